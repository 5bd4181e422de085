// The raw calibration format (schema cpsim.calibration/1): round trip and strict validation with
// errors that name the JSON path.
#include "cpsim/calibrate/raw.hpp"

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"

#include "synthetic.hpp"

namespace cpsim::calibrate {
namespace {

using Json = nlohmann::json;

// The synthetic raw file, with two of its GEMM samples given the backward's layouts.
RawCalibration sample_raw() {
  RawCalibration raw = testing::synthetic_raw(testing::truth_profile(), 0.02, 7);
  raw.samples.gemm.at(1).layout = GemmLayout::kDgrad;
  raw.samples.gemm.at(2).layout = GemmLayout::kWgrad;
  return raw;
}

void expect_equal(const RawCalibration& a, const RawCalibration& b) {
  const RawContext& x = a.context;
  const RawContext& y = b.context;
  EXPECT_EQ(x.device, y.device);
  EXPECT_EQ(x.gpu_count, y.gpu_count);
  EXPECT_EQ(x.device_count, y.device_count);
  EXPECT_EQ(x.driver_version, y.driver_version);
  EXPECT_EQ(x.cuda_driver_version, y.cuda_driver_version);
  EXPECT_EQ(x.cuda_runtime_version, y.cuda_runtime_version);
  EXPECT_EQ(x.nccl_version, y.nccl_version);
  EXPECT_EQ(x.cublaslt_version, y.cublaslt_version);
  EXPECT_EQ(x.sm_count, y.sm_count);
  EXPECT_EQ(x.hbm_capacity_bytes, y.hbm_capacity_bytes);
  EXPECT_EQ(x.l2_cache_bytes, y.l2_cache_bytes);
  EXPECT_EQ(x.sm_clock_max_mhz, y.sm_clock_max_mhz);
  EXPECT_EQ(x.memory_clock_max_mhz, y.memory_clock_max_mhz);
  EXPECT_EQ(x.sm_clock_measured_mhz, y.sm_clock_measured_mhz);
  EXPECT_EQ(x.date, y.date);
  EXPECT_EQ(x.cpsim_version, y.cpsim_version);
  EXPECT_EQ(x.argv, y.argv);
  EXPECT_EQ(x.quick, y.quick);
  EXPECT_EQ(x.method.timer, y.method.timer);
  EXPECT_EQ(x.method.statistic, y.method.statistic);
  EXPECT_EQ(x.method.warmup, y.method.warmup);
  EXPECT_EQ(x.method.repetitions, y.method.repetitions);
  EXPECT_EQ(x.method.rotation_bytes, y.method.rotation_bytes);
  EXPECT_EQ(x.notes, y.notes);

  const RawSamples& s = a.samples;
  const RawSamples& t = b.samples;
  ASSERT_EQ(s.gemm.size(), t.gemm.size());
  for (std::size_t i = 0; i < s.gemm.size(); ++i) {
    EXPECT_EQ(s.gemm[i].m, t.gemm[i].m);
    EXPECT_EQ(s.gemm[i].n, t.gemm[i].n);
    EXPECT_EQ(s.gemm[i].k, t.gemm[i].k);
    EXPECT_EQ(s.gemm[i].time_s, t.gemm[i].time_s);
    EXPECT_EQ(s.gemm[i].layout, t.gemm[i].layout);
  }
  ASSERT_EQ(s.attention.size(), t.attention.size());
  for (std::size_t i = 0; i < s.attention.size(); ++i) {
    const AttentionSample& p = s.attention[i];
    const AttentionSample& q = t.attention[i];
    EXPECT_EQ(p.kernel, q.kernel);
    EXPECT_EQ(p.pass, q.pass);
    EXPECT_EQ(p.causal, q.causal);
    EXPECT_EQ(p.head_dim, q.head_dim);
    EXPECT_EQ(p.heads, q.heads);
    EXPECT_EQ(p.q_len, q.q_len);
    EXPECT_EQ(p.kv_len, q.kv_len);
    EXPECT_EQ(p.time_s, q.time_s);
  }
  ASSERT_EQ(s.memory.size(), t.memory.size());
  for (std::size_t i = 0; i < s.memory.size(); ++i) {
    EXPECT_EQ(s.memory[i].kernel, t.memory[i].kernel);
    EXPECT_EQ(s.memory[i].bytes, t.memory[i].bytes);
    EXPECT_EQ(s.memory[i].time_s, t.memory[i].time_s);
  }
  ASSERT_EQ(s.collectives.size(), t.collectives.size());
  for (std::size_t i = 0; i < s.collectives.size(); ++i) {
    const CollectiveSample& p = s.collectives[i];
    const CollectiveSample& q = t.collectives[i];
    EXPECT_EQ(p.op, q.op);
    EXPECT_EQ(p.ranks, q.ranks);
    EXPECT_EQ(p.size_bytes, q.size_bytes);
    EXPECT_EQ(p.time_s, q.time_s);
    EXPECT_EQ(p.algbw_bytes_per_s, q.algbw_bytes_per_s);
    EXPECT_EQ(p.busbw_bytes_per_s, q.busbw_bytes_per_s);
  }
  ASSERT_EQ(s.host_copies.size(), t.host_copies.size());
  for (std::size_t i = 0; i < s.host_copies.size(); ++i) {
    const HostCopySample& p = s.host_copies[i];
    const HostCopySample& q = t.host_copies[i];
    EXPECT_EQ(p.direction, q.direction);
    EXPECT_EQ(p.gpu, q.gpu);
    EXPECT_EQ(p.gpus, q.gpus);
    EXPECT_EQ(p.bytes, q.bytes);
    EXPECT_EQ(p.time_s, q.time_s);
  }
  ASSERT_EQ(s.interference.size(), t.interference.size());
  for (std::size_t i = 0; i < s.interference.size(); ++i) {
    EXPECT_EQ(s.interference[i].background, t.interference[i].background);
    EXPECT_EQ(s.interference[i].foreground, t.interference[i].foreground);
    EXPECT_EQ(s.interference[i].gpus, t.interference[i].gpus);
    EXPECT_EQ(s.interference[i].time_alone_s, t.interference[i].time_alone_s);
    EXPECT_EQ(s.interference[i].time_concurrent_s, t.interference[i].time_concurrent_s);
  }
  ASSERT_EQ(s.launch.size(), t.launch.size());
  for (std::size_t i = 0; i < s.launch.size(); ++i) {
    EXPECT_EQ(s.launch[i].kernels, t.launch[i].kernels);
    EXPECT_EQ(s.launch[i].device_time_s, t.launch[i].device_time_s);
    EXPECT_EQ(s.launch[i].host_time_s, t.launch[i].host_time_s);
  }
}

/// Parses `text` and checks that it fails with an InputError naming exactly `field`.
void expect_field_error(const std::string& text, const std::string& field) {
  try {
    (void)parse_raw(text, "raw.json");
    ADD_FAILURE() << "expected InputError for " << field;
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), field) << e.what();
  }
}

