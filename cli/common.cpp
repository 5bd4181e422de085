#include "common.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <dlfcn.h>
#include <sstream>
#include <string_view>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

namespace cpsim::cli {

models::DataDir data_dir() {
  if (const char* env = std::getenv("CPSIM_DATA_DIR"); env != nullptr && *env != '\0') {
    std::error_code ec;
    if (!std::filesystem::is_directory(env, ec)) {
      throw InputError("CPSIM_DATA_DIR",
                       fmt::format("'{}' is not a directory (the environment variable names the "
                                   "folder of built-in models, hardware and recipes; unset it to "
                                   "use the built-in data)",
                                   env));
    }
    return {std::filesystem::path(env)};
  }
  // An installed copy (the Python package) carries its data beside the code: data/ next to the
  // file this function was loaded from. The binary in a build tree has none there.
  Dl_info info{};
  if (dladdr(reinterpret_cast<const void*>(&data_dir), &info) != 0 && info.dli_fname != nullptr) {
    std::error_code ec;
    const std::filesystem::path beside =
        std::filesystem::path(info.dli_fname).parent_path() / "data";
    if (std::filesystem::is_directory(beside / "models", ec)) {
      return {beside};
    }
  }
  return {std::filesystem::path(CPSIM_DATA_DIR_DEFAULT)};
}

double parse_duration_s(const std::string& text, const std::string& field) {
  static constexpr std::pair<std::string_view, double> kUnits[] = {
      {"min", 60.0}, {"s", 1.0}, {"h", 3600.0}, {"d", 86400.0}};
  std::string_view number = text;
  double unit_s = 1.0;
  for (const auto& [suffix, seconds] : kUnits) {
    if (number.size() > suffix.size() && number.ends_with(suffix)) {
      number.remove_suffix(suffix.size());
      unit_s = seconds;
      break;
    }
  }
  double value = 0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  if (ec != std::errc() || end != number.data() + number.size() || !std::isfinite(value) ||
      value <= 0) {
    throw InputError(field, fmt::format("'{}' is not a positive duration (a number with s, min, "
                                        "h or d; a plain number is seconds)",
                                        text));
  }
  return value * unit_s;
}

std::int64_t memory_margin_bytes(const std::string& text,
                                 std::int64_t capacity_bytes,
                                 const std::string& field,
                                 const std::string& what) {
  std::string number = text;
  double unit = static_cast<double>(kGiB);  // a plain number is GiB
  bool percent = false;
  auto strip = [&number](std::string_view suffix) {
    if (number.size() > suffix.size() && number.ends_with(suffix)) {
      number.resize(number.size() - suffix.size());
      return true;
    }
    return false;
  };
  if (strip("%")) {
    percent = true;
  } else if (strip("GiB")) {
    unit = static_cast<double>(kGiB);
  } else if (strip("MiB")) {
    unit = static_cast<double>(kMiB);
  }
  double value = 0.0;
  const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), value);
  const double capacity = static_cast<double>(capacity_bytes);
  const double bytes = percent ? value / 100.0 * capacity : value * unit;
  if (percent && capacity_bytes <= 0 && ec == std::errc() && value >= 0.0 && value < 100.0) {
    return 0;  // a profile without this memory: nothing to keep free
  }
  if (ec != std::errc() || end != number.data() + number.size() || number.empty()) {
    throw InputError(field, fmt::format("expected a percentage of the {} (5%) or a size in GiB "
                                        "(4, 4GiB, 512MiB), got '{}'",
                                        what, text));
  }
  if (!(bytes >= 0.0) || !(bytes < capacity)) {
    throw InputError(field, fmt::format("'{}' is out of range: the margin kept free must be at "
                                        "least 0 and below the {} of {:.4g} GiB",
                                        text, what, capacity / static_cast<double>(kGiB)));
  }
  return static_cast<std::int64_t>(bytes);
}

bool parse_switch(const std::string& text, const std::string& field) {
  std::string t = text;
  std::transform(t.begin(), t.end(), t.begin(), [](unsigned char c) { return std::tolower(c); });
  if (t == "on" || t == "true" || t == "yes" || t == "1") {
    return true;
  }
  if (t == "off" || t == "false" || t == "no" || t == "0") {
    return false;
  }
  throw InputError(field, fmt::format("expected on or off, got '{}'", text));
}

std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& numeric) {
  std::vector<std::size_t> width(header.size(), 0);
  for (std::size_t c = 0; c < header.size(); ++c) {
    width[c] = header[c].size();
    for (const auto& row : rows) {
      width[c] = std::max(width[c], row[c].size());
    }
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string s;
    for (std::size_t c = 0; c < cells.size(); ++c) {
      const bool right = c < numeric.size() && numeric[c];
      s += right ? fmt::format("{:>{}}", cells[c], width[c])
                 : fmt::format("{:<{}}", cells[c], width[c]);
      if (c + 1 < cells.size()) {
        s += "  ";
      }
    }
    while (!s.empty() && s.back() == ' ') {
      s.pop_back();
    }
    return s + "\n";
  };
  std::string out = line(header);
  std::vector<std::string> rule;
  for (std::size_t w : width) {
    rule.emplace_back(w, '-');
  }
  out += line(rule);
  for (const auto& row : rows) {
    out += line(row);
  }
  return out;
}

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) {
    return s;
  }
  std::string o = "\"";
  for (char c : s) {
    if (c == '"') {
      o += '"';
    }
    o += c;
  }
  return o + "\"";
}

std::string indent_lines(const std::string& text, const std::string& prefix) {
  std::string o;
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    o += prefix + line + "\n";
  }
  return o;
}

}  // namespace cpsim::cli
