// LayerTemplate (sim/src/layer_template.hpp): an instance is what emitting the recorded code again
// would append, with the ports bound; dependencies on a port's producer are left out or
// de-duplicated with the bound producer; references outside the ports and bindings that do not
// fit their port are refused.
#include "layer_template.hpp"

#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "builder.hpp"

namespace cpsim::sim::detail {
namespace {

constexpr int kRanks = 2;

OpSet emit(Builder& b,
           const char* name,
           Stream stream,
           std::vector<TensorSet> in,
           std::vector<TensorSet> out,
           std::vector<OpSet> deps = {}) {
  OpSpec s;
  s.name = name;
  s.stream = stream;
  s.time_s = 1e-6;
  s.inputs = std::move(in);
  s.outputs = std::move(out);
  s.deps = std::move(deps);
  return b.op(s);
}

/// A tensor produced by an op on `stream`.
TensorSet produced(Builder& b, const char* name, Stream stream) {
  TensorSet t = b.tensor(name, 8, MemCategory::kActivations);
  emit(b, name, stream, {}, {t});
  return t;
}

/// The code recorded: reads x twice (compute, then the copy stream) and y, writes its own tensors
/// and the port g (a gradient buffer, produced here).
struct Ends {
  TensorSet out;
  OpSet first;
};
Ends block(Builder& b, TensorSet x, TensorSet y, TensorSet g) {
  TensorSet a = b.tensor("a", 16, MemCategory::kActivations);
  const OpSet first = emit(b, "f", Stream::kCompute, {x, y}, {a});
  TensorSet c = b.tensor("c", 16, MemCategory::kOther);
  emit(b, "copy", Stream::kD2H, {x, a}, {c}, {first});
  TensorSet out = b.tensor("out", 16, MemCategory::kActivations);
  emit(b, "g", Stream::kCompute, {c, a}, {out, g});
  emit(b, "h", Stream::kCompute, {g}, {});
  return {out, first};
}

struct Recorded {
  LayerTemplate tmpl;
  Ends ends;
};
Recorded record(Builder& b, Workload& w, TensorSet x, TensorSet y, TensorSet g) {
  const Mark scratch = b.mark();
  auto port_like = [&](TensorSet t, const char* name) {
    if (!t.valid()) {
      return TensorSet{};
    }
    return w.tensors[static_cast<std::size_t>(t.base)].producer != kNone
               ? produced(b, name, Stream::kCompute)
               : b.tensor(name, 0, MemCategory::kOther);
  };
  const TensorSet px = port_like(x, "px"), py = port_like(y, "py"), pg = port_like(g, "pg");
  b.set_port_ops(scratch.ops, b.mark().ops);
  const Mark begin = b.mark();
  const Ends ends = block(b, px, py, pg);
  Recorded r{
      LayerTemplate::record(w, begin, b.mark(), {Port::of(px), Port::of(py), Port::of(pg)}, kRanks),
      ends};
  b.set_port_ops(kNone, kNone);
  b.truncate(scratch);
  return r;
}

void expect_same(const Workload& a, const Workload& b) {
  ASSERT_EQ(a.ops.size(), b.ops.size());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  ASSERT_EQ(a.edges, b.edges);
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    SCOPED_TRACE("op " + std::to_string(i));
    const Op& x = a.ops[i];
    const Op& y = b.ops[i];
    EXPECT_EQ(a.names[static_cast<std::size_t>(x.name)], b.names[static_cast<std::size_t>(y.name)]);
    EXPECT_EQ(x.rank, y.rank);
    EXPECT_EQ(x.stream, y.stream);
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.phase, y.phase);
    EXPECT_EQ(x.duration_ns, y.duration_ns);
    EXPECT_EQ(x.deps_begin, y.deps_begin);
    EXPECT_EQ(x.deps_end, y.deps_end);
    EXPECT_EQ(x.inputs_begin, y.inputs_begin);
    EXPECT_EQ(x.outputs_end, y.outputs_end);
  }
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    SCOPED_TRACE("tensor " + std::to_string(i));
    EXPECT_EQ(a.tensors[i].producer, b.tensors[i].producer);
    EXPECT_EQ(a.tensors[i].consumers, b.tensors[i].consumers);
    EXPECT_EQ(a.tensors[i].bytes, b.tensors[i].bytes);
  }
}

