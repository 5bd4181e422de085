#pragma once
// Internal: the builder of one training step. The block structure, FSDP/ZeRO, checkpointing, loss
// and optimizer live in step_builder.cpp; each attention scheme in its own attention_*.cpp.

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cpsim/models/transformer.hpp"
#include "cpsim/sim/cost_model.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

#include "builder.hpp"
#include "kernel_costs.hpp"
#include "layer_template.hpp"
#include "op_emitter.hpp"

namespace cpsim::sim::detail {

/// Tensors saved by the grad-enabled forward of a block and read by its backward.
/// What a gated MLP keeps for its backward (StepBuilder::gated_mlp_forward).
struct MlpSaved {
  TensorSet gate_up;         // [rows, 2f]
  TensorSet act;             // [rows, f] (FP8: down's column-wise FP8 copy, 1 byte)
  TensorSet silu;            // eager activation: silu(gate) [rows, f]
  TensorSet gate_up_copies;  // a clamped GLU's clamped gate/up (GatedMlp::gate_up_copies)
};

struct SavedLayer {
  TensorSet x;   // block input (checkpoint)
  TensorSet xn;  // norm1 output (QKV projection input)
  // What the norms keep for backward beyond their input and output (eager RMSNorm: fp32 input and
  // bf16 normalised tensor), and the inputs of Qwen3's q/k norms.
  TensorSet norm1_saved, norm2_saved, qk_norm_saved;
  // post_sublayer_norms (Gemma 3): the attention's and the MLP's outputs (the post-norms'
  // inputs) and what those norms keep beyond them.
  TensorSet post_attn_in, post_attn_saved, post_mlp_in, post_mlp_saved;
  // Ulysses family (ulysses, usp, ring, allgather): head-sharded Q and K/V, output, LSE; and the
  // local Q and K/V after RoPE, input of selective recomputation.
  TensorSet q_local, kv_local;
  TensorSet q_h, kv_h, o_h, lse;
  TensorSet o;      // input of the output projection (UPipe: the permuted copy)
  TensorSet o_fp8;  // FP8: the output projection's column-wise FP8 copy of its input
  // UPipe: the full output and one LSE per stage.
  TensorSet final_out;
  std::vector<TensorSet> lses;
  // FPDT: per-chunk tensors kept for backward (on host when offloading).
  std::vector<TensorSet> chunk_q, chunk_kv, chunk_o, chunk_lse;
  TensorSet h1;   // after the attention residual
  TensorSet h1n;  // norm2 output (MLP input)
  MlpSaved mlp;   // the untiled MLP's, or the routed experts' of a mixture of experts
  // Mixture of experts (step_experts.cpp): the router's fp32 probabilities [s, E], the top-k
  // weights and indices, the rows the rank's experts computed on and their outputs [R, h].
  TensorSet router_probs, routing, expert_in, expert_out;
  TensorSet expert_weighted;  // the weighted outputs [s·k, h], where the implementation keeps them
  TensorSet combined_copy;    // the combined outputs in the weights' product's own dtype
  TensorSet router_input;     // a copy of the router's input in its own dtype
  // A shared expert: its gated MLP's tensors, and with a gate its output and sigmoid score, which
  // the gate's product keeps.
  MlpSaved shared;
  TensorSet shared_out, shared_score;
  // Multi-head latent attention (attention_mla.cpp): each norm's input and each up projection's
  // input (the normed latents, with the norms' rstd).
  struct {
    TensorSet q_latent, q_normed, kv_latent, kv_normed;
  } mla;
  TensorSet out;     // block output
  OpSet attn_ready;  // when set, the output projection waits for it (outputs filled in place)
  OpSet first_op;
  OpSet last_op;
};

/// Output of core attention on head-sharded tensors.
struct CoreForward {
  TensorSet o_h;      // [n_r, hq, d] in activation dtype
  TensorSet lse;      // [hq, n_r] fp32
  TensorSet kv_used;  // K/V the kernel read when not the input (SDPA: repeated to hq heads)
};
struct CoreBackward {
  TensorSet dq_h;   // [n_r, hq, d]
  TensorSet dkv_h;  // [n_r, 2·hkv, d]
};

/// Gradient of the QKV projection input, and the op after which it is complete.
struct InputGrad {
  TensorSet dxn;
  OpSet ready;
};

/// A rank's query and key/value after the projections and RoPE, before any exchange.
struct LocalQkv {
  TensorSet q, kv;
};

/// Ring steps simulated as one op per stream: `steps` steps from `first` (see ring_segments).
struct RingSegment {
  int first = 0;
  int steps = 1;
};

/// One training step's op graph: embedding, blocks (built, or instances of a recorded template),
/// loss, optimizer, with ZeRO/FSDP, checkpointing and offload; ops go out through its OpEmitter,
/// timed by its KernelCosts.
class StepBuilder : private OpEmitter, private KernelCosts {
 public:
  /// `merge_ring_steps`: see BuildOptions (representative rank only: its middle steps are equal).
  /// `layout`: derive_head_layout(in), derived once by build_step.
  /// `repeat_layers`: blocks are instances of templates (step_layers.cpp), else built one by one.
  /// `implementation`: the one that runs it (LayoutCheck::implementation; nullptr: the scheme).
  StepBuilder(const ScheduleInputs& in,
              const HeadLayout& layout,
              const Implementation* implementation,
              Workload& w,
              int simulated_ranks,
              bool merge_ring_steps,
              bool repeat_layers);
  void build();

