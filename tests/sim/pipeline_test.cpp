// Pipeline parallelism: the schedule's counts by hand (bubble fraction, warm-up and micro-batches
// in flight on the first stage, from Megatron-Core's schedules.py), the stage's layer split, the
// P2P message and its link, and the refusals.
#include "cpsim/sim/pipeline.hpp"

#include <string>

#include <gtest/gtest.h>

#include "cpsim/sim/result.hpp"
#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using models::PipelineSchedule;
using testing::inputs;

constexpr std::int64_t kK = 1024;

// Llama 3 8B (32 blocks, h 4096) on 16 GPUs: PP 4 × TP 2 × Ulysses 2, 64K tokens.
ScheduleInputs pp4(int micro_batches) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 16, 64 * kK);
  in.parallel.cp_degree = 2;
  in.parallel.tp_degree = 2;
  in.parallel.pp_degree = 4;
  in.parallel.micro_batches = micro_batches;
  return in;
}

std::string issue_of(const ScheduleInputs& in) {
  const LayoutCheck c = check_head_layout(in);
  return c.issue ? to_string(c.issue->quantity) : "";
}

TEST(Pipeline, OneFOneBCounts) {
  const ScheduleInputs in = pp4(8);
  ASSERT_EQ(issue_of(in), "");
  const PipelineShape s = pipeline_shape(in);
  EXPECT_EQ(s.stage_layers, 8);  // 32 / 4
  // Rank 0: P − 1 = 3 warm-up forwards, then the steady state's forward: 4 = min(P, m) in flight.
  EXPECT_EQ(s.warmup_first_stage, 3);
  EXPECT_DOUBLE_EQ(s.in_flight_first_stage, 4.0);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 3.0 / 8.0);  // (P − 1)/m
  EXPECT_DOUBLE_EQ(s.step_slots, 11.0);            // m + P − 1
  EXPECT_TRUE(s.p2p_exposed);
  // Fewer micro-batches than stages: all of them are in flight.
  const PipelineShape two = pipeline_shape(pp4(2));
  EXPECT_EQ(two.warmup_first_stage, 2);
  EXPECT_DOUBLE_EQ(two.in_flight_first_stage, 2.0);
  EXPECT_DOUBLE_EQ(two.bubble_fraction, 1.5);
  EXPECT_DOUBLE_EQ(two.step_slots, 5.0);
}

TEST(Pipeline, InterleavedCounts) {
  ScheduleInputs in = pp4(8);
  in.parallel.pp_schedule = PipelineSchedule::kInterleaved;
  in.parallel.virtual_stages = 2;
  ASSERT_EQ(issue_of(in), "");
  const PipelineShape s = pipeline_shape(in);
  // Warm-up on rank 0: 2(P − 1) + (V − 1)·P = 6 + 4 = 10 chunk forwards; 11 chunks of 4 blocks
  // in flight = 5.5 micro-batches of the stage's 8 blocks.
  EXPECT_EQ(s.warmup_first_stage, 10);
  EXPECT_DOUBLE_EQ(s.in_flight_first_stage, 5.5);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 3.0 / 16.0);  // (P − 1)/(m·V)
  EXPECT_DOUBLE_EQ(s.step_slots, 9.5);              // m + (P − 1)/V
  EXPECT_FALSE(s.p2p_exposed);
}

TEST(Pipeline, P2PMessageAndLink) {
  const ScheduleInputs in = pp4(8);
  const PipelineShape s = pipeline_shape(in);
  // [s/(C·T), h] bf16 = 65536/(2·2) · 4096 · 2 bytes.
  EXPECT_EQ(s.p2p_bytes, 16384LL * 4096 * 2);
  // 16 GPUs over two 8-GPU nodes: stages 1 and 2 meet across the nodes.
  EXPECT_EQ(s.p2p_span, models::Span::kInterNode);
  ScheduleInputs one_node = in;
  one_node.parallel.gpus = 8;
  one_node.parallel.cp_degree = 1;
  EXPECT_EQ(pipeline_shape(one_node).p2p_span, models::Span::kIntraNode);
  EXPECT_GT(pipeline_p2p_s(in, s), pipeline_p2p_s(one_node, pipeline_shape(one_node)));
}

TEST(Pipeline, StageInputs) {
  const ScheduleInputs stage = pipeline_stage_inputs(pp4(8), 1);
  EXPECT_EQ(stage.model.layers, 8);
  EXPECT_EQ(stage.parallel.gpus, 4);
  EXPECT_EQ(stage.parallel.pp_degree, 1);
  EXPECT_EQ(stage.parallel.micro_batches, 1);
  // The same data-parallel degree inside the stage as in the whole job: 16/(2·2·4) = 1.
  EXPECT_EQ(stage.parallel.data_parallel(), pp4(8).parallel.data_parallel());
  EXPECT_EQ(issue_of(stage), "");
}

