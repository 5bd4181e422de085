#include "builder.hpp"

#include <algorithm>
#include <stdexcept>

#include "cpsim/models/units.hpp"

namespace cpsim::sim::detail {

Builder::Builder(Workload& w, int ranks, int cp_degree, int gpus_per_node)
    : w_(w), ranks_(ranks), cp_(cp_degree), gpus_per_node_(gpus_per_node) {
  w_.ranks = ranks;
  w_.gpus_per_node = gpus_per_node;
  w_.static_memory.assign(static_cast<std::size_t>(ranks), {});
}

TensorSet Builder::tensor(const std::string& name,
                          std::int64_t bytes,
                          MemCategory category,
                          bool on_host) {
  const auto base = static_cast<TensorId>(w_.tensors.size());
  const std::int32_t name_id = w_.intern(name);
  for (int r = 0; r < ranks_; ++r) {
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

models::Span Builder::span_of(Group g) const {
  const int members = g == Group::kCp ? cp_ : ranks_;
  return members <= gpus_per_node_ ? models::Span::kIntraNode : models::Span::kInterNode;
}

OpSet Builder::op(const OpSpec& spec) {
  const auto base = static_cast<OpId>(w_.ops.size());
  const std::int32_t name_id = w_.intern(spec.name);
  const SimTime duration = seconds_to_simtime(spec.time_s);
  for (int r = 0; r < ranks_; ++r) {
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
  const int members = group == Group::kCp ? cp_ : ranks_;
  const models::Span span = span_of(group);
  const CollectiveCost c = cost.collective(kind, span, members, size_bytes);
  OpSpec s = spec;
  s.kind = OpKind::kCollective;
  s.time_s = c.time_s();
  const OpSet set = op(s);
  const int groups = ranks_ / members;
  const auto first = static_cast<CollectiveId>(w_.collectives.size());
  for (int g = 0; g < groups; ++g) {
    Collective col;
    col.kind = kind;
    col.span = span;
    col.size_bytes = c.size_bytes;
    col.wire_bytes = c.wire_bytes;
    col.alpha_s = c.alpha_s;
    col.nominal_bytes_per_s = c.nominal_bytes_per_s;
    for (int m = 0; m < members; ++m) {
      col.members.push_back(g * members + m);
    }
    w_.collectives.push_back(std::move(col));
  }
  for (int r = 0; r < ranks_; ++r) {
    w_.ops[static_cast<std::size_t>(set.base + r)].collective = first + r / members;
  }
  return set;
}

}  // namespace cpsim::sim::detail
