#include "builder.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <type_traits>

#include <fmt/format.h>

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

// Positions and spans follow the layout of all_members: CP groups of C consecutive ranks, Ulysses
// groups of u consecutive ranks, ring groups of stride u inside the CP group.
int Builder::position(Group g, int rank) const {
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
  }
  return 0;
}

models::Span Builder::span_of(Group g) const {
  // The first and the last member of the group of rank 0.
  const int last =
      g == Group::kAll ? ranks_ - 1 : (group_size(g) - 1) * (g == Group::kRing ? cp_ / ring_ : 1);
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
          dep.stream == spec.stream && dep.rank == r) {
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
  for (int r = 0; r < sim_ranks_; ++r) {
    w_.ops[static_cast<std::size_t>(set.base + r)].collective =
        first + gs.of_rank[static_cast<std::size_t>(r)];
  }
  return set;
}

// ---- repeated segments --------------------------------------------------------------------
//
// Transformer blocks are built alike: the ops of block l + 1 are those of block l with every id
// inside the blocks moved by one block's worth. A builder that has built two blocks and checked
// (repeats) that the second is the first mapped can append the next ones by copying (repeat),
// which is what emitting them again would append. Only names with the block's number differ.

namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

/// The number that distinguishes `a` from `b` as (prefix, suffix, b − a), or step 0 when they
/// differ otherwise.
NameStep numbered(std::string_view a, std::string_view b) {
  NameStep n;
  std::size_t p = 0;
  while (p < a.size() && p < b.size() && a[p] == b[p]) {
    ++p;
  }
  while (p > 0 && is_digit(a[p - 1])) {
    --p;  // the number starts at its first digit
  }
  std::size_t q = 0;
  while (q < a.size() - p && q < b.size() - p && a[a.size() - 1 - q] == b[b.size() - 1 - q]) {
    ++q;
  }
  while (q > 0 && is_digit(a[a.size() - q])) {
    --q;  // and ends at its last
  }
  const std::string_view na = a.substr(p, a.size() - p - q);
  const std::string_view nb = b.substr(p, b.size() - p - q);
  auto plain = [](std::string_view x) {
    return !x.empty() && x.size() < 9 && (x.size() == 1 || x[0] != '0') &&
           std::all_of(x.begin(), x.end(), is_digit);
  };
  if (!plain(na) || !plain(nb)) {
    return n;
  }
  const int step = std::stoi(std::string(nb)) - std::stoi(std::string(na));
  if (step == 1 || step == -1) {
    n.prefix = static_cast<std::int32_t>(p);
    n.suffix = static_cast<std::int32_t>(q);
    n.step = step;
  }
  return n;
}

}  // namespace

Mark Builder::mark() const {
  return {static_cast<std::int32_t>(w_.ops.size()), static_cast<std::int32_t>(w_.tensors.size()),
          static_cast<std::int32_t>(w_.edges.size()),
          static_cast<std::int32_t>(w_.collectives.size())};
}

