#include "cpsim/sim/trace.hpp"

#include <algorithm>
#include <iterator>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "cpsim/models/json_io.hpp"

namespace cpsim::sim {

bool TraceSelection::has_rank(int rank) const {
  if (rank < 0) {
    return false;
  }
  const auto r = static_cast<std::size_t>(rank);
  return ranks.empty() || (r < ranks.size() && ranks[r]);
}

bool TraceSelection::has_layer(int layer) const {
  if (layers.empty()) {
    return true;
  }
  const auto l = static_cast<std::size_t>(layer);
  return layer >= 0 && l < layers.size() && layers[l];
}

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr std::int64_t kProgressEvery = 1 << 14;  // events between progress calls
constexpr std::size_t kFlushBytes = 1 << 16;      // buffered before a write to the stream
constexpr std::int64_t kSampleEvery = 16;         // estimate: every n-th event of a kind formatted

using models::append_json_string;

// Microseconds with nanosecond precision, exactly ("12.345"), as Chrome's trace format expects.
void append_us(std::string& out, SimTime t_ns) {
  fmt::format_to(std::back_inserter(out), "{}.{:03}", t_ns / 1000, t_ns % 1000);
}

void append_gib(std::string& out, std::string_view key, double bytes) {
  append_json_string(out, key);
  fmt::format_to(std::back_inserter(out), ":{}", bytes / kGiB);
}

const Op& op_of(const Workload& w, OpId op) {
  return w.ops[static_cast<std::size_t>(op)];
}

// Calls f(starts, id) for each flow arrow that ends on the slice of op `o`: a collective's first
// shown member points to every other shown member; a send/recv member points to the next member
// of its ring (the one it sends to). Ids are unique per (collective, receiving rank).
template <class F>
void for_each_flow(const Workload& w, const TraceSelection& sel, const Op& o, F&& f) {
  if (o.collective == kNone) {
    return;
  }
  const Collective& c = w.collectives[static_cast<std::size_t>(o.collective)];
  const std::vector<std::int32_t>& members = w.members(c);
  const std::size_t n = members.size();
  const auto pos =
      static_cast<std::size_t>(std::find(members.begin(), members.end(), o.rank) - members.begin());
  if (n < 2 || pos == n) {
    return;
  }
  const auto shown = [&](std::int32_t r) { return r < w.ranks && sel.has_rank(r); };
  const std::int64_t stride = std::max(w.ranks, w.represented_ranks);
  const auto id = [&](std::int32_t to) { return std::int64_t{o.collective} * stride + to; };
  if (c.kind == models::Collective::kSendRecv) {
    if (const std::int32_t to = members[(pos + 1) % n]; shown(to)) {
      f(true, id(to));
    }
    if (shown(members[(pos + n - 1) % n])) {
      f(false, id(o.rank));
    }
    return;
  }
  const auto first = std::find_if(members.begin(), members.end(), shown);
  if (*first != o.rank) {
    f(false, id(o.rank));
    return;
  }
  for (auto m = std::next(first); m != members.end(); ++m) {
    if (shown(*m)) {
      f(true, id(*m));
    }
  }
}

// Formats events one at a time into a reused buffer (each preceded by a comma but the first).
class EventFormatter {
 public:
  explicit EventFormatter(const Workload& w) : w_(w) {}

  std::string& text() { return buf_; }
  void clear() { buf_.clear(); }

  void begin_event() {
    if (!first_) {
      buf_ += ",\n";
    }
    first_ = false;
  }

