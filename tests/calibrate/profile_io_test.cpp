// The profile writer is the inverse of models::parse_hardware_profile.
#include "cpsim/calibrate/profile_io.hpp"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"

namespace cpsim::calibrate {
namespace {

const models::DataDir kData{CPSIM_TEST_DATA_DIR};

void expect_curve_equal(const models::LogCurve& a, const models::LogCurve& b, const char* what) {
  EXPECT_EQ(a.points(), b.points()) << what;
}

void expect_profiles_equal(const models::HardwareProfile& a, const models::HardwareProfile& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.description, b.description);
  EXPECT_EQ(a.gpu_name, b.gpu_name);
  EXPECT_EQ(a.hbm_capacity_bytes, b.hbm_capacity_bytes);
  EXPECT_EQ(a.sm_count, b.sm_count);
  EXPECT_EQ(a.peak_bf16_flops_per_s, b.peak_bf16_flops_per_s);
  EXPECT_EQ(a.peak_fp8_flops_per_s, b.peak_fp8_flops_per_s);
  EXPECT_EQ(a.hbm_bandwidth_bytes_per_s, b.hbm_bandwidth_bytes_per_s);
  EXPECT_EQ(a.gemm_max_efficiency, b.gemm_max_efficiency);
  expect_curve_equal(a.gemm_efficiency_by_flops, b.gemm_efficiency_by_flops, "gemm");
  EXPECT_EQ(a.memory_bound_efficiency, b.memory_bound_efficiency);
  EXPECT_EQ(a.kernel_launch_s, b.kernel_launch_s);
  EXPECT_EQ(a.collective_launch_s, b.collective_launch_s);
  EXPECT_EQ(a.compute_slowdown_under_comm, b.compute_slowdown_under_comm);
  ASSERT_EQ(a.attention_kernels.size(), b.attention_kernels.size());
  for (const auto& [name, k] : a.attention_kernels) {
    const models::AttentionKernelModel& l = b.attention_kernel(name);
    expect_curve_equal(k.fwd_causal_flops_per_s, l.fwd_causal_flops_per_s, "fwd_causal");
    expect_curve_equal(k.fwd_full_flops_per_s, l.fwd_full_flops_per_s, "fwd_full");
    expect_curve_equal(k.bwd_causal_flops_per_s, l.bwd_causal_flops_per_s, "bwd_causal");
    expect_curve_equal(k.bwd_full_flops_per_s, l.bwd_full_flops_per_s, "bwd_full");
    EXPECT_EQ(k.fwd_block_m, l.fwd_block_m);
    EXPECT_EQ(k.bwd_block_n, l.bwd_block_n);
    EXPECT_EQ(k.head_dim, l.head_dim);
  }
  EXPECT_EQ(a.cuda_context_bytes, b.cuda_context_bytes);
  EXPECT_EQ(a.nccl.collective_channels_intra_node, b.nccl.collective_channels_intra_node);
  EXPECT_EQ(a.nccl.collective_channels_inter_node, b.nccl.collective_channels_inter_node);
  EXPECT_EQ(a.nccl.p2p_channels_per_nvlink_peer, b.nccl.p2p_channels_per_nvlink_peer);
  EXPECT_EQ(a.nccl.p2p_channels_per_net_peer, b.nccl.p2p_channels_per_net_peer);
  EXPECT_EQ(a.nccl.nvls_channels, b.nccl.nvls_channels);
  EXPECT_EQ(a.nccl.nvlink_p2p_read, b.nccl.nvlink_p2p_read);
  EXPECT_EQ(a.nccl.allocation_granularity_bytes, b.nccl.allocation_granularity_bytes);
  EXPECT_EQ(a.cublas_workspace_bytes, b.cublas_workspace_bytes);
  EXPECT_EQ(a.gpus_per_node, b.gpus_per_node);
  EXPECT_EQ(a.host_memory_bytes_per_node, b.host_memory_bytes_per_node);
  EXPECT_EQ(a.cpu_adam_params_per_s, b.cpu_adam_params_per_s);
  EXPECT_EQ(a.host_link.alpha_s, b.host_link.alpha_s);
  EXPECT_EQ(a.host_link.h2d_bytes_per_s, b.host_link.h2d_bytes_per_s);
  EXPECT_EQ(a.host_link.d2h_bytes_per_s, b.host_link.d2h_bytes_per_s);
  EXPECT_EQ(a.host_link.duplex_total_bytes_per_s, b.host_link.duplex_total_bytes_per_s);
  for (const auto& [span, by_op] : a.collectives) {
    for (const auto& [op, m] : by_op) {
      const models::CollectiveModel& n = b.collective(span, op);
      EXPECT_EQ(m.alpha_s, n.alpha_s);
      EXPECT_EQ(m.peak_busbw_bytes_per_s, n.peak_busbw_bytes_per_s);
      expect_curve_equal(m.efficiency_by_size, n.efficiency_by_size, "efficiency");
      ASSERT_EQ(m.by_ranks.size(), n.by_ranks.size());
      for (const auto& [ranks, curve] : m.by_ranks) {
        const models::CollectiveCurve& other = n.by_ranks.at(ranks);
        EXPECT_EQ(curve.alpha_s, other.alpha_s);
        EXPECT_EQ(curve.peak_busbw_bytes_per_s, other.peak_busbw_bytes_per_s);
        expect_curve_equal(curve.efficiency_by_size, other.efficiency_by_size, "by_ranks");
      }
    }
  }
  EXPECT_EQ(a.provenance, b.provenance);
}

class ProfileRoundTrip : public ::testing::TestWithParam<std::string> {};

TEST_P(ProfileRoundTrip, WriteThenParseGivesTheSameProfile) {
  const models::HardwareProfile original = models::load_hardware(GetParam(), kData);
  const std::string text = write_hardware_profile(original);
  const models::HardwareProfile back = models::parse_hardware_profile(text, "written.json");
  expect_profiles_equal(original, back);
  EXPECT_EQ(write_hardware_profile(back), text);
}

INSTANTIATE_TEST_SUITE_P(BuiltIn,
                         ProfileRoundTrip,
                         ::testing::Values("h100-sxm-80g",
                                           "h200-141g",
                                           "a100-sxm-40g",
                                           "a100-sxm-80g",
                                           "a800-sxm-80g",
                                           "b200"));

TEST(ProfileWriter, KeepsTheSchemaAndLayoutOfTheDataFiles) {
  const models::HardwareProfile p = models::load_hardware("h100-sxm-80g", kData);
  const nlohmann::json j = nlohmann::json::parse(write_hardware_profile(p));
  EXPECT_EQ(j.at("schema"), "cpsim.hardware/1");
  EXPECT_TRUE(j.at("gpu").at("sm_count").contains("source"));
  EXPECT_EQ(j.at("gpu").at("sm_count").at("value"), 132);
  EXPECT_TRUE(j.at("compute")
                  .at("attention_kernels")
                  .at("fa3")
                  .at("fwd_full_flops_per_s")
                  .contains("points"));
  EXPECT_TRUE(j.at("collectives").at("inter_node").at("send_recv").contains("alpha_s"));
}

TEST(ProfileWriter, CurvesPerGroupSizeRoundTripAndBadKeysAreRefused) {
  models::HardwareProfile p = models::load_hardware("h100-sxm-80g", kData);
  models::CollectiveModel& m =
      p.collectives[models::Span::kIntraNode][models::Collective::kReduceScatter];
  models::CollectiveCurve four;
  four.alpha_s = 7e-6;
  four.peak_busbw_bytes_per_s = 300e9;
  four.efficiency_by_size = models::LogCurve({{1024.0, 0.1}, {1073741824.0, 0.9}});
  m.by_ranks[4] = four;
  const std::string at = "collectives.intra_node.reduce_scatter.by_ranks.4";
  for (const char* key : {".alpha_s", ".peak_busbw_bytes_per_s", ".efficiency_by_size"}) {
    p.provenance[at + key] = "test";
  }
  const std::string text = write_hardware_profile(p);
  const models::HardwareProfile back = models::parse_hardware_profile(text, "written.json");
  expect_profiles_equal(p, back);
  EXPECT_EQ(back.collective(models::Span::kIntraNode, models::Collective::kReduceScatter)
                .curve_for(6)
                .alpha_s,
            7e-6);

  nlohmann::ordered_json j = nlohmann::ordered_json::parse(text);
  auto& by = j["collectives"]["intra_node"]["reduce_scatter"]["by_ranks"];
  by["1"] = by["4"];
  try {
    (void)models::parse_hardware_profile(j.dump(), "bad.json");
    ADD_FAILURE() << "accepted by_ranks key 1";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "bad.json:collectives.intra_node.reduce_scatter.by_ranks.1");
  }
  by.erase("1");
  by["4"]["peak_busbw_bytes_per_s"]["value"] = 1e3;
  EXPECT_THROW((void)models::parse_hardware_profile(j.dump(), "bad.json"), InputError);
}

TEST(ProfileWriter, RefusesACoefficientWithoutSource) {
  models::HardwareProfile p = models::load_hardware("h100-sxm-80g", kData);
  p.provenance.edit().erase("node.host_link.d2h_bytes_per_s");
  try {
    (void)write_hardware_profile(p);
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "provenance.node.host_link.d2h_bytes_per_s");
  }
}

}  // namespace
}  // namespace cpsim::calibrate
