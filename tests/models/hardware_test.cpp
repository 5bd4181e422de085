#include "cpsim/models/hardware.hpp"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"

namespace cpsim::models {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

json h100_json() {
  return json::parse(
      read_text(std::filesystem::path(CPSIM_TEST_DATA_DIR) / "hardware" / "h100-sxm-80g.json"));
}

/// The InputError field raised by parsing `profile` (as origin "h100.json"), or "" if it parses.
std::string error_field(const json& profile) {
  try {
    parse_hardware_profile(profile.dump(), "h100.json");
  } catch (const InputError& e) {
    EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << e.what();
    return e.field();
  }
  return "";
}

TEST(HardwareProfile, ParsesTheH100Profile) {
  const HardwareProfile hw = parse_hardware_profile(h100_json().dump(), "h100.json");
  EXPECT_EQ(hw.schema_version, 1);
  EXPECT_EQ(hw.name, "h100-sxm-80g");
  EXPECT_EQ(hw.gpu_name, "NVIDIA H100 SXM5 80GB");
  EXPECT_FALSE(hw.description.empty());
  EXPECT_EQ(hw.hbm_capacity_bytes, 85520809984);
  EXPECT_EQ(hw.sm_count, 132);
  EXPECT_DOUBLE_EQ(hw.peak_bf16_flops_per_s, 989e12);
  EXPECT_DOUBLE_EQ(hw.hbm_bandwidth_bytes_per_s, 3.35e12);
  EXPECT_DOUBLE_EQ(hw.gemm_max_efficiency, 0.803);
  EXPECT_TRUE(hw.gemm_efficiency_by_flops.empty());
  EXPECT_DOUBLE_EQ(hw.memory_bound_efficiency, 0.85);
  EXPECT_DOUBLE_EQ(hw.kernel_launch_s, 1e-6);
  EXPECT_DOUBLE_EQ(hw.collective_launch_s, 5e-6);
  EXPECT_DOUBLE_EQ(hw.compute_slowdown_under_comm, 0.0);
  EXPECT_EQ(hw.cuda_context_bytes, 536870912);
  EXPECT_EQ(hw.nccl.collective_channels_intra_node, 24);
  EXPECT_EQ(hw.nccl.nvls_channels, 16);
  EXPECT_FALSE(hw.nccl.nvlink_p2p_read);
  EXPECT_EQ(hw.nccl.allocation_granularity_bytes, 2097152);
  EXPECT_EQ(hw.cublas_workspace_bytes, 67108864);
  EXPECT_EQ(hw.fixed_overhead_bytes(), 536870912LL + 67108864);  // NCCL's is per communicator
  EXPECT_EQ(hw.gpus_per_node, 8);
  EXPECT_EQ(hw.host_memory_bytes_per_node, 2000000000000);
  EXPECT_DOUBLE_EQ(hw.host_link.alpha_s, 5e-6);
  EXPECT_DOUBLE_EQ(hw.host_link.h2d_bytes_per_s, 55.43e9);
  EXPECT_DOUBLE_EQ(hw.host_link.d2h_bytes_per_s, 55.06e9);
  EXPECT_DOUBLE_EQ(hw.host_link.duplex_total_bytes_per_s, 49e9);

  const AttentionKernelModel& fa3 = hw.attention_kernel("fa3");
  EXPECT_EQ(fa3.fwd_causal_flops_per_s.points().size(), 6U);
  EXPECT_DOUBLE_EQ(fa3.fwd_causal_flops_per_s(512), 292e12);
  EXPECT_DOUBLE_EQ(fa3.fwd_causal_flops_per_s(16384), 616e12);
  EXPECT_DOUBLE_EQ(fa3.fwd_causal_flops_per_s(1e6), 616e12);
  EXPECT_DOUBLE_EQ(fa3.bwd_full_flops_per_s(8192), 559e12);
  EXPECT_EQ(fa3.fwd_block_m, 128);
  EXPECT_EQ(fa3.bwd_block_n, 128);
  EXPECT_EQ(fa3.head_dim, 128);
  EXPECT_EQ(hw.attention_kernels.size(), 4U);

  const CollectiveModel& a2a = hw.collective(Span::kIntraNode, Collective::kAllToAll);
  EXPECT_DOUBLE_EQ(a2a.alpha_s, 12.5e-6);
  EXPECT_DOUBLE_EQ(a2a.peak_busbw_bytes_per_s, 370.8e9);
  EXPECT_DOUBLE_EQ(a2a.efficiency_by_size(16777216), 0.44);
  EXPECT_DOUBLE_EQ(a2a.efficiency_by_size(33554432), 0.52);  // halfway in log2
  EXPECT_DOUBLE_EQ(hw.collective(Span::kInterNode, Collective::kAllReduce).peak_busbw_bytes_per_s,
                   48.5e9);
  for (const Span span : {Span::kIntraNode, Span::kInterNode}) {
    for (const Collective c :
         {Collective::kAllToAll, Collective::kAllGather, Collective::kReduceScatter,
          Collective::kAllReduce, Collective::kSendRecv}) {
      EXPECT_NO_THROW(hw.collective(span, c)) << to_string(span) << " " << to_string(c);
    }
  }
}

TEST(HardwareProfile, RecordsProvenanceOfEveryCoefficient) {
  const HardwareProfile hw = parse_hardware_profile(h100_json().dump(), "h100.json");
  // 5 gpu (with the FP8 peak) + 5 compute + 4 kernels x 7 + 2 overheads + 7 NCCL + 3 node + 4 host
  // link + 3 host issue + 2 x 5 x 3 collectives.
  EXPECT_EQ(hw.provenance.size(), 87U);
  EXPECT_THAT(hw.provenance.at("memory_overheads.nccl.collective_channels_inter_node"),
              HasSubstr("nccl#1453"));
  EXPECT_THAT(hw.provenance.at("node.host_issue.launch_s"), HasSubstr("ReFrame"));
  EXPECT_THAT(hw.provenance.at("gpu.peak_bf16_flops_per_s"), HasSubstr("989 TFLOP/s"));
  EXPECT_THAT(hw.provenance.at("gpu.peak_fp8_flops_per_s"), HasSubstr("1,979 TFLOP/s"));
  EXPECT_THAT(hw.provenance.at("collectives.intra_node.all_to_all.alpha_s"), HasSubstr("11-15 us"));
  EXPECT_THAT(hw.provenance.at("compute.attention_kernels.fa3.fwd_causal_flops_per_s"),
              HasSubstr("FlashAttention-3"));
  EXPECT_EQ(hw.provenance.count("collectives.inter_node.send_recv.efficiency_by_size"), 1U);
  EXPECT_EQ(hw.provenance.count("node.host_link.duplex_total_bytes_per_s"), 1U);
  EXPECT_EQ(hw.provenance.count("memory_overheads.cublas_workspace_bytes"), 1U);
}

TEST(HardwareProfile, OptionalHostIssue) {
  // The built-in profile's constants (docs/MODEL.md, "Host issue"): 4.5 + 2.7 us per call.
  const HardwareProfile hw = parse_hardware_profile(h100_json().dump(), "h100.json");
  EXPECT_DOUBLE_EQ(hw.host_issue.dispatch_s, 4.5e-6);
  EXPECT_DOUBLE_EQ(hw.host_issue.launch_s, 2.7e-6);
  EXPECT_DOUBLE_EQ(hw.host_issue.sync_s, 6.95e-6);
  EXPECT_DOUBLE_EQ(hw.host_issue.per_call_s(), 7.2e-6);
  EXPECT_TRUE(hw.host_issue.enabled());
  // Without the section the model is off.
  json profile = h100_json();
  profile["node"].erase("host_issue");
  const HardwareProfile off = parse_hardware_profile(profile.dump(), "h100.json");
  EXPECT_FALSE(off.host_issue.enabled());
  EXPECT_EQ(off.provenance.count("node.host_issue.sync_s"), 0U);
  // A negative value names its path.
  profile = h100_json();
  profile["node"]["host_issue"]["sync_s"]["value"] = -1.0;
  EXPECT_THAT(error_field(profile), HasSubstr("node.host_issue.sync_s"));
}

TEST(HardwareProfile, OptionalGemmEfficiencyCurve) {
  json profile = h100_json();
  profile["compute"]["gemm_efficiency_by_flops"] =
      json::parse(R"({"points": [[1e9, 0.5], [1e12, 1.0]], "source": "test"})");
  const HardwareProfile hw = parse_hardware_profile(profile.dump(), "h100.json");
  EXPECT_DOUBLE_EQ(hw.gemm_efficiency_by_flops(1e12), 1.0);
  EXPECT_EQ(hw.provenance.at("compute.gemm_efficiency_by_flops"), "test");
}

TEST(HardwareProfile, RejectsNanInfAndNegativeValuesNamingThePath) {
  json profile = h100_json();
  profile["gpu"]["peak_bf16_flops_per_s"]["value"] = "NaN";
  EXPECT_EQ(error_field(profile), "h100.json:gpu.peak_bf16_flops_per_s");

  profile = h100_json();
  profile["gpu"]["peak_bf16_flops_per_s"]["value"] = -1.0;
  EXPECT_EQ(error_field(profile), "h100.json:gpu.peak_bf16_flops_per_s");

  profile = h100_json();
  profile["gpu"]["peak_bf16_flops_per_s"]["value"] = 0.0;
  EXPECT_EQ(error_field(profile), "h100.json:gpu.peak_bf16_flops_per_s");

  profile = h100_json();
  profile["collectives"]["inter_node"]["all_gather"]["alpha_s"]["value"] = -1e-6;
  EXPECT_EQ(error_field(profile), "h100.json:collectives.inter_node.all_gather.alpha_s");

  profile = h100_json();
  profile["compute"]["gemm_max_efficiency"]["value"] = 1.2;
  EXPECT_EQ(error_field(profile), "h100.json:compute.gemm_max_efficiency");

  profile = h100_json();
  profile["collectives"]["intra_node"]["all_to_all"]["efficiency_by_size"]["points"][2][1] = -0.5;
  EXPECT_EQ(error_field(profile),
            "h100.json:collectives.intra_node.all_to_all.efficiency_by_size.points[2]");

  profile = h100_json();
  profile["compute"]["attention_kernels"]["fa2"]["bwd_full_flops_per_s"]["points"][1][0] = 256;
  EXPECT_EQ(error_field(profile),
            "h100.json:compute.attention_kernels.fa2.bwd_full_flops_per_s.points[1]");

  profile = h100_json();
  profile["compute"]["attention_kernels"]["fa2"]["bwd_full_flops_per_s"]["points"] = json::array();
  EXPECT_EQ(error_field(profile),
            "h100.json:compute.attention_kernels.fa2.bwd_full_flops_per_s.points");

  // A bare NaN literal is not JSON: the parser reports the position in the file.
  std::string text = h100_json().dump(2);
  const std::string needle = "\"value\": 989000000000000.0";
  ASSERT_NE(text.find(needle), std::string::npos);
  text.replace(text.find(needle), needle.size(), "\"value\": NaN");
  try {
    parse_hardware_profile(text, "h100.json");
    ADD_FAILURE() << "accepted NaN";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "h100.json");
    EXPECT_THAT(e.what(), HasSubstr("line "));
  }
}

