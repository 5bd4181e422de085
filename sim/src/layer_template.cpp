#include "layer_template.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace cpsim::sim::detail {
namespace {

bool inside(std::int32_t x, std::int32_t lo, std::int32_t hi) {
  return x >= lo && x < hi;
}

/// Room for `more` elements, growing geometrically (an instance appends while reading).
template <class V>
void make_room(V& v, std::size_t more) {
  const std::size_t need = v.size() + more;
  if (need > v.capacity()) {
    v.reserve(std::max(need, 2 * v.capacity()));
  }
}

/// Appends the recorded dependencies [rec, rec_end) of op `o` at edges[cursor]: a local one moved
/// to the instance (ops from `op0`); a port's producer left out when none, on the same rank and
/// stream, or already listed, as Builder::op does. Returns the cursor after them.
std::int32_t copy_deps(const std::int32_t* rec,
                       const std::int32_t* rec_end,
                       const std::int32_t* resolved,
                       std::int32_t op0,
                       const Op* ops,
                       const Op& o,
                       std::int32_t* edges,
                       std::int32_t cursor) {
  const std::int32_t first = cursor;
  for (; rec != rec_end; ++rec) {
    const std::int32_t x = *rec;
    if (x >= 0) {
      edges[cursor++] = op0 + x;
      continue;
    }
    const OpId d = resolved[~x];
    if (d == kNone) {
      continue;
    }
    const Op& dep = ops[d];
    if ((dep.stream == o.stream && dep.rank == o.rank) ||
        std::find(edges + first, edges + cursor, d) != edges + cursor) {
      continue;
    }
    edges[cursor++] = d;
  }
  return cursor;
}

}  // namespace

LayerTemplate LayerTemplate::record(
    const Workload& w, const Mark& begin, const Mark& end, ListRef<Port> ports, int ranks) {
  LayerTemplate t;
  t.begin_ = begin;
  t.size_ = {end.ops - begin.ops, end.tensors - begin.tensors, end.edges - begin.edges,
             end.collectives - begin.collectives};
  t.port_count_ = static_cast<std::int32_t>(ports.size());
  for (std::int32_t i = 0; i < t.port_count_; ++i) {
    const Port& p = ports.begin()[i];
    t.port_kinds_.push_back(p.tensor.valid() ? PortKind::kTensor
                            : p.end.ops > p.begin.ops || p.end.tensors > p.begin.tensors
                                ? PortKind::kSegment
                                : PortKind::kNone);
    if (p.tensor.valid()) {
      const OpId producer = w.tensors[static_cast<std::size_t>(p.tensor.base)].producer;
      if (producer == kNone || producer >= begin.ops) {
        t.unproduced_ports_.push_back(i);
      }
    }
  }
  t.collectives_.assign(w.collectives.begin() + begin.collectives,
                        w.collectives.begin() + end.collectives);
  t.tensors_.assign(w.tensors.begin() + begin.tensors, w.tensors.begin() + end.tensors);
  for (Tensor& x : t.tensors_) {
    if (x.producer != kNone && !inside(x.producer, begin.ops, end.ops)) {
      throw std::logic_error("recorded tensor produced outside its segment");
    }
    // What the segment's own ops give it, as Builder::op does: its producer (an offset in the
    // segment) and its readers, counted below; reads after the segment add to an instance's.
    x.producer = x.producer == kNone ? kNone : x.producer - begin.ops;
    x.consumers = 0;
  }
  t.ops_.assign(w.ops.begin() + begin.ops, w.ops.begin() + end.ops);
  t.edges_.resize(static_cast<std::size_t>(end.edges - begin.edges));
  for (Op& o : t.ops_) {
    if (o.collective != kNone) {
      if (!inside(o.collective, begin.collectives, end.collectives)) {
        throw std::logic_error("recorded op in a collective outside its segment");
      }
      o.collective -= begin.collectives;
    }
    if (o.deps_begin < begin.edges || o.outputs_end > end.edges) {
      throw std::logic_error("recorded op with edges outside its segment");
    }
    auto at = [&](std::int32_t e) -> std::int32_t& {
      return t.edges_[static_cast<std::size_t>(e - begin.edges)];
    };
    for (std::int32_t e = o.deps_begin; e < o.deps_end; ++e) {
      at(e) = t.encode_op(w, w.edges[static_cast<std::size_t>(e)], begin, end, ports, ranks);
    }
    for (std::int32_t e = o.inputs_begin; e < o.outputs_end; ++e) {
      at(e) = t.encode_tensor(w.edges[static_cast<std::size_t>(e)], begin, end, ports, ranks);
    }
    for (std::int32_t e = o.inputs_begin; e < o.inputs_end; ++e) {
      if (at(e) >= 0) {
        t.tensors_[static_cast<std::size_t>(at(e))].consumers += 1;
      }
    }
    bool ported = false;
    for (std::int32_t e = o.deps_begin; e < o.outputs_end && !ported; ++e) {
      ported = at(e) < 0;
    }
    if (ported) {
      t.ported_ops_.push_back(static_cast<std::int32_t>(&o - t.ops_.data()));
    }
    o.deps_begin -= begin.edges;
    o.deps_end -= begin.edges;
    o.inputs_begin -= begin.edges;
    o.inputs_end -= begin.edges;
    o.outputs_begin -= begin.edges;
    o.outputs_end -= begin.edges;
  }
  t.ref_index_.clear();
  return t;
}

