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

std::int32_t Engine::new_activity(ActivityKind kind,
                                  std::int32_t id,
                                  std::int32_t rank,
                                  double work) {
  std::int32_t a = 0;
  if (b_.free_activities.empty()) {
    a = static_cast<std::int32_t>(b_.activities.size());
    b_.activities.emplace_back();
  } else {
    a = b_.free_activities.back();
    b_.free_activities.pop_back();
  }
  Activity& act = b_.activities[idx(a)];
  act.kind = kind;
  act.id = id;
  act.rank = rank;
  act.active = true;
  act.scheduled = false;
  act.remaining = std::max(0.0, work);
  act.rate = 0.0;
  act.last_update = now_;
  return a;
}

// What the activity's rate depends on, as one number (equal keys give equal rates): compute,
// whether a collective runs on its rank; copy, 2 x copies in its direction + both directions busy;
// collective, the most collectives on one member's link.
std::int32_t Engine::rate_key(const Activity& act) const {
  const RankState& rs = b_.ranks[idx(act.rank)];
  switch (act.kind) {
    case ActivityKind::kCompute:
      return rs.collectives.empty() ? 0 : 1;
    case ActivityKind::kCopy:
      return 2 * std::max(1, act.to_device ? rs.h2d : rs.d2h) + (rs.h2d > 0 && rs.d2h > 0 ? 1 : 0);
    case ActivityKind::kCollective: {
      std::int32_t worst = 1;
      for (std::int32_t i = 0; i < act.n_members; ++i) {
        worst = std::max(worst, b_.ranks[idx(act.members[i])].link[act.span]);
      }
      return worst;
    }
  }
  return 0;
}

double Engine::rate_of(const Activity& act, std::int32_t key) const {
  switch (act.kind) {
    case ActivityKind::kCompute:
      return key == 0 ? 1.0 : compute_rate_under_comm_;
    case ActivityKind::kCopy: {
      const std::int32_t same = key / 2;
      double rate = act.base_rate / same;
      if (key % 2 != 0) {
        rate = std::min(rate, duplex_half_rate_ / same);
      }
      return rate;
    }
    case ActivityKind::kCollective:
      return act.base_rate / key;
  }
  return 1.0;
}

// Brings the activity's remaining work up to now; when its rate changed (or it has none yet),
// schedules its completion at the new rate, superseding the earlier event.
// An activity whose rate stays is not touched: its remaining work is brought up to date only when
// its rate changes.
void Engine::refresh(std::int32_t a) {
  Activity& act = b_.activities[idx(a)];
  const std::int32_t key = rate_key(act);
  if (act.scheduled && key == act.rate_key) {
    return;  // same inputs, same rate: the scheduled completion still holds
  }
  act.rate_key = key;
  const double rate = rate_of(act, key);
  if (act.scheduled && rate == act.rate) {
    return;
  }
  if (now_ > act.last_update) {
    act.remaining =
        std::max(0.0, act.remaining - act.rate * static_cast<double>(now_ - act.last_update));
  }
  act.last_update = now_;
  act.rate = rate;
  act.scheduled = true;
  act.event_seq = seq_;
  const SimTime dt = ceil_ns(act.remaining / rate - 1e-6);
  push_event(now_ + std::max<SimTime>(0, dt), a);
}

inline void Engine::push_event(SimTime time, std::int32_t target) {
  if (seq_ == std::numeric_limits<std::uint32_t>::max()) {
    throw std::logic_error("simulation: event sequence numbers exhausted");
  }
  b_.events.push_back({time, seq_++, target});
  std::push_heap(b_.events.begin(), b_.events.end(), EventLater{});
}

// What a rate depends on (rate_key): a compute activity, whether collectives run on its rank; a
// copy, the copies of its rank; a collective, the collectives on its members' links. So a change
// refreshes only the activities it can affect (refreshing any other would find its key unchanged):
// a compute op's start or end none but itself, a copy's the copies of its rank, a collective's the
// compute and the collectives of its members.
void Engine::refresh_copies(std::int32_t rank) {
  for (std::int32_t a : b_.ranks[idx(rank)].copies) {
    refresh(a);
  }
}