  /// `host`: the rank has a host issue track (tid kStreamCount).
  void metadata(int rank, bool host) {
    begin_event();
    fmt::format_to(std::back_inserter(buf_),
                   R"({{"ph":"M","pid":{0},"name":"process_name","args":{{"name":"rank {0}"}}}})",
                   rank);
    begin_event();
    fmt::format_to(
        std::back_inserter(buf_),
        R"({{"ph":"M","pid":{0},"name":"process_sort_index","args":{{"sort_index":{0}}}}})", rank);
    for (int s = 0; s < kStreamCount; ++s) {
      begin_event();
      fmt::format_to(
          std::back_inserter(buf_),
          R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":"{}"}}}})", rank, s,
          to_string(static_cast<Stream>(s)));
    }
    if (host) {
      begin_event();
      fmt::format_to(
          std::back_inserter(buf_),
          R"({{"ph":"M","pid":{},"tid":{},"name":"thread_name","args":{{"name":"host issue"}}}})",
          rank, kStreamCount);
    }
  }

  // The host's issue of an op (SimResult::host_intervals) on the rank's host track.
  void host_slice(const OpInterval& i) {
    const Op& o = op_of(w_, i.op);
    begin_event();
    fmt::format_to(std::back_inserter(buf_), R"({{"ph":"X","pid":{},"tid":{},"name":)", o.rank,
                   kStreamCount);
    append_json_string(buf_, w_.names[static_cast<std::size_t>(o.name)]);
    buf_ += R"(,"cat":"host","ts":)";
    append_us(buf_, i.start_ns);
    buf_ += ",\"dur\":";
    append_us(buf_, i.end_ns - i.start_ns);
    fmt::format_to(std::back_inserter(buf_), R"(,"args":{{"phase":"{}","calls":{},"host_sync":{})",
                   to_string(o.phase), o.host_calls, o.host_sync);
    if (o.layer >= 0) {
      fmt::format_to(std::back_inserter(buf_), R"(,"layer":{})", o.layer);
    }
    buf_ += "}}";
  }

  void slice(const OpInterval& i) {
    const Op& o = op_of(w_, i.op);
    begin_event();
    fmt::format_to(std::back_inserter(buf_), R"({{"ph":"X","pid":{},"tid":{},"name":)", o.rank,
                   static_cast<int>(o.stream));
    append_json_string(buf_, w_.names[static_cast<std::size_t>(o.name)]);
    fmt::format_to(std::back_inserter(buf_), R"(,"cat":"{}","ts":)", to_string(o.kind));
    append_us(buf_, i.start_ns);
    buf_ += ",\"dur\":";
    append_us(buf_, i.end_ns - i.start_ns);
    fmt::format_to(std::back_inserter(buf_), R"(,"args":{{"phase":"{}","kind":"{}")",
                   to_string(o.phase), to_string(o.kind));
    if (o.layer >= 0) {
      fmt::format_to(std::back_inserter(buf_), R"(,"layer":{})", o.layer);
    }
    if (o.flops > 0) {
      fmt::format_to(std::back_inserter(buf_), R"(,"gflop":{})", o.flops / 1e9);
    }
    if (o.collective != kNone) {
      const Collective& c = w_.collectives[static_cast<std::size_t>(o.collective)];
      fmt::format_to(std::back_inserter(buf_),
                     R"(,"collective":"{}","size_bytes":{},"wire_bytes":{},"group_size":{})",
                     models::to_string(c.kind), c.size_bytes, c.wire_bytes, w_.members(c).size());
    }
    if (o.transfer_bytes > 0) {
      fmt::format_to(std::back_inserter(buf_), R"(,"bytes":{})", o.transfer_bytes);
    }
    buf_ += "}}";
  }

  // One end of a flow arrow, bound to the slice of `i` (which starts at the flow's time).
  void flow(const OpInterval& i, bool starts, std::int64_t id) {
    const Op& o = op_of(w_, i.op);
    const Collective& c = w_.collectives[static_cast<std::size_t>(o.collective)];
    begin_event();
    fmt::format_to(std::back_inserter(buf_),
                   R"({{"ph":"{}",{}"cat":"flow","name":"{}","id":{},"pid":{},"tid":{},"ts":)",
                   starts ? "s" : "f", starts ? "" : R"("bp":"e",)", models::to_string(c.kind), id,
                   o.rank, static_cast<int>(o.stream));
    append_us(buf_, i.start_ns);
    buf_ += '}';
  }

