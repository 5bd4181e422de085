// Schedule builders for Ulysses and UPipe under an FSDP (ZeRO-3) recipe.
//
// One training step, per rank (s = N/C local tokens, h hidden, H/H_kv heads, d head dim, f FFN):
//   embedding → L × block forward → final norm + loss → L × block backward (reverse) → optimizer.
// FSDP: each block's bf16 parameters are all-gathered before use (the next block's gather is
// issued when a block starts: prefetch depth 1) and freed after use; the block's unsharded
// gradients are reduce-scattered in the recipe's reduce dtype when its backward ends.
//
// Activation checkpointing decides what the first forward saves and what runs again:
//   none       forward runs with autograd: every tensor a backward op reads stays alive.
//   selective  as none, except that the attention core (all-to-all of QKV, attention forward) is
//              not saved and runs again before attention backward (Ulysses); UPipe's custom op
//              already recomputes per stage, so selective equals none for it.
//   full       forward saves only each block's input (offloaded to pinned host memory on all but
//              the first and last block when the recipe says so); before each block's backward the
//              whole block forward runs again with autograd (the "recompute" phase), then backward.
// What each method recomputes inside backward on top of that:
//   Ulysses    nothing: attention backward reads the saved head-sharded Q, K, V, output and LSE.
//   UPipe      the custom op saves its input xn, the full output final_out [s, H·d] and one LSE per
//              stage; in backward, per stage, it recomputes the Q projection + RoPE + Q all-to-all
//              (and K/V once per KV fetch), all-to-alls the stage's slice of final_out and of dOut
//              to head-sharded layout, runs attention backward, and all-to-alls dQ (and dK/dV at
//              the end of a KV cycle) back. Under full AC the QKV projection and its all-to-all
//              therefore run three times per step.
#include "cpsim/sim/schedule.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

#include "builder.hpp"

