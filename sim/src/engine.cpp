#include "cpsim/sim/engine.hpp"

#include <algorithm>
#include <cmath>
#include <queue>
#include <span>
#include <stdexcept>

#include <fmt/format.h>

namespace cpsim::sim {
namespace {

std::int64_t rounded(std::int64_t bytes) {
  return allocation_bytes(bytes);
}

std::size_t idx(std::int32_t i) {
  return static_cast<std::size_t>(i);
}

enum class ActivityKind : std::uint8_t { kCompute, kCopy, kCollective };

struct Activity {
  ActivityKind kind = ActivityKind::kCompute;
  bool to_device = false;
  bool active = false;
  std::int32_t id = 0;  // op id, or collective id
  std::int32_t rank = 0;
  std::uint32_t version = 0;
  double remaining = 0.0;  // ns of work (compute) or bytes (copy, collective)
  double rate = 0.0;       // work per ns
  SimTime last_update = 0;
};

struct Event {
  SimTime time;
  std::int64_t seq;
  std::int32_t activity;
  std::uint32_t version;
};
struct EventLater {
  bool operator()(const Event& a, const Event& b) const {
    return a.time != b.time ? a.time > b.time : a.seq > b.seq;
  }
};

enum class OpState : std::uint8_t { kWaiting, kArrived, kRunning, kDone };

/// Run-time state of one op.
struct OpRuntime {
  SimTime start = 0;
  std::int32_t deps_begin = 0;      // its dependencies (a copy of Op::deps_begin, for setup)
  std::int32_t pending = 0;         // dependencies not yet ended
  std::int32_t next_in_stream = 0;  // the next op of its (rank, stream) queue, or kNone
  std::int32_t next_member = 0;     // the next op of its collective, or kNone
  OpState state = OpState::kWaiting;
};

struct RankState {
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

int span_index(models::Span s) {
  return s == models::Span::kIntraNode ? 0 : 1;
}

void erase_value(std::vector<std::int32_t>& v, std::int32_t x) {
  v.erase(std::find(v.begin(), v.end(), x));
}

/// Offsets of a compressed adjacency list: row i is [begin[i], begin[i + 1]).
struct Csr {
  std::vector<std::int32_t> begin;
  std::vector<std::int32_t> items;
  std::span<const std::int32_t> row(std::size_t i) const {
    return {items.data() + begin[i], static_cast<std::size_t>(begin[i + 1] - begin[i])};
  }
};

}  // namespace

/// The buffers of one run, kept by a Simulator from run to run (their capacity is reused; every
/// run resets their contents in Engine::setup).
struct Simulator::Scratch {
  std::vector<Event> events;  // a binary heap ordered by EventLater (as std::priority_queue)
  std::vector<Activity> activities;
  std::vector<std::uint32_t> stamp;
  std::vector<OpRuntime> op;
  Csr dependents;
  std::vector<std::int32_t> head;
  std::vector<std::int32_t> first_member;
  std::vector<std::int32_t> arrivals;
  std::vector<std::int32_t> consumers_left;
  std::vector<RankState> ranks;
  std::vector<std::int32_t> queue_tail;
  std::vector<std::int32_t> member_tail;
};

namespace {

class Engine {
 public:
  Engine(const Workload& w,
         const models::HardwareProfile& p,
         const SimOptions& o,
         Simulator::Scratch& scratch)
      : w_(w),
        profile_(p),
        options_(o),
        scratch_(scratch),
        events_(std::move(scratch.events)),
        activities_(std::move(scratch.activities)),
        stamp_(std::move(scratch.stamp)),
        op_(std::move(scratch.op)),
        dependents_(std::move(scratch.dependents)),
        head_(std::move(scratch.head)),
        first_member_(std::move(scratch.first_member)),
        arrivals_(std::move(scratch.arrivals)),
        consumers_left_(std::move(scratch.consumers_left)),
        ranks_(std::move(scratch.ranks)),
        queue_tail_(std::move(scratch.queue_tail)),
        member_tail_(std::move(scratch.member_tail)) {}
  // The buffers go back to the Simulator (with their capacity) however the run ends.
  ~Engine() {
    scratch_.events = std::move(events_);
    scratch_.activities = std::move(activities_);
    scratch_.stamp = std::move(stamp_);
    scratch_.op = std::move(op_);
    scratch_.dependents = std::move(dependents_);
    scratch_.head = std::move(head_);
    scratch_.first_member = std::move(first_member_);
    scratch_.arrivals = std::move(arrivals_);
    scratch_.consumers_left = std::move(consumers_left_);
    scratch_.ranks = std::move(ranks_);
    scratch_.queue_tail = std::move(queue_tail_);
    scratch_.member_tail = std::move(member_tail_);
  }
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;
  SimResult run();

