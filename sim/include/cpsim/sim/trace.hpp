#pragma once
/// @file Chrome/Perfetto trace of a simulated step, written as it is produced (memory independent
/// of the trace's length): one process per rank, one thread per stream, op slices ("X"), flow
/// arrows ("s"/"f") between the ranks of a collective and from each sender of a send/recv to its
/// receiver, and counter tracks per rank: device memory by category, pinned host memory and the
/// caching allocator's reserved memory (GiB).

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <vector>

#include "cpsim/sim/allocator.hpp"
#include "cpsim/sim/engine.hpp"

namespace cpsim::sim {

/// Which ranks and layers a trace shows.
struct TraceSelection {
  std::vector<bool> ranks;   ///< index = rank; empty: every rank
  std::vector<bool> layers;  ///< index = layer; empty: every op, those outside layers included
  bool has_rank(int rank) const;
  /// An op of `layer` (−1: embedding, loss, optimizer) is shown: with a layer list only the ops
  /// of the listed layers are.
  bool has_layer(int layer) const;
};

struct TraceOptions {
  TraceSelection selection;
  /// The reserved-memory counter replays SimResult::allocations through this model (per rank:
  /// capacity less the fixed overheads, the model states as static memory); none without it or
  /// without allocations.
  std::optional<AllocatorMode> allocator_mode;
  std::int64_t device_capacity_bytes = 0;
  /// Called every few thousand events with the number written so far.
  std::function<void(std::int64_t events_written)> progress;
};

/// What a trace will hold, counted before writing it.
struct TraceEstimate {
  std::int64_t events = 0;
  std::int64_t bytes = 0;  ///< events × average bytes (averaged over a sample of each kind)
};

/// Counts the events write_chrome_trace would write and estimates the file's size. The reserved
/// counter's changes are not counted (the cache grows a few times a step).
TraceEstimate estimate_chrome_trace(const Workload& workload,
                                    const SimResult& result,
                                    const TraceOptions& options = {});

/// Writes the trace JSON ("traceEvents" array, timestamps in µs) to `out`, event by event. Needs
/// a result simulated with SimOptions::record_trace (memory counters for the ranks whose samples
/// were kept). Deterministic: events come in a fixed order (slices in the order the ops ended,
/// which keeps every track in time order; then each rank's counters in time order).
/// @returns the number of events written.
std::int64_t write_chrome_trace(const Workload& workload,
                                const SimResult& result,
                                std::ostream& out,
                                const TraceOptions& options = {});

}  // namespace cpsim::sim
