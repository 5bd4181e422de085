// Ulysses-family attention: Q and K/V projected for all heads, all-to-all over the Ulysses group
// (sequence-sharded → head-sharded), core attention over the ring group (one call when the ring
// degree is 1), all-to-all of the output back. This one builder covers
//   ulysses    u = C, ring 1          usp        u × ring = C (ring across nodes)
//   ring       u = 1, ring = C        allgather  u = 1, ring = C, K/V all-gathered
// With u = 1 the all-to-alls vanish (the local tensors are already "head-sharded").
// Backward: all-to-all dOut, core attention backward from the saved head-sharded Q, K/V, output
// and LSE, all-to-all dQ and dK/dV back, RoPE backward, projection backward. Nothing attention-
// related is recomputed unless checkpointing says so (selective: the all-to-alls of Q and K/V and
// the core forward run again first).
#include <fmt/format.h>

#include "cpsim/models/units.hpp"

#include "step_builder.hpp"

namespace cpsim::sim::detail {

LocalQkv StepBuilder::project_qkv(SavedLayer& sv, TensorSet params, bool grad) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t kv = layout_.kv_heads_eff;
  const std::int64_t q_bytes = shape_.local_tokens * m_.heads * d * shape_.activation_bytes;
  const std::int64_t kv_bytes = shape_.local_tokens * 2 * kv * d * shape_.activation_bytes;
  // Projection (K/V replicated after the GEMM when H_kv < u: the copy is part of RoPE's traffic).
  TensorSet q = b_.tensor("q", q_bytes, MemCategory::kAttention);
  TensorSet kvp = b_.tensor("kv", kv_bytes, MemCategory::kAttention);
  compute("qkv_proj", OpKind::kGemm,
          linear_fwd(shape_.local_tokens, (m_.heads + 2 * m_.kv_heads) * d, h, grad),
          {sv.xn, params}, {q, kvp});
  TensorSet q_in = q, kv_in = kvp;
  if (m_.qk_norm) {
    // Qwen3: RMSNorm per head on Q and K before RoPE. Its backward reads its input, the projection
    // output, which nothing else keeps: s·(H + H_kv)·d elements (more for an eager norm).
    const std::int64_t qk_elems = shape_.local_tokens * (m_.heads + m_.kv_heads) * d;
    q_in = b_.tensor("q_normed", q_bytes, MemCategory::kAttention);
    kv_in = b_.tensor("kv_normed", kv_bytes, MemCategory::kAttention);
    std::vector<TensorSet> outs = {q_in, kv_in};
    if (grad) {
      const std::int64_t kept = qk_elems * shape_.activation_bytes + norm_saved_bytes(qk_elems, 1);
      sv.qk_norm_saved = b_.tensor("qk_norm_saved", kept, MemCategory::kActivations);
      outs.push_back(sv.qk_norm_saved);
    }
    compute("qk_norm", OpKind::kElementwise,
            norm_cost(qk_elems, 2 * qk_elems * shape_.activation_bytes, false), {q, kvp},
            std::move(outs));
  }
  TensorSet q_r = b_.tensor("q_rope", q_bytes, MemCategory::kAttention);
  TensorSet kv_r = b_.tensor("kv_rope", kv_bytes, MemCategory::kAttention);
  // RoPE on Q and the model's K heads; V and any K/V replication are a copy beside it.
  const std::int64_t q_elems = q_bytes / shape_.activation_bytes,
                     k_elems = shape_.local_tokens * m_.kv_heads * d;
  const std::int64_t pass_bytes = 2 * kv_bytes - 2 * shape_.activation_bytes * k_elems;
  compute("rope", OpKind::kElementwise,
          rope_cost(q_elems, k_elems, pass_bytes, RopeBackward::kNone), {q_in, kv_in}, {q_r, kv_r});
  return {q_r, kv_r};
}

void StepBuilder::ulysses_forward(SavedLayer& sv, TensorSet params, bool grad) {
  const std::int64_t kv = layout_.kv_heads_eff, ab = shape_.activation_bytes;
  const std::int64_t q_bytes = shape_.local_tokens * m_.heads * shape_.qk_head_dim * ab;
  const std::int64_t kv_bytes = shape_.local_tokens * kv * shape_.kv_pair_dim() * ab;
  const std::int64_t o_bytes = shape_.local_tokens * m_.heads * shape_.v_head_dim * ab;
  const auto [q_r, kv_r] =
      m_.is_mla() ? mla_project(sv, params, grad) : project_qkv(sv, params, grad);
  TensorSet q_h = exchange("a2a_q", q_r, q_bytes, LedgerSite::kQExchange);
  TensorSet kv_h = exchange("a2a_kv", kv_r, kv_bytes, LedgerSite::kKvExchange);
  const CoreForward core =
      core_forward("", q_h, kv_h, m_.heads / shape_.ulysses, kv / shape_.ulysses);
  // An implementation whose caller holds q, k, v keeps them until the output all-to-all ends.
  std::vector<TensorSet> held;
  if (ledger_bytes(LedgerSite::kHeldThroughBlock) > 0) {
    held = {q_r, kv_r};
  }
  sv.o = exchange("a2a_out", core.o_h, o_bytes, LedgerSite::kOutExchange, held);
  if (grad) {
    // The all-to-alls keep nothing for backward (theirs is the reverse all-to-all of the
    // gradient); the local Q and K/V are kept only as the input of selective recomputation.
    if (r_.checkpointing == models::CheckpointMode::kSelective || shape_.ulysses == 1) {
      sv.q_local = q_r;
      sv.kv_local = kv_r;
    }
    sv.q_h = q_h;
    sv.kv_h = core.kv_used.valid() ? core.kv_used : kv_h;
    sv.o_h = core.o_h;
    sv.lse = core.lse;
  }
}