  const HeadLayout& layout() const { return layout_; }

  // ---- attention schemes (called by the CP implementations, methods/<name>.cpp) ----
  void ulysses_forward(SavedLayer& sv, TensorSet params, bool grad);
  InputGrad ulysses_backward(const SavedLayer& sv,
                             TensorSet d_o,
                             TensorSet params,
                             TensorSet grads);
  void upipe_forward(SavedLayer& sv, TensorSet params);
  InputGrad upipe_backward(const SavedLayer& sv, TensorSet d_o, TensorSet params, TensorSet grads);
  void fpdt_forward(SavedLayer& sv, TensorSet params, bool grad);
  class FpdtPass;     ///< what both FPDT passes share (attention_fpdt.cpp)
  class FpdtForward;  ///< fpdt_forward's chunk loop (attention_fpdt.cpp)
  InputGrad fpdt_backward(const SavedLayer& sv, TensorSet d_o, TensorSet params, TensorSet grads);
  class FpdtBackward;  ///< fpdt_backward's chunk loops (attention_fpdt.cpp)

 private:
  /// The Q/K/V projections, q/k norms and RoPE of the Ulysses scheme (attention_ulysses.cpp),
  /// and their backward from dQ and dK/dV.
  LocalQkv project_qkv(SavedLayer& sv, TensorSet params, bool grad);
  InputGrad project_qkv_backward(
      const SavedLayer& sv, TensorSet dq, TensorSet dkv, TensorSet params, TensorSet grads);
  /// The same for multi-head latent attention (attention_mla.cpp).
  LocalQkv mla_project(SavedLayer& sv, TensorSet params, bool grad);
  InputGrad mla_project_backward(
      const SavedLayer& sv, TensorSet dq, TensorSet dkv, TensorSet params, TensorSet grads);
  std::int64_t norm_workspace() const;
  /// Bytes a norm over `rows` × `width` elements keeps for backward beyond its input and output.
  std::int64_t norm_saved_bytes(std::int64_t rows, std::int64_t width) const;
  /// Workspace of one FlashAttention backward call over nq queries and nkv keys with hq query and
  /// hkv K/V heads (see attention_core.cpp).
  std::int64_t flash_bwd_workspace(std::int64_t nq,
                                   std::int64_t nkv,
                                   std::int64_t hq,
                                   std::int64_t hkv) const;
  OpSet gather_params(Name name,
                      std::int64_t params,
                      TensorSet out,
                      ListRef<OpSet> deps,
                      Group group = Group::kAll);
  /// Reduces the gradients of `params` elements, of which the largest parameter has `largest`,
  /// over `group` (the ranks sharing them).
  OpSet reduce_grads(Name name,
                     std::int64_t params,
                     std::int64_t largest,
                     TensorSet grads,
                     ListRef<OpSet> deps,
                     Group group = Group::kAll);
  /// Whether DeepSpeed ZeRO-3 copies each reduced gradient partition back from its host buffer to
  /// the GPU (stage 3, optimizer offload, recipe host_grad_partition_buffer).
  bool zero3_host_grad_partitions() const;
  /// The reduce-stream bytes live at once while DeepSpeed ZeRO-3 with optimizer offload reduces
  /// `params` elements whose largest parameter has `largest` (see step_builder.cpp).
  std::int64_t zero3_offload_reduce_bytes(std::int64_t params, std::int64_t largest) const;
  /// Elements of a block's largest parameter (one TP rank's share).
  std::int64_t largest_layer_param() const;
  /// Block `l`'s parameters on the rank (a mixture of experts' dense layers have their own), and
  /// of those its experts' (0 for a dense MLP).
  std::int64_t layer_param_count(int l) const {
    return m_.is_moe() && !m_.experts_at(l) ? params_.dense_per_layer : params_.per_layer;
  }
  std::int64_t layer_expert_params(int l) const { return m_.experts_at(l) ? expert_params_ : 0; }

