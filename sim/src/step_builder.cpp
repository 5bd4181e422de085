// The step: embedding → L blocks forward → final norm + loss → L blocks backward → optimizer,
// with ZeRO/FSDP sharding, activation checkpointing and checkpoint offload. Attention schemes are
// in attention_*.cpp, each with the derivation of what it saves and recomputes at its top;
// schedule.cpp derives the checkpointing modes, the attention buffer sizes and the model states.
#include "step_builder.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"

namespace cpsim::sim::detail {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

}  // namespace

StepBuilder::StepBuilder(const ScheduleInputs& in,
                         const HeadLayout& layout,
                         const Implementation* implementation,
                         Workload& w,
                         int simulated_ranks,
                         bool merge_ring_steps,
                         bool repeat_layers)
    : OpEmitter(in, layout, implementation, w, simulated_ranks),
      KernelCosts(cost_, in, implementation),
      layout_(layout),
      implementation_(implementation),
      method_(cp_scheme(in.parallel.method)) {
  params_ = models::count_parameters(m_);
  if (shape_.ep > 1) {
    expert_params_ = params_.experts_per_layer / shape_.ep;
    const std::int64_t elsewhere = params_.experts_per_layer - expert_params_;
    params_.per_layer -= elsewhere;
    params_.mlp_per_layer -= elsewhere;
    params_.experts_per_layer = expert_params_;
    params_.total -= m_.sparse_layers() * elsewhere;
  }
  {
    const std::int64_t all = b_.group_size(Group::kAll);
    const std::int64_t experts = m_.sparse_layers() * expert_params_;
    updated_params_ = r_.zero_stage == 0 ? params_.total
                                         : ceil_div(params_.total - experts, all) +
                                               ceil_div(experts, b_.group_size(Group::kExpertData));
  }
  // Packed documents make ring steps unlike one another: each is its own op.
  merge_ring_ = merge_ring_steps && simulated_ranks < in.parallel.gpus && in.documents.empty();
  // Blocks whose attention differs (some windowed or chunked, some not) are built one by one.
  const bool differ = m_.mixed_attention() &&
                      ((m_.windowed_layers() > 0 && m_.sliding_window < shape_.seq_tokens) ||
                       (m_.chunked_layers() > 0 && m_.attention_chunk < shape_.seq_tokens));
  repeat_layers_ = repeat_layers && !differ && !m_.mixed_mlp();  // layers with and without experts
  layer_experts_ = m_.is_moe();                                  // enter_layer sets each layer's
  tp_regather_ = implementation_ == nullptr || implementation_->tp_regathers_inputs();
  shards_ =
      r_.tiled_mlp_shards > 0 ? r_.tiled_mlp_shards : ceil_div(shape_.local_tokens, m_.hidden);
  if (implementation_ != nullptr) {
    acc_bytes_ = implementation_->ring_accumulator_bytes(in);
    experts_ = implementation_->experts(in.parallel.method);
    logits_loss_ = implementation_->logits_loss();
  }
  tile_ = ceil_div(shape_.local_tokens, shards_);
}

std::int64_t StepBuilder::norm_workspace() const {
  // Upcasting RMSNorm (torch.nn.RMSNorm unfused, HF eager): fp32 input copy and fp32 normalised
  // result while it runs (2 × 4 bytes per element; in eager mode the fp32 input is the saved
  // tensor and the second temporary is the fp32 gradient of the backward), tile-sized when the
  // norm is tiled. A fused kernel (Liger) needs one fp32 rstd per row: nothing at this scale.
  if (r_.norm_kernel == models::NormKernel::kFused) {
    return 0;
  }
  const std::int64_t rows = r_.tiled_norm ? std::min(tile_, shape_.sp_tokens) : shape_.sp_tokens;
  return rows * m_.hidden * 2 * kFp32Bytes;
}

std::int64_t StepBuilder::norm_saved_bytes(std::int64_t rows, std::int64_t width) const {
  // HF eager LlamaRMSNorm keeps the fp32 input (read by pow and by the rsqrt product) and the bf16
  // normalised tensor (read by the weight product): 4 + 2 bytes per element. A tiled norm
  // recomputes per tile and keeps nothing; upcast and fused norms keep only their input.
  if (r_.norm_kernel != models::NormKernel::kEager || r_.tiled_norm) {
    return 0;
  }
  return rows * width * (kFp32Bytes + shape_.activation_bytes);
}

OpSet StepBuilder::gather_params(
    Name name, std::int64_t params, TensorSet out, ListRef<OpSet> deps, Group group) {
  TensorSet staged;
  OpSet copied;
  if (r_.param_offload) {
    // ZeRO-3 offload_param: the rank's shard comes from host memory first, then the all-gather
    // (on one GPU the copy fills the whole buffer). DeepSpeed issues both under its all-gather
    // stream (zero/partitioned_param_coordinator.py:606 `with stream(self.__allgather_stream)`
    // around all_gather_coalesced, whose shard `.to(device)` is
    // zero/partition_parameters.py:61-106; the stream itself zero/parameter_offload.py:195-196,
    // deepspeed 0.19.8; read in calibrate/tracer/findings-zero3.md), so the copies allocate from
    // that stream's pool, as the all-gather does: cpsim's H2D stream times them, the all-gather
    // pool holds their memory.
    const std::int64_t shard_bytes = ceil_div(params, b_.group_size(group)) * r_.param_bytes;
    if (b_.group_size(group) == 1) {
      return host_copy(name.text(w_) + "(from host)", true, shard_bytes, TensorSet{}, out, deps,
                       MemoryPool::kGather);
    }
    staged = b_.tensor(name.text(w_) + ".shard", shard_bytes, MemCategory::kParamGather);
    copied = host_copy(name.text(w_) + "(from host)", true, shard_bytes, TensorSet{}, staged, deps,
                       MemoryPool::kGather);
  }
  OpSpec& s = next_spec(name, Stream::kFsdp, OpKind::kElementwise);
  s.memory_pool = MemoryPool::kGather;
  s.outputs.push_back(out);
  if (copied.valid()) {
    s.inputs.push_back(staged);
    s.deps.push_back(copied);
  } else {
    s.deps.assign(deps.begin(), deps.end());
  }
  return b_.collective(s, group, models::Collective::kAllGather, cost_, params * r_.param_bytes);
}

bool StepBuilder::zero3_host_grad_partitions() const {
  return r_.zero_stage == 3 && r_.optimizer_offload && r_.host_grad_partition_buffer;
}

std::int64_t StepBuilder::largest_layer_param() const {
  // q_proj/o_proj [h, H·d], k_proj/v_proj [h, Hkv·d], the MLP's matrices [h, f] (one TP rank's
  // share: m_ is the rank's view); MLA's up projections [r, H·d] and [r_kv, H·(d − d_r + d_v)].
  const models::MlaSpec& a = m_.mla;
  const std::int64_t mla_up =
      m_.is_mla() ? std::max(a.q_lora_rank * m_.q_width(),
                             a.kv_lora_rank * m_.heads *
                                 (m_.head_dim - a.rope_head_dim + m_.value_head_dim()))
                  : 0;
  return std::max(mla_up, m_.hidden * std::max({m_.q_width(), m_.kv_width(), m_.mlp_width(),
                                                m_.mixed_mlp() ? m_.ffn_hidden : 0}));
}

