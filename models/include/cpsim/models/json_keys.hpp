#pragma once
/// @file Duplicate keys in JSON text. nlohmann::json (like most parsers) keeps the last of two
/// equal keys in one object without a word, so a file edited by hand can say one thing and mean
/// another; every loader of user JSON runs this check before parsing.

#include <string>
#include <string_view>

namespace cpsim::models {

/// @throws InputError with field `<origin>:<path>` (path dotted, arrays as `[i]`, e.g.
/// `gpu.sm_count`) naming the first key that appears twice in one object. Malformed text is not
/// an error here: the parser that reads it afterwards reports it.
void reject_duplicate_json_keys(std::string_view json_text, const std::string& origin);

}  // namespace cpsim::models
