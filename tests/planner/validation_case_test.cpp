// The validation case loader (schema cpsim.validation/1): every public case parses, a good case
// reads back field by field, and bad input is refused with an InputError naming the field.
#include "cpsim/planner/validation_case.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"

namespace cpsim::planner {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using ::testing::HasSubstr;

Json good_case() {
  return Json::parse(R"({
    "schema": "cpsim.validation/1",
    "id": "demo-case",
    "row": 7,
    "title": "A demo",
    "quantity": "max_seq_len",
    "published": 3700000,
    "tolerance": {"relative": 0.2, "why": "one recipe step"},
    "setup": {"model": "llama3-8b", "gpus": 8, "gpus-per-node": 4, "recipe": "alst",
              "seq": 131072, "fused-loss": true, "heads-per-stage": 16, "zero": 3,
              "ring-layout": "zigzag", "impl": "deepspeed-ulysses"},
    "source": "REFERENCES.md [ALST]",
    "granularity": "100000"
  })");
}

/// The field of the InputError that parsing `j` raises ("" when it parses).
std::string error_field(const std::string& text) {
  try {
    (void)parse_validation_case(text, "case.json");
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr(e.field())) << "the message names the field";
    return e.field();
  }
  return "";
}

std::string error_field(const Json& j) {
  return error_field(j.dump());
}

TEST(ValidationCase, GoodCaseReadsBack) {
  const ValidationCase c = parse_validation_case(good_case().dump(), "case.json");
  EXPECT_EQ(c.id, "demo-case");
  EXPECT_EQ(c.row, 7);
  EXPECT_EQ(c.title, "A demo");
  EXPECT_EQ(c.quantity, "max_seq_len");
  EXPECT_EQ(c.published, 3700000.0);
  EXPECT_EQ(c.tolerance, 0.2);
  EXPECT_EQ(c.tolerance_why, "one recipe step");
  EXPECT_EQ(c.source, "REFERENCES.md [ALST]");
  EXPECT_EQ(c.granularity, "100000");
  EXPECT_EQ(c.skip, "");
  const ValidationSetup& s = c.setup;
  EXPECT_EQ(s.method, "ulysses") << "a case without a method is a Ulysses case";
  EXPECT_EQ(s.model, "llama3-8b");
  EXPECT_EQ(s.gpus, 8);
  EXPECT_EQ(s.gpus_per_node, 4);
  EXPECT_EQ(s.recipe, "alst");
  EXPECT_EQ(s.seq, "131072") << "numbers are taken as their JSON text";
  EXPECT_EQ(s.fused_loss, "true") << "booleans are taken as their JSON text";
  EXPECT_EQ(s.heads_per_stage, 16);
  EXPECT_EQ(s.zero, 3);
  EXPECT_EQ(s.ring_layout, "zigzag");
  EXPECT_FALSE(s.hardware.has_value()) << "keys the case does not give stay unset";
  EXPECT_FALSE(s.ulysses_degree.has_value());
  EXPECT_FALSE(s.ac.has_value());
}

TEST(ValidationCase, OptionalFieldsDefault) {
  Json j = good_case();
  j.erase("row");
  j.erase("granularity");
  j["skip"] = "cannot express the recipe yet";
  j["setup"]["method"] = "fpdt";
  const ValidationCase c = parse_validation_case(j.dump(), "case.json");
  EXPECT_EQ(c.row, 0);
  EXPECT_EQ(c.granularity, "64K");
  EXPECT_EQ(c.skip, "cannot express the recipe yet");
  EXPECT_EQ(c.setup.method, "fpdt");
  j["row"] = nullptr;
  EXPECT_EQ(parse_validation_case(j.dump(), "case.json").row, 0);
}

