#pragma once
/// @file Implementations of the CP methods as users run them: yunchang's LongContextAttention,
/// DeepSpeed's UlyssesSPAttentionHF, ... Each one runs a method's scheme (cp_method.hpp) and adds
/// what its own code allocates beyond that scheme: its allocation ledger, read from its source at a
/// pinned commit. One file per implementation in sim/src/implementations/, with its derivation and
/// sources; the ledger document docs/implementations/<name>.md lists the same rows (a test keeps
/// the two equal).

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "cpsim/models/parallel.hpp"
#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/head_layout.hpp"

namespace cpsim::sim {

/// Where, among the ops of one layer's attention block, a ledger row's memory lives: allocated
/// when that op starts, freed when it ends (op workspace). The sites are those of the Ulysses
/// scheme (attention_ulysses.cpp); at Ulysses degree 1 the exchanges are local copies.
enum class LedgerSite : std::uint8_t {
  /// Not workspace: the projected Q, K, V (after RoPE) stay alive until the block's output
  /// all-to-all has ended, because the caller holds them (the module's locals), and not only until
  /// their all-to-all.
  kHeldThroughBlock,
  /// Not workspace: what the backward kernel read (head-sharded Q, K/V, output, LSE, dOut) and
  /// the incoming output gradient stay alive until the gradients' all-to-alls end (one autograd
  /// function around kernel and all-to-alls).
  kHeldThroughBackward,
  kQExchange,     ///< all-to-all of Q (forward and recomputation)
  kKvExchange,    ///< all-to-all of K and V
  kCoreForward,   ///< the attention kernel call and the wrapper's merge around it (ring degree 1)
  kOutExchange,   ///< all-to-all of the output back to the sequence layout
  kDoutExchange,  ///< backward: all-to-all of the output gradient
  kCoreBackward,  ///< backward: the attention kernel call (ring degree 1)
  /// backward: what the wrapper does after the kernel (gradient copies, casts, send/recv of dK/dV)
  /// while it still holds the saved tensors; an op of its own (ring degree 1).
  kGradFinish,
  kDqExchange,   ///< backward: all-to-all of dQ
  kDkvExchange,  ///< backward: all-to-all of dK and dV
  /// Each forward step of the ring part (ring degree > 1): the block's kernel call and the merge
  /// of its output into the accumulators, while the next K/V block is in flight.
  kRingForwardStep,
  /// Each backward step of the ring part: the block's kernel call and the dK/dV hop.
  kRingBackwardStep,
  /// Kept from every forward step of the ring part until the output is merged after the last step
  /// (code that keeps each step's received K/V and output in a list): beyond the scheme's current
  /// and next block and its merged output, step k holds these bytes k − 1 times, the final merge
  /// C − 1 times.
  kRingForwardHeld,
};
inline constexpr int kLedgerSiteCount = 14;
const char* to_string(LedgerSite s);

/// When a ledger row applies.
enum class LedgerWhen : std::uint8_t {
  kAlways,
  kUlyssesAbove1,         ///< Ulysses degree u > 1 (a copy the wrapper skips at u = 1)
  kKvHeadsPerRankAbove1,  ///< u > 1 and more than one KV head per rank after the all-to-all
  /// More than one KV head per rank after the all-to-all, whatever u (at u = 1: Hkv > 1): a
  /// copy of a transposed view that is already contiguous with one head (yunchang's
  /// all_to_all_4D).
  kKvHeadsPerRankAbove1AnyDegree,
  /// u > 1 and more than one query head per rank after the all-to-all (with one, a head-major
  /// tensor's transpose is already contiguous and `.contiguous()` copies nothing).
  kHeadsPerRankAbove1,
};
const char* to_string(LedgerWhen w);

/// One allocation beyond the method's scheme, in bytes per element count of the rank's tensors:
///   bytes = shd·(s·H·d) + shkd·(s·Hkv·d) + sh·(s·H)
/// with s = N/C the rank's tokens before the all-to-all, H and Hkv the query and KV heads of one
/// stage (all of the model's heads, KV heads after any replication; UPipe: the U heads of a stage
/// and the KV heads of one fetch), d the head dimension. (After the all-to-all a rank holds N/r
/// tokens of H/u heads: the same element count.) Example: a bf16 copy of Q is shd = 2.
///
/// `traffic`, in the same units: the HBM bytes read plus written by the kernel(s) that write the
/// row's tensors (a bf16 `.contiguous()` copy of Q: 2 + 2 = 4 per s·H·d; `.to(float32)` of it:
/// 2 + 4 = 6; a zero fill: its bytes), less what the scheme already times at that op for the same
/// work (its generic fp32 merge). 0 for a pure allocation whose contents a timed op writes (an
/// all-to-all's receive buffer, a kernel's output) and for tensors only held. The simulator runs
/// it on the op's compute stream at the memory-bound rate (CostModel::memory_traffic_s).
struct LedgerTraffic {
  std::int64_t shd = 0;
  std::int64_t shkd = 0;
  std::int64_t sh = 0;
};
/// A row's traffic, as the tables write it: hbm(shd, shkd, sh).
constexpr LedgerTraffic hbm(std::int64_t shd, std::int64_t shkd, std::int64_t sh) {
  return LedgerTraffic{shd, shkd, sh};
}
struct LedgerRow {
  std::string_view id;  ///< the ledger document's row id ("F1")
  LedgerSite site = LedgerSite::kCoreForward;
  LedgerWhen when = LedgerWhen::kAlways;
  std::int64_t shd = 0;
  std::int64_t shkd = 0;
  std::int64_t sh = 0;
  LedgerTraffic traffic;    ///< bytes its kernels read and write (see above)
  std::string_view tensor;  ///< what it is, with its dtype
  /// `shkd` counts the model's KV heads, sHkv_m·d: tensors made before the implementation
  /// replicates K/V to the Ulysses degree (LedgerUnits::shkd_model).
  bool model_kv_heads = false;
  /// `shd` (bytes and traffic) counts attention outputs and their gradients, s·H·d_v
  /// (LedgerUnits::shvd): d_v differs from d under multi-head latent attention only.
  bool output_heads = false;
};

/// The element counts a ledger row multiplies.
/// K and V count together in every row (even shkd coefficients), so that under multi-head latent
/// attention sHkv·d stands for sHkv·(d + d_v)/2.
struct LedgerUnits {
  std::int64_t shd = 0;
  std::int64_t shvd = 0;  ///< s·H·d_v: outputs (LedgerRow::output_heads)
  std::int64_t shkd = 0;
  std::int64_t sh = 0;
  std::int64_t ulysses = 1;
  std::int64_t kv_heads_per_rank = 1;
  std::int64_t heads_per_rank = 1;
  std::int64_t kv_replication = 1;  ///< HeadLayout::kv_replication (1: KV heads not replicated)
  std::int64_t shkd_model = 0;      ///< shkd at the model's KV heads: shkd / kv_replication
};
LedgerUnits ledger_units(const ScheduleInputs& in, const HeadLayout& layout);
std::int64_t row_bytes(const LedgerRow& row, const LedgerUnits& units);
/// The row's bytes as the ledger documents write them: "2·sHd + 4·sHkv·d" ("0" when empty).
std::string row_formula(const LedgerRow& row);
/// HBM bytes read and written by the row's kernels (`LedgerRow::traffic`).
std::int64_t row_traffic_bytes(const LedgerRow& row, const LedgerUnits& units);
/// The row's traffic as the ledger documents write it ("4·sHd", "0" when none).
std::string traffic_formula(const LedgerRow& row);

/// When a traced framework-call count (SiteCalls) applies: what differs between traced shapes.
enum class CallsWhen : std::uint8_t {
  kAlways,
  kHeadsPerRankAbove1,    ///< more than one query head per rank after the all-to-all
  kKvHeadsPerRankAbove1,  ///< more than one KV head per rank after the all-to-all
  kKvReplicated,          ///< KV heads replicated up to the Ulysses degree
};
const char* to_string(CallsWhen w);

/// Framework calls the host issues at one ledger site of one attention block (Op::host_calls),
/// counted from the implementation's code by the allocation tracer (the traces' "op_counts":
/// aten calls that launch work; views, detach and empty excluded; the attention kernel counts
/// 1). A site's count is the sum of its rows that apply; the exchange sites' counts hold at
/// Ulysses degree > 1, the kernel's and grad_finish at ring degree 1.
struct SiteCalls {
  LedgerSite site = LedgerSite::kCoreForward;
  CallsWhen when = CallsWhen::kAlways;
  std::int64_t calls = 0;
};

/// Cross-entropy over materialised logits (the recipe's fused loss off), as the framework around
/// an implementation computes it; sim/src/step_builder.cpp has each one's derivation.
enum class LogitsLoss : std::uint8_t {
  /// `logits.float()`, then F.cross_entropy (log_softmax + nll_loss): Hugging Face's
  /// ForCausalLMLoss, TorchTitan's cross_entropy_loss. 12 bytes per logit at the backward peak.
  kHuggingFace,
  /// Megatron-Core's vocab-parallel cross-entropy: one fp32 copy of the logits becomes the softmax
  /// in place and, in backward, the gradient in place, then a cast to the logits' dtype.
  kMegatronVocabParallel,
};

/// How an implementation's code runs a model's sliding-window layers when it runs a method
/// (Implementation::sliding_window).
struct WindowSupport {
  /// Its attention call hands the layer's window to the kernel, which sees the whole sequence of
  /// its heads (no ring part): the kernel skips the key blocks outside the window.
  bool passes_window = false;
  std::string_view source;  ///< where its code says so, or why not
};

/// How an implementation's code runs an attention feature of a model (Implementation::
/// attention_sinks: gpt-oss's learned logit per query head in every softmax's denominator;
/// Implementation::chunked_attention: Llama 4's chunks; Implementation::latent_attention:
/// DeepSeek-V3's multi-head latent attention, K heads d wide and V heads d_v).
struct FeatureSupport {
  bool runs = false;        ///< its attention kernel runs it as the model's code does
  std::string_view source;  ///< where its code says so, or why not
};

/// How an implementation's code runs a mixture-of-experts MLP (Implementation::experts).
struct ExpertSupport {
  bool runs = false;             ///< its model code runs the mixture of experts
  bool expert_parallel = false;  ///< it splits the experts over an EP group (E_p > 1)
  std::string_view source;       ///< where its code says so, or why not
  // What its block keeps for the backward (step_experts.cpp), beside the experts' input [s·k, h]
  // and the gated MLP's tensors, which every block keeps. Bytes stated for a 2-byte activation
  // dtype (check_experts refuses others); s tokens, k per token, E experts, h hidden.
  /// Routing bytes per token and expert: the fp32 softmax output [s, E] (4), or Megatron-Core's
  /// probabilities in bf16 with its boolean routing map (3).
  std::int64_t routing_bytes_per_token_expert = 4;
  /// Routing bytes per token copy: the top-k index (int64) and the cast weight (bf16), 10, plus
  /// the implementation's own (sorted indices, per-row weights, per-expert loop indices).
  std::int64_t routing_bytes_per_copy = 10;
  /// Routing bytes per token beyond those (a renormalisation's fp32 sum where it is not counted
  /// by keeps_renormalisation).
  std::int64_t routing_bytes_per_token = 0;
  /// The fp32 weights and sum of a renormalisation, 4·(s·k + s), kept when the top-k weights are
  /// renormalised (MoeSpec::renormalize); false where routing_bytes_* count them already.
  bool keeps_renormalisation = true;
  /// Bytes per element of a copy of the router's input [s, h] kept for its backward (TorchTitan
  /// computes the gate under CUDA autocast to fp32: 4); 0: the block's input serves.
  std::int64_t router_input_bytes = 0;
  /// The routing weights multiply inside the experts, on the SwiGLU's output [s·k, f] that the
  /// down projection keeps anyway (Megatron-Core's weighted SwiGLU), rather than on the combined
  /// outputs [s·k, h], which the product's backward then keeps.
  bool weights_inside_experts = false;
  /// Bytes per element of the combined outputs kept for the weights' product (when the weights
  /// multiply after the experts): 2 (bf16), or 4 where the product runs in fp32 (TorchTitan).
  std::int64_t combined_bytes = 2;
  /// The weighted outputs [s·k, h] kept as well (the Hugging Face loop's index_add_ saves its
  /// source).
  bool keeps_weighted_outputs = false;
  /// Its experts keep silu(gate) [s·k, f] whatever the recipe's MLP kernel (eager SwiGLU in the
  /// experts: TorchTitan's GroupedExperts, the Hugging Face loop).
  bool eager_expert_activation = false;
  /// gpt-oss's clamped GLU (models::ActivationKind::kClampedQuickGeGlu) in its experts: -1 not
  /// read (refused), else the copies of gate/up [s·k, 2·f] it keeps beyond gate/up itself
  /// (Megatron-Core's clamp keeps its input and the fused GLU the clamped concatenation: 1).
  std::int64_t clamped_glu_copies = -1;
  /// Its block runs a shared expert (MoeSpec::shared_ffn_hidden) as step_experts.cpp does; false:
  /// not read (refused).
  bool runs_shared_experts = false;
  /// Framework calls its block makes, traced where it loops over the experts in Python (0: one
  /// per kernel, as the builders count them): per layer `block` + `per_expert` × experts, with
  /// `renormalize` more when the top-k weights are renormalised (MoeSpec::renormalize).
  struct HostCalls {
    std::int64_t block = 0;
    std::int64_t per_expert = 0;
    std::int64_t renormalize = 0;
    std::int64_t of(std::int64_t experts, bool renormalized) const {
      return block + per_expert * experts + (renormalized ? renormalize : 0);
    }
  };
  HostCalls forward_calls{};
  HostCalls backward_calls{};
  /// Its forward waits on the GPU inside the expert loop (a device-to-host read per expert): the
  /// host issues nothing while the experts' kernels run.
  bool synchronises_per_expert = false;
};

/// The Hugging Face model's own MoE block, which the implementations that replace only the
/// attention leave in place (transformers 4.57.6 MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock,
/// modeling_qwen3_moe.py:226-264): a loop over the experts on each rank's tokens, so every expert
/// runs on every rank (its weights gathered by ZeRO-3), no expert parallelism. Per expert it keeps
/// the torch.where indices idx and top_x (int64, 16 more bytes per token copy: 26) and index_add_'s
/// source,
/// the weighted outputs (traced: tests/models/test_hf_models.py). Its framework calls, counted
/// there as the tracer counts them (every non-view aten op): forward 14 + 12 per expert
/// (torch.where's nonzero, the index of the tokens and of their weights, gate/up/down mm, silu,
/// two mul, index_add_, and the `.item()` of indexing the ModuleList with a tensor: a
/// device-to-host read per expert, as is nonzero's size), 3 more when renormalised; backward
/// 6 + 20 per expert, 7 more when renormalised.
inline constexpr ExpertSupport kHuggingFaceExperts{
    .runs = true,
    .expert_parallel = false,
    .source =
        "its wrapper replaces the attention only; the Hugging Face MoE block runs every "
        "expert on each rank (transformers 4.57.6 modeling_qwen3_moe.py:226-264): no "
        "expert parallelism",
    .routing_bytes_per_copy = 26,
    .keeps_weighted_outputs = true,
    .eager_expert_activation = true,
    .forward_calls = {.block = 14, .per_expert = 12, .renormalize = 3},
    .backward_calls = {.block = 6, .per_expert = 20, .renormalize = 7},
    .synchronises_per_expert = true};

/// What an implementation is, as data (one constexpr table per file in sim/src/implementations).
struct ImplementationTable {
  std::string_view name;           ///< as `--impl` spells it: "yunchang-usp"
  std::string_view title;          ///< one line: the code it models
  std::string_view pinned_source;  ///< upstream repository and commit: "owner/repo@<40 hex>"
  std::span<const models::CpMethod> methods;    ///< the first is the one `--impl` alone selects
  std::span<const std::string_view> launchers;  ///< as `--emit` spells them
  /// The recipe whose runs of its methods it is the default implementation of; empty: none.
  std::string_view default_recipe;
  std::span<const LedgerRow> ledger;
  /// What it models crudely or leaves out (printed with the modelling notes); one line each.
  std::span<const std::string_view> limits;
  /// Tensor parallelism around its CP (ParallelConfig::tp_degree > 1): empty when its launcher
  /// runs it, else why not (one line, naming the source).
  std::string_view tp_refusal;
  /// Under TP with sequence parallelism, its column-parallel linears save their sequence-sharded
  /// input [s/T, h] and all-gather it again in backward for the weight gradient (Megatron);
  /// false: the gathered input [s, h] is what autograd saves (TorchTitan's DTensor linears).
  bool tp_regathers_inputs;
  /// Pipeline parallelism around its CP (ParallelConfig::pp_degree > 1): empty when its launcher
  /// runs it, else why not (one line, naming the source).
  std::string_view pp_refusal;
};

/// An implementation users run: its table, and hooks where its code changes the scheme.
class Implementation {
 public:
  explicit Implementation(const ImplementationTable& table) : table_(table) {}
  virtual ~Implementation() = default;
  Implementation(const Implementation&) = delete;
  Implementation& operator=(const Implementation&) = delete;

