#include "cpsim/models/io.hpp"

#include <algorithm>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/json_io.hpp"

#include "loader_common.hpp"

namespace cpsim::models {

namespace fs = std::filesystem;

namespace detail {

void reject_unknown_keys(const Json& object,
                         std::initializer_list<std::string_view> known,
                         const std::string& origin,
                         const std::string& path) {
  for (const auto& [key, value] : object.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      throw InputError(json_field(origin, json_child_path(path, key)),
                       fmt::format("unknown key; known keys here: {}", join_keys(known)));
    }
  }
}

std::string name_from_origin(const std::string& origin) {
  const fs::path p(origin);
  std::string stem = p.stem().string();
  if (stem == "config" && p.has_parent_path() && !p.parent_path().filename().empty()) {
    stem = p.parent_path().filename().string();
  }
  return stem.empty() ? origin : stem;
}

[[noreturn]] void rethrow_with_origin(const InputError& e,
                                      std::string_view prefix,
                                      const std::string& origin) {
  std::string path = e.field();
  if (path.rfind(prefix, 0) == 0) {
    path.erase(0, prefix.size());
  }
  const std::string what = e.what();
  const std::string message = what.substr(std::min(what.size(), e.field().size() + 2));
  throw InputError(json_field(origin, path), message);
}

void check_schema(const Json& root, std::string_view expected, const std::string& origin) {
  const std::string field = json_field(origin, "schema");
  const auto it = root.find("schema");
  if (it == root.end()) {
    throw InputError(field, fmt::format("required key is missing (expected \"{}\")", expected));
  }
  const std::string schema = json_string(*it, field);
  if (schema != expected) {
    throw InputError(field, fmt::format("unknown schema '{}'; expected \"{}\"", schema, expected));
  }
}

/// An argument that looks like a path (has a '/' or ends in .json) but names nothing is a missing
/// file, not an unknown built-in name. @throws InputError naming `field` and the path.
void check_path_exists(const std::string& name_or_path, const std::string& field) {
  const bool looks_like_path =
      name_or_path.find_first_of("/\\") != std::string::npos ||
      (name_or_path.size() > 5 && name_or_path.compare(name_or_path.size() - 5, 5, ".json") == 0);
  std::error_code ec;
  if (looks_like_path && !fs::exists(name_or_path, ec)) {
    throw InputError(field, fmt::format("file not found: '{}'", name_or_path));
  }
}

ResolvedFile resolve_file(const std::string& name_or_path,
                          const DataDir& data,
                          const std::string& kind,
                          std::string_view noun,
                          std::string_view hint,
                          const std::string& field) {
  std::error_code ec;
  if (!name_or_path.empty()) {
    const fs::path given(name_or_path);
    if (fs::is_regular_file(given, ec)) {
      return {given, name_or_path};
    }
    if (kind == "models" && fs::is_directory(given, ec) &&
        fs::is_regular_file(given / "config.json", ec)) {
      return {given / "config.json", (given / "config.json").string()};
    }
    const bool plain_name = name_or_path.find_first_of("/\\") == std::string::npos &&
                            name_or_path != "." && name_or_path != "..";
    if (plain_name) {
      std::string stem = name_or_path;
      if (stem.size() > 5 && stem.compare(stem.size() - 5, 5, ".json") == 0) {
        stem.resize(stem.size() - 5);
      }
      const fs::path builtin = data.root / kind / (stem + ".json");
      if (fs::is_regular_file(builtin, ec)) {
        return {builtin, stem + ".json", true};
      }
    }
  }
  check_path_exists(name_or_path, field);
  const std::vector<std::string> names = list_builtin(data, kind);
  std::string list;
  for (const auto& n : names) {
    list += list.empty() ? n : ", " + n;
  }
  const std::string none = fmt::format("none found in '{}'", (data.root / kind).string());
  throw InputError(field, fmt::format("unknown {} '{}'; built-in: {} ({})", noun, name_or_path,
                                      list.empty() ? none : list, hint));
}

}  // namespace detail

std::vector<std::string> list_builtin(const DataDir& data, const std::string& kind) {
  std::vector<std::string> names;
  std::error_code ec;
  fs::directory_iterator it(data.root / kind, ec);
  if (ec) {
    return names;
  }
  for (const fs::directory_iterator end; it != end; it.increment(ec)) {
    if (ec) {
      break;
    }
    const fs::path& p = it->path();
    std::error_code file_ec;
    if (p.extension() == ".json" && fs::is_regular_file(p, file_ec)) {
      names.push_back(p.stem().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace cpsim::models
