// Blocks as instances of a template (BuildOptions::repeat_layers): the workload is the one built
// block by block, op for op, over every method, activation-checkpointing mode, ZeRO stage and
// offload, with one simulated rank and with all of them.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

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

TEST(RepeatLayers, SameWorkloadAsBuiltBlockByBlock) {
  const Case cases[] = {
      {CpMethod::kUlysses, "llama3-8b", 8, 1, 256 * kK},
      {CpMethod::kUPipe, "qwen3-4b", 8, 1, 256 * kK},
      {CpMethod::kRing, "llama3-8b", 8, 8, 256 * kK},
      {CpMethod::kAllGather, "llama3-8b", 8, 8, 128 * kK},
      {CpMethod::kFpdt, "llama3-8b", 8, 1, 512 * kK},
      {CpMethod::kUsp, "qwen3-8b", 16, 2, 256 * kK},
      {CpMethod::kUPipe, "llama3-8b", 16, 2, 256 * kK},
  };
  int repeated = 0;
  for (const Case& c : cases) {
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

}  // namespace
}  // namespace cpsim::sim
