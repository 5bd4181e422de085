// DeepSpeed ZeRO-3's reduce-stream transients with the optimizer offloaded, and the per-stream
// pools of the allocator model, against hand-computed cases.
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cpsim/sim/allocator.hpp"
#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::data;
using testing::first_op_named;
using testing::inputs;

ScheduleInputs alst_deepspeed(int gpus, std::int64_t seq) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", gpus, seq);
  in.recipe = models::load_recipe("alst-deepspeed", data());
  return in;
}

// Llama-3-8B (h 4096, f 14336, 32/8 heads of 128, V 128256), recipe alst-deepspeed (bf16
// gradients, reduce bucket 5e8, optimizer offloaded), one GPU:
//   block: 218,112,000 parameters, the largest the MLP's [4096, 14336], n = 58,720,256:
//     cat 218,112,000·2 = 436,224,000; copy back 2n = 117,440,512;
//     max(8·min(n, 2.5e8), 4n) = 469,762,048; sum 1,023,426,560
//   LM head: n = 525,336,576 > 5e8, reduced alone (no cat): 2n = 1,050,673,152,
//     max(8·2.5e8, 4n) = 2,101,346,304; sum 3,152,019,456 (findings-zero3.md's 3,152,019,456)
// Eight GPUs: partitions ⌈n/8⌉; the block's n_p = 7,340,032: 436,224,000 + 14,680,064 +
//   58,720,256 = 509,624,320.
TEST(DeepSpeedZero3, ReduceStreamTransientsWithOptimizerOffload) {
  const Workload one = build_step(alst_deepspeed(1, 32768));
  const Op* layer = first_op_named(one, "reduce.layer5(local)");
  ASSERT_NE(layer, nullptr);
  EXPECT_EQ(layer->workspace_bytes, 1023426560);
  EXPECT_EQ(layer->memory_pool, MemoryPool::kReduce);
  const Op* head = first_op_named(one, "reduce.head(local)");
  ASSERT_NE(head, nullptr);
  EXPECT_EQ(head->workspace_bytes, 3152019456);
  const Op* embedding = first_op_named(one, "reduce.embedding(local)");
  ASSERT_NE(embedding, nullptr);
  EXPECT_EQ(embedding->workspace_bytes, 3152019456);

  const Workload eight = build_step(alst_deepspeed(8, 65536));
  const Op* sharded = first_op_named(eight, "reduce.layer5");
  ASSERT_NE(sharded, nullptr);
  EXPECT_EQ(sharded->workspace_bytes, 509624320);
  EXPECT_EQ(sharded->memory_pool, MemoryPool::kReduce);

  // Without the offload the gradient partitions stay on the GPU: the cast into the collective's
  // buffer only, params × 2, on the FSDP stream's pool.
  ScheduleInputs on_gpu = alst_deepspeed(1, 32768);
  on_gpu.recipe.optimizer_offload = false;
  const Workload plain = build_step(on_gpu);
  const Op* cast = first_op_named(plain, "reduce.layer5(local)");
  ASSERT_NE(cast, nullptr);
  EXPECT_EQ(cast->workspace_bytes, 436224000);
  EXPECT_EQ(cast->memory_pool, MemoryPool::kByStream);
}

// The allocator keeps the three stream pools apart: the step's reserved memory is at least the
// sum of each pool's own peak (no pool's free blocks are lent to another). The gathered parameters
// (copied from host, ZeRO-3 offload_param) are in the all-gather pool (1), the reduce transients
// in the reduce pool (2), where at most the LM head's 3,152,019,456 B are live on one GPU.
TEST(DeepSpeedZero3, StreamPoolsKeptApart) {
  const ScheduleInputs in = alst_deepspeed(1, 32768);
  const Workload w = build_step(in);
  SimOptions options;
  options.log_allocations = true;
  const SimResult r = simulate(w, in.hardware, options);
  AllocatorConfig config;
  config.capacity_bytes = std::int64_t{1} << 50;
  const AllocatorReplay all = replay_allocator(r.allocations, 0, config);
  std::int64_t pools_sum = 0;
  std::vector<AllocatorReplay> pools;
  for (std::uint8_t p = 0; p < kStreamPoolCount; ++p) {
    std::vector<AllocationEvent> only;
    for (const AllocationEvent& e : r.allocations) {
      if (e.stream_pool == p) {
        only.push_back(e);
      }
    }
    pools.push_back(replay_allocator(only, 0, config));
    pools_sum += pools.back().peak_reserved_bytes;
  }
  EXPECT_GE(all.peak_reserved_bytes, pools_sum);
  EXPECT_EQ(pools[2].peak_allocated_bytes, 3152019456);
  // The LM head's gathered parameters (V·h + h = 525,340,672 bf16) are in pool 1.
  bool head_in_gather_pool = false;
  for (const AllocationEvent& e : r.allocations) {
    if (e.allocate && e.key >= 0 &&
        w.names[static_cast<std::size_t>(w.tensors[static_cast<std::size_t>(e.key)].name)] ==
            "head.params") {
      head_in_gather_pool = e.stream_pool == 1;
    }
  }
  EXPECT_TRUE(head_in_gather_pool);
  EXPECT_GE(pools[1].peak_allocated_bytes, 1050681344);
}

// ZeRO-1 under Megatron-Core's DDP (megatron-core-cp): the fp32 gradients are reduce-scattered in
// place in their persistent buffer, so the reduction holds no copy; the scheme alone casts them
// into one: a block's 218,112,000 parameters × 4 bytes (Llama-3-8B).
TEST(GradientReduction, MegatronReducesTheFp32GradientsInPlace) {
  ScheduleInputs in = inputs(CpMethod::kRing, "llama3-8b", 8, 65536);
  in.parallel.ring_degree = 8;
  in.recipe.zero_stage = 1;
  in.recipe.optimizer_offload = false;
  in.recipe.checkpoint_offload = false;
  ASSERT_EQ(in.recipe.grad_bytes, 4);
  ASSERT_EQ(in.recipe.grad_reduce_bytes, 4);
  const Workload scheme = build_step(in);
  const Op* alone = first_op_named(scheme, "reduce.layer5");
  ASSERT_NE(alone, nullptr);
  EXPECT_EQ(alone->workspace_bytes, std::int64_t{218112000} * 4);
  in.parallel.implementation = "megatron-core-cp";
  const Workload megatron = build_step(in);
  const Op* in_place = first_op_named(megatron, "reduce.layer5");
  ASSERT_NE(in_place, nullptr);
  EXPECT_EQ(in_place->workspace_bytes, 0);
  EXPECT_EQ(in_place->duration_ns, alone->duration_ns);  // the same collective
  // Gradients reduced in another dtype than they accumulate in are cast: a copy again.
  in.recipe.grad_reduce_bytes = 2;
  const Workload casting = build_step(in);
  const Op* cast = first_op_named(casting, "reduce.layer5");
  ASSERT_NE(cast, nullptr);
  EXPECT_EQ(cast->workspace_bytes, std::int64_t{218112000} * 2);
}

}  // namespace
}  // namespace cpsim::sim
