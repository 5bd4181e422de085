#include "cpsim/sim/engine.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <span>
#include <stdexcept>
#include <type_traits>
#include <utility>

#include <fmt/format.h>

namespace cpsim::sim {
namespace {

// Simulator::Scratch::reader_queue of a tensor nobody reads, and of one read on several queues.
constexpr std::int32_t kNoQueue = -1, kMixedQueues = -2;

std::int64_t rounded(std::int64_t bytes) {
  return allocation_bytes(bytes);
}

std::size_t idx(std::int32_t i) {
  return static_cast<std::size_t>(i);
}

/// ceil(x) as an integer, for finite x in the range of SimTime (exactly std::ceil, without the
/// library call).
SimTime ceil_ns(double x) {
  auto t = static_cast<SimTime>(x);  // truncates toward zero
  if (static_cast<double>(t) < x) {
    ++t;
  }
  return t;
}

/// Asks for the cache line holding `p` ahead of use (no effect on results).
void prefetch(const void* p) {
  __builtin_prefetch(p);
}

enum class ActivityKind : std::uint8_t { kCompute, kCopy, kCollective };

/// A running activity. Slots are reused once an activity ends; an event is current only while its
/// sequence number is the slot's `event_seq`.
struct Activity {
  double remaining = 0.0;  // ns of work (compute) or bytes (copy, collective)
  double rate = 0.0;       // work per ns
  double base_rate = 0.0;  // copy, collective: the rate alone on its link (bytes per ns)
  SimTime last_update = 0;
  std::uint32_t event_seq = 0;            // seq of its scheduled completion (when `scheduled`)
  std::uint32_t stamp = 0;                // refresh_ranks: refreshed in the current pass
  std::int32_t rate_key = 0;              // Engine::rate_key when `rate` was set
  const std::int32_t* members = nullptr;  // collective: its member ranks
  std::int32_t n_members = 0;
  std::int32_t id = 0;  // op id, or collective id
  std::int32_t rank = 0;
  ActivityKind kind = ActivityKind::kCompute;
  std::uint8_t span = 0;  // collective: its link (0 intra-node, 1 inter-node)
  bool to_device = false;
  bool active = false;
  bool scheduled = false;  // has an event (its rate was set)
};

/// Completion of an activity at `time`; ordered by (time, seq), seq being the insertion order.
struct Event {
  SimTime time;
  std::uint32_t seq;
  std::int32_t activity;  // an activity, or a fixed-rate compute op as fixed_rate_event(op)
};
struct EventLater {
  bool operator()(const Event& a, const Event& b) const {
    return a.time != b.time ? a.time > b.time : a.seq > b.seq;
  }
};

enum class OpState : std::uint8_t { kWaiting, kArrived, kRunning, kDone };

/// Run-time state of one op. Every field is written by Engine::setup (start: by begin_op).
struct OpRuntime {
  SimTime start;
  std::int32_t next_in_stream;  // the next op of its (rank, stream) queue, or kNone
  std::int32_t next_member;     // the next op of its collective, or kNone
  std::int32_t first_watcher;   // a queue whose head waits for this op to end, or kNone
  OpState state;
};

/// A (rank, stream) queue. Its head starts once every dependency has ended: the dependencies are
/// checked in order from `cursor`, and the head waits on the first that has not ended (the queue is
/// then on that op's watcher list, linked through `next_watcher`).
struct Queue {
  OpId head = kNone;
  std::int32_t cursor = 0;  // the head's first dependency not known to have ended (edges index)
  std::int32_t next_watcher = kNone;
  OpId tail = kNone;  // setup: the last op so far
};

/// Consumers of a tensor not yet ended; set from Tensor::consumers on first use in a run (`run`
/// differs until then), so setup does not visit every tensor.
struct TensorState {
  std::uint32_t run = 0;
  std::int32_t consumers_left = 0;
};

/// Per collective: its member ops (a list through OpRuntime::next_member) and arrivals so far.
struct CollectiveRuntime {
  OpId first_member = kNone;
  OpId last_member = kNone;  // setup
  std::int32_t arrivals = 0;
};

struct RankState {
  /// The running compute activity, kNoCompute, or kFixedRateCompute (a compute op whose rate
  /// cannot change, tracked by its event alone).
  std::int32_t compute_activity = -1;
  std::vector<std::int32_t> copies;       // running copy activities
  std::vector<std::int32_t> collectives;  // running collective activities
  std::int32_t h2d = 0;
  std::int32_t d2h = 0;
  std::array<std::int32_t, 2> link{};  // running collectives per span (intra, inter)
  std::array<std::int64_t, kMemCategoryCount> live{};
  std::int64_t device_total = 0;  // static bytes + the sum of live
  std::int64_t host_live = 0;
};

/// The host thread of one rank (docs/MODEL.md, "Host issue"): it issues the rank's ops in program
/// order, each taking Op::host_calls × the profile's per-call cost, and after an op with
/// Op::host_sync it waits until that op has ended (plus the profile's sync_s).
struct HostClock {
  SimTime time = 0;        // when the host has issued everything so far
  OpId next = kNone;       // the next op to issue
  OpId waits_for = kNone;  // a host_sync op not yet ended: nothing after it is issued
  OpId tail = kNone;       // setup: the last op of the rank so far
};
/// Per op: when the host issued it (kNotIssued before) and the next op of its rank (setup links
/// only the ops after a rank's first synchronisation; kNone otherwise).
struct HostOp {
  SimTime issued;
  OpId next_on_rank;
};
/// HostClock's mark of an op not issued yet.
constexpr SimTime kNotIssued = std::numeric_limits<SimTime>::max();

constexpr std::int32_t kNoCompute = -1;
constexpr std::int32_t kFixedRateCompute = -2;

/// Events of a queue head waiting for the host to issue it (Engine::host_issued) name the queue
/// as kHostWaitEvent + queue; activities are below it (they are reused: never that many at once).
constexpr std::int32_t kHostWaitEvent = std::int32_t{1} << 30;

/// Events of fixed-rate compute ops name the op as −(op + 1); activities are ≥ 0.
constexpr std::int32_t fixed_rate_event(OpId op) {
  return -op - 1;
}
constexpr OpId fixed_rate_op(std::int32_t event_target) {
  return -event_target - 1;
}

std::uint8_t span_index(models::Span s) {
  return s == models::Span::kIntraNode ? 0 : 1;
}

void erase_value(std::vector<std::int32_t>& v, std::int32_t x) {
  v.erase(std::find(v.begin(), v.end(), x));
}

/// An array whose elements are left uninitialised when it grows (for trivial types that the
/// engine writes before it reads); its capacity is kept from run to run.
template <class T>
class RawArray {
  static_assert(std::is_trivially_default_constructible_v<T> &&
                std::is_trivially_destructible_v<T>);