  std::string_view name() const { return table_.name; }
  std::string_view title() const { return table_.title; }
  std::string_view pinned_source() const { return table_.pinned_source; }
  std::span<const models::CpMethod> methods() const { return table_.methods; }
  /// The recipe whose runs of its methods it is the default of; empty: none.
  std::string_view default_recipe() const { return table_.default_recipe; }
  std::span<const std::string_view> launchers() const { return table_.launchers; }
  std::span<const LedgerRow> ledger() const { return table_.ledger; }
  std::span<const std::string_view> limits() const { return table_.limits; }
  /// Empty when it runs tensor parallelism around its CP, else why not.
  std::string_view tp_refusal() const { return table_.tp_refusal; }
  bool tp_regathers_inputs() const { return table_.tp_regathers_inputs; }
  /// Empty when it runs pipeline parallelism around its CP, else why not.
  std::string_view pp_refusal() const { return table_.pp_refusal; }
  /// docs/implementations/<name>.md
  std::string ledger_document() const {
    return "docs/implementations/" + std::string(name()) + ".md";
  }
  bool runs(models::CpMethod m) const;
  bool runs_on(std::string_view launcher) const;
  /// Whether it is the default implementation of `m` in recipe `recipe`.
  bool default_for(std::string_view recipe, models::CpMethod m) const;
  /// Sum of the rows that apply at `site`.
  std::int64_t site_bytes(LedgerSite site, const LedgerUnits& units) const;
  /// Sum of the traffic of the rows that apply at `site`.
  std::int64_t site_traffic_bytes(LedgerSite site, const LedgerUnits& units) const;
  /// Framework calls at `site` traced from its code (the SiteCalls rows that apply); nullopt:
  /// none traced there, the builders' own count per op stands.
  std::optional<std::int64_t> site_calls(LedgerSite site, const LedgerUnits& units) const;