  // ---- the step (step_builder.cpp): embedding, blocks forward, loss, blocks backward, optimizer
  void set_static_memory();
  /// NCCL's memory for the communicators the step used (after the build), in static memory.
  void set_nccl_memory();
  TensorSet pin_host_optimizer_states();
  /// DeepSpeed ZeRO-3's persistent gradient bucket (recipe reduce_bucket_elements); none without.
  TensorSet allocate_reduce_bucket();
  std::int64_t act_bytes() const;  ///< one [s, h] activation
  /// Gathered parameters (ZeRO-3) and unsharded gradients (ZeRO ≥ 2); none otherwise.
  TensorSet param_buffer(Name name, std::int64_t params);
  TensorSet grad_buffer(Name name, std::int64_t params);
  OpSet gather_into(Name name, std::int64_t params, TensorSet out, ListRef<OpSet> deps);
  /// prefix + l + suffix, interned once per workload (Workload::intern_indexed).
  Name block_name(std::string_view prefix, int l, std::string_view suffix = {}) {
    return Name::interned(w_.intern_indexed(prefix, l, suffix));
  }
  /// Block l's parameters gathered into layer_params_[l] (ZeRO-3).
  void gather_layer(int l, ListRef<OpSet> deps);
  /// Before block l's backward: its parameters and its offloaded checkpoint, issued after `after`.
  void prefetch_layer(int l, OpSet after);
  /// Embedding forward (and block 0's gather); returns its output.
  TensorSet embedding_forward();
  /// Blocks 0..L−1 forward from `x`; returns the last block's output.
  TensorSet forward_layers(TensorSet x);
  struct LossEnd {
    TensorSet dy;   ///< gradient of the last block's output
    OpSet last_op;  ///< the final norm's backward
  };
  LossEnd loss_forward_backward(TensorSet x, bool reduce);
  /// A pipeline stage without the output layer (TransformerSpec::has_output_layer): its output
  /// `x` goes to the next stage and the gradient of it comes back.
  LossEnd gradient_from_next_stage(TensorSet x);
  void fused_loss(TensorSet xf, TensorSet head_w, TensorSet dxf, TensorSet head_grads);
  /// The LM head, the framework's cross-entropy on its logits (logits_loss_), the head's
  /// backward.
  void materialised_loss(TensorSet xf, TensorSet head_w, TensorSet dxf, TensorSet head_grads);
  /// Cross-entropy of the logits to their gradient (in the activations' dtype), as each
  /// framework runs it.
  TensorSet hugging_face_cross_entropy(TensorSet logits);
  TensorSet vocab_parallel_cross_entropy(TensorSet logits);
  /// Blocks L−1..0 backward from `dy` (after `after_loss`); returns the embedding's gradient.
  TensorSet backward_layers(TensorSet dy, OpSet after_loss, bool reduce);
  OpSet embedding_backward(TensorSet dy, bool reduce);
  void optimizer(OpSet last_reduce, TensorSet host_optimizer, TensorSet reduce_bucket);
  void add_notes();
  /// One micro-batch's embedding, forward, loss and backward; `reduce`: its gradients are reduced
  /// (every micro-batch under ZeRO ≥ 2, the last one only under ZeRO 0/1). Returns the op the
  /// optimizer waits for.
  OpSet micro_batch(bool reduce);