 public:
  RawArray() = default;
  RawArray(RawArray&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), capacity_(std::exchange(o.capacity_, 0)) {}
  RawArray& operator=(RawArray&& o) noexcept {
    if (this != &o) {
      free();
      data_ = std::exchange(o.data_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
    }
    return *this;
  }
  RawArray(const RawArray&) = delete;
  RawArray& operator=(const RawArray&) = delete;
  ~RawArray() { free(); }

  void resize(std::size_t n) {
    if (n > capacity_) {
      free();
      data_ = HugePageAllocator<T>().allocate(n);
      capacity_ = n;
    }
  }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

 private:
  void free() noexcept {
    if (data_ != nullptr) {
      HugePageAllocator<T>().deallocate(data_, capacity_);
      data_ = nullptr;
      capacity_ = 0;
    }
  }
  T* data_ = nullptr;
  std::size_t capacity_ = 0;
};

}  // namespace

/// The buffers of one run, kept by a Simulator from run to run (their capacity is reused; every
/// run resets their contents in Engine::setup).
struct Simulator::Scratch {
  std::vector<Event> events;  // a binary heap ordered by EventLater (as std::priority_queue)
  std::vector<Activity> activities;
  std::vector<std::int32_t> free_activities;  // ended activity slots, reused first
  RawArray<OpRuntime> op;
  std::vector<Queue> queues;  // (rank, stream)
  std::vector<CollectiveRuntime> collectives;
  std::vector<TensorState, HugePageAllocator<TensorState>> tensors;
  std::uint32_t run = 0;  // runs so far (TensorState::run of this run)
  std::vector<RankState> ranks;
  std::vector<std::int32_t> woken;  // wake_watchers: queues whose head became ready (n_queues)
  std::vector<std::int64_t> node_host_bytes;  // per node: the sum of its ranks' host peaks so far
  // Host issue model (only when the profile enables it): per op, when the host has issued it
  // (kNotIssued before) and the next op of its rank; per rank, its host thread.
  RawArray<HostOp> host_ops;
  std::vector<HostClock> hosts;
  // Fast-forward, learnt when a window first reads a tensor with several readers
  // (Engine::ff_learn_readers): each tensor's count of reads, the queue its readers all run on
  // (kMixedQueues when they run on several) and its last reader in program order; and when a
  // case needs them (Engine::ff_list_reads), its reads in program order (the ops
  // reads[read_begin[t] .. read_begin[t + 1])).
  std::vector<std::int32_t> read_begin;
  std::vector<std::int32_t> reader_queue;
  std::vector<OpId> last_reader;
  std::vector<OpId> reads;
  std::vector<std::int32_t> read_cursor;
  // The allocation log of a result given back (Simulator::recycle): the next logged run's.
  std::vector<AllocationEvent, HugePageAllocator<AllocationEvent>> spare_allocations;
};

namespace {

class Engine {
 public:
  /// How far ahead in program order begin_op prefetches.
  static constexpr std::size_t kPrefetchOps = 32;

  Engine(const Workload& w,
         const models::HardwareProfile& p,
         const SimOptions& o,
         Simulator::Scratch& scratch)
      : w_(w),
        profile_(p),
        trace_(o.record_trace),
        sampled_ranks_(o.sampled_ranks),
        log_allocations_(o.log_allocations),
        fast_forward_(o.fast_forward && !o.record_trace),
        stop_above_bytes_(o.stop_above_device_bytes > 0 ? o.stop_above_device_bytes
                                                        : std::numeric_limits<std::int64_t>::max()),
        stop_above_host_bytes_(o.stop_above_host_bytes > 0
                                   ? o.stop_above_host_bytes
                                   : std::numeric_limits<std::int64_t>::max()),
        home_(scratch),
        b_(std::move(scratch)) {}
  // The buffers go back to the Simulator (with their capacity) however the run ends.
  ~Engine() { home_ = std::move(b_); }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  SimResult run();