TEST(ValidationCase, BoundSetupNoteAndKernelKeys) {
  Json j = good_case();
  j["bound"] = "lower";
  EXPECT_EQ(error_field(j), "case.json:bound_quote");  // one-sided only with the source's words
  j["bound_quote"] = "we stopped at 3.7M, well below the limit";
  j["open_gap"] = "not yet";
  j["setup_note"] = "offloads parameters";
  j["setup"]["param-offload"] = "on";
  j["setup"]["norm-kernel"] = "eager";
  j["setup"]["mlp-kernel"] = "fused";
  j["setup"]["int32-indexing"] = false;
  j["setup"]["tp"] = 8;
  j["setup"]["micro-batches"] = 16;
  j["setup"]["pp"] = 4;
  j["setup"]["pp-schedule"] = "interleaved";
  j["setup"]["virtual-stages"] = 2;
  const ValidationCase c = parse_validation_case(j.dump(), "case.json");
  EXPECT_EQ(c.bound, "lower");
  EXPECT_EQ(c.bound_quote, "we stopped at 3.7M, well below the limit");
  EXPECT_EQ(c.open_gap, "not yet");
  EXPECT_EQ(c.setup.impl, "deepspeed-ulysses");
  EXPECT_EQ(c.setup_note, "offloads parameters");
  EXPECT_EQ(c.setup.param_offload, "on");
  EXPECT_EQ(c.setup.norm_kernel, "eager");
  EXPECT_EQ(c.setup.mlp_kernel, "fused");
  EXPECT_EQ(c.setup.int32_indexing, "false");
  EXPECT_EQ(c.setup.tp, 8);
  EXPECT_EQ(c.setup.micro_batches, 16);
  EXPECT_EQ(c.setup.pp, 4);
  EXPECT_EQ(c.setup.pp_schedule, "interleaved");
  EXPECT_EQ(c.setup.virtual_stages, 2);
  EXPECT_EQ(parse_validation_case(good_case().dump(), "case.json").bound, "two-sided");
  Json no_impl = good_case();
  no_impl["setup"].erase("impl");
  EXPECT_EQ(error_field(no_impl), "case.json:setup.impl");
}

TEST(ValidationCase, EveryPublicCaseLoads) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(fs::path(CPSIM_TEST_DATA_DIR) / "validation")) {
    if (e.path().extension() == ".json")
      files.push_back(e.path());
  }
  ASSERT_FALSE(files.empty());
  for (const fs::path& f : files) {
    SCOPED_TRACE(f.string());
    const ValidationCase c = load_validation_case(f);
    EXPECT_EQ(c.id, f.stem().string()) << "a case's id is its file name";
    EXPECT_GT(c.published, 0.0);
    EXPECT_TRUE(c.setup.model.has_value());
  }
}

// Every quantity the list names parses, and nothing else does.
TEST(ValidationCase, EveryListedQuantityParses) {
  const auto quantities = validation_quantities();
  ASSERT_EQ(quantities.size(), 7U);
  for (const std::string_view q : quantities) {
    Json j = good_case();
    j["quantity"] = std::string(q);
    EXPECT_EQ(parse_validation_case(j.dump(), "case.json").quantity, q);
  }
  EXPECT_NE(std::find(quantities.begin(), quantities.end(), "activation_peak_bytes"),
            quantities.end());
}

TEST(ValidationCase, LoadNamesTheFileItCannotRead) {
  try {
    (void)load_validation_case(fs::path(CPSIM_TEST_DATA_DIR) / "validation" / "no-such.json");
    FAIL() << "a missing file was accepted";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "no-such.json");
    EXPECT_THAT(e.what(), HasSubstr("cannot read"));
  }
}