namespace cpsim::sim {
namespace {

using detail::Builder;
using detail::Group;
using detail::OpSet;
using detail::OpSpec;
using detail::TensorSet;
using models::CheckpointMode;
using models::Collective;
using models::CpMethod;

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

constexpr std::int64_t kMaxSeqLen = std::int64_t{1} << 34;  // 16G tokens: beyond any real run
constexpr double kMaxStepSeconds = 1e7;

}  // namespace

HeadLayout derive_head_layout(const ScheduleInputs& in) {
  const auto& m = in.model;
  const auto& p = in.parallel;
  if (p.gpus < 1 || p.gpus > 65536) {
    throw InputError("--gpus", fmt::format("must be between 1 and 65536, got {}", p.gpus));
  }
  if (p.gpus_per_node < 1) {
    throw InputError("--gpus-per-node", fmt::format("must be at least 1, got {}", p.gpus_per_node));
  }
  if (p.cp_degree < 1 || p.gpus % p.cp_degree != 0) {
    throw InputError("--ulysses-degree",
                     fmt::format("CP degree {} must divide --gpus {}", p.cp_degree, p.gpus));
  }
  if (p.seq_len <= 0) {
    throw InputError("--seq", "must be positive");
  }
  if (p.seq_len > kMaxSeqLen) {
    throw InputError("--seq", fmt::format("{} tokens is beyond what cpsim models (at most {})",
                                          p.seq_len, format_length(kMaxSeqLen)));
  }
  // A step whose model FLOPs alone take more than ~4 months per GPU is not a plan anyone runs, and
  // its nanosecond clock would approach the 64-bit range once recomputation is added: refuse it.
  const double lower_bound_s = models::model_step_flops(m, p.seq_len).total() /
                               static_cast<double>(p.cp_degree) / in.hardware.peak_bf16_flops_per_s;
  if (!(lower_bound_s < kMaxStepSeconds)) {
    throw InputError("--seq", fmt::format("{} tokens on {} would take at least {:.3g} s per step; "
                                          "cpsim refuses lengths this absurd",
                                          p.seq_len, m.name, lower_bound_s));
  }
  const std::int64_t c = p.cp_degree;
  if (p.seq_len % c != 0) {
    throw InputError(
        "--seq",
        fmt::format("sequence length {} must be divisible by the CP degree {}", p.seq_len, c));
  }
  HeadLayout L;
  L.cp = c;
  L.heads = m.heads;
  if (m.heads % c != 0) {
    throw InputError("--model", fmt::format("{} has {} attention heads, not divisible by the CP "
                                            "degree {} (Ulysses splits heads across ranks)",
                                            m.name, m.heads, c));
  }
  if (m.kv_heads % c == 0) {
    L.kv_heads_eff = m.kv_heads;
  } else if (c % m.kv_heads == 0) {
    L.kv_heads_eff = c;  // replicate each KV head c / H_kv times
  } else {
    throw InputError("--model",
                     fmt::format("{} has {} KV heads: neither divisible by nor a divisor "
                                 "of the CP degree {}",
                                 m.name, m.kv_heads, c));
  }
  L.kv_replication = L.kv_heads_eff / m.kv_heads;
  if (p.cp_degree > p.gpus_per_node && p.cp_degree % p.gpus_per_node != 0) {
    throw InputError(p.cp_degree == p.gpus ? "--gpus" : "--ulysses-degree",
                     fmt::format("a CP group spanning nodes must cover whole nodes: degree {} is "
                                 "not a multiple of --gpus-per-node {}",
                                 p.cp_degree, p.gpus_per_node));
  }
  if (p.method == CpMethod::kUlysses) {
    L.heads_per_stage = m.heads;
  } else {
    const std::int64_t u = p.heads_per_stage == 0 ? c : p.heads_per_stage;
    if (u <= 0 || u % c != 0) {
      throw InputError("--heads-per-stage",
                       fmt::format("U = {} must be a positive multiple of the CP degree {}", u, c));
    }
    if (m.heads % u != 0) {
      throw InputError(
          "--heads-per-stage",
          fmt::format("U = {} must divide the {} query heads of {}", u, m.heads, m.name));
    }
    if ((u <= L.kv_heads_eff && L.kv_heads_eff % u != 0) ||
        (u > L.kv_heads_eff && u % L.kv_heads_eff != 0)) {
      throw InputError("--heads-per-stage",
                       fmt::format("U = {} is not compatible with {} KV heads (after replication): "
                                   "one must divide the other",
                                   u, L.kv_heads_eff));
    }
    L.heads_per_stage = u;
  }
  L.stages = m.heads / L.heads_per_stage;
  if (L.heads_per_stage <= L.kv_heads_eff) {
    L.kv_heads_per_fetch = L.heads_per_stage;
    L.stages_per_kv_fetch = m.heads / L.kv_heads_eff;
  } else {
    L.kv_heads_per_fetch = L.kv_heads_eff;
    L.stages_per_kv_fetch = L.stages;
  }
  return L;
}

// Attention buffers of one layer, per rank (bf16 = 2 bytes, LSE fp32):
//   Ulysses (one "stage" of all H heads):
//     QKV local          s·(H + 2·H_kv')·d·2      before the all-to-all (H_kv' after replication)
//     QKV head-sharded   N·(H + 2·H_kv')/C·d·2    after it: the same bytes
//     out head-sharded   N·(H/C)·d·2
//     out local          s·H·d·2
//     LSE                (H/C)·N·4
//   UPipe, per stage of U heads (K/V once per KV fetch of F = kv_heads_per_fetch heads):
//     QKV local          s·(U + 2F)·d·2,  head-sharded N·(U + 2F)/C·d·2
//     out                N·(U/C)·d·2 and s·U·d·2;  LSE (U/C)·N·4
//     final_out          s·H·d·2 (kept for backward)
//   All-to-all bytes sent per rank in one forward layer: Ulysses s·(H + 2H_kv')·d·2 + s·H·d·2
//   (reference/papers.md §4.2: 4Nh/P for MHA), UPipe the same split over stages.
AttentionBuffers attention_buffers(const ScheduleInputs& in, const HeadLayout& L) {
  const std::int64_t n = in.parallel.seq_len;
  const std::int64_t s = n / L.cp;
  const std::int64_t d = in.model.head_dim;
  const std::int64_t b = in.recipe.activation_bytes;
  const std::int64_t u = L.heads_per_stage;
  const std::int64_t f = L.kv_heads_per_fetch;
  AttentionBuffers a;
  a.qkv_local_bytes = s * (u + 2 * f) * d * b;
  a.qkv_headsharded_bytes = n * (u + 2 * f) / L.cp * d * b;
  a.out_headsharded_bytes = n * (u / L.cp) * d * b;
  a.out_local_bytes = s * u * d * b;
  a.lse_bytes = (u / L.cp) * n * kFp32Bytes;
  a.final_out_bytes = in.parallel.method == CpMethod::kUPipe ? s * L.heads * d * b : 0;
  a.a2a_send_bytes_per_layer_fwd = s * (L.heads + 2 * L.kv_heads_eff) * d * b + s * L.heads * d * b;
  return a;
}

namespace {

/// Per-layer tensors saved by the grad-enabled forward of a block and read by its backward.
struct SavedLayer {
  TensorSet x;          // block input (checkpoint)
  TensorSet xn;         // norm1 output (QKV projection input)
  TensorSet qkv;        // Ulysses: local QKV after RoPE (selective recompute input)
  TensorSet qkv_h;      // Ulysses: head-sharded QKV
  TensorSet o_h;        // Ulysses: head-sharded attention output
  TensorSet lse;        // Ulysses: LSE
  TensorSet o;          // input of the output projection (Ulysses: out local; UPipe: permuted copy)
  TensorSet final_out;  // UPipe
  std::vector<TensorSet> lses;  // UPipe: one per stage
  TensorSet h1;                 // after the attention residual
  TensorSet h1n;                // norm2 output (MLP input)
  TensorSet gate_up;            // untiled MLP: [s, 2f]
  TensorSet act;                // untiled MLP: [s, f]
  TensorSet out;                // block output
  OpSet first_op;
  OpSet last_op;
};

class StepBuilder {
 public:
  StepBuilder(const ScheduleInputs& in, Workload& w)
      : in_(in),
        m_(in.model),
        r_(in.recipe),
        layout_(derive_head_layout(in)),
        cost_(in.hardware, in.recipe.attention_kernel),
        b_(w, in.parallel.gpus, in.parallel.cp_degree, in.parallel.gpus_per_node),
        w_(w) {
    params_ = models::count_parameters(m_);
    n_ = in.parallel.seq_len;
    c_ = in.parallel.cp_degree;
    s_ = n_ / c_;
    ab_ = r_.activation_bytes;
    shards_ = r_.tiled_mlp_shards > 0 ? r_.tiled_mlp_shards : ceil_div(s_, m_.hidden);
    tile_ = ceil_div(s_, shards_);
  }

  void build();