TEST(HardwareProfile, NcclTopologyIsCheckedNamingTheField) {
  json profile = h100_json();
  profile["memory_overheads"]["nccl_buffers_bytes"] = {{"value", 536870912}, {"source", "old"}};
  EXPECT_EQ(error_field(profile), "h100.json:memory_overheads.nccl_buffers_bytes");

  profile = h100_json();
  profile["memory_overheads"]["nccl"]["nvlink_p2p_read"]["value"] = 2;
  EXPECT_EQ(error_field(profile), "h100.json:memory_overheads.nccl.nvlink_p2p_read");

  profile = h100_json();
  profile["memory_overheads"]["nccl"]["collective_channels_intra_node"]["value"] = 0;
  EXPECT_EQ(error_field(profile), "h100.json:memory_overheads.nccl.collective_channels_intra_node");

  profile = h100_json();
  profile["memory_overheads"]["nccl"].erase("nvls_channels");
  EXPECT_EQ(error_field(profile), "h100.json:memory_overheads.nccl.nvls_channels");
}

TEST(HardwareProfile, RejectsMissingOrEmptySourceNamingThePath) {
  json profile = h100_json();
  profile["gpu"]["sm_count"].erase("source");
  EXPECT_EQ(error_field(profile), "h100.json:gpu.sm_count.source");

  profile = h100_json();
  profile["node"]["host_link"]["h2d_bytes_per_s"]["source"] = "  ";
  EXPECT_EQ(error_field(profile), "h100.json:node.host_link.h2d_bytes_per_s.source");

  profile = h100_json();
  profile["compute"]["attention_kernels"]["cudnn"]["fwd_full_flops_per_s"]["source"] = "";
  EXPECT_EQ(error_field(profile),
            "h100.json:compute.attention_kernels.cudnn.fwd_full_flops_per_s.source");

  profile = h100_json();
  profile["collectives"]["intra_node"]["send_recv"]["efficiency_by_size"]["source"] = 3;
  EXPECT_EQ(error_field(profile),
            "h100.json:collectives.intra_node.send_recv.efficiency_by_size.source");
}