  void device_memory(const MemorySample& m) {
    const StaticMemory& sm = w_.static_memory[static_cast<std::size_t>(m.rank)];
    begin_event();
    fmt::format_to(std::back_inserter(buf_),
                   R"j({{"ph":"C","pid":{},"name":"device memory (GiB)","ts":)j", m.rank);
    append_us(buf_, m.time_ns);
    buf_ += R"(,"args":{)";
    for (int c = 0; c < kMemCategoryCount; ++c) {
      double bytes = static_cast<double>(m.device_bytes[static_cast<std::size_t>(c)]);
      if (static_cast<MemCategory>(c) == MemCategory::kModelStates) {
        bytes += static_cast<double>(sm.model_states_bytes);
      }
      append_gib(buf_, to_string(static_cast<MemCategory>(c)), bytes);
      buf_ += ',';
    }
    append_gib(buf_, "fixed", static_cast<double>(sm.fixed_overhead_bytes));
    buf_ += "}}";
  }

  // A one-value counter track of `rank`.
  void counter(int rank, SimTime t, const char* name, const char* key, std::int64_t bytes) {
    begin_event();
    fmt::format_to(std::back_inserter(buf_), R"({{"ph":"C","pid":{},"name":"{}","ts":)", rank,
                   name);
    append_us(buf_, t);
    buf_ += R"(,"args":{)";
    append_gib(buf_, key, static_cast<double>(bytes));
    buf_ += "}}";
  }

 private:
  const Workload& w_;
  std::string buf_;
  bool first_ = true;
};

constexpr const char* kHostCounter = "host memory (GiB)";
constexpr const char* kReservedCounter = "reserved memory (GiB)";

// Writes formatted events to the stream in large pieces and reports progress.
class TraceWriter {
 public:
  TraceWriter(const Workload& w, std::ostream& out, const TraceOptions& options)
      : w_(w), out_(out), options_(options), f_(w) {}

  std::int64_t write(const SimResult& r) {
    const bool host = !r.host_intervals.empty();
    out_ << R"({"displayTimeUnit":"ms","traceEvents":[)" << '\n';
    for (int rank = 0; rank < w_.ranks; ++rank) {
      if (options_.selection.has_rank(rank)) {
        f_.metadata(rank, host);
        done(2 + kStreamCount + (host ? 1 : 0));
      }
    }
    for (const OpInterval& i : r.intervals) {
      const Op& o = op_of(w_, i.op);
      if (!options_.selection.has_rank(o.rank) || !options_.selection.has_layer(o.layer)) {
        continue;
      }
      f_.slice(i);
      done(1);
      for_each_flow(w_, options_.selection, o, [&](bool starts, std::int64_t id) {
        f_.flow(i, starts, id);
        done(1);
      });
    }
    for (const OpInterval& i : r.host_intervals) {
      const Op& o = op_of(w_, i.op);
      if (options_.selection.has_rank(o.rank) && options_.selection.has_layer(o.layer)) {
        f_.host_slice(i);
        done(1);
      }
    }
    for (int rank = 0; rank < w_.ranks; ++rank) {
      if (options_.selection.has_rank(rank)) {
        write_counters(r, rank);
      }
    }
    flush();
    out_ << "\n]}\n";
    return written_;
  }

 private:
  void done(std::int64_t events) {
    written_ += events;
    if (f_.text().size() >= kFlushBytes) {
      flush();
    }
    if (options_.progress && written_ >= next_progress_) {
      options_.progress(written_);
      next_progress_ = written_ + kProgressEvery;
    }
  }

  void flush() {
    out_.write(f_.text().data(), static_cast<std::streamsize>(f_.text().size()));
    f_.clear();
  }

