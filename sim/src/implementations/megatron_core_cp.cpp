// Context parallelism of Megatron-Core through Transformer Engine's DotProductAttention, as
// Megatron-LM and NeMo run it: `--cp-comm-type p2p` (ring), `a2a` (Ulysses) and `a2a+p2p` (USP),
// always on TE's cuDNN fused-attention kernels (Megatron's sbhd layout rules out flash-attn
// under CP).
//
// Derivation (ledger: docs/implementations/megatron-core-cp.md, rows by id). On top of cpsim's
// schemes, per layer and rank (element counts of one rank: s·H·d, s·Hkv·d):
//   - Megatron's attention keeps query, key and value as locals until core attention returns;
//   - a2a (flash_attn_a2a_communicate): each all-to-all copies its input (movedim().contiguous()),
//     receives into an empty_like buffer and then copies again (the sequence reorder, or the
//     final movedim().contiguous()), so two transients the size of the tensor live beside input
//     and output; dQ, dK and dV go through one call (their copies live together); one autograd
//     function wraps the all-to-alls and the kernel, so what it saved and the incoming gradient
//     live until the gradients' all-to-all ends; TE does not replicate KV heads (it asserts
//     Hkv % a2a size == 0);
//   - p2p (AttnFuncWithCPAndKVP2P): the forward keeps every received K/V buffer, every step's
//   output
//     and LSE in lists until the output is merged after the last step; the merged output and the
//     dQ/dK/dV accumulators are in the activations' dtype (bf16), not fp32, and the dK/dV
//     accumulate inside the communication buffers, so no cast ends the backward.
// Not modelled (limits()): the cuDNN kernels' workspace (chosen by cuDNN at run time); the
// all_gather comm type (TE regathers K/V and keeps per-step gradient lists); FP8; a contiguous
// copy of V before CP when it is a strided view (backends.py); the returned dK/dV pinning their
// whole communication buffer.
// Megatron's vocab-parallel cross-entropy runs on the materialised logits (LogitsLoss, ledger
// section 5: one fp32 copy of the logits, softmax and backward in place; the step builder's
// vocab_parallel_cross_entropy); the fused linear cross-entropy has no Megatron-LM or NeMo setting.
//
// Sources (REFERENCES.md [TransformerEngine], [Megatron-LM]): NVIDIA/TransformerEngine @
// d0067d0da6cb01811b8072a7d304f0e00344ce2b,
// transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py
// (AttnFuncWithCPAndKVP2P, AttnFuncWithCPAndQKVOA2A, flash_attn_a2a_communicate), backends.py;
// NVIDIA/Megatron-LM @ d98e8a64ddf34856e74b24714e3bedb2f5a39553,
// megatron/core/extensions/transformer_engine.py (sbhd, cp_comm_type),
// megatron/core/transformer/attention.py.
#include <array>

#include <fmt/format.h>

