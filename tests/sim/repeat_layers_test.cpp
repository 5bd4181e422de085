// Blocks as instances of a template (BuildOptions::repeat_layers): the workload is the one built
// block by block, op for op, over every method, activation-checkpointing mode, ZeRO stage and
// offload, with one simulated rank and with all of them.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CheckpointMode;
using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kK = 1 << 10;

const std::string& name(const Workload& w, std::int32_t id) {
  return w.names[static_cast<std::size_t>(id)];
}

// Field by field; names compared as text (per-block names are interned in another order).
void expect_same(const Workload& a, const Workload& b) {
  ASSERT_EQ(a.ops.size(), b.ops.size());
  ASSERT_EQ(a.tensors.size(), b.tensors.size());
  ASSERT_EQ(a.edges, b.edges);
  ASSERT_EQ(a.collectives.size(), b.collectives.size());
  EXPECT_EQ(a.groups, b.groups);
  EXPECT_EQ(a.notes, b.notes);
  for (std::size_t i = 0; i < a.ops.size(); ++i) {
    const Op& x = a.ops[i];
    const Op& y = b.ops[i];
    SCOPED_TRACE(fmt::format("op {} '{}' layer {}", i, name(a, x.name), x.layer));
    ASSERT_EQ(name(a, x.name), name(b, y.name));
    ASSERT_EQ(x.rank, y.rank);
    ASSERT_EQ(x.stream, y.stream);
    ASSERT_EQ(x.kind, y.kind);
    ASSERT_EQ(x.phase, y.phase);
    ASSERT_EQ(x.layer, y.layer);
    ASSERT_EQ(x.duration_ns, y.duration_ns);
    ASSERT_EQ(x.transfer_bytes, y.transfer_bytes);
    ASSERT_EQ(x.flops, y.flops);
    ASSERT_EQ(x.workspace_bytes, y.workspace_bytes);
    ASSERT_EQ(x.workspace_category, y.workspace_category);
    ASSERT_EQ(x.memory_pool, y.memory_pool);
    ASSERT_EQ(x.host_calls, y.host_calls);
    ASSERT_EQ(x.host_sync, y.host_sync);
    ASSERT_EQ(x.collective, y.collective);
    ASSERT_EQ(x.deps_begin, y.deps_begin);
    ASSERT_EQ(x.deps_end, y.deps_end);
    ASSERT_EQ(x.inputs_begin, y.inputs_begin);
    ASSERT_EQ(x.inputs_end, y.inputs_end);
    ASSERT_EQ(x.outputs_begin, y.outputs_begin);
    ASSERT_EQ(x.outputs_end, y.outputs_end);
  }
  for (std::size_t i = 0; i < a.tensors.size(); ++i) {
    const Tensor& x = a.tensors[i];
    const Tensor& y = b.tensors[i];
    SCOPED_TRACE(fmt::format("tensor {} '{}'", i, name(a, x.name)));
    ASSERT_EQ(name(a, x.name), name(b, y.name));
    ASSERT_EQ(x.bytes, y.bytes);
    ASSERT_EQ(x.rank, y.rank);
    ASSERT_EQ(x.category, y.category);
    ASSERT_EQ(x.on_host, y.on_host);
    ASSERT_EQ(x.producer, y.producer);
    ASSERT_EQ(x.consumers, y.consumers);
  }
  for (std::size_t i = 0; i < a.collectives.size(); ++i) {
    const Collective& x = a.collectives[i];
    const Collective& y = b.collectives[i];
    ASSERT_EQ(x.kind, y.kind);
    ASSERT_EQ(x.span, y.span);
    ASSERT_EQ(x.group, y.group);
    ASSERT_EQ(x.size_bytes, y.size_bytes);
    ASSERT_EQ(x.wire_bytes, y.wire_bytes);
    ASSERT_EQ(x.alpha_s, y.alpha_s);
    ASSERT_EQ(x.nominal_bytes_per_s, y.nominal_bytes_per_s);
  }
}