  // ---- blocks (step_layers.cpp): built, or instances of a template ----
  struct LayerEnds {
    TensorSet out;  ///< block output
    OpSet first_op;
  };
  /// A recorded block body: its template and, in the template's ids, what the step reads of it.
  struct LayerBody {
    LayerTemplate tmpl;
    TensorSet out;
    OpSet first_op;
  };
  LayerEnds forward_layer(int l, TensorSet x, TensorSet params);
  /// Full checkpointing: block l recomputed from its checkpoint `x`; returns its first op.
  OpSet recompute_layer(int l, TensorSet x, TensorSet params);
  /// Block l's backward (`x`: the input of its forward or recomputation); returns dx.
  TensorSet backward_layer(int l, TensorSet x, TensorSet dy, TensorSet params, TensorSet grads);
  /// Selective checkpointing drops the attention core from what the backward reads.
  void keep_for_backward(SavedLayer& sv) const;
  LayerEnds body_instance(LayerBody& body, int l, TensorSet x, TensorSet params, bool grad);
  /// A stand-in for `bound` while recording: none if it is none, with a producer if it has one.
  TensorSet port_like(TensorSet bound);
  /// Records layer_forward(x, params, grad) into `body`, then removes it from the workload.
  void record_body(LayerBody& body, TensorSet x, TensorSet params, bool grad);
  /// Records layer_backward into bwd_, reading a block emitted just before it, then removes both.
  void record_backward(TensorSet x, TensorSet params, TensorSet dy, TensorSet grads);
  /// Tells the workload the shape of template `id` (Workload::template_shapes).
  void note_template(std::int32_t id, const LayerTemplate& t);

  // ---- block ----
  SavedLayer layer_forward(TensorSet x, TensorSet params, bool grad);
  /// `reentrant`: the block was recomputed by a reentrant checkpoint, whose backward keeps the
  /// recomputed output and the incoming gradient `dy` until the block's backward ends.
  TensorSet layer_backward(
      const SavedLayer& sv, TensorSet dy, TensorSet params, TensorSet grads, bool reentrant);
  /// The block's MLP, forward and backward (tiled or not): step_builder.cpp.
  TensorSet mlp_forward(SavedLayer& sv, TensorSet h1n, TensorSet params, bool grad);
  TensorSet mlp_backward(
      const SavedLayer& sv, TensorSet dy_full, TensorSet h1n, TensorSet params, TensorSet grads);
  /// A gated MLP over `rows` tokens of width `width`, its GEMMs split into `groups` equal ones
  /// (a rank's experts; 1 for a dense MLP).
  struct GatedMlp {
    std::int64_t rows = 0;
    std::int64_t width = 0;
    std::int64_t groups = 1;
    bool eager_activation = false;  ///< silu(gate) kept whatever the recipe's MLP kernel
    /// Copies of gate/up [rows, 2·width] kept beside it (a clamped GLU's clamped inputs).
    std::int64_t gate_up_copies = 0;
  };
  /// The experts' gated MLP on the rank, and the shared expert's (step_experts.cpp).
  GatedMlp expert_mlp() const;
  GatedMlp shared_mlp() const;
  /// `one` run `groups` times (exactly `one` for a single group).
  static KernelCost grouped(KernelCost one, std::int64_t groups);
  /// Gate/up GEMM, activation and down GEMM from `in` into `out`; what the backward reads goes
  /// into `sv`.
  void gated_mlp_forward(
      MlpSaved& saved, TensorSet in, TensorSet params, bool grad, const GatedMlp& g, TensorSet out);
  /// Its backward from `dy` into `dx` and `grads`, as one op. A second MLP of the block (a shared
  /// expert) passes `grads_exist` (its weight gradients go into the block's gradients, which the
  /// first produced) and `dx_partial`, the input gradient its dgrad adds to.
  void gated_mlp_backward(const MlpSaved& saved,
                          TensorSet dy,
                          TensorSet in,
                          TensorSet params,
                          TensorSet grads,
                          const GatedMlp& g,
                          TensorSet dx,
                          bool grads_exist = false,
                          TensorSet dx_partial = {});
  /// Widths of f the MLP backward's gradients hold at once (3, or 1 for Liger's in-place kernel;
  /// 3 for an eager activation).
  std::int64_t mlp_grad_widths(bool eager_activation = false) const;
  /// The mixture of experts, forward and backward: step_experts.cpp.
  TensorSet moe_forward(SavedLayer& sv, TensorSet h1n, TensorSet params, bool grad);
  TensorSet moe_backward(
      const SavedLayer& sv, TensorSet dy, TensorSet h1n, TensorSet params, TensorSet grads);
  /// A shared expert beside the routed ones: the gated MLP of width f_s on every token, added
  /// (scaled by its gate) to the routed sum `routed`; its backward returns its input gradient.
  TensorSet shared_expert_forward(
      SavedLayer& sv, TensorSet h1n, TensorSet params, bool grad, TensorSet routed);
  TensorSet shared_expert_backward(const SavedLayer& sv,
                                   TensorSet dy,
                                   TensorSet h1n,
                                   TensorSet params,
                                   TensorSet grads,
                                   TensorSet routed_dx);
  /// The implementation's traced framework calls for the block's ops emitted since `begin`: all
  /// on its first op; the ops named `sync_after` make the host wait where the implementation
  /// synchronises per expert (step_experts.cpp).
  void issue_block_calls(Mark begin,
                         const ExpertSupport::HostCalls& calls,
                         std::int32_t sync_after);
  /// Routing bookkeeping a block keeps: top-k indices and weights, their sum, the
  /// implementation's own (step_experts.cpp).
  std::int64_t routing_bytes() const;
  /// All-to-all of `in` over the EP group into a new [rows, h] tensor of category `cat`; the
  /// busiest rank's buffer is `buffer_rows` × h.
  TensorSet expert_exchange(
      const char* name, TensorSet in, std::int64_t rows, std::int64_t buffer_rows, MemCategory cat);