bool Builder::repeats(const Mark& a0,
                      const Mark& a1,
                      const Mark& b0,
                      const Mark& b1,
                      const IdMap& map,
                      std::int32_t layer_step,
                      std::vector<NameStep>& names) const {
  if (a1.ops - a0.ops != b1.ops - b0.ops || a1.tensors - a0.tensors != b1.tensors - b0.tensors ||
      a1.edges - a0.edges != b1.edges - b0.edges ||
      a1.collectives - a0.collectives != b1.collectives - b0.collectives) {
    return false;
  }
  const std::int32_t d_edges = b0.edges - a0.edges;
  const std::int32_t d_coll = b0.collectives - a0.collectives;
  auto same_name = [&](bool tensor, std::int32_t index, std::int32_t x, std::int32_t y) {
    if (x == y) {
      return true;
    }
    NameStep n =
        numbered(w_.names[static_cast<std::size_t>(x)], w_.names[static_cast<std::size_t>(y)]);
    if (n.step == 0) {
      return false;
    }
    n.tensor = tensor;
    n.index = index;
    names.push_back(n);
    return true;
  };
  names.clear();
  for (std::int32_t i = 0; i < a1.ops - a0.ops; ++i) {
    const Op& a = w_.ops[static_cast<std::size_t>(a0.ops + i)];
    const Op& b = w_.ops[static_cast<std::size_t>(b0.ops + i)];
    const bool in_segment = a.collective >= a0.collectives && a.collective < a1.collectives;
    if (a.rank != b.rank || a.stream != b.stream || a.kind != b.kind || a.phase != b.phase ||
        (a.layer < 0 ? b.layer != a.layer : b.layer != a.layer + layer_step) ||
        a.duration_ns != b.duration_ns || a.transfer_bytes != b.transfer_bytes ||
        a.flops != b.flops || a.workspace_bytes != b.workspace_bytes ||
        a.workspace_category != b.workspace_category ||
        b.collective != (in_segment ? a.collective + d_coll : a.collective) ||
        b.deps_begin != a.deps_begin + d_edges || b.deps_end != a.deps_end + d_edges ||
        b.inputs_begin != a.inputs_begin + d_edges || b.inputs_end != a.inputs_end + d_edges ||
        b.outputs_begin != a.outputs_begin + d_edges || b.outputs_end != a.outputs_end + d_edges ||
        !same_name(false, i, a.name, b.name)) {
      return false;
    }
    for (std::int32_t e = a.deps_begin; e < a.deps_end; ++e) {
      if (map.op(w_.edges[static_cast<std::size_t>(e)]) !=
          w_.edges[static_cast<std::size_t>(e + d_edges)]) {
        return false;
      }
    }
    for (std::int32_t e = a.inputs_begin; e < a.outputs_end; ++e) {
      if (map.tensor(w_.edges[static_cast<std::size_t>(e)]) !=
          w_.edges[static_cast<std::size_t>(e + d_edges)]) {
        return false;
      }
    }
  }
  for (std::int32_t i = 0; i < a1.tensors - a0.tensors; ++i) {
    const Tensor& a = w_.tensors[static_cast<std::size_t>(a0.tensors + i)];
    const Tensor& b = w_.tensors[static_cast<std::size_t>(b0.tensors + i)];
    if (a.bytes != b.bytes || a.rank != b.rank || a.category != b.category ||
        a.on_host != b.on_host || map.op(a.producer) != b.producer ||
        !same_name(true, i, a.name, b.name)) {
      return false;
    }
  }
  for (std::int32_t i = 0; i < a1.collectives - a0.collectives; ++i) {
    const Collective& a = w_.collectives[static_cast<std::size_t>(a0.collectives + i)];
    const Collective& b = w_.collectives[static_cast<std::size_t>(b0.collectives + i)];
    if (a.kind != b.kind || a.span != b.span || a.group != b.group ||
        a.size_bytes != b.size_bytes || a.wire_bytes != b.wire_bytes || a.alpha_s != b.alpha_s ||
        a.nominal_bytes_per_s != b.nominal_bytes_per_s) {
      return false;
    }
  }
  return true;
}