#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim::impls {
namespace {

using models::CpMethod;

constexpr std::array kRows = {
    LedgerRow{"A0", LedgerSite::kHeldThroughBlock, LedgerWhen::kAlways, 2, 4, 0, hbm(0, 0, 0),
              "attention's query, key, value (bf16) held until core attention returns"},
    LedgerRow{"A1+A2 (q)", LedgerSite::kQExchange, LedgerWhen::kUlyssesAbove1, 4, 0, 0,
              hbm(4, 0, 0), "q all-to-all: input copy and empty_like receive buffer (bf16)"},
    LedgerRow{"A1+A2 (k, v)", LedgerSite::kKvExchange, LedgerWhen::kUlyssesAbove1, 0, 8, 0,
              hbm(0, 8, 0), "k, v all-to-all: input copies and receive buffers (bf16)"},
    LedgerRow{"A7+A8", LedgerSite::kOutExchange, LedgerWhen::kUlyssesAbove1, 4, 0, 0, hbm(4, 0, 0),
              "output all-to-all: reorder copy and receive buffer (bf16)", false, true},
    LedgerRow{"A11", LedgerSite::kDoutExchange, LedgerWhen::kUlyssesAbove1, 4, 0, 0, hbm(4, 0, 0),
              "dout all-to-all: input copy and receive buffer (bf16)", false, true},
    LedgerRow{"A10+A11 (q, k, v)", LedgerSite::kHeldThroughBackward, LedgerWhen::kUlyssesAbove1, 2,
              4, 4, hbm(0, 0, 0), "saved q', k', v' and LSE held to the function's return"},
    LedgerRow{"A10+A11 (out)", LedgerSite::kHeldThroughBackward, LedgerWhen::kUlyssesAbove1, 6, 0,
              0, hbm(0, 0, 0), "saved out_ and dout' held to the function's return, with dout",
              false, true},
    LedgerRow{"A14", LedgerSite::kDqExchange, LedgerWhen::kUlyssesAbove1, 4, 12, 0, hbm(4, 16, 0),
              "one all-to-all call for dq, dk, dv: reorder copies and receive buffers of all "
              "three and the dk, dv results (bf16)"},
    LedgerRow{"P3+P5 (K/V, LSE)", LedgerSite::kRingForwardHeld, LedgerWhen::kAlways, 0, 4, 4,
              hbm(0, 0, 0), "per step kept to the merge: received K/V (bf16), LSE (fp32)"},
    LedgerRow{"P6 (out)", LedgerSite::kRingForwardHeld, LedgerWhen::kAlways, 2, 0, 0, hbm(0, 0, 0),
              "per step kept to the merge: output (bf16)", false, true},
};

constexpr std::array<std::string_view, 3> kLimits = {
    "megatron-core-cp: the cuDNN fused-attention workspace (chosen at run time) and the "
    "all_gather comm type are not modelled",
    "megatron-core-cp: the returned dK/dV pinning their communication buffer is not modelled; "
    "the vocab-parallel cross-entropy is timed pass by pass as the unfused code runs it "
    "(NeMo's default fused copy may merge passes)",
    "megatron-core-cp: the copies' time (ledger traffic) runs as one op before each all-to-all, "
    "on the compute stream; the index_select reorders after the receive (A3, A9) and the ring's "
    "out correction beyond the scheme's merge are not timed",
};

constexpr std::array kMethods = {CpMethod::kRing, CpMethod::kUlysses, CpMethod::kUsp};
constexpr std::array<std::string_view, 2> kLaunchers = {"megatron", "nemo"};

// No built-in recipe is Megatron's: `--impl megatron-core-cp` selects it.
constexpr ImplementationTable kTable{
    "megatron-core-cp",
    "Megatron-Core CP through Transformer Engine (p2p, a2a, a2a+p2p; cuDNN attention)",
    "NVIDIA/TransformerEngine@d0067d0da6cb01811b8072a7d304f0e00344ce2b",
    kMethods,
    kLaunchers,
    "",
    kRows,
    kLimits,
    "",
    true,
    ""};

class MegatronCoreCp final : public Implementation {
 public:
  MegatronCoreCp() : Implementation(kTable) {}
  // Megatron-LM @ d98e8a6 megatron/core/utils.py:2454-2501 (get_batch_on_this_cp_rank with
  // cu_seqlens: per-document zigzag through TransformerEngine's thd_get_partitioned_indices) and
  // TransformerEngine @ d0067d0 context_parallel.cu:83-103 (the p2p ring over THD);
  // megatron-core 0.16.1 pipeline_parallel/hybrid_cp_schedule.py (hybrid CP). The THD path of its
  // all-to-all CP was not read.
  DocumentMasking document_masking(models::CpMethod m) const override {
    if (m == models::CpMethod::kRing) {
      return {DocumentMasking::Kind::kMasked,
              {Balancer::kPerDocument, Balancer::kHybridCp, Balancer::kDynamicCp},
              "THD with cu_seqlens: every document padded to 2·CP and split head-tail by "
              "TransformerEngine, or with hybrid (dynamic) CP each document on a CP group of "
              "its own size (REFERENCES.md [Packing-Megatron], [CP-split-TE], "
              "[HybridCP-Megatron], [DynamicCP-Megatron])"};
    }
    return {DocumentMasking::Kind::kNotRead,
            {},
            "the THD path of its all-to-all CP (cp_comm_type a2a, a2a+p2p) was not read"};
  }
  // megatron-core 0.16.1 DDP: every gradient accumulates in the bucket's grad_data (main_grad,
  // fp32 with grad_reduce_in_fp32; distributed/param_and_grad_buffer.py:780-840), and
  // start_grad_sync reduce-scatters (distributed optimizer) or all-reduces that buffer in place
  // (:433-457): no copy beside the model states.
  bool reduces_gradients_in_place() const override { return true; }
  // megatron-core 0.16.1: MoELayer (transformer/moe/moe_layer.py) with the all-to-all token
  // dispatcher (token_dispatcher.py:348, 647-669: permuted tokens all-to-all over the EP group and
  // back) and grouped experts (experts.py); the expert ranks fold over the same GPUs as TP × CP ×
  // DP in the order tp-ep-dp (parallel_state.py:785-806: expert TP defaults to TP, EP innermost).
  // What its block keeps, traced: megatron-core 0.16.1's MoELayer with the all-to-all dispatcher
  // run on the CPU (tests/models/test_megatron_moe.py: CUDA streams stood in, TransformerEngine
  // absent, SequentialMLP for TE's grouped GEMM, whose GroupedLinear keeps the same inputs). Per
  // token copy: the top-k index (int64) and softmaxed score (fp32), the sorted index (int64) and
  // the permuted weight (bf16): 22 bytes; per token and expert the probabilities (bf16) and the
  // routing map (bool): 3; the weights multiply inside the experts (weighted SwiGLU,
  // moe_utils / fusions/fused_bias_swiglu.py), so no combined [s·k, h] is kept; the top-k softmax
  // is the renormalisation. gpt-oss's clamped GLU (weighted_bias_quick_geglu_impl with a clamp,
  // fusions/fused_bias_geglu.py): the clamps keep gate/up (their input) and the fused function
  // the concatenated clamped halves, one more [s·k, 2f] (traced: test_megatron_moe.py); the expert
  // output bias (TEGroupedMLP._apply_bias) keeps nothing beyond its inputs. Shared experts:
  // SharedExpertMLP (moe/shared_experts.py:125-135), traced in the same test.
  ExpertSupport experts(models::CpMethod /*m*/) const override {
    return {.runs = true,
            .expert_parallel = true,
            .source =
                "MoELayer with the all-to-all dispatcher over EP ranks folded with CP and DP "
                "(megatron-core 0.16.1, transformer/moe/token_dispatcher.py:647-669, "
                "parallel_state.py:785-806)",
            .routing_bytes_per_token_expert = 3,
            .routing_bytes_per_copy = 22,
            .keeps_renormalisation = false,
            .weights_inside_experts = true,
            .clamped_glu_copies = 1,
            .runs_shared_experts = true};
  }
  // TransformerEngine v2.11 (megatron-core 0.16.1 takes TE >= 2.9, < 2.12) context_parallel.py:
  // 4023-4029 asserts `not sliding_window_attn or cp_comm_type in ["a2a", "all_gather"]`; a2a
  // passes the window to the kernel over the whole sequence (:3353-3357). Megatron hands
  // config.window_size to TE (extensions/transformer_engine.py:1262-1270).
  WindowSupport sliding_window(models::CpMethod m) const override {
    if (m == models::CpMethod::kUlysses) {
      return {true,
              "cp_comm_type a2a passes the window to the kernel over the whole sequence "
              "(TransformerEngine v2.11, context_parallel.py:3353-3357)"};
    }
    return {false,
            "TransformerEngine asserts a sliding window runs with cp_comm_type a2a or all_gather "
            "only (v2.11, context_parallel.py:4023-4029)"};
  }
  // gpt-oss's sinks: Megatron's softmax_type "learnable" (a softmax offset per head,
  // dot_product_attention.py:126 in megatron-core 0.16.1) goes to TE's fused attention, which
  // under CP asserts `softmax_type == "vanilla" or cp_comm_type == "a2a"` (TransformerEngine @
  // d0067d0 context_parallel.py:5062-5067). The offset's gradient is H floats per layer.
  FeatureSupport attention_sinks(models::CpMethod m) const override {
    if (m == models::CpMethod::kUlysses) {
      return {true,
              "cp_comm_type a2a runs TransformerEngine's learnable softmax offset "
              "(context_parallel.py:5062-5067 @ d0067d0)"};
    }
    return {false,
            "TransformerEngine runs a learnable softmax (the sinks) under CP with cp_comm_type "
            "a2a only (context_parallel.py:5062-5067 @ d0067d0)"};
  }
  // Llama 4's chunks: megatron-core 0.16.1's TransformerConfig has no chunk, and Megatron-LM
  // d98e8a6 sets `attention_chunk` to 0 in its flash-attention call (inference only,
  // transformer/attention.py:952): trained through Megatron, every layer attends causally over
  // the whole sequence, another model.
  FeatureSupport chunked_attention(models::CpMethod /*m*/) const override {
    return {false,
            "Megatron-Core trains with no attention chunks (megatron-core 0.16.1 has no chunk "
            "setting; attention_chunk is 0 in Megatron-LM d98e8a6 transformer/attention.py:952): "
            "every layer would attend to the whole sequence"};
  }
  // DeepSeek-V3's MLA: Megatron-LM d98e8a6 MLASelfAttention hands TE the expanded per-head K
  // (d wide) and V (d_v wide) (multi_latent_attention.py:207-218, 966-979). TransformerEngine
  // v2.11 (the releases megatron-core 0.16.1 takes) asserts MLA under CP runs with cp_comm_type
  // p2p or a2a+p2p only (context_parallel.py:4031-4035); p2p rotates K and V flattened into one
  // buffer at their own widths (:1302 onwards; at d0067d0 :1686-1690).
  FeatureSupport latent_attention(models::CpMethod m) const override {
    if (m == models::CpMethod::kRing || m == models::CpMethod::kUsp) {
      return {true,
              "cp_comm_type p2p and a2a+p2p run K and V at their own widths (TransformerEngine "
              "v2.11 context_parallel.py:4031-4035)"};
    }
    return {false,
            "TransformerEngine v2.11 asserts MLA under CP runs with cp_comm_type p2p or a2a+p2p "
            "only (context_parallel.py:4031-4035)"};
  }
  // TE runs a learnable softmax under CP on FusedAttention only (context_parallel.py:5062-5064
  // @ d0067d0): a model with sinks runs cuDNN's kernel whatever the recipe names. Megatron's sbhd
  // under CP is FusedAttention's too (:5043-5045), and MLA's unequal head widths
  // (utils.py:903-911).
  std::string attention_kernel(const ScheduleInputs& in) const override {
    return in.model.attention_sinks || in.model.is_mla() ? "cudnn" : in.recipe.attention_kernel;
  }
  std::int64_t ring_accumulator_bytes(const ScheduleInputs& in) const override {
    return in.recipe.activation_bytes;
  }
  LogitsLoss logits_loss() const override { return LogitsLoss::kMegatronVocabParallel; }
  // TE's a2a splits heads without replicating KV heads (context_parallel.py asserts it).
  std::optional<ConfigIssue> check(const ScheduleInputs& in,
                                   const HeadLayout& layout) const override {
    if (in.model.kv_heads % layout.ulysses != 0) {
      return ConfigIssue{
          Quantity::kModelHeads,
          fmt::format("Transformer Engine's a2a splits the {} KV heads of {} over the all-to-all "
                      "group of {} without replicating them: the group size must divide {}",
                      in.model.kv_heads, in.model.name, layout.ulysses, in.model.kv_heads)};
    }
    return std::nullopt;
  }
};

}  // namespace

const Implementation& megatron_core_cp() {
  static const MegatronCoreCp kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::impls