// DeepSpeed ZeRO-3 with the optimizer offloaded (the gradient partitions in a host buffer) makes,
// per reduction, on its reduce stream (`with stream(self.reduce_and_partition_stream)`,
// zero/stage3.py:1669; deepspeed 0.19.8, read and checked byte for byte against a run in
// calibrate/tracer/findings-zero3.md; the same formulas in v0.17.2):
//   cat:  reduce_scatter_coalesced's torch.cat of the bucket's gradients when the reduction holds
//         more than one tensor, bucket elements × the reduce dtype (comm/coalesced_collectives.py:
//         102-122 via stage3.py:1678, 1911-1946). A parameter above reduce_bucket_size is reduced
//         alone, without it (stage3.py:1626: Llama-8B's LM head and embedding). cpsim reduces per
//         block, so a block's cat is its own gradients (the real bucket spans ~2 blocks of
//         Llama-8B, up to reduce_bucket_size; v0.17.2, which the recipes ran, makes none at all);
//   then for each parameter in turn, with n_p its partition's elements (⌈n/G⌉), live together:
//         the partition copied back from the host buffer, n_p × the gradient dtype
//         (stage3.py:2023-2028, `grad_buffer.to(grad_partition.device)`), an fp64 norm chunk,
//         8·min(n_p, 2.5e8) (stage3.py:1446, 1960-1967, _constant_buffered_norm2's
//         `.to(get_norm_dtype())` per 2.5e8-element split; fp64: zero/utils.py:59-63), and the fp32
//         cast for the copy to the host fp32 gradients, 4·n_p (stage3.py:1456-1457), which
//         reuses the freed norm chunk: max(8·min(n_p, 2.5e8), 4·n_p) beside the copy.
// Bytes = cat + max over the parameters of [g·n_p + max(8·min(n_p, 2.5e8), 4·n_p)], the largest
// parameter's. Not modelled: the 8-byte norm kept per parameter to the step (stage3.py:1446; 2 KiB
// for Llama-8B) and, with G > 1, the reduce-scatter's output partitions.
std::int64_t StepBuilder::zero3_offload_reduce_bytes(std::int64_t params,
                                                     std::int64_t largest) const {
  constexpr std::int64_t kNormChunkElements = 250'000'000;  // _constant_buffered_norm2 buffer_size
  constexpr std::int64_t kFp64Bytes = 8;
  const std::int64_t bucket = r_.reduce_bucket_elements;
  std::int64_t cat = 0;
  if (bucket <= 0) {
    cat = params * r_.grad_reduce_bytes;
  } else if (largest <= bucket) {
    cat = std::min(params, bucket) * r_.grad_reduce_bytes;
  }
  const std::int64_t partition = ceil_div(largest, b_.group_size(Group::kAll));
  return cat + partition * r_.grad_bytes +
         std::max(kFp64Bytes * std::min(partition, kNormChunkElements), kFp32Bytes * partition);
}

OpSet StepBuilder::reduce_grads(Name name,
                                std::int64_t params,
                                std::int64_t largest,
                                TensorSet grads,
                                ListRef<OpSet> deps,
                                Group group) {
  // The gradients are cast to the reduce dtype into the collective's buffer. ZeRO ≥ 2 reduce-
  // scatters them; ZeRO 0/1 all-reduce into the persistent unsharded gradients. `deps` must hold
  // the op that finishes the gradients: under ZeRO 0/1 `grads` is none (the persistent gradients
  // are model states), and a ZeRO ≥ 2 buffer's producer is its first writer, not its last.
  // DeepSpeed ZeRO-3 with optimizer offload: its reduce-stream transients instead, in that
  // stream's own pool (zero3_offload_reduce_bytes).
  const bool host_partitions = zero3_host_grad_partitions();
  // Megatron's DDP reduces the persistent fp32 gradients in place (reduces_gradients_in_place).
  const bool in_place = implementation_ != nullptr &&
                        implementation_->reduces_gradients_in_place() && r_.zero_stage <= 1 &&
                        r_.grad_bytes == r_.grad_reduce_bytes;
  const std::int64_t workspace = host_partitions ? zero3_offload_reduce_bytes(params, largest)
                                 : in_place      ? 0
                                                 : params * r_.grad_reduce_bytes;
  const MemoryPool pool = host_partitions ? MemoryPool::kReduce : MemoryPool::kByStream;
  const auto kind =
      r_.zero_stage >= 2 ? models::Collective::kReduceScatter : models::Collective::kAllReduce;
  if (b_.group_size(group) == 1) {
    const KernelCost k = mem(params * r_.grad_reduce_bytes);
    OpSpec& s = next_spec(name.text(w_) + "(local)", Stream::kCompute, OpKind::kElementwise);
    s.time_s = k.time_s;
    s.flops = k.flops;
    s.host_calls = k.host_calls;
    s.inputs.push_back(grads);
    s.deps.assign(deps.begin(), deps.end());
    s.workspace_bytes = workspace;
    s.workspace_category = MemCategory::kGradBuffers;
    s.memory_pool = pool;
    return b_.op(s);
  }
  OpSpec& s = next_spec(name, Stream::kFsdp, OpKind::kElementwise);
  s.inputs.push_back(grads);
  s.deps.assign(deps.begin(), deps.end());
  s.workspace_bytes = workspace;
  s.workspace_category = MemCategory::kGradBuffers;
  s.memory_pool = pool;
  return b_.collective(s, group, kind, cost_, params * r_.grad_reduce_bytes);
}

// With tensor parallelism (T > 1) the norms and residuals run on the rank's s/T tokens (sequence
// parallel), each GEMM block on all s tokens of its TP share (tp_exchange around them). What the
// backward keeps of a column-parallel block's input is the implementation's: Megatron's linears
// save the [s/T, h] shard and gather it again (tensor_parallel/layers.py:604, 623-629, 667-680 @
// d98e8a6), TorchTitan's DTensor linears save the gathered [s, h] input (PrepareModuleInput to
// Replicate before wq/wk/wv and w1/w3, llama3/infra/parallelize.py:219-240 @ 73a0e69). Everything
// else a block keeps is a TP share already (heads/T, f/T) or s/T tokens: Korthikanti et al.'s
// activations per layer with SP, sbh·(34/t + 5as/(ht)) in their dropout-and-softmax accounting.
// MLP (SwiGLU): gate/up GEMM [s, h] × [h, 2f], activation, down GEMM [s, f] × [f, h]; what the
// backward needs goes into `sv`. Returns the MLP's output (before TP's reduce-scatter). A mixture
// of experts: step_experts.cpp.
TensorSet StepBuilder::mlp_forward(SavedLayer& sv, TensorSet h1n, TensorSet params, bool grad) {
  if (layer_experts_) {
    return moe_forward(sv, h1n, params, grad);
  }
  const std::int64_t h = m_.hidden;
  const std::int64_t f = m_.ffn_hidden;
  TensorSet mlp_out =
      b_.tensor("mlp_out", shape_.local_tokens * h * shape_.activation_bytes,
                shape_.tp == 1 ? post_norm_input_category(grad) : MemCategory::kOther);
  if (r_.tiled_mlp) {
    // Tiles of `tile_` tokens; only one tile's intermediates (gate, up, act) are live at a time.
    const KernelCost one =
        plus(plus(gemm(tile_, 2 * f, h), mem(4 * tile_ * f * shape_.activation_bytes)),
             gemm(tile_, h, f));
    compute(fmt::format("mlp_tiled[{}]", shards_), OpKind::kGemm,
            times(one, static_cast<double>(shards_)), {h1n, params}, {mlp_out}, {},
            3 * tile_ * f * shape_.activation_bytes);
  } else {
    gated_mlp_forward(sv.mlp, h1n, params, grad, {shape_.local_tokens, f, 1}, mlp_out);
  }
  return mlp_out;
}

KernelCost StepBuilder::grouped(KernelCost one, std::int64_t groups) {
  return groups == 1 ? one : times(one, static_cast<double>(groups));
}

