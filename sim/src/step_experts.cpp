// A mixture-of-experts MLP (models::MoeSpec), forward and backward, on a rank's s tokens with E
// experts, k per token, experts of width f_e, E_p-way expert parallelism.
//
// Forward, as transformers 4.57.6's MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock
// (modeling_qwen3_moe.py:226-264), Megatron-Core 0.16.1's MoELayer with the all-to-all dispatcher
// (transformer/moe/token_dispatcher.py:348-669) and TorchTitan's MoE (models/common/moe.py) all
// compute it:
//   router     logits [s, E] = x·W_r (a GEMM), softmax in fp32 [s, E], top-k: k weights and
//              indices per token (renormalised, cast back to the activation dtype);
//   dispatch   the s·k token copies gathered in expert order [s·k, h]; with E_p > 1 an all-to-all
//              over the EP group sends each copy to the rank of its expert, which receives
//              R = ⌈s·k·imbalance⌉ rows (StepShape::expert_rows: balanced routing gives s·k);
//   experts    the gated MLP of width f_e over the R rows, as E/E_p GEMMs of R/(E/E_p) rows each
//              (the experts of the rank; the cost model prices each GEMM at its own size);
//   combine    the expert outputs [R, h] all-to-all back to the tokens' ranks [s·k, h], each
//              weighted by its routing weight and summed into the token's row [s, h].
// Kept for the backward (per layer): the fp32 probabilities (softmax's backward reads its output)
// 4·s·E bytes; the top-k indices (int64) and cast weights s·k·(8 + a), and with renormalised
// weights (MoeSpec::renormalize) the division's fp32 weights and sum, 4·(s·k + s); the experts'
// input [R, h] and
// what the gated MLP keeps of R rows (gate/up 2f_e, product f_e, and silu(gate) f_e with the eager
// MLP, as the dense MLP: StepBuilder::gated_mlp_forward); the combined expert outputs [s·k, h],
// which the weighted sum's backward reads for the weights' gradient. The implementation's own
// (ExpertSupport): the Hugging Face loop also keeps its weighted outputs [s·k, h] and 16 bytes of
// indices per copy; Megatron-Core weights the rows inside the experts (no combined outputs kept),
// keeps its scores as [E, s] probabilities in the activation dtype with a boolean map, and 12
// more bytes per copy. Both sums are checked against the saved tensors of the real blocks run on
// the CPU (tests/models/test_hf_models.py, tests/models/test_megatron_moe.py), and the simulated
// blocks against them (tests/sim/moe_test.cpp).
// Backward: the weighted sum's (d outputs [s·k, h], d weights), the all-to-all back to the experts,
// the gated MLP's backward, the all-to-all of the experts' input gradients, and one op for the sum
// over each token's copies plus the router's backward (softmax [s, E] fp32 and the router's dgrad
// and wgrad GEMMs).
// The Hugging Face loop issues its kernels expert by expert from Python and reads the GPU twice
// per expert (ExpertSupport::forward_calls, synchronises_per_expert): its block's traced calls go
// to the block's first op and the host waits for the experts' last forward op, so that the host's
// issue and the experts' kernels add up rather than overlap, as they do expert by expert.
// Not modelled: the load-balancing loss (off in these configs' output_router_logits),
// capacity-factor dropping (every implementation above is dropless).
#include <algorithm>
#include <vector>

#include "cpsim/models/units.hpp"

#include "step_builder.hpp"

