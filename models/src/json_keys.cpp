#include "cpsim/models/json_keys.hpp"

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cpsim/models/error.hpp"

namespace cpsim::models {
namespace {

using Json = nlohmann::json;

/// SAX pass over the text that keeps the keys seen in every open object. Objects nested deeper
/// than kMaxDepth end the check (no loader reads such files; the parser after it still does).
class DuplicateKeyFinder final : public nlohmann::json_sax<Json> {
 public:
  explicit DuplicateKeyFinder(const std::string& origin) : origin_(origin) {}

  bool null() override { return value(); }
  bool boolean(bool /*v*/) override { return value(); }
  bool number_integer(number_integer_t /*v*/) override { return value(); }
  bool number_unsigned(number_unsigned_t /*v*/) override { return value(); }
  bool number_float(number_float_t /*v*/, const string_t& /*text*/) override { return value(); }
  bool string(string_t& /*v*/) override { return value(); }
  bool binary(binary_t& /*v*/) override { return value(); }
  bool start_object(std::size_t /*size*/) override { return open(false); }
  bool start_array(std::size_t /*size*/) override { return open(true); }
  bool end_object() override { return close(); }
  bool end_array() override { return close(); }
  bool key(string_t& k) override {
    Frame& f = frames_.back();
    f.current = k;
    if (!f.keys.insert(k).second) {
      throw InputError(field(), fmt::format("duplicate key \"{}\" in one object (only one value "
                                            "would be read; keep one)",
                                            k));
    }
    return true;
  }
  bool parse_error(std::size_t /*position*/,
                   const std::string& /*token*/,
                   const nlohmann::detail::exception& /*e*/) override {
    return false;
  }

 private:
  static constexpr std::size_t kMaxDepth = 512;

  struct Frame {
    bool array = false;
    std::size_t next_index = 0;
    std::string current;  ///< key of the member being read, or "[i]" in an array
    std::set<std::string> keys;
  };

  /// A value starts: in an array, it is the next element.
  bool value() {
    if (!frames_.empty() && frames_.back().array) {
      Frame& f = frames_.back();
      f.current = fmt::format("[{}]", f.next_index++);
    }
    return true;
  }
  bool open(bool array) {
    value();
    if (frames_.size() >= kMaxDepth) {
      return false;
    }
    frames_.push_back(Frame{array, 0, {}, {}});
    return true;
  }
  bool close() {
    frames_.pop_back();
    return true;
  }

  std::string field() const {
    std::string path;
    for (const Frame& f : frames_) {
      if (f.array || path.empty()) {
        path += f.current;
      } else {
        path += "." + f.current;
      }
    }
    return path.empty() ? origin_ : fmt::format("{}:{}", origin_, path);
  }

  const std::string& origin_;
  std::vector<Frame> frames_;
};

}  // namespace

void reject_duplicate_json_keys(std::string_view json_text, const std::string& origin) {
  DuplicateKeyFinder finder(origin);
  (void)Json::sax_parse(json_text.begin(), json_text.end(), &finder);
}

}  // namespace cpsim::models