TEST(HardwareProfile, RejectsStructuralErrors) {
  json profile = h100_json();
  profile["schema"] = "cpsim.hardware/2";
  EXPECT_EQ(error_field(profile), "h100.json:schema");
  profile.erase("schema");
  EXPECT_EQ(error_field(profile), "h100.json:schema");

  for (const char* section : {"gpu", "compute", "memory_overheads", "node", "collectives"}) {
    profile = h100_json();
    profile.erase(section);
    EXPECT_EQ(error_field(profile), std::string("h100.json:") + section);
  }

  profile = h100_json();
  profile["collectives"]["inter_node"].erase("reduce_scatter");
  EXPECT_EQ(error_field(profile), "h100.json:collectives.inter_node.reduce_scatter");

  profile = h100_json();
  profile["gpu"]["sm_count"]["value"] = 132.5;
  EXPECT_EQ(error_field(profile), "h100.json:gpu.sm_count");

  profile = h100_json();
  profile["gpu"]["peak_bf16_flops_per_s"] = 989e12;  // bare number instead of {value, source}
  EXPECT_EQ(error_field(profile), "h100.json:gpu.peak_bf16_flops_per_s");

  profile = h100_json();
  profile["gpu"]["peak_bf16_flops"] = profile["gpu"]["peak_bf16_flops_per_s"];  // typo'd extra key
  EXPECT_EQ(error_field(profile), "h100.json:gpu.peak_bf16_flops");

  profile = h100_json();
  profile["compute"]["attention_kernels"] = json::object();
  EXPECT_EQ(error_field(profile), "h100.json:compute.attention_kernels");

  profile = h100_json();
  profile["name"] = "";
  EXPECT_EQ(error_field(profile), "h100.json:name");
}

TEST(HardwareProfile, LookupErrors) {
  const HardwareProfile hw = parse_hardware_profile(h100_json().dump(), "h100.json");
  try {
    hw.attention_kernel("fa4");
    ADD_FAILURE() << "found fa4";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--attention-kernel");
    EXPECT_THAT(e.what(), HasSubstr("cudnn, fa2, fa3"));
  }
  HardwareProfile empty;
  EXPECT_THROW(empty.collective(Span::kInterNode, Collective::kSendRecv), InputError);
}

TEST(HardwareProfile, EnumNamesMatchTheJsonKeys) {
  EXPECT_STREQ(to_string(Collective::kAllToAll), "all_to_all");
  EXPECT_STREQ(to_string(Collective::kAllGather), "all_gather");
  EXPECT_STREQ(to_string(Collective::kReduceScatter), "reduce_scatter");
  EXPECT_STREQ(to_string(Collective::kAllReduce), "all_reduce");
  EXPECT_STREQ(to_string(Collective::kSendRecv), "send_recv");
  EXPECT_STREQ(to_string(Span::kIntraNode), "intra_node");
  EXPECT_STREQ(to_string(Span::kInterNode), "inter_node");
}

}  // namespace
}  // namespace cpsim::models
