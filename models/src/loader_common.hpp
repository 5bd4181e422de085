#pragma once
// What the loaders of models/src share: unknown-key and schema checks, default names, errors of
// validate() renamed to the file's fields, and resolving a built-in name or a path. Private to
// models/src; the typed JSON reads are in cpsim/models/json_io.hpp.

#include <filesystem>
#include <initializer_list>
#include <string>
#include <string_view>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/models/json_io.hpp"

namespace cpsim::models::detail {

/// Typo protection: every key of `object` (at `path` in `origin`) must be in `known`.
void reject_unknown_keys(const Json& object,
                         std::initializer_list<std::string_view> known,
                         const std::string& origin,
                         const std::string& path);

/// Default model or recipe name from its origin: the file stem, or the folder of a config.json.
std::string name_from_origin(const std::string& origin);

/// Rethrows an InputError from a validate() whose field is `<prefix><path>` as `<origin>:<path>`.
[[noreturn]] void rethrow_with_origin(const InputError& e,
                                      std::string_view prefix,
                                      const std::string& origin);

/// `schema` must be present and equal to `expected`.
void check_schema(const Json& root, std::string_view expected, const std::string& origin);

struct ResolvedFile {
  std::filesystem::path path;
  std::string
      origin;  ///< prefix of error fields: the path as given, or "<name>.json" for built-ins
  bool builtin = false;  ///< found under data.root/kind, not as a path
};

/// `name_or_path` as an existing file, else as a built-in `data.root/kind/<name>.json`.
/// `noun` and `hint` shape the error: "unknown model 'x'; built-in: a, b (or give a path to ...)".
ResolvedFile resolve_file(const std::string& name_or_path,
                          const DataDir& data,
                          const std::string& kind,
                          std::string_view noun,
                          std::string_view hint,
                          const std::string& field);

}  // namespace cpsim::models::detail
