#include "builder.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"

namespace cpsim::sim::detail {

Builder::Builder(Workload& w,
                 int ranks,
                 int simulated_ranks,
                 int cp_degree,
                 int ring_degree,
                 int gpus_per_node,
                 int tp_degree,
                 int ep_degree)
    : w_(w),
      ranks_(ranks),
      sim_ranks_(simulated_ranks),
      cp_(cp_degree),
      ring_(ring_degree),
      gpus_per_node_(gpus_per_node),
      tp_(tp_degree),
      ep_(std::max(1, ep_degree)) {
  w_.ranks = simulated_ranks;
  w_.represented_ranks = ranks;
  w_.gpus_per_node = gpus_per_node;
  w_.static_memory.assign(static_cast<std::size_t>(simulated_ranks), {});
}

TensorSet Builder::tensor(std::string_view name,
                          std::int64_t bytes,
                          MemCategory category,
                          bool on_host) {
  return tensor(w_.intern(name), bytes, category, on_host);
}

TensorSet Builder::tensor(std::int32_t name_id,
                          std::int64_t bytes,
                          MemCategory category,
                          bool on_host) {
  const auto base = static_cast<TensorId>(w_.tensors.size());
  for (int r = 0; r < sim_ranks_; ++r) {
    Tensor t;
    t.bytes = bytes;
    t.rank = r;
    t.category = category;
    t.on_host = on_host;
    t.name = name_id;
    w_.tensors.push_back(t);
  }
  return {base};
}

std::int32_t Builder::name_series(const std::string& key) {
  const auto [it, inserted] =
      series_index_.try_emplace(key, static_cast<std::int32_t>(series_.size()));
  if (inserted) {
    series_.emplace_back(key, std::vector<std::int32_t>{});
  }
  return it->second;
}

int Builder::group_size(Group g) const {
  switch (g) {
    case Group::kCp:
      return cp_;
    case Group::kUlysses:
      return cp_ / ring_;
    case Group::kRing:
      return ring_;
    case Group::kAll:
      return ranks_ / tp_;
    case Group::kTp:
      return tp_;
    case Group::kExpert:
      return ep_;
    case Group::kExpertData:
      return ranks_ / tp_ / ep_;
  }
  return 1;
}

std::vector<std::int32_t> Builder::members(Group g, int rank) const {
  std::vector<std::int32_t> m = all_members(g, rank);
  m.erase(std::remove_if(m.begin(), m.end(), [this](std::int32_t r) { return r >= sim_ranks_; }),
          m.end());
  return m;
}

std::vector<std::int32_t> Builder::all_members(Group g, int rank) const {
  // Without TP the layout below; with TP it is laid over the ranks of `rank`'s TP position
  // (index rank / T, rank = index · T + position).
  const int tp_pos = rank % tp_;
  std::vector<std::int32_t> m;
  if (g == Group::kTp) {
    for (int i = 0; i < tp_; ++i)
      m.push_back(rank - tp_pos + i);
    return m;
  }
  rank /= tp_;
  const int u = cp_ / ring_;
  const int cp_base = rank / cp_ * cp_;
  switch (g) {
    case Group::kCp:
      for (int i = 0; i < cp_; ++i)
        m.push_back(cp_base + i);
      break;
    case Group::kUlysses:
      for (int i = 0; i < u; ++i)
        m.push_back(rank / u * u + i);
      break;
    case Group::kRing:
      for (int i = 0; i < ring_; ++i)
        m.push_back(cp_base + (rank - cp_base) % u + i * u);
      break;
    case Group::kAll:
      for (int i = 0; i < ranks_ / tp_; ++i)
        m.push_back(i);
      break;
    case Group::kExpert:
      for (int i = 0; i < ep_; ++i)
        m.push_back(rank / ep_ * ep_ + i);
      break;
    case Group::kExpertData:
      for (int i = 0; i < ranks_ / tp_ / ep_; ++i)
        m.push_back(rank % ep_ + i * ep_);
      break;
    case Group::kTp:
      break;
  }
  for (std::int32_t& r : m) {
    r = r * tp_ + tp_pos;
  }
  return m;
}

// Positions and spans follow the layout of all_members: CP groups of C consecutive ranks, Ulysses
// groups of u consecutive ranks, ring groups of stride u inside the CP group.
int Builder::position(Group g, int rank) const {
  if (g == Group::kTp) {
    return rank % tp_;
  }
  rank /= tp_;
  const int u = cp_ / ring_;
  switch (g) {
    case Group::kCp:
      return rank % cp_;
    case Group::kUlysses:
      return rank % u;
    case Group::kRing:
      return rank % cp_ / u;
    case Group::kAll:
      return rank;
    case Group::kExpert:
      return rank % ep_;
    case Group::kExpertData:
      return rank / ep_;
    case Group::kTp:
      break;
  }
  return 0;
}

models::Span Builder::span_of(Group g) const {
  // The first and the last member of the group of rank 0 (TP: ranks 0..T−1; the others: their
  // layout over TP position 0, stride T).
  int last = tp_ - 1;
  if (g == Group::kExpertData) {
    last = tp_ * (ranks_ / tp_ - ep_);
  } else if (g != Group::kTp) {
    last = tp_ * (g == Group::kAll ? ranks_ / tp_ - 1
                                   : (group_size(g) - 1) * (g == Group::kRing ? cp_ / ring_ : 1));
  }
  return last / gpus_per_node_ == 0 ? models::Span::kIntraNode : models::Span::kInterNode;
}

const Builder::Groups& Builder::groups(Group g) {
  Groups& gs = groups_[static_cast<std::size_t>(g)];
  if (!gs.ready) {
    gs.ready = true;
    gs.span = span_of(g);
    gs.of_rank.assign(static_cast<std::size_t>(sim_ranks_), kNone);
    for (int r = 0; r < sim_ranks_; ++r) {
      if (gs.of_rank[static_cast<std::size_t>(r)] != kNone) {
        continue;
      }
      const auto index = static_cast<std::int32_t>(gs.members.size());
      gs.members.push_back(members(g, r));
      for (std::int32_t m : gs.members.back()) {
        gs.of_rank[static_cast<std::size_t>(m)] = index;
      }
      gs.ids.push_back(static_cast<std::int32_t>(w_.groups.size()));
      w_.groups.push_back(gs.members.back());
    }
  }
  return gs;
}

OpSet Builder::op(const OpSpec& spec) {
  return emit(spec, spec.kind, nullptr);
}

void Builder::throw_bad_dependency(std::int32_t name_id, OpId self, int rank, OpId dep) const {
  const std::string dep_name =
      dep >= 0 && static_cast<std::size_t>(dep) < w_.ops.size()
          ? "'" + w_.names[static_cast<std::size_t>(w_.ops[static_cast<std::size_t>(dep)].name)] +
                "'"
          : "an unknown op";
  throw std::logic_error(
      fmt::format("schedule builder: op '{}' (#{}, rank {}) depends on {} (#{}), "
                  "which is not an earlier op",
                  w_.names[static_cast<std::size_t>(name_id)], self, rank, dep_name, dep));
}

OpSet Builder::emit(const OpSpec& spec, OpKind kind, const double* time_s) {
  const auto base = static_cast<OpId>(w_.ops.size());
  const std::int32_t name_id = spec.name_id != kNone ? spec.name_id : w_.intern(spec.name);
  // A few candidate dependencies are de-duplicated by looking through those kept so far; many
  // (joins over every chunk) by marks indexed by op.
  const bool marks = spec.deps.size() + spec.inputs.size() > kDepsScanned;
  if (marks && dep_mark_.size() < w_.ops.size() + static_cast<std::size_t>(sim_ranks_)) {
    dep_mark_.resize(2 * (w_.ops.size() + static_cast<std::size_t>(sim_ranks_)), kNone);
  }
  const bool per_rank = time_s == nullptr && !spec.time_s_per_rank.empty();
  const SimTime duration =
      per_rank ? 0 : seconds_to_simtime(time_s != nullptr ? *time_s : spec.time_s);
  const auto host_calls = static_cast<std::uint16_t>(
      std::clamp<std::int64_t>(spec.host_calls, 0, std::numeric_limits<std::uint16_t>::max()));
  for (int r = 0; r < sim_ranks_; ++r) {
    Op o;
    o.rank = r;
    o.stream = spec.stream;
    o.kind = kind;
    o.phase = phase_;
    o.layer = layer_;
    o.name = name_id;
    o.duration_ns =
        per_rank ? seconds_to_simtime(spec.time_s_per_rank[static_cast<std::size_t>(r)]) : duration;
    o.transfer_bytes = spec.transfer_bytes;
    o.flops = spec.flops;
    o.workspace_bytes = spec.workspace_bytes;
    o.workspace_category = spec.workspace_category;
    o.memory_pool = spec.memory_pool;
    o.host_calls = host_calls;
    o.host_sync = spec.host_sync;
    const OpId self = base + r;
    // Dependencies: explicit ones plus the producers of inputs, de-duplicated, in that order. One
    // on an earlier op of the same rank and stream is implied by the stream's program order (the
    // op cannot reach the head of its queue before that op has ended), so it is not listed: the
    // schedule is the same, and the engine checks only dependencies that can make an op wait.
    o.deps_begin = static_cast<std::int32_t>(w_.edges.size());
    auto add_dep = [&](OpId d) {
      if (d == kNone) {
        return;
      }
      if (d < 0 || d >= self) {
        throw_bad_dependency(name_id, self, r, d);
      }
      if (const Op& dep = w_.ops[static_cast<std::size_t>(d)];
          dep.stream == spec.stream && dep.rank == r && (d < port_ops_lo_ || d >= port_ops_hi_)) {
        return;
      }
      if (marks) {
        if (dep_mark_[static_cast<std::size_t>(d)] == self) {
          return;
        }
        dep_mark_[static_cast<std::size_t>(d)] = self;
      } else if (std::find(w_.edges.begin() + o.deps_begin, w_.edges.end(), d) != w_.edges.end()) {
        return;
      }
      w_.edges.push_back(d);
    };
    for (const OpSet& d : spec.deps) {
      if (d.valid()) {
        add_dep(d.base + r);
      }
    }
    for (const TensorSet& t : spec.inputs) {
      if (t.valid()) {
        add_dep(w_.tensors[static_cast<std::size_t>(t.base + r)].producer);
      }
    }
    o.deps_end = static_cast<std::int32_t>(w_.edges.size());
    o.inputs_begin = o.deps_end;
    for (const TensorSet& t : spec.inputs) {
      if (t.valid()) {
        w_.edges.push_back(t.base + r);
        w_.tensors[static_cast<std::size_t>(t.base + r)].consumers += 1;
      }
    }
    o.inputs_end = static_cast<std::int32_t>(w_.edges.size());
    o.outputs_begin = o.inputs_end;
    for (const TensorSet& t : spec.outputs) {
      if (t.valid()) {
        Tensor& ten = w_.tensors[static_cast<std::size_t>(t.base + r)];
        if (ten.producer != kNone) {
          throw std::logic_error("tensor '" + w_.names[static_cast<std::size_t>(ten.name)] +
                                 "' produced twice");
        }
        ten.producer = self;
        w_.edges.push_back(t.base + r);
      }
    }
    o.outputs_end = static_cast<std::int32_t>(w_.edges.size());
    w_.ops.push_back(o);
  }
  return {base};
}

OpSet Builder::collective(const OpSpec& spec,
                          Group group,
                          models::Collective kind,
                          const CostModel& cost,
                          std::int64_t size_bytes,
                          std::int64_t calls) {
  const Groups& gs = groups(group);
  collective_kinds_[static_cast<std::size_t>(group)] |=
      static_cast<std::uint8_t>(1U << static_cast<unsigned>(kind));
  const CostEntry* cached = nullptr;
  for (const CostEntry& e : cost_cache_) {
    if (e.cost == &cost && e.kind == kind && e.group == group && e.size_bytes == size_bytes) {
      cached = &e;
      break;
    }
  }
  if (cached == nullptr) {
    CostEntry& e = cost_cache_[cost_cache_next_];
    cost_cache_next_ = (cost_cache_next_ + 1) % cost_cache_.size();
    e = {&cost, kind, group, size_bytes,
         cost.collective(kind, gs.span, group_size(group), size_bytes)};
    cached = &e;
  }
  CollectiveCost c = cached->value;
  c.wire_bytes *= calls;
  c.alpha_s *= static_cast<double>(calls);
  const double time_s = c.time_s();
  const OpSet set = emit(spec, OpKind::kCollective, &time_s);
  // One collective per distinct group, numbered in order of each group's lowest rank.
  const auto first = static_cast<CollectiveId>(w_.collectives.size());
  for (const std::int32_t group_id : gs.ids) {
    Collective col;
    col.kind = kind;
    col.span = gs.span;
    col.size_bytes = c.size_bytes;
    col.wire_bytes = c.wire_bytes;
    col.alpha_s = c.alpha_s;
    col.nominal_bytes_per_s = c.nominal_bytes_per_s;
    col.group = group_id;
    w_.collectives.push_back(col);
  }
  // `calls` back-to-back calls: each is issued by the host (Op::host_calls).
  const auto host_calls = static_cast<std::uint16_t>(std::clamp<std::int64_t>(
      spec.host_calls * calls, 0, std::numeric_limits<std::uint16_t>::max()));
  for (int r = 0; r < sim_ranks_; ++r) {
    w_.ops[static_cast<std::size_t>(set.base + r)].host_calls = host_calls;
    w_.ops[static_cast<std::size_t>(set.base + r)].collective =
        first + gs.of_rank[static_cast<std::size_t>(r)];
  }
  return set;
}

Mark Builder::mark() const {
  return {static_cast<std::int32_t>(w_.ops.size()), static_cast<std::int32_t>(w_.tensors.size()),
          static_cast<std::int32_t>(w_.edges.size()),
          static_cast<std::int32_t>(w_.collectives.size())};
}

void Builder::truncate(const Mark& m) {
  w_.ops.resize(static_cast<std::size_t>(m.ops));
  w_.tensors.resize(static_cast<std::size_t>(m.tensors));
  w_.edges.resize(static_cast<std::size_t>(m.edges));
  w_.collectives.resize(static_cast<std::size_t>(m.collectives));
  // Marks left by the removed ops would name ops emitted next.
  std::fill(dep_mark_.begin(), dep_mark_.end(), kNone);
}

}  // namespace cpsim::sim::detail