void StepBuilder::gated_mlp_forward(
    MlpSaved& saved, TensorSet in, TensorSet params, bool grad, const GatedMlp& g, TensorSet out) {
  const std::int64_t h = m_.hidden, f = g.width, rows = g.rows, a = shape_.activation_bytes;
  const std::int64_t group_rows = (rows + g.groups - 1) / g.groups;
  TensorSet gate_up = b_.tensor("gate_up", rows * 2 * f * a, MemCategory::kActivations);
  compute("mlp_gate_up", OpKind::kGemm, grouped(linear_fwd(group_rows, 2 * f, h, grad), g.groups),
          {in, params}, {gate_up});
  TensorSet act = b_.tensor("mlp_act", rows * f * a, MemCategory::kActivations);
  std::vector<TensorSet> act_out = {act};
  if (grad && (r_.mlp_kernel == models::MlpKernel::kEager || g.eager_activation)) {
    // silu(gate), kept by the product for its backward.
    saved.silu = b_.tensor("mlp_silu", rows * f * a, MemCategory::kActivations);
    act_out.push_back(saved.silu);
  }
  if (grad && g.gate_up_copies > 0) {
    saved.gate_up_copies =
        b_.tensor("mlp_clamped", g.gate_up_copies * rows * 2 * f * a, MemCategory::kActivations);
    act_out.push_back(saved.gate_up_copies);
  }
  compute("mlp_act", OpKind::kElementwise, swiglu_cost(rows * f, false), {gate_up},
          std::move(act_out));
  std::vector<TensorSet> down_out = {out};
  TensorSet act_kept = act;
  if (r_.fp8 && grad) {
    act_kept = b_.tensor("mlp_act_fp8", rows * f, MemCategory::kActivations);
    down_out.push_back(act_kept);
  }
  compute("mlp_down", OpKind::kGemm, grouped(linear_fwd(group_rows, h, f, grad), g.groups),
          {act, params}, std::move(down_out));
  if (grad) {
    saved.gate_up = gate_up;
    saved.act = act_kept;
  }
}

// Gemma 3's post_attention_layernorm and post_feedforward_layernorm (modeling_gemma3.py:388-400,
// transformers 4.57.6): residual + norm(sub-block(norm(x))). Each is an RMSNorm like the pre-norms
// (the same kernel, cost and saved tensors: norm_cost, norm_saved_bytes) on the sub-block's
// output, which its backward reads: that output is kept from the forward to the backward.
MemCategory StepBuilder::post_norm_input_category(bool grad) const {
  return m_.post_sublayer_norms && grad ? MemCategory::kActivations : MemCategory::kOther;
}

TensorSet StepBuilder::post_norm(
    const char* name, TensorSet in, bool grad, TensorSet& kept_in, TensorSet& kept) {
  if (!m_.post_sublayer_norms) {
    return in;
  }
  const std::int64_t h = m_.hidden;
  const std::int64_t act_bytes = shape_.sp_tokens * h * shape_.activation_bytes;
  TensorSet out = b_.tensor(name, act_bytes, MemCategory::kOther);
  std::vector<TensorSet> outs = {out};
  if (const std::int64_t saved = norm_saved_bytes(shape_.sp_tokens, h); saved > 0 && grad) {
    kept = b_.tensor(name, saved, MemCategory::kActivations);
    outs.push_back(kept);
  }
  compute(name, OpKind::kElementwise, norm_cost(shape_.sp_tokens * h, 2 * act_bytes, false), {in},
          std::move(outs), {}, norm_workspace());
  if (grad) {
    kept_in = in;
  }
  return out;
}

TensorSet StepBuilder::post_norm_backward(const char* name,
                                          TensorSet d_out,
                                          TensorSet in,
                                          TensorSet kept) {
  if (!m_.post_sublayer_norms) {
    return d_out;
  }
  const std::int64_t act_bytes = shape_.sp_tokens * m_.hidden * shape_.activation_bytes;
  TensorSet d_in = b_.tensor(name, act_bytes, MemCategory::kOther);
  std::vector<TensorSet> ins = {d_out, in};
  if (kept.valid()) {
    ins.push_back(kept);
  }
  compute(name, OpKind::kElementwise, norm_cost(shape_.sp_tokens * m_.hidden, 4 * act_bytes, true),
          std::move(ins), {d_in}, {}, norm_workspace());
  return d_in;
}

SavedLayer StepBuilder::layer_forward(TensorSet x, TensorSet params, bool grad) {
  const std::int64_t h = m_.hidden;
  const std::int64_t act_bytes = shape_.sp_tokens * h * shape_.activation_bytes;
  const MemCategory gathered_cat =
      grad && !tp_regather_ ? MemCategory::kActivations : MemCategory::kOther;
  SavedLayer sv;
  sv.x = x;
  sv.xn = b_.tensor("xn", act_bytes, MemCategory::kActivations);
  std::vector<TensorSet> norm1_out = {sv.xn};
  if (const std::int64_t saved = norm_saved_bytes(shape_.sp_tokens, h); saved > 0 && grad) {
    sv.norm1_saved = b_.tensor("norm1_saved", saved, MemCategory::kActivations);
    norm1_out.push_back(sv.norm1_saved);
  }
  sv.first_op =
      compute("norm1", OpKind::kElementwise, norm_cost(shape_.sp_tokens * h, 2 * act_bytes, false),
              {x}, norm1_out, {}, norm_workspace());
  const TensorSet xn_sp = sv.xn;
  sv.xn = tp_exchange("tp_ag.xn", xn_sp, true, gathered_cat);
  method_.attention_forward(*this, sv, params, grad);
  if (tp_regather_) {
    sv.xn = xn_sp;  // the backward gathers it again
  }
  // Output projection and residual.
  TensorSet attn_out =
      b_.tensor("attn_out", shape_.local_tokens * h * shape_.activation_bytes,
                shape_.tp == 1 ? post_norm_input_category(grad) : MemCategory::kOther);
  // FP8 (TransformerEngine Linear, linear.py:595-616 @ d0067d0): each Linear saves the column-wise
  // FP8 copy of its input for wgrad, 1 byte per element, and not its bf16 input. The output
  // projection's input is also the attention's saved output (kept in bf16 as before): its FP8
  // copy adds s·H·d bytes. The down projection's input (the SwiGLU product) is kept by nothing
  // else: f bytes per token instead of 2f. Q/K/V's and gate/up's inputs (the norms' outputs,
  // which TransformerEngine's LayerNormLinear keeps in FP8 only) stay in bf16 here.
  std::vector<TensorSet> o_proj_out = {attn_out};
  if (r_.fp8 && grad) {
    sv.o_fp8 = b_.tensor("o_fp8", shape_.local_tokens * m_.o_width(), MemCategory::kActivations);
    o_proj_out.push_back(sv.o_fp8);
  }
  compute("o_proj", OpKind::kGemm, linear_fwd(shape_.local_tokens, h, m_.o_width(), grad),
          {sv.o, params}, std::move(o_proj_out), {sv.attn_ready});
  attn_out = tp_exchange("tp_rs.attn_out", attn_out, false, post_norm_input_category(grad));
  attn_out = post_norm("post_attn_norm", attn_out, grad, sv.post_attn_in, sv.post_attn_saved);
  sv.h1 = b_.tensor("h1", act_bytes, MemCategory::kActivations);
  compute("residual1", OpKind::kElementwise, mem(3 * act_bytes), {x, attn_out}, {sv.h1});
  sv.h1n = b_.tensor("h1n", act_bytes, MemCategory::kActivations);
  std::vector<TensorSet> norm2_out = {sv.h1n};
  if (const std::int64_t saved = norm_saved_bytes(shape_.sp_tokens, h); saved > 0 && grad) {
    sv.norm2_saved = b_.tensor("norm2_saved", saved, MemCategory::kActivations);
    norm2_out.push_back(sv.norm2_saved);
  }
  compute("norm2", OpKind::kElementwise, norm_cost(shape_.sp_tokens * h, 2 * act_bytes, false),
          {sv.h1}, norm2_out, {}, norm_workspace());
  const TensorSet h1n = tp_exchange("tp_ag.h1n", sv.h1n, true, gathered_cat);
  if (!tp_regather_) {
    sv.h1n = h1n;
  }
  TensorSet mlp_out = mlp_forward(sv, h1n, params, grad);
  mlp_out = tp_exchange("tp_rs.mlp_out", mlp_out, false, post_norm_input_category(grad));
  mlp_out = post_norm("post_mlp_norm", mlp_out, grad, sv.post_mlp_in, sv.post_mlp_saved);
  sv.out = b_.tensor("block_out", act_bytes, MemCategory::kActivations);
  sv.last_op =
      compute("residual2", OpKind::kElementwise, mem(3 * act_bytes), {sv.h1, mlp_out}, {sv.out});
  return sv;
}

