#include "cpsim/sim/trace.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace cpsim::sim {
namespace {

// Microseconds with nanosecond precision, as Chrome's trace format expects.
double to_us(SimTime t) {
  return static_cast<double>(t) / 1000.0;
}

}  // namespace

void write_chrome_trace(const Workload& w, const SimResult& r, std::ostream& out) {
  using nlohmann::json;
  json events = json::array();
  for (int rank = 0; rank < w.ranks; ++rank) {
    events.push_back({{"ph", "M"},
                      {"pid", rank},
                      {"name", "process_name"},
                      {"args", {{"name", fmt::format("rank {}", rank)}}}});
    events.push_back({{"ph", "M"},
                      {"pid", rank},
                      {"name", "process_sort_index"},
                      {"args", {{"sort_index", rank}}}});
    for (int s = 0; s < kStreamCount; ++s) {
      events.push_back({{"ph", "M"},
                        {"pid", rank},
                        {"tid", s},
                        {"name", "thread_name"},
                        {"args", {{"name", to_string(static_cast<Stream>(s))}}}});
    }
  }
  // Op intervals, ordered by (rank, stream, start) so each track is monotone.
  std::vector<OpInterval> iv = r.intervals;
  std::stable_sort(iv.begin(), iv.end(), [&w](const OpInterval& a, const OpInterval& b) {
    const Op& oa = w.ops[static_cast<std::size_t>(a.op)];
    const Op& ob = w.ops[static_cast<std::size_t>(b.op)];
    if (oa.rank != ob.rank)
      return oa.rank < ob.rank;
    if (oa.stream != ob.stream)
      return oa.stream < ob.stream;
    return a.start_ns < b.start_ns;
  });
  for (const OpInterval& i : iv) {
    const Op& o = w.ops[static_cast<std::size_t>(i.op)];
    json args = {{"phase", to_string(o.phase)}, {"kind", to_string(o.kind)}};
    if (o.layer >= 0)
      args["layer"] = o.layer;
    if (o.flops > 0)
      args["gflop"] = o.flops / 1e9;
    if (o.collective != kNone) {
      const Collective& c = w.collectives[static_cast<std::size_t>(o.collective)];
      args["collective"] = models::to_string(c.kind);
      args["size_bytes"] = c.size_bytes;
      args["wire_bytes"] = c.wire_bytes;
      args["group_size"] = w.members(c).size();
    }
    if (o.transfer_bytes > 0)
      args["bytes"] = o.transfer_bytes;
    events.push_back({{"ph", "X"},
                      {"pid", o.rank},
                      {"tid", static_cast<int>(o.stream)},
                      {"name", w.names[static_cast<std::size_t>(o.name)]},
                      {"cat", to_string(o.kind)},
                      {"ts", to_us(i.start_ns)},
                      {"dur", to_us(i.end_ns - i.start_ns)},
                      {"args", std::move(args)}});
  }
  // Memory counters per rank (already in time order per rank).
  std::vector<MemorySample> ms = r.memory_samples;
  std::stable_sort(ms.begin(), ms.end(), [](const MemorySample& a, const MemorySample& b) {
    return a.rank != b.rank ? a.rank < b.rank : a.time_ns < b.time_ns;
  });
  for (std::size_t k = 0; k < ms.size(); ++k) {
    // Keep the last sample at each (rank, time): the state after all changes at that instant.
    if (k + 1 < ms.size() && ms[k + 1].rank == ms[k].rank && ms[k + 1].time_ns == ms[k].time_ns) {
      continue;
    }
    const MemorySample& m = ms[k];
    const auto& sm = w.static_memory[static_cast<std::size_t>(m.rank)];
    json args;
    for (int c = 0; c < kMemCategoryCount; ++c) {
      double bytes = static_cast<double>(m.device_bytes[static_cast<std::size_t>(c)]);
      if (static_cast<MemCategory>(c) == MemCategory::kModelStates) {
        bytes += static_cast<double>(sm.model_states_bytes);
      }
      args[to_string(static_cast<MemCategory>(c))] = bytes / (1024.0 * 1024.0 * 1024.0);
    }
    args["fixed"] = static_cast<double>(sm.fixed_overhead_bytes) / (1024.0 * 1024.0 * 1024.0);
    events.push_back({{"ph", "C"},
                      {"pid", m.rank},
                      {"name", "device memory (GiB)"},
                      {"ts", to_us(m.time_ns)},
                      {"args", std::move(args)}});
  }
  json doc = {{"traceEvents", std::move(events)}, {"displayTimeUnit", "ms"}};
  out << doc.dump() << '\n';
}

}  // namespace cpsim::sim
