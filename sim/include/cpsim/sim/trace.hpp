#pragma once
/// @file Chrome/Perfetto trace of a simulated step: one process per rank, one thread per stream,
/// a counter track per rank with device memory by category (GiB).

#include <ostream>

#include "cpsim/sim/engine.hpp"

namespace cpsim::sim {

/// Writes the trace JSON ("traceEvents" array, timestamps in µs). Needs a result simulated with
/// SimOptions::record_trace. Deterministic: events are written in a fixed order.
void write_chrome_trace(const Workload& workload, const SimResult& result, std::ostream& out);

}  // namespace cpsim::sim
