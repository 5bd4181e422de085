#include "common.hpp"

#include <algorithm>
#include <cstdlib>

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
  return {std::filesystem::path(CPSIM_DATA_DIR_DEFAULT)};
}

std::int64_t memory_margin_bytes(double margin_gib, const models::HardwareProfile& hardware) {
  const double capacity_gib =
      static_cast<double>(hardware.hbm_capacity_bytes) / static_cast<double>(kGiB);
  if (!(margin_gib >= 0.0) || !(margin_gib < capacity_gib)) {
    throw InputError("--memory-margin",
                     fmt::format("{} GiB is out of range: the margin kept free on every GPU must "
                                 "be at least 0 and below the {:.4g} GiB of {} ({})",
                                 margin_gib, capacity_gib, hardware.gpu_name, hardware.name));
  }
  return static_cast<std::int64_t>(margin_gib * static_cast<double>(kGiB));
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