std::int32_t LayerTemplate::encode(const Ref& r) {
  const std::int64_t key = (static_cast<std::int64_t>(r.port) << 34) |
                           (static_cast<std::int64_t>(r.kind) << 32) |
                           static_cast<std::uint32_t>(r.index);
  const auto [it, inserted] = ref_index_.try_emplace(key, static_cast<std::int32_t>(refs_.size()));
  if (inserted) {
    refs_.push_back(r);
  }
  return ~it->second;
}

std::int32_t LayerTemplate::encode_op(
    const Workload& w, OpId d, const Mark& begin, const Mark& end, ListRef<Port> ports, int ranks) {
  if (inside(d, begin.ops, end.ops)) {
    return d - begin.ops;
  }
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(ports.size()); ++i) {
    const Port& p = ports.begin()[i];
    if (p.tensor.valid()) {
      for (std::int32_t r = 0; r < ranks; ++r) {
        if (w.tensors[static_cast<std::size_t>(p.tensor.base + r)].producer == d) {
          return encode({RefKind::kPortProducer, i, r});
        }
      }
    } else if (inside(d, p.begin.ops, p.end.ops)) {
      return encode({RefKind::kSegmentOp, i, d - p.begin.ops});
    }
  }
  throw std::logic_error(
      "recorded segment depends on op '" +
      w.names[static_cast<std::size_t>(w.ops[static_cast<std::size_t>(d)].name)] +
      "' outside its ports");
}

std::int32_t LayerTemplate::encode_tensor(
    TensorId x, const Mark& begin, const Mark& end, ListRef<Port> ports, int ranks) {
  if (inside(x, begin.tensors, end.tensors)) {
    return x - begin.tensors;
  }
  for (std::int32_t i = 0; i < static_cast<std::int32_t>(ports.size()); ++i) {
    const Port& p = ports.begin()[i];
    if (p.tensor.valid() && inside(x, p.tensor.base, p.tensor.base + ranks)) {
      return encode({RefKind::kPortTensor, i, x - p.tensor.base});
    }
    if (!p.tensor.valid() && inside(x, p.begin.tensors, p.end.tensors)) {
      return encode({RefKind::kSegmentTensor, i, x - p.begin.tensors});
    }
  }
  throw std::logic_error("recorded segment refers to a tensor outside its ports");
}

void LayerTemplate::resolve(const Workload& w, ListRef<Binding> bindings) {
  if (static_cast<std::int32_t>(bindings.size()) != port_count_) {
    throw std::logic_error("layer instance with the wrong number of bindings");
  }
  const Binding* b = bindings.begin();
  for (std::int32_t i = 0; i < port_count_; ++i) {
    const PortKind kind = port_kinds_[static_cast<std::size_t>(i)];
    if ((kind == PortKind::kTensor) != b[i].tensor.valid()) {
      throw std::logic_error("layer instance binds a tensor port to no tensor or the reverse");
    }
  }
  for (const std::int32_t i : unproduced_ports_) {
    if (w.tensors[static_cast<std::size_t>(b[i].tensor.base)].producer != kNone) {
      throw std::logic_error("layer instance binds a tensor that is already produced");
    }
  }
  resolved_.resize(refs_.size());
  for (std::size_t k = 0; k < refs_.size(); ++k) {
    const Ref& r = refs_[k];
    const Binding& to = b[r.port];
    switch (r.kind) {
      case RefKind::kPortTensor:
        resolved_[k] = to.tensor.base + r.index;
        break;
      case RefKind::kPortProducer:
        resolved_[k] = w.tensors[static_cast<std::size_t>(to.tensor.base + r.index)].producer;
        break;
      case RefKind::kSegmentTensor:
        resolved_[k] = to.segment.tensors + r.index;
        break;
      case RefKind::kSegmentOp:
        resolved_[k] = to.segment.ops + r.index;
        break;
    }
  }
}

