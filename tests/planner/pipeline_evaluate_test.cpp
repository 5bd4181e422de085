// A pipeline-parallel step composed from its stage's simulations: the step time from one and two
// micro-batches on the stage, the schedule's slots and the exposed P2P; the first stage's extra
// in-flight activations; tokens and model FLOPs of the whole job; refusals.
#include <gtest/gtest.h>

#include "cpsim/models/io.hpp"
#include "cpsim/planner/evaluate.hpp"
#include "cpsim/sim/pipeline.hpp"

namespace cpsim::planner {
namespace {

const models::DataDir kData{CPSIM_TEST_DATA_DIR};
constexpr std::int64_t kK = 1024;

// Llama 3 8B on 16 H100s: PP 4 × TP 2 × Ulysses 2, 64K tokens, the scheme alone.
sim::ScheduleInputs pp4(int micro_batches) {
  sim::ScheduleInputs in;
  in.model = models::load_model("llama3-8b", kData);
  in.hardware = models::load_hardware("h100-sxm-80g", kData);
  in.recipe = models::load_recipe("alst", kData);
  in.parallel.method = models::CpMethod::kUlysses;
  in.parallel.implementation = "none";
  in.parallel.gpus = 16;
  in.parallel.gpus_per_node = 8;
  in.parallel.cp_degree = 2;
  in.parallel.tp_degree = 2;
  in.parallel.pp_degree = 4;
  in.parallel.micro_batches = micro_batches;
  in.parallel.seq_len = 64 * kK;
  return in;
}

// The stage before the last (no LM head and loss), one micro-batch, with what a micro-batch holds
// between its forward and its backward measured.
sim::StepReport first_stage_run(const sim::ScheduleInputs& in) {
  EvaluateOptions measured;
  measured.measure_forward_saved = true;
  return evaluate(sim::pipeline_stage_inputs(in, 1, sim::PipelineStage::kWithoutOutputLayer),
                  measured)
      .report;
}

TEST(PipelineEvaluate, OneFOneBStepFromTheStage) {
  sim::ScheduleInputs in = pp4(8);
  in.recipe.checkpoint_offload = false;  // every block input held on the GPU
  const sim::StepReport rep = evaluate(in).report;
  const sim::StepReport one = evaluate(sim::pipeline_stage_inputs(in, 1)).report;
  const sim::StepReport two = evaluate(sim::pipeline_stage_inputs(in, 2)).report;
  const double t_mb = two.step_time_s - one.step_time_s;
  const double t_end = one.step_time_s - t_mb;
  const double send = sim::pipeline_p2p_s(in, sim::pipeline_shape(in));
  ASSERT_GT(t_mb, 0.0);
  ASSERT_GT(send, 0.0);
  // (m + P − 1) = 11 slots of one micro-batch plus two blocking transfers, then the step's end.
  EXPECT_NEAR(rep.step_time_s, 11.0 * (t_mb + 2.0 * send) + t_end, 1e-9 * rep.step_time_s);
  EXPECT_DOUBLE_EQ(rep.pipeline.bubble_fraction, 3.0 / 8.0);
  // min(P, m) = 4 micro-batches in flight on the first stage, three more than its run (the stage
  // without the LM head) holds, each what a micro-batch holds from its forward to its backward;
  // the last stage holds one (1F1B). Here the first stage binds.
  const sim::StepReport first = first_stage_run(in);
  ASSERT_GT(first.forward_saved_bytes, 0);
  const std::int64_t extra = 3 * first.forward_saved_bytes;
  ASSERT_LT(first.gpu_headroom_bytes - extra, one.gpu_headroom_bytes);
  EXPECT_EQ(rep.pipeline_in_flight_extra_bytes, extra);
  EXPECT_EQ(rep.peak_memory_bytes, first.peak_memory_bytes + extra);
  EXPECT_EQ(rep.gpu_headroom_bytes, first.gpu_headroom_bytes - extra);
  EXPECT_EQ(rep.pipeline_peak_stage, "the first pipeline stage (4 micro-batches in flight)");
  // Tokens and model FLOPs of the whole job: m sequences per data-parallel replica (DP 1).
  EXPECT_EQ(rep.tokens_per_step, 8 * 64 * kK);
  EXPECT_DOUBLE_EQ(rep.model_flops_per_step,
                   8.0 * models::model_step_flops(in.model, in.parallel.seq_len).total());
}

TEST(PipelineEvaluate, InterleavedHidesTransfersAndShrinksTheBubble) {
  sim::ScheduleInputs in = pp4(8);
  in.recipe.checkpoint_offload = false;
  const double plain = evaluate(in).report.step_time_s;
  in.parallel.pp_schedule = models::PipelineSchedule::kInterleaved;
  in.parallel.virtual_stages = 2;
  const sim::StepReport rep = evaluate(in).report;
  const sim::StepReport one = evaluate(sim::pipeline_stage_inputs(in, 1)).report;
  const sim::StepReport two = evaluate(sim::pipeline_stage_inputs(in, 2)).report;
  const double t_mb = two.step_time_s - one.step_time_s;
  const double send = sim::pipeline_p2p_s(in, sim::pipeline_shape(in));
  ASSERT_LT(4.0 * send, t_mb);  // the transfers fit under the next chunk: none exposed
  EXPECT_NEAR(rep.step_time_s, 9.5 * t_mb + (one.step_time_s - t_mb), 1e-9 * rep.step_time_s);
  EXPECT_LT(rep.step_time_s, plain);
  // 5.5 micro-batches' activations in flight on the first stage: 4.5 more than simulated.
  const sim::StepReport first = first_stage_run(in);
  EXPECT_NEAR(static_cast<double>(rep.pipeline_in_flight_extra_bytes),
              4.5 * static_cast<double>(first.forward_saved_bytes), 1.0);
}

// The last stage's loss is held by the micro-batch that runs it, not by those in flight on the
// first stage: Llama 3 70B at 128K on 32 GPUs as TP 8 × PP 4 with 4 micro-batches, Megatron's
// loss on materialised logits (16032 vocabulary rows per TP rank: 8 GB of logits and their fp32
// softmax), ZeRO-1 and full checkpointing on the GPU. The step's peak is the larger of the first
// stage's (its run plus three micro-batches' block inputs) and the last stage's (its run, loss
// included, with one).
TEST(PipelineEvaluate, TheLossIsNotHeldByTheMicroBatchesInFlight) {
  sim::ScheduleInputs in;
  in.model = models::load_model("llama3-70b", kData);
  in.hardware = models::load_hardware("h100-sxm-80g", kData);
  in.recipe = models::load_recipe("alst", kData);
  in.recipe.zero_stage = 1;
  in.recipe.checkpoint_offload = false;
  in.recipe.tiled_mlp = false;
  in.recipe.fused_loss = false;
  in.parallel.method = models::CpMethod::kUlysses;
  in.parallel.implementation = "megatron-core-cp";
  in.parallel.gpus = 32;
  in.parallel.gpus_per_node = 8;
  in.parallel.cp_degree = 1;
  in.parallel.tp_degree = 8;
  in.parallel.pp_degree = 4;
  in.parallel.micro_batches = 4;
  in.parallel.seq_len = 128 * kK;
  const sim::StepReport rep = evaluate(in).report;
  const sim::StepReport first = first_stage_run(in);
  const sim::StepReport last = evaluate(sim::pipeline_stage_inputs(in, 1)).report;
  // The 20 blocks' inputs (the first is the embedding's output): 20 · [16384, 8192] bf16.
  EXPECT_EQ(first.forward_saved_bytes, 20LL * 16384 * 8192 * 2);
  const std::int64_t first_peak = first.peak_memory_bytes + 3 * first.forward_saved_bytes;
  EXPECT_EQ(rep.peak_memory_bytes, std::max(first_peak, last.peak_memory_bytes));
  // Counting the loss's tensors into each micro-batch in flight would add three times the logits
  // and the softmax (6 bytes per logit) to the first stage's peak, and no stage holds that.
  EXPECT_LT(rep.peak_memory_bytes, last.peak_memory_bytes + 3 * 6 * 128 * kK * 16032);
  EXPECT_TRUE(rep.fits_gpu) << rep.binding;
}

TEST(PipelineEvaluate, RefusedConfigurationsThrow) {
  sim::ScheduleInputs in = pp4(8);
  in.parallel.implementation = "deepspeed-ulysses";
  EXPECT_THROW(evaluate(in), sim::ConfigError);
  in = pp4(8);
  in.parallel.gpus = 12;
  in.parallel.pp_degree = 3;
  try {
    evaluate(in);
    FAIL() << "32 blocks over 3 stages were accepted";
  } catch (const sim::ConfigError& e) {
    EXPECT_EQ(e.quantity(), sim::Quantity::kPpDegree);
  }
}

}  // namespace
}  // namespace cpsim::planner
