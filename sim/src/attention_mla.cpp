// Multi-head latent attention's projections (DeepSeek-V2/V3, models::MlaSpec), as Megatron-Core
// runs them (MLASelfAttention, megatron/core/transformer/multi_latent_attention.py @ d98e8a6,
// get_query_key_value_tensors :666-1002), on a rank's s local tokens and all H heads:
//   q_down   x [s, h] → c_q [s, r_q]                        (linear_q_down_proj; none if r_q = 0)
//   q_norm   RMSNorm(c_q)                                    (fused into linear_q_up_proj by TE)
//   q_up     → q [s, H·d]                                    (linear_q_up_proj; x·W_q if r_q = 0)
//   kv_down  x → [s, r_kv + d_r]: latent c_kv and k_r        (linear_kv_down_proj, split :746-763)
//   kv_norm  RMSNorm(c_kv)                                   (fused into linear_kv_up_proj)
//   kv_up    → [s, H·(d − d_r + d_v)]: k_nope and v per head (linear_kv_up_proj)
//   rope     RoPE on q's last d_r and on k_r; q = cat(q_nope, q_r), k = cat(k_nope, k_r expanded
//            to every head), v: [s, H, d] (q, k) and [s, H, d_v] (v) made contiguous (:933-979)
// The Ulysses scheme then exchanges and attends q, k, v as any model's (K/V of H·(d + d_v)).
// Kept for backward, beyond x (the norm's output every projection reads, kept by the block):
// each up projection's input (the normed latent) and each norm's input (c_q, and the whole
// kv_down output of which c_kv is a view) and its fp32 rstd per token. The up projections'
// outputs are not kept: the split, the RoPE and the concatenation need no input in backward.
// Source-read, not traced (TransformerEngine's fused norm-linear has no CPU path); Megatron's
// selective recompute of the up projections (recompute_modules mla_up_proj) is not modelled.
#include "cpsim/models/units.hpp"

#include "step_builder.hpp"

