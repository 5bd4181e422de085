#pragma once
// Shared pieces of the subcommands: data directory, atomic file writes, table formatting.

#include <filesystem>
#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include "cpsim/models/io.hpp"

namespace cpsim::cli {

/// CPSIM_DATA_DIR from the environment, else the source tree's data/ compiled in.
models::DataDir data_dir();

/// Writes `content` to `path` through a temporary file in the same folder and a rename, so an
/// interrupted run never leaves a half-written file. @throws InputError(field) if it cannot.
void write_file_atomically(const std::filesystem::path& path,
                           const std::string& content,
                           const std::string& field);

/// The same with the content written to a stream by `write` as it is produced (nothing held in
/// memory). An exception from `write` removes the temporary file and propagates.
void write_file_atomically_streamed(const std::filesystem::path& path,
                                    const std::function<void(std::ostream&)>& write,
                                    const std::string& field);

/// Parses on/off style switches. @throws InputError(field).
bool parse_switch(const std::string& text, const std::string& field);

/// A plain text table: columns left-aligned except those listed as numeric (right-aligned).
std::string format_table(const std::vector<std::string>& header,
                         const std::vector<std::vector<std::string>>& rows,
                         const std::vector<bool>& numeric);

}  // namespace cpsim::cli