 private:
  std::span<const std::int32_t> range(std::int32_t b, std::int32_t e) const {
    return {w_.edges.data() + b, static_cast<std::size_t>(e - b)};
  }
  static std::size_t queue_index(std::int32_t rank, Stream s) {
    return idx(rank) * kStreamCount + static_cast<std::size_t>(s);
  }
  void setup();
  std::int32_t new_activity(ActivityKind kind, std::int32_t id, std::int32_t rank, double work);
  void set_head(std::size_t q, OpId op);
  [[gnu::always_inline]] inline bool head_ready(std::size_t q);
  void start_head(std::size_t q);
  [[gnu::always_inline]] inline void begin_op(OpId op, const Op& o);
  void finish_op(OpId op);
  void wake_watchers(OpRuntime& rt);
  void finish_activity(std::int32_t a);
  void advance_host(std::int32_t rank);
  void setup_host(OpId op, const Op& o);
  [[gnu::cold, gnu::noinline]] void note_issue(OpId op, const Op& o, SimTime issued);
  [[gnu::noinline]] bool host_issued(std::size_t q, OpId op);
  void release_host(OpId op, std::int32_t rank);
  void refresh_copies(std::int32_t rank);
  void refresh_ranks(std::span<const std::int32_t> ranks);
  void refresh(std::int32_t a);
  [[gnu::always_inline]] inline void push_event(SimTime time, std::int32_t target);
  std::int32_t rate_key(const Activity& act) const;
  double rate_of(const Activity& act, std::int32_t key) const;
  [[gnu::always_inline]] inline void note_memory(std::int32_t rank, OpId op);
  [[gnu::always_inline]] inline void release(TensorId t);
  [[gnu::always_inline]] inline bool last_read(TensorId t);
  template <class LastRead, class Free>
  [[gnu::always_inline]] inline void free_at_end(const Op& o, LastRead last, Free free);
  bool ff_last_read(TensorId t);
  [[gnu::cold, gnu::noinline]] void sample_memory(std::int32_t rank);
  [[gnu::noinline]] void note_host_peak(std::int32_t rank, std::int64_t growth);
  [[gnu::cold, gnu::noinline]] void log_allocation(
      std::int64_t key, std::int64_t bytes, std::int32_t rank, const Op* maker, bool allocate);
  [[gnu::cold, gnu::noinline]] void log_begin(OpId op, const Op& o);
  [[gnu::cold, gnu::noinline]] void log_release(TensorId t);

  // Fast-forward over periodic blocks ("Fast-forward" below).
  struct FfWindowMax {
    std::int64_t device_bytes = 0, host_bytes = 0;
    std::array<std::int64_t, kMemCategoryCount> category_bytes{};
  };
  struct FfRun {
    std::vector<Workload::Instance> marks;  // equally spaced instances of one template
    OpId retry_from = 0;  // no skip while M[i-1] is before this op (an aperiodic op was found)
  };
  struct FfBoundary {
    std::int32_t run = 0, index = 0;
    OpId op = kNone;  // the instance's first op
  };
  struct FfQueue {
    OpId head = kNone;
    std::int32_t cursor = 0;
    OpState state = OpState::kWaiting;
    SimTime start = 0;          // when running or arrived
    std::int32_t arrivals = 0;  // arrived: its collective's arrivals
  };
  /// The engine's state when a block's first op has started.
  struct FfSnapshot {
    bool valid = false;
    std::int32_t run = -1, index = -1;
    SimTime now = 0;
    std::int64_t events = 0;
    std::vector<FfQueue> queues;
    std::vector<Event> heap;  // sorted by (time, seq)
    std::vector<Activity> activities;
    std::vector<RankState> ranks;
    std::vector<StreamBusy> busy;
    std::vector<FfWindowMax> window_max;  // over the block before the boundary
    // Host issue (when the model is on): each rank's host clock, and the issue times of the ops
    // from the rank's earliest queue head to the next op its host issues.
    std::vector<HostClock> hosts;
    std::int64_t host_waits = 0;               // Engine::host_waits_
    std::vector<OpId> host_from;               // per rank: its earliest queue head (kNone: none)
    std::vector<std::vector<SimTime>> issued;  // per rank: ops [host_from, next) of that rank
    std::size_t allocations = 0;               // entries in the allocation log
  };
  /// How far the blocks after the boundary are the shifted copies of the ones before.
  struct FfShift {
    Workload::Instance delta;  // between consecutive instances
    SimTime period_ns = 0;
  };
  void ff_setup();
  void ff_arm_next();
  [[gnu::noinline]] void ff_at_boundary();
  FfSnapshot ff_snapshot(const FfBoundary& at) const;
  bool ff_same_activity(const Activity& a,
                        SimTime a_now,
                        const Activity& b,
                        SimTime b_now,
                        const Workload::Instance& d) const;
  bool ff_equivalent(const FfSnapshot& p,
                     const FfSnapshot& c,
                     const Workload::Instance& d,
                     OpId window_begin) const;
  bool ff_same_hosts(const FfSnapshot& p, const FfSnapshot& c, const Workload::Instance& d) const;
  OpId ff_watched(OpId head, std::int32_t cursor) const;
  bool ff_same_op(const Op& o, const Op& r, const Workload::Instance& d) const;
  bool ff_done_at(const FfSnapshot& p, OpId op) const;
  void ff_learn_readers();
  void ff_list_reads();
  bool ff_same_reads(
      TensorId a, OpId x, TensorId b, const FfSnapshot& p, OpId from, OpId to, OpId shift);
  OpId ff_first_aperiodic(const FfSnapshot& p,
                          OpId from,
                          OpId to,
                          TensorId from_tensor,
                          TensorId to_tensor,
                          const Workload::Instance& d,
                          OpId period_begin,
                          OpId period_end);
  bool ff_statics_last(std::int32_t k) const;
  std::int32_t ff_stop_limit(const FfSnapshot& p, const FfSnapshot& c, std::int32_t k) const;
  void ff_skip(const FfSnapshot& p, const FfSnapshot& c, const FfShift& shift, std::int32_t k);
  /// One skip: the two states, the block's shift, the blocks skipped, and what they move by.
  struct FfMove {
    const FfSnapshot& p;
    const FfSnapshot& c;
    const Workload::Instance& d;
    std::int32_t k;
    SimTime dt;
    std::int32_t ops_shift;
    bool moved(std::size_t q) const { return c.queues[q].head != p.queues[q].head; }
  };
  void ff_unlink_moved(const FfMove& m);
  void ff_move_hosts(const FfMove& m);
  void ff_log_skipped(const FfMove& m);
  void ff_end_skipped_ops(const FfMove& m);
  void ff_move_heads(const FfMove& m);
  void ff_move_memory(const FfMove& m);