// The stages before the last (PipelineStage::kWithoutOutputLayer): no final norm, LM head or loss;
// the stage's output is sent on and the gradient of it received, [s/(C·T), h] bf16 = 16384 · 4096
// · 2 bytes; the model states lose the LM head's and the final norm's parameters.
TEST(Pipeline, StageWithoutTheOutputLayer) {
  const ScheduleInputs with = pipeline_stage_inputs(pp4(8), 1);
  const ScheduleInputs without =
      pipeline_stage_inputs(pp4(8), 1, PipelineStage::kWithoutOutputLayer);
  EXPECT_TRUE(with.model.has_output_layer);
  EXPECT_FALSE(without.model.has_output_layer);
  const models::ParameterCount p = models::count_parameters(without.model);
  EXPECT_EQ(p.lm_head, 0);
  EXPECT_EQ(p.final_norm, 0);
  EXPECT_EQ(p.embedding, 128256LL * 4096);
  // ZeRO-3 (alst) over the stage's 2 GPUs of each TP position: (p' + g + m + o) = 2 + 2 + 12
  // bytes per parameter of the TP rank's share; the share of the head is ⌈V/T⌉·h, of the final
  // norm h.
  const std::int64_t head_share = 64128LL * 4096 + 4096;
  EXPECT_EQ(model_states(with).gpu_bytes - model_states(without).gpu_bytes,
            (head_share + 1) / 2 * 16);
  const Workload w = build_step(without);
  int sends = 0, receives = 0;
  std::int64_t received_bytes = 0;
  for (const Op& op : w.ops) {
    const std::string& name = w.names[static_cast<std::size_t>(op.name)];
    EXPECT_NE(name, "lm_head");
    EXPECT_NE(name, "final_norm");
    EXPECT_NE(name, "fused_linear_ce");
    if (op.rank != 0) {
      continue;
    }
    sends += name == "pp_send_output" ? 1 : 0;
    if (name == "pp_recv_grad") {
      receives += 1;
      received_bytes =
          w.tensors[static_cast<std::size_t>(w.edges[static_cast<std::size_t>(op.outputs_begin)])]
              .bytes;
    }
  }
  EXPECT_EQ(sends, 1);
  EXPECT_EQ(receives, 1);
  EXPECT_EQ(received_bytes, 16384LL * 4096 * 2);
}

// What one micro-batch holds between its forward and its backward, by hand: with full
// checkpointing on the GPU, the 8 blocks' inputs [s/(C·T), h] = 16384 · 4096 · 2 bytes each (the
// first is the embedding's output), and on the last stage the last block's output, which the
// final norm's backward reads; nothing of the loss (its logits die in the forward) and nothing of
// a block's recomputation. With the checkpoints offloaded the GPU holds the first and the last
// block's only (alst keeps them).
TEST(Pipeline, ForwardSavedBytesByHand) {
  constexpr std::int64_t kBlockInput = 16384LL * 4096 * 2;
  ScheduleInputs in = pp4(8);
  in.recipe.checkpoint_offload = false;
  const Workload last = build_step(pipeline_stage_inputs(in, 1));
  EXPECT_EQ(forward_saved_bytes(last, 0), 9 * kBlockInput);
  const Workload before_last =
      build_step(pipeline_stage_inputs(in, 1, PipelineStage::kWithoutOutputLayer));
  EXPECT_EQ(forward_saved_bytes(before_last, 0), 8 * kBlockInput);
  in.recipe.checkpoint_offload = true;
  const Workload offloaded =
      build_step(pipeline_stage_inputs(in, 1, PipelineStage::kWithoutOutputLayer));
  EXPECT_EQ(forward_saved_bytes(offloaded, 0), 2 * kBlockInput);
}

TEST(Pipeline, Refusals) {
  ScheduleInputs uneven = pp4(8);
  uneven.parallel.gpus = 12;
  uneven.parallel.pp_degree = 3;  // 32 blocks over 3 stages
  EXPECT_EQ(issue_of(uneven), "pp_degree");
  ScheduleInputs chunks = pp4(8);
  chunks.parallel.pp_schedule = PipelineSchedule::kInterleaved;
  chunks.parallel.virtual_stages = 3;  // 4 · 3 = 12 chunks of 32 blocks
  EXPECT_EQ(issue_of(chunks), "pp_degree");
  ScheduleInputs few = pp4(6);  // interleaving needs m a multiple of P
  few.parallel.pp_schedule = PipelineSchedule::kInterleaved;
  few.parallel.virtual_stages = 2;
  EXPECT_EQ(issue_of(few), "pp_degree");
  ScheduleInputs virt = pp4(8);
  virt.parallel.virtual_stages = 2;  // without --pp-schedule interleaved
  EXPECT_EQ(issue_of(virt), "pp_degree");
  ScheduleInputs gpus = pp4(8);
  gpus.parallel.pp_degree = 3;
  EXPECT_EQ(issue_of(gpus), "pp_degree");
  // Implementations whose launchers do not run it refuse it, naming the quantity.
  ScheduleInputs ds = inputs(CpMethod::kUlysses, "llama3-8b", 16, 64 * kK);
  ds.parallel.cp_degree = 8;
  ds.parallel.pp_degree = 2;
  ds.parallel.implementation = "deepspeed-ulysses";
  EXPECT_EQ(issue_of(ds), "pp_degree");
  ds.parallel.implementation = "megatron-core-cp";
  EXPECT_EQ(issue_of(ds), "");
  ds.parallel.implementation = "torch-native-cp";
  ds.parallel.method = CpMethod::kRing;  // TorchTitan's CP rotates K/V
  ds.parallel.ring_degree = 8;
  EXPECT_EQ(issue_of(ds), "");
}