  /// Core attention over the head-sharded sequence of n_r = N / ring tokens: one flash-attention
  /// call when the ring degree is 1, else a ring (send/recv) or an all-gather of K/V over the ring
  /// group. `hq` and `hkv` are local heads. `tag` suffixes op names.
  /// The ring's steps: one per step, or with merge_ring_ (r ≥ 4) the first, steps 1..r−2 as one
  /// segment (equal durations on the representative rank), and the last.
  std::vector<RingSegment> ring_segments() const;
  CoreForward core_forward(
      const std::string& tag, TensorSet q_h, TensorSet kv_h, std::int64_t hq, std::int64_t hkv);
  CoreBackward core_backward(const std::string& tag,
                             TensorSet q_h,
                             TensorSet kv_h,
                             TensorSet o_h,
                             TensorSet lse,
                             TensorSet do_h,
                             std::int64_t hq,
                             std::int64_t hkv);
  CoreForward ring_forward(
      const std::string& tag, TensorSet q_h, TensorSet kv_h, std::int64_t hq, std::int64_t hkv);
  CoreBackward ring_backward(const std::string& tag,
                             TensorSet q_h,
                             TensorSet kv_h,
                             TensorSet o_h,
                             TensorSet lse,
                             TensorSet do_h,
                             std::int64_t hq,
                             std::int64_t hkv);
  CoreForward allgather_forward(
      const std::string& tag, TensorSet q_h, TensorSet kv_h, std::int64_t hq, std::int64_t hkv);
  CoreBackward allgather_backward(const std::string& tag,
                                  TensorSet q_h,
                                  TensorSet kv_h,
                                  TensorSet o_h,
                                  TensorSet lse,
                                  TensorSet do_h,
                                  std::int64_t hq,
                                  std::int64_t hkv);
  /// All-gather attention: time of forward or backward per rank, and FLOPs of rank 0.
  /// `k` with its time and FLOPs scaled by the document mask's share of the causal work
  /// (ScheduleInputs::documents); `k` itself for one document.
  static KernelCost masked(KernelCost k, double factor);
  /// The share of one causal document's attention work a rank holding the whole sequence of its
  /// heads (no ring part) computes in the current block: the document mask's (1 without
  /// documents), or the sliding window's of a windowed block (check_attention_window keeps the
  /// two apart and windows off ring parts).
  double whole_share() const {
    return in_.documents.empty() ? layer_window_share_ : in_.documents.total_factor();
  }
  /// post_sublayer_norms: the norm of a sub-block's output `in` (sequence-parallel [s/T, h])
  /// before its residual; keeps `in` and the norm's saved tensors in `kept_in`/`kept` when
  /// `grad`. Returns `in` itself without post-norms.
  TensorSet post_norm(
      const char* name, TensorSet in, bool grad, TensorSet& kept_in, TensorSet& kept);
  /// The category of a sub-block's output: an activation when a post-norm keeps it for backward.
  MemCategory post_norm_input_category(bool grad) const;
  /// Its backward: the gradient of the sub-block's output from `d_out`; `d_out` itself without
  /// post-norms.
  TensorSet post_norm_backward(const char* name, TensorSet d_out, TensorSet in, TensorSet kept);
  /// Enters block `layer`: its attention's window share (whole_share).
  void enter_layer(int layer);
  std::vector<double> allgather_times(std::int64_t hq, bool backward, double* flops) const;
  /// The steps of `seg` on each rank of the ring (attention shapes of the zigzag or contiguous
  /// layout): time of forward or backward per rank, and FLOPs of rank 0.
  /// `send_s`: a forward send's nominal time (packed documents on the representative rank).
  std::vector<double> ring_step_times(const RingSegment& seg,
                                      std::int64_t hq,
                                      bool backward,
                                      double* flops,
                                      double send_s = 0.0) const;
  /// The representative rank's forward attention time of ring step `step` when positions differ
  /// (attention_core.cpp, "Forward ring steps of positions whose attention differs").
  double ring_forward_lockstep_s(int step,
                                 const std::function<double(int, int)>& attention_s,
                                 double send_s) const;

