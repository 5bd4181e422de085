#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"

namespace cpsim::models {
namespace {

using ::testing::HasSubstr;

DataDir test_data() {
  return DataDir{CPSIM_TEST_DATA_DIR};
}

TEST(BuiltinData, ListsSortedStems) {
  const std::vector<std::string> models = list_builtin(test_data(), "models");
  EXPECT_THAT(models, ::testing::IsSupersetOf({"llama2-7b", "llama2-13b", "llama3-8b", "llama3-70b",
                                               "llama3.1-405b", "qwen3-4b", "qwen3-8b", "qwen3-14b",
                                               "qwen3-32b"}));
  EXPECT_TRUE(std::is_sorted(models.begin(), models.end()));
  EXPECT_THAT(list_builtin(test_data(), "hardware"),
              ::testing::IsSupersetOf({"a100-sxm-40g", "a100-sxm-80g", "a800-sxm-80g", "b200",
                                       "h100-sxm-80g", "h200-141g"}));
  EXPECT_THAT(list_builtin(test_data(), "recipes"), ::testing::Contains("alst"));
  EXPECT_TRUE(list_builtin(test_data(), "no-such-kind").empty());
}

TEST(BuiltinData, EveryModelLoads) {
  const auto names = list_builtin(test_data(), "models");
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const TransformerSpec spec = load_model(name, test_data());
    EXPECT_EQ(spec.name, name);  // the file's `name` matches its file name
    EXPECT_FALSE(spec.source.empty());
    EXPECT_NO_THROW(spec.validate());
  }
}

TEST(BuiltinData, EveryHardwareProfileLoads) {
  const auto names = list_builtin(test_data(), "hardware");
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const HardwareProfile hw = load_hardware(name, test_data());
    EXPECT_EQ(hw.name, name);
    EXPECT_FALSE(hw.provenance.empty());
    EXPECT_FALSE(hw.attention_kernels.empty());
    // Every coefficient says where it comes from: a publication, an inference from one, an
    // explicit assumption or a measurement. A profile with measured coefficients names the folder
    // of data/measurements/ that holds the raw files (which must exist); one without says it was
    // not measured.
    bool measured = false;
    for (const auto& [path, source] : hw.provenance) {
      EXPECT_FALSE(source.empty()) << path;
      measured = measured || source.rfind("measured:", 0) == 0;
    }
    if (!measured) {
      EXPECT_THAT(hw.description, HasSubstr("not measured"));
      continue;
    }
    std::smatch folder;
    ASSERT_TRUE(std::regex_search(hw.description, folder,
                                  std::regex("data/measurements/([A-Za-z0-9._-]+)")))
        << hw.description;
    EXPECT_TRUE(
        std::filesystem::exists(test_data().root / "measurements" / folder[1].str() / "README.md"));
  }
}

// FlashAttention-3 is Hopper-only (sm90): the Hopper profiles have it and the recipes' default;
// the Ampere and Blackwell profiles leave it out rather than borrow Hopper curves.
TEST(BuiltinData, Fa3OnlyOnHopperProfiles) {
  for (const char* name : {"h100-sxm-80g", "h200-141g"}) {
    SCOPED_TRACE(name);
    EXPECT_NO_THROW(
        load_hardware(name, test_data()).attention_kernel(TrainingRecipe{}.attention_kernel));
  }
  for (const char* name : {"a100-sxm-40g", "a100-sxm-80g", "a800-sxm-80g", "b200"}) {
    SCOPED_TRACE(name);
    const HardwareProfile hw = load_hardware(name, test_data());
    EXPECT_EQ(hw.attention_kernels.count("fa3"), 0U);
    EXPECT_THAT(hw.description, HasSubstr("Hopper-only"));
  }
}