 private:
  std::span<const std::int32_t> range(std::int32_t b, std::int32_t e) const {
    return {w_.edges.data() + b, static_cast<std::size_t>(e - b)};
  }
  std::size_t queue_index(std::int32_t rank, Stream s) const {
    return idx(rank) * kStreamCount + static_cast<std::size_t>(s);
  }
  void setup();
  std::int32_t new_activity(ActivityKind kind, std::int32_t id, std::int32_t rank, double work);
  void try_start(std::int32_t rank, Stream stream);
  void begin_op(OpId op);
  void finish_op(OpId op);
  void finish_activity(std::int32_t a);
  void refresh_rank(std::int32_t rank);
  void refresh_ranks(std::span<const std::int32_t> ranks);
  void refresh(std::int32_t a);
  double rate_of(const Activity& act) const;
  void note_memory(std::int32_t rank, OpId op);
  void release(TensorId t);

  const Workload& w_;
  const models::HardwareProfile& profile_;
  const SimOptions& options_;
  // Constant over the run: per-ns link rates of the profile.
  double compute_rate_under_comm_ = 1.0;

  SimTime now_ = 0;
  std::int64_t seq_ = 0;
  Simulator::Scratch& scratch_;  // where the buffers come from and go back to
  std::vector<Event> events_;    // binary heap (std::push_heap / std::pop_heap with EventLater)
  std::vector<Activity> activities_;
  std::vector<std::uint32_t> stamp_;
  std::uint32_t stamp_now_ = 0;
  std::vector<OpRuntime> op_;
  std::size_t done_ = 0;            // ops ended
  Csr dependents_;                  // op -> ops that depend on it, in program order
  std::vector<std::int32_t> head_;  // (rank, stream) -> the op at the head of its queue, or kNone
  std::vector<std::int32_t> first_member_;  // collective -> its first op (then next_member)
  std::vector<std::int32_t> arrivals_;
  std::vector<std::int32_t> consumers_left_;
  std::vector<RankState> ranks_;
  std::vector<std::int32_t> queue_tail_;   // setup: the last op of each queue so far
  std::vector<std::int32_t> member_tail_;  // setup: the last op of each collective so far
  SimResult result_;
};

std::int32_t Engine::new_activity(ActivityKind kind,
                                  std::int32_t id,
                                  std::int32_t rank,
                                  double work) {
  Activity& a = activities_.emplace_back();
  a.kind = kind;
  a.id = id;
  a.rank = rank;
  a.active = true;
  a.remaining = std::max(0.0, work);
  a.last_update = now_;
  stamp_.push_back(0);
  return static_cast<std::int32_t>(activities_.size() - 1);
}

double Engine::rate_of(const Activity& act) const {
  const RankState& rs = ranks_[idx(act.rank)];
  switch (act.kind) {
    case ActivityKind::kCompute:
      return rs.collectives.empty() ? 1.0 : compute_rate_under_comm_;
    case ActivityKind::kCopy: {
      const auto& h = profile_.host_link;
      const int same = std::max(1, act.to_device ? rs.h2d : rs.d2h);
      double rate = (act.to_device ? h.h2d_bytes_per_s : h.d2h_bytes_per_s) * 1e-9 / same;
      if (rs.h2d > 0 && rs.d2h > 0) {
        rate = std::min(rate, h.duplex_total_bytes_per_s * 1e-9 / 2.0 / same);
      }
      return rate;
    }
    case ActivityKind::kCollective: {
      const Collective& c = w_.collectives[idx(act.id)];
      const int span = span_index(c.span);
      int worst = 1;
      for (std::int32_t m : w_.members(c)) {
        worst = std::max(worst, ranks_[idx(m)].link[static_cast<std::size_t>(span)]);
      }
      return c.nominal_bytes_per_s * 1e-9 / worst;
    }
  }
  return 1.0;
}

void Engine::refresh(std::int32_t a) {
  Activity& act = activities_[idx(a)];
  if (now_ > act.last_update) {
    act.remaining =
        std::max(0.0, act.remaining - act.rate * static_cast<double>(now_ - act.last_update));
  }
  act.last_update = now_;
  const double rate = rate_of(act);
  if (act.version != 0 && rate == act.rate) {
    return;  // same rate: the scheduled completion still holds
  }
  act.rate = rate;
  ++act.version;
  const SimTime dt = static_cast<SimTime>(std::ceil(act.remaining / rate - 1e-6));
  events_.push_back({now_ + std::max<SimTime>(0, dt), seq_++, a, act.version});
  std::push_heap(events_.begin(), events_.end(), EventLater{});
}

// One rank: its compute, copy and collective activities are distinct, so each is refreshed once
// without stamps, in the order refresh_ranks uses.
void Engine::refresh_rank(std::int32_t rank) {
  const RankState& rs = ranks_[idx(rank)];
  if (rs.compute_activity >= 0) {
    refresh(rs.compute_activity);
  }
  for (std::int32_t a : rs.copies) {
    refresh(a);
  }
  for (std::int32_t a : rs.collectives) {
    refresh(a);
  }
}

void Engine::refresh_ranks(std::span<const std::int32_t> ranks) {
  if (ranks.size() == 1) {
    refresh_rank(ranks[0]);
    return;
  }
  ++stamp_now_;
  auto touch = [this](std::int32_t a) {
    if (stamp_[idx(a)] != stamp_now_) {
      stamp_[idx(a)] = stamp_now_;
      refresh(a);
    }
  };
  for (std::int32_t r : ranks) {
    const RankState& rs = ranks_[idx(r)];
    if (rs.compute_activity >= 0) {
      touch(rs.compute_activity);
    }
    for (std::int32_t a : rs.copies) {
      touch(a);
    }
    for (std::int32_t a : rs.collectives) {
      touch(a);
    }
  }
}

void Engine::note_memory(std::int32_t rank, OpId op) {
  const RankState& rs = ranks_[idx(rank)];
  RankMemory& m = result_.memory[idx(rank)];
  if (rs.device_total > m.peak_bytes) {
    m.peak_bytes = rs.device_total;
    m.peak_time_ns = now_;
    m.peak_op = op;
    m.breakdown_at_peak = rs.live;
  }
  m.host_peak_bytes = std::max(m.host_peak_bytes, rs.host_live);
  if (options_.record_trace) {
    result_.memory_samples.push_back({rank, now_, rs.live});
  }
}

// Device bytes grow only here, each growth followed by note_memory: the peak of a category is
// reached right after one of its own allocations, so only the categories allocated are compared.
void Engine::begin_op(OpId op) {
  const Op& o = w_.ops[idx(op)];
  OpRuntime& rt = op_[idx(op)];
  rt.state = OpState::kRunning;
  rt.start = now_;

  RankState& rs = ranks_[idx(o.rank)];
  RankMemory& m = result_.memory[idx(o.rank)];
  auto allocate = [&rs, &m](MemCategory category, std::int64_t bytes) {
    const auto c = static_cast<std::size_t>(category);
    rs.live[c] += bytes;
    rs.device_total += bytes;
    m.category_peak[c] = std::max(m.category_peak[c], rs.live[c]);
  };
  for (TensorId t : range(o.outputs_begin, o.outputs_end)) {
    const Tensor& ten = w_.tensors[idx(t)];
    if (ten.on_host) {
      rs.host_live += ten.bytes;
    } else {
      allocate(ten.category, rounded(ten.bytes));
    }
  }
  allocate(o.workspace_category, rounded(o.workspace_bytes));
  note_memory(o.rank, op);
}

void Engine::try_start(std::int32_t rank, Stream stream) {
  const OpId op = head_[queue_index(rank, stream)];
  if (op == kNone) {
    return;
  }
  OpRuntime& rt = op_[idx(op)];
  if (rt.state != OpState::kWaiting || rt.pending > 0) {
    return;
  }
  const Op& o = w_.ops[idx(op)];
  if (o.collective != kNone) {
    rt.state = OpState::kArrived;
    const Collective& c = w_.collectives[idx(o.collective)];
    if (++arrivals_[idx(o.collective)] < static_cast<std::int32_t>(w_.members(c).size())) {
      return;
    }
    const double work = static_cast<double>(c.wire_bytes) + c.alpha_s * c.nominal_bytes_per_s;
    const std::int32_t a = new_activity(ActivityKind::kCollective, o.collective, o.rank, work);
    const auto span = static_cast<std::size_t>(span_index(c.span));
    for (std::int32_t m : w_.members(c)) {
      ranks_[idx(m)].link[span] += 1;
      ranks_[idx(m)].collectives.push_back(a);
    }
    for (OpId m = first_member_[idx(o.collective)]; m != kNone; m = op_[idx(m)].next_member) {
      begin_op(m);
    }
    refresh_ranks(w_.members(c));
    return;
  }
  begin_op(op);
  RankState& rs = ranks_[idx(rank)];
  if (o.kind == OpKind::kCopyD2H || o.kind == OpKind::kCopyH2D) {
    const bool to_device = o.kind == OpKind::kCopyH2D;
    const auto& h = profile_.host_link;
    const double bw = to_device ? h.h2d_bytes_per_s : h.d2h_bytes_per_s;
    const std::int32_t a = new_activity(ActivityKind::kCopy, op, rank,
                                        static_cast<double>(o.transfer_bytes) + h.alpha_s * bw);
    activities_[idx(a)].to_device = to_device;
    (to_device ? rs.h2d : rs.d2h) += 1;
    rs.copies.push_back(a);
    refresh_rank(rank);
  } else {
    if (rs.compute_activity >= 0) {
      throw std::logic_error("two compute activities on one rank");
    }
    rs.compute_activity =
        new_activity(ActivityKind::kCompute, op, rank, static_cast<double>(o.duration_ns));
    refresh_rank(rank);
  }
}

void Engine::release(TensorId t) {
  const Tensor& ten = w_.tensors[idx(t)];
  RankState& owner = ranks_[idx(ten.rank)];
  if (ten.on_host) {
    owner.host_live -= ten.bytes;
  } else {
    const std::int64_t bytes = rounded(ten.bytes);
    owner.live[static_cast<std::size_t>(ten.category)] -= bytes;
    owner.device_total -= bytes;
  }
}

void Engine::finish_op(OpId op) {
  const Op& o = w_.ops[idx(op)];
  OpRuntime& rt = op_[idx(op)];
  rt.state = OpState::kDone;
  ++done_;
  RankState& rs = ranks_[idx(o.rank)];
  result_.busy[idx(o.rank)].busy_ns[static_cast<std::size_t>(o.stream)] += now_ - rt.start;
  if (options_.record_trace) {
    result_.intervals.push_back({op, rt.start, now_});
  }
  const std::int64_t workspace = rounded(o.workspace_bytes);
  rs.live[static_cast<std::size_t>(o.workspace_category)] -= workspace;
  rs.device_total -= workspace;
  for (TensorId t : range(o.inputs_begin, o.inputs_end)) {
    if (--consumers_left_[idx(t)] == 0) {
      release(t);
    }
  }
  for (TensorId t : range(o.outputs_begin, o.outputs_end)) {
    if (w_.tensors[idx(t)].consumers == 0) {
      release(t);
    }
  }
  if (options_.record_trace) {
    result_.memory_samples.push_back({o.rank, now_, rs.live});
  }
  for (OpId d : dependents_.row(idx(op))) {
    if (--op_[idx(d)].pending == 0) {
      const Op& od = w_.ops[idx(d)];
      if (head_[queue_index(od.rank, od.stream)] == d) {
        try_start(od.rank, od.stream);
      }
    }
  }
  head_[queue_index(o.rank, o.stream)] = rt.next_in_stream;
  try_start(o.rank, o.stream);
}

void Engine::finish_activity(std::int32_t a) {
  Activity& act = activities_[idx(a)];
  act.active = false;
  if (act.kind == ActivityKind::kCollective) {
    const Collective& c = w_.collectives[idx(act.id)];
    const auto span = static_cast<std::size_t>(span_index(c.span));
    for (std::int32_t m : w_.members(c)) {
      ranks_[idx(m)].link[span] -= 1;
      erase_value(ranks_[idx(m)].collectives, a);
    }
    refresh_ranks(w_.members(c));
    for (OpId m = first_member_[idx(act.id)]; m != kNone;) {
      const OpId next = op_[idx(m)].next_member;
      finish_op(m);
      m = next;
    }
    return;
  }
  RankState& rs = ranks_[idx(act.rank)];
  const std::int32_t rank = act.rank;
  const OpId op = act.id;
  if (act.kind == ActivityKind::kCopy) {
    (act.to_device ? rs.h2d : rs.d2h) -= 1;
    erase_value(rs.copies, a);
    refresh_rank(rank);
  } else {
    rs.compute_activity = -1;
    refresh_rank(rank);
  }
  finish_op(op);
}

// Reverse dependencies as a compressed list (rows counted, offsets summed, rows filled with the
// offsets as cursors, offsets restored); stream queues and collective members as linked lists. All
// in program order.
void Engine::setup() {
  const std::size_t n_ops = w_.ops.size();
  const auto n_ranks = static_cast<std::size_t>(w_.ranks);
  const std::size_t n_queues = n_ranks * kStreamCount;
  const std::size_t n_coll = w_.collectives.size();
  events_.clear();
  activities_.clear();
  stamp_.clear();
  op_.assign(n_ops, {});
  arrivals_.assign(n_coll, 0);
  ranks_.assign(n_ranks, {});
  result_.memory.assign(n_ranks, {});
  result_.busy.assign(n_ranks, {});
  activities_.reserve(n_ops + n_coll);
  stamp_.reserve(n_ops + n_coll);

  dependents_.begin.assign(n_ops + 1, 0);
  head_.assign(n_queues, kNone);
  first_member_.assign(n_coll, kNone);
  std::vector<std::int32_t>& queue_tail = queue_tail_;
  std::vector<std::int32_t>& member_tail = member_tail_;
  queue_tail.assign(n_queues, kNone);
  member_tail.assign(n_coll, kNone);
  const std::int32_t* edges = w_.edges.data();
  for (std::size_t i = 0; i < n_ops; ++i) {
    const Op& o = w_.ops[i];
    const auto self = static_cast<OpId>(i);
    OpRuntime& rt = op_[i];
    for (std::int32_t e = o.deps_begin; e < o.deps_end; ++e) {
      dependents_.begin[idx(edges[e]) + 1] += 1;
    }
    rt.deps_begin = o.deps_begin;
    rt.pending = o.deps_end - o.deps_begin;
    rt.next_in_stream = kNone;
    rt.next_member = kNone;
    const std::size_t q = queue_index(o.rank, o.stream);
    (queue_tail[q] == kNone ? head_[q] : op_[idx(queue_tail[q])].next_in_stream) = self;
    queue_tail[q] = self;
    if (o.collective != kNone) {
      const auto c = idx(o.collective);
      (member_tail[c] == kNone ? first_member_[c] : op_[idx(member_tail[c])].next_member) = self;
      member_tail[c] = self;
    }
  }
  std::vector<std::int32_t>& begin = dependents_.begin;
  for (std::size_t i = 1; i <= n_ops; ++i) {
    begin[i] += begin[i - 1];
  }
  dependents_.items.resize(idx(begin[n_ops]));
  for (std::size_t i = 0; i < n_ops; ++i) {
    const OpRuntime& rt = op_[i];
    for (std::int32_t e = rt.deps_begin; e < rt.deps_begin + rt.pending; ++e) {
      dependents_.items[idx(begin[idx(edges[e])]++)] = static_cast<OpId>(i);
    }
  }
  for (std::size_t i = n_ops; i > 0; --i) {
    begin[i] = begin[i - 1];
  }
  begin[0] = 0;
  consumers_left_.resize(w_.tensors.size());
  for (std::size_t t = 0; t < w_.tensors.size(); ++t) {
    consumers_left_[t] = w_.tensors[t].consumers;
  }
  for (std::size_t r = 0; r < n_ranks; ++r) {
    const StaticMemory& sm = w_.static_memory[r];
    ranks_[r].device_total = sm.model_states_bytes + sm.fixed_overhead_bytes;
    result_.memory[r].fixed_overhead_bytes = sm.fixed_overhead_bytes;
    result_.memory[r].peak_bytes = ranks_[r].device_total;
    result_.memory[r].breakdown_at_peak[static_cast<std::size_t>(MemCategory::kModelStates)] = 0;
  }
  compute_rate_under_comm_ = 1.0 / (1.0 + profile_.compute_slowdown_under_comm);
}

SimResult Engine::run() {
  setup();
  for (std::int32_t r = 0; r < w_.ranks; ++r) {
    for (int s = 0; s < kStreamCount; ++s) {
      try_start(r, static_cast<Stream>(s));
    }
  }
  std::int64_t events = 0;
  while (!events_.empty()) {
    std::pop_heap(events_.begin(), events_.end(), EventLater{});
    const Event e = events_.back();
    events_.pop_back();
    ++events;
    const Activity& act = activities_[idx(e.activity)];
    if (!act.active || act.version != e.version) {
      continue;  // superseded by a rate change
    }
    now_ = e.time;
    finish_activity(e.activity);
  }
  result_.events = events;
  result_.step_time_ns = now_;

  const std::size_t n_ops = w_.ops.size();
  for (std::size_t i = 0; done_ < n_ops && i < n_ops; ++i) {
    if (op_[i].state != OpState::kDone) {
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
