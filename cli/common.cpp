#include "common.hpp"

#include <algorithm>
#include <cstdlib>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::cli {

models::DataDir data_dir() {
  if (const char* env = std::getenv("CPSIM_DATA_DIR"); env != nullptr && *env != '\0') {
    return {std::filesystem::path(env)};
  }
  return {std::filesystem::path(CPSIM_DATA_DIR_DEFAULT)};
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

}  // namespace cpsim::cli