// Values checked by hand against the published figures cited in each profile's sources.
TEST(BuiltinData, AmpereProfilesMatchTheDatasheet) {
  constexpr std::int64_t kMiB = 1024 * 1024;
  const HardwareProfile a40 = load_hardware("a100-sxm-40g", test_data());
  const HardwareProfile a80 = load_hardware("a100-sxm-80g", test_data());
  const HardwareProfile a800 = load_hardware("a800-sxm-80g", test_data());
  // NVIDIA A100 datasheet: 312 TFLOP/s dense BF16, 108 SMs; 1,555 GB/s (40 GB HBM2) and
  // 2,039 GB/s (80 GB HBM2e); nvidia-smi totals 40960 and 81920 MiB.
  for (const HardwareProfile* hw : {&a40, &a80, &a800}) {
    SCOPED_TRACE(hw->name);
    EXPECT_DOUBLE_EQ(hw->peak_bf16_flops_per_s, 312e12);
    EXPECT_EQ(hw->peak_fp8_flops_per_s, 0.0);  // no FP8 tensor cores before Hopper
    EXPECT_EQ(hw->sm_count, 108);
    EXPECT_EQ(hw->gpus_per_node, 8);
    EXPECT_NEAR(hw->gemm_max_efficiency, 267.9 / 312, 1e-3);  // ml-engineering MAMF
    // FlashAttention-2 paper: up to 230 TFLOP/s forward on A100 (73 % of 312).
    EXPECT_NEAR(hw->attention_kernel("fa2").fwd_full_flops_per_s(16384), 230e12, 1e12);
    EXPECT_NEAR(hw->host_link.h2d_bytes_per_s, 25e9, 1e9);  // PCIe Gen4 x16 pinned copies
  }
  EXPECT_EQ(a40.hbm_capacity_bytes, 40960 * kMiB);
  EXPECT_EQ(a80.hbm_capacity_bytes, 81920 * kMiB);
  EXPECT_EQ(a800.hbm_capacity_bytes, 81920 * kMiB);
  EXPECT_DOUBLE_EQ(a40.hbm_bandwidth_bytes_per_s, 1555e9);
  EXPECT_DOUBLE_EQ(a80.hbm_bandwidth_bytes_per_s, 2039e9);
  EXPECT_DOUBLE_EQ(a800.hbm_bandwidth_bytes_per_s, 2039e9);
  // NVLink3: 12 links on A100, 8 on A800 (600 vs 400 GB/s bidirectional); NCCL counts 20 GB/s
  // per link. No NVLink SHARP on A100's NVSwitch: all-reduce at the ring bandwidth.
  for (const Collective c : {Collective::kAllGather, Collective::kAllReduce}) {
    EXPECT_DOUBLE_EQ(a80.collective(Span::kIntraNode, c).peak_busbw_bytes_per_s, 240e9);
    EXPECT_DOUBLE_EQ(a800.collective(Span::kIntraNode, c).peak_busbw_bytes_per_s, 160e9);
  }
  EXPECT_DOUBLE_EQ(a800.collective(Span::kInterNode, Collective::kAllToAll).peak_busbw_bytes_per_s,
                   a80.collective(Span::kInterNode, Collective::kAllToAll).peak_busbw_bytes_per_s);
}

TEST(BuiltinData, HopperFp8PeakIsTwiceBf16) {
  // H100 SXM datasheet: 1,979 TFLOP/s dense FP8 (3,958 with sparsity); H200: the same compute.
  for (const char* name : {"h100-sxm-80g", "h200-141g"}) {
    const HardwareProfile hw = load_hardware(name, test_data());
    EXPECT_DOUBLE_EQ(hw.peak_fp8_flops_per_s, 1979e12) << name;
  }
}