 private:
  // Helpers
  OpSet compute(const std::string& name,
                OpKind kind,
                const KernelCost& k,
                std::vector<TensorSet> inputs,
                std::vector<TensorSet> outputs,
                std::vector<OpSet> deps = {},
                std::int64_t workspace = 0,
                MemCategory ws_cat = MemCategory::kOther) {
    OpSpec s;
    s.name = name;
    s.kind = kind;
    s.time_s = k.time_s;
    s.flops = k.flops;
    s.inputs = std::move(inputs);
    s.outputs = std::move(outputs);
    s.deps = std::move(deps);
    s.workspace_bytes = workspace;
    s.workspace_category = ws_cat;
    return b_.op(s);
  }
  OpSet a2a(const std::string& name, TensorSet in, TensorSet out, std::int64_t size_bytes) {
    OpSpec s;
    s.name = name;
    s.stream = Stream::kComm;
    s.inputs = {in};
    s.outputs = {out};
    return b_.collective(s, Group::kCp, Collective::kAllToAll, cost_, size_bytes);
  }
  /// A tensor produced by an all-to-all, or passed through unchanged when C = 1.
  TensorSet exchange(const std::string& name, TensorSet in, std::int64_t bytes, MemCategory cat) {
    if (c_ == 1) {
      return in;
    }
    TensorSet out = b_.tensor(name, bytes, cat);
    a2a(name, in, out, bytes);
    return out;
  }
  KernelCost gemm(std::int64_t m, std::int64_t n, std::int64_t k) const {
    return cost_.gemm(m, n, k);
  }
  KernelCost mem(std::int64_t bytes) const { return cost_.memory_bound(bytes); }
  KernelCost times(KernelCost k, double factor) const {
    return {k.time_s * factor, k.flops * factor};
  }
  KernelCost plus(KernelCost a, KernelCost b) const {
    return {a.time_s + b.time_s, a.flops + b.flops};
  }
  std::int64_t norm_workspace() const {
    // RMSNorm upcasts to fp32: input copy and normalised result (2 × 4 bytes per element),
    // tile-sized when the norm is tiled.
    const std::int64_t rows = r_.tiled_norm ? tile_ : s_;
    return rows * m_.hidden * 2 * kFp32Bytes;
  }

  OpSet gather_params(const std::string& name,
                      std::int64_t params,
                      TensorSet out,
                      std::vector<OpSet> deps) {
    OpSpec s;
    s.name = name;
    s.stream = Stream::kFsdp;
    s.outputs = {out};
    s.deps = std::move(deps);
    return b_.collective(s, Group::kAll, Collective::kAllGather, cost_, params * r_.param_bytes);
  }
  OpSet reduce_grads(const std::string& name,
                     std::int64_t params,
                     TensorSet grads,
                     std::vector<OpSet> deps) {
    OpSpec s;
    s.name = name;
    s.stream = Stream::kFsdp;
    s.inputs = {grads};
    s.deps = std::move(deps);
    // The unsharded gradients are cast to the reduce dtype into the collective's input buffer.
    s.workspace_bytes = params * r_.grad_reduce_bytes;
    s.workspace_category = MemCategory::kParamGather;
    return b_.collective(s, Group::kAll, Collective::kReduceScatter, cost_,
                         params * r_.grad_reduce_bytes);
  }

  SavedLayer layer_forward(int layer, TensorSet x, TensorSet params, bool grad);
  void attention_forward_ulysses(SavedLayer& sv, TensorSet params, bool grad);
  void attention_forward_upipe(SavedLayer& sv, TensorSet params);
  /// Returns dx (gradient of the block input).
  TensorSet layer_backward(
      int layer, const SavedLayer& sv, TensorSet dy, TensorSet params, TensorSet grads);
  /// Gradient of the QKV projection input, and the op after which it is complete.
  struct InputGrad {
    TensorSet dxn;
    OpSet ready;
  };
  InputGrad attention_backward_ulysses(const SavedLayer& sv,
                                       TensorSet d_o,
                                       TensorSet params,
                                       TensorSet grads);
  InputGrad attention_backward_upipe(const SavedLayer& sv,
                                     TensorSet d_o,
                                     TensorSet params,
                                     TensorSet grads);