// MLP backward from the gradient of its output `dy_full` and its input `h1n`; returns the
// gradient of its input (before TP's reduce-scatter). With T > 1 under Megatron the gate/up wgrad
// is an op of its own, overlapping dh1n's reduce-scatter.
TensorSet StepBuilder::mlp_backward(
    const SavedLayer& sv, TensorSet dy_full, TensorSet h1n, TensorSet params, TensorSet grads) {
  if (layer_experts_) {
    return moe_backward(sv, dy_full, h1n, params, grads);
  }
  const std::int64_t h = m_.hidden, f = m_.ffn_hidden;
  TensorSet dh1n =
      b_.tensor("dh1n", shape_.local_tokens * h * shape_.activation_bytes, MemCategory::kOther);
  if (r_.tiled_mlp) {
    // Per tile: recompute gate/up and activation, then dgrad and wgrad of both GEMMs.
    const KernelCost fwd =
        plus(plus(gemm(tile_, 2 * f, h), mem(4 * tile_ * f * shape_.activation_bytes)),
             gemm(tile_, h, f));
    const KernelCost bwd = plus(times(plus(gemm(tile_, 2 * f, h), gemm(tile_, h, f)), 2.0),
                                mem(6 * tile_ * f * shape_.activation_bytes));
    compute(fmt::format("mlp_tiled_bwd[{}]", shards_), OpKind::kGemm,
            times(plus(fwd, bwd), static_cast<double>(shards_)), {dy_full, h1n, params},
            {dh1n, grads}, {}, 6 * tile_ * f * shape_.activation_bytes);
  } else if (shape_.tp > 1 && tp_regather_) {
    // Megatron: down's dgrad and wgrad, the activation's backward and gate/up's dgrad; then
    // gate/up's wgrad (reading the gathered h1n) while dh1n is reduce-scattered. dgate/dup
    // (2f, none extra for Liger's in-place kernel) live until that wgrad.
    std::vector<TensorSet> kept = {dy_full, sv.mlp.gate_up, sv.mlp.act, params};
    if (sv.mlp.silu.valid()) {
      kept.push_back(sv.mlp.silu);
    }
    const std::int64_t grads_f = mlp_grad_widths();
    const TensorSet dgate_up =
        b_.tensor("dgate_up", (grads_f - 1) * shape_.local_tokens * f * shape_.activation_bytes,
                  MemCategory::kOther);
    const KernelCost dgrad = plus(
        plus(linear_bwd(shape_.local_tokens, h, f), linear_dgrad(shape_.local_tokens, 2 * f, h)),
        swiglu_cost(shape_.local_tokens * f, true));
    compute("mlp_bwd", OpKind::kGemm, dgrad, std::move(kept), {dh1n, dgate_up, grads}, {},
            shape_.local_tokens * f * shape_.activation_bytes);
    compute("mlp_wgrad", OpKind::kGemm, linear_wgrad(shape_.local_tokens, 2 * f, h),
            {dgate_up, h1n, params}, {});
  } else {
    gated_mlp_backward(sv.mlp, dy_full, h1n, params, grads, {shape_.local_tokens, f, 1}, dh1n);
  }
  return dh1n;
}

std::int64_t StepBuilder::mlp_grad_widths(bool eager_activation) const {
  // Gradients held at once: the product's, then dgate and dup (3f); Liger writes the latter two
  // over gate and up, leaving only the product's (f).
  return r_.mlp_kernel == models::MlpKernel::kFused && !eager_activation ? 1 : 3;
}

void StepBuilder::gated_mlp_backward(const MlpSaved& saved,
                                     TensorSet dy,
                                     TensorSet in,
                                     TensorSet params,
                                     TensorSet grads,
                                     const GatedMlp& g,
                                     TensorSet dx,
                                     bool grads_exist,
                                     TensorSet dx_partial) {
  const std::int64_t h = m_.hidden, f = g.width, rows = g.rows;
  const std::int64_t group_rows = (rows + g.groups - 1) / g.groups;
  const KernelCost bwd =
      plus(grouped(plus(linear_bwd(group_rows, 2 * f, h), linear_bwd(group_rows, h, f)), g.groups),
           swiglu_cost(rows * f, true));
  std::vector<TensorSet> kept = {dy, in, saved.gate_up, saved.act, params};
  for (const TensorSet t : {saved.silu, saved.gate_up_copies, dx_partial}) {
    if (t.valid()) {
      kept.push_back(t);
    }
  }
  std::vector<TensorSet> written = {dx};
  (grads_exist ? kept : written).push_back(grads);
  compute("mlp_bwd", OpKind::kGemm, bwd, std::move(kept), std::move(written), {},
          mlp_grad_widths(g.eager_activation) * rows * f * shape_.activation_bytes);
}

TensorSet StepBuilder::layer_backward(
    const SavedLayer& sv, TensorSet dy, TensorSet params, TensorSet grads, bool reentrant) {
  const std::int64_t h = m_.hidden;
  const std::int64_t act_bytes = shape_.sp_tokens * h * shape_.activation_bytes;
  // With T > 1 the backward of the reduce-scatter after down is an all-gather of dy, that of the
  // all-gather before gate/up a reduce-scatter of dh1n; a regathering implementation issues the
  // gather of its saved input next (Megatron overlaps it with the dgrad GEMM; cpsim with whatever
  // runs on the compute stream). Megatron also overlaps the reduce-scatter of the input gradient
  // with the wgrad GEMM (layers.py:700-707, async_op): the untiled MLP's gate/up wgrad is an op of
  // its own for that; the Q/K/V backward is the scheme's one op, so its reduce-scatter is exposed
  // (a limit noted with the results).
  const TensorSet d_mlp_out =
      post_norm_backward("post_mlp_norm_bwd", dy, sv.post_mlp_in, sv.post_mlp_saved);
  const TensorSet dy_full = tp_exchange("tp_ag.dy", d_mlp_out, true);
  const TensorSet h1n = tp_regather_ ? tp_exchange("tp_ag.h1n(re)", sv.h1n, true) : sv.h1n;
  TensorSet dh1n = mlp_backward(sv, dy_full, h1n, params, grads);
  dh1n = tp_exchange("tp_rs.dh1n", dh1n, false);
  // norm2 backward plus the residual: dh1 = dy + norm2_bwd(dh1n).
  TensorSet dh1 = b_.tensor("dh1", act_bytes, MemCategory::kOther);
  std::vector<TensorSet> norm2_in = {dh1n, sv.h1, dy};
  if (sv.norm2_saved.valid()) {
    norm2_in.push_back(sv.norm2_saved);
  }
  compute("norm2_bwd", OpKind::kElementwise, norm_cost(shape_.sp_tokens * h, 4 * act_bytes, true),
          std::move(norm2_in), {dh1}, {}, norm_workspace());
  // Output projection backward: dO = dh1 · Woᵀ, and its weight gradient.
  const TensorSet d_attn_out =
      post_norm_backward("post_attn_norm_bwd", dh1, sv.post_attn_in, sv.post_attn_saved);
  const TensorSet dh1_full = tp_exchange("tp_ag.dh1", d_attn_out, true);
  SavedLayer regathered;
  if (shape_.tp > 1 && tp_regather_) {
    regathered = sv;
    regathered.xn = tp_exchange("tp_ag.xn(re)", sv.xn, true);
  }
  const SavedLayer& saved = shape_.tp > 1 && tp_regather_ ? regathered : sv;
  TensorSet d_o = b_.tensor("dout", shape_.local_tokens * m_.o_width() * shape_.activation_bytes,
                            MemCategory::kAttention);
  std::vector<TensorSet> o_proj_in = {dh1_full, sv.o, params, grads};
  if (sv.o_fp8.valid()) {
    o_proj_in.push_back(sv.o_fp8);
  }
  compute("o_proj_bwd", OpKind::kGemm, linear_bwd(shape_.local_tokens, h, m_.o_width()),
          std::move(o_proj_in), {d_o});
  const InputGrad g = method_.attention_backward(*this, saved, d_o, params, grads);
  const TensorSet dxn = tp_exchange("tp_rs.dxn", g.dxn, false, MemCategory::kOther, {g.ready});
  TensorSet dx = b_.tensor("dx", act_bytes, MemCategory::kOther);
  std::vector<TensorSet> norm1_in = {dxn, sv.x, dh1};
  if (sv.norm1_saved.valid()) {
    norm1_in.push_back(sv.norm1_saved);
  }
  if (reentrant) {
    // CheckpointFunction.backward holds `outputs = run_function(*inputs)` and its grad arguments
    // until torch.autograd.backward(outputs, grads) returns: two [s, h] tensors for the whole
    // block backward (non-reentrant checkpointing frees both as soon as they are consumed).
    norm1_in.push_back(sv.out);
    norm1_in.push_back(dy);
  }
  compute("norm1_bwd", OpKind::kElementwise, norm_cost(shape_.sp_tokens * h, 4 * act_bytes, true),
          std::move(norm1_in), {dx}, {g.ready}, norm_workspace());
  return dx;
}

