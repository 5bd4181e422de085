#include "cpsim/models/json_io.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>
#include <system_error>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {
namespace {

namespace fs = std::filesystem;

/// nlohmann's what() without its "[json.exception.parse_error.101] " prefix, on one line.
std::string strip_exception_prefix(std::string message) {
  if (const auto pos = message.find("] "); pos != std::string::npos) {
    message.erase(0, pos + 2);
  }
  std::replace(message.begin(), message.end(), '\n', ' ');
  return message;
}

/// Parse callback state that refuses a key named twice in one object. One frame per open
/// container: how its parent names it (a key, or an index in an array), the keys seen (objects)
/// or the next element index (arrays). Paths are built only for an error: storing each frame's
/// whole path made deeply nested text quadratic in memory (100,000 nested arrays took 15 GB).
class DuplicateKeyCheck {
 public:
  explicit DuplicateKeyCheck(const std::string& origin) : origin_(origin) {}

  bool operator()(int /*depth*/, Json::parse_event_t event, const Json& parsed) {
    switch (event) {
      case Json::parse_event_t::object_start:
      case Json::parse_event_t::array_start:
        open(event == Json::parse_event_t::array_start);
        break;
      case Json::parse_event_t::object_end:
      case Json::parse_event_t::array_end:
        frames_.pop_back();
        break;
      case Json::parse_event_t::key:
        add_key(parsed.get_ref<const std::string&>());
        break;
      case Json::parse_event_t::value:
        if (!frames_.empty() && frames_.back().is_array) {
          ++frames_.back().next_index;
        }
        break;
    }
    return true;
  }

 private:
  struct Frame {
    std::string key;        ///< its key in the parent object (parent not an array)
    std::size_t index = 0;  ///< its index in the parent array
    bool is_array = false;
    std::size_t next_index = 0;
    std::unordered_set<std::string> keys;
  };

  /// A container starts (counted as an element of a parent array).
  void open(bool is_array) {
    Frame frame;
    frame.is_array = is_array;
    if (!frames_.empty()) {
      Frame& parent = frames_.back();
      if (parent.is_array) {
        frame.index = parent.next_index++;
      } else {
        frame.key = last_key_;
      }
    }
    frames_.push_back(std::move(frame));
  }

  /// The dotted path of the innermost open container ("gpu", "c.points[1]").
  std::string path() const {
    std::string out;
    for (std::size_t i = 1; i < frames_.size(); ++i) {
      out = frames_[i - 1].is_array ? fmt::format("{}[{}]", out, frames_[i].index)
                                    : json_child_path(out, frames_[i].key);
    }
    return out;
  }

  void add_key(const std::string& key) {
    Frame& object = frames_.back();
    if (!object.keys.insert(key).second) {
      throw InputError(json_field(origin_, json_child_path(path(), key)),
                       fmt::format("duplicate key \"{}\" in one object (only one value would be "
                                   "read; keep one)",
                                   key));
    }
    last_key_ = key;
  }

  const std::string& origin_;
  std::vector<Frame> frames_;
  std::string last_key_;
};

}  // namespace

std::string read_text_file(const fs::path& path,
                           const std::string& field,
                           std::uintmax_t max_bytes) {
  std::error_code ec;
  const std::uintmax_t size = fs::file_size(path, ec);
  if (!ec && size > max_bytes) {
    throw InputError(field, fmt::format("'{}' is too large ({} bytes)", path.string(), size));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(field, fmt::format("cannot open '{}' for reading", path.string()));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) {
    throw InputError(field, fmt::format("error while reading '{}'", path.string()));
  }
  return text.str();
}

Json parse_json(const std::string& text, const std::string& origin) {
  DuplicateKeyCheck check(origin);
  try {
    return Json::parse(text, [&check](int depth, Json::parse_event_t event, Json& parsed) {
      return check(depth, event, parsed);
    });
  } catch (const Json::exception& e) {
    throw InputError(origin, fmt::format("malformed JSON: {}", strip_exception_prefix(e.what())));
  }
}

void reject_duplicate_json_keys(const std::string& text, const std::string& origin) {
  DuplicateKeyCheck check(origin);
  const Json ignored = Json::parse(
      text,
      [&check](int depth, Json::parse_event_t event, Json& parsed) {
        return check(depth, event, parsed);
      },
      /*allow_exceptions=*/false);
  static_cast<void>(ignored);
}

void append_json_string(std::string& out, std::string_view text) {
  out += '"';
  for (const char ch : text) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20) {
          fmt::format_to(std::back_inserter(out), "\\u{:04x}", static_cast<unsigned char>(ch));
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

std::string json_field(const std::string& origin, const std::string& path) {
  return path.empty() ? origin : fmt::format("{}:{}", origin, path);
}

std::string json_child_path(const std::string& path, std::string_view key) {
  return path.empty() ? std::string(key) : fmt::format("{}.{}", path, key);
}

std::string describe_json(const Json& value) {
  if (value.is_number() || value.is_boolean() || value.is_null()) {
    return value.dump();
  }
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    return s.size() <= 40 ? fmt::format("string \"{}\"", s) : "a string";
  }
  return fmt::format("an {}", value.type_name());
}