// Gaps several cases share: listed by key, each read from gaps/<key>.md beside the case (its
// text without the final newline); a key that is not a plain name, or a missing or empty file, is
// refused naming the field.
TEST(ValidationCase, SharedGapsAreReadBesideTheCase) {
  const fs::path dir = fs::temp_directory_path() / "cpsim-validation-case-test";
  fs::remove_all(dir);
  fs::create_directories(dir / "gaps");
  std::ofstream(dir / "gaps" / "loss-read.md") << "Read the loss.\n";
  std::ofstream(dir / "gaps" / "empty.md") << "\n";
  auto write_case = [&](const Json& keys) {
    Json j = good_case();
    j["open_gap"] = "own text";
    j["shared_gaps"] = keys;
    std::ofstream(dir / "demo-case.json") << j.dump();
    return dir / "demo-case.json";
  };
  const ValidationCase c = load_validation_case(write_case(Json::array({"loss-read"})));
  EXPECT_EQ(c.open_gap, "own text");
  ASSERT_EQ(c.shared_gaps.size(), 1U);
  EXPECT_EQ(c.shared_gaps[0].key, "loss-read");
  EXPECT_EQ(c.shared_gaps[0].text, "Read the loss.");
  for (const Json& keys :
       {Json::array({"missing"}), Json::array({"empty"}), Json::array({"../gaps/loss-read"}),
        Json::array({""}), Json("loss-read"), Json::array({3})}) {
    try {
      (void)load_validation_case(write_case(keys));
      ADD_FAILURE() << "accepted " << keys;
    } catch (const InputError& e) {
      EXPECT_THAT(e.field(), ::testing::StartsWith("demo-case.json")) << keys;
      if (keys.is_array() && keys[0].is_string()) {
        EXPECT_EQ(e.field(), "demo-case.json:shared_gaps") << keys;
      }
    }
  }
  fs::remove_all(dir);
}

TEST(ValidationCase, BadInputNamesTheField) {
  EXPECT_EQ(error_field(good_case()), "");
  EXPECT_EQ(error_field(std::string("{\"schema\": ")), "case.json") << "malformed JSON";
  EXPECT_EQ(error_field(std::string("{\"published\": 1e999}")), "case.json") << "overflow";
  EXPECT_EQ(error_field(std::string("[1, 2]")), "case.json:schema");

  Json j = good_case();
  j["schema"] = "cpsim.validation/2";
  EXPECT_EQ(error_field(j), "case.json:schema");

  j = good_case();
  j.erase("id");
  EXPECT_EQ(error_field(j), "case.json:id");

  j = good_case();
  j["title"] = 5;
  EXPECT_EQ(error_field(j), "case.json") << "wrong type";

  j = good_case();
  j["quantity"] = "bananas";
  EXPECT_EQ(error_field(j), "case.json:quantity");

  j = good_case();
  j["published"] = -1.0;
  EXPECT_EQ(error_field(j), "case.json:published");

  j = good_case();
  j["tolerance"]["relative"] = 1.5;
  EXPECT_EQ(error_field(j), "case.json:published");

  for (const Json& row : {Json(1e300), Json(-3), Json(4294967296LL), Json("24")}) {
    j = good_case();
    j["row"] = row;
    EXPECT_EQ(error_field(j), "case.json:row") << row;
  }

  j = good_case();
  j["bound"] = "upper";
  EXPECT_EQ(error_field(j), "case.json:bound");

  j = good_case();
  j["bound"] = "lower";
  j["quantity"] = "mfu";
  EXPECT_EQ(error_field(j), "case.json:bound") << "a lower bound needs a max_seq_len case";

  j = good_case();
  j["setup_note"] = Json::array();
  EXPECT_EQ(error_field(j), "case.json") << "wrong type";

  j = good_case();
  j["setup"] = "llama3-8b";
  EXPECT_EQ(error_field(j), "case.json:setup");

  j = good_case();
  j.erase("setup");
  EXPECT_EQ(error_field(j), "case.json:setup");

  j = good_case();
  j["setup"]["bananas"] = 3;
  EXPECT_EQ(error_field(j), "case.json:setup.bananas");

  for (const Json& gpus : {Json("8"), Json(8.5), Json(4294967304ULL), Json(nullptr)}) {
    j = good_case();
    j["setup"]["gpus"] = gpus;
    EXPECT_EQ(error_field(j), "case.json:setup.gpus") << gpus;
  }

  for (const Json& model : {Json::array({"llama3-8b"}), Json::object(), Json(nullptr)}) {
    j = good_case();
    j["setup"]["model"] = model;
    EXPECT_EQ(error_field(j), "case.json:setup.model") << model;
  }
}

}  // namespace
}  // namespace cpsim::planner