TEST(BuiltinData, B200ProfileMatchesTheDatasheet) {
  const HardwareProfile hw = load_hardware("b200", test_data());
  // DGX B200 user guide: "1,440 GB" for 8 GPUs, 180 each in binary units; nvidia-smi reports
  // 183359 MiB (179.1 GiB), not the 192 GB of the HBM3e stacks.
  EXPECT_EQ(hw.hbm_capacity_bytes, std::int64_t{183359} * 1024 * 1024);
  EXPECT_NEAR(static_cast<double>(hw.hbm_capacity_bytes) * 8 / (1024.0 * 1024 * 1024), 1440, 10);
  EXPECT_DOUBLE_EQ(hw.peak_bf16_flops_per_s, 2.25e15);  // HGX B200, 1000 W, dense BF16
  EXPECT_DOUBLE_EQ(hw.peak_fp8_flops_per_s, 4.5e15);    // DGX B200 72 PFLOP/s sparse FP8 / 8 / 2
  EXPECT_DOUBLE_EQ(hw.hbm_bandwidth_bytes_per_s, 8e12);
  EXPECT_EQ(hw.sm_count, 148);
  EXPECT_EQ(hw.gpus_per_node, 8);
  EXPECT_EQ(hw.host_memory_bytes_per_node, 2000000000000);   // DGX B200: 2 TB
  EXPECT_NEAR(hw.gemm_max_efficiency, 1745.0 / 2250, 1e-3);  // ml-engineering MAMF
  // NCCL: 40.1 GB/s per NVLink5 link x 18.
  EXPECT_NEAR(hw.collective(Span::kIntraNode, Collective::kAllGather).peak_busbw_bytes_per_s,
              721.8e9, 1e6);
  // cuDNN on GB200 (cuDNN-frontend results), scaled by the 2.25/2.5 PFLOP/s rating.
  EXPECT_NEAR(hw.attention_kernel("cudnn").fwd_causal_flops_per_s(16384), 0.9 * 1687e12,
              2e12);  // rounded to 1.52e15
}

TEST(BuiltinData, EveryRecipeLoads) {
  const auto names = list_builtin(test_data(), "recipes");
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    EXPECT_EQ(load_recipe(name, test_data()).name, name);
  }
}

TEST(BuiltinData, ResolvesPathsAndJsonSuffix) {
  const auto dir = std::filesystem::path(CPSIM_TEST_DATA_DIR);
  EXPECT_EQ(load_model((dir / "models" / "qwen3-8b.json").string(), test_data()).name, "qwen3-8b");
  EXPECT_EQ(load_model("qwen3-8b.json", test_data()).name, "qwen3-8b");
  EXPECT_EQ(load_hardware((dir / "hardware" / "h200-141g.json").string(), test_data()).name,
            "h200-141g");
}

TEST(BuiltinData, UnknownModelListsTheBuiltIns) {
  try {
    load_model("llama9-1t", test_data());
    ADD_FAILURE() << "found llama9-1t";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--model");
    EXPECT_THAT(e.what(), HasSubstr("unknown model 'llama9-1t'"));
    EXPECT_THAT(e.what(), HasSubstr("llama3-8b, llama3.1-405b"));
    EXPECT_THAT(e.what(), HasSubstr("qwen3-32b"));
    EXPECT_THAT(e.what(), HasSubstr("config.json"));
  }
  try {
    load_model("/no/such/dir/config.json", test_data(), "--baseline-model");
    ADD_FAILURE() << "found a missing file";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--baseline-model");
  }
  EXPECT_THROW(load_model("", test_data()), InputError);
}

TEST(BuiltinData, UnknownHardwareAndRecipeListTheBuiltIns) {
  try {
    load_hardware("mi300x", test_data());
    ADD_FAILURE() << "found mi300x";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--hardware");
    EXPECT_THAT(e.what(), HasSubstr("h100-sxm-80g, h200-141g"));
  }
  try {
    load_recipe("zero1", test_data());
    ADD_FAILURE() << "found zero1";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--recipe");
    EXPECT_THAT(e.what(), HasSubstr("alst"));
  }
}

TEST(BuiltinData, ErrorsInsideABuiltInNameTheFile) {
  // A model file given as a hardware profile fails on the first missing key of the profile.
  const auto path = std::filesystem::path(CPSIM_TEST_DATA_DIR) / "models" / "llama3-8b.json";
  try {
    load_hardware(path.string(), test_data());
    ADD_FAILURE() << "accepted a model file as a profile";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), path.string() + ":schema");
  }
}

TEST(BuiltinData, UnreadableFileNamesTheFlag) {
  const auto path = std::filesystem::temp_directory_path() / "cpsim_models_test_unreadable.json";
  {
    std::ofstream out(path);
    out << "{}";
  }
  std::filesystem::permissions(path, std::filesystem::perms::none);
  if (std::ifstream(path).good()) {
    std::filesystem::remove(path);
    GTEST_SKIP() << "running with privileges that read any file";
  }
  try {
    load_model(path.string(), test_data());
    ADD_FAILURE() << "read an unreadable file";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--model");
    EXPECT_THAT(e.what(), HasSubstr("cannot open"));
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace cpsim::models
