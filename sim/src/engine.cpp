#include "cpsim/sim/engine.hpp"

#include <algorithm>
#include <cmath>
#include <queue>
#include <span>
#include <stdexcept>

#include <fmt/format.h>

namespace cpsim::sim {
namespace {

constexpr std::int64_t kAllocRounding = 512;  // PyTorch caching allocator kMinBlockSize

std::int64_t rounded(std::int64_t bytes) {
  return (bytes + kAllocRounding - 1) / kAllocRounding * kAllocRounding;
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

struct RankState {
  std::int32_t compute_activity = -1;
  std::vector<std::int32_t> copies;       // running copy activities
  std::vector<std::int32_t> collectives;  // running collective activities
  std::int32_t h2d = 0;
  std::int32_t d2h = 0;
  std::array<std::int32_t, 2> link{};  // running collectives per span (intra, inter)
  std::array<std::int64_t, kMemCategoryCount> live{};
  std::int64_t static_bytes = 0;
  std::int64_t host_live = 0;
};

int span_index(models::Span s) {
  return s == models::Span::kIntraNode ? 0 : 1;
}

void erase_value(std::vector<std::int32_t>& v, std::int32_t x) {
  v.erase(std::find(v.begin(), v.end(), x));
}

class Engine {
 public:
  Engine(const Workload& w, const models::HardwareProfile& p, const SimOptions& o)
      : w_(w), profile_(p), options_(o) {}
  SimResult run();

 private:
  std::span<const std::int32_t> range(std::int32_t b, std::int32_t e) const {
    return {w_.edges.data() + b, static_cast<std::size_t>(e - b)};
  }
  std::size_t queue_index(std::int32_t rank, Stream s) const {
    return idx(rank) * kStreamCount + static_cast<std::size_t>(s);
  }
  std::int32_t new_activity(ActivityKind kind, std::int32_t id, std::int32_t rank, double work);
  void try_start(std::int32_t rank, Stream stream);
  void begin_op(OpId op);
  void finish_op(OpId op);
  void finish_activity(std::int32_t a);
  void refresh_ranks(std::span<const std::int32_t> ranks);
  void refresh(std::int32_t a);
  double rate_of(const Activity& act) const;
  void note_memory(std::int32_t rank, OpId op);

  const Workload& w_;
  const models::HardwareProfile& profile_;
  const SimOptions& options_;

  SimTime now_ = 0;
  std::int64_t seq_ = 0;
  std::priority_queue<Event, std::vector<Event>, EventLater> events_;
  std::vector<Activity> activities_;
  std::vector<std::uint32_t> stamp_;
  std::uint32_t stamp_now_ = 0;
  std::vector<OpState> state_;
  std::vector<std::int32_t> pending_;
  std::vector<std::int32_t> dependents_begin_;
  std::vector<OpId> dependents_;
  std::vector<std::vector<OpId>> queues_;
  std::vector<std::size_t> cursor_;
  std::vector<std::int32_t> arrivals_;
  std::vector<std::vector<OpId>> collective_ops_;
  std::vector<std::int32_t> consumers_left_;
  std::vector<SimTime> op_start_;
  std::vector<RankState> ranks_;
  SimResult result_;
};

std::int32_t Engine::new_activity(ActivityKind kind,
                                  std::int32_t id,
                                  std::int32_t rank,
                                  double work) {
  Activity a;
  a.kind = kind;
  a.id = id;
  a.rank = rank;
  a.active = true;
  a.remaining = std::max(0.0, work);
  a.last_update = now_;
  activities_.push_back(a);
  stamp_.push_back(0);
  return static_cast<std::int32_t>(activities_.size() - 1);
}

double Engine::rate_of(const Activity& act) const {
  const RankState& rs = ranks_[idx(act.rank)];
  switch (act.kind) {
    case ActivityKind::kCompute:
      return rs.collectives.empty() ? 1.0 : 1.0 / (1.0 + profile_.compute_slowdown_under_comm);
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
      for (std::int32_t m : c.members) {
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
  events_.push({now_ + std::max<SimTime>(0, dt), seq_++, a, act.version});
}

void Engine::refresh_ranks(std::span<const std::int32_t> ranks) {
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
  std::int64_t total = rs.static_bytes;
  for (std::size_t c = 0; c < kMemCategoryCount; ++c) {
    total += rs.live[c];
    m.category_peak[c] = std::max(m.category_peak[c], rs.live[c]);
  }
  if (total > m.peak_bytes) {
    m.peak_bytes = total;
    m.peak_time_ns = now_;
    m.peak_op = op;
    m.breakdown_at_peak = rs.live;
  }
  m.host_peak_bytes = std::max(m.host_peak_bytes, rs.host_live);
  if (options_.record_trace) {
    result_.memory_samples.push_back({rank, now_, rs.live});
  }
}

void Engine::begin_op(OpId op) {
  const Op& o = w_.ops[idx(op)];
  state_[idx(op)] = OpState::kRunning;
  op_start_[idx(op)] = now_;
  RankState& rs = ranks_[idx(o.rank)];
  for (TensorId t : range(o.outputs_begin, o.outputs_end)) {
    const Tensor& ten = w_.tensors[idx(t)];
    if (ten.on_host) {
      rs.host_live += ten.bytes;
    } else {
      rs.live[static_cast<std::size_t>(ten.category)] += rounded(ten.bytes);
    }
  }
  rs.live[static_cast<std::size_t>(o.workspace_category)] += rounded(o.workspace_bytes);
  note_memory(o.rank, op);
}

void Engine::try_start(std::int32_t rank, Stream stream) {
  const std::size_t q = queue_index(rank, stream);
  if (cursor_[q] >= queues_[q].size()) {
    return;
  }
  const OpId op = queues_[q][cursor_[q]];
  if (state_[idx(op)] != OpState::kWaiting || pending_[idx(op)] > 0) {
    return;
  }
  const Op& o = w_.ops[idx(op)];
  if (o.collective != kNone) {
    state_[idx(op)] = OpState::kArrived;
    const Collective& c = w_.collectives[idx(o.collective)];
    if (++arrivals_[idx(o.collective)] < static_cast<std::int32_t>(c.members.size())) {
      return;
    }
    const double work = static_cast<double>(c.wire_bytes) + c.alpha_s * c.nominal_bytes_per_s;
    const std::int32_t a = new_activity(ActivityKind::kCollective, o.collective, o.rank, work);
    const auto span = static_cast<std::size_t>(span_index(c.span));
    for (std::int32_t m : c.members) {
      ranks_[idx(m)].link[span] += 1;
      ranks_[idx(m)].collectives.push_back(a);
    }
    for (OpId member_op : collective_ops_[idx(o.collective)]) {
      begin_op(member_op);
    }
    refresh_ranks(c.members);
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
  } else {
    if (rs.compute_activity >= 0) {
      throw std::logic_error("two compute activities on one rank");
    }
    rs.compute_activity =
        new_activity(ActivityKind::kCompute, op, rank, static_cast<double>(o.duration_ns));
  }
  const std::int32_t one[1] = {rank};
  refresh_ranks(one);
}

void Engine::finish_op(OpId op) {
  const Op& o = w_.ops[idx(op)];
  state_[idx(op)] = OpState::kDone;
  RankState& rs = ranks_[idx(o.rank)];
  result_.busy[idx(o.rank)].busy_ns[static_cast<std::size_t>(o.stream)] +=
      now_ - op_start_[idx(op)];
  if (options_.record_trace) {
    result_.intervals.push_back({op, op_start_[idx(op)], now_});
  }
  rs.live[static_cast<std::size_t>(o.workspace_category)] -= rounded(o.workspace_bytes);
  auto release = [&rs, this](TensorId t) {
    const Tensor& ten = w_.tensors[idx(t)];
    RankState& owner = ranks_[idx(ten.rank)];
    if (ten.on_host) {
      owner.host_live -= ten.bytes;
    } else {
      owner.live[static_cast<std::size_t>(ten.category)] -= rounded(ten.bytes);
    }
    (void)rs;
  };
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
  for (std::int32_t i = dependents_begin_[idx(op)]; i < dependents_begin_[idx(op) + 1]; ++i) {
    const OpId d = dependents_[idx(i)];
    if (--pending_[idx(d)] == 0) {
      try_start(w_.ops[idx(d)].rank, w_.ops[idx(d)].stream);
    }
  }
  cursor_[queue_index(o.rank, o.stream)] += 1;
  try_start(o.rank, o.stream);
}

void Engine::finish_activity(std::int32_t a) {
  Activity& act = activities_[idx(a)];
  act.active = false;
  if (act.kind == ActivityKind::kCollective) {
    const Collective& c = w_.collectives[idx(act.id)];
    const auto span = static_cast<std::size_t>(span_index(c.span));
    for (std::int32_t m : c.members) {
      ranks_[idx(m)].link[span] -= 1;
      erase_value(ranks_[idx(m)].collectives, a);
    }
    refresh_ranks(c.members);
    for (OpId op : collective_ops_[idx(act.id)]) {
      finish_op(op);
    }
    return;
  }
  RankState& rs = ranks_[idx(act.rank)];
  if (act.kind == ActivityKind::kCopy) {
    (act.to_device ? rs.h2d : rs.d2h) -= 1;
    erase_value(rs.copies, a);
  } else {
    rs.compute_activity = -1;
  }
  const std::int32_t one[1] = {act.rank};
  refresh_ranks(one);
  finish_op(act.id);
}

SimResult Engine::run() {
  const std::size_t n_ops = w_.ops.size();
  const auto n_ranks = static_cast<std::size_t>(w_.ranks);
  state_.assign(n_ops, OpState::kWaiting);
  pending_.assign(n_ops, 0);
  op_start_.assign(n_ops, 0);
  queues_.assign(n_ranks * kStreamCount, {});
  cursor_.assign(n_ranks * kStreamCount, 0);
  arrivals_.assign(w_.collectives.size(), 0);
  collective_ops_.assign(w_.collectives.size(), {});
  consumers_left_.resize(w_.tensors.size());
  ranks_.assign(n_ranks, {});
  result_.memory.assign(n_ranks, {});
  result_.busy.assign(n_ranks, {});

  // Reverse dependency lists (CSR) and stream queues, in program order.
  dependents_begin_.assign(n_ops + 1, 0);
  for (std::size_t i = 0; i < n_ops; ++i) {
    const Op& o = w_.ops[i];
    for (OpId d : range(o.deps_begin, o.deps_end)) {
      dependents_begin_[idx(d) + 1] += 1;
    }
    pending_[i] = o.deps_end - o.deps_begin;
    queues_[queue_index(o.rank, o.stream)].push_back(static_cast<OpId>(i));
    if (o.collective != kNone) {
      collective_ops_[idx(o.collective)].push_back(static_cast<OpId>(i));
    }
  }
  for (std::size_t i = 0; i < n_ops; ++i) {
    dependents_begin_[i + 1] += dependents_begin_[i];
  }
  dependents_.resize(idx(dependents_begin_[n_ops]));
  std::vector<std::int32_t> fill(dependents_begin_.begin(), dependents_begin_.end() - 1);
  for (std::size_t i = 0; i < n_ops; ++i) {
    const Op& o = w_.ops[i];
    for (OpId d : range(o.deps_begin, o.deps_end)) {
      dependents_[idx(fill[idx(d)]++)] = static_cast<OpId>(i);
    }
  }
  for (std::size_t t = 0; t < w_.tensors.size(); ++t) {
    consumers_left_[t] = w_.tensors[t].consumers;
  }
  for (std::size_t r = 0; r < n_ranks; ++r) {
    const StaticMemory& sm = w_.static_memory[r];
    ranks_[r].static_bytes = sm.model_states_bytes + sm.fixed_overhead_bytes;
    result_.memory[r].fixed_overhead_bytes = sm.fixed_overhead_bytes;
    result_.memory[r].peak_bytes = ranks_[r].static_bytes;
    result_.memory[r].breakdown_at_peak[static_cast<std::size_t>(MemCategory::kModelStates)] = 0;
  }

  for (std::int32_t r = 0; r < w_.ranks; ++r) {
    for (int s = 0; s < kStreamCount; ++s) {
      try_start(r, static_cast<Stream>(s));
    }
  }
  std::int64_t events = 0;
  while (!events_.empty()) {
    const Event e = events_.top();
    events_.pop();
    ++events;
    Activity& act = activities_[idx(e.activity)];
    if (!act.active || act.version != e.version) {
      continue;  // superseded by a rate change
    }
    now_ = e.time;
    finish_activity(e.activity);
  }
  result_.events = events;
  result_.step_time_ns = now_;

  for (std::size_t i = 0; i < n_ops; ++i) {
    if (state_[i] != OpState::kDone) {
      throw std::logic_error(fmt::format("simulation stalled: op {} '{}' on rank {} never ran", i,
                                         w_.names[idx(w_.ops[i].name)], w_.ops[i].rank));
    }
  }
  // Model states are static memory: report them in the breakdown at the peak.
  for (std::size_t r = 0; r < n_ranks; ++r) {
    result_.memory[r].breakdown_at_peak[static_cast<std::size_t>(MemCategory::kModelStates)] +=
        w_.static_memory[r].model_states_bytes;
    result_.memory[r].category_peak[static_cast<std::size_t>(MemCategory::kModelStates)] +=
        w_.static_memory[r].model_states_bytes;
  }
  return std::move(result_);
}

}  // namespace

SimResult simulate(const Workload& workload,
                   const models::HardwareProfile& profile,
                   const SimOptions& options) {
  Engine engine(workload, profile, options);
  return engine.run();
}

}  // namespace cpsim::sim