  // The counters of one rank in time order. A sample is written once the next one of the rank
  // shows a later time (only the state after the last change at an instant is shown); the host
  // and reserved tracks only when their value changes.
  void write_counters(const SimResult& r, int rank) {
    const std::vector<MemorySample>& samples = r.memory_samples;
    std::size_t next = 0;                  // the next sample to look at
    std::size_t pending = samples.size();  // a sample of `rank` not yet written
    std::int64_t pending_reserved = -1;
    std::int64_t reserved = -1;  // -1: not modelled
    std::int64_t last_host = -1;
    std::int64_t last_reserved = -1;
    const auto emit = [&](const MemorySample& m, std::int64_t reserved_bytes) {
      f_.device_memory(m);
      std::int64_t n = 1;
      if (m.host_bytes != last_host) {
        f_.counter(rank, m.time_ns, kHostCounter, "pinned", m.host_bytes);
        last_host = m.host_bytes;
        ++n;
      }
      if (reserved_bytes >= 0 && reserved_bytes != last_reserved) {
        f_.counter(rank, m.time_ns, kReservedCounter, "reserved", reserved_bytes);
        last_reserved = reserved_bytes;
        ++n;
      }
      done(n);
    };
    // Takes the samples made after at most `applied` allocation events.
    const auto take = [&](std::int64_t applied) {
      for (; next < samples.size(); ++next) {
        const MemorySample& m = samples[next];
        if (m.rank != rank) {
          continue;
        }
        if (m.allocations > applied) {
          return;
        }
        if (pending < samples.size() && samples[pending].time_ns != m.time_ns) {
          emit(samples[pending], pending_reserved);
        }
        pending = next;
        pending_reserved = reserved;
      }
    };
    const auto ri = static_cast<std::size_t>(rank);
    if (options_.allocator_mode && !r.allocations.empty()) {
      const StaticMemory& sm = w_.static_memory[ri];
      AllocatorConfig config;
      config.mode = *options_.allocator_mode;
      config.capacity_bytes = options_.device_capacity_bytes - sm.fixed_overhead_bytes;
      config.static_bytes = sm.model_states_bytes;
      replay_allocator(r.allocations, rank, config,
                       [&](std::size_t applied, std::int64_t reserved_bytes) {
                         // Samples before this event saw the reserved bytes before it.
                         take(static_cast<std::int64_t>(applied) - 1);
                         reserved = reserved_bytes + sm.fixed_overhead_bytes;
                       });
    }
    take(std::numeric_limits<std::int64_t>::max());
    if (pending < samples.size()) {
      emit(samples[pending], pending_reserved);
    }
  }

