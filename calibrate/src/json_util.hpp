#pragma once
// Strict typed access to nlohmann::json values for the calibrate readers. Every error is an
// InputError whose field is `<origin>:<path>` ("raw.json:samples.gemm[3].time_s"). Private to
// calibrate/src.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cpsim::calibrate::detail {

using Json = nlohmann::json;

/// Parses JSON text; malformed text becomes InputError(origin, "malformed JSON: ...").
Json parse_json_text(const std::string& text, const std::string& origin);

/// A JSON value together with its path, for errors that name the field.
class Node {
 public:
  Node(const Json& value, std::string origin, std::string path)
      : value_(&value), origin_(std::move(origin)), path_(std::move(path)) {}

  const Json& json() const { return *value_; }
  const std::string& path() const { return path_; }
  /// `<origin>:<path>` (just the origin for the root).
  std::string field() const;
  std::string child_path(std::string_view key) const;

  /// Throws InputError(field(), message).
  [[noreturn]] void fail(const std::string& message) const;

  /// This value must be an object whose keys are all in `known`.
  void expect_object(std::initializer_list<std::string_view> known) const;
  void expect_array() const;

  bool has(std::string_view key) const;
  /// Member `key` (must exist).
  Node at(std::string_view key) const;
  /// Element `i` of an array.
  Node at(std::size_t i) const;
  std::size_t size() const { return value_->size(); }

  double number() const;  ///< finite number
  double positive_number() const;
  double non_negative_number() const;
  std::int64_t integer() const;  ///< integral number in int64 range
  std::int64_t positive_integer() const;
  std::int64_t non_negative_integer() const;
  int small_int() const;  ///< integer in int range
  bool boolean() const;
  std::string string() const;
  std::string non_empty_string() const;

 private:
  const Json* value_;
  std::string origin_;
  std::string path_;
};

/// Short description of a JSON value for error messages.
std::string describe(const Json& value);

}  // namespace cpsim::calibrate::detail
