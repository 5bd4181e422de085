// Duplicate keys in JSON text: found at any depth, named by their dotted path; distinct keys,
// equal keys in different objects and malformed text pass (the parser afterwards reports the
// latter).
#include <string>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/json_io.hpp"

namespace cpsim::models {
namespace {

/// The field of the InputError for `text`, or "" when the text passes.
std::string duplicate_field(const std::string& text) {
  try {
    reject_duplicate_json_keys(text, "f.json");
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("duplicate key"), std::string::npos) << e.what();
    return e.field();
  }
  return "";
}

TEST(DuplicateJsonKeys, NamedByPath) {
  EXPECT_EQ(duplicate_field(R"({"a": 1, "a": 2})"), "f.json:a");
  EXPECT_EQ(duplicate_field(R"({"gpu": {"sm_count": 1, "name": "x", "sm_count": 2}})"),
            "f.json:gpu.sm_count");
  EXPECT_EQ(duplicate_field(R"({"c": {"points": [[1, 2], {"x": 1, "x": 1}]}})"),
            "f.json:c.points[1].x");
  EXPECT_EQ(duplicate_field(R"([{"k": 0}, {"k": 1, "k": 1}])"), "f.json:[1].k");
  EXPECT_EQ(duplicate_field(R"({"a": {"b": {}}, "z": 1, "a": 3})"), "f.json:a");
}

TEST(DuplicateJsonKeys, DistinctKeysAndMalformedTextPass) {
  EXPECT_EQ(duplicate_field(R"({"a": {"k": 1}, "b": {"k": 1}, "c": [{"k": 1}, {"k": 2}]})"), "");
  EXPECT_EQ(duplicate_field(R"({"a": 1, "A": 2})"), "");
  EXPECT_EQ(duplicate_field(R"({"a": 1, )"), "");
  EXPECT_EQ(duplicate_field(""), "");
  EXPECT_EQ(duplicate_field(std::string(100000, '[')), "");
}

}  // namespace
}  // namespace cpsim::models