  const Workload& w_;
  std::ostream& out_;
  const TraceOptions& options_;
  EventFormatter f_;
  std::int64_t written_ = 0;
  std::int64_t next_progress_ = kProgressEvery;
};

// Running mean of the sizes of a kind of event, from every kSampleEvery-th one.
struct SizeSample {
  std::int64_t count = 0;
  std::int64_t sampled = 0;
  std::int64_t sampled_bytes = 0;
  bool wants_sample() const { return count % kSampleEvery == 0; }
  void add(std::int64_t n) { count += n; }
  void measure(std::size_t bytes, std::int64_t n) {
    sampled += n;
    sampled_bytes += static_cast<std::int64_t>(bytes);
  }
  std::int64_t bytes() const { return sampled == 0 ? 0 : sampled_bytes * count / sampled; }
};

// The host track's issue slices, and the ops' slices with their flow arrows.
void estimate_slices(const Workload& w,
                     const SimResult& r,
                     const TraceSelection& sel,
                     EventFormatter& f,
                     SizeSample& issues,
                     SizeSample& slices,
                     SizeSample& flows) {
  for (const OpInterval& i : r.host_intervals) {
    const Op& o = op_of(w, i.op);
    if (!sel.has_rank(o.rank) || !sel.has_layer(o.layer)) {
      continue;
    }
    if (issues.wants_sample()) {
      f.clear();
      f.host_slice(i);
      issues.measure(f.text().size(), 1);
    }
    issues.add(1);
  }
  for (const OpInterval& i : r.intervals) {
    const Op& o = op_of(w, i.op);
    if (!sel.has_rank(o.rank) || !sel.has_layer(o.layer)) {
      continue;
    }
    const bool measure = slices.wants_sample();
    f.clear();
    if (measure) {
      f.slice(i);
      slices.measure(f.text().size(), 1);
      f.clear();
    }
    slices.add(1);
    std::int64_t n = 0;
    for_each_flow(w, sel, o, [&](bool starts, std::int64_t id) {
      ++n;
      if (measure) {
        f.flow(i, starts, id);
      }
    });
    if (measure && n > 0) {
      flows.measure(f.text().size(), n);
    }
    flows.add(n);
  }
}

// Device counters (the last sample at each instant of a rank) and the host counter's changes.
void estimate_counters(const Workload& w,
                       const SimResult& r,
                       const TraceSelection& sel,
                       EventFormatter& f,
                       SizeSample& counters,
                       SizeSample& hosts) {
  const auto n_ranks = static_cast<std::size_t>(w.ranks);
  std::vector<const MemorySample*> pending(n_ranks, nullptr);
  std::vector<std::int64_t> last_host(n_ranks, -1);
  const auto count = [&](const MemorySample& m) {
    if (counters.wants_sample()) {
      f.clear();
      f.device_memory(m);
      counters.measure(f.text().size(), 1);
    }
    counters.add(1);
    if (std::int64_t& host = last_host[static_cast<std::size_t>(m.rank)]; m.host_bytes != host) {
      host = m.host_bytes;
      if (hosts.wants_sample()) {
        f.clear();
        f.counter(m.rank, m.time_ns, kHostCounter, "pinned", m.host_bytes);
        hosts.measure(f.text().size(), 1);
      }
      hosts.add(1);
    }
  };
  for (const MemorySample& m : r.memory_samples) {
    if (!sel.has_rank(m.rank)) {
      continue;
    }
    const MemorySample*& p = pending[static_cast<std::size_t>(m.rank)];
    if (p != nullptr && p->time_ns != m.time_ns) {
      count(*p);
    }
    p = &m;
  }
  for (const MemorySample* p : pending) {
    if (p != nullptr) {
      count(*p);
    }
  }
}

}  // namespace

TraceEstimate estimate_chrome_trace(const Workload& w,
                                    const SimResult& r,
                                    const TraceOptions& options) {
  const TraceSelection& sel = options.selection;
  EventFormatter f(w);
  f.begin_event();  // every event after the first carries its separator
  std::int64_t bytes = 0;
  std::int64_t events = 0;
  const bool host_track = !r.host_intervals.empty();
  for (int rank = 0; rank < w.ranks; ++rank) {
    if (sel.has_rank(rank)) {
      f.clear();
      f.metadata(rank, host_track);
      bytes += static_cast<std::int64_t>(f.text().size());
      events += 2 + kStreamCount + (host_track ? 1 : 0);
    }
  }
  SizeSample slices, flows, counters, hosts, issues;
  estimate_slices(w, r, sel, f, issues, slices, flows);
  estimate_counters(w, r, sel, f, counters, hosts);
  events += slices.count + flows.count + counters.count + hosts.count + issues.count;
  bytes += slices.bytes() + flows.bytes() + counters.bytes() + hosts.bytes() + issues.bytes() +
           64;  // + the enclosing object
  return {events, bytes};
}

std::int64_t write_chrome_trace(const Workload& w,
                                const SimResult& r,
                                std::ostream& out,
                                const TraceOptions& options) {
  TraceWriter writer(w, out, options);
  return writer.write(r);
}

}  // namespace cpsim::sim
