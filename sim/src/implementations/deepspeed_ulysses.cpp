// DeepSpeed's UlyssesSPAttentionHF (Arctic Long Sequence Training, ALST): Ulysses around a
// Hugging Face transformers attention function (FlashAttention-2/3 or SDPA), as ArcticTraining,
// Accelerate (sp_backend: deepspeed) and the HF Trainer run it.
//
// Derivation (ledger: docs/implementations/deepspeed-ulysses.md, rows by id). Beyond the Ulysses
// scheme of attention_ulysses.cpp (head-sharded Q, K/V and the kernel's output and LSE saved, the
// kernel's backward workspace), per layer and rank, with s·H·d etc. element counts of one rank:
//   - HF's attention module keeps its q/k/v (after RoPE) as locals until the wrapper returns;
//   - forward all-to-alls go through _DimZeroAllToAll on a `.contiguous()` copy of a permuted
//     view (a copy for Q, K, V); after the all-to-all, `rearrange(...).contiguous()` copies to the
//     head-major [1, h, N, d] layout the kernel reads (h > 1): at most one transient beside input
//     and output at any time;
//   - the kernel's output is head-major (empty_like(q) keeps q's strides), so the wrapper copies
//     it to [N, 1, h·d] (context_layer) and keeps that local while the output all-to-all receives
//     into a fresh buffer and `rearrange` copies the result: two transients the size of the output;
//   - backward all-to-alls receive a non-contiguous gradient: `empty_like(grad).contiguous()`
//     plus `grad.contiguous()`: one transient beside input and output (dOut and dQ; dK/dV when a
//     rank holds more than one KV head, else their gradient is already contiguous).
// KV heads are replicated (repeat_interleave before the all-to-all) when the Ulysses degree
// exceeds them, as cpsim's head layout does. No dtype casts in bf16 training.
// Not modelled (limits()): the position_ids all-gather (int64, s·C elements), the replica's
// transient before the copy, HF's packed-sequence path (extra k/v copies), the time of the
// copies a row does not list (F10 with more than one KV head per rank, F21), the caching
// allocator's and NCCL's own buffers; FlashAttention-3's workspace is cpsim's fa3
// kernel model.
//
// Sources (REFERENCES.md [DeepSpeed], [FA-code], [ALST]): deepspeedai/DeepSpeed @
// edaa7221267243c7be7fb49c5d5f5c4fb97b4641, deepspeed/runtime/sequence_parallel/ulysses_sp.py
// (UlyssesSPAttentionHF, combine_sequence, _partition_global_sequence),
// deepspeed/sequence/layer.py (_DimZeroAllToAll); Dao-AILab/flash-attention
// csrc/flash_attn/flash_api.cpp (mha_fwd output strides, mha_bwd workspace).
#include <array>