struct Case {
  CpMethod method;
  const char* model;
  int gpus;
  int ring;
  std::int64_t seq;
};

// Every method, UPipe with and without a ring.
constexpr Case kCases[] = {
    {CpMethod::kUlysses, "llama3-8b", 8, 1, 256 * kK},
    {CpMethod::kUPipe, "qwen3-4b", 8, 1, 256 * kK},
    {CpMethod::kRing, "llama3-8b", 8, 8, 256 * kK},
    {CpMethod::kAllGather, "llama3-8b", 8, 8, 128 * kK},
    {CpMethod::kFpdt, "llama3-8b", 8, 1, 512 * kK},
    {CpMethod::kUsp, "qwen3-8b", 16, 2, 256 * kK},
    {CpMethod::kUPipe, "llama3-8b", 16, 2, 256 * kK},
};

// CpScheme::recomputes_selectively: where a method says selective checkpointing changes
// nothing, the step under it is the step without checkpointing, op for op (a plan simulates one
// for both); where it says it does, the steps differ. Each method's scheme and the implementation
// the recipe runs for it; FPDT with several chunks (kCases) and with one (plain Ulysses).
TEST(SelectiveCheckpointing, SameStepWhereTheMethodRecomputesNothing) {
  std::vector<Case> cases(std::begin(kCases), std::end(kCases));
  cases.push_back({CpMethod::kFpdt, "llama3-8b", 8, 1, 64 * kK});
  int same = 0, different = 0;
  for (const Case& c : cases) {
    for (const char* impl : {"none", ""}) {
      ScheduleInputs in = inputs(c.method, c.model, c.gpus, c.seq);
      in.parallel.ring_degree = c.ring;
      in.parallel.fpdt_chunk = 64 * kK;
      in.parallel.implementation = impl;
      in.recipe.checkpoint_offload = false;
      SCOPED_TRACE(
          fmt::format("{} {} seq {} impl '{}'", models::to_string(c.method), c.model, c.seq, impl));
      in.recipe.checkpointing = CheckpointMode::kSelective;
      const Workload selective = build_step(in);
      in.recipe.checkpointing = CheckpointMode::kNone;
      const Workload none = build_step(in);
      if (!cp_scheme(c.method).recomputes_selectively(in.parallel)) {
        expect_same(selective, none);
        same += 1;
      } else {
        EXPECT_NE(selective.ops.size(), none.ops.size());
        different += 1;
      }
    }
  }
  EXPECT_EQ(same, 6);  // UPipe with and without a ring, FPDT with 8 chunks
  EXPECT_EQ(different, 10);
}

TEST(RepeatLayers, SameWorkloadAsBuiltBlockByBlock) {
  int repeated = 0;
  for (const Case& c : kCases) {
    for (const auto& [ac, offload] :
         {std::pair{CheckpointMode::kFull, true}, std::pair{CheckpointMode::kFull, false},
          std::pair{CheckpointMode::kSelective, false}, std::pair{CheckpointMode::kNone, false}}) {
      for (const int zero : {3, 2, 0}) {
        for (const bool all_ranks : {false, true}) {
          if (all_ranks && (zero != 3 || !offload)) {
            continue;  // every rank: the recipe of the default only (time)
          }
          ScheduleInputs in = inputs(c.method, c.model, c.gpus, c.seq);
          in.parallel.ring_degree = c.ring;
          in.recipe.checkpointing = ac;
          in.recipe.checkpoint_offload = offload;
          in.recipe.zero_stage = zero;
          in.recipe.optimizer_offload = zero == 0;
          SCOPED_TRACE(fmt::format("{} {} ac {} offload {} zero {} all ranks {}",
                                   models::to_string(c.method), c.model, models::to_string(ac),
                                   offload, zero, all_ranks));
          const Workload built = build_step(in, {.all_ranks = all_ranks, .repeat_layers = false});
          const Workload fast = build_step(in, {.all_ranks = all_ranks, .repeat_layers = true});
          expect_same(built, fast);
          EXPECT_EQ(built.repeated_blocks, 0);
          // Every block's forward and backward, and its recomputation under full checkpointing.
          EXPECT_EQ(fast.repeated_blocks, (ac == CheckpointMode::kFull ? 3 : 2) * in.model.layers);
          repeated += fast.repeated_blocks > 0 ? 1 : 0;
        }
      }
    }
  }
  EXPECT_EQ(repeated, 7 * 4 * 3 + 7);  // every configuration instantiated its blocks
}