// The members' compute and collective activities, each once (a collective spans several members),
// rank by rank.
void Engine::refresh_ranks(std::span<const std::int32_t> ranks) {
  if (ranks.size() == 1) {
    const RankState& rs = b_.ranks[idx(ranks[0])];
    if (rs.compute_activity >= 0) {
      refresh(rs.compute_activity);
    }
    for (std::int32_t a : rs.collectives) {
      refresh(a);
    }
    return;
  }
  ++stamp_now_;
  auto touch = [this](std::int32_t a) {
    std::uint32_t& stamp = b_.activities[idx(a)].stamp;
    if (stamp != stamp_now_) {
      stamp = stamp_now_;
      refresh(a);
    }
  };
  for (std::int32_t r : ranks) {
    const RankState& rs = b_.ranks[idx(r)];
    if (rs.compute_activity >= 0) {
      touch(rs.compute_activity);
    }
    for (std::int32_t a : rs.collectives) {
      touch(a);
    }
  }
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

// Host issue: whether the host has issued `op`, the head of queue q, by now. If not, the queue
// waits: on the synchronising op the host waits for (its end issues more), or until the instant
// the host issues it.
bool Engine::host_issued(std::size_t q, OpId op) {
  const SimTime at = b_.host_ops[idx(op)].issued;
  if (at <= now_) {
    return true;
  }
  ++host_waits_;
  if (at == kNotIssued) {
    OpRuntime& sync = b_.op[idx(b_.hosts[idx(w_.ops[idx(op)].rank)].waits_for)];
    b_.queues[q].next_watcher = sync.first_watcher;
    sync.first_watcher = static_cast<std::int32_t>(q);
    return false;
  }
  push_event(at, kHostWaitEvent + static_cast<std::int32_t>(q));
  return false;
}

// Issues the rank's ops in program order until one the host must wait for (O(1) per op).
void Engine::advance_host(std::int32_t rank) {
  HostClock& h = b_.hosts[idx(rank)];
  while (h.next != kNone && h.waits_for == kNone) {
    const OpId op = h.next;
    const Op& o = w_.ops[idx(op)];
    h.time += static_cast<SimTime>(o.host_calls) * call_ns_;
    b_.host_ops[idx(op)].issued = h.time;
    if (trace_) [[unlikely]] {
      note_issue(op, o, h.time);
    }
    if (o.host_sync) {
      h.waits_for = op;
    }
    h.next = b_.host_ops[idx(op)].next_on_rank;
  }
}

// Setup, in program order: the host issues the op now unless its rank's host waits for a
// synchronisation (as advance_host would, without a second pass over the ops); the ops after that
// are linked for advance_host.
void Engine::setup_host(OpId op, const Op& o) {
  HostClock& h = b_.hosts[idx(o.rank)];
  HostOp& ho = b_.host_ops[idx(op)];
  ho.next_on_rank = kNone;
  if (h.waits_for == kNone) {
    h.time += static_cast<SimTime>(o.host_calls) * call_ns_;
    ho.issued = h.time;
    if (trace_) [[unlikely]] {
      note_issue(op, o, h.time);
    }
    if (o.host_sync) {
      h.waits_for = op;
    }
    return;
  }
  ho.issued = kNotIssued;
  (h.tail == kNone ? h.next : b_.host_ops[idx(h.tail)].next_on_rank) = op;
  h.tail = op;
}

// Trace only: the host's issue of `op`, from its first call to `issued`.
void Engine::note_issue(OpId op, const Op& o, SimTime issued) {
  if (o.host_calls > 0) {
    result_.host_intervals.push_back(
        {op, issued - static_cast<SimTime>(o.host_calls) * call_ns_, issued});
  }
}

// A host_sync op ended: the host resumes sync_s after the later of its end and the host's own
// clock, and issues on.
void Engine::release_host(OpId op, std::int32_t rank) {
  HostClock& h = b_.hosts[idx(rank)];
  if (h.waits_for != op) {
    return;
  }
  h.time = std::max(h.time, now_) + sync_ns_;
  h.waits_for = kNone;
  advance_host(rank);
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

// Fast-forward. The blocks of a step are instances of one template each (forward, backward), laid
// out at equal spacing in program order: instance i+1 is instance i with every op, tensor, edge and
// collective id moved by Δ, whatever the builder put between them included. The engine's rules
// read ids only through the workload, so when
//  (a) the state when block i's first op has started (queue heads and cursors, running activities
//      with their remaining work and rates, pending events, all relative to now and to the block)
//      is the state when block i−1's first op had started moved by Δ, except queues that wait for
//      an op after the window and are otherwise left alone, and
//  (b) every op in [M(i−1), M(i+k+2)) is the op Δ before it moved by Δ (kind, stream, duration,
//      bytes, workspace, collective; dependencies moved by Δ or the same done op; tensors moved by
//      Δ with the same sizes and reader counts, or the same tensor, read again after the window),
// the run from block i to block i+k is the run from block i−1 to block i repeated k times: the
// state at block i+k is the state at block i with ids moved by kΔ, the time by k periods, busy
// totals, events and live memory by k times their growth over one block. Peaks need nothing: the
// skipped blocks follow the memory profile of block i−1 plus a multiple of the growth, whose
// maximum is in block i−1 or in block i+k, both simulated (with no growth the earliest, as in the
// full run). A stop limit is not crossed inside the skipped blocks (ff_stop_limit), so a run that
// stops stops at the same op.
void Engine::ff_setup() {
  ff_readers_known_ = false;
  ff_reads_listed_ = false;
  ff_reads_first_asked_ = std::numeric_limits<std::size_t>::max();
  ff_runs_.clear();
  ff_boundaries_.clear();
  ff_next_ = 0;
  ff_prev_ = {};
  ff_window_max_.assign(idx(w_.ranks), {});
  if (fast_forward_) {
    auto same_step = [](const Workload::Instance& a, const Workload::Instance& b,
                        const Workload::Instance& c) {
      return b.ops - a.ops == c.ops - b.ops && b.tensors - a.tensors == c.tensors - b.tensors &&
             b.edges - a.edges == c.edges - b.edges &&
             b.collectives - a.collectives == c.collectives - b.collectives && c.ops > b.ops;
    };
    for (const std::int32_t block : {Workload::kForwardBlock, Workload::kBackwardBlock}) {
      FfRun run;
      auto close = [this, &run] {
        if (run.marks.size() >= 5) {
          ff_runs_.push_back(std::move(run));
        }
        run = {};
      };
      for (const Workload::Instance& m : w_.instances) {
        if (m.template_id != block) {
          continue;
        }
        const std::size_t n = run.marks.size();
        if (n >= 2 && !same_step(run.marks[n - 2], run.marks[n - 1], m)) {
          const Workload::Instance last = run.marks.back();
          close();
          run.marks.push_back(last);
        }
        run.marks.push_back(m);
      }
      close();
    }
    for (std::size_t r = 0; r < ff_runs_.size(); ++r) {
      const auto n = static_cast<std::int32_t>(ff_runs_[r].marks.size());
      for (std::int32_t i = 1; i <= n - 4; ++i) {
        ff_boundaries_.push_back({static_cast<std::int32_t>(r), i, ff_runs_[r].marks[idx(i)].ops});
      }
    }
    std::sort(ff_boundaries_.begin(), ff_boundaries_.end(),
              [](const FfBoundary& a, const FfBoundary& b) { return a.op < b.op; });
  }
  ff_arm_next();
}

void Engine::ff_arm_next() {
  ff_watch_ = ff_next_ < ff_boundaries_.size() ? ff_boundaries_[ff_next_].op
                                               : static_cast<OpId>(w_.ops.size());
  ff_log_ops_ = log_allocations_ && ff_next_ < ff_boundaries_.size();
}

Engine::FfSnapshot Engine::ff_snapshot(const FfBoundary& at) const {
  FfSnapshot s;
  s.valid = true;
  s.run = at.run;
  s.index = at.index;
  s.now = now_;
  s.events = events_;
  s.queues.resize(b_.queues.size());
  for (std::size_t q = 0; q < b_.queues.size(); ++q) {
    const Queue& queue = b_.queues[q];
    FfQueue& f = s.queues[q];
    f.head = queue.head;
    f.cursor = queue.cursor;
    if (queue.head != kNone) {
      const OpRuntime& rt = b_.op[idx(queue.head)];
      f.state = rt.state;
      if (rt.state == OpState::kRunning) {
        f.start = rt.start;
      } else if (rt.state == OpState::kArrived) {
        f.arrivals = b_.collectives[idx(w_.ops[idx(queue.head)].collective)].arrivals;
      }
    }
  }
  s.heap = b_.events;
  std::sort(s.heap.begin(), s.heap.end(), [](const Event& a, const Event& b) {
    return a.time != b.time ? a.time < b.time : a.seq < b.seq;
  });
  s.activities = b_.activities;
  s.ranks = b_.ranks;
  s.busy = result_.busy;
  s.window_max = ff_window_max_;
  s.allocations = result_.allocations.size();
  if (host_) {
    s.hosts = b_.hosts;
    s.host_waits = host_waits_;
    s.host_from.assign(b_.hosts.size(), kNone);
    for (std::size_t q = 0; q < b_.queues.size(); ++q) {
      const OpId head = b_.queues[q].head;
      if (head != kNone) {
        OpId& from = s.host_from[q / kStreamCount];
        from = from == kNone ? head : std::min(from, head);
      }
    }
    s.issued.resize(b_.hosts.size());
    const FfRun& run = ff_runs_[idx(at.run)];
    const OpId block_ops = run.marks[1].ops - run.marks[0].ops;
    for (std::size_t r = 0; r < b_.hosts.size(); ++r) {
      const HostClock& h = b_.hosts[r];
      if (h.waits_for == kNone || s.host_from[r] == kNone ||
          h.waits_for - s.host_from[r] > 2 * block_ops) {
        continue;  // running ahead (absolute times), or nothing left to run
      }
      const OpId to = h.next == kNone ? static_cast<OpId>(w_.ops.size()) : h.next;
      for (OpId x = s.host_from[r]; x < to; ++x) {
        if (idx(w_.ops[idx(x)].rank) == r) {
          s.issued[r].push_back(b_.host_ops[idx(x)].issued);
        }
      }
    }
  }
  return s;
}

bool Engine::ff_same_activity(const Activity& a,
                              SimTime a_now,
                              const Activity& b,
                              SimTime b_now,
                              const Workload::Instance& d) const {
  const std::int32_t shift = a.kind == ActivityKind::kCollective ? d.collectives : d.ops;
  return a.active && b.active && a.kind == b.kind && b.id - a.id == shift && a.rank == b.rank &&
         a.remaining == b.remaining && a.rate == b.rate && a.base_rate == b.base_rate &&
         a.rate_key == b.rate_key && a.scheduled == b.scheduled && a.to_device == b.to_device &&
         a.span == b.span && a.n_members == b.n_members && a.members == b.members &&
         a.last_update - a_now == b.last_update - b_now;
}

// (a) above: `c` is `p` moved by d (heads of moved queues from window_begin on).
bool Engine::ff_equivalent(const FfSnapshot& p,
                           const FfSnapshot& c,
                           const Workload::Instance& d,
                           OpId window_begin) const {
  for (std::size_t q = 0; q < c.queues.size(); ++q) {
    const FfQueue& a = p.queues[q];
    const FfQueue& b = c.queues[q];
    if (a.head == b.head) {  // left alone: waiting (checked against the window by the caller)
      if (a.head != kNone &&
          (a.cursor != b.cursor || a.state != OpState::kWaiting || b.state != OpState::kWaiting)) {
        return false;
      }
      continue;
    }
    if (a.head == kNone || b.head == kNone || b.head - a.head != d.ops ||
        b.cursor - a.cursor != d.edges || a.state != b.state || b.head < window_begin) {
      return false;
    }
    if ((a.state == OpState::kRunning && a.start - p.now != b.start - c.now) ||
        (a.state == OpState::kArrived && a.arrivals != b.arrivals)) {
      return false;
    }
  }
  if (p.heap.size() != c.heap.size()) {
    return false;
  }
  for (std::size_t e = 0; e < p.heap.size(); ++e) {
    const Event& a = p.heap[e];
    const Event& b = c.heap[e];
    if (a.time - p.now != b.time - c.now || (a.activity < 0) != (b.activity < 0)) {
      return false;
    }
    if (a.activity < 0) {
      if (fixed_rate_op(b.activity) - fixed_rate_op(a.activity) != d.ops) {
        return false;
      }
      continue;
    }
    if (a.activity >= kHostWaitEvent || b.activity >= kHostWaitEvent) {
      if (a.activity != b.activity) {  // the same queue
        return false;
      }
      continue;
    }
    const Activity& x = p.activities[idx(a.activity)];
    const Activity& y = c.activities[idx(b.activity)];
    const bool a_current = x.active && x.event_seq == a.seq;
    const bool b_current = y.active && y.event_seq == b.seq;
    if (a_current != b_current || (a_current && !ff_same_activity(x, p.now, y, c.now, d))) {
      return false;
    }
  }
  auto same_slot = [&](std::int32_t x, std::int32_t y) {
    return x < 0 || y < 0
               ? x == y
               : ff_same_activity(p.activities[idx(x)], p.now, c.activities[idx(y)], c.now, d);
  };
  auto same_list = [&](const std::vector<std::int32_t>& x, const std::vector<std::int32_t>& y) {
    if (x.size() != y.size()) {
      return false;
    }
    for (std::size_t i = 0; i < x.size(); ++i) {
      if (!same_slot(x[i], y[i])) {
        return false;
      }
    }
    return true;
  };
  for (std::size_t r = 0; r < c.ranks.size(); ++r) {
    const RankState& a = p.ranks[r];
    const RankState& b = c.ranks[r];
    if (a.h2d != b.h2d || a.d2h != b.d2h || a.link != b.link ||
        !same_slot(a.compute_activity, b.compute_activity) || !same_list(a.copies, b.copies) ||
        !same_list(a.collectives, b.collectives)) {
      return false;
    }
  }
  return !host_ || ff_same_hosts(p, c, d);
}

// The host clocks: each rank's either waits for a synchronisation in both states, the op moved by
// d, with the same issue times relative to now (the host is tied to the GPU's progress, and moves
// with it); or waits for the same synchronisation, or for none, in both (it runs ahead: absolute
// issue times up to that op, which the skipped blocks must end before), and then must not have
// held up any op since `p` nor issue a block slower than the GPU runs one (so it never holds one
// up in the skipped blocks either).
bool Engine::ff_same_hosts(const FfSnapshot& p,
                           const FfSnapshot& c,
                           const Workload::Instance& d) const {
  const SimTime period = c.now - p.now;
  for (std::size_t r = 0; r < c.hosts.size(); ++r) {
    const HostClock& a = p.hosts[r];
    const HostClock& b = c.hosts[r];
    if (a.waits_for == b.waits_for) {
      // Ahead of the GPU: everything to the synchronisation it waits for (if any) is issued.
      if (c.host_waits != p.host_waits) {
        return false;
      }
      // The host's time per block, from the rank's heads (every op is issued).
      for (std::size_t q = r * kStreamCount; q < (r + 1) * kStreamCount; ++q) {
        const OpId head = c.queues[q].head;
        if (head != kNone && head != p.queues[q].head &&
            b_.host_ops[idx(head)].issued - b_.host_ops[idx(head - d.ops)].issued > period) {
          return false;
        }
      }
      continue;
    }
    auto moved = [&d](OpId x, OpId y) { return x == kNone ? y == kNone : y - x == d.ops; };
    if (a.waits_for == kNone || b.waits_for == kNone || p.issued[r].empty() ||
        !moved(a.waits_for, b.waits_for) || !moved(a.next, b.next) ||
        a.time - p.now != b.time - c.now || !moved(p.host_from[r], c.host_from[r]) ||
        p.issued[r].size() != c.issued[r].size()) {
      return false;
    }
    for (std::size_t i = 0; i < p.issued[r].size(); ++i) {
      const SimTime x = p.issued[r][i], y = c.issued[r][i];
      if ((x == kNotIssued) != (y == kNotIssued) || (x != kNotIssued && x - p.now != y - c.now)) {
        return false;
      }
    }
  }
  return true;
}

// The op a waiting queue head is on the watcher list of: its first unfinished dependency, or the
// synchronisation its rank's host waits for while the head is not issued (kNone: it waits for its
// issue event, or is not waiting).
OpId Engine::ff_watched(OpId head, std::int32_t cursor) const {
  const Op& o = w_.ops[idx(head)];
  if (cursor < o.deps_end) {
    return w_.edges[idx(cursor)];
  }
  if (host_ && b_.host_ops[idx(head)].issued == kNotIssued) {
    return b_.hosts[idx(o.rank)].waits_for;
  }
  return kNone;
}

// Whether op o is op r moved by d in everything but its edges' contents: kind, stream, duration,
// bytes, workspace, host calls, edge counts and positions, collective. Names and layers label ops
// for reports only (per-block ops built between instances carry the layer in their name).
bool Engine::ff_same_op(const Op& o, const Op& r, const Workload::Instance& d) const {
  if (o.rank != r.rank || o.stream != r.stream || o.kind != r.kind || o.phase != r.phase ||
      o.duration_ns != r.duration_ns || o.transfer_bytes != r.transfer_bytes ||
      o.workspace_bytes != r.workspace_bytes || o.workspace_category != r.workspace_category ||
      o.memory_pool != r.memory_pool || o.host_calls != r.host_calls ||
      o.host_sync != r.host_sync || o.deps_begin - r.deps_begin != d.edges ||
      o.deps_end - o.deps_begin != r.deps_end - r.deps_begin ||
      o.inputs_end - o.inputs_begin != r.inputs_end - r.inputs_begin ||
      o.outputs_end - o.outputs_begin != r.outputs_end - r.outputs_begin ||
      (o.collective == kNone) != (r.collective == kNone)) {
    return false;
  }
  if (o.collective == kNone) {
    return true;
  }
  const Collective& a = w_.collectives[idx(o.collective)];
  const Collective& b = w_.collectives[idx(r.collective)];
  return o.collective - r.collective == d.collectives && a.kind == b.kind && a.span == b.span &&
         a.group == b.group && a.size_bytes == b.size_bytes && a.wire_bytes == b.wire_bytes &&
         a.alpha_s == b.alpha_s && a.nominal_bytes_per_s == b.nominal_bytes_per_s;
}

// (b) above over [from, to): the first op that is not the op d before it moved by d (`to` when
// every one is). Lists in ff_statics_ the tensors read by the same id, with their reads in
// [period_begin, period_end).
OpId Engine::ff_first_aperiodic(const FfSnapshot& p,
                                OpId from,
                                OpId to,
                                TensorId from_tensor,
                                TensorId to_tensor,
                                const Workload::Instance& d,
                                OpId period_begin,
                                OpId period_end) {
  ff_statics_.clear();
  const std::int32_t* edges = w_.edges.data();
  auto same_tensor = [this](TensorId x, TensorId y) {
    const Tensor& a = w_.tensors[idx(x)];
    const Tensor& b = w_.tensors[idx(y)];
    return a.bytes == b.bytes && a.rank == b.rank && a.category == b.category &&
           a.on_host == b.on_host && a.consumers == b.consumers &&
           (a.producer == kNone) == (b.producer == kNone);
  };
  auto done_at_p = [this, &p](OpId op) { return ff_done_at(p, op); };
  auto done_now = [this](OpId op) { return b_.op[idx(op)].state == OpState::kDone; };
  // A tensor of the window moved by d from b (a == b + d.tensors): the window's tensors
  // [from_tensor, to_tensor) are compared once each, in order, as far as the reads reach, so
  // that a tensor read several times is compared once.
  TensorId verified = from_tensor;  // [from_tensor, verified): each the same as d.tensors before
  auto same_moved_tensor = [&](TensorId a, TensorId b) {
    if (a >= from_tensor && a < to_tensor) {
      while (verified <= a && same_tensor(verified, verified - d.tensors)) {
        ++verified;
      }
      if (a < verified) {
        return true;
      }
    }
    return same_tensor(a, b);
  };
  // Tensors made before the window and its reference: a by an op done now, b by one done at p.
  auto made_before = [&](TensorId a, TensorId b) {
    const OpId pa = w_.tensors[idx(a)].producer, pb = w_.tensors[idx(b)].producer;
    return (pa == kNone || done_now(pa)) && (pb == kNone || done_at_p(pb));
  };
  auto periodic = [&](OpId x) {
    const Op& o = w_.ops[idx(x)];
    const Op& r = w_.ops[idx(x - d.ops)];
    if (!ff_same_op(o, r, d)) {
      return false;
    }
    for (std::int32_t j = 0; j < o.deps_end - o.deps_begin; ++j) {
      const OpId a = edges[o.deps_begin + j];
      const OpId b = edges[r.deps_begin + j];
      // Moved with the block, or no constraint on either side (ended before both runs).
      if (a != b + d.ops && !(done_now(a) && done_at_p(b))) {
        return false;
      }
    }
    for (std::int32_t j = 0; j < o.inputs_end - o.inputs_begin; ++j) {
      const TensorId a = edges[o.inputs_begin + j];
      const TensorId b = edges[r.inputs_begin + j];
      if (a == b + d.tensors && same_moved_tensor(a, b)) {
        continue;
      }
      // Each block's own tensor made before the window (a backward block reading what its
      // forward saved, in the reverse order): the same when its sole reader is this op, or when
      // its reads free it as the other's freed it (ff_same_reads).
      if (a != b && made_before(a, b) && same_tensor(a, b) &&
          (w_.tensors[idx(a)].consumers == 1 || ff_same_reads(a, x, b, p, from, to, d.ops))) {
        continue;
      }
      if (a != b) {
        return false;
      }
      if (x >= period_begin && x < period_end) {
        auto it = std::find_if(ff_statics_.begin(), ff_statics_.end(),
                               [a](const auto& s) { return s.first == a; });
        if (it == ff_statics_.end()) {
          ff_statics_.emplace_back(a, 1);
        } else {
          ++it->second;
        }
      }
    }
    for (std::int32_t j = 0; j < o.outputs_end - o.outputs_begin; ++j) {
      const TensorId a = edges[o.outputs_begin + j];
      const TensorId b = edges[r.outputs_begin + j];
      if (a != b + d.tensors || !same_moved_tensor(a, b)) {
        return false;
      }
    }
    return true;
  };
  // Instances of one template Δ apart (Workload::template_shapes): the ops without a port are
  // the same up to Δ by construction, so only the instance's tensors and its ported ops are
  // compared. When every tensor is the same, no op before the first ported op that differs can
  // differ: that op is the answer. Otherwise the instance is compared op by op.
  const auto& instances = w_.instances;
  auto instance_at = [&instances](OpId op) {
    return std::lower_bound(instances.begin(), instances.end(), op,
                            [](const Workload::Instance& m, OpId value) { return m.ops < value; });
  };
  auto counterpart = [&](const Workload::Instance& m) {
    const auto ref = instance_at(m.ops - d.ops);
    return ref != instances.end() && ref->ops == m.ops - d.ops &&
           ref->template_id == m.template_id && ref->tensors == m.tensors - d.tensors &&
           ref->edges == m.edges - d.edges && ref->collectives == m.collectives - d.collectives;
  };
  OpId x = from;
  for (auto m = instance_at(from); x < to; ++m) {
    const OpId next = m == instances.end() ? to : std::min(m->ops, to);
    for (; x < next; ++x) {
      if (!periodic(x)) {
        return x;
      }
    }
    if (m == instances.end() || x >= to) {
      break;
    }
    if (idx(m->template_id) >= w_.template_shapes.size()) {
      continue;  // not a template the build recorded
    }
    const Workload::TemplateShape& shape = w_.template_shapes[idx(m->template_id)];
    if (shape.ops <= 0 || m->ops < x || m->ops + shape.ops > to || !counterpart(*m)) {
      continue;  // compared op by op (the loop above, from the next instance on)
    }
    bool same_tensors = true;
    for (TensorId t = m->tensors; t < m->tensors + shape.tensors && same_tensors; ++t) {
      same_tensors = same_moved_tensor(t, t - d.tensors);
    }
    if (!same_tensors) {
      continue;
    }
    for (const std::int32_t q : shape.ported_ops) {
      if (!periodic(m->ops + q)) {
        return m->ops + q;
      }
    }
    x = m->ops + shape.ops;
  }
  return to;
}

// Whether op `op` had ended when snapshot p was taken (a queue runs its ops in order).
bool Engine::ff_done_at(const FfSnapshot& p, OpId op) const {
  const Op& o = w_.ops[idx(op)];
  const OpId head = p.queues[queue_index(o.rank, o.stream)].head;
  return head == kNone || op < head;
}

// Learns each tensor's count of reads, the queue of its readers and its last reader (one pass
// over the ops).
void Engine::ff_learn_readers() {
  ff_readers_known_ = true;
  ff_reads_listed_ = false;
  const std::size_t n = w_.tensors.size();
  b_.read_begin.assign(n + 1, 0);
  b_.reader_queue.assign(n, kNoQueue);
  b_.last_reader.resize(n);  // read only where reader_queue says the tensor is read
  const std::int32_t* edges = w_.edges.data();
  for (std::size_t i = 0; i < w_.ops.size(); ++i) {
    const Op& o = w_.ops[i];
    const auto q = static_cast<std::int32_t>(queue_index(o.rank, o.stream));
    for (std::int32_t e = o.inputs_begin; e < o.inputs_end; ++e) {
      const auto t = idx(edges[e]);
      b_.read_begin[t + 1] += 1;
      std::int32_t& rq = b_.reader_queue[t];
      rq = rq == kNoQueue || rq == q ? q : kMixedQueues;
      b_.last_reader[t] = static_cast<OpId>(i);
    }
  }
}

// Lists each tensor's reads in program order (a second pass over the ops, after
// ff_learn_readers's counts).
void Engine::ff_list_reads() {
  ff_reads_listed_ = true;
  std::partial_sum(b_.read_begin.begin(), b_.read_begin.end(), b_.read_begin.begin());
  b_.reads.resize(idx(b_.read_begin.back()));
  b_.read_cursor.assign(b_.read_begin.begin(), b_.read_begin.end() - 1);
  const std::int32_t* edges = w_.edges.data();
  for (std::size_t i = 0; i < w_.ops.size(); ++i) {
    const Op& o = w_.ops[i];
    for (std::int32_t e = o.inputs_begin; e < o.inputs_end; ++e) {
      b_.reads[idx(b_.read_cursor[idx(edges[e])]++)] = static_cast<OpId>(i);
    }
  }
}

// Whether reading tensor a at op x frees it (or not) as reading b at op x − shift freed b, for a
// block's own tensor made before the window [from, to) with several readers. Either
//   - the readers of each run on one queue, which ends its ops in program order: a tensor is freed
//     when its last reader in program order ends, and x is a's last exactly when x − shift is
//     b's; or
//   - a's readers in the window are b's moved by the shift and the other way round, and every
//     other reader of a has ended now and of b had ended at p: the reads left then are those of
//     one block before, moved by a block, so the last of them to end frees it in both.
bool Engine::ff_same_reads(
    TensorId a, OpId x, TensorId b, const FfSnapshot& p, OpId from, OpId to, OpId shift) {
  if (!ff_readers_known_) {
    // Learning the reads is a pass over every op. A run whose blocks read such tensors at one
    // boundary only (the first backward block reading what the last forward block and the loss
    // read too) gains a block at most: the reads are learnt at the second boundary that asks.
    if (ff_reads_first_asked_ == std::numeric_limits<std::size_t>::max() ||
        ff_reads_first_asked_ == ff_next_) {
      ff_reads_first_asked_ = ff_next_;
      return false;
    }
    ff_learn_readers();
  }
  // x reads a and x − shift reads b: each has a last reader.
  if (b_.reader_queue[idx(a)] >= 0 && b_.reader_queue[idx(b)] >= 0 &&
      (b_.last_reader[idx(a)] == x) == (b_.last_reader[idx(b)] == x - shift)) {
    return true;
  }
  if (!ff_reads_listed_) {
    ff_list_reads();
  }
  const OpId* reads = b_.reads.data();
  const OpId* a_begin = reads + b_.read_begin[idx(a)];
  const OpId* a_end = reads + b_.read_begin[idx(a) + 1];
  const OpId* b_begin = reads + b_.read_begin[idx(b)];
  const OpId* b_end = reads + b_.read_begin[idx(b) + 1];
  auto done_at_p = [this, &p](OpId op) { return ff_done_at(p, op); };
  const OpId* j = b_begin;
  for (const OpId* i = a_begin; i != a_end; ++i) {
    if (*i >= from && *i < to) {
      // The reads of b before *i − shift are outside the reference window and ended at p.
      while (j != b_end && *j < *i - shift) {
        if (*j >= from - shift || !done_at_p(*j)) {
          return false;
        }
        ++j;
      }
      if (j == b_end || *j != *i - shift) {
        return false;
      }
      ++j;
    } else if (b_.op[idx(*i)].state != OpState::kDone) {
      return false;
    }
  }
  for (; j != b_end; ++j) {
    if ((*j >= from - shift && *j < to - shift) || !done_at_p(*j)) {
      return false;
    }
  }
  return true;
}

// Whether the tensors every block reads by the same id keep a reader after k more blocks (their
// release would not repeat).
bool Engine::ff_statics_last(std::int32_t k) const {
  for (const auto& [t, reads] : ff_statics_) {
    const std::int32_t consumers = w_.tensors[idx(t)].consumers;
    const TensorState& ts = b_.tensors[idx(t)];
    const std::int64_t left = consumers == 1 ? 1 : ts.run == b_.run ? ts.consumers_left : consumers;
    if (left - std::int64_t{k} * reads <= 0) {
      return false;
    }
  }
  return true;
}

// The most blocks (up to k) that can be skipped without a rank's device memory or a node's host
// memory passing its stop limit inside them (counted from the highest of the block before, plus
// the growth per block).
std::int32_t Engine::ff_stop_limit(const FfSnapshot& p, const FfSnapshot& c, std::int32_t k) const {
  const auto per_node = static_cast<std::size_t>(std::max(1, w_.gpus_per_node));
  const std::int64_t host_factor = w_.ranks < w_.represented_ranks
                                       ? std::min<std::int64_t>(static_cast<std::int64_t>(per_node),
                                                                std::max(1, w_.represented_ranks))
                                       : 1;
  auto fits = [&](std::int32_t blocks) {
    std::vector<std::int64_t> node(c.ranks.size() / per_node + 1, 0);
    for (std::size_t r = 0; r < c.ranks.size(); ++r) {
      const std::int64_t device_growth = c.ranks[r].device_total - p.ranks[r].device_total;
      const std::int64_t host_growth = c.ranks[r].host_live - p.ranks[r].host_live;
      if (c.window_max[r].device_bytes + blocks * std::max<std::int64_t>(0, device_growth) >
          stop_above_bytes_) {
        return false;
      }
      const std::int64_t host =
          std::max(result_.memory[r].host_peak_bytes,
                   c.window_max[r].host_bytes + blocks * std::max<std::int64_t>(0, host_growth));
      node[r / per_node] += host * host_factor;
    }
    return std::all_of(node.begin(), node.end(),
                       [this](std::int64_t n) { return n <= stop_above_host_bytes_; });
  };
  while (k >= 1 && !fits(k)) {
    --k;
  }
  return k;
}

[[gnu::noinline]] void Engine::ff_at_boundary() {
  const FfBoundary at = ff_boundaries_[ff_next_++];
  ff_arm_next();
  FfSnapshot snap = ff_snapshot(at);
  for (FfWindowMax& m : ff_window_max_) {
    m = {};
  }
  FfRun& run = ff_runs_[idx(at.run)];
  const auto n = static_cast<std::int32_t>(run.marks.size());
  const std::int32_t i = at.index;
  std::int32_t k = n - 3 - i;
  const bool follows = ff_prev_.valid && ff_prev_.run == at.run && ff_prev_.index + 1 == i;
  if (follows && i >= 2 && k >= 1 && run.marks[idx(i - 1)].ops >= run.retry_from) {
    const Workload::Instance& m = run.marks[idx(i)];
    const Workload::Instance& before = run.marks[idx(i - 1)];
    const Workload::Instance d{m.ops - before.ops, m.tensors - before.tensors,
                               m.edges - before.edges, m.collectives - before.collectives, 0};
    auto window_end = [&run, i](std::int32_t blocks) { return run.marks[idx(i + blocks + 2)].ops; };
    if (ff_equivalent(ff_prev_, snap, d, before.ops)) {
      const OpId aperiodic = ff_first_aperiodic(ff_prev_, before.ops, window_end(k), before.tensors,
                                                run.marks[idx(i + k + 2)].tensors, d, m.ops,
                                                run.marks[idx(i + 1)].ops);
      for (std::size_t q = 0; q < snap.queues.size(); ++q) {
        const FfQueue& f = snap.queues[q];
        if (f.head != kNone && f.head == ff_prev_.queues[q].head) {
          const OpId watched = ff_watched(f.head, f.cursor);
          while (k >= 1 && (watched == kNone || window_end(k) > watched)) {
            --k;
          }
        }
      }
      while (k >= 1 && window_end(k) > aperiodic) {
        --k;
      }
      for (std::size_t r = 0; host_ && r < snap.hosts.size(); ++r) {
        const OpId sync = snap.hosts[r].waits_for;
        if (sync != kNone && sync == ff_prev_.hosts[r].waits_for) {
          while (k >= 1 && window_end(k) > sync) {
            --k;
          }
        }
      }
      while (k >= 1 && !ff_statics_last(k)) {
        --k;
      }
      k = ff_stop_limit(ff_prev_, snap, k);
      if (k >= 1) {
        ff_skip(ff_prev_, snap, {d, snap.now - ff_prev_.now}, k);
        const OpId passed = run.marks[idx(i + k)].ops;
        while (ff_next_ < ff_boundaries_.size() && ff_boundaries_[ff_next_].op <= passed) {
          ++ff_next_;
        }
        ff_arm_next();
        ff_prev_ = {};
        ff_op_log_.clear();
        return;
      }
      if (aperiodic <= run.marks[idx(i + 1)].ops) {
        run.retry_from = aperiodic + 1;
      }
    }
  }
  ff_prev_ = std::move(snap);
  ff_op_log_.clear();
}

// Moves the state `c` (the current one, equivalent to `p` moved by one block) on by k blocks:
// watcher links, hosts, the ops the blocks end, queue heads, activities and events, memory, busy
// totals and the clock, in that order.
void Engine::ff_skip(const FfSnapshot& p,
                     const FfSnapshot& c,
                     const FfShift& shift,
                     std::int32_t k) {
  const FfMove move{p, c, shift.delta, k, shift.period_ns * k, shift.delta.ops * k};
  ff_unlink_moved(move);
  ff_move_hosts(move);
  if (log_allocations_) {
    const std::size_t begin = result_.allocations.size();
    const std::size_t period = c.allocations - p.allocations;
    ff_log_skipped(move);
    if (result_.allocations.size() != begin + period * static_cast<std::size_t>(k)) {
      throw std::logic_error("fast-forward: a skipped block logged other allocations");
    }
    if (period > 0) {
      result_.allocation_repeats.push_back({begin, period, k});
    }
  }
  ff_end_skipped_ops(move);
  ff_move_heads(move);
  for (Activity& act : b_.activities) {
    if (act.active) {
      act.id += act.kind == ActivityKind::kCollective ? move.d.collectives * k : move.ops_shift;
      act.last_update += move.dt;
    }
  }
  for (Event& e : b_.events) {
    e.time += move.dt;
    if (e.activity < 0) {
      e.activity = fixed_rate_event(fixed_rate_op(e.activity) + move.ops_shift);
    }
  }
  ff_move_memory(move);
  events_ += (c.events - p.events) * k;
  now_ += move.dt;
  result_.fast_forwarded_blocks += k;
}

// Takes each moved waiting queue off the watcher list it is on (its head moves).
void Engine::ff_unlink_moved(const FfMove& m) {
  for (std::size_t q = 0; q < m.c.queues.size(); ++q) {
    if (!m.moved(q) || m.c.queues[q].state != OpState::kWaiting) {
      continue;
    }
    const OpId watched = ff_watched(m.c.queues[q].head, m.c.queues[q].cursor);
    if (watched == kNone) {
      continue;
    }
    std::int32_t* link = &b_.op[idx(watched)].first_watcher;
    while (*link != kNone && *link != static_cast<std::int32_t>(q)) {
      link = &b_.queues[idx(*link)].next_watcher;
    }
    if (*link == kNone) {
      throw std::logic_error("fast-forward: a waiting queue is on no watcher list");
    }
    *link = b_.queues[q].next_watcher;
  }
}

// Hosts tied to the GPU move with it: their clock, the next op and the synchronisation they wait
// for, and the issue times of the ops from the earliest head on.
void Engine::ff_move_hosts(const FfMove& m) {
  for (std::size_t r = 0; host_ && r < m.c.hosts.size(); ++r) {
    HostClock& h = b_.hosts[r];
    if (h.waits_for == m.p.hosts[r].waits_for) {
      continue;  // ahead of the GPU: its issue times are absolute
    }
    h.time += m.dt;
    h.waits_for += m.ops_shift;
    if (h.next != kNone) {
      h.next += m.ops_shift;
    }
    const OpId from = m.c.host_from[r] + m.ops_shift;
    const OpId to = h.next == kNone ? static_cast<OpId>(w_.ops.size()) : h.next;
    std::size_t i = 0;
    for (OpId x = from; x < to; ++x) {
      if (idx(w_.ops[idx(x)].rank) == r) {
        const SimTime at = m.c.issued[r][i++];
        b_.host_ops[idx(x)].issued = at == kNotIssued ? at : at + m.dt;
      }
    }
  }
}

// The allocation log of the k skipped blocks: the begins and ends of the block before (recorded
// since the last boundary), moved by 1..k blocks, each logging what begin_op and finish_op log for
// the moved op (its own tensors, read from the workload), with finish_op's count of reads. By (a)
// and (b) above, the full run makes these begins and ends in this order.
void Engine::ff_log_skipped(const FfMove& m) {
  for (std::int32_t j = 1; j <= m.k; ++j) {
    const OpId shift = m.d.ops * j;
    for (const OpId entry : ff_op_log_) {
      if (entry >= 0) {
        const OpId x = entry + shift;
        log_begin(x, w_.ops[idx(x)]);
        continue;
      }
      const OpId x = ~entry + shift;
      const Op& o = w_.ops[idx(x)];
      if (const std::int64_t workspace = rounded(o.workspace_bytes); workspace != 0) {
        log_allocation(-std::int64_t{x} - 1, workspace, o.rank, &o, false);
      }
      free_at_end(
          o, [this](TensorId t) { return ff_last_read(t); },
          [this](TensorId t) {
            if (!w_.tensors[idx(t)].on_host) {
              log_release(t);
            }
          });
    }
  }
}

// The ops the k blocks end, each as finish_op leaves it, without its frees (the memory moves by
// the growth instead): on each moved queue, those from its head to its head moved by k blocks,
// found in one pass in program order.
void Engine::ff_end_skipped_ops(const FfMove& m) {
  OpId first = std::numeric_limits<OpId>::max(), last = 0;
  for (std::size_t q = 0; q < m.c.queues.size(); ++q) {
    if (m.moved(q)) {
      first = std::min(first, m.c.queues[q].head);
      last = std::max(last, m.c.queues[q].head + m.ops_shift);
    }
  }
  for (OpId x = first; x < last; ++x) {
    const Op& o = w_.ops[idx(x)];
    const std::size_t q = queue_index(o.rank, o.stream);
    if (!m.moved(q) || x < m.c.queues[q].head || x >= m.c.queues[q].head + m.ops_shift) {
      continue;
    }
    OpRuntime& rt = b_.op[idx(x)];
    rt.state = OpState::kDone;
    rt.first_watcher = kNone;
    ++done_;
    if (log_allocations_) {
      continue;  // ff_log_skipped counted the reads, in the order of the ends
    }
    for (TensorId t : range(o.inputs_begin, o.inputs_end)) {
      (void)ff_last_read(t);
    }
  }
}

// Each moved queue's head moves k blocks on with its state, and a waiting one watches the op its
// new head waits for.
void Engine::ff_move_heads(const FfMove& m) {
  for (std::size_t q = 0; q < m.c.queues.size(); ++q) {
    if (!m.moved(q)) {
      continue;
    }
    const FfQueue& f = m.c.queues[q];
    const OpId head = f.head + m.ops_shift;
    OpRuntime& rt = b_.op[idx(head)];
    rt.state = f.state;
    rt.start = f.start + m.dt;
    Queue& queue = b_.queues[q];
    queue.head = head;
    queue.cursor = f.cursor + m.d.edges * m.k;
    if (f.state == OpState::kArrived) {
      b_.collectives[idx(w_.ops[idx(head)].collective)].arrivals = f.arrivals;
    }
  }
  for (std::size_t q = 0; q < m.c.queues.size(); ++q) {
    if (!m.moved(q) || m.c.queues[q].state != OpState::kWaiting) {
      continue;
    }
    Queue& queue = b_.queues[q];
    const OpId watched_op = ff_watched(queue.head, queue.cursor);
    if (watched_op == kNone) {
      continue;  // its issue event moved with the heap
    }
    OpRuntime& watched = b_.op[idx(watched_op)];
    if (watched.state == OpState::kDone) {
      throw std::logic_error("fast-forward: a queue would wait for an op already done");
    }
    queue.next_watcher = watched.first_watcher;
    watched.first_watcher = static_cast<std::int32_t>(q);
  }
}

// Live memory moves by k growths; the peaks of categories and of host memory reached in the
// skipped blocks (the block before's highest plus k growths) are noted now, since a stop in the
// next block may come before that block's own allocations reach them. Busy totals move too.
void Engine::ff_move_memory(const FfMove& m) {
  const FfSnapshot& p = m.p;
  const FfSnapshot& c = m.c;
  for (std::size_t r = 0; r < c.ranks.size(); ++r) {
    RankState& rs = b_.ranks[r];
    RankMemory& rm = result_.memory[r];
    for (std::size_t cat = 0; cat < kMemCategoryCount; ++cat) {
      const std::int64_t growth = c.ranks[r].live[cat] - p.ranks[r].live[cat];
      rs.live[cat] += growth * m.k;
      if (growth > 0) {
        rm.category_peak[cat] =
            std::max(rm.category_peak[cat], c.window_max[r].category_bytes[cat] + growth * m.k);
      }
    }
    rs.device_total += (c.ranks[r].device_total - p.ranks[r].device_total) * m.k;
    const std::int64_t host_growth = c.ranks[r].host_live - p.ranks[r].host_live;
    rs.host_live += host_growth * m.k;
    if (const std::int64_t host = c.window_max[r].host_bytes + host_growth * m.k;
        host_growth > 0 && host > rm.host_peak_bytes) {
      note_host_peak(static_cast<std::int32_t>(r), host - rm.host_peak_bytes);
      rm.host_peak_bytes = host;
    }
    for (std::size_t s = 0; s < kStreamCount; ++s) {
      result_.busy[r].busy_ns[s] += (c.busy[r].busy_ns[s] - p.busy[r].busy_ns[s]) * m.k;
    }
  }
}

// One pass over the ops links the stream queues and collective members (in program order) and
// resets the run-time state; dependents are not listed: a waiting head watches one dependency.
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