namespace cpsim::sim::detail {

TensorSet StepBuilder::expert_exchange(
    const char* name, TensorSet in, std::int64_t rows, std::int64_t buffer_rows, MemCategory cat) {
  const std::int64_t row_bytes = m_.hidden * shape_.activation_bytes;
  TensorSet out = b_.tensor(name, rows * row_bytes, cat);
  OpSpec& s = next_spec(name, Stream::kComm, OpKind::kElementwise);
  s.inputs.push_back(in);
  s.outputs.push_back(out);
  b_.collective(s, Group::kExpert, models::Collective::kAllToAll, cost_, buffer_rows * row_bytes);
  return out;
}

StepBuilder::GatedMlp StepBuilder::expert_mlp() const {
  const bool clamped = m_.activation == models::ActivationKind::kClampedQuickGeGlu;
  return {shape_.expert_rows, m_.moe.expert_ffn_hidden, shape_.local_experts,
          experts_.eager_expert_activation, clamped ? experts_.clamped_glu_copies : 0};
}

StepBuilder::GatedMlp StepBuilder::shared_mlp() const {
  return {shape_.local_tokens, m_.moe.shared_ffn_hidden, 1, experts_.eager_expert_activation, 0};
}

std::int64_t StepBuilder::routing_bytes() const {
  const std::int64_t s = shape_.local_tokens, copies = s * m_.moe.experts_per_token;
  return copies * experts_.routing_bytes_per_copy + s * experts_.routing_bytes_per_token +
         (m_.moe.renormalize && experts_.keeps_renormalisation ? (copies + s) * kFp32Bytes : 0);
}

void StepBuilder::issue_block_calls(Mark begin,
                                    const ExpertSupport::HostCalls& calls,
                                    std::int32_t sync_after) {
  if (calls.per_expert == 0) {
    return;  // one call per kernel, as emitted
  }
  const std::int64_t total = calls.of(shape_.local_experts, m_.moe.renormalize);
  const auto first = static_cast<std::size_t>(begin.ops);
  const auto ranks = static_cast<std::size_t>(b_.simulated_ranks());
  for (std::size_t k = first; k < w_.ops.size(); ++k) {
    Op& o = w_.ops[k];
    o.host_calls = k < first + ranks ? total : 0;
    o.host_sync = o.host_sync || (experts_.synchronises_per_expert && o.name == sync_after);
  }
}

TensorSet StepBuilder::moe_forward(SavedLayer& sv, TensorSet h1n, TensorSet params, bool grad) {
  const Mark begin = b_.mark();
  const std::int64_t h = m_.hidden, s = shape_.local_tokens, a = shape_.activation_bytes;
  const std::int64_t experts = m_.moe.experts, k = m_.moe.experts_per_token;
  const std::int64_t copies = s * k, rows = shape_.expert_rows;
  const bool ep = shape_.ep > 1;
  const MemCategory kept = grad ? MemCategory::kActivations : MemCategory::kOther;

  TensorSet logits = b_.tensor("router_logits", s * experts * a, MemCategory::kOther);
  std::vector<TensorSet> router_out = {logits};
  if (experts_.router_input_bytes > 0 && grad) {
    sv.router_input = b_.tensor("router_input", s * h * experts_.router_input_bytes, kept);
    router_out.push_back(sv.router_input);
  }
  compute("moe_router", OpKind::kGemm, linear_fwd(s, experts, h, grad), {h1n, params},
          std::move(router_out));
  TensorSet probs =
      b_.tensor("router_probs", s * experts * experts_.routing_bytes_per_token_expert, kept);
  TensorSet routing = b_.tensor("routing", routing_bytes(), kept);
  compute("moe_topk", OpKind::kElementwise,
          mem(s * experts * (a + 2 * kFp32Bytes) + routing_bytes()), {logits}, {probs, routing});
  TensorSet permuted = b_.tensor("moe_permuted", copies * h * a, ep ? MemCategory::kOther : kept);
  compute("moe_permute", OpKind::kElementwise, mem(2 * copies * h * a), {h1n, routing}, {permuted});
  const TensorSet expert_in =
      ep ? expert_exchange("moe_dispatch", permuted, rows, std::max(rows, copies), kept) : permuted;
  // The combined outputs are kept for the weights' product after the experts, as they are or,
  // where the product runs in a dtype of its own (TorchTitan's fp32), as a copy in it; not where
  // the weights multiply inside the experts (Megatron-Core).
  const bool combined_copy = !experts_.weights_inside_experts && experts_.combined_bytes != a;
  const MemCategory combined_cat =
      experts_.weights_inside_experts || combined_copy ? MemCategory::kOther : kept;
  TensorSet expert_out =
      b_.tensor("moe_expert_out", rows * h * a, ep ? MemCategory::kOther : combined_cat);
  gated_mlp_forward(sv.mlp, expert_in, params, grad, expert_mlp(), expert_out);
  const TensorSet combined =
      ep ? expert_exchange("moe_combine", expert_out, copies, std::max(rows, copies), combined_cat)
         : expert_out;
  const bool shared = m_.moe.shared_ffn_hidden > 0;  // then the shared expert's sum is the output
  TensorSet mlp_out = b_.tensor(shared ? "moe_routed_out" : "mlp_out", s * h * a,
                                shared ? MemCategory::kOther : post_norm_input_category(grad));
  std::vector<TensorSet> sums = {mlp_out};
  if (combined_copy && grad) {
    sv.combined_copy =
        b_.tensor("moe_combined", copies * h * experts_.combined_bytes, MemCategory::kActivations);
    sums.push_back(sv.combined_copy);
  }
  if (experts_.keeps_weighted_outputs && grad) {
    sv.expert_weighted = b_.tensor("moe_weighted", copies * h * a, MemCategory::kActivations);
    sums.push_back(sv.expert_weighted);
  }
  compute("moe_unpermute", OpKind::kElementwise, mem((copies + s) * h * a), {combined, routing},
          std::move(sums));
  issue_block_calls(begin, experts_.forward_calls, w_.intern("mlp_down"));
  if (grad) {
    sv.router_probs = probs;
    sv.routing = routing;
    sv.expert_in = expert_in;
    sv.expert_out = experts_.weights_inside_experts || combined_copy ? TensorSet{} : combined;
  }
  return shared ? shared_expert_forward(sv, h1n, params, grad, mlp_out) : mlp_out;
}

// The shared expert (MoeSpec::shared_ffn_hidden; Qwen2-MoE's, Megatron-Core's SharedExpertMLP,
// megatron-core 0.16.1 transformer/moe/shared_experts.py:125-135): the gated MLP of width f_s over
// the s tokens, kept as the dense MLP keeps it; with a gate, the score sigmoid(x·w_g) [s, 1] and
// the product score × output, whose backward reads both (the output [s, h] and the score are
// kept); then the sum with the routed experts'. Megatron-Core's block keeps exactly those bytes
// beyond the routed experts' (tests/models/test_megatron_moe.py).
TensorSet StepBuilder::shared_expert_forward(
    SavedLayer& sv, TensorSet h1n, TensorSet params, bool grad, TensorSet routed) {
  const std::int64_t h = m_.hidden, s = shape_.local_tokens, a = shape_.activation_bytes;
  const bool gate = m_.moe.shared_gate;
  const MemCategory kept = grad ? MemCategory::kActivations : MemCategory::kOther;
  TensorSet shared = b_.tensor("moe_shared_out", s * h * a, gate ? kept : MemCategory::kOther);
  gated_mlp_forward(sv.shared, h1n, params, grad, shared_mlp(), shared);
  TensorSet out = b_.tensor("mlp_out", s * h * a, post_norm_input_category(grad));
  std::vector<TensorSet> outs = {out};
  KernelCost cost = mem(3 * s * h * a);
  if (gate) {
    cost = plus(cost, linear_fwd(s, 1, h, grad));
    TensorSet score = b_.tensor("moe_shared_score", s * a, kept);
    outs.push_back(score);
    if (grad) {
      sv.shared_out = shared;
      sv.shared_score = score;
    }
  }
  compute("moe_shared_sum", OpKind::kElementwise, cost, {routed, shared, h1n, params},
          std::move(outs));
  return out;
}

// Its backward, after the routed experts' (whose gated MLP produced the block's gradients): the
// gate's (d output = dy × score, d score = dy · output, the gate's dgrad and wgrad), then the
// gated MLP's, whose dgrad adds to the routed experts' input gradient `routed_dx`.
TensorSet StepBuilder::shared_expert_backward(const SavedLayer& sv,
                                              TensorSet dy,
                                              TensorSet h1n,
                                              TensorSet params,
                                              TensorSet grads,
                                              TensorSet routed_dx) {
  const std::int64_t h = m_.hidden, s = shape_.local_tokens, a = shape_.activation_bytes;
  TensorSet d_shared = dy;
  if (m_.moe.shared_gate) {
    d_shared = b_.tensor("moe_d_shared_out", s * h * a, MemCategory::kOther);
    compute("moe_shared_gate_bwd", OpKind::kElementwise,
            plus(mem(3 * s * h * a), linear_bwd(s, 1, h)),
            {dy, sv.shared_out, sv.shared_score, h1n, params, grads}, {d_shared});
  }
  TensorSet dx = b_.tensor("dh1n", s * h * a, MemCategory::kOther);
  gated_mlp_backward(sv.shared, d_shared, h1n, params, grads, shared_mlp(), dx, true, routed_dx);
  return dx;
}

TensorSet StepBuilder::moe_backward(
    const SavedLayer& sv, TensorSet dy, TensorSet h1n, TensorSet params, TensorSet grads) {
  const Mark begin = b_.mark();
  const std::int64_t h = m_.hidden, s = shape_.local_tokens, a = shape_.activation_bytes;
  const std::int64_t experts = m_.moe.experts, k = m_.moe.experts_per_token;
  const std::int64_t copies = s * k, rows = shape_.expert_rows;
  const bool ep = shape_.ep > 1;

  // The weighted sum's backward: each copy's gradient (dy × weight) and each weight's (dy · out).
  TensorSet d_combined = b_.tensor("moe_d_combined", copies * h * a, MemCategory::kOther);
  TensorSet d_weights = b_.tensor("moe_d_weights", copies * kFp32Bytes, MemCategory::kOther);
  std::vector<TensorSet> read = {dy, sv.routing};
  if (sv.expert_out.valid()) {
    read.push_back(sv.expert_out);
  }
  for (const TensorSet t : {sv.expert_weighted, sv.combined_copy}) {
    if (t.valid()) {
      read.push_back(t);
    }
  }
  compute("moe_unpermute_bwd", OpKind::kElementwise, mem((s + 2 * copies) * h * a), std::move(read),
          {d_combined, d_weights});
  const TensorSet d_expert_out = ep ? expert_exchange("moe_combine_bwd", d_combined, rows,
                                                      std::max(rows, copies), MemCategory::kOther)
                                    : d_combined;
  TensorSet d_expert_in = b_.tensor("moe_d_expert_in", rows * h * a, MemCategory::kOther);
  gated_mlp_backward(sv.mlp, d_expert_out, sv.expert_in, params, grads, expert_mlp(), d_expert_in);
  const TensorSet d_permuted = ep ? expert_exchange("moe_dispatch_bwd", d_expert_in, copies,
                                                    std::max(rows, copies), MemCategory::kOther)
                                  : d_expert_in;
  // The sum over each token's copies, and the router: softmax's backward in fp32 (d probs and
  // d logits live while it runs), the router's dgrad added into dh1n and its wgrad.
  TensorSet dh1n = b_.tensor("dh1n", s * h * a, MemCategory::kOther);
  const KernelCost router = plus(mem((copies + s) * h * a + s * experts * (3 * kFp32Bytes + a)),
                                 linear_bwd(s, experts, h));
  compute("moe_router_bwd", OpKind::kGemm, router,
          {d_permuted, d_weights, sv.router_probs, sv.routing, sv.router_input, h1n, params, grads},
          {dh1n}, {}, s * experts * (kFp32Bytes + a));
  issue_block_calls(begin, experts_.backward_calls, kNone);
  return m_.moe.shared_ffn_hidden > 0 ? shared_expert_backward(sv, dy, h1n, params, grads, dh1n)
                                      : dh1n;
}

}  // namespace cpsim::sim::detail
