// Mixture-of-experts MLPs (models::MoeSpec, step_experts.cpp): expert bytes per rank under
// expert parallelism, the dispatch all-to-all's bytes, what a block keeps for the backward, the
// template-built step against the block-by-block build, and the refusals, each by hand.
#include <cstdint>
#include <string>

#include <gtest/gtest.h>

#include "cpsim/models/transformer.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/pipeline.hpp"
#include "cpsim/sim/schedule.hpp"

#include "block_oracle.hpp"
#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::first_op_named;
using testing::inputs;
using testing::ops_named;
using testing::refusal;
using testing::tensor_bytes;

constexpr std::int64_t kSeq = 64 * 1024;

// qwen3-30b-a3b (128 experts of 768, 8 per token, h 2048, 48 layers) under the method's scheme
// alone, its MLP untiled.
ScheduleInputs moe_inputs(int ep, CpMethod method = CpMethod::kRing) {
  ScheduleInputs in = inputs(method, "qwen3-30b-a3b", 8, kSeq);
  in.recipe.tiled_mlp = false;
  in.parallel.ep_degree = ep;
  if (method == CpMethod::kRing) {
    in.parallel.ring_degree = 8;
  }
  return in;
}

TEST(Experts, ParametersCountEveryExpertAndTheRouter) {
  const models::TransformerSpec m = inputs(CpMethod::kRing, "qwen3-30b-a3b", 8, kSeq).model;
  const models::ParameterCount p = models::count_parameters(m);
  // 128 · 3 · 2048 · 768 expert weights and a 2048 × 128 router per layer.
  EXPECT_EQ(p.experts_per_layer, 603'979'776);
  EXPECT_EQ(p.mlp_per_layer, 603'979'776 + 262'144);
  // Model FLOPs count the router and the 8 experts a token goes through, not all 128.
  models::TransformerSpec dense = m;
  dense.moe = {};
  dense.ffn_hidden = 8 * 768;  // a dense MLP as wide as the 8 experts together
  const double router_flops = 6.0 * kSeq * 48 * 2048 * 128;
  EXPECT_DOUBLE_EQ(models::model_step_flops(m, kSeq).dense,
                   models::model_step_flops(dense, kSeq).dense + router_flops);
}

TEST(Experts, ExpertParallelismHoldsAShareOfTheExpertsPerRank) {
  // ZeRO-0 keeps every parameter unsharded: EP 8 leaves 1/8 of the experts on a rank.
  ScheduleInputs one = moe_inputs(1);
  one.recipe.zero_stage = 0;
  one.recipe.optimizer_offload = false;
  one.recipe.param_offload = false;
  ScheduleInputs eight = one;
  eight.parallel.ep_degree = 8;
  const std::int64_t per_param = one.recipe.param_bytes + one.recipe.grad_bytes +
                                 one.recipe.master_param_bytes + one.recipe.optimizer_state_bytes;
  const std::int64_t experts = 48 * std::int64_t{603'979'776};
  EXPECT_EQ(model_states(one).gpu_bytes - model_states(eight).gpu_bytes,
            experts / 8 * 7 * per_param);
  // ZeRO-3 shards every parameter over the 8 ranks either way: the experts over the 8 / 8 ranks
  // that hold the same ones, the rest over all 8.
  one.recipe.zero_stage = 3;
  eight.recipe.zero_stage = 3;
  EXPECT_EQ(model_states(one).gpu_bytes, model_states(eight).gpu_bytes);
  // ...and a block gathers its other parameters and its rank's 16 experts only.
  const Workload w = build_step(eight);
  const models::ParameterCount p = models::count_parameters(eight.model);
  EXPECT_EQ(tensor_bytes(w, "layer0.params"),
            (p.per_layer - p.experts_per_layer * 7 / 8) * eight.recipe.param_bytes);
  EXPECT_EQ(ops_named(w, "allgather.experts0"), 1 + 1);  // forward, and again for the backward
}

TEST(Experts, DispatchSendsEachTokenCopyToItsExpertsRank) {
  ScheduleInputs in = moe_inputs(8);
  const std::int64_t s = kSeq / 8, k = 8, h = 2048, a = in.recipe.activation_bytes;
  {
    const Workload w = build_step(in);
    const Op* dispatch = first_op_named(w, "moe_dispatch");
    ASSERT_NE(dispatch, nullptr);
    const Collective& c = w.collectives[static_cast<std::size_t>(dispatch->collective)];
    EXPECT_EQ(c.kind, models::Collective::kAllToAll);
    EXPECT_EQ(c.size_bytes, s * k * h * a);  // balanced: s·k copies of [h] out and in
    EXPECT_EQ(tensor_bytes(w, "moe_dispatch"), s * k * h * a);
    // Forward, recomputation (full checkpointing): dispatch and combine; backward: both again.
    EXPECT_EQ(ops_named(w, "moe_dispatch"), 2 * 48);
    EXPECT_EQ(ops_named(w, "moe_combine"), 2 * 48);
    EXPECT_EQ(ops_named(w, "moe_dispatch_bwd"), 48);
    EXPECT_EQ(ops_named(w, "moe_combine_bwd"), 48);
  }
  // The busiest rank receives 1.25 × the balanced share: its buffer and its experts' rows grow.
  in.parallel.expert_imbalance = 1.25;
  const Workload w = build_step(in);
  const std::int64_t rows = s * k * 5 / 4;
  EXPECT_EQ(tensor_bytes(w, "moe_dispatch"), rows * h * a);
  EXPECT_EQ(tensor_bytes(w, "gate_up"), rows * 2 * 768 * a);
  const Op* dispatch = first_op_named(w, "moe_dispatch");
  ASSERT_NE(dispatch, nullptr);
  EXPECT_EQ(w.collectives[static_cast<std::size_t>(dispatch->collective)].size_bytes, rows * h * a);
  // Without EP no token leaves its rank.
  EXPECT_EQ(ops_named(build_step(moe_inputs(1)), "moe_dispatch"), 0);
}

// Activation bytes a step keeps at its peak with every block's tensors kept, minus those of the
// same model with a dense MLP of the experts' width: L × what an MoE block keeps beyond it.
std::int64_t kept_beyond_dense(ScheduleInputs moe) {
  moe.recipe.checkpointing = models::CheckpointMode::kNone;
  moe.recipe.checkpoint_offload = false;
  ScheduleInputs dense = moe;
  dense.model.moe = {};
  dense.model.ffn_hidden = moe.model.moe.expert_ffn_hidden;
  dense.model.activation = models::ActivationKind::kSwiGlu;  // a clamped GLU is experts' only
  const auto activations = static_cast<std::size_t>(MemCategory::kActivations);
  return test::evaluate(moe).report.category_peak[activations] -
         test::evaluate(dense).report.category_peak[activations];
}

TEST(Experts, ABlockKeepsTheRouterAndTheExpertsInputsAndOutputs) {
  // Beyond the dense MLP's [s, ...] tensors: those tensors for k·s rows instead of s, the
  // router's fp32 probabilities, the top-k indices (int64) and cast weights, the fp32 weights and
  // sum of the renormalisation (Qwen3-30B-A3B's norm_topk_prob), and the experts' input and
  // output [k·s, h]. tests/models/test_hf_models.py checks the same sum against the saved tensors
  // of transformers' own block, traced.
  ScheduleInputs moe = moe_inputs(1, CpMethod::kUlysses);
  const std::int64_t s = kSeq / 8, k = 8, h = 2048, f = 768, e = 128;
  const std::int64_t a = moe.recipe.activation_bytes;
  const Workload w = build_step(moe);
  EXPECT_EQ(tensor_bytes(w, "router_probs"), s * e * 4);
  EXPECT_EQ(tensor_bytes(w, "routing"), s * k * (8 + a) + (s * k + s) * 4);
  EXPECT_EQ(tensor_bytes(w, "moe_permuted"), s * k * h * a);
  EXPECT_EQ(tensor_bytes(w, "moe_expert_out"), s * k * h * a);
  const auto mlp_rows = [&](const ScheduleInputs& in) {
    const std::int64_t silu = in.recipe.mlp_kernel == models::MlpKernel::kEager ? 1 : 0;
    return (2 + 1 + silu) * f * a;  // gate/up, product, silu(gate)
  };
  const std::int64_t common = (s * k - s) * mlp_rows(moe) + s * e * 4 + s * k * (8 + a) +
                              (s * k + s) * 4 + 2 * s * k * h * a;
  EXPECT_EQ(kept_beyond_dense(moe), 48 * common);

  // The Hugging Face block under DeepSpeed's wrapper also keeps its weighted outputs [k·s, h]
  // and two int64 indices per copy.
  ScheduleInputs hf = moe;
  hf.model.kv_heads = 8;
  hf.parallel.implementation = "deepspeed-ulysses";
  hf.recipe.mlp_kernel = models::MlpKernel::kEager;
  const std::int64_t hf_block = (s * k - s) * mlp_rows(hf) + s * e * 4 + s * k * (8 + a + 16) +
                                (s * k + s) * 4 + 3 * s * k * h * a;
  EXPECT_EQ(kept_beyond_dense(hf), 48 * hf_block);

  // Megatron-Core weights the rows inside the experts (no combined outputs), keeps its scores as
  // [E, s] probabilities in bf16 with a boolean map, and 12 more bytes per copy
  // (tests/models/test_megatron_moe.py traces the same sum from its MoELayer).
  ScheduleInputs megatron = moe;
  megatron.model.kv_heads = 8;
  megatron.parallel.implementation = "megatron-core-cp";
  const std::int64_t megatron_block =
      (s * k - s) * mlp_rows(megatron) + s * e * (a + 1) + s * k * (8 + a + 12) + s * k * h * a;
  EXPECT_EQ(kept_beyond_dense(megatron), 48 * megatron_block);

  // TorchTitan (torch-native-cp): the gate's fp32 input copy, fp32 scores, 32 bytes per copy and
  // 4 per token of routing, the experts' eager SwiGLU (silu kept whatever the recipe's kernel),
  // the experts' input and the combined outputs in fp32 (tests/models/test_titan_moe.py).
  ScheduleInputs titan = moe;
  titan.parallel.method = CpMethod::kRing;
  titan.parallel.ring_degree = 8;
  titan.parallel.implementation = "torch-native-cp";
  const std::int64_t dense_silu = titan.recipe.mlp_kernel == models::MlpKernel::kEager ? 1 : 0;
  const std::int64_t titan_block = s * k * 4 * f * a - s * (3 + dense_silu) * f * a + s * e * 4 +
                                   s * k * 32 + s * 4 + s * h * 4 + s * k * h * a + s * k * h * 4;
  EXPECT_EQ(kept_beyond_dense(titan), 48 * titan_block);

  // gpt-oss's clamped GLU under Megatron-Core keeps one more gate/up [k·s, 2f] per block: the
  // clamps' input beside the fused GLU's clamped copy (tests/models/test_megatron_moe.py).
  ScheduleInputs clamped = megatron;
  clamped.model.activation = models::ActivationKind::kClampedQuickGeGlu;
  EXPECT_EQ(kept_beyond_dense(clamped) - kept_beyond_dense(megatron), 48 * s * k * 2 * f * a);

  // A shared expert of width f_s behind a sigmoid gate (Qwen2-MoE's, Megatron-Core's
  // SharedExpertMLP): its gated MLP's tensors over the s tokens, and for the gate's product its
  // output [s, h] and score [s, 1] (tests/models/test_megatron_moe.py traces the same bytes).
  ScheduleInputs shared = megatron;
  const std::int64_t fs = 1536;
  shared.model.moe.shared_ffn_hidden = fs;
  shared.model.moe.shared_gate = true;
  const std::int64_t silu = shared.recipe.mlp_kernel == models::MlpKernel::kEager ? 1 : 0;
  const std::int64_t shared_block = s * (3 + silu) * fs * a + s * (h + 1) * a;
  EXPECT_EQ(kept_beyond_dense(shared) - kept_beyond_dense(megatron), 48 * shared_block);
  shared.model.moe.shared_gate = false;
  EXPECT_EQ(kept_beyond_dense(shared) - kept_beyond_dense(megatron), 48 * s * (3 + silu) * fs * a);
}

TEST(Experts, TheHuggingFaceLoopIssuesItsTracedCallsAndWaitsPerExpert) {
  // Qwen3-30B-A3B (128 experts, renormalised) under DeepSpeed's wrapper: the block's forward
  // makes 14 + 12·128 + 3 framework calls, its backward 6 + 20·128 + 7 (kHuggingFaceExperts,
  // traced in tests/models/test_hf_models.py), and the host waits for the experts' last op.
  ScheduleInputs hf = moe_inputs(1, CpMethod::kUlysses);
  hf.model.kv_heads = 8;
  hf.parallel.implementation = "deepspeed-ulysses";
  const Workload w = build_step(hf);
  const Op* router = first_op_named(w, "moe_router");
  const Op* down = first_op_named(w, "mlp_down");
  const Op* backward = first_op_named(w, "moe_unpermute_bwd");
  ASSERT_NE(router, nullptr);
  ASSERT_NE(down, nullptr);
  ASSERT_NE(backward, nullptr);
  EXPECT_EQ(router->host_calls, 14 + 12 * 128 + 3);
  EXPECT_EQ(down->host_calls, 0);
  EXPECT_TRUE(down->host_sync);
  EXPECT_EQ(backward->host_calls, 6 + 20 * 128 + 7);
  // The grouped experts of Megatron-Core's and TorchTitan's blocks: one call per kernel.
  ScheduleInputs none = moe_inputs(1, CpMethod::kUlysses);
  const Workload scheme = build_step(none);
  EXPECT_EQ(first_op_named(scheme, "moe_router")->host_calls, 1);
  EXPECT_FALSE(first_op_named(scheme, "mlp_down")->host_sync);
}

TEST(Experts, RepeatedBlocksEqualBlocksBuiltOneByOne) {
  test::expect_repeated_blocks_equal_oracle(moe_inputs(1, CpMethod::kUlysses));
  test::expect_repeated_blocks_equal_oracle(moe_inputs(8));
  ScheduleInputs zero1 = moe_inputs(4);
  zero1.recipe.zero_stage = 1;
  zero1.recipe.checkpointing = models::CheckpointMode::kSelective;
  test::expect_repeated_blocks_equal_oracle(zero1);
  ScheduleInputs hf = moe_inputs(1, CpMethod::kUlysses);  // its calls and syncs rewritten
  hf.model.kv_heads = 8;
  hf.parallel.implementation = "deepspeed-ulysses";
  test::expect_repeated_blocks_equal_oracle(hf);
  ScheduleInputs shared = moe_inputs(4);  // a gated shared expert under Megatron-Core
  shared.model.kv_heads = 8;
  shared.parallel.implementation = "megatron-core-cp";
  shared.model.moe.shared_ffn_hidden = 1024;
  shared.model.moe.shared_gate = true;
  test::expect_repeated_blocks_equal_oracle(shared);
  shared.recipe.checkpointing = models::CheckpointMode::kFull;
  test::expect_repeated_blocks_equal_oracle(shared);
}

TEST(Experts, WhatIsNotModelledIsRefused) {
  ScheduleInputs dense_ep = inputs(CpMethod::kRing, "llama3-8b", 8, kSeq);
  dense_ep.parallel.ring_degree = 8;
  dense_ep.parallel.ep_degree = 2;
  EXPECT_EQ(refusal(dense_ep), Quantity::kExpertParallel);  // no experts to split
  ScheduleInputs odd = moe_inputs(3);
  EXPECT_EQ(refusal(odd), Quantity::kExpertParallel);  // 3 divides neither 128 nor 8
  ScheduleInputs tiled = moe_inputs(1);
  tiled.recipe.tiled_mlp = true;
  EXPECT_EQ(refusal(tiled), Quantity::kExperts);
  ScheduleInputs offload = moe_inputs(8);
  offload.recipe.optimizer_offload = true;
  EXPECT_EQ(refusal(offload), Quantity::kExpertParallel);
  ScheduleInputs imbalance = moe_inputs(8);
  imbalance.parallel.expert_imbalance = 0.5;
  EXPECT_EQ(refusal(imbalance), Quantity::kExpertImbalance);
  // An implementation that runs every expert on each rank refuses EP; one not read refuses all.
  ScheduleInputs hf = moe_inputs(8, CpMethod::kUlysses);
  hf.model.kv_heads = 8;  // yunchang-usp splits the KV heads over the Ulysses degree
  hf.parallel.implementation = "yunchang-usp";
  EXPECT_EQ(refusal(hf), Quantity::kExpertParallel);
  hf.parallel.ep_degree = 1;
  EXPECT_NO_THROW((void)build_step(hf));
  // A clamped GLU: where the experts' handling of it was not read (the Hugging Face block's), and
  // outside experts.
  hf.model.activation = models::ActivationKind::kClampedQuickGeGlu;
  EXPECT_EQ(refusal(hf), Quantity::kExperts);
  ScheduleInputs clamped_dense = dense_ep;
  clamped_dense.parallel.ep_degree = 1;
  clamped_dense.model.activation = models::ActivationKind::kClampedQuickGeGlu;
  EXPECT_EQ(refusal(clamped_dense), Quantity::kExperts);
  // A shared expert where the implementation's handling of one was not read.
  ScheduleInputs titan_shared = moe_inputs(1);
  titan_shared.parallel.implementation = "torch-native-cp";
  titan_shared.model.moe.shared_ffn_hidden = 1024;
  EXPECT_EQ(refusal(titan_shared), Quantity::kExperts);
  ScheduleInputs upipe = moe_inputs(1, CpMethod::kUPipe);
  upipe.model.kv_heads = 8;
  upipe.parallel.implementation = "untied-ulysses-upipe";
  EXPECT_EQ(refusal(upipe), Quantity::kExperts);
}

// Dense layers among the sparse ones (Qwen's mlp_only_layers, Llama 4's moe_layers): each block
// gathers, keeps and reduces its own parameters, runs its own MLP, and the model states count each
// kind's parameters; pipeline stages of such layers are refused.
TEST(Experts, DenseLayersAmongSparseOnesHoldTheirOwnParameters) {
  ScheduleInputs mixed = moe_inputs(8);
  mixed.model.ffn_hidden = 6144;  // the dense layers' MLP
  for (std::int64_t l = 0; l < mixed.model.layers; ++l) {
    mixed.model.layer_mlp.push_back(l % 2 == 0 ? models::LayerMlp::kDense
                                               : models::LayerMlp::kExperts);
  }
  const models::ParameterCount p = models::count_parameters(mixed.model);
  EXPECT_EQ(p.dense_layers, 24);
  EXPECT_EQ(p.per_layer - p.dense_per_layer, 603'979'776 + 262'144 - 3LL * 2048 * 6144);
  const Workload w = build_step(mixed);
  const std::int64_t b = mixed.recipe.param_bytes;
  EXPECT_EQ(tensor_bytes(w, "layer0.params"), p.dense_per_layer * b);
  EXPECT_EQ(tensor_bytes(w, "layer1.params"), (p.per_layer - p.experts_per_layer * 7 / 8) * b);
  EXPECT_EQ(ops_named(w, "allgather.experts1"), 2);
  EXPECT_EQ(ops_named(w, "allgather.experts0"), 0);
  EXPECT_EQ(ops_named(w, "moe_router"), 24 * 2);  // forward and recomputation of 24 blocks
  // ZeRO-0: the states hold every dense layer and 1/8 of each sparse layer's experts.
  ScheduleInputs unsharded = mixed;
  unsharded.recipe.zero_stage = 0;
  unsharded.recipe.optimizer_offload = false;
  unsharded.recipe.param_offload = false;
  const std::int64_t per_param = unsharded.recipe.param_bytes + unsharded.recipe.grad_bytes +
                                 unsharded.recipe.master_param_bytes +
                                 unsharded.recipe.optimizer_state_bytes;
  const std::int64_t held = p.total - 24 * (p.experts_per_layer - p.experts_per_layer / 8);
  EXPECT_EQ(model_states(unsharded).gpu_bytes, held * per_param);
  // Pipeline stages are simulated with experts in every layer: an upper bound here, where a
  // sparse layer holds more parameters per rank (16 experts of 3·2048·768 and the router against
  // 3·2048·6144) and as wide MLPs per token (8·768 against 6144); refused where a dense layer is
  // wider.
  ScheduleInputs staged = mixed;
  staged.parallel.pp_degree = 2;
  staged.parallel.micro_batches = 2;
  staged.parallel.cp_degree = 4;
  staged.parallel.ring_degree = 4;
  staged.parallel.ep_degree = 4;
  const LayoutCheck stages = check_head_layout(staged);
  EXPECT_FALSE(stages.issue) << stages.issue->message;
  ScheduleInputs stage = pipeline_stage_inputs(staged, 2, PipelineStage::kWithOutputLayer);
  EXPECT_TRUE(stage.model.layer_mlp.empty());
  staged.model.ffn_hidden = 8192;
  EXPECT_EQ(refusal(staged), Quantity::kPpDegree);
}

// gpt-oss-120b's sinks: Megatron-Core runs them through TransformerEngine's learnable softmax
// with cp_comm_type a2a only, on cuDNN's fused kernel; the Hugging Face and yunchang kernels take
// none, TorchTitan's FlexAttention path is not modelled.
TEST(AttentionSinks, RunWhereTheImplementationsKernelTakesThem) {
  ScheduleInputs a2a = inputs(CpMethod::kUlysses, "gpt-oss-120b", 8, kSeq);
  a2a.parallel.implementation = "megatron-core-cp";
  a2a.parallel.ep_degree = 8;
  a2a.recipe.tiled_mlp = false;
  const LayoutCheck checked = check_head_layout(a2a);
  ASSERT_FALSE(checked.issue) << checked.issue->message;
  EXPECT_EQ(checked.implementation->attention_kernel(a2a), "cudnn");
  for (const char* impl : {"deepspeed-ulysses", "yunchang-usp"}) {
    ScheduleInputs other = a2a;
    other.parallel.implementation = impl;
    other.parallel.ep_degree = 1;
    EXPECT_EQ(refusal(other), Quantity::kAttentionSinks) << impl;
  }
  ScheduleInputs no_sinks = a2a;
  no_sinks.model.attention_sinks = false;
  no_sinks.parallel.implementation = "deepspeed-ulysses";
  no_sinks.parallel.ep_degree = 1;
  EXPECT_NE(check_head_layout(no_sinks).issue.value_or(ConfigIssue{}).quantity,
            Quantity::kAttentionSinks);
  // Megatron's ring (p2p) is refused by its window first; without windows, by its sinks.
  ScheduleInputs ring = a2a;
  ring.parallel.method = CpMethod::kRing;
  ring.parallel.ring_degree = 8;
  ring.model.layer_attention.clear();
  EXPECT_EQ(refusal(ring), Quantity::kAttentionSinks);
}

}  // namespace
}  // namespace cpsim::sim