void Builder::repeat(const Mark& a0,
                     const Mark& a1,
                     const IdMap& map,
                     std::int32_t layer_step,
                     const std::vector<NameStep>& names) {
  const Mark b0 = mark();
  const std::int32_t d_edges = b0.edges - a0.edges;
  const std::int32_t d_coll = b0.collectives - a0.collectives;
  w_.repeated_blocks += 1;
  // Room for the copy (reading the template while appending), growing geometrically.
  auto make_room = [](auto& v, std::int32_t more) {
    const std::size_t need = v.size() + static_cast<std::size_t>(more);
    if (need > v.capacity()) {
      v.reserve(std::max(need, 2 * v.capacity()));
    }
  };
  make_room(w_.ops, a1.ops - a0.ops);
  make_room(w_.tensors, a1.tensors - a0.tensors);
  make_room(w_.edges, a1.edges - a0.edges);
  make_room(w_.collectives, a1.collectives - a0.collectives);
  for (std::int32_t i = a0.collectives; i < a1.collectives; ++i) {
    const Collective c = w_.collectives[static_cast<std::size_t>(i)];
    w_.collectives.push_back(c);
  }
  // Tensors first (an op's outputs may be tensors of its own segment), as Builder::tensor makes
  // them: no producer and no consumer yet.
  for (std::int32_t i = a0.tensors; i < a1.tensors; ++i) {
    Tensor t = w_.tensors[static_cast<std::size_t>(i)];
    t.producer = kNone;
    t.consumers = 0;
    w_.tensors.push_back(t);
  }
  // The segment's edges follow its ops in order (each op's deps, inputs, outputs), so the copy's
  // edges are the template's, mapped, at a distance of d_edges.
  w_.edges.resize(static_cast<std::size_t>(b0.edges + (a1.edges - a0.edges)));
  const auto o0 = static_cast<std::size_t>(b0.ops);
  const auto n_ops = static_cast<std::size_t>(a1.ops - a0.ops);
  w_.ops.resize(o0 + n_ops);
  static_assert(std::is_trivially_copyable_v<Op>);
  Op* const copy = w_.ops.data() + o0;
  std::memcpy(copy, w_.ops.data() + a0.ops, n_ops * sizeof(Op));
  std::int32_t* edges = w_.edges.data();
  Tensor* tensors = w_.tensors.data();
  const auto n_coll = static_cast<std::uint32_t>(a1.collectives - a0.collectives);
  for (std::size_t i = 0; i < n_ops; ++i) {
    Op& o = copy[i];
    const auto self = static_cast<OpId>(o0 + i);
    o.layer += o.layer >= 0 ? layer_step : 0;
    if (static_cast<std::uint32_t>(o.collective - a0.collectives) < n_coll) {
      o.collective += d_coll;  // a collective of the segment (kNone wraps around: not one)
    }
    // An op's edges are its deps, inputs and outputs, one after the other (read into locals: the
    // stores through `edges` and `tensors` could otherwise alias them).
    const std::int32_t deps_end = o.deps_end, inputs_end = o.inputs_end;
    const std::int32_t outputs_end = o.outputs_end;
    std::int32_t e = o.deps_begin;
    for (; e < deps_end; ++e) {
      edges[e + d_edges] = map.op(edges[e]);
    }
    for (; e < inputs_end; ++e) {
      const TensorId t = map.tensor(edges[e]);
      edges[e + d_edges] = t;
      tensors[t].consumers += 1;
    }
    for (; e < outputs_end; ++e) {
      const TensorId t = map.tensor(edges[e]);
      edges[e + d_edges] = t;
      Tensor& ten = tensors[t];
      if (ten.producer != kNone) {
        throw std::logic_error("tensor '" + w_.names[static_cast<std::size_t>(ten.name)] +
                               "' produced twice");
      }
      ten.producer = self;
    }
    o.deps_begin += d_edges;
    o.deps_end += d_edges;
    o.inputs_begin += d_edges;
    o.inputs_end += d_edges;
    o.outputs_begin += d_edges;
    o.outputs_end += d_edges;
  }
  for (const NameStep& n : names) {
    std::int32_t& name = n.tensor ? w_.tensors[static_cast<std::size_t>(b0.tensors + n.index)].name
                                  : w_.ops[static_cast<std::size_t>(b0.ops + n.index)].name;
    const std::string& old = w_.names[static_cast<std::size_t>(name)];
    const auto digits = old.size() - static_cast<std::size_t>(n.prefix + n.suffix);
    const int number = std::stoi(old.substr(static_cast<std::size_t>(n.prefix), digits)) + n.step;
    if (number < 0) {
      throw std::logic_error("repeated segment numbered below zero: " + old);
    }
    name = w_.intern(old.substr(0, static_cast<std::size_t>(n.prefix)) + std::to_string(number) +
                     old.substr(old.size() - static_cast<std::size_t>(n.suffix)));
  }
}

}  // namespace cpsim::sim::detail