  const ScheduleInputs& in_;
  const models::TransformerSpec& m_;
  const models::TrainingRecipe& r_;
  HeadLayout layout_;
  CostModel cost_;
  Builder b_;
  Workload& w_;
  models::ParameterCount params_;
  std::int64_t n_ = 0, c_ = 0, s_ = 0, ab_ = 2, shards_ = 1, tile_ = 0;
  OpSet last_compute_;
};

SavedLayer StepBuilder::layer_forward(int layer, TensorSet x, TensorSet params, bool grad) {
  (void)layer;
  const std::int64_t h = m_.hidden;
  const std::int64_t act_bytes = s_ * h * ab_;
  SavedLayer sv;
  sv.x = x;
  sv.xn = b_.tensor("xn", act_bytes, MemCategory::kActivations);
  sv.first_op = compute("norm1", OpKind::kElementwise, mem(2 * act_bytes), {x}, {sv.xn}, {},
                        norm_workspace());
  if (in_.parallel.method == CpMethod::kUlysses) {
    attention_forward_ulysses(sv, params, grad);
  } else {
    attention_forward_upipe(sv, params);
  }
  // Output projection and residual.
  TensorSet attn_out = b_.tensor("attn_out", act_bytes, MemCategory::kOther);
  compute("o_proj", OpKind::kGemm, gemm(s_, h, m_.q_width()), {sv.o, params}, {attn_out});
  sv.h1 = b_.tensor("h1", act_bytes, MemCategory::kActivations);
  compute("residual1", OpKind::kElementwise, mem(3 * act_bytes), {x, attn_out}, {sv.h1});
  sv.h1n = b_.tensor("h1n", act_bytes, MemCategory::kActivations);
  compute("norm2", OpKind::kElementwise, mem(2 * act_bytes), {sv.h1}, {sv.h1n}, {},
          norm_workspace());
  // MLP (SwiGLU): gate/up GEMM [s, h] × [h, 2f], activation, down GEMM [s, f] × [f, h].
  const std::int64_t f = m_.ffn_hidden;
  TensorSet mlp_out = b_.tensor("mlp_out", act_bytes, MemCategory::kOther);
  if (r_.tiled_mlp) {
    // Tiles of `tile_` tokens; only one tile's intermediates (gate, up, act) are live at a time.
    const KernelCost one =
        plus(plus(gemm(tile_, 2 * f, h), mem(4 * tile_ * f * ab_)), gemm(tile_, h, f));
    compute(fmt::format("mlp_tiled[{}]", shards_), OpKind::kGemm,
            times(one, static_cast<double>(shards_)), {sv.h1n, params}, {mlp_out}, {},
            3 * tile_ * f * ab_);
  } else {
    TensorSet gate_up = b_.tensor("gate_up", s_ * 2 * f * ab_, MemCategory::kActivations);
    compute("mlp_gate_up", OpKind::kGemm, gemm(s_, 2 * f, h), {sv.h1n, params}, {gate_up});
    TensorSet act = b_.tensor("mlp_act", s_ * f * ab_, MemCategory::kActivations);
    compute("mlp_act", OpKind::kElementwise, mem(3 * s_ * f * ab_), {gate_up}, {act});
    compute("mlp_down", OpKind::kGemm, gemm(s_, h, f), {act, params}, {mlp_out});
    if (grad) {
      sv.gate_up = gate_up;
      sv.act = act;
    }
  }
  sv.out = b_.tensor("block_out", act_bytes, MemCategory::kActivations);
  sv.last_op =
      compute("residual2", OpKind::kElementwise, mem(3 * act_bytes), {sv.h1, mlp_out}, {sv.out});
  return sv;
}

void StepBuilder::attention_forward_ulysses(SavedLayer& sv, TensorSet params, bool grad) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t kv = layout_.kv_heads_eff;
  const std::int64_t heads_local = m_.heads / c_;
  const std::int64_t qkv_bytes = s_ * (m_.heads + 2 * kv) * d * ab_;
  // Projection (K/V replicated after the GEMM when H_kv < C: the copy is part of RoPE's traffic).
  TensorSet qkv = b_.tensor("qkv", qkv_bytes, MemCategory::kAttention);
  compute("qkv_proj", OpKind::kGemm, gemm(s_, (m_.heads + 2 * m_.kv_heads) * d, h), {sv.xn, params},
          {qkv});
  TensorSet qkv_r = b_.tensor("qkv_rope", qkv_bytes, MemCategory::kAttention);
  compute("rope", OpKind::kElementwise, mem(2 * qkv_bytes), {qkv}, {qkv_r});
  TensorSet qkv_h = exchange("a2a_qkv", qkv_r, qkv_bytes, MemCategory::kAttention);
  TensorSet o_h = b_.tensor("attn_out_h", n_ * heads_local * d * ab_, MemCategory::kAttention);
  TensorSet lse = b_.tensor("lse", heads_local * n_ * kFp32Bytes, MemCategory::kAttention);
  const AttentionShape shape{n_, n_, heads_local, d, true};
  compute("attn_fwd", OpKind::kAttentionFwd, cost_.attention_fwd(shape), {qkv_h}, {o_h, lse});
  sv.o = exchange("a2a_out", o_h, s_ * m_.heads * d * ab_, MemCategory::kAttention);
  if (grad) {
    sv.qkv = qkv_r;
    sv.qkv_h = qkv_h;
    sv.o_h = o_h;
    sv.lse = lse;
  }
}

void StepBuilder::attention_forward_upipe(SavedLayer& sv, TensorSet params) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t u = layout_.heads_per_stage;
  const std::int64_t f = layout_.kv_heads_per_fetch;
  const std::int64_t q_local = u / c_;
  const std::int64_t kv_bytes = s_ * 2 * f * d * ab_;
  const std::int64_t q_bytes = s_ * u * d * ab_;
  // The full output is preallocated by the custom op and filled stage by stage.
  sv.final_out = b_.tensor("final_out", s_ * m_.heads * d * ab_, MemCategory::kActivations);
  OpSet alloc = compute("upipe_alloc_out", OpKind::kElementwise, {0.0, 0.0}, {}, {sv.final_out});
  TensorSet kv_h;
  std::vector<OpSet> fills;
  for (std::int64_t st = 0; st < layout_.stages; ++st) {
    const std::string tag = fmt::format("[s{}]", st);
    if (st % layout_.stages_per_kv_fetch == 0) {
      TensorSet kvp = b_.tensor("kv" + tag, kv_bytes, MemCategory::kAttention);
      compute("kv_proj" + tag, OpKind::kGemm, gemm(s_, 2 * f / layout_.kv_replication * d, h),
              {sv.xn, params}, {kvp});
      TensorSet kvr = b_.tensor("kv_rope" + tag, kv_bytes, MemCategory::kAttention);
      compute("rope_k" + tag, OpKind::kElementwise, mem(kv_bytes), {kvp}, {kvr});
      kv_h = exchange("a2a_kv" + tag, kvr, kv_bytes, MemCategory::kAttention);
    }
    TensorSet q = b_.tensor("q" + tag, q_bytes, MemCategory::kAttention);
    compute("q_proj" + tag, OpKind::kGemm, gemm(s_, u * d, h), {sv.xn, params}, {q});
    TensorSet qr = b_.tensor("q_rope" + tag, q_bytes, MemCategory::kAttention);
    compute("rope_q" + tag, OpKind::kElementwise, mem(2 * q_bytes), {q}, {qr});
    TensorSet q_h = exchange("a2a_q" + tag, qr, q_bytes, MemCategory::kAttention);
    TensorSet o_h = b_.tensor("attn_out_h" + tag, n_ * q_local * d * ab_, MemCategory::kAttention);
    TensorSet lse = b_.tensor("lse" + tag, q_local * n_ * kFp32Bytes, MemCategory::kAttention);
    const AttentionShape shape{n_, n_, q_local, d, true};
    compute("attn_fwd" + tag, OpKind::kAttentionFwd, cost_.attention_fwd(shape), {q_h, kv_h},
            {o_h, lse});
    TensorSet o_s = exchange("a2a_out" + tag, o_h, q_bytes, MemCategory::kAttention);
    fills.push_back(
        compute("fill_out" + tag, OpKind::kElementwise, mem(2 * q_bytes), {o_s}, {}, {alloc}));
    sv.lses.push_back(lse);
  }
  // Heads back to their natural order before the output projection (an indexed copy).
  sv.o = b_.tensor("out_permuted", s_ * m_.heads * d * ab_, MemCategory::kActivations);
  compute("permute_out", OpKind::kElementwise, mem(2 * s_ * m_.heads * d * ab_), {sv.final_out},
          {sv.o}, fills);
}