// Three blocks whose input x comes from the compute stream, then the copy stream, then an op
// that also produces y: the dependency on x's producer is left out on the same stream and listed
// once when x and y share a producer, as emitting does.
TEST(LayerTemplate, InstancesAreTheEmission) {
  Workload built, fast;
  Builder bb(built, kRanks, kRanks, 1, 1, 8);
  Builder bf(fast, kRanks, kRanks, 1, 1, 8);
  auto inputs = [](Builder& b, int l) {
    TensorSet x, y = produced(b, "y", Stream::kH2D);
    if (l == 0) {
      x = produced(b, "x", Stream::kCompute);
    } else if (l == 1) {
      x = produced(b, "x", Stream::kD2H);
    } else {
      x = b.tensor("x", 8, MemCategory::kActivations);
      y = b.tensor("y", 8, MemCategory::kActivations);
      emit(b, "xy", Stream::kH2D, {}, {x, y});
    }
    return std::pair{x, y};
  };
  Recorded rec;
  for (int l = 0; l < 3; ++l) {
    bb.set_layer(l);
    bf.set_layer(l);
    const auto [bx, by] = inputs(bb, l);
    const TensorSet bg = bb.tensor("grads", 8, MemCategory::kParamGather);
    const Ends e = block(bb, bx, by, bg);
    emit(bb, "after", Stream::kComm, {e.out}, {}, {e.first});

    const auto [fx, fy] = inputs(bf, l);
    const TensorSet fg = bf.tensor("grads", 8, MemCategory::kParamGather);
    if (rec.tmpl.empty()) {
      rec = record(bf, fast, fx, fy, fg);
    }
    const Mark at =
        rec.tmpl.instantiate(fast, l, {Binding::of(fx), Binding::of(fy), Binding::of(fg)});
    emit(bf, "after", Stream::kComm, {rec.tmpl.in(at, rec.ends.out)}, {},
         {rec.tmpl.in(at, rec.ends.first)});
  }
  expect_same(built, fast);
  EXPECT_EQ(fast.repeated_blocks, 3);
  // The instances differ as the emission does: "f" waits for x's producer only in block 1 (in
  // block 0 it is on the same stream) and lists the common producer of x and y once in block 2.
  std::vector<std::int32_t> deps_of_f;
  for (const Op& o : fast.ops) {
    if (fast.names[static_cast<std::size_t>(o.name)] == "f" && o.rank == 0) {
      deps_of_f.push_back(o.deps_end - o.deps_begin);
    }
  }
  EXPECT_EQ(deps_of_f, (std::vector<std::int32_t>{1, 2, 1}));
}

TEST(LayerTemplate, RefusesReferencesOutsideItsPorts) {
  Workload w;
  Builder b(w, kRanks, kRanks, 1, 1, 8);
  const TensorSet outside = produced(b, "outside", Stream::kCompute);
  const Mark begin = b.mark();
  emit(b, "reads", Stream::kCompute, {outside}, {});
  EXPECT_THROW(LayerTemplate::record(w, begin, b.mark(), {}, kRanks), std::logic_error);
  EXPECT_NO_THROW(LayerTemplate::record(w, begin, b.mark(), {Port::of(outside)}, kRanks));
}

TEST(LayerTemplate, RefusesBindingsThatDoNotFit) {
  Workload w;
  Builder b(w, kRanks, kRanks, 1, 1, 8);
  const TensorSet x = produced(b, "x", Stream::kCompute);
  const TensorSet g = b.tensor("g", 8, MemCategory::kParamGather);
  Recorded rec = record(b, w, x, TensorSet{}, g);
  // y was recorded as none: binding a tensor to it does not fit, nor binding none to x.
  EXPECT_THROW(rec.tmpl.instantiate(w, 0, {Binding::of(x), Binding::of(x), Binding::of(g)}),
               std::logic_error);
  EXPECT_THROW(rec.tmpl.instantiate(w, 0, {Binding::of({}), Binding::of({}), Binding::of(g)}),
               std::logic_error);
  EXPECT_THROW(rec.tmpl.instantiate(w, 0, {Binding::of(x), Binding::of({})}), std::logic_error);
  // g was recorded without a producer (the block produces it): an already produced one does not
  // fit.
  EXPECT_THROW(rec.tmpl.instantiate(w, 0, {Binding::of(x), Binding::of({}), Binding::of(x)}),
               std::logic_error);
  EXPECT_NO_THROW(rec.tmpl.instantiate(w, 0, {Binding::of(x), Binding::of({}), Binding::of(g)}));
}

// A segment port: a second segment that reads the first one's tensors follows the first one's
// instance.
TEST(LayerTemplate, SegmentPortFollowsTheBoundInstance) {
  Workload w;
  Builder b(w, kRanks, kRanks, 1, 1, 8);
  const Mark scratch = b.mark();
  const Mark fwd0 = b.mark();
  TensorSet saved = b.tensor("saved", 8, MemCategory::kActivations);
  emit(b, "fwd", Stream::kCompute, {}, {saved});
  const Mark fwd1 = b.mark();
  emit(b, "bwd", Stream::kComm, {saved}, {});
  LayerTemplate fwd = LayerTemplate::record(w, fwd0, fwd1, {}, kRanks);
  LayerTemplate bwd = LayerTemplate::record(w, fwd1, b.mark(), {Port::segment(fwd0, fwd1)}, kRanks);
  b.truncate(scratch);
  const Mark f0 = fwd.instantiate(w, 0, {});
  const Mark f1 = fwd.instantiate(w, 1, {});
  const Mark b1 = bwd.instantiate(w, 1, {Binding::at(f1)});
  const Mark b0 = bwd.instantiate(w, 0, {Binding::at(f0)});
  auto input_of = [&](const Mark& at) {
    return w.edges[static_cast<std::size_t>(w.ops[static_cast<std::size_t>(at.ops)].inputs_begin)];
  };
  auto dep_of = [&](const Mark& at) {
    return w.edges[static_cast<std::size_t>(w.ops[static_cast<std::size_t>(at.ops)].deps_begin)];
  };
  EXPECT_EQ(input_of(b1), f1.tensors);
  EXPECT_EQ(input_of(b0), f0.tensors);
  EXPECT_EQ(dep_of(b1), f1.ops);  // "fwd" on another stream
  EXPECT_EQ(dep_of(b0), f0.ops);
  EXPECT_EQ(w.tensors[static_cast<std::size_t>(f0.tensors)].consumers, 1);
  EXPECT_EQ(w.ops[static_cast<std::size_t>(b1.ops)].layer, 1);
}

}  // namespace
}  // namespace cpsim::sim::detail