// ---- the step ---------------------------------------------------------------------------------

// Gradient accumulation over M micro-batches of one sequence (ParallelConfig::micro_batches):
// M forward/backward passes, one after the other (no pipeline), then one optimizer step; only
// one micro-batch's activations are live at a time. Gradients are reduced after every micro-batch
// under ZeRO ≥ 2 (FSDP2 reduce-scatters each backward unless told not to sync; DeepSpeed ZeRO-2/3
// reduce per micro-batch), after the last one under ZeRO 0/1 (Megatron's DDP runs the first M−1
// under no_sync: megatron/core/pipeline_parallel/schedules.py forward_backward_no_pipelining @
// d98e8a6). ZeRO-3 gathers the parameters again in every pass.
void StepBuilder::build() {
  set_static_memory();
  b_.set_phase(Phase::kForward);
  b_.set_layer(-1);
  const TensorSet host_optimizer = pin_host_optimizer_states();
  const TensorSet reduce_bucket = allocate_reduce_bucket();
  const int micro_batches = std::max(1, in_.parallel.micro_batches);
  OpSet last_reduce;
  for (int mb = 0; mb < micro_batches; ++mb) {
    b_.set_phase(Phase::kForward);
    b_.set_layer(-1);
    last_reduce = micro_batch(r_.zero_stage >= 2 || mb + 1 == micro_batches);
  }
  optimizer(last_reduce, host_optimizer, reduce_bucket);
  set_nccl_memory();
  add_notes();
}

OpSet StepBuilder::micro_batch(bool reduce) {
  TensorSet x = embedding_forward();
  x = forward_layers(x);
  const LossEnd loss =
      m_.has_output_layer ? loss_forward_backward(x, reduce) : gradient_from_next_stage(x);
  const TensorSet dy = backward_layers(loss.dy, loss.last_op, reduce);
  b_.set_layer(-1);
  return embedding_backward(dy, reduce);
}

void StepBuilder::set_static_memory() {
  const ModelStates ms = model_states(in_);
  for (auto& sm : w_.static_memory) {
    sm.model_states_bytes = ms.gpu_bytes;
    sm.fixed_overhead_bytes = in_.hardware.fixed_overhead_bytes();
  }
  const auto layers = static_cast<std::size_t>(m_.layers);
  layer_params_.assign(layers, {});
  checkpoints_.assign(layers, {});
  host_copies_.assign(layers, {});
  saved_.assign(repeat_layers_ ? 0 : layers, {});
  body_at_.assign(repeat_layers_ ? layers : 0, {});
}

// One NCCL communicator per kind of group a collective ran over: the process groups the
// implementations create (CP, Ulysses, ring, data parallel, TP, EP, expert data), each its own
// communicator (NCCL shares nothing between them by default: init.cc:2117), measured on rank 0's
// group; and one between pipeline stages, sending to and receiving from both neighbours.
void StepBuilder::set_nccl_memory() {
  const int per_node = b_.gpus_per_node();
  std::int64_t bytes = 0;
  for (int k = 0; k < Builder::kGroupKinds; ++k) {
    const auto g = static_cast<Group>(k);
    const unsigned kinds = b_.collective_kinds(g);
    if (kinds == 0 || b_.group_size(g) < 2) {
      continue;
    }
    const auto ran = [&](models::Collective c) {
      return ((kinds >> static_cast<unsigned>(c)) & 1U) != 0;
    };
    const std::vector<std::int32_t> members = b_.all_members(g, 0);
    models::CommunicatorUse use;
    use.ranks = static_cast<int>(members.size());
    use.nodes = 0;
    for (std::size_t i = 0; i < members.size(); ++i) {
      use.nodes += i == 0 || members[i] / per_node != members[i - 1] / per_node ? 1 : 0;
      use.ranks_on_node += members[i] / per_node == members[0] / per_node ? 1 : 0;
    }
    use.collectives = ran(models::Collective::kAllGather) ||
                      ran(models::Collective::kReduceScatter) ||
                      ran(models::Collective::kAllReduce);
    use.all_to_all = ran(models::Collective::kAllToAll);
    use.send_peers = use.receive_peers = ran(models::Collective::kSendRecv) ? 1 : 0;
    bytes += models::nccl_device_memory(in_.hardware.nccl, use).total();
  }
  if (const ScheduleInputs::PipelineNeighbours& pp = in_.pipeline; pp.stages > 1) {
    models::CommunicatorUse use;
    use.ranks = pp.stages;
    const bool across = pp.span == models::Span::kInterNode;
    use.nodes = across ? pp.stages : 1;
    use.ranks_on_node = across ? 1 : pp.stages;
    use.send_peers = use.receive_peers = std::min(2, pp.stages - 1);
    bytes += models::nccl_device_memory(in_.hardware.nccl, use).total();
  }
  for (StaticMemory& sm : w_.static_memory) {
    sm.nccl_bytes = bytes;
    sm.fixed_overhead_bytes += bytes;
  }
}

TensorSet StepBuilder::pin_host_optimizer_states() {
  const std::int64_t host_states = model_states(in_).host_bytes;
  if (host_states <= 0) {
    return {};
  }
  TensorSet host_optimizer =
      b_.tensor("optimizer_states.host", host_states, MemCategory::kModelStates, true);
  compute("pin_optimizer_states", OpKind::kElementwise, {0.0, 0.0}, {}, {host_optimizer});
  return host_optimizer;
}

TensorSet StepBuilder::allocate_reduce_bucket() {
  // DeepSpeed ZeRO-3 with contiguous_gradients (default on) allocates one flat GPU buffer of
  // reduce_bucket_size elements per gradient-communication dtype when the optimizer is built,
  // copies each gradient into it and reduce-scatters from it; it lives for the whole run. Source:
  // deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641
  // deepspeed/runtime/zero/stage3.py:731-735 (v0.17.2, which the ALST recipes ran: :557-561);
  // defaults contiguous_gradients true and reduce_bucket_size 5e8 in
  // deepspeed/runtime/zero/config.py:102,113. Here it is live from the step's start to the
  // optimizer, which reads the gradients last.
  if (r_.zero_stage != 3 || r_.reduce_bucket_elements <= 0) {
    return {};
  }
  TensorSet bucket =
      b_.tensor("zero3_reduce_bucket", r_.reduce_bucket_elements * r_.grad_reduce_bytes,
                MemCategory::kGradBuffers);
  compute("allocate_reduce_bucket", OpKind::kElementwise, {0.0, 0.0}, {}, {bucket});
  return bucket;
}