StepBuilder::InputGrad StepBuilder::attention_backward_ulysses(const SavedLayer& sv,
                                                               TensorSet d_o,
                                                               TensorSet params,
                                                               TensorSet grads) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t kv = layout_.kv_heads_eff;
  const std::int64_t heads_local = m_.heads / c_;
  const std::int64_t qkv_bytes = s_ * (m_.heads + 2 * kv) * d * ab_;
  TensorSet qkv_h = sv.qkv_h, o_h = sv.o_h, lse = sv.lse;
  const AttentionShape shape{n_, n_, heads_local, d, true};
  if (!qkv_h.valid()) {
    // Selective checkpointing: the attention core runs again from the saved local QKV.
    qkv_h = exchange("a2a_qkv(re)", sv.qkv, qkv_bytes, MemCategory::kAttention);
    o_h = b_.tensor("attn_out_h(re)", n_ * heads_local * d * ab_, MemCategory::kAttention);
    lse = b_.tensor("lse(re)", heads_local * n_ * kFp32Bytes, MemCategory::kAttention);
    compute("attn_fwd(re)", OpKind::kAttentionFwd, cost_.attention_fwd(shape), {qkv_h}, {o_h, lse});
  }
  TensorSet do_h = exchange("a2a_dout", d_o, s_ * m_.heads * d * ab_, MemCategory::kAttention);
  TensorSet dqkv_h = b_.tensor("dqkv_h", qkv_bytes, MemCategory::kAttention);
  // FlashAttention backward workspace: fp32 dQ accumulator and softmax row sums (dot(dO, O)).
  const std::int64_t ws = n_ * heads_local * d * kFp32Bytes + n_ * heads_local * kFp32Bytes;
  compute("attn_bwd", OpKind::kAttentionBwd, cost_.attention_bwd(shape), {do_h, qkv_h, o_h, lse},
          {dqkv_h}, {}, ws, MemCategory::kAttention);
  TensorSet dqkv = exchange("a2a_dqkv", dqkv_h, qkv_bytes, MemCategory::kAttention);
  TensorSet dqkv_r = b_.tensor("dqkv_rope", qkv_bytes, MemCategory::kAttention);
  compute("rope_bwd", OpKind::kElementwise, mem(2 * qkv_bytes), {dqkv}, {dqkv_r});
  TensorSet dxn = b_.tensor("dxn", s_ * h * ab_, MemCategory::kOther);
  const OpSet ready = compute("qkv_proj_bwd", OpKind::kGemm,
                              times(gemm(s_, (m_.heads + 2 * m_.kv_heads) * d, h), 2.0),
                              {dqkv_r, sv.xn, params, grads}, {dxn});
  return {dxn, ready};
}