  /// What its code changes in the head layout before anything is sized (e.g. K/V repeated to the
  /// query heads before attention); the default changes nothing.
  virtual void shape(const ScheduleInputs& /*in*/, HeadLayout& /*layout*/) const {}
  /// Bytes per element of the ring part's output and dQ/dK/dV accumulators (fp32 in most code;
  /// Transformer Engine accumulates in the activations' dtype).
  virtual std::int64_t ring_accumulator_bytes(const ScheduleInputs& /*in*/) const { return 4; }
  /// The attention kernel whose profile curves time its attention calls: the one PyTorch's or
  /// the library's dispatch picks for the recipe's kernel at these shapes; the default is the
  /// recipe's.
  virtual std::string attention_kernel(const ScheduleInputs& in) const {
    return in.recipe.attention_kernel;
  }
  /// How its code applies RoPE (models::RopeKernel): the recipe's, unless the implementation runs
  /// its own kernel whatever the model's code does.
  virtual models::RopeKernel rope_kernel(const ScheduleInputs& in) const {
    return in.recipe.rope_kernel;
  }
  /// The cross-entropy its framework runs on materialised logits; the default: Hugging Face's.
  virtual LogitsLoss logits_loss() const { return LogitsLoss::kHuggingFace; }
  /// Whether it runs the FPDT scheme's offloading loop as DeepSpeed's fpdt_layer.py does: the
  /// framework calls of its chunks and blocks and its host synchronisations after each block
  /// (sim/src/attention_fpdt.cpp, docs/MODEL.md "Host issue"); the default: no.
  virtual bool synchronised_fpdt_loop() const { return false; }
  /// Whether its online-softmax merge writes a new fp32 output and LSE accumulator while the old
  /// ones are live (they are rebound after it), rather than updating them in place; the FPDT
  /// scheme then holds both during every block's merge. The default: in place.
  virtual bool rebinds_merge_accumulator() const { return false; }
  /// Whether its framework reduces unsharded (ZeRO-0/1) gradients in place, in the persistent
  /// buffer they accumulate in, so that a reduction in their own dtype allocates nothing; the
  /// default: the reduction casts them into a buffer of its own.
  virtual bool reduces_gradients_in_place() const { return false; }
  /// How its code attends packed documents when it runs method `m` (docs/PACKING.md); the
  /// default: not read.
  virtual DocumentMasking document_masking(models::CpMethod /*m*/) const {
    return {DocumentMasking::Kind::kNotRead, {}, "its handling of packed documents was not read"};
  }
  /// How its code runs sliding-window layers under method `m`; the default: not read.
  virtual WindowSupport sliding_window(models::CpMethod /*m*/) const {
    return {false, "its handling of a sliding window was not read"};
  }
  /// How its code runs attention sinks under method `m`; the default: not read.
  virtual FeatureSupport attention_sinks(models::CpMethod /*m*/) const {
    return {false, "its handling of attention sinks was not read"};
  }
  /// How its code runs chunked attention under method `m`; the default: not read.
  virtual FeatureSupport chunked_attention(models::CpMethod /*m*/) const {
    return {false, "its handling of chunked attention was not read"};
  }
  /// How its code runs multi-head latent attention under method `m`; the default: not read.
  virtual FeatureSupport latent_attention(models::CpMethod /*m*/) const {
    return {false, "its handling of multi-head latent attention was not read"};
  }
  /// How its code runs a mixture of experts under method `m`; the default: not read.
  virtual ExpertSupport experts(models::CpMethod /*m*/) const {
    return {.runs = false,
            .expert_parallel = false,
            .source = "its handling of a mixture of experts was not read"};
  }
  /// Its framework calls per site, traced (SiteCalls); the default: none traced.
  virtual std::span<const SiteCalls> traced_calls() const { return {}; }
  /// Constraints of its code beyond the method's (head divisibility, ...); the default has none.
  virtual std::optional<ConfigIssue> check(const ScheduleInputs& /*in*/,
                                           const HeadLayout& /*layout*/) const {
    return std::nullopt;
  }