std::int64_t StepBuilder::act_bytes() const {
  return shape_.sp_tokens * m_.hidden * shape_.activation_bytes;
}

TensorSet StepBuilder::param_buffer(Name name, std::int64_t params) {
  return r_.zero_stage == 3
             ? b_.tensor(name.id(w_), params * r_.param_bytes, MemCategory::kParamGather)
             : TensorSet{};
}

TensorSet StepBuilder::grad_buffer(Name name, std::int64_t params) {
  return r_.zero_stage >= 2
             ? b_.tensor(name.id(w_), params * r_.param_bytes, MemCategory::kGradBuffers)
             : TensorSet{};
}

OpSet StepBuilder::gather_into(Name name, std::int64_t params, TensorSet out, ListRef<OpSet> deps) {
  return r_.zero_stage == 3 ? gather_params(name, params, out, deps) : OpSet{};
}

void StepBuilder::gather_layer(int l, ListRef<OpSet> deps) {
  if (r_.zero_stage != 3) {
    return;  // no per-block parameter buffer
  }
  TensorSet& params = layer_params_[static_cast<std::size_t>(l)];
  const std::int64_t all = layer_param_count(l), experts = layer_expert_params(l);
  params = param_buffer(block_name("layer", l, ".params"), all);
  if (experts == 0) {
    gather_into(block_name("allgather.layer", l), all, params, deps);
    return;
  }
  // Expert parallelism: the block's other parameters over every rank, then its experts over the
  // ranks holding the same ones, into one buffer (allocated for the whole block from the first
  // gather on: its workspace), which the block's ops wait for through the second.
  OpSpec& s = next_spec(block_name("allgather.layer", l), Stream::kFsdp, OpKind::kElementwise);
  s.memory_pool = MemoryPool::kGather;
  s.deps.assign(deps.begin(), deps.end());
  s.workspace_bytes = all * r_.param_bytes;
  s.workspace_category = MemCategory::kParamGather;
  const OpSet others = b_.collective(s, Group::kAll, models::Collective::kAllGather, cost_,
                                     (all - experts) * r_.param_bytes);
  gather_params(block_name("allgather.experts", l), experts, params, {others}, Group::kExpertData);
}

void StepBuilder::prefetch_layer(int l, OpSet after) {
  const auto li = static_cast<std::size_t>(l);
  gather_layer(l, {after});
  if (host_copies_[li].valid()) {
    checkpoints_[li] =
        b_.tensor(block_name("ckpt", l).id(w_), act_bytes(), MemCategory::kActivations);
    host_copy(block_name("prefetch_ckpt", l), true, act_bytes(), host_copies_[li], checkpoints_[li],
              {after});
  }
}

TensorSet StepBuilder::embedding_forward() {
  TensorSet emb_w = param_buffer("embedding.params", params_.embedding);
  OpSet ag_emb = gather_into("allgather.embedding", params_.embedding, emb_w, {});
  // Vocabulary-parallel embedding (T > 1): each rank looks up the rows it holds into a partial
  // [s, h] sum, reduce-scattered to the rank's s/T tokens (Megatron reduce_scatter_embeddings,
  // layers.py:367-378; TorchTitan RowwiseParallel to Shard(1), parallelize.py:177-180).
  TensorSet x = b_.tensor("x0", shape_.local_tokens * m_.hidden * shape_.activation_bytes,
                          MemCategory::kActivations);
  compute("embedding", OpKind::kElementwise,
          mem(2 * shape_.local_tokens * m_.hidden * shape_.activation_bytes), {emb_w}, {x});
  x = tp_exchange("tp_rs.embedding", x, false, MemCategory::kActivations);
  gather_layer(0, {ag_emb});
  return x;
}

TensorSet StepBuilder::forward_layers(TensorSet x) {
  const int layers = static_cast<int>(m_.layers);
  const bool full_ac = r_.checkpointing == models::CheckpointMode::kFull;
  const bool offload = full_ac && r_.checkpoint_offload;
  for (int l = 0; l < layers; ++l) {
    b_.set_layer(l);
    const auto li = static_cast<std::size_t>(l);
    checkpoints_[li] = x;
    const bool keep_on_gpu =
        !offload || (r_.offload_keep_first_last && (l == 0 || l == layers - 1));
    if (full_ac && !keep_on_gpu) {
      host_copies_[li] = b_.tensor(block_name("ckpt", l, ".host").id(w_), act_bytes(),
                                   MemCategory::kActivations, true);
      host_copy(block_name("offload_ckpt", l), false, act_bytes(), x, host_copies_[li]);
    }
    const LayerEnds block = forward_layer(l, x, layer_params_[li]);
    if (l + 1 < layers) {
      // Prefetch: the next block's gather is issued when this block starts.
      gather_layer(l + 1, {block.first_op});
    }
    x = block.out;
  }
  return x;
}

StepBuilder::LossEnd StepBuilder::loss_forward_backward(TensorSet x, bool reduce) {
  if (w_.loss_begin == kNone) {
    w_.loss_begin = static_cast<OpId>(w_.ops.size());
  }
  b_.set_layer(-1);
  const std::int64_t h = m_.hidden;
  const std::int64_t act = act_bytes();
  const std::int64_t p_head =
      (params_.lm_head > 0 ? params_.lm_head : params_.embedding) + params_.final_norm;
  TensorSet head_w = param_buffer("head.params", p_head);
  gather_into("allgather.head", p_head, head_w, {});
  TensorSet xf = b_.tensor("x_final", act, MemCategory::kActivations);
  std::vector<TensorSet> final_norm_out = {xf};
  TensorSet final_norm_saved;
  if (const std::int64_t kept = norm_saved_bytes(shape_.sp_tokens, h); kept > 0) {
    final_norm_saved = b_.tensor("final_norm_saved", kept, MemCategory::kActivations);
    final_norm_out.push_back(final_norm_saved);
  }
  compute("final_norm", OpKind::kElementwise,
          norm_cost(act / shape_.activation_bytes, 2 * act, false), {x}, final_norm_out, {},
          norm_workspace());
  // T > 1: the vocabulary-parallel LM head reads all s tokens (all-gather) and its input gradient
  // is a partial sum (reduce-scatter); the loss over V/T logits per rank all-reduces the logits'
  // max, the sum of exponentials and the target logit over the TP group: three all-reduces of s
  // fp32 values (Megatron tensor_parallel/cross_entropy.py; TorchTitan loss_parallel).
  const TensorSet xf_full = tp_exchange("tp_ag.x_final", xf, true, MemCategory::kActivations);
  if (shape_.tp > 1) {
    OpSpec& s = next_spec("tp_allreduce.cross_entropy", Stream::kComm, OpKind::kElementwise);
    s.inputs.push_back(xf_full);
    b_.collective(s, Group::kTp, models::Collective::kAllReduce, cost_,
                  shape_.local_tokens * kFp32Bytes, 3);
  }
  TensorSet dxf =
      b_.tensor("dx_final", shape_.local_tokens * h * shape_.activation_bytes, MemCategory::kOther);
  TensorSet head_grads = grad_buffer("head.grads", p_head);
  if (r_.fused_loss) {
    fused_loss(xf_full, head_w, dxf, head_grads);
  } else {
    materialised_loss(xf_full, head_w, dxf, head_grads);
  }
  // The loss op that writes dx_final writes the head's gradients too (the fused loss does so in
  // the forward); from here on everything is backward.
  b_.set_phase(Phase::kBackward);
  if (reduce) {
    reduce_grads("reduce.head", p_head, std::max(p_head - params_.final_norm, params_.final_norm),
                 head_grads, {b_.producer(dxf)});
  }
  dxf = tp_exchange("tp_rs.dx_final", dxf, false);
  TensorSet dy = b_.tensor("dy", act, MemCategory::kOther);
  std::vector<TensorSet> final_norm_in = {dxf, x};
  if (final_norm_saved.valid()) {
    final_norm_in.push_back(final_norm_saved);
  }
  OpSet fn_bwd = compute("final_norm_bwd", OpKind::kElementwise,
                         norm_cost(act / shape_.activation_bytes, 3 * act, true),
                         std::move(final_norm_in), {dy}, {}, norm_workspace());
  return {dy, fn_bwd};
}

