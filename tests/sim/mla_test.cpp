// Multi-head latent attention (models::MlaSpec; attention_mla.cpp): the parameters by hand, what a
// block keeps and exchanges with value heads narrower than the query's, the attention FLOPs, who
// runs it, and the template-built step against the block-by-block build.
#include <cstdint>

#include <gtest/gtest.h>

#include "cpsim/models/transformer.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

#include "block_oracle.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::first_op_named;
using testing::inputs;
using testing::refusal;
using testing::tensor_bytes;

constexpr std::int64_t kSeq = 64 * 1024;
constexpr std::int64_t kHeads = 32, kQkDim = 192, kVDim = 128, kRope = 64;
constexpr std::int64_t kQRank = 1536, kKvRank = 512;

// llama3-8b's block with DeepSeek-V3's attention widths: 32 heads of q/k 128 + 64 RoPE and v 128,
// q and kv latents of 1536 and 512.
ScheduleInputs mla_inputs(CpMethod method, const char* impl = "megatron-core-cp") {
  ScheduleInputs in = inputs(method, "llama3-8b", 8, kSeq);
  in.model.kv_heads = kHeads;
  in.model.head_dim = kQkDim;
  in.model.v_head_dim = kVDim;
  in.model.mla = {kQRank, kKvRank, kRope};
  in.model.validate();
  in.recipe.tiled_mlp = false;
  in.parallel.implementation = impl;
  if (method == CpMethod::kRing) {
    in.parallel.ring_degree = 8;
  }
  if (method == CpMethod::kUsp) {
    in.parallel.ring_degree = 2;
  }
  return in;
}