  const Workload& w_;
  const models::HardwareProfile& profile_;
  const bool trace_;                          // SimOptions::record_trace
  const std::vector<bool>& sampled_ranks_;    // SimOptions::sampled_ranks
  const bool log_allocations_;                // SimOptions::log_allocations
  const bool fast_forward_;                   // SimOptions::fast_forward, without a trace
  const std::int64_t stop_above_bytes_;       // SimOptions::stop_above_device_bytes (max: never)
  const std::int64_t stop_above_host_bytes_;  // SimOptions::stop_above_host_bytes (max: never)
  bool stop_ = false;  // a rank's device memory or a node's host memory passed its stop limit
  // Constant over the run: rates of the profile (per ns).
  double compute_rate_under_comm_ = 1.0;
  double h2d_rate_ = 0.0;
  double d2h_rate_ = 0.0;
  double duplex_half_rate_ = 0.0;  // half the duplex total: each direction's cap when both busy
  // Compute runs at rate 1 beside collectives too (no calibrated slowdown): compute ops need no
  // activity.
  bool fixed_compute_rate_ = false;
  // Host issue model (HostIssueModel::enabled): ns per framework call and per synchronisation.
  bool host_ = false;
  SimTime call_ns_ = 0;
  SimTime sync_ns_ = 0;