StepBuilder::LossEnd StepBuilder::gradient_from_next_stage(TensorSet x) {
  // The stage's output is sent on and nothing here reads it again: Megatron-Core frees its data
  // once sent (REFERENCES.md [Megatron-LM] megatron/core/pipeline_parallel/schedules.py:171-200
  // deallocate_output_tensor, which Megatron-LM's training turns on:
  // megatron/training/argument_utils.py:305; NeMo's and TorchTitan's settings were not read). The
  // gradient of it arrives in a buffer of its size before the backward starts; the transfers
  // themselves are timed by the pipeline's composition (planner/evaluate_pipeline.cpp), so send
  // and receive cost nothing here.
  if (w_.loss_begin == kNone) {
    w_.loss_begin = static_cast<OpId>(w_.ops.size());
  }
  b_.set_layer(-1);
  compute("pp_send_output", OpKind::kElementwise, KernelCost{0.0, 0.0}, {x}, {});
  b_.set_phase(Phase::kBackward);
  TensorSet dy = b_.tensor("dy_received", act_bytes(), MemCategory::kOther);
  OpSet received = compute("pp_recv_grad", OpKind::kElementwise, KernelCost{0.0, 0.0}, {}, {dy});
  return {dy, received};
}

void StepBuilder::fused_loss(TensorSet xf, TensorSet head_w, TensorSet dxf, TensorSet head_grads) {
  // Fused linear cross-entropy (Liger): chunks of c tokens with c ≈ s·h/V (next power of two),
  // logits of one chunk [c, V] live at a time; gradients of the input and the head weight are
  // computed in the forward: 3 GEMMs of s×V×h in total.
  const std::int64_t h = m_.hidden, v = m_.vocab;
  std::int64_t chunk = 1;
  while (chunk < ceil_div(shape_.local_tokens, ceil_div(v, h))) {
    chunk *= 2;
  }
  chunk = std::min(chunk, shape_.local_tokens);
  const KernelCost k = plus(times(gemm(shape_.local_tokens, v, h), 3.0),
                            mem(2 * shape_.local_tokens * v * shape_.activation_bytes));
  compute("fused_linear_ce", OpKind::kLoss, k, {xf, head_w}, {dxf, head_grads}, {},
          chunk * v * shape_.activation_bytes);
}

void StepBuilder::materialised_loss(TensorSet xf,
                                    TensorSet head_w,
                                    TensorSet dxf,
                                    TensorSet head_grads) {
  // The LM head writes n = s·V logits in the activations' dtype; the framework's cross-entropy
  // turns them into their gradient, which the head's two GEMMs read.
  const std::int64_t h = m_.hidden, v = m_.vocab;
  TensorSet logits = b_.tensor("logits", shape_.local_tokens * v * shape_.activation_bytes,
                               MemCategory::kActivations);
  compute("lm_head", OpKind::kGemm, gemm(shape_.local_tokens, v, h), {xf, head_w}, {logits});
  const TensorSet dlogits = logits_loss_ == LogitsLoss::kMegatronVocabParallel
                                ? vocab_parallel_cross_entropy(logits)
                                : hugging_face_cross_entropy(logits);
  compute("lm_head_bwd", OpKind::kGemm, times(gemm(shape_.local_tokens, v, h), 2.0),
          {dlogits, xf, head_w}, {dxf, head_grads});
}

TensorSet StepBuilder::hugging_face_cross_entropy(TensorSet logits) {
  // Hugging Face's loss on materialised logits (ForCausalLMLoss: logits.float(), then
  // F.cross_entropy = log_softmax + nll_loss), tensor by tensor as PyTorch's autograd holds them,
  // with n = s·V logits:
  //   forward:  logits bf16 (2n B); the fp32 upcast (4n) lives while log_softmax writes its fp32
  //             output (4n, saved for backward); the upcast is dropped when the loss returns and
  //             the bf16 logits with the model's output (ToCopyBackward saves no tensor):
  //             5 logit-sized bf16 units at the forward peak.
  //   backward: nll_loss_backward writes a zero-filled fp32 gradient (4n); log_softmax_backward
  //             reads it and the saved output and writes the fp32 input gradient (4n): 12n bytes
  //             at the backward peak; then both are dropped and ToCopyBackward writes the bf16
  //             gradient (2n) that the head's two GEMMs read.
  // Memory traffic per logit: forward 2+4 (upcast) and 4+4+4 (log_softmax: max/sum pass and
  // write); backward 4 (zero fill), 4+4+4 (log_softmax_backward), 4+2 (downcast).
  const std::int64_t n = shape_.local_tokens * m_.vocab;
  TensorSet log_probs = b_.tensor("log_softmax_out", n * kFp32Bytes, MemCategory::kActivations);
  compute("cross_entropy", OpKind::kLoss, mem(n * (shape_.activation_bytes + 3 * kFp32Bytes)),
          {logits}, {log_probs}, {}, n * kFp32Bytes);
  b_.set_phase(Phase::kBackward);
  TensorSet dlog_probs = b_.tensor("dlog_softmax_out", n * kFp32Bytes, MemCategory::kOther);
  compute("nll_loss_bwd", OpKind::kLoss, mem(n * kFp32Bytes), {}, {dlog_probs});
  TensorSet dlogits_fp32 = b_.tensor("dlogits_fp32", n * kFp32Bytes, MemCategory::kOther);
  compute("log_softmax_bwd", OpKind::kLoss, mem(3 * n * kFp32Bytes), {dlog_probs, log_probs},
          {dlogits_fp32});
  TensorSet dlogits = b_.tensor("dlogits", n * shape_.activation_bytes, MemCategory::kOther);
  compute("upcast_bwd", OpKind::kElementwise, mem(n * (kFp32Bytes + shape_.activation_bytes)),
          {dlogits_fp32}, {dlogits});
  return dlogits;
}

TensorSet StepBuilder::vocab_parallel_cross_entropy(TensorSet logits) {
  // Megatron-Core's vocab-parallel cross-entropy (REFERENCES.md [Megatron-LM]:
  // megatron/core/tensor_parallel/cross_entropy.py, _VocabParallelCrossEntropy; the jit-fused copy
  // in megatron/core/fusions/fused_cross_entropy.py that NeMo's default cross_entropy_loss_fusion
  // runs holds the same tensors), with n = s·V/T logits per rank:
  //   forward:  the LM head writes the logits in the activations' dtype (ab·n B); the function's
  //             `.float()` writes an fp32 copy (4n, :25) that every later step modifies in place
  //             (`-= max` :42, `exp(out=)` :62, `div_(sum)` :77) and that it saves as the softmax
  //             (:181); nothing saves the logits, so they die when the loss returns: (4 + ab)·n at
  //             the forward peak, 4n held into backward.
  //   backward: the gradient is the saved softmax, changed in place (`-=` at the targets :111,
  //             `mul_` :114) and returned in fp32 for an input of the activations' dtype, which
  //             autograd casts to that dtype (engine.cpp validate_outputs, REFERENCES.md
  //             [PyTorch-autograd]; the fused copy casts it itself): ab·n written while the 4n
  //             lives.
  // The loss's [s]-sized tensors (max, sum, target mask and index) are left out (≤ 25·s bytes).
  // Memory traffic per logit: forward ab+4 (.float()), 4 (max), 4+4 (-=), 4+4 (exp), 4 (sum),
  // 4+4 (div_); backward 4+4 (mul_), 4+ab (cast). The fused copy may merge passes: at most this.
  const std::int64_t n = shape_.local_tokens * m_.vocab;
  TensorSet softmax = b_.tensor("softmax_fp32", n * kFp32Bytes, MemCategory::kActivations);
  compute("vocab_parallel_ce", OpKind::kLoss, mem(n * (shape_.activation_bytes + 9 * kFp32Bytes)),
          {logits}, {softmax});
  b_.set_phase(Phase::kBackward);
  TensorSet dlogits = b_.tensor("dlogits", n * shape_.activation_bytes, MemCategory::kOther);
  compute("vocab_parallel_ce_bwd", OpKind::kLoss,
          mem(n * (3 * kFp32Bytes + shape_.activation_bytes)), {softmax}, {dlogits});
  return dlogits;
}

