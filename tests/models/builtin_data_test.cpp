#include <algorithm>
#include <filesystem>
#include <fstream>
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
  EXPECT_THAT(models, ::testing::IsSupersetOf({"llama3-8b", "llama3-70b", "llama3.1-405b",
                                               "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-32b"}));
  EXPECT_TRUE(std::is_sorted(models.begin(), models.end()));
  EXPECT_THAT(list_builtin(test_data(), "hardware"),
              ::testing::IsSupersetOf({"h100-sxm-80g", "h200-141g"}));
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
    EXPECT_NO_THROW(hw.attention_kernel(TrainingRecipe{}.attention_kernel));
  }
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
    load_hardware("b200", test_data());
    ADD_FAILURE() << "found b200";
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