  SimTime now_ = 0;
  std::int64_t events_ = 0;      // events processed by the loop
  std::int64_t host_waits_ = 0;  // queue heads held up because their host had not issued them
  std::uint32_t seq_ = 0;
  std::uint32_t stamp_now_ = 0;
  std::size_t done_ = 0;      // ops ended
  Simulator::Scratch& home_;  // where the buffers come from and go back to
  Simulator::Scratch b_;      // the buffers of this run
  SimResult result_;
  std::vector<FfWindowMax> ff_window_max_;  // per rank: highest memory since the last boundary
  std::vector<FfRun> ff_runs_;
  std::vector<FfBoundary> ff_boundaries_;  // in program order
  std::size_t ff_next_ = 0;                // the next boundary to reach
  OpId ff_watch_ = 0;                      // its first op; the sentinel op past the last when none
  FfSnapshot ff_prev_;
  /// Tensors read by every block that are not the block's own (the same id in each), with their
  /// reads in one block: set by ff_first_aperiodic.
  std::vector<std::pair<TensorId, std::int32_t>> ff_statics_;
  bool ff_readers_known_ = false;  // b_.reader_queue, b_.last_reader are this workload's
  bool ff_reads_listed_ = false;   // b_.reads and b_.read_begin too
  /// The boundary (ff_next_) that first asked for the reads, before they were learnt.
  std::size_t ff_reads_first_asked_ = std::numeric_limits<std::size_t>::max();
  /// With the allocation log: the ops begun (id) and ended (~id) since the last boundary, in the
  /// order the engine made them, which a skip repeats block by block (ff_log_skipped).
  std::vector<OpId> ff_op_log_;
  bool ff_log_ops_ = false;  // log allocations, and a boundary is still ahead
};

// The engine's other jobs are files of their own, compiled here as part of this one unit: the
// engine's types keep internal linkage, so the compiler inlines and specialises the event loop's
// calls across them (compiled apart, with external linkage, the event loop ran about 10 % slower:
// tests/bench/sim_bench.cpp, BM_EventLoop).
#include "engine_fast_forward.inc"  // skipping periodic blocks
#include "engine_host_issue.inc"    // the host thread that issues each rank's ops
#include "engine_sharing.inc"       // activities and the rates of those that share a resource

inline void Engine::push_event(SimTime time, std::int32_t target) {
  if (seq_ == std::numeric_limits<std::uint32_t>::max()) {
    throw std::logic_error("simulation: event sequence numbers exhausted");
  }
  b_.events.push_back({time, seq_++, target});
  std::push_heap(b_.events.begin(), b_.events.end(), EventLater{});
}

inline void Engine::note_memory(std::int32_t rank, OpId op) {
  const RankState& rs = b_.ranks[idx(rank)];
  RankMemory& m = result_.memory[idx(rank)];
  FfWindowMax& window = ff_window_max_[idx(rank)];
  window.device_bytes = std::max(window.device_bytes, rs.device_total);
  window.host_bytes = std::max(window.host_bytes, rs.host_live);
  if (rs.device_total > m.peak_bytes) {
    m.peak_bytes = rs.device_total;
    m.peak_time_ns = now_;
    m.peak_op = op;
    m.breakdown_at_peak = rs.live;
    stop_ = stop_ || m.peak_bytes > stop_above_bytes_;
  }
  if (rs.host_live > m.host_peak_bytes) {
    note_host_peak(rank, rs.host_live - m.host_peak_bytes);
    m.host_peak_bytes = rs.host_live;
  }
  if (trace_) [[unlikely]] {
    sample_memory(rank);
  }
}

// A rank's host peak grew by `growth`: its node's sum of host peaks so far, counted as summarize()
// counts the node's host memory (a lower bound of the step's, since peaks only grow), against
// stop_above_host_bytes_.
void Engine::note_host_peak(std::int32_t rank, std::int64_t growth) {
  if (stop_above_host_bytes_ == std::numeric_limits<std::int64_t>::max()) {
    return;
  }
  const auto per_node = static_cast<std::size_t>(std::max(1, w_.gpus_per_node));
  std::int64_t& node = b_.node_host_bytes[idx(rank) / per_node];
  node += growth;
  std::int64_t need = node;
  if (w_.ranks < w_.represented_ranks && rank == 0) {
    // Every rank of the node holds what rank 0 holds.
    need = std::max(need, (result_.memory[0].host_peak_bytes + growth) *
                              std::min<std::int64_t>(static_cast<std::int64_t>(per_node),
                                                     std::max(1, w_.represented_ranks)));
  }
  stop_ = stop_ || need > stop_above_host_bytes_;
}

void Engine::sample_memory(std::int32_t rank) {
  if (!sampled_ranks_.empty() &&
      (idx(rank) >= sampled_ranks_.size() || !sampled_ranks_[idx(rank)])) {
    return;
  }
  const RankState& rs = b_.ranks[idx(rank)];
  const MemorySample sample{rank, now_, rs.live, rs.host_live,
                            static_cast<std::int64_t>(result_.allocations.size())};
  std::vector<MemorySample>& samples = result_.memory_samples;
  if (!samples.empty() && samples.back().rank == rank && samples.back().time_ns == now_) {
    samples.back() = sample;  // the same instant: only the state after the last change shows
  } else {
    samples.push_back(sample);
  }
}

// Device bytes grow only here, each growth followed by note_memory: the peak of a category is
// reached right after one of its own allocations, so only the categories allocated are compared.
inline void Engine::begin_op(OpId op, const Op& o) {
  // Ops run roughly in program order: fetch what a later one will read while this one runs.
  if (const std::size_t ahead = idx(op) + kPrefetchOps; ahead < w_.ops.size()) {
    const auto* later = reinterpret_cast<const char*>(&w_.ops[ahead]);
    prefetch(later);
    prefetch(later + sizeof(Op) - 1);
    prefetch(&b_.op[ahead]);
  }
  if (const std::size_t edge = idx(o.deps_begin) + 2 * kPrefetchOps; edge < w_.edges.size()) {
    prefetch(&w_.edges[edge]);
  }
  OpRuntime& rt = b_.op[idx(op)];
  rt.state = OpState::kRunning;
  rt.start = now_;

  RankState& rs = b_.ranks[idx(o.rank)];
  RankMemory& m = result_.memory[idx(o.rank)];
  FfWindowMax& window = ff_window_max_[idx(o.rank)];
  auto allocate = [&rs, &m, &window](MemCategory category, std::int64_t bytes) {
    const auto c = static_cast<std::size_t>(category);
    rs.live[c] += bytes;
    rs.device_total += bytes;
    m.category_peak[c] = std::max(m.category_peak[c], rs.live[c]);
    window.category_bytes[c] = std::max(window.category_bytes[c], rs.live[c]);
  };
  for (TensorId t : range(o.outputs_begin, o.outputs_end)) {
    const Tensor& ten = w_.tensors[idx(t)];
    if (ten.on_host) {
      rs.host_live += ten.bytes;
    } else {
      allocate(ten.category, rounded(ten.bytes));
    }
  }
  // A zero-byte allocation changes nothing (a category's peak is never below its live bytes).
  if (const std::int64_t workspace = rounded(o.workspace_bytes); workspace != 0) {
    allocate(o.workspace_category, workspace);
  }
  if (log_allocations_) [[unlikely]] {
    if (ff_log_ops_) {
      ff_op_log_.push_back(op);
    }
    log_begin(op, o);
  }
  note_memory(o.rank, op);
}

void Engine::set_head(std::size_t q, OpId op) {
  Queue& queue = b_.queues[q];
  queue.head = op;
  if (op != kNone) {
    queue.cursor = w_.ops[idx(op)].deps_begin;
  }
}

// Whether the head of queue q waits for nothing; if it waits for a dependency, the queue watches
// that op (it is asked again when the op ends).
inline bool Engine::head_ready(std::size_t q) {
  Queue& queue = b_.queues[q];
  const OpId op = queue.head;
  if (op == kNone || b_.op[idx(op)].state != OpState::kWaiting) {
    return false;
  }
  const std::int32_t end = w_.ops[idx(op)].deps_end;
  const std::int32_t* edges = w_.edges.data();
  std::int32_t e = queue.cursor;
  while (e < end && b_.op[idx(edges[e])].state == OpState::kDone) {
    ++e;
  }
  queue.cursor = e;
  if (e < end) {
    OpRuntime& dep = b_.op[idx(edges[e])];
    queue.next_watcher = dep.first_watcher;
    dep.first_watcher = static_cast<std::int32_t>(q);
    return false;
  }
  return !host_ || host_issued(q, op);
}

// Starts the head of queue q (ready: head_ready said so). A collective op only arrives until the
// last member arrives; then every member begins.
void Engine::start_head(std::size_t q) {
  const OpId op = b_.queues[q].head;
  const Op& o = w_.ops[idx(op)];
  const std::int32_t rank = o.rank;
  if (o.collective != kNone) {
    b_.op[idx(op)].state = OpState::kArrived;
    const Collective& c = w_.collectives[idx(o.collective)];
    CollectiveRuntime& cr = b_.collectives[idx(o.collective)];
    const std::vector<std::int32_t>& members = w_.members(c);
    if (++cr.arrivals < static_cast<std::int32_t>(members.size())) {
      return;
    }
    const double work = static_cast<double>(c.wire_bytes) + c.alpha_s * c.nominal_bytes_per_s;
    const std::int32_t a = new_activity(ActivityKind::kCollective, o.collective, rank, work);
    const std::uint8_t span = span_index(c.span);
    b_.activities[idx(a)].span = span;
    b_.activities[idx(a)].members = members.data();
    b_.activities[idx(a)].n_members = static_cast<std::int32_t>(members.size());
    b_.activities[idx(a)].base_rate = c.nominal_bytes_per_s * 1e-9;
    for (std::int32_t m : members) {
      b_.ranks[idx(m)].link[span] += 1;
      b_.ranks[idx(m)].collectives.push_back(a);
    }
    for (OpId m = cr.first_member; m != kNone; m = b_.op[idx(m)].next_member) {
      begin_op(m, w_.ops[idx(m)]);
    }
    refresh_ranks(members);
    return;
  }
  begin_op(op, o);
  RankState& rs = b_.ranks[idx(rank)];
  if (o.kind == OpKind::kCopyD2H || o.kind == OpKind::kCopyH2D) {
    const bool to_device = o.kind == OpKind::kCopyH2D;
    const auto& h = profile_.host_link;
    const double bw = to_device ? h.h2d_bytes_per_s : h.d2h_bytes_per_s;
    const std::int32_t a = new_activity(ActivityKind::kCopy, op, rank,
                                        static_cast<double>(o.transfer_bytes) + h.alpha_s * bw);
    Activity& act = b_.activities[idx(a)];
    act.to_device = to_device;
    act.base_rate = to_device ? h2d_rate_ : d2h_rate_;
    (to_device ? rs.h2d : rs.d2h) += 1;
    rs.copies.push_back(a);
    refresh_copies(rank);
  } else {
    if (rs.compute_activity != kNoCompute) {
      throw std::logic_error("two compute activities on one rank");
    }
    if (fixed_compute_rate_) {
      // Its rate is 1 whatever runs beside it: the completion is known now and never moves (the
      // same time and sequence number an activity would get), so no activity is kept for it.
      rs.compute_activity = kFixedRateCompute;
      push_event(now_ + std::max<SimTime>(0, o.duration_ns), fixed_rate_event(op));
    } else {
      rs.compute_activity =
          new_activity(ActivityKind::kCompute, op, rank, static_cast<double>(o.duration_ns));
      refresh(rs.compute_activity);
    }
  }
}

inline void Engine::release(TensorId t) {
  const Tensor& ten = w_.tensors[idx(t)];
  RankState& owner = b_.ranks[idx(ten.rank)];
  if (ten.on_host) {
    owner.host_live -= ten.bytes;
  } else {
    const std::int64_t bytes = rounded(ten.bytes);
    owner.live[static_cast<std::size_t>(ten.category)] -= bytes;
    owner.device_total -= bytes;
    if (log_allocations_) [[unlikely]] {
      log_release(t);
    }
  }
}

// Keys: a tensor's id, or −(op + 1) for an op's workspace. `maker` is the op that made the
// allocation (none: a tensor made before the step, in the default pools). Its pool is the op's
// memory_pool; by stream, the FSDP stream allocates from its own pools (PyTorch keeps pools per
// stream; FSDP2 and ZeRO-3 gather parameters on their stream) and every other stream from the
// default ones.
void Engine::log_allocation(
    std::int64_t key, std::int64_t bytes, std::int32_t rank, const Op* maker, bool allocate) {
  std::uint8_t pool = 0;
  if (maker != nullptr) {
    switch (maker->memory_pool) {
      case MemoryPool::kByStream:
        pool = maker->stream == Stream::kFsdp ? 1 : 0;
        break;
      case MemoryPool::kDefault:
        pool = 0;
        break;
      case MemoryPool::kGather:
        pool = 1;
        break;
      case MemoryPool::kReduce:
        pool = 2;
        break;
    }
  }
  result_.allocations.push_back({key, bytes, rank, pool, allocate});
}

// What begin_op allocates on the device, in its order: the outputs, then the workspace.
void Engine::log_begin(OpId op, const Op& o) {
  for (TensorId t : range(o.outputs_begin, o.outputs_end)) {
    const Tensor& ten = w_.tensors[idx(t)];
    if (!ten.on_host) {
      log_allocation(t, rounded(ten.bytes), o.rank, &o, true);
    }
  }
  if (const std::int64_t workspace = rounded(o.workspace_bytes); workspace != 0) {
    log_allocation(-std::int64_t{op} - 1, workspace, o.rank, &o, true);
  }
}

// The free of a device tensor, in the pool of the stream that made it.
void Engine::log_release(TensorId t) {
  const Tensor& ten = w_.tensors[idx(t)];
  const Op* maker = ten.producer == kNone ? nullptr : &w_.ops[idx(ten.producer)];
  log_allocation(t, rounded(ten.bytes), ten.rank, maker, false);
}

// One read of tensor t ended: whether it was its last (a sole reader keeps no count).
inline bool Engine::last_read(TensorId t) {
  const std::int32_t consumers = w_.tensors[idx(t)].consumers;
  if (consumers == 1) {
    return true;
  }
  TensorState& ts = b_.tensors[idx(t)];
  if (ts.run != b_.run) {
    ts.run = b_.run;
    ts.consumers_left = consumers;
  }
  return --ts.consumers_left == 0;
}

// The same for a read in skipped blocks, which must not read a tensor more often than it has
// readers.
bool Engine::ff_last_read(TensorId t) {
  const bool last = last_read(t);
  if (w_.tensors[idx(t)].consumers != 1 && b_.tensors[idx(t)].consumers_left < 0) {
    throw std::logic_error("fast-forward: a tensor read more often than it has readers");
  }
  return last;
}

// What an ending op frees, in finish_op's order: each input at its last read, then each output
// nobody reads.
template <class LastRead, class Free>
inline void Engine::free_at_end(const Op& o, LastRead last, Free free) {
  for (TensorId t : range(o.inputs_begin, o.inputs_end)) {
    if (last(t)) {
      free(t);
    }
  }
  for (TensorId t : range(o.outputs_begin, o.outputs_end)) {
    if (w_.tensors[idx(t)].consumers == 0) {
      free(t);
    }
  }
}

// Frees what the op held, starts the queue heads that waited only for it (in program order), then
// moves its own queue on.
void Engine::finish_op(OpId op) {
  const Op& o = w_.ops[idx(op)];
  OpRuntime& rt = b_.op[idx(op)];
  rt.state = OpState::kDone;
  ++done_;
  RankState& rs = b_.ranks[idx(o.rank)];
  result_.busy[idx(o.rank)].busy_ns[static_cast<std::size_t>(o.stream)] += now_ - rt.start;
  if (trace_) {
    result_.intervals.push_back({op, rt.start, now_});
  }
  if (ff_log_ops_) [[unlikely]] {
    ff_op_log_.push_back(~op);
  }
  if (const std::int64_t workspace = rounded(o.workspace_bytes); workspace != 0) {
    rs.live[static_cast<std::size_t>(o.workspace_category)] -= workspace;
    rs.device_total -= workspace;
    if (log_allocations_) [[unlikely]] {
      log_allocation(-std::int64_t{op} - 1, workspace, o.rank, &o, false);
    }
  }
  free_at_end(
      o, [this](TensorId t) { return last_read(t); }, [this](TensorId t) { release(t); });
  if (trace_) [[unlikely]] {
    sample_memory(o.rank);
  }
  if (host_ && o.host_sync) {
    release_host(op, o.rank);  // before the watchers: some wait for the host to issue their head
  }
  if (rt.first_watcher != kNone) {
    wake_watchers(rt);
  }
  const std::size_t own = queue_index(o.rank, o.stream);
  set_head(own, rt.next_in_stream);
  if (head_ready(own)) {
    start_head(own);
  }
}

// The queues watching an op that ended: each head whose dependencies have all ended starts, in
// program order (the order its dependencies' ends would list it in).
void Engine::wake_watchers(OpRuntime& rt) {
  std::int32_t* woken = b_.woken.data();
  std::size_t n = 0;
  for (std::int32_t w = rt.first_watcher; w != kNone;) {
    const std::int32_t next = b_.queues[idx(w)].next_watcher;  // head_ready may relink w
    if (head_ready(idx(w))) {
      // Insertion by head op id (a handful of queues at most).
      const OpId head = b_.queues[idx(w)].head;
      std::size_t i = n++;
      for (; i > 0 && b_.queues[idx(woken[i - 1])].head > head; --i) {
        woken[i] = woken[i - 1];
      }
      woken[i] = w;
    }
    w = next;
  }
  rt.first_watcher = kNone;
  for (std::size_t i = 0; i < n; ++i) {
    start_head(idx(woken[i]));
  }
}

void Engine::finish_activity(std::int32_t a) {
  Activity& act = b_.activities[idx(a)];
  act.active = false;
  const ActivityKind kind = act.kind;
  const std::int32_t id = act.id;
  const std::int32_t rank = act.rank;
  const bool to_device = act.to_device;
  b_.free_activities.push_back(a);
  if (kind == ActivityKind::kCollective) {
    const Collective& c = w_.collectives[idx(id)];
    const auto span = static_cast<std::size_t>(span_index(c.span));
    const std::vector<std::int32_t>& members = w_.members(c);
    for (std::int32_t m : members) {
      b_.ranks[idx(m)].link[span] -= 1;
      erase_value(b_.ranks[idx(m)].collectives, a);
    }
    refresh_ranks(members);
    for (OpId m = b_.collectives[idx(id)].first_member; m != kNone;) {
      const OpId next = b_.op[idx(m)].next_member;
      finish_op(m);
      m = next;
    }
    return;
  }
  RankState& rs = b_.ranks[idx(rank)];
  if (kind == ActivityKind::kCopy) {
    (to_device ? rs.h2d : rs.d2h) -= 1;
    erase_value(rs.copies, a);
    refresh_copies(rank);
  } else {
    rs.compute_activity = kNoCompute;
  }
  finish_op(id);
}

void Engine::setup() {
  const std::size_t n_ops = w_.ops.size();
  const auto n_ranks = static_cast<std::size_t>(w_.ranks);
  const std::size_t n_queues = n_ranks * kStreamCount;
  b_.events.clear();
  b_.activities.clear();
  b_.free_activities.clear();
  b_.op.resize(n_ops + 1);  // + the sentinel op fast-forward watches when it has nothing to watch
  b_.op[n_ops].state = OpState::kWaiting;
  b_.queues.assign(n_queues, Queue{});
  b_.woken.resize(n_queues);
  b_.collectives.assign(w_.collectives.size(), CollectiveRuntime{});
  b_.ranks.assign(n_ranks, {});
  result_.memory.assign(n_ranks, {});
  b_.node_host_bytes.assign(n_ranks / static_cast<std::size_t>(std::max(1, w_.gpus_per_node)) + 1,
                            0);
  result_.busy.assign(n_ranks, {});
  if (log_allocations_) {
    // At most an allocation and a free per tensor and per op's workspace: room for all of them up
    // front (pages are touched only as entries are written) instead of copies at each doubling;
    // in a recycled log, whose pages are in already.
    result_.allocations = std::move(b_.spare_allocations);
    result_.allocations.clear();
    result_.allocations.reserve(2 * (w_.tensors.size() + n_ops));
  }
  host_ = profile_.host_issue.enabled();
  if (host_) {
    if (n_queues >= static_cast<std::size_t>(kHostWaitEvent)) {
      throw std::logic_error("simulation: too many stream queues for host issue events");
    }
    call_ns_ = seconds_to_simtime(profile_.host_issue.per_call_s());
    sync_ns_ = seconds_to_simtime(profile_.host_issue.sync_s);
    b_.host_ops.resize(n_ops);
    b_.hosts.assign(n_ranks, {});
  }

  for (std::size_t i = 0; i < n_ops; ++i) {
    const Op& o = w_.ops[i];
    const auto self = static_cast<OpId>(i);
    OpRuntime& rt = b_.op[i];
    rt.next_in_stream = kNone;
    rt.next_member = kNone;
    rt.first_watcher = kNone;
    rt.state = OpState::kWaiting;
    Queue& queue = b_.queues[queue_index(o.rank, o.stream)];
    if (queue.tail == kNone) {
      queue.head = self;
      queue.cursor = o.deps_begin;
    } else {
      b_.op[idx(queue.tail)].next_in_stream = self;
    }
    queue.tail = self;
    if (o.collective != kNone) {
      CollectiveRuntime& cr = b_.collectives[idx(o.collective)];
      (cr.last_member == kNone ? cr.first_member : b_.op[idx(cr.last_member)].next_member) = self;
      cr.last_member = self;
    }
    if (host_) {
      setup_host(self, o);
    }
  }
  if (++b_.run == 0) {  // wrapped: forget every earlier run
    b_.tensors.assign(b_.tensors.size(), TensorState{});
    b_.run = 1;
  }
  b_.tensors.resize(w_.tensors.size());  // new entries have run 0: not this run's
  for (std::size_t r = 0; r < n_ranks; ++r) {
    const StaticMemory& sm = w_.static_memory[r];
    b_.ranks[r].device_total = sm.model_states_bytes + sm.fixed_overhead_bytes;
    result_.memory[r].fixed_overhead_bytes = sm.fixed_overhead_bytes;
    result_.memory[r].nccl_bytes = sm.nccl_bytes;
    result_.memory[r].peak_bytes = b_.ranks[r].device_total;
    stop_ = stop_ || b_.ranks[r].device_total > stop_above_bytes_;
  }
  const auto& h = profile_.host_link;
  compute_rate_under_comm_ = 1.0 / (1.0 + profile_.compute_slowdown_under_comm);
  fixed_compute_rate_ = compute_rate_under_comm_ == 1.0;
  h2d_rate_ = h.h2d_bytes_per_s * 1e-9;
  d2h_rate_ = h.d2h_bytes_per_s * 1e-9;
  duplex_half_rate_ = h.duplex_total_bytes_per_s * 1e-9 / 2.0;
}

SimResult Engine::run() {
  setup();
  ff_setup();
  for (std::size_t q = 0; q < b_.queues.size(); ++q) {
    if (head_ready(q)) {
      start_head(q);
    }
  }
  std::vector<Event>& heap = b_.events;
  while (!heap.empty() && !stop_) {
    std::pop_heap(heap.begin(), heap.end(), EventLater{});
    const Event e = heap.back();
    heap.pop_back();
    ++events_;
    if (e.activity < 0) {
      now_ = e.time;
      const OpId op = fixed_rate_op(e.activity);
      b_.ranks[idx(w_.ops[idx(op)].rank)].compute_activity = kNoCompute;
      finish_op(op);
    } else if (e.activity >= kHostWaitEvent) [[unlikely]] {
      // The host has issued the queue's head (it waited for nothing else: head_ready said so).
      now_ = e.time;
      const auto q = idx(e.activity - kHostWaitEvent);
      if (head_ready(q)) {
        start_head(q);
      }
    } else {
      const Activity& act = b_.activities[idx(e.activity)];
      if (!act.active || act.event_seq != e.seq) {
        continue;  // superseded by a rate change
      }
      now_ = e.time;
      finish_activity(e.activity);
    }
    if (b_.op[idx(ff_watch_)].state != OpState::kWaiting) [[unlikely]] {
      ff_at_boundary();
    }
  }
  result_.events = events_;
  result_.step_time_ns = now_;
  result_.stopped_early = stop_;

  const std::size_t n_ops = w_.ops.size();
  for (std::size_t i = 0; !stop_ && done_ < n_ops && i < n_ops; ++i) {
    if (b_.op[i].state != OpState::kDone) {
      throw std::logic_error(fmt::format("simulation stalled: op {} '{}' on rank {} never ran", i,
                                         w_.names[idx(w_.ops[i].name)], w_.ops[i].rank));
    }
  }
  // Model states are static memory: report them in the breakdown at the peak.
  for (std::size_t r = 0; r < static_cast<std::size_t>(w_.ranks); ++r) {
    result_.memory[r].breakdown_at_peak[static_cast<std::size_t>(MemCategory::kModelStates)] +=
        w_.static_memory[r].model_states_bytes;
    result_.memory[r].category_peak[static_cast<std::size_t>(MemCategory::kModelStates)] +=
        w_.static_memory[r].model_states_bytes;
  }
  return std::move(result_);
}

}  // namespace

Simulator::Simulator() : scratch_(std::make_unique<Scratch>()) {}

void Simulator::recycle(SimResult&& spent) {
  if (spent.allocations.capacity() > scratch_->spare_allocations.capacity()) {
    scratch_->spare_allocations = std::move(spent.allocations);
  }
}
Simulator::~Simulator() = default;
Simulator::Simulator(Simulator&&) noexcept = default;
Simulator& Simulator::operator=(Simulator&&) noexcept = default;

SimResult Simulator::run(const Workload& workload,
                         const models::HardwareProfile& profile,
                         const SimOptions& options) {
  Engine engine(workload, profile, options, *scratch_);
  return engine.run();
}

SimResult simulate(const Workload& workload,
                   const models::HardwareProfile& profile,
                   const SimOptions& options) {
  return Simulator().run(workload, profile, options);
}

}  // namespace cpsim::sim
