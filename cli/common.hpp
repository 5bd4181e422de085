#pragma once
// Shared pieces of the subcommands: data directory, table formatting (output files: output.hpp).

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cpsim/models/io.hpp"

namespace cpsim::cli {

/// CPSIM_DATA_DIR from the environment, else the source tree's data/ compiled in.
/// @throws InputError naming CPSIM_DATA_DIR when it is set but is not a directory.
models::DataDir data_dir();

/// `--memory-margin` in GiB as bytes: at least 0 and below the profile's GPU capacity (a margin
/// must leave some memory to plan with). @throws InputError naming --memory-margin.
std::int64_t memory_margin_bytes(double margin_gib, const models::HardwareProfile& hardware);

/// Parses on/off style switches. @throws InputError(field).
bool parse_switch(const std::string& text, const std::string& field);

/// A plain text table: columns left-aligned except those listed as numeric (right-aligned).
std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& numeric);

}  // namespace cpsim::cli