// Shallow models: from one block on, every block is an instance (the first, the last and the
// only block included), with and without offloaded checkpoints (kept on the GPU for the first and
// the last block, or not) and without checkpointing.
TEST(RepeatLayers, ShallowModels) {
  for (const CpMethod method : {CpMethod::kUlysses, CpMethod::kUPipe, CpMethod::kFpdt}) {
    for (const auto& [ac, keep_first_last] :
         {std::pair{CheckpointMode::kFull, true}, std::pair{CheckpointMode::kFull, false},
          std::pair{CheckpointMode::kNone, false}}) {
      for (std::int64_t layers = 1; layers <= 6; ++layers) {
        ScheduleInputs in = inputs(method, "llama3-8b", 8, 256 * kK);
        in.model.layers = layers;
        in.recipe.checkpointing = ac;
        in.recipe.checkpoint_offload = ac == CheckpointMode::kFull;
        in.recipe.offload_keep_first_last = keep_first_last;
        SCOPED_TRACE(fmt::format("{} {} layers ac {} keep first/last {}", models::to_string(method),
                                 layers, models::to_string(ac), keep_first_last));
        const Workload built = build_step(in, {.repeat_layers = false});
        const Workload fast = build_step(in);
        expect_same(built, fast);
        EXPECT_EQ(fast.repeated_blocks, (ac == CheckpointMode::kFull ? 3 : 2) * layers);
      }
    }
  }
}