StepBuilder::InputGrad StepBuilder::attention_backward_upipe(const SavedLayer& sv,
                                                             TensorSet d_o,
                                                             TensorSet params,
                                                             TensorSet grads) {
  const std::int64_t h = m_.hidden, d = m_.head_dim;
  const std::int64_t u = layout_.heads_per_stage;
  const std::int64_t f = layout_.kv_heads_per_fetch;
  const std::int64_t q_local = u / c_;
  const std::int64_t kv_local = f / c_;
  const std::int64_t kv_bytes = s_ * 2 * f * d * ab_;
  const std::int64_t q_bytes = s_ * u * d * ab_;
  // dX accumulates the contributions of every stage's Q (and each fetch's K/V) projection.
  TensorSet dxn = b_.tensor("dxn", s_ * h * ab_, MemCategory::kOther);
  OpSet alloc = compute("upipe_alloc_dx", OpKind::kElementwise, mem(s_ * h * ab_), {}, {dxn});
  std::vector<OpSet> dx_writes{alloc};
  TensorSet kv_h, dkv_acc;
  for (std::int64_t st = 0; st < layout_.stages; ++st) {
    const std::string tag = fmt::format("[s{}]", st);
    const bool fetch_start = st % layout_.stages_per_kv_fetch == 0;
    const bool fetch_end = (st + 1) % layout_.stages_per_kv_fetch == 0;
    if (fetch_start) {
      TensorSet kvp = b_.tensor("kv(re)" + tag, kv_bytes, MemCategory::kAttention);
      compute("kv_proj(re)" + tag, OpKind::kGemm, gemm(s_, 2 * f / layout_.kv_replication * d, h),
              {sv.xn, params}, {kvp});
      TensorSet kvr = b_.tensor("kv_rope(re)" + tag, kv_bytes, MemCategory::kAttention);
      compute("rope_k(re)" + tag, OpKind::kElementwise, mem(kv_bytes), {kvp}, {kvr});
      kv_h = exchange("a2a_kv(re)" + tag, kvr, kv_bytes, MemCategory::kAttention);
      dkv_acc = b_.tensor("dkv_acc" + tag, n_ * 2 * kv_local * d * ab_, MemCategory::kAttention);
    }
    TensorSet q = b_.tensor("q(re)" + tag, q_bytes, MemCategory::kAttention);
    compute("q_proj(re)" + tag, OpKind::kGemm, gemm(s_, u * d, h), {sv.xn, params}, {q});
    TensorSet qr = b_.tensor("q_rope(re)" + tag, q_bytes, MemCategory::kAttention);
    compute("rope_q(re)" + tag, OpKind::kElementwise, mem(2 * q_bytes), {q}, {qr});
    TensorSet q_h = exchange("a2a_q(re)" + tag, qr, q_bytes, MemCategory::kAttention);
    // The stage's slice of final_out and of dOut, to head-sharded layout.
    TensorSet o_slice = b_.tensor("out_slice" + tag, q_bytes, MemCategory::kAttention);
    compute("slice_out" + tag, OpKind::kElementwise, mem(2 * q_bytes), {sv.final_out}, {o_slice});
    TensorSet o_h = exchange("a2a_out(bwd)" + tag, o_slice, q_bytes, MemCategory::kAttention);
    TensorSet do_slice = b_.tensor("dout_slice" + tag, q_bytes, MemCategory::kAttention);
    compute("slice_dout" + tag, OpKind::kElementwise, mem(2 * q_bytes), {d_o}, {do_slice});
    TensorSet do_h = exchange("a2a_dout" + tag, do_slice, q_bytes, MemCategory::kAttention);
    TensorSet dq_h = b_.tensor("dq_h" + tag, n_ * q_local * d * ab_, MemCategory::kAttention);
    const AttentionShape shape{n_, n_, q_local, d, true};
    // Workspace: fp32 dQ accumulator, softmax row sums, and, for the later stages of a K/V fetch,
    // this call's dK/dV before they are added into the fetch's accumulator (the first stage of a
    // fetch writes the accumulator directly).
    const std::int64_t partial_dkv = fetch_start ? 0 : n_ * 2 * kv_local * d * ab_;
    const std::int64_t ws = n_ * q_local * d * kFp32Bytes + n_ * q_local * kFp32Bytes + partial_dkv;
    std::vector<TensorSet> outs{dq_h};
    std::vector<TensorSet> ins{q_h, kv_h, o_h, do_h, sv.lses[static_cast<std::size_t>(st)]};
    if (fetch_start) {
      outs.push_back(dkv_acc);
    } else {
      ins.push_back(dkv_acc);
    }
    compute("attn_bwd" + tag, OpKind::kAttentionBwd, cost_.attention_bwd(shape), ins, outs, {}, ws,
            MemCategory::kAttention);
    TensorSet dq = exchange("a2a_dq" + tag, dq_h, q_bytes, MemCategory::kAttention);
    TensorSet dqr = b_.tensor("dq_rope" + tag, q_bytes, MemCategory::kAttention);
    compute("rope_q_bwd" + tag, OpKind::kElementwise, mem(2 * q_bytes), {dq}, {dqr});
    dx_writes.push_back(compute("q_proj_bwd" + tag, OpKind::kGemm, times(gemm(s_, u * d, h), 2.0),
                                {dqr, sv.xn, params, grads}, {}, {dx_writes.back()}));
    if (fetch_end) {
      TensorSet dkv = exchange("a2a_dkv" + tag, dkv_acc, kv_bytes, MemCategory::kAttention);
      TensorSet dkvr = b_.tensor("dkv_rope" + tag, kv_bytes, MemCategory::kAttention);
      compute("rope_k_bwd" + tag, OpKind::kElementwise, mem(kv_bytes), {dkv}, {dkvr});
      dx_writes.push_back(compute("kv_proj_bwd" + tag, OpKind::kGemm,
                                  times(gemm(s_, 2 * f / layout_.kv_replication * d, h), 2.0),
                                  {dkvr, sv.xn, params, grads}, {}, {dx_writes.back()}));
    }
  }
  // dxn is complete when the last projection backward has written it.
  return {dxn, dx_writes.back()};
}

TensorSet StepBuilder::layer_backward(
    int layer, const SavedLayer& sv, TensorSet dy, TensorSet params, TensorSet grads) {
  (void)layer;
  const std::int64_t h = m_.hidden, f = m_.ffn_hidden;
  const std::int64_t act_bytes = s_ * h * ab_;
  // MLP backward.
  TensorSet dh1n = b_.tensor("dh1n", act_bytes, MemCategory::kOther);
  if (r_.tiled_mlp) {
    // Per tile: recompute gate/up and activation, then dgrad and wgrad of both GEMMs.
    const KernelCost fwd =
        plus(plus(gemm(tile_, 2 * f, h), mem(4 * tile_ * f * ab_)), gemm(tile_, h, f));
    const KernelCost bwd =
        plus(times(plus(gemm(tile_, 2 * f, h), gemm(tile_, h, f)), 2.0), mem(6 * tile_ * f * ab_));
    compute(fmt::format("mlp_tiled_bwd[{}]", shards_), OpKind::kGemm,
            times(plus(fwd, bwd), static_cast<double>(shards_)), {dy, sv.h1n, params},
            {dh1n, grads}, {}, 6 * tile_ * f * ab_);
  } else {
    const KernelCost bwd =
        plus(times(plus(gemm(s_, 2 * f, h), gemm(s_, h, f)), 2.0), mem(6 * s_ * f * ab_));
    compute("mlp_bwd", OpKind::kGemm, bwd, {dy, sv.h1n, sv.gate_up, sv.act, params}, {dh1n, grads},
            {}, 3 * s_ * f * ab_);
  }
  // norm2 backward plus the residual: dh1 = dy + norm2_bwd(dh1n).
  TensorSet dh1 = b_.tensor("dh1", act_bytes, MemCategory::kOther);
  compute("norm2_bwd", OpKind::kElementwise, mem(4 * act_bytes), {dh1n, sv.h1, dy}, {dh1}, {},
          norm_workspace());
  // Output projection backward: dO = dh1 · Woᵀ, and its weight gradient.
  TensorSet d_o = b_.tensor("dout", s_ * m_.q_width() * ab_, MemCategory::kAttention);
  compute("o_proj_bwd", OpKind::kGemm, times(gemm(s_, h, m_.q_width()), 2.0),
          {dh1, sv.o, params, grads}, {d_o});
  const InputGrad g = in_.parallel.method == CpMethod::kUlysses
                          ? attention_backward_ulysses(sv, d_o, params, grads)
                          : attention_backward_upipe(sv, d_o, params, grads);
  TensorSet dx = b_.tensor("dx", act_bytes, MemCategory::kOther);
  compute("norm1_bwd", OpKind::kElementwise, mem(4 * act_bytes), {g.dxn, sv.x, dh1}, {dx},
          {g.ready}, norm_workspace());
  return dx;
}