/// The sample file as JSON, edited by `edit`, as text.
template <typename Edit>
std::string edited(Edit&& edit) {
  Json j = Json::parse(write_raw(sample_raw()));
  edit(j);
  return j.dump();
}

TEST(RawFormat, RoundTripsEverySampleKind) {
  const RawCalibration raw = sample_raw();
  ASSERT_FALSE(raw.samples.gemm.empty());
  ASSERT_FALSE(raw.samples.collectives.empty());
  const std::string text = write_raw(raw);
  const RawCalibration back = parse_raw(text, "raw.json");
  expect_equal(raw, back);
  EXPECT_EQ(write_raw(back), text);  // the writer is deterministic
}

TEST(RawFormat, WritesTheSchemaAndNamedFields) {
  const Json j = Json::parse(write_raw(sample_raw()));
  EXPECT_EQ(j.at("schema"), "cpsim.calibration/1");
  EXPECT_EQ(j.at("context").at("device"), "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(j.at("samples").at("collectives").at(0).at("op"), "all_to_all");
  EXPECT_TRUE(j.at("samples").at("collectives").at(0).contains("busbw_bytes_per_s"));
  EXPECT_EQ(j.at("samples").at("attention").at(0).at("pass"), "fwd");
  EXPECT_EQ(j.at("samples").at("host_copies").at(0).at("direction"), "h2d");
  // A GEMM sample names its layout unless it is the forward's.
  EXPECT_FALSE(j.at("samples").at("gemm").at(0).contains("layout"));
  EXPECT_EQ(j.at("samples").at("gemm").at(1).at("layout"), "dgrad");
  EXPECT_EQ(j.at("samples").at("gemm").at(2).at("layout"), "wgrad");
}

TEST(RawFormat, SampleArraysMayBeAbsent) {
  const std::string text = edited([](Json& j) {
    j["samples"] = Json::object({{"attention", j["samples"]["attention"]}});
  });
  const RawCalibration raw = parse_raw(text, "raw.json");
  EXPECT_TRUE(raw.samples.gemm.empty());
  EXPECT_FALSE(raw.samples.attention.empty());
}

TEST(RawFormat, CorruptedFieldsNameTheJsonPath) {
  expect_field_error(edited([](Json& j) { j["samples"]["gemm"][3]["time_s"] = "fast"; }),
                     "raw.json:samples.gemm[3].time_s");
  expect_field_error(edited([](Json& j) { j["samples"]["gemm"][0]["m"] = -4; }),
                     "raw.json:samples.gemm[0].m");
  expect_field_error(edited([](Json& j) { j["samples"]["gemm"][0]["layout"] = "sideways"; }),
                     "raw.json:samples.gemm[0].layout");
  expect_field_error(edited([](Json& j) { j["samples"]["attention"][2].erase("kv_len"); }),
                     "raw.json:samples.attention[2].kv_len");
  expect_field_error(edited([](Json& j) { j["samples"]["attention"][1]["pass"] = "sideways"; }),
                     "raw.json:samples.attention[1].pass");
  expect_field_error(
      edited([](Json& j) { j["samples"]["attention"][0]["kernel"] = "flash attention"; }),
      "raw.json:samples.attention[0].kernel");
  expect_field_error(edited([](Json& j) { j["samples"]["collectives"][5]["op"] = "broadcast"; }),
                     "raw.json:samples.collectives[5].op");
  expect_field_error(edited([](Json& j) { j["samples"]["collectives"][0]["ranks"] = 64; }),
                     "raw.json:samples.collectives[0].ranks");
  expect_field_error(edited([](Json& j) { j["samples"]["collectives"][0]["time_s"] = 0.0; }),
                     "raw.json:samples.collectives[0].time_s");
  expect_field_error(edited([](Json& j) { j["samples"]["host_copies"][0]["direction"] = "up"; }),
                     "raw.json:samples.host_copies[0].direction");
  expect_field_error(edited([](Json& j) { j["samples"]["interference"][0]["background"] = 3; }),
                     "raw.json:samples.interference[0].background");
  expect_field_error(edited([](Json& j) { j["samples"]["launch"][0]["kernels"] = 1.5; }),
                     "raw.json:samples.launch[0].kernels");
  expect_field_error(edited([](Json& j) { j["samples"]["memory"] = Json::object(); }),
                     "raw.json:samples.memory");
  expect_field_error(edited([](Json& j) { j["samples"]["gemm"][0]["flops"] = 1; }),
                     "raw.json:samples.gemm[0].flops");
  expect_field_error(edited([](Json& j) { j["samples"]["shapes"] = Json::array(); }),
                     "raw.json:samples.shapes");
}

TEST(RawFormat, ContextIsValidated) {
  expect_field_error(edited([](Json& j) { j["context"].erase("device"); }),
                     "raw.json:context.device");
  expect_field_error(edited([](Json& j) { j["context"]["gpu_count"] = 0; }),
                     "raw.json:context.gpu_count");
  expect_field_error(edited([](Json& j) { j["context"]["device_count"] = 1; }),
                     "raw.json:context.device_count");
  expect_field_error(edited([](Json& j) { j["context"]["method"]["repetitions"] = 0; }),
                     "raw.json:context.method.repetitions");
  expect_field_error(edited([](Json& j) { j["context"]["argv"] = "cpsim"; }),
                     "raw.json:context.argv");
  expect_field_error(edited([](Json& j) { j["context"]["quick"] = "no"; }),
                     "raw.json:context.quick");
}

TEST(RawFormat, TheMpiLayoutRoundTripsAndIsChecked) {
  EXPECT_FALSE(Json::parse(write_raw(sample_raw())).at("context").contains("mpi"));
  RawCalibration raw = sample_raw();  // 8 GPUs
  raw.context.mpi = RawMpi{8, 2, 4, {"node1", "node2"}};
  const std::string text = write_raw(raw);
  const RawCalibration back = parse_raw(text, "raw.json");
  EXPECT_EQ(back.context.mpi.ranks, 8);
  EXPECT_EQ(back.context.mpi.nodes, 2);
  EXPECT_EQ(back.context.mpi.ranks_per_node, 4);
  EXPECT_EQ(back.context.mpi.hosts, (std::vector<std::string>{"node1", "node2"}));
  EXPECT_EQ(write_raw(back), text);
  const auto with_mpi = [&](const std::function<void(Json&)>& edit) {
    Json j = Json::parse(text);
    edit(j["context"]["mpi"]);
    return j.dump();
  };
  expect_field_error(with_mpi([](Json& m) { m["ranks"] = 6; }), "raw.json:context.mpi.ranks");
  expect_field_error(with_mpi([](Json& m) {
                       m["ranks"] = 16;
                       m["ranks_per_node"] = 8;
                     }),
                     "raw.json:context.mpi.ranks");  // more ranks than gpu_count
  expect_field_error(with_mpi([](Json& m) { m["nodes"] = 0; }), "raw.json:context.mpi.nodes");
  expect_field_error(with_mpi([](Json& m) { m["hosts"] = Json::array({"node1"}); }),
                     "raw.json:context.mpi.hosts");
  expect_field_error(with_mpi([](Json& m) { m["rails"] = 1; }), "raw.json:context.mpi.rails");
}

TEST(RawFormat, SchemaAndShapeAreChecked) {
  expect_field_error(edited([](Json& j) { j["schema"] = "cpsim.calibration/2"; }),
                     "raw.json:schema");
  expect_field_error(edited([](Json& j) { j.erase("schema"); }), "raw.json:schema");
  expect_field_error(edited([](Json& j) { j.erase("samples"); }), "raw.json:samples");
  expect_field_error("[1, 2]", "raw.json");
  expect_field_error("{\"schema\": ", "raw.json");
}

TEST(RawFormat, LoadRawNamesThePathAsOrigin) {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / "cpsim_raw_test_corrupt.json";
  {
    std::ofstream out(path);
    out << edited([](Json& j) { j["samples"]["gemm"][3]["time_s"] = -1.0; });
  }
  try {
    (void)load_raw(path, "RAW");
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), path.string() + ":samples.gemm[3].time_s");
  }
  std::filesystem::remove(path);
  try {
    (void)load_raw(path, "RAW");
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "RAW");
  }
}

TEST(RawFormat, BusbwFactorsFollowNcclTests) {
  EXPECT_DOUBLE_EQ(busbw_factor(models::Collective::kAllReduce, 8), 2.0 * 7.0 / 8.0);
  EXPECT_DOUBLE_EQ(busbw_factor(models::Collective::kAllGather, 8), 7.0 / 8.0);
  EXPECT_DOUBLE_EQ(busbw_factor(models::Collective::kReduceScatter, 4), 3.0 / 4.0);
  EXPECT_DOUBLE_EQ(busbw_factor(models::Collective::kAllToAll, 2), 0.5);
  EXPECT_DOUBLE_EQ(busbw_factor(models::Collective::kSendRecv, 8), 1.0);
}

}  // namespace
}  // namespace cpsim::calibrate