Mark LayerTemplate::instantiate(Workload& w, std::int32_t layer, ListRef<Binding> bindings) {
  resolve(w, bindings);
  const Mark at{
      static_cast<std::int32_t>(w.ops.size()), static_cast<std::int32_t>(w.tensors.size()),
      static_cast<std::int32_t>(w.edges.size()), static_cast<std::int32_t>(w.collectives.size())};
  w.repeated_blocks += 1;
  make_room(w.ops, ops_.size());
  make_room(w.tensors, tensors_.size());
  make_room(w.edges, edges_.size());
  make_room(w.collectives, collectives_.size());
  w.collectives.insert(w.collectives.end(), collectives_.begin(), collectives_.end());
  // Local tensors with their local readers counted and their local producer recorded (moved to
  // the instance here); a port's tensor gains its reads and its producer in the pass below.
  w.tensors.insert(w.tensors.end(), tensors_.begin(), tensors_.end());
  Tensor* const tensors = w.tensors.data();
  for (Tensor* t = tensors + at.tensors; t != tensors + w.tensors.size(); ++t) {
    if (t->producer != kNone) {
      t->producer += at.ops;
    }
  }
  // Ops in one copy, then their ids moved in one pass. Edges to local ops and tensors move by the
  // instance's start; a dependency on a port's producer is left out or de-duplicated as
  // Builder::op does (so an instance can have fewer edges than the recording).
  const auto o0 = static_cast<std::size_t>(at.ops);
  w.ops.insert(w.ops.end(), ops_.begin(), ops_.end());
  Op* const ops = w.ops.data();
  w.edges.resize(static_cast<std::size_t>(at.edges) + edges_.size());
  std::int32_t* const edges = w.edges.data();
  const std::int32_t* const rec = edges_.data();
  const std::int32_t* const resolved = resolved_.data();
  std::int32_t cursor = at.edges;
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    Op& o = ops[o0 + i];
    const auto self = static_cast<OpId>(o0 + i);
    o.layer = layer;
    if (o.collective != kNone) {
      o.collective += at.collectives;
    }
    // Read into locals: the stores through `edges` and `tensors` could otherwise alias them.
    const std::int32_t deps_begin = o.deps_begin, deps_end = o.deps_end;
    const std::int32_t inputs_end = o.inputs_end, outputs_end = o.outputs_end;
    const std::int32_t first = cursor;
    cursor = copy_deps(rec + deps_begin, rec + deps_end, resolved, at.ops, ops, o, edges, cursor);
    std::int32_t e = deps_end;
    o.deps_begin = first;
    o.deps_end = cursor;
    o.inputs_begin = cursor;
    for (; e < inputs_end; ++e) {
      const std::int32_t x = rec[e];
      if (x >= 0) {
        edges[cursor++] = at.tensors + x;
        continue;
      }
      const TensorId t = resolved[~x];
      edges[cursor++] = t;
      tensors[t].consumers += 1;
    }
    o.inputs_end = cursor;
    o.outputs_begin = cursor;
    for (; e < outputs_end; ++e) {
      const std::int32_t x = rec[e];
      if (x >= 0) {
        edges[cursor++] = at.tensors + x;
        continue;
      }
      const TensorId t = resolved[~x];
      edges[cursor++] = t;
      Tensor& ten = tensors[t];
      if (ten.producer != kNone) {
        throw std::logic_error("tensor '" + w.names[static_cast<std::size_t>(ten.name)] +
                               "' produced twice");
      }
      ten.producer = self;
    }
    o.outputs_end = cursor;
  }
  w.edges.resize(static_cast<std::size_t>(cursor));
  return at;
}

TensorSet LayerTemplate::in(const Mark& at, TensorSet t) const {
  if (!t.valid()) {
    return t;
  }
  if (!inside(t.base, begin_.tensors, begin_.tensors + size_.tensors)) {
    throw std::logic_error("tensor outside the recorded segment");
  }
  return {at.tensors + (t.base - begin_.tensors)};
}

OpSet LayerTemplate::in(const Mark& at, OpSet o) const {
  if (!o.valid()) {
    return o;
  }
  if (!inside(o.base, begin_.ops, begin_.ops + size_.ops)) {
    throw std::logic_error("op outside the recorded segment");
  }
  return {at.ops + (o.base - begin_.ops)};
}

}  // namespace cpsim::sim::detail