namespace cpsim::sim::detail {

LocalQkv StepBuilder::mla_project(SavedLayer& sv, TensorSet params, bool grad) {
  const models::MlaSpec& a = m_.mla;
  const std::int64_t s = shape_.local_tokens, h = m_.hidden, ab = shape_.activation_bytes;
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  const std::int64_t nope_and_v = m_.heads * (d - a.rope_head_dim + dv);
  const MemCategory kept = grad ? MemCategory::kActivations : MemCategory::kOther;
  TensorSet q;
  if (a.q_lora_rank > 0) {
    sv.mla.q_latent = b_.tensor("mla_q_latent", s * a.q_lora_rank * ab, kept);
    compute("mla_q_down", OpKind::kGemm, linear_fwd(s, a.q_lora_rank, h, grad), {sv.xn, params},
            {sv.mla.q_latent});
    sv.mla.q_normed = b_.tensor("mla_q_normed", s * a.q_lora_rank * ab + s * kFp32Bytes, kept);
    compute("mla_q_norm", OpKind::kElementwise,
            norm_cost(s * a.q_lora_rank, 2 * s * a.q_lora_rank * ab, false), {sv.mla.q_latent},
            {sv.mla.q_normed});
    q = b_.tensor("mla_q", s * m_.q_width() * ab, MemCategory::kAttention);
    compute("mla_q_up", OpKind::kGemm, linear_fwd(s, m_.q_width(), a.q_lora_rank, grad),
            {sv.mla.q_normed, params}, {q});
  } else {
    q = b_.tensor("mla_q", s * m_.q_width() * ab, MemCategory::kAttention);
    compute("mla_q_proj", OpKind::kGemm, linear_fwd(s, m_.q_width(), h, grad), {sv.xn, params},
            {q});
  }
  sv.mla.kv_latent = b_.tensor("mla_kv_latent", s * (a.kv_lora_rank + a.rope_head_dim) * ab, kept);
  compute("mla_kv_down", OpKind::kGemm, linear_fwd(s, a.kv_lora_rank + a.rope_head_dim, h, grad),
          {sv.xn, params}, {sv.mla.kv_latent});
  sv.mla.kv_normed = b_.tensor("mla_kv_normed", s * a.kv_lora_rank * ab + s * kFp32Bytes, kept);
  compute("mla_kv_norm", OpKind::kElementwise,
          norm_cost(s * a.kv_lora_rank, 2 * s * a.kv_lora_rank * ab, false), {sv.mla.kv_latent},
          {sv.mla.kv_normed});
  TensorSet kv_up = b_.tensor("mla_kv_up", s * nope_and_v * ab, MemCategory::kAttention);
  compute("mla_kv_up", OpKind::kGemm, linear_fwd(s, nope_and_v, a.kv_lora_rank, grad),
          {sv.mla.kv_normed, params}, {kv_up});
  // RoPE on the d_r rotated parts, and the concatenations and copies into q, k, v, which move the
  // up projections' outputs once more (read and write).
  LocalQkv out;
  out.q = b_.tensor("q_rope", s * m_.q_width() * ab, MemCategory::kAttention);
  out.kv = b_.tensor("kv_rope", s * m_.kv_pair_width() * ab, MemCategory::kAttention);
  const std::int64_t copied = s * (m_.q_width() + m_.kv_pair_width()) * ab;
  compute("mla_rope", OpKind::kElementwise,
          rope_cost(s * m_.heads * a.rope_head_dim, s * a.rope_head_dim, 2 * copied,
                    RopeBackward::kNone),
          {q, kv_up, sv.mla.kv_latent}, {out.q, out.kv});
  return out;
}

InputGrad StepBuilder::mla_project_backward(
    const SavedLayer& sv, TensorSet dq, TensorSet dkv, TensorSet params, TensorSet grads) {
  const models::MlaSpec& a = m_.mla;
  const std::int64_t s = shape_.local_tokens, h = m_.hidden, ab = shape_.activation_bytes;
  const std::int64_t d = shape_.qk_head_dim, dv = shape_.v_head_dim;
  const std::int64_t nope_and_v = m_.heads * (d - a.rope_head_dim + dv);
  // RoPE's backward and the concatenations' (the rotated key part summed over the heads).
  TensorSet dq_up = b_.tensor("mla_dq", s * m_.q_width() * ab, MemCategory::kAttention);
  TensorSet dkv_up = b_.tensor("mla_dkv_up", s * nope_and_v * ab, MemCategory::kAttention);
  TensorSet dk_rope = b_.tensor("mla_dk_rope", s * a.rope_head_dim * ab, MemCategory::kAttention);
  const std::int64_t copied = s * (m_.q_width() + m_.kv_pair_width()) * ab;
  compute("mla_rope_bwd", OpKind::kElementwise,
          rope_cost(s * m_.heads * a.rope_head_dim, s * m_.heads * a.rope_head_dim, 2 * copied,
                    RopeBackward::kAutograd),
          {dq, dkv}, {dq_up, dkv_up, dk_rope});
  TensorSet dkv_normed =
      b_.tensor("mla_dkv_normed", s * a.kv_lora_rank * ab, MemCategory::kAttention);
  compute("mla_kv_up_bwd", OpKind::kGemm, linear_bwd(s, nope_and_v, a.kv_lora_rank),
          {dkv_up, sv.mla.kv_normed, params, grads}, {dkv_normed});
  TensorSet dkv_latent = b_.tensor("mla_dkv_latent", s * (a.kv_lora_rank + a.rope_head_dim) * ab,
                                   MemCategory::kAttention);
  compute("mla_kv_norm_bwd", OpKind::kElementwise,
          norm_cost(s * a.kv_lora_rank, 2 * s * a.kv_lora_rank * ab, true),
          {dkv_normed, dk_rope, sv.mla.kv_latent, sv.mla.kv_normed}, {dkv_latent});
  TensorSet dxn_kv = b_.tensor("dxn_kv", s * h * ab, MemCategory::kOther);
  compute("mla_kv_down_bwd", OpKind::kGemm, linear_bwd(s, a.kv_lora_rank + a.rope_head_dim, h),
          {dkv_latent, sv.xn, params, grads}, {dxn_kv});
  TensorSet dxn = b_.tensor("dxn", s * h * ab, MemCategory::kOther);
  OpSet ready;
  if (a.q_lora_rank > 0) {
    TensorSet dq_normed =
        b_.tensor("mla_dq_normed", s * a.q_lora_rank * ab, MemCategory::kAttention);
    compute("mla_q_up_bwd", OpKind::kGemm, linear_bwd(s, m_.q_width(), a.q_lora_rank),
            {dq_up, sv.mla.q_normed, params, grads}, {dq_normed});
    TensorSet dq_latent =
        b_.tensor("mla_dq_latent", s * a.q_lora_rank * ab, MemCategory::kAttention);
    compute("mla_q_norm_bwd", OpKind::kElementwise,
            norm_cost(s * a.q_lora_rank, 2 * s * a.q_lora_rank * ab, true),
            {dq_normed, sv.mla.q_latent, sv.mla.q_normed}, {dq_latent});
    // The two down projections' input gradients sum into x's.
    ready = compute("mla_q_down_bwd", OpKind::kGemm, linear_bwd(s, a.q_lora_rank, h),
                    {dq_latent, dxn_kv, sv.xn, params, grads}, {dxn});
  } else {
    ready = compute("mla_q_proj_bwd", OpKind::kGemm, linear_bwd(s, m_.q_width(), h),
                    {dq_up, dxn_kv, sv.xn, params, grads}, {dxn});
  }
  return {dxn, ready};
}

}  // namespace cpsim::sim::detail
