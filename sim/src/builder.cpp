#include "builder.hpp"

#include <algorithm>
#include <stdexcept>

#include "cpsim/models/units.hpp"

namespace cpsim::sim::detail {

Builder::Builder(
    Workload& w, int ranks, int simulated_ranks, int cp_degree, int ring_degree, int gpus_per_node)
    : w_(w),
      ranks_(ranks),
      sim_ranks_(simulated_ranks),
      cp_(cp_degree),
      ring_(ring_degree),
      gpus_per_node_(gpus_per_node) {
  w_.ranks = simulated_ranks;
  w_.represented_ranks = ranks;
  w_.gpus_per_node = gpus_per_node;
  w_.static_memory.assign(static_cast<std::size_t>(simulated_ranks), {});
}

TensorSet Builder::tensor(const std::string& name,
                          std::int64_t bytes,
                          MemCategory category,
                          bool on_host) {
  const auto base = static_cast<TensorId>(w_.tensors.size());
  const std::int32_t name_id = w_.intern(name);
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

int Builder::group_size(Group g) const {
  switch (g) {
    case Group::kCp:
      return cp_;
    case Group::kUlysses:
      return cp_ / ring_;
    case Group::kRing:
      return ring_;
    case Group::kAll:
      return ranks_;
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
  const int u = cp_ / ring_;
  const int cp_base = rank / cp_ * cp_;
  std::vector<std::int32_t> m;
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
      for (int i = 0; i < ranks_; ++i)
        m.push_back(i);
      break;
  }
  return m;
}

int Builder::position(Group g, int rank) const {
  const std::vector<std::int32_t> m = all_members(g, rank);
  return static_cast<int>(std::find(m.begin(), m.end(), rank) - m.begin());
}

models::Span Builder::span_of(Group g) const {
  const std::vector<std::int32_t> m = all_members(g, 0);
  return m.front() / gpus_per_node_ == m.back() / gpus_per_node_ ? models::Span::kIntraNode
                                                                 : models::Span::kInterNode;
}

OpSet Builder::op(const OpSpec& spec) {
  const auto base = static_cast<OpId>(w_.ops.size());
  const std::int32_t name_id = w_.intern(spec.name);
  for (int r = 0; r < sim_ranks_; ++r) {
    const SimTime duration = seconds_to_simtime(
        spec.time_s_per_rank.empty() ? spec.time_s
                                     : spec.time_s_per_rank[static_cast<std::size_t>(r)]);
    Op o;
    o.rank = r;
    o.stream = spec.stream;
    o.kind = spec.kind;
    o.phase = phase_;
    o.layer = layer_;
    o.name = name_id;
    o.duration_ns = duration;
    o.transfer_bytes = spec.transfer_bytes;
    o.flops = spec.flops;
    o.workspace_bytes = spec.workspace_bytes;
    o.workspace_category = spec.workspace_category;
    const OpId self = base + r;
    // Dependencies: explicit ones plus the producers of inputs, de-duplicated.
    o.deps_begin = static_cast<std::int32_t>(w_.edges.size());
    auto add_dep = [&](OpId d) {
      if (d == kNone || d >= self) {
        return;
      }
      for (auto i = static_cast<std::size_t>(o.deps_begin); i < w_.edges.size(); ++i) {
        if (w_.edges[i] == d) {
          return;
        }
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
                          std::int64_t size_bytes) {
  const int n = group_size(group);
  const models::Span span = span_of(group);
  const CollectiveCost c = cost.collective(kind, span, n, size_bytes);
  OpSpec s = spec;
  s.kind = OpKind::kCollective;
  s.time_s = c.time_s();
  s.time_s_per_rank.clear();
  const OpSet set = op(s);
  // One collective per distinct group, numbered in order of each group's lowest rank.
  std::vector<CollectiveId> of_rank(static_cast<std::size_t>(sim_ranks_), kNone);
  for (int r = 0; r < sim_ranks_; ++r) {
    if (of_rank[static_cast<std::size_t>(r)] != kNone) {
      continue;
    }
    Collective col;
    col.kind = kind;
    col.span = span;
    col.size_bytes = c.size_bytes;
    col.wire_bytes = c.wire_bytes;
    col.alpha_s = c.alpha_s;
    col.nominal_bytes_per_s = c.nominal_bytes_per_s;
    col.members = members(group, r);
    const auto id = static_cast<CollectiveId>(w_.collectives.size());
    for (std::int32_t m : col.members) {
      of_rank[static_cast<std::size_t>(m)] = id;
    }
    w_.collectives.push_back(std::move(col));
  }
  for (int r = 0; r < sim_ranks_; ++r) {
    w_.ops[static_cast<std::size_t>(set.base + r)].collective =
        of_rank[static_cast<std::size_t>(r)];
  }
  return set;
}

}  // namespace cpsim::sim::detail
