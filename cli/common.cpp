#include "common.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <system_error>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::cli {

models::DataDir data_dir() {
  if (const char* env = std::getenv("CPSIM_DATA_DIR"); env != nullptr && *env != '\0') {
    return {std::filesystem::path(env)};
  }
  return {std::filesystem::path(CPSIM_DATA_DIR_DEFAULT)};
}

void write_file_atomically(const std::filesystem::path& path,
                           const std::string& content,
                           const std::string& field) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw InputError(field, fmt::format("cannot write '{}'", path.string()));
    }
    out << content;
    out.flush();
    if (!out) {
      std::error_code ec;
      std::filesystem::remove(tmp, ec);
      throw InputError(field, fmt::format("writing '{}' failed", path.string()));
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw InputError(field, fmt::format("cannot rename onto '{}'", path.string()));
  }
}

void write_file_atomically_streamed(const std::filesystem::path& path,
                                    const std::function<void(std::ostream&)>& write,
                                    const std::string& field) {
  std::filesystem::path tmp = path;
  tmp += ".tmp";
  std::error_code ec;
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw InputError(field, fmt::format("cannot write '{}'", path.string()));
    }
    try {
      write(out);
      out.flush();
    } catch (...) {
      out.close();
      std::filesystem::remove(tmp, ec);
      throw;
    }
    if (!out) {
      out.close();
      std::filesystem::remove(tmp, ec);
      throw InputError(field, fmt::format("writing '{}' failed", path.string()));
    }
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp, ec);
    throw InputError(field, fmt::format("cannot rename onto '{}'", path.string()));
  }
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