 private:
  /// Sum of `per_row` over the rows that apply at `site`.
  std::int64_t site_sum(LedgerSite site,
                        const LedgerUnits& units,
                        std::int64_t (*per_row)(const LedgerRow&, const LedgerUnits&)) const;

  ImplementationTable table_;
};

/// Every implementation, in the order `cpsim implementations` lists them.
std::span<const Implementation* const> implementations();
/// The default implementation of method `m` in recipe `recipe`; nullptr: the scheme alone.
const Implementation* default_implementation(std::string_view recipe, models::CpMethod m);
/// The implementation a configuration asks for, resolved by name once: `ParallelConfig::
/// implementation`, else the recipe's default for its method; nullptr for "none" or no default.
/// `issue`: the name is unknown, or the implementation does not run the method (then no
/// implementation). Its own constraints are check_head_layout's.
struct ResolvedImplementation {
  const Implementation* implementation = nullptr;
  std::optional<ConfigIssue> issue;
};
ResolvedImplementation resolve_implementation(const ScheduleInputs& in);
/// resolve_implementation(in).implementation: nullptr for an unknown name too.
const Implementation* requested_implementation(const ScheduleInputs& in);
/// Bytes per logit held at the peak of the loss on materialised logits, beyond the loss's input
/// and the LM head (the implementation's LogitsLoss; Hugging Face's without one): 12 for Hugging
/// Face's (three fp32 tensors), 4 + the activation bytes for Megatron's (the fp32 softmax and the
/// gradient cast to the logits' dtype).
std::int64_t logits_loss_peak_bytes_per_logit(const ScheduleInputs& in);
/// By name; nullptr when unknown.
const Implementation* find_implementation(std::string_view name);
/// "a, b, c".
std::string implementation_names();

}  // namespace cpsim::sim