InputGrad StepBuilder::ulysses_backward(const SavedLayer& sv,
                                        TensorSet d_o,
                                        TensorSet params,
                                        TensorSet grads) {
  const std::int64_t kv = layout_.kv_heads_eff, ab = shape_.activation_bytes;
  const std::int64_t hq = m_.heads / shape_.ulysses, hkv = kv / shape_.ulysses;
  const std::int64_t q_bytes = shape_.local_tokens * m_.heads * shape_.qk_head_dim * ab;
  const std::int64_t kv_bytes = shape_.local_tokens * kv * shape_.kv_pair_dim() * ab;
  const std::int64_t o_bytes = shape_.local_tokens * m_.heads * shape_.v_head_dim * ab;
  TensorSet q_h = sv.q_h, kv_h = sv.kv_h, o_h = sv.o_h, lse = sv.lse;
  if (!q_h.valid()) {
    // Selective checkpointing: the attention core runs again from the saved local Q and K/V.
    q_h = exchange("a2a_q(re)", sv.q_local, q_bytes, LedgerSite::kQExchange);
    kv_h = exchange("a2a_kv(re)", sv.kv_local, kv_bytes, LedgerSite::kKvExchange);
    const CoreForward core = core_forward("(re)", q_h, kv_h, hq, hkv);
    o_h = core.o_h;
    lse = core.lse;
  }
  TensorSet do_h = exchange("a2a_dout", d_o, o_bytes, LedgerSite::kDoutExchange);
  const CoreBackward g = core_backward("", q_h, kv_h, o_h, lse, do_h, hq, hkv);
  // An implementation that wraps kernel and all-to-alls in one autograd function keeps what it
  // saved, and the incoming gradient, until the gradients' all-to-alls end.
  std::vector<TensorSet> held;
  if (ledger_bytes(LedgerSite::kHeldThroughBackward) > 0) {
    held = {q_h, kv_h, o_h, lse, do_h, d_o};
  }
  TensorSet dq = exchange("a2a_dq", g.dq_h, q_bytes, LedgerSite::kDqExchange, held);
  TensorSet dkv = exchange("a2a_dkv", g.dkv_h, kv_bytes, LedgerSite::kDkvExchange, held);
  return m_.is_mla() ? mla_project_backward(sv, dq, dkv, params, grads)
                     : project_qkv_backward(sv, dq, dkv, params, grads);
}

InputGrad StepBuilder::project_qkv_backward(
    const SavedLayer& sv, TensorSet dq, TensorSet dkv, TensorSet params, TensorSet grads) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t kv = layout_.kv_heads_eff;
  const std::int64_t q_bytes = shape_.local_tokens * m_.heads * d * shape_.activation_bytes;
  const std::int64_t kv_bytes = shape_.local_tokens * 2 * kv * d * shape_.activation_bytes;
  TensorSet dq_r = b_.tensor("dq_rope", q_bytes, MemCategory::kAttention);
  TensorSet dkv_r = b_.tensor("dkv_rope", kv_bytes, MemCategory::kAttention);
  const std::int64_t q_elems = q_bytes / shape_.activation_bytes,
                     k_elems = shape_.local_tokens * m_.kv_heads * d;
  compute("rope_bwd", OpKind::kElementwise,
          rope_cost(q_elems, k_elems, 2 * kv_bytes - 2 * shape_.activation_bytes * k_elems,
                    RopeBackward::kAutograd),
          {dq, dkv}, {dq_r, dkv_r});
  if (sv.qk_norm_saved.valid()) {
    TensorSet dq_n = b_.tensor("dq_normbwd", q_bytes, MemCategory::kAttention);
    TensorSet dkv_n = b_.tensor("dkv_normbwd", kv_bytes, MemCategory::kAttention);
    compute(
        "qk_norm_bwd", OpKind::kElementwise,
        norm_cost((q_bytes + kv_bytes) / shape_.activation_bytes, 2 * (q_bytes + kv_bytes), true),
        {dq_r, dkv_r, sv.qk_norm_saved}, {dq_n, dkv_n});
    dq_r = dq_n;
    dkv_r = dkv_n;
  }
  TensorSet dxn =
      b_.tensor("dxn", shape_.local_tokens * h * shape_.activation_bytes, MemCategory::kOther);
  const OpSet ready = compute("qkv_proj_bwd", OpKind::kGemm,
                              linear_bwd(shape_.local_tokens, (m_.heads + 2 * m_.kv_heads) * d, h),
                              {dq_r, dkv_r, sv.xn, params, grads}, {dxn});
  return {dxn, ready};
}

}  // namespace cpsim::sim::detail