// Uneven stages as Megatron's --decoder-first/last-pipeline-num-layers give them: 32 blocks over
// 4 stages with 6 on the first and the last leave (32 − 12)/2 = 10 on each middle stage.
TEST(Pipeline, UnevenStagesByHand) {
  ScheduleInputs in = pp4(8);
  in.parallel.pp_first_stage_layers = 6;
  in.parallel.pp_last_stage_layers = 6;
  ASSERT_EQ(issue_of(in), "");
  PipelineShape s = pipeline_shape(in);
  EXPECT_EQ(s.first_stage_layers, 6);
  EXPECT_EQ(s.middle_stage_layers, 10);
  EXPECT_EQ(s.last_stage_layers, 6);
  EXPECT_EQ(s.stage_layers, 10);  // the simulated stage: the largest
  EXPECT_EQ(pipeline_stage_inputs(in, 1).model.layers, 10);
  // 1F1B, m = 8: rank 0 holds min(4, 8) = 4 micro-batches of 6 blocks = 2.4 of the simulated 10,
  // rank 1 min(3, 8) = 3 of 10 blocks = 3.0, rank 3 one of 6 = 0.6: rank 1 holds the most.
  EXPECT_DOUBLE_EQ(s.in_flight_first_stage, 4.0);
  EXPECT_EQ(s.memory_stage, 1);
  EXPECT_DOUBLE_EQ(s.activation_factor, 3.0);
  // The bubble and the step slots do not depend on the split: (P − 1)/m and m + P − 1.
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 3.0 / 8.0);
  EXPECT_DOUBLE_EQ(s.step_slots, 11.0);
  // Interleaved, V = 2 (6, 10 and 6 all even): rank 0 warms up 2·3 + 1·4 = 10 chunks, holds 11
  // chunks of 3 blocks = 3.3 stages of 10; rank 1 2·2 + 4 = 8, 9 chunks of 5 blocks = 4.5.
  in.parallel.pp_schedule = PipelineSchedule::kInterleaved;
  in.parallel.virtual_stages = 2;
  ASSERT_EQ(issue_of(in), "");
  s = pipeline_shape(in);
  EXPECT_DOUBLE_EQ(s.in_flight_first_stage, 5.5);
  EXPECT_EQ(s.memory_stage, 1);
  EXPECT_DOUBLE_EQ(s.activation_factor, 4.5);
  // Only the first stage given: the other 3 split 26 — not evenly: refused; 29 = 3 · 9 + 2 fits.
  ScheduleInputs first_only = pp4(8);
  first_only.parallel.pp_first_stage_layers = 6;
  EXPECT_EQ(issue_of(first_only), "pp_degree");
  first_only.parallel.pp_first_stage_layers = 5;
  ASSERT_EQ(issue_of(first_only), "");
  s = pipeline_shape(first_only);
  EXPECT_EQ(s.first_stage_layers, 5);
  EXPECT_EQ(s.middle_stage_layers, 9);
  EXPECT_EQ(s.last_stage_layers, 9);
  // Refusals: middle blocks not splitting, a stage's blocks not divisible by V, no PP.
  ScheduleInputs odd = pp4(8);
  odd.parallel.pp_first_stage_layers = 7;
  odd.parallel.pp_last_stage_layers = 6;  // 19 over 2 middle stages
  EXPECT_EQ(issue_of(odd), "pp_degree");
  ScheduleInputs v4 = in;
  v4.parallel.virtual_stages = 4;  // 6 blocks do not split into 4 chunks
  EXPECT_EQ(issue_of(v4), "pp_degree");
  ScheduleInputs none = pp4(8);
  none.parallel.pp_degree = 1;
  none.parallel.gpus = 4;
  none.parallel.pp_first_stage_layers = 4;
  EXPECT_EQ(issue_of(none), "pp_degree");
}

TEST(Pipeline, DegreeOneIsNoPipeline) {
  ScheduleInputs in = pp4(8);
  in.parallel.pp_degree = 1;
  in.parallel.gpus = 4;
  EXPECT_FALSE(check_pipeline(in).has_value());
  const PipelineShape s = pipeline_shape(in);
  EXPECT_DOUBLE_EQ(s.bubble_fraction, 0.0);
  EXPECT_DOUBLE_EQ(s.step_slots, 8.0);
  EXPECT_DOUBLE_EQ(s.in_flight_first_stage, 1.0);
}

}  // namespace
}  // namespace cpsim::sim
