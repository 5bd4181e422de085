#pragma once
// Shared pieces of the subcommands: data directory, table formatting (output files: output.hpp).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cpsim/models/io.hpp"

namespace cpsim::cli {

/// CPSIM_DATA_DIR from the environment, else data/ beside the loaded code (an installed Python
/// package), else the source tree's data/ compiled in.
/// @throws InputError naming CPSIM_DATA_DIR when it is set but is not a directory.
models::DataDir data_dir();

/// Default safety margins (docs/MODEL.md, "Safety margin"): a policy for what the model leaves
/// out, not a measurement. GPU: against the reserved memory (what nvidia-smi shows); host: per
/// node.
inline constexpr const char* kDefaultGpuMargin = "5%";
inline constexpr const char* kDefaultHostMargin = "10%";

/// A memory margin as bytes: "N%" of `capacity_bytes` or a size in GiB ("4", "4GiB", "512MiB"),
/// at least 0 and below the capacity (a margin must leave memory to plan with).
/// @throws InputError naming `field`.
std::int64_t memory_margin_bytes(const std::string& text,
                                 std::int64_t capacity_bytes,
                                 const std::string& field,
                                 const std::string& what);

/// A duration in seconds: a number with a unit, s, min, h or d ("90s", "30min", "2h", "1.5d"); a
/// plain number is seconds. Positive and finite. @throws InputError(field).
double parse_duration_s(const std::string& text, const std::string& field);

/// Parses on/off style switches. @throws InputError(field).
bool parse_switch(const std::string& text, const std::string& field);

/// A plain text table: columns left-aligned except those listed as numeric (right-aligned).
std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& numeric);

/// Every line of `text` prefixed with `prefix`, each ending in a newline.
std::string indent_lines(const std::string& text, const std::string& prefix);

/// One CSV field (RFC 4180): quoted, with quotes doubled, when it holds a comma, a quote or a
/// newline.
std::string csv_field(const std::string& s);

}  // namespace cpsim::cli