#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim::impls {
namespace {

using models::CpMethod;

constexpr std::array kRows = {
    LedgerRow{"F0", LedgerSite::kHeldThroughBlock, LedgerWhen::kUlyssesAbove1, 2, 4, 0,
              hbm(0, 0, 0),
              "HF attention's q, k, v (bf16, the model's KV heads) held until the wrapper returns",
              /*model_kv_heads=*/true},
    LedgerRow{"F4-F6", LedgerSite::kQExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0, hbm(8, 0, 0),
              "q all-to-all input copy, then the head-major copy (one at a time, bf16)"},
    LedgerRow{"F8-F10", LedgerSite::kKvExchange, LedgerWhen::kUlyssesAbove1, 0, 2, 0, hbm(0, 8, 0),
              "all-to-all input copy of k, then of v (bf16; each freed before the next)"},
    LedgerRow{"F18", LedgerSite::kOutExchange, LedgerWhen::kHeadsPerRankAbove1, 2, 0, 0,
              hbm(4, 0, 0),
              "context_layer copy (bf16; none with one query head per rank: already contiguous)"},
    LedgerRow{"F20", LedgerSite::kOutExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0, hbm(0, 0, 0),
              "the output all-to-all's receive buffer (bf16)"},
    LedgerRow{"B1", LedgerSite::kDoutExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0, hbm(4, 0, 0),
              "dout: empty_like transient or grad.contiguous() copy (bf16)"},
    LedgerRow{"B9", LedgerSite::kDqExchange, LedgerWhen::kHeadsPerRankAbove1, 2, 0, 0, hbm(4, 0, 0),
              "dq: grad.contiguous() copy (bf16; none with one query head per rank)"},
    LedgerRow{"B8", LedgerSite::kDkvExchange, LedgerWhen::kKvHeadsPerRankAbove1, 0, 2, 0,
              hbm(0, 8, 0),
              "grad.contiguous() copy of dv, then of dk (bf16; each freed before the next), only "
              "with more than one KV head per rank"},
};

// Framework calls per attention block at each site (Op::host_calls), traced: the "op_counts" of
// the six shapes in data/traces/deepspeed-ulysses/ (transformers' flash_attention_2 path);
// tests/tracer/test_host_calls.py keeps them equal. Each all-to-all is _DimZeroAllToAll on a
// `.contiguous()` copy, then `rearrange(...).contiguous()`; a copy of a tensor already contiguous
// (one head per rank) launches nothing. The projections, RoPE and q/k norms (sites untracked,
// held_through_block) are cpsim's own ops elsewhere.
constexpr std::array kCalls = {
    SiteCalls{LedgerSite::kQExchange, CallsWhen::kAlways, 2},              // copy, all-to-all
    SiteCalls{LedgerSite::kQExchange, CallsWhen::kHeadsPerRankAbove1, 1},  // head-major copy (F6)
    SiteCalls{LedgerSite::kKvExchange, CallsWhen::kAlways, 4},             // the same for k, v
    SiteCalls{LedgerSite::kKvExchange, CallsWhen::kKvHeadsPerRankAbove1, 2},  // F10
    SiteCalls{LedgerSite::kKvExchange, CallsWhen::kKvReplicated, 2},  // repeat_interleave k, v
    // transformers 4.57.6's packed-sequence check of position_ids (_is_packed_sequence: arange,
    // min, add, sub, abs, sum, the bool copy, the host read) and the flash forward
    SiteCalls{LedgerSite::kCoreForward, CallsWhen::kAlways, 9},
    SiteCalls{LedgerSite::kOutExchange, CallsWhen::kAlways, 3},  // all-to-all, copies around it
    SiteCalls{LedgerSite::kOutExchange, CallsWhen::kHeadsPerRankAbove1, 2},  // context_layer (F18)
    SiteCalls{LedgerSite::kDoutExchange, CallsWhen::kAlways, 2},  // grad.contiguous(), all-to-all
    SiteCalls{LedgerSite::kCoreBackward, CallsWhen::kAlways, 1},  // the flash backward
    SiteCalls{LedgerSite::kDqExchange, CallsWhen::kAlways, 1},    // all-to-all
    SiteCalls{LedgerSite::kDqExchange, CallsWhen::kHeadsPerRankAbove1, 3},     // copies (B9)
    SiteCalls{LedgerSite::kDkvExchange, CallsWhen::kAlways, 2},                // dk, dv all-to-alls
    SiteCalls{LedgerSite::kDkvExchange, CallsWhen::kKvHeadsPerRankAbove1, 6},  // copies (B8)
    SiteCalls{LedgerSite::kDkvExchange, CallsWhen::kKvReplicated, 2},          // the replicas' sums
};

constexpr std::array<std::string_view, 3> kLimits = {
    "deepspeed-ulysses: the position_ids all-gather, the KV replica's transient and HF's "
    "packed-sequence copies are not modelled",
    "deepspeed-ulysses: the copies' time (ledger traffic) runs as one op before each "
    "all-to-all, on the compute stream; the key/value_layer copies made only when more than one "
    "KV head is left per rank (F10) and the output's final reshape copy (F21) are not timed, the "
    "query_layer copy (F6, made only with more than one query head per rank) always is",
    "deepspeed-ulysses: PyTorch's caching allocator and NCCL's own buffers are outside the ledger",
};

constexpr std::array kMethods = {CpMethod::kUlysses};
// Megatron-DeepSpeed (--emit deepspeed) runs DistributedAttention, not this wrapper.
constexpr std::array<std::string_view, 2> kLaunchers = {"arctic", "accelerate"};

// Its head checks (ulysses_sp.py: H % C, and Hk % C or C % Hk) are the method's own.
constexpr ImplementationTable kTable{
    "deepspeed-ulysses",
    "DeepSpeed UlyssesSPAttentionHF (ALST) over HF transformers attention",
    "deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641",
    kMethods,
    kLaunchers,
    "alst-deepspeed",
    kRows,
    kLimits,
    "DeepSpeed's ALST parallel state has sequence- and data-parallel groups only, no "
    "tensor-parallel group (deepspeed/runtime/sequence_parallel/parallel_state_sp.py:13-58)",
    false,
    "DeepSpeed's ALST parallel state has sequence- and data-parallel groups only, no pipeline "
    "group (deepspeed/runtime/sequence_parallel/parallel_state_sp.py:13-58)"};

class DeepspeedUlysses final : public Implementation {
 public:
  DeepspeedUlysses() : Implementation(kTable) {}
  std::span<const SiteCalls> traced_calls() const override { return kCalls; }
  // DeepSpeed 0.19.8 deepspeed/runtime/sequence_parallel/ulysses_sp.py:282-293: position_ids
  // gathered after the all-to-all, "FA2 uses them for packed-sequence detection
  // (flash_varlen_fn)"; "For packed sequences: position_ids must reset at document boundaries".
  DocumentMasking document_masking(models::CpMethod /*m*/) const override {
    return {DocumentMasking::Kind::kMasked,
            {Balancer::kHeads},
            "position_ids restart at each document and flash_attention_2 runs varlen over them "
            "(DeepSpeed 0.19.8, ulysses_sp.py:282-293)"};
  }
  // UlyssesSPAttentionHF (DeepSpeed 0.19.8 ulysses_sp.py) replaces the attention only; the Hugging
  // Face model's own MoE block (transformers 4.57.6 MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock:
  // a loop over the experts on each rank's tokens) runs every expert on every rank: no expert
  // parallelism.
  ExpertSupport experts(models::CpMethod /*m*/) const override { return kHuggingFaceExperts; }
  // DeepSpeed 0.19.8 ulysses_sp.py:522-556, 356-357: the wrapper hands the Hugging Face module's
  // `sliding_window` kwarg on to the core attention, which with flash_attention_2 sees the whole
  // sequence after the all-to-all (transformers 4.57.6 modeling_flash_attention_utils.py:506-512:
  // window_size (w − 1, w − 1)). With sdpa the wrapper drops the mask (:545-546) and the window
  // is lost; check_attention_window refuses SDPA.
  // gpt-oss's sinks reach a flash kernel only when its signature takes `s_aux` (transformers
  // 4.57.6 modeling_flash_attention_utils.py:119-124, 523-524): flash-attn 2's and 3's do not,
  // so flash_attention_2 drops them silently; gpt-oss has no SDPA path (_supports_sdpa = False,
  // modeling_gpt_oss.py:399) and DeepSpeed refuses eager (ulysses_sp.py:468-471). The kernels-hub
  // FA3 that takes sinks is not modelled.
  FeatureSupport latent_attention(models::CpMethod /*m*/) const override {
    return {false,
            "UlyssesSPAttentionHF takes one head width from config.head_dim (DeepseekV3Config "
            "sets it to qk_rope_head_dim) and asserts key.shape == value.shape (deepspeed 0.19.8 "
            "runtime/sequence_parallel/ulysses_sp.py:299-304, 503-512)"};
  }
  FeatureSupport attention_sinks(models::CpMethod /*m*/) const override {
    return {false,
            "its flash kernels take no sinks, and transformers drops them without a word "
            "(4.57.6 modeling_flash_attention_utils.py:523-524); the kernels-hub FA3 that takes "
            "them is not modelled"};
  }
  // Llama 4 has no flash-attention path in transformers 4.57.6 (_supports_flash_attn = False,
  // modeling_llama4.py:432): its chunks reach SDPA as a mask tensor, which is not modelled.
  FeatureSupport chunked_attention(models::CpMethod /*m*/) const override {
    return {false,
            "transformers' Llama 4 has no flash-attention path (4.57.6 modeling_llama4.py:432); "
            "SDPA takes its chunks as a mask tensor, which is not modelled"};
  }
  WindowSupport sliding_window(models::CpMethod /*m*/) const override {
    return {true,
            "the Hugging Face sliding_window kwarg reaches flash_attention_2 over the whole "
            "sequence (DeepSpeed 0.19.8, ulysses_sp.py:522-556)"};
  }
};

}  // namespace

const Implementation& deepspeed_ulysses() {
  static const DeepspeedUlysses kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::impls