// What the engine's fast-forward takes from the construction (Workload::template_shapes): every
// op of an instance that is not among its template's ported ops has its dependencies and tensors
// inside the instance, and is the same op in every instance of the template, with its ids moved
// by the instance's start (its edges' positions too, while the ported ops before it have as many
// edges in both instances).
void expect_instances_differ_only_in_ported_ops(const Workload& w) {
  int compared = 0;
  for (std::int32_t id = 0; id < 3; ++id) {
    const Workload::TemplateShape& shape = w.template_shapes[static_cast<std::size_t>(id)];
    std::vector<Workload::Instance> of_template;
    for (const Workload::Instance& m : w.instances) {
      if (m.template_id == id) {
        of_template.push_back(m);
      }
    }
    if (of_template.empty()) {
      EXPECT_EQ(shape.ops, 0);
      continue;
    }
    ASSERT_GT(shape.ops, 0) << "template " << id;
    const Workload::Instance& a = of_template.front();
    for (const Workload::Instance& b : of_template) {
      SCOPED_TRACE(fmt::format("template {} instances at ops {} and {}", id, a.ops, b.ops));
      const std::int32_t dops = b.ops - a.ops, dtensors = b.tensors - a.tensors;
      bool aligned = true;  // the ported ops so far have as many edges in both
      std::size_t next_ported = 0;
      for (std::int32_t k = 0; k < shape.ops; ++k) {
        const Op& x = w.ops[static_cast<std::size_t>(a.ops + k)];
        const Op& y = w.ops[static_cast<std::size_t>(b.ops + k)];
        if (next_ported < shape.ported_ops.size() && shape.ported_ops[next_ported] == k) {
          ++next_ported;
          aligned = aligned && x.outputs_end - x.deps_begin == y.outputs_end - y.deps_begin;
          continue;
        }
        SCOPED_TRACE(fmt::format("op {} of the instance, '{}'", k, name(w, x.name)));
        ASSERT_EQ(x.name, y.name);
        ASSERT_EQ(x.rank, y.rank);
        ASSERT_EQ(x.stream, y.stream);
        ASSERT_EQ(x.kind, y.kind);
        ASSERT_EQ(x.phase, y.phase);
        ASSERT_EQ(x.duration_ns, y.duration_ns);
        ASSERT_EQ(x.workspace_bytes, y.workspace_bytes);
        ASSERT_EQ(x.host_calls, y.host_calls);
        ASSERT_EQ(x.host_sync, y.host_sync);
        ASSERT_EQ(x.collective == kNone, y.collective == kNone);
        if (x.collective != kNone) {
          ASSERT_EQ(y.collective - x.collective, b.collectives - a.collectives);
        }
        if (aligned) {
          ASSERT_EQ(y.deps_begin - x.deps_begin, b.edges - a.edges);
        }
        ASSERT_EQ(x.deps_end - x.deps_begin, y.deps_end - y.deps_begin);
        ASSERT_EQ(x.outputs_end - x.inputs_begin, y.outputs_end - y.inputs_begin);
        for (std::int32_t e = 0; e < x.deps_end - x.deps_begin; ++e) {
          const OpId dx = w.edges[static_cast<std::size_t>(x.deps_begin + e)];
          ASSERT_GE(dx, a.ops);
          ASSERT_LT(dx, a.ops + shape.ops);
          ASSERT_EQ(w.edges[static_cast<std::size_t>(y.deps_begin + e)], dx + dops);
        }
        for (std::int32_t e = 0; e < x.outputs_end - x.inputs_begin; ++e) {
          const TensorId tx = w.edges[static_cast<std::size_t>(x.inputs_begin + e)];
          ASSERT_GE(tx, a.tensors);
          ASSERT_LT(tx, a.tensors + shape.tensors);
          ASSERT_EQ(w.edges[static_cast<std::size_t>(y.inputs_begin + e)], tx + dtensors);
        }
        ++compared;
      }
      ASSERT_EQ(next_ported, shape.ported_ops.size());
      for (std::int32_t t = 0; t < shape.tensors; ++t) {
        const Tensor& x = w.tensors[static_cast<std::size_t>(a.tensors + t)];
        const Tensor& y = w.tensors[static_cast<std::size_t>(b.tensors + t)];
        ASSERT_EQ(x.bytes, y.bytes);
        ASSERT_EQ(x.rank, y.rank);
        ASSERT_EQ(x.category, y.category);
        ASSERT_EQ(x.on_host, y.on_host);
      }
    }
  }
  EXPECT_GT(compared, 0);
}

TEST(RepeatLayers, InstancesDifferOnlyInPortedOps) {
  for (const Case& c : kCases) {
    for (const CheckpointMode ac :
         {CheckpointMode::kFull, CheckpointMode::kSelective, CheckpointMode::kNone}) {
      for (const int zero : {3, 2}) {
        ScheduleInputs in = inputs(c.method, c.model, c.gpus, c.seq);
        in.parallel.ring_degree = c.ring;
        in.recipe.checkpointing = ac;
        in.recipe.checkpoint_offload = ac == CheckpointMode::kFull;
        in.recipe.zero_stage = zero;
        SCOPED_TRACE(fmt::format("{} {} ac {} zero {}", models::to_string(c.method), c.model,
                                 models::to_string(ac), zero));
        const Workload w = build_step(in);
        expect_instances_differ_only_in_ported_ops(w);
        // Each template recorded once per build: its shape is known (the recomputation's under
        // full checkpointing only).
        EXPECT_GT(w.template_shapes[Workload::kForwardBlock].ops, 0);
        EXPECT_EQ(w.template_shapes[Workload::kRecomputeBlock].ops > 0,
                  ac == CheckpointMode::kFull);
        EXPECT_GT(w.template_shapes[Workload::kBackwardBlock].ops, 0);
      }
    }
  }
}

}  // namespace
}  // namespace cpsim::sim