TensorSet StepBuilder::backward_layers(TensorSet dy, OpSet after_loss, bool reduce) {
  const int layers = static_cast<int>(m_.layers);
  const bool full_ac = r_.checkpointing == models::CheckpointMode::kFull;
  b_.set_phase(Phase::kBackward);
  b_.set_layer(layers - 1);
  prefetch_layer(layers - 1, after_loss);
  for (int l = layers - 1; l >= 0; --l) {
    b_.set_layer(l);
    const auto li = static_cast<std::size_t>(l);
    // With full checkpointing the block is recomputed first and the prefetch of the block below
    // waits for the recomputation to start; otherwise it is issued at once.
    const OpSet recomputed =
        full_ac ? recompute_layer(l, checkpoints_[li], layer_params_[li]) : OpSet{};
    if (l > 0) {
      prefetch_layer(l - 1, recomputed);
    }
    const std::int64_t all = layer_param_count(l), experts = layer_expert_params(l);
    TensorSet grads = grad_buffer(block_name("layer", l, ".grads"), all);
    dy = backward_layer(l, checkpoints_[li], dy, layer_params_[li], grads);
    // FSDP's post-backward hook: the block's gradients are reduced once its backward has ended
    // (dy's producer is the block's last op on the compute stream).
    if (!reduce) {
      continue;
    }
    if (experts == 0) {
      reduce_grads(block_name("reduce.layer", l), all, largest_layer_param(), grads,
                   {b_.producer(dy)});
      continue;
    }
    reduce_grads(block_name("reduce.layer", l), all - experts, largest_layer_param(), grads,
                 {b_.producer(dy)});
    reduce_grads(block_name("reduce.experts", l), experts, largest_layer_param(), grads,
                 {b_.producer(dy)}, Group::kExpertData);
  }
  return dy;
}

OpSet StepBuilder::embedding_backward(TensorSet dy, bool reduce) {
  TensorSet emb_grads = grad_buffer("embedding.grads", params_.embedding);
  dy = tp_exchange("tp_ag.dembedding", dy, true);
  const OpSet grads_done = compute(
      "embedding_bwd", OpKind::kElementwise,
      mem(2 * shape_.local_tokens * m_.hidden * shape_.activation_bytes), {dy}, {emb_grads});
  if (!reduce) {
    return grads_done;
  }
  return reduce_grads("reduce.embedding", params_.embedding, params_.embedding, emb_grads,
                      {grads_done});
}

void StepBuilder::optimizer(OpSet last_reduce, TensorSet host_optimizer, TensorSet reduce_bucket) {
  b_.set_phase(Phase::kOptimizer);
  const std::int64_t updated = updated_params_;
  if (!r_.optimizer_offload) {
    // AdamW on the GPU: reads param, grad, m, v (fp32) and writes param, m, v: 28 bytes/param.
    compute("adamw", OpKind::kOptimizer, mem(updated * 28), {reduce_bucket}, {}, {last_reduce});
    return;
  }
  // Offloaded: gradients to host (fp32), CPU Adam at the node's rate shared by its GPUs,
  // updated compute-dtype parameters back to the GPU.
  TensorSet grads_host = b_.tensor("grads.host_copy", 0, MemCategory::kOther, true);
  OpSet d2h = host_copy("grads_to_host", false, updated * kFp32Bytes, reduce_bucket, grads_host,
                        {last_reduce});
  const double rate =
      in_.hardware.cpu_adam_params_per_s / static_cast<double>(in_.parallel.gpus_per_node);
  OpSet cpu =
      compute("cpu_adam (host)", OpKind::kOptimizer, {static_cast<double>(updated) / rate, 0.0},
              {grads_host, host_optimizer}, {}, {d2h});
  // CPU Adam runs on the host (DeepSpeed's DeepSpeedCPUAdam.step from the training loop): the
  // host issues nothing after it before it ends (docs/MODEL.md, "Host issue").
  for (std::size_t k = w_.ops.size() - static_cast<std::size_t>(b_.simulated_ranks());
       k < w_.ops.size(); ++k) {
    w_.ops[k].host_sync = true;
  }
  TensorSet params_back = b_.tensor("params.from_host", 0, MemCategory::kOther);
  host_copy("params_to_device", true, updated * r_.param_bytes, TensorSet{}, params_back, {cpu});
  w_.notes.push_back("CPU Adam throughput is an assumption of the profile (no published figure)");
}

void StepBuilder::add_notes() {
  if (r_.zero_stage == 3) {
    w_.notes.push_back("unsharded gradients of a block are allocated when its backward starts");
    w_.notes.push_back("FSDP all-gather and reduce-scatter share one stream (FSDP2 uses two)");
  }
  if (in_.hardware.compute_slowdown_under_comm == 0.0) {
    w_.notes.push_back("compute is not slowed by concurrent NCCL kernels (no calibrated factor)");
  }
  if (b_.span_of(Group::kAll) == models::Span::kInterNode ||
      b_.span_of(Group::kCp) == models::Span::kInterNode) {
    w_.notes.push_back("inter-node collectives use one NIC per GPU at the NIC's busbw (crude)");
  }
  if (shape_.tp > 1) {
    w_.notes.push_back(
        "TP collectives run exposed (Megatron's --tp-comm-overlap and TorchTitan's async TP are "
        "off "
        "by default); Megatron's overlap of the Q/K/V input gradient's reduce-scatter with their "
        "weight-gradient GEMM is not modelled (the MLP's is)");
  }
  if (!r_.expandable_segments) {
    w_.notes.push_back(
        "PyTorch's default allocator (no expandable segments): its segments and their "
        "fragmentation are modelled where the reserved memory is replayed (simulate, and the "
        "answers maxlen and plan show), not in the searches' inner loops");
  }
  if (in_.hardware.host_issue.enabled()) {
    w_.notes.push_back(
        "host issue: one host thread per rank issues every op in program order at the profile's "
        "per-call cost; the framework calls per op are counted from the implementations' source "
        "where read (FPDT's chunk loop, RMSNorm) and are one per kernel elsewhere, so the host "
        "time's granularity is approximate");
  }
  if (rope_kernel_ != models::RopeKernel::kFused) {
    w_.notes.push_back(fmt::format(
        "{} RoPE: each op of its chain is timed at the profile's memory-bound rate; on strided "
        "q/k such kernels were measured 2.6-4.5x slower (an H200), so its time is a lower bound, "
        "and its intermediates are not held in memory",
        models::to_string(rope_kernel_)));
  }
  if (implementation_ != nullptr) {
    for (const std::string_view limit : implementation_->limits()) {
      w_.notes.emplace_back(limit);
    }
  }
  w_.notes.insert(w_.notes.end(), in_.model.notes.begin(), in_.model.notes.end());
}

}  // namespace cpsim::sim::detail
