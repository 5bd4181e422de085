#include "cpsim/models/json_io.hpp"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {
namespace {

using ::testing::HasSubstr;

/// The InputError a call throws, as "field|message"; "" when it throws none.
template <typename F>
std::string error_of(F&& call) {
  try {
    call();
  } catch (const InputError& e) {
    const std::string what = e.what();
    return e.field() + "|" + what.substr(e.field().size() + 2);
  }
  return "";
}

TEST(JsonIo, ReadTextFileNamesThePath) {
  const std::filesystem::path dir = std::filesystem::path(testing::TempDir()) / "cpsim_json_io";
  std::filesystem::create_directories(dir);
  const std::filesystem::path file = dir / "small.json";
  std::ofstream(file) << "{\"a\": 1}";
  EXPECT_EQ(read_text_file(file, "--model"), "{\"a\": 1}");
  EXPECT_EQ(error_of([&] { read_text_file(dir / "missing.json", "--model"); }),
            "--model|cannot open '" + (dir / "missing.json").string() + "' for reading");
  EXPECT_EQ(error_of([&] { read_text_file(file, "--model", 4); }),
            "--model|'" + file.string() + "' is too large (8 bytes)");
}

TEST(JsonIo, ParseNamesMalformedTextAndDuplicateKeys) {
  EXPECT_THAT(error_of([] { parse_json("{\"a\": }", "x.json"); }),
              HasSubstr("x.json|malformed JSON: parse error at line 1, column 7: syntax error"));
  EXPECT_EQ(error_of([] { parse_json(R"({"a": 1, "a": 2})", "x.json"); }),
            "x.json:a|duplicate key \"a\" in one object (only one value would be read; keep one)");
  EXPECT_EQ(
      error_of([] { parse_json(R"({"s": [{"k": 1}, {"k": 1, "k": 2}]})", "x.json"); }),
      "x.json:s[1].k|duplicate key \"k\" in one object (only one value would be read; keep one)");
  EXPECT_EQ(
      error_of([] { parse_json(R"({"s": [1, [2], {"o": {"k": 1, "k": 1}}]})", "x.json"); }),
      "x.json:s[2].o.k|duplicate key \"k\" in one object (only one value would be read; keep one)");
  // The same key in sibling objects is no duplicate.
  const Json ok = parse_json(R"({"a": {"k": 1}, "b": {"k": 2}, "c": [{"k": 3}, {"k": 4}]})", "x");
  EXPECT_EQ(ok["c"][1]["k"], 4);
}

TEST(JsonIo, TypedReadsNameTheField) {
  const Json v = parse_json(R"({"i": 8.0, "f": 1.5, "s": "x", "b": true, "n": null,
                                 "big": 9223372036854775808})",
                            "x.json");
  EXPECT_EQ(json_integer(v["i"], "f"), 8);
  EXPECT_EQ(error_of([&] { json_integer(v["f"], "x.json:f"); }),
            "x.json:f|must be an integer, got 1.5");
  EXPECT_EQ(error_of([&] { json_integer(v["big"], "x.json:big"); }),
            "x.json:big|integer 9223372036854775808 is out of range");
  EXPECT_EQ(error_of([&] { json_number(v["s"], "x.json:s"); }),
            "x.json:s|must be a number, got string \"x\"");
  EXPECT_EQ(error_of([&] { json_bool(v["i"], "x.json:i"); }),
            "x.json:i|must be true or false, got 8.0");
  EXPECT_EQ(error_of([&] { json_string(v["b"], "x.json:b"); }),
            "x.json:b|must be a string, got true");
  EXPECT_EQ(error_of([&] { json_object(v["s"], "x.json:s"); }),
            "x.json:s|must be a JSON object, got string \"x\"");
  EXPECT_EQ(find_member(v, "n"), nullptr);
  EXPECT_EQ(find_member(v, "absent"), nullptr);
  EXPECT_NE(find_member(v, "s"), nullptr);
}

TEST(JsonIo, NodeNamesPathsAndUnknownKeys) {
  const Json v = parse_json(R"({"a": {"list": [1, -2]}, "typo": 1})", "r.json");
  const JsonNode root(v, "r.json", "");
  EXPECT_EQ(root.field(), "r.json");
  EXPECT_EQ(error_of([&] { root.expect_object({"a"}); }), "r.json:typo|unknown key; known keys: a");
  const JsonNode list = root.at("a").at("list");
  EXPECT_EQ(list.at(std::size_t{0}).positive_integer(), 1);
  EXPECT_EQ(error_of([&] { list.at(std::size_t{1}).non_negative_integer(); }),
            "r.json:a.list[1]|must not be negative, got -2");
  EXPECT_EQ(error_of([&] { root.at("a").at("missing"); }),
            "r.json:a.missing|required key is missing");
  EXPECT_EQ(error_of([&] { root.at("a").expect_array(); }),
            "r.json:a|must be an array, got an object");
}

}  // namespace
}  // namespace cpsim::models
