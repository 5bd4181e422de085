#pragma once
// Shared pieces of the subcommands: data directory, table formatting (output files: output.hpp).

#include <filesystem>
#include <string>
#include <vector>

#include "cpsim/models/io.hpp"

namespace cpsim::cli {

/// CPSIM_DATA_DIR from the environment, else the source tree's data/ compiled in.
models::DataDir data_dir();

/// Parses on/off style switches. @throws InputError(field).
bool parse_switch(const std::string& text, const std::string& field);

/// A plain text table: columns left-aligned except those listed as numeric (right-aligned).
std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& numeric);

}  // namespace cpsim::cli
