#pragma once
// `simulate --trace`: the trace flags, the size check before writing and the progress line.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cpsim/planner/evaluate.hpp"
#include "cpsim/sim/schedule.hpp"
#include "cpsim/sim/trace.hpp"

#include "commands.hpp"

namespace cpsim::cli {

/// Parses a list of indices below `count`: `all` (an empty mask: every index) or items `3` and
/// `5-7` joined by commas (`0,3,5-7`). @throws InputError(field) naming the bad item.
std::vector<bool> parse_index_list(std::string_view text,
                                   std::int64_t count,
                                   std::string_view field);

/// The ranks and layers of --trace-ranks (default: rank 0, the representative rank) and
/// --trace-layers (default: all). @throws InputError naming the flag.
sim::TraceSelection trace_selection(const SimulateArgs& args, const sim::ScheduleInputs& inputs);

/// Estimates the trace (one line on stderr), refuses it above --trace-max-bytes (default 1 GiB)
/// unless --trace-force, then writes it to args.trace with a progress line on stderr for long
/// writes. @throws InputError("--trace") when refused or when the file cannot be written.
void write_trace(const SimulateArgs& args,
                 const sim::ScheduleInputs& inputs,
                 const planner::Evaluation& evaluation,
                 const sim::TraceSelection& selection);

}  // namespace cpsim::cli
