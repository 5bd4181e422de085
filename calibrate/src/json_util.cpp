#include "json_util.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/json_keys.hpp"

namespace cpsim::calibrate::detail {

namespace {

std::string strip_exception_prefix(std::string message) {
  // e.what() is "[json.exception.parse_error.101] parse error at line 3, column 5: ...".
  if (const auto pos = message.find("] "); pos != std::string::npos) {
    message.erase(0, pos + 2);
  }
  std::replace(message.begin(), message.end(), '\n', ' ');
  return message;
}

}  // namespace

Json parse_json_text(const std::string& text, const std::string& origin) {
  models::reject_duplicate_json_keys(text, origin);
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    throw InputError(origin, fmt::format("malformed JSON: {}", strip_exception_prefix(e.what())));
  }
}

std::string describe(const Json& value) {
  if (value.is_number() || value.is_boolean() || value.is_null()) {
    return value.dump();
  }
  if (value.is_string()) {
    const auto& s = value.get_ref<const std::string&>();
    return s.size() <= 40 ? fmt::format("string \"{}\"", s) : "a string";
  }
  return fmt::format("an {}", value.type_name());
}

std::string Node::field() const {
  return path_.empty() ? origin_ : fmt::format("{}:{}", origin_, path_);
}

std::string Node::child_path(std::string_view key) const {
  return path_.empty() ? std::string(key) : fmt::format("{}.{}", path_, key);
}

void Node::fail(const std::string& message) const {
  throw InputError(field(), message);
}

void Node::expect_object(std::initializer_list<std::string_view> known) const {
  if (!value_->is_object()) {
    fail(fmt::format("must be a JSON object, got {}", describe(*value_)));
  }
  for (const auto& [key, member] : value_->items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string list;
      for (const std::string_view k : known) {
        list += list.empty() ? std::string(k) : fmt::format(", {}", k);
      }
      Node(member, origin_, child_path(key)).fail(fmt::format("unknown key; known keys: {}", list));
    }
  }
}

void Node::expect_array() const {
  if (!value_->is_array()) {
    fail(fmt::format("must be an array, got {}", describe(*value_)));
  }
}

bool Node::has(std::string_view key) const {
  return value_->is_object() && value_->contains(key);
}

Node Node::at(std::string_view key) const {
  const std::string child = child_path(key);
  const auto it = value_->find(key);
  if (it == value_->end()) {
    throw InputError(fmt::format("{}:{}", origin_, child), "required key is missing");
  }
  return Node(*it, origin_, child);
}

Node Node::at(std::size_t i) const {
  return Node((*value_)[i], origin_, fmt::format("{}[{}]", path_, i));
}

double Node::number() const {
  if (!value_->is_number()) {
    fail(fmt::format("must be a number, got {}", describe(*value_)));
  }
  const double d = value_->get<double>();
  if (!std::isfinite(d)) {
    fail(fmt::format("must be finite, got {}", d));
  }
  return d;
}

double Node::positive_number() const {
  const double d = number();
  if (!(d > 0.0)) {
    fail(fmt::format("must be positive, got {}", d));
  }
  return d;
}

double Node::non_negative_number() const {
  const double d = number();
  if (d < 0.0) {
    fail(fmt::format("must not be negative, got {}", d));
  }
  return d;
}

std::int64_t Node::integer() const {
  if (value_->is_number_unsigned()) {
    const auto u = value_->get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
      fail(fmt::format("integer {} is out of range", u));
    }
    return static_cast<std::int64_t>(u);
  }
  if (value_->is_number_integer()) {
    return value_->get<std::int64_t>();
  }
  if (value_->is_number_float()) {
    const double d = value_->get<double>();
    constexpr double kLimit = 9223372036854775808.0;
    if (std::isfinite(d) && std::floor(d) == d && d > -kLimit && d < kLimit) {
      return static_cast<std::int64_t>(d);
    }
  }
  fail(fmt::format("must be an integer, got {}", describe(*value_)));
}

std::int64_t Node::positive_integer() const {
  const std::int64_t v = integer();
  if (v <= 0) {
    fail(fmt::format("must be positive, got {}", v));
  }
  return v;
}

std::int64_t Node::non_negative_integer() const {
  const std::int64_t v = integer();
  if (v < 0) {
    fail(fmt::format("must not be negative, got {}", v));
  }
  return v;
}

int Node::small_int() const {
  const std::int64_t v = integer();
  if (v < std::numeric_limits<int>::min() || v > std::numeric_limits<int>::max()) {
    fail(fmt::format("{} is out of range", v));
  }
  return static_cast<int>(v);
}

bool Node::boolean() const {
  if (!value_->is_boolean()) {
    fail(fmt::format("must be true or false, got {}", describe(*value_)));
  }
  return value_->get<bool>();
}

std::string Node::string() const {
  if (!value_->is_string()) {
    fail(fmt::format("must be a string, got {}", describe(*value_)));
  }
  return value_->get<std::string>();
}

std::string Node::non_empty_string() const {
  std::string s = string();
  if (s.find_first_not_of(" \t\r\n") == std::string::npos) {
    fail("must not be empty");
  }
  return s;
}

}  // namespace cpsim::calibrate::detail