TEST(LatentAttention, DeepSeekV3sParametersByHand) {
  const models::TransformerSpec m = inputs(CpMethod::kRing, "deepseek-v3", 8, kSeq).model;
  ASSERT_TRUE(m.is_mla());
  EXPECT_EQ(m.head_dim, 192);
  EXPECT_EQ(m.value_head_dim(), 128);
  const models::ParameterCount p = models::count_parameters(m);
  // W_qa 7168·1536 + its norm 1536 + W_qb 1536·128·192 + W_kva 7168·(512 + 64) + its norm 512
  // + W_kvb 512·128·(128 + 128) + W_o 128·128·7168.
  EXPECT_EQ(p.attention_per_layer,
            11'010'048 + 1'536 + 37'748'736 + 4'128'768 + 512 + 16'777'216 + 117'440'512);
  // 256 routed experts and one shared of 3·7168·2048 each, a router 7168 × 256.
  EXPECT_EQ(p.mlp_per_layer, 257 * std::int64_t{44'040'192} + 1'835'008);
  EXPECT_EQ(p.dense_layers, 3);
  EXPECT_EQ(p.dense_per_layer, p.attention_per_layer + 2 * 7168 + 3 * 7168 * std::int64_t{18432});
  EXPECT_EQ(p.total,
            58 * p.per_layer + 3 * p.dense_per_layer + 2 * 129'280 * std::int64_t{7168} + 7168);
  // The attention core: QKᵀ over 192 and PV over 128 per visible pair.
  models::TransformerSpec wide = m;
  wide.v_head_dim = 0;  // v as wide as q/k
  const double pairs = 61.0 * 3.5 * kSeq * kSeq / 2.0 * 128;
  EXPECT_DOUBLE_EQ(models::model_step_flops(m, kSeq).attention, pairs * 2 * (192 + 128));
  EXPECT_DOUBLE_EQ(models::model_step_flops(wide, kSeq).attention, pairs * 2 * (192 + 192));
}

TEST(LatentAttention, ABlockKeepsTheLatentsAndMovesKAndVAtTheirWidths) {
  const ScheduleInputs in = mla_inputs(CpMethod::kRing);
  const Workload w = build_step(in);
  const std::int64_t s = kSeq / 8, a = in.recipe.activation_bytes;
  // The norms' inputs and the up projections' inputs (the normed latents with an fp32 rstd).
  EXPECT_EQ(tensor_bytes(w, "mla_q_latent"), s * kQRank * a);
  EXPECT_EQ(tensor_bytes(w, "mla_q_normed"), s * kQRank * a + s * 4);
  EXPECT_EQ(tensor_bytes(w, "mla_kv_latent"), s * (kKvRank + kRope) * a);
  EXPECT_EQ(tensor_bytes(w, "mla_kv_normed"), s * kKvRank * a + s * 4);
  // q and k of 192, v of 128 per head; the output and its gradient of 128.
  EXPECT_EQ(tensor_bytes(w, "q_rope"), s * kHeads * kQkDim * a);
  EXPECT_EQ(tensor_bytes(w, "kv_rope"), s * kHeads * (kQkDim + kVDim) * a);
  EXPECT_EQ(tensor_bytes(w, "kv_block1"), s * kHeads * (kQkDim + kVDim) * a);
  EXPECT_EQ(tensor_bytes(w, "attn_out_h"), s * kHeads * kVDim * a);
  EXPECT_EQ(tensor_bytes(w, "dout"), s * kHeads * kVDim * a);
  EXPECT_EQ(tensor_bytes(w, "dkv_h"), 0);  // Megatron accumulates dK/dV in bf16: no cast
  // The output projection reads H·d_v: 2·s·h·(H·d_v) FLOPs.
  const Op* o_proj = first_op_named(w, "o_proj");
  ASSERT_NE(o_proj, nullptr);
  EXPECT_DOUBLE_EQ(o_proj->flops, 2.0 * s * 4096 * kHeads * kVDim);
  // The first ring step's causal block: 2·(d + d_v) FLOPs per visible pair and head.
  const Op* diagonal = first_op_named(w, "ring_attn_fwd0");
  ASSERT_NE(diagonal, nullptr);
  EXPECT_DOUBLE_EQ(diagonal->flops,
                   static_cast<double>(s) * (s / 2.0) * kHeads * 2 * (kQkDim + kVDim));
}

TEST(LatentAttention, MegatronsLedgerCountsOutputsAtTheValueWidth) {
  const ScheduleInputs in = mla_inputs(CpMethod::kUsp);
  const LayoutCheck checked = check_head_layout(in);
  ASSERT_FALSE(checked.issue) << checked.issue->message;
  const Implementation& impl = *checked.implementation;
  EXPECT_EQ(impl.attention_kernel(in), "cudnn");
  const LedgerUnits u = ledger_units(in, checked.layout);
  const std::int64_t s = kSeq / 8;
  EXPECT_EQ(u.shd, s * kHeads * kQkDim);
  EXPECT_EQ(u.shvd, s * kHeads * kVDim);
  EXPECT_EQ(u.shkd, s * kHeads * (kQkDim + kVDim) / 2);
  // The output all-to-all's copy and receive buffer: 4 bytes per output element.
  EXPECT_EQ(impl.site_bytes(LedgerSite::kOutExchange, u), 4 * s * kHeads * kVDim);
  // Held through the backward: q' (2·sHd), k', v' (4·sHkv·(d + d_v)/2), LSE, out_, dout', dout.
  EXPECT_EQ(impl.site_bytes(LedgerSite::kHeldThroughBackward, u),
            2 * s * kHeads * kQkDim + 2 * s * kHeads * (kQkDim + kVDim) + 4 * s * kHeads +
                6 * s * kHeads * kVDim);
}

TEST(LatentAttention, RunsWhereTheImplementationRunsItAndIsRefusedElsewhere) {
  EXPECT_NO_THROW((void)build_step(mla_inputs(CpMethod::kRing)));
  EXPECT_NO_THROW((void)build_step(mla_inputs(CpMethod::kUsp)));
  EXPECT_NO_THROW((void)build_step(mla_inputs(CpMethod::kUlysses, "none")));
  // TransformerEngine v2.11 refuses MLA with cp_comm_type a2a.
  EXPECT_EQ(refusal(mla_inputs(CpMethod::kUlysses)), Quantity::kLatentAttention);
  for (const char* impl : {"deepspeed-ulysses", "yunchang-usp"}) {
    EXPECT_EQ(refusal(mla_inputs(CpMethod::kUlysses, impl)), Quantity::kLatentAttention) << impl;
  }
  EXPECT_EQ(refusal(mla_inputs(CpMethod::kRing, "torch-native-cp")), Quantity::kLatentAttention);
  // UPipe's and FPDT's schemes build one head width.
  ScheduleInputs upipe = mla_inputs(CpMethod::kUPipe, "none");
  upipe.parallel.heads_per_stage = 8;
  EXPECT_EQ(refusal(upipe), Quantity::kLatentAttention);
  ScheduleInputs fpdt = mla_inputs(CpMethod::kFpdt, "none");
  fpdt.parallel.fpdt_chunk = 8192;
  EXPECT_EQ(refusal(fpdt), Quantity::kLatentAttention);
  ScheduleInputs tp = mla_inputs(CpMethod::kRing);
  tp.parallel.tp_degree = 2;
  tp.parallel.gpus = 16;
  EXPECT_EQ(refusal(tp), Quantity::kTpDegree);
  // Megatron-LM's all_gather (the scheme alone, no implementation modelled) is TE's, which
  // refuses MLA; TorchTitan's launchers are not refused by the method.
  const CpScheme& allgather = cp_scheme(CpMethod::kAllGather);
  const models::TransformerSpec& mla = mla_inputs(CpMethod::kRing).model;
  EXPECT_TRUE(allgather.launcher_refuses("megatron", mla).has_value());
  EXPECT_FALSE(allgather.launcher_refuses("torchtitan", mla).has_value());
  EXPECT_FALSE(
      allgather.launcher_refuses("megatron", inputs(CpMethod::kRing, "llama3-8b", 8, kSeq).model)
          .has_value());
  ScheduleInputs fp8 = mla_inputs(CpMethod::kRing);
  fp8.recipe.fp8 = true;
  fp8.recipe.zero_stage = 1;  // FP8 weight caching needs unsharded weights
  EXPECT_EQ(refusal(fp8), Quantity::kLatentAttention);
}

TEST(LatentAttention, RepeatedBlocksEqualBlocksBuiltOneByOne) {
  test::expect_repeated_blocks_equal_oracle(mla_inputs(CpMethod::kRing));
  ScheduleInputs usp = mla_inputs(CpMethod::kUsp);
  usp.recipe.checkpointing = models::CheckpointMode::kSelective;
  test::expect_repeated_blocks_equal_oracle(usp);
  ScheduleInputs full = mla_inputs(CpMethod::kUlysses, "none");
  full.recipe.checkpointing = models::CheckpointMode::kFull;
  test::expect_repeated_blocks_equal_oracle(full);
  ScheduleInputs direct_q = mla_inputs(CpMethod::kRing);
  direct_q.model.mla.q_lora_rank = 0;  // q projected from x
  test::expect_repeated_blocks_equal_oracle(direct_q);
}

}  // namespace
}  // namespace cpsim::sim
