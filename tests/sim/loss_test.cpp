// The loss on materialised logits as each framework runs it (Implementation::logits_loss):
// Hugging Face's upcast + log_softmax + nll_loss, and Megatron-Core's vocab-parallel
// cross-entropy under megatron-core-cp; hand-computed tensors, traffic and peaks.
#include <string>

#include <gtest/gtest.h>

#include "cpsim/sim/cost_model.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kK = 1024;

// Llama 3 8B on 8 GPUs as TP 2 × ring 4 (Megatron's p2p), 64K tokens, the logits materialised:
// s = 16384 tokens per CP rank, all of them in the vocabulary-parallel LM head, ⌈V/T⌉ = 64128
// vocabulary rows per rank, n = s · 64128 logits.
ScheduleInputs megatron_tp2_ring4() {
  ScheduleInputs in = inputs(CpMethod::kRing, "llama3-8b", 8, 64 * kK);
  in.parallel.cp_degree = 4;
  in.parallel.ring_degree = 4;
  in.parallel.tp_degree = 2;
  in.parallel.implementation = "megatron-core-cp";
  in.recipe.fused_loss = false;
  return in;
}
constexpr std::int64_t kLogits = 16384LL * 64128;

const Op* find_op(const Workload& w, const std::string& name) {
  for (const Op& op : w.ops) {
    if (op.rank == 0 && w.names[static_cast<std::size_t>(op.name)] == name) {
      return &op;
    }
  }
  return nullptr;
}

std::int64_t tensor_bytes(const Workload& w, std::int32_t edge) {
  return w.tensors[static_cast<std::size_t>(w.edges[static_cast<std::size_t>(edge)])].bytes;
}

// Rank 0's op `name`: one input and one output tensor of these sizes, no workspace; nullptr (a
// failure) when it is not there.
const Op* expect_one_in_one_out(const Workload& w,
                                const std::string& name,
                                std::int64_t input_bytes,
                                std::int64_t output_bytes) {
  const Op* op = find_op(w, name);
  EXPECT_NE(op, nullptr) << name;
  if (op == nullptr || op->inputs_end - op->inputs_begin != 1 ||
      op->outputs_end - op->outputs_begin != 1) {
    ADD_FAILURE() << name << ": not one input and one output";
    return nullptr;
  }
  EXPECT_EQ(tensor_bytes(w, op->inputs_begin), input_bytes) << name;
  EXPECT_EQ(tensor_bytes(w, op->outputs_begin), output_bytes) << name;
  EXPECT_EQ(op->workspace_bytes, 0) << name;
  return op;
}

TEST(Loss, MegatronHoldsOneFp32CopyOfTheLogits) {
  const ScheduleInputs in = megatron_tp2_ring4();
  const Workload w = build_step(in);
  // Hugging Face's chain is gone.
  EXPECT_EQ(find_op(w, "cross_entropy"), nullptr);
  EXPECT_EQ(find_op(w, "log_softmax_bwd"), nullptr);
  // Forward: the bf16 logits in, the fp32 softmax out (4 bytes per logit), no workspace.
  const Op* fwd = expect_one_in_one_out(w, "vocab_parallel_ce", 2 * kLogits, 4 * kLogits);
  ASSERT_NE(fwd, nullptr);
  EXPECT_EQ(fwd->phase, Phase::kForward);
  // Backward: the softmax (changed in place) in, the gradient cast to bf16 out.
  const Op* bwd = expect_one_in_one_out(w, "vocab_parallel_ce_bwd", 4 * kLogits, 2 * kLogits);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->phase, Phase::kBackward);
  // Traffic: forward 2 + 4 (.float()), 4 (max), 8 (-=), 8 (exp), 4 (sum), 8 (div_) = 38 bytes per
  // logit; backward 8 (mul_) + 4 + 2 (the cast) = 14.
  const CostModel cost(in.hardware, in.recipe.attention_kernel);
  EXPECT_EQ(fwd->duration_ns, seconds_to_simtime(cost.memory_bound(38 * kLogits).time_s));
  EXPECT_EQ(bwd->duration_ns, seconds_to_simtime(cost.memory_bound(14 * kLogits).time_s));
  // The planner's bound takes the same: 4 + 2 bytes per logit, against Hugging Face's 12.
  EXPECT_EQ(logits_loss_peak_bytes_per_logit(in), 6);
  ScheduleInputs hf = in;
  hf.parallel.implementation = "none";
  EXPECT_EQ(logits_loss_peak_bytes_per_logit(hf), 12);
}

// Where the loss sets the step's peak (Llama 3 8B, TP 8 on 8 GPUs at 128K, full checkpointing
// on the GPU), Megatron's loss holds 6 bytes per logit less than Hugging Face's at the backward
// peak: softmax 4 + gradient 2 against log-softmax output, its gradient and the logits' fp32
// gradient, 4 + 4 + 4; the rest of what is live there is the same.
TEST(Loss, MegatronPeakIsSixBytesPerLogitBelowHuggingFace) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 128 * kK);
  in.parallel.cp_degree = 1;
  in.parallel.tp_degree = 8;
  in.parallel.implementation = "megatron-core-cp";
  in.recipe.fused_loss = false;
  in.recipe.checkpoint_offload = false;
  const StepReport megatron = test::evaluate(in).report;
  in.parallel.implementation = "none";
  const StepReport hf = test::evaluate(in).report;
  ASSERT_NE(hf.peak_op.find("log_softmax_bwd"), std::string::npos) << hf.peak_op;
  ASSERT_NE(megatron.peak_op.find("vocab_parallel_ce"), std::string::npos) << megatron.peak_op;
  const std::int64_t logits = 128 * kK * 16032;  // ⌈128256 / 8⌉ rows per TP rank
  EXPECT_EQ(hf.peak_memory_bytes - megatron.peak_memory_bytes, 6 * logits);
}

}  // namespace
}  // namespace cpsim::sim
