#pragma once
/// @file The file and JSON reading layer of every loader (models, calibrate): whole-file reads
/// whose errors name the path, JSON parsing that refuses duplicate keys, and typed reads whose
/// errors are InputErrors naming the field as `<origin>:<path>` (`gpu.sm_count`,
/// `samples.gemm[3].time_s`).

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace cpsim::models {

using Json = nlohmann::json;

/// Files larger than this are refused before they are read.
inline constexpr std::uintmax_t kMaxJsonFileBytes = 64 * 1024 * 1024;

/// The whole file as text. @throws InputError(field, ...) naming the path when the file is larger
/// than `max_bytes`, cannot be opened or fails while being read.
std::string read_text_file(const std::filesystem::path& path,
                           const std::string& field,
                           std::uintmax_t max_bytes = kMaxJsonFileBytes);

/// Parses JSON text. @throws InputError(origin, "malformed JSON: ...") for bad text and
/// InputError(`<origin>:<path>`, "duplicate key") when an object names a key twice.
Json parse_json(const std::string& text, const std::string& origin);

/// The duplicate-key check of parse_json alone, for readers that parse the text themselves.
/// Malformed text is not an error here (the reader's own parser reports it).
/// @throws InputError(`<origin>:<path>`, "duplicate key ...") for the first key named twice.
void reject_duplicate_json_keys(const std::string& text, const std::string& origin);

/// Appends `text` as a double-quoted JSON string: quotes, backslashes and control bytes escaped
/// (the same escapes serve TOML basic strings and YAML double-quoted scalars).
void append_json_string(std::string& out, std::string_view text);

/// `<origin>:<path>`, or just the origin for the root (empty path).
std::string json_field(const std::string& origin, const std::string& path);
/// The dotted path of member `key` below `path` ("gpu" + "name" -> "gpu.name").
std::string json_child_path(const std::string& path, std::string_view key);
/// Short description of a value for error messages: numbers and short strings verbatim,
/// containers by type.
std::string describe_json(const Json& value);
/// "a, b, c": the known keys of an object, for unknown-key errors.
std::string join_keys(std::initializer_list<std::string_view> known);

/// Typed reads of one value; each throws InputError(field, ...) naming what was expected.
std::int64_t json_integer(const Json& value, const std::string& field);  ///< integral, int64 range
double json_number(const Json& value, const std::string& field);         ///< finite
bool json_bool(const Json& value, const std::string& field);
std::string json_string(const Json& value, const std::string& field);
const Json& json_object(const Json& value, const std::string& field);

/// Member `key` of an object, or nullptr when it is absent or null.
const Json* find_member(const Json& object, std::string_view key);

/// A JSON value together with its origin and path, so that every error names the field.
class JsonNode {
 public:
  JsonNode(const Json& value, std::string origin, std::string path)
      : value_(&value), origin_(std::move(origin)), path_(std::move(path)) {}

  const Json& json() const { return *value_; }
  const std::string& path() const { return path_; }
  /// `<origin>:<path>` (just the origin for the root).
  std::string field() const { return json_field(origin_, path_); }
  std::string child_path(std::string_view key) const { return json_child_path(path_, key); }

  /// Throws InputError(field(), message).
  [[noreturn]] void fail(const std::string& message) const;

  /// This value must be an object whose keys are all in `known`.
  void expect_object(std::initializer_list<std::string_view> known) const;
  void expect_array() const;

  bool has(std::string_view key) const;
  /// Member `key` (must exist).
  JsonNode at(std::string_view key) const;
  /// Element `i` of an array (i < size()).
  JsonNode at(std::size_t i) const;
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

}  // namespace cpsim::models