  HeadLayout layout_;
  const Implementation* implementation_;  ///< nullptr: the method's scheme alone
  const CpScheme& method_;
  /// How the implementation's code runs a mixture of experts (the common part without one).
  ExpertSupport experts_;
  std::int64_t acc_bytes_ = 4;  ///< ring output and gradient accumulators (implementation's dtype)
  LogitsLoss logits_loss_ = LogitsLoss::kHuggingFace;  ///< the implementation's framework's
  /// The rank's parameters: with expert parallelism its layers hold 1/E_p of the experts
  /// (per_layer and total count those), expert_params_ of them per layer.
  models::ParameterCount params_;
  std::int64_t expert_params_ = 0;
  /// Parameters the rank's optimizer updates: everything under ZeRO-0, else its shard (the
  /// experts' over the expert data-parallel ranks, the rest over all).
  std::int64_t updated_params_ = 0;
  bool merge_ring_ = false;               // BuildOptions::merge_ring_steps
  bool repeat_layers_ = true;             // BuildOptions::repeat_layers
  double layer_window_share_ = 1.0;       // the current block's (enter_layer)
  bool layer_experts_ = false;            // the current block's MLP is the experts (enter_layer)
  std::int64_t layer_window_tokens_ = 0;  // the current block's window; 0: none or ≥ the sequence
  bool tp_regather_ = true;               // TP linears save [s/T, h] inputs and gather them again
  std::int64_t shards_ = 1, tile_ = 0;
  // Per block, filled by build().
  std::vector<TensorSet> layer_params_;  ///< gathered parameters (ZeRO-3)
  std::vector<TensorSet> checkpoints_;   ///< input of the forward or recomputation, on the GPU
  std::vector<TensorSet> host_copies_;   ///< offloaded checkpoints (pinned host)
  std::vector<SavedLayer> saved_;        ///< built one by one: what each backward reads
  std::vector<Mark> body_at_;  ///< instances: where each forward (or recomputation) begins
  LayerBody fwd_, rec_, bwd_;  ///< templates: forward, recomputation, backward
  std::array<int, 3> noted_templates_{};  ///< recordings per Workload template id
};

}  // namespace cpsim::sim::detail