void StepBuilder::build() {
  const std::int64_t h = m_.hidden;
  const int layers = static_cast<int>(m_.layers);
  const std::int64_t act_bytes = s_ * h * ab_;
  const CheckpointMode ac = r_.checkpointing;
  const bool full_ac = ac == CheckpointMode::kFull;
  const bool offload = full_ac && r_.checkpoint_offload;
  const std::int64_t p_layer = params_.per_layer;
  const std::int64_t p_embed = params_.embedding;
  const std::int64_t p_head =
      (params_.lm_head > 0 ? params_.lm_head : params_.embedding) + params_.final_norm;
  const int gpus = in_.parallel.gpus;

  // Static memory: FSDP/ZeRO-3 shards params, grads and optimizer states over all GPUs.
  // Bytes per parameter: fp32 master 4 + fp32 grad 4 + AdamW states 8 = 16 (recipe alst).
  const std::int64_t per_param = r_.master_param_bytes + r_.grad_bytes + r_.optimizer_state_bytes;
  const std::int64_t shard = ceil_div(params_.total, gpus);
  for (auto& sm : w_.static_memory) {
    sm.model_states_bytes = shard * per_param;
    sm.fixed_overhead_bytes = in_.hardware.fixed_overhead_bytes();
  }

  // ---- Forward -------------------------------------------------------------------------------
  b_.set_phase(Phase::kForward);
  b_.set_layer(-1);
  TensorSet emb_w =
      b_.tensor("embedding.params", p_embed * r_.param_bytes, MemCategory::kParamGather);
  OpSet ag_emb = gather_params("allgather.embedding", p_embed, emb_w, {});
  TensorSet x = b_.tensor("x0", act_bytes, MemCategory::kActivations);
  compute("embedding", OpKind::kElementwise, mem(2 * act_bytes), {emb_w}, {x});

  std::vector<TensorSet> layer_params(static_cast<std::size_t>(layers));
  std::vector<OpSet> layer_gather(static_cast<std::size_t>(layers));
  std::vector<TensorSet> checkpoints(static_cast<std::size_t>(layers));  // on GPU
  std::vector<TensorSet> host_copies(static_cast<std::size_t>(layers));  // pinned host
  std::vector<SavedLayer> saved(static_cast<std::size_t>(layers));
  auto gather_layer = [&](int l, std::vector<OpSet> deps) {
    layer_params[static_cast<std::size_t>(l)] = b_.tensor(
        fmt::format("layer{}.params", l), p_layer * r_.param_bytes, MemCategory::kParamGather);
    layer_gather[static_cast<std::size_t>(l)] =
        gather_params(fmt::format("allgather.layer{}", l), p_layer,
                      layer_params[static_cast<std::size_t>(l)], std::move(deps));
  };
  gather_layer(0, {ag_emb});
  for (int l = 0; l < layers; ++l) {
    b_.set_layer(l);
    const auto li = static_cast<std::size_t>(l);
    checkpoints[li] = x;
    const bool keep_on_gpu =
        !offload || (r_.offload_keep_first_last && (l == 0 || l == layers - 1));
    if (full_ac && !keep_on_gpu) {
      host_copies[li] =
          b_.tensor(fmt::format("ckpt{}.host", l), act_bytes, MemCategory::kActivations, true);
      OpSpec s;
      s.name = fmt::format("offload_ckpt{}", l);
      s.stream = Stream::kD2H;
      s.kind = OpKind::kCopyD2H;
      s.transfer_bytes = act_bytes;
      s.time_s = cost_.host_copy_s(act_bytes, false);
      s.inputs = {x};
      s.outputs = {host_copies[li]};
      b_.op(s);
    }
    SavedLayer sv = layer_forward(l, x, layer_params[li], /*grad=*/!full_ac);
    if (l + 1 < layers) {
      // Prefetch: the next block's gather is issued when this block starts.
      gather_layer(l + 1, {sv.first_op});
    }
    x = sv.out;
    if (ac == CheckpointMode::kSelective) {
      // The attention core is not saved: backward re-runs it from the local QKV.
      sv.qkv_h = {};
      sv.o_h = {};
      sv.lse = {};
    }
    if (!full_ac) {
      saved[li] = std::move(sv);
    }
  }

  // ---- Loss ----------------------------------------------------------------------------------
  b_.set_layer(-1);
  const std::int64_t v = m_.vocab;
  TensorSet head_w = b_.tensor("head.params", p_head * r_.param_bytes, MemCategory::kParamGather);
  gather_params("allgather.head", p_head, head_w, {});
  TensorSet xf = b_.tensor("x_final", act_bytes, MemCategory::kActivations);
  compute("final_norm", OpKind::kElementwise, mem(2 * act_bytes), {x}, {xf}, {}, norm_workspace());
  TensorSet dxf = b_.tensor("dx_final", act_bytes, MemCategory::kOther);
  TensorSet head_grads =
      b_.tensor("head.grads", p_head * r_.param_bytes, MemCategory::kParamGather);
  if (r_.fused_loss) {
    // Fused linear cross-entropy (Liger): chunks of c tokens with c ≈ s·h/V (next power of two),
    // logits of one chunk [c, V] live at a time; gradients of the input and the head weight are
    // computed in the forward: 3 GEMMs of s×V×h in total.
    std::int64_t chunk = 1;
    while (chunk < ceil_div(s_, ceil_div(v, h))) {
      chunk *= 2;
    }
    chunk = std::min(chunk, s_);
    const KernelCost k = plus(times(gemm(s_, v, h), 3.0), mem(2 * s_ * v * ab_));
    compute("fused_linear_ce", OpKind::kLoss, k, {xf, head_w}, {dxf, head_grads}, {},
            chunk * v * ab_);
  } else {
    // Logits [s, V] in bf16 saved, an fp32 upcast for the loss, and an fp32 gradient.
    TensorSet logits = b_.tensor("logits", s_ * v * ab_, MemCategory::kActivations);
    compute("lm_head", OpKind::kGemm, gemm(s_, v, h), {xf, head_w}, {logits});
    TensorSet dlogits = b_.tensor("dlogits", s_ * v * ab_, MemCategory::kOther);
    compute("cross_entropy", OpKind::kLoss, mem(4 * s_ * v * kFp32Bytes), {logits}, {dlogits}, {},
            2 * s_ * v * kFp32Bytes);
    compute("lm_head_bwd", OpKind::kGemm, times(gemm(s_, v, h), 2.0), {dlogits, xf, head_w},
            {dxf, head_grads});
  }
  OpSet rs_head = reduce_grads("reducescatter.head", p_head, head_grads, {});
  (void)rs_head;
  TensorSet dy = b_.tensor("dy", act_bytes, MemCategory::kOther);
  OpSet fn_bwd = compute("final_norm_bwd", OpKind::kElementwise, mem(3 * act_bytes), {dxf, x}, {dy},
                         {}, norm_workspace());

  // ---- Backward ------------------------------------------------------------------------------
  b_.set_phase(Phase::kBackward);
  std::vector<OpSet> fetch(static_cast<std::size_t>(layers));
  auto prefetch = [&](int l, OpSet after) {
    const auto li = static_cast<std::size_t>(l);
    gather_layer(l, {after});
    if (host_copies[li].valid()) {
      checkpoints[li] = b_.tensor(fmt::format("ckpt{}", l), act_bytes, MemCategory::kActivations);
      OpSpec s;
      s.name = fmt::format("prefetch_ckpt{}", l);
      s.stream = Stream::kH2D;
      s.kind = OpKind::kCopyH2D;
      s.transfer_bytes = act_bytes;
      s.time_s = cost_.host_copy_s(act_bytes, true);
      s.inputs = {host_copies[li]};
      s.outputs = {checkpoints[li]};
      s.deps = {after};
      fetch[li] = b_.op(s);
    }
  };
  b_.set_layer(layers - 1);
  prefetch(layers - 1, fn_bwd);
  OpSet last_rs;
  for (int l = layers - 1; l >= 0; --l) {
    b_.set_layer(l);
    const auto li = static_cast<std::size_t>(l);
    SavedLayer sv;
    if (full_ac) {
      b_.set_phase(Phase::kRecompute);
      sv = layer_forward(l, checkpoints[li], layer_params[li], /*grad=*/true);
      b_.set_phase(Phase::kBackward);
    } else {
      sv = std::move(saved[li]);
    }
    if (l > 0) {
      prefetch(l - 1, full_ac ? sv.first_op : OpSet{});
    }
    TensorSet grads = b_.tensor(fmt::format("layer{}.grads", l), p_layer * r_.param_bytes,
                                MemCategory::kParamGather);
    dy = layer_backward(l, sv, dy, layer_params[li], grads);
    last_rs = reduce_grads(fmt::format("reducescatter.layer{}", l), p_layer, grads, {});
  }
  b_.set_layer(-1);
  TensorSet emb_grads =
      b_.tensor("embedding.grads", p_embed * r_.param_bytes, MemCategory::kParamGather);
  compute("embedding_bwd", OpKind::kElementwise, mem(2 * act_bytes), {dy}, {emb_grads});
  last_rs = reduce_grads("reducescatter.embedding", p_embed, emb_grads, {});

  // ---- Optimizer -----------------------------------------------------------------------------
  // AdamW over the local shard: reads param, grad, m, v (fp32) and writes param, m, v.
  b_.set_phase(Phase::kOptimizer);
  compute("adamw", OpKind::kOptimizer, mem(shard * 28), {}, {}, {last_rs});

  w_.notes.push_back("unsharded gradients of a block are allocated when its backward starts");
  w_.notes.push_back("FSDP all-gather and reduce-scatter share one stream (FSDP2 uses two)");
  if (in_.hardware.compute_slowdown_under_comm == 0.0) {
    w_.notes.push_back("compute is not slowed by concurrent NCCL kernels (no calibrated factor)");
  }
  if (b_.span_of(Group::kAll) == models::Span::kInterNode ||
      b_.span_of(Group::kCp) == models::Span::kInterNode) {
    w_.notes.push_back("inter-node collectives use one NIC per GPU at the NIC's busbw (crude)");
  }
  if (!r_.expandable_segments) {
    w_.notes.push_back("allocator fragmentation without expandable segments is not modelled");
  }
}

}  // namespace

Workload build_step(const ScheduleInputs& inputs) {
  inputs.model.validate();
  inputs.recipe.validate();
  if (inputs.recipe.zero_stage != 3) {
    throw InputError("--zero", "only ZeRO-3 (FSDP full shard) is modelled in this version");
  }
  Workload w;
  StepBuilder builder(inputs, w);
  builder.build();
  return w;
}

}  // namespace cpsim::sim