std::string join_keys(std::initializer_list<std::string_view> known) {
  std::string list;
  for (const std::string_view k : known) {
    list += list.empty() ? std::string(k) : fmt::format(", {}", k);
  }
  return list;
}

std::int64_t json_integer(const Json& value, const std::string& field) {
  if (value.is_number_unsigned()) {
    const auto u = value.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      throw InputError(field, fmt::format("integer {} is out of range", u));
    }
    return static_cast<std::int64_t>(u);
  }
  if (value.is_number_integer()) {
    return value.get<std::int64_t>();
  }
  if (value.is_number_float()) {
    // Integral doubles (8.0) are accepted; 2^63 is the first value out of int64 range.
    const double d = value.get<double>();
    constexpr double kLimit = 9223372036854775808.0;
    if (std::isfinite(d) && std::floor(d) == d && d > -kLimit && d < kLimit) {
      return static_cast<std::int64_t>(d);
    }
  }
  throw InputError(field, fmt::format("must be an integer, got {}", describe_json(value)));
}

double json_number(const Json& value, const std::string& field) {
  if (!value.is_number()) {
    throw InputError(field, fmt::format("must be a number, got {}", describe_json(value)));
  }
  const double d = value.get<double>();
  if (!std::isfinite(d)) {
    throw InputError(field, fmt::format("must be finite, got {}", d));
  }
  return d;
}

bool json_bool(const Json& value, const std::string& field) {
  if (!value.is_boolean()) {
    throw InputError(field, fmt::format("must be true or false, got {}", describe_json(value)));
  }
  return value.get<bool>();
}

std::string json_string(const Json& value, const std::string& field) {
  if (!value.is_string()) {
    throw InputError(field, fmt::format("must be a string, got {}", describe_json(value)));
  }
  return value.get<std::string>();
}

const Json& json_object(const Json& value, const std::string& field) {
  if (!value.is_object()) {
    throw InputError(field, fmt::format("must be a JSON object, got {}", describe_json(value)));
  }
  return value;
}

const Json* find_member(const Json& object, std::string_view key) {
  const auto it = object.find(key);
  if (it == object.end() || it->is_null()) {
    return nullptr;
  }
  return &*it;
}

// -------------------------------------------------------------------------------------------------
// JsonNode

void JsonNode::fail(const std::string& message) const {
  throw InputError(field(), message);
}

void JsonNode::expect_object(std::initializer_list<std::string_view> known) const {
  json_object(*value_, field());
  for (const auto& [key, member] : value_->items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      JsonNode(member, origin_, child_path(key))
          .fail(fmt::format("unknown key; known keys: {}", join_keys(known)));
    }
  }
}

void JsonNode::expect_array() const {
  if (!value_->is_array()) {
    fail(fmt::format("must be an array, got {}", describe_json(*value_)));
  }
}

bool JsonNode::has(std::string_view key) const {
  return value_->is_object() && value_->contains(key);
}

JsonNode JsonNode::at(std::string_view key) const {
  const std::string child = child_path(key);
  const auto it = value_->find(key);
  if (it == value_->end()) {
    throw InputError(json_field(origin_, child), "required key is missing");
  }
  return JsonNode(*it, origin_, child);
}

JsonNode JsonNode::at(std::size_t i) const {
  return JsonNode((*value_)[i], origin_, fmt::format("{}[{}]", path_, i));
}

double JsonNode::number() const {
  return json_number(*value_, field());
}

double JsonNode::positive_number() const {
  const double d = number();
  if (!(d > 0.0)) {
    fail(fmt::format("must be positive, got {}", d));
  }
  return d;
}

double JsonNode::non_negative_number() const {
  const double d = number();
  if (d < 0.0) {
    fail(fmt::format("must not be negative, got {}", d));
  }
  return d;
}

std::int64_t JsonNode::integer() const {
  return json_integer(*value_, field());
}

std::int64_t JsonNode::positive_integer() const {
  const std::int64_t v = integer();
  if (v <= 0) {
    fail(fmt::format("must be positive, got {}", v));
  }
  return v;
}

std::int64_t JsonNode::non_negative_integer() const {
  const std::int64_t v = integer();
  if (v < 0) {
    fail(fmt::format("must not be negative, got {}", v));
  }
  return v;
}

int JsonNode::small_int() const {
  const std::int64_t v = integer();
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    fail(fmt::format("{} is out of range", v));
  }
  return static_cast<int>(v);
}

bool JsonNode::boolean() const {
  return json_bool(*value_, field());
}

std::string JsonNode::string() const {
  return json_string(*value_, field());
}

std::string JsonNode::non_empty_string() const {
  std::string s = string();
  if (s.find_first_not_of(" \t\r\n") == std::string::npos) {
    fail("must not be empty");
  }
  return s;
}

}  // namespace cpsim::models
