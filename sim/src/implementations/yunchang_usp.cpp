// yunchang's LongContextAttention (USP: Ulysses all-to-all × zigzag ring flash attention), as the
// UPipe authors' TorchTitan fork runs its usp_* and ring baselines, and yunchang users run it.
//
// Derivation (ledger: docs/implementations/yunchang-usp.md, rows by id). The method's scheme
// (attention_ulysses.cpp, attention_core.cpp) already holds what any Ulysses × ring code must:
// the head-sharded Q, K/V after the all-to-all (saved), the kernel's output and fp32 LSE (saved),
// the output all-to-all's result, and in backward the kernel's dQ/dK/dV outputs and its workspace
// (dq_accum, softmax_d, GQA dk/dv_expanded). This implementation adds, per layer and rank, with
// s·H·d etc. element counts of one rank (LedgerRow):
//   - the module's q/k/v locals stay alive until attention returns (TorchTitan's Attention.forward
//     holds xq, xk, xv across the call);
//   - all_to_all_4D copies its input with .contiguous() before all_to_all_single (Q, K, V; u > 1);
//     the reverse direction (output, dQ, dK/dV) copies for every u and receives into an
//     empty_like buffer before the final transpose copy: two transients the size of the tensor;
//   - ring degree 1 still goes through zigzag_ring_flash_attn: the kernel's bf16 block output and
//     an fp32 copy (block_out.to(float32)) live next to the final bf16 cast;
//   - backward at ring degree 1: a contiguous copy of half the LSE (softmax_lse1), the kernel
//     writes into bf16 dq/dk/dv buffers, which are copied to fp32, dK/dV are sent to the rank
//     itself (fp32 receive buffers), and the return casts them back to bf16 — all while the saved
//     tensors are still held (an op of its own: grad_finish).
// Not modelled (limits() prints them): the ring part at ring degree > 1 runs cpsim's ring scheme
// (fp32 accumulators), without yunchang's merge temporaries (_update_out_and_lse: two fp32
// tensors of the block at once) and its bf16 gradient buffers; the caching allocator's and
// NCCL's own buffers. Time (ledger traffic): each .contiguous() copy reads and writes its bytes
// (2 + 2 per bf16 element), each .to(float32) reads 2 and writes 4, a receive buffer filled by
// the all-to-all costs nothing more; next_dk/next_dv (B13) are written by the send_recv to the
// rank itself, a copy of the fp32 dk, dv (8 + 8).
//
// Sources (REFERENCES.md [yunchang], [FA-code], [USP]):
//   github.com/feifeibear/long-context-attention @ 56118e0d8fe377d43441226dd8bdd07135c92c22
//   (2026-05-21): yunchang/comm/all_to_all.py (all_to_all_4D), yunchang/hybrid/attn_layer.py,
//   yunchang/ring/zigzag_ring_flash_attn.py, yunchang/ring/utils.py;
//   github.com/Dao-AILab/flash-attention csrc/flash_attn/flash_api.cpp (mha_fwd, mha_bwd).
//   Jiarui Fang, Shangchun Zhao, "USP: A Unified Sequence Parallelism Approach for Long Context
//   Generative AI", arXiv:2405.07719.
#include <array>

#include <fmt/format.h>

#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim::impls {
namespace {

using models::CpMethod;

constexpr std::array kRows = {
    LedgerRow{"F0", LedgerSite::kHeldThroughBlock, LedgerWhen::kAlways, 2, 4, 0, hbm(0, 0, 0),
              "caller's q, k, v (bf16) held until attention returns"},
    LedgerRow{"F1", LedgerSite::kQExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0, hbm(4, 0, 0),
              "all_to_all_4D input copy of q (bf16)"},
    LedgerRow{"F3+F5", LedgerSite::kKvExchange, LedgerWhen::kUlyssesAbove1, 0, 2, 0, hbm(0, 8, 0),
              "all_to_all_4D input copy of k, then of v (bf16; each freed before the next)"},
    LedgerRow{"F9+F14", LedgerSite::kCoreForward, LedgerWhen::kAlways, 6, 0, 0, hbm(6, 0, 0),
              "kernel block_out (bf16) and its fp32 copy out, beside the final bf16 cast"},
    LedgerRow{"F27+F28", LedgerSite::kOutExchange, LedgerWhen::kAlways, 4, 0, 0, hbm(4, 0, 0),
              "output all_to_all_4D input copy and receive buffer (bf16)"},
    LedgerRow{"B1", LedgerSite::kDoutExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0, hbm(4, 0, 0),
              "all_to_all_4D input copy of dout (bf16)"},
    LedgerRow{"B3", LedgerSite::kCoreBackward, LedgerWhen::kAlways, 0, 0, 2, hbm(0, 0, 4),
              "softmax_lse1: contiguous half of the LSE (fp32)"},
    LedgerRow{"B3 (held)", LedgerSite::kGradFinish, LedgerWhen::kAlways, 0, 0, 2, hbm(0, 0, 0),
              "softmax_lse1, still held (fp32)"},
    LedgerRow{"B11", LedgerSite::kGradFinish, LedgerWhen::kAlways, 4, 0, 0, hbm(6, 0, 0),
              "dq = dq_buffer.to(float32)"},
    LedgerRow{"B12", LedgerSite::kGradFinish, LedgerWhen::kAlways, 0, 8, 0, hbm(0, 12, 0),
              "dk, dv = dk_buffer, dv_buffer .to(float32)"},
    LedgerRow{"B13", LedgerSite::kGradFinish, LedgerWhen::kAlways, 0, 8, 0, hbm(0, 16, 0),
              "next_dk, next_dv: fp32 receive buffers of the dK/dV send_recv"},
    LedgerRow{"B15+B16 (dq)", LedgerSite::kDqExchange, LedgerWhen::kAlways, 4, 0, 0, hbm(4, 0, 0),
              "dq all_to_all_4D input copy and receive buffer (bf16)"},
    LedgerRow{"B15 (dk, dv)", LedgerSite::kDkvExchange, LedgerWhen::kKvHeadsPerRankAbove1AnyDegree,
              0, 2, 0, hbm(0, 8, 0),
              "all_to_all_4D input copy of dv, then of dk (bf16; none with one KV head per rank)"},
    LedgerRow{"B16 (dk, dv)", LedgerSite::kDkvExchange, LedgerWhen::kAlways, 0, 2, 0, hbm(0, 0, 0),
              "all_to_all_4D receive buffer of dv, then of dk (bf16; each freed before the next)"},
};

// Framework calls per attention block at each site (Op::host_calls), traced: the "op_counts" of
// data/traces/yunchang-usp/ s64-h8-kv4-u4, s128-h16-kv8-d32-u4, s128-h4-kv2-u2 (Ulysses, ring
// degree 1) and, for the exchanges, s128-h8-kv4-u2-r2; tests/tracer/test_host_calls.py keeps them
// equal. An all_to_all_4D is its input's .contiguous() (u > 1), all_to_all_single and the
// transposing copy after it, less the copies of tensors already contiguous.
constexpr std::array kCalls = {
    SiteCalls{LedgerSite::kQExchange, CallsWhen::kAlways, 2},     // input copy, all-to-all
    SiteCalls{LedgerSite::kKvExchange, CallsWhen::kAlways, 4},    // the same for k, then v
    SiteCalls{LedgerSite::kCoreForward, CallsWhen::kAlways, 3},   // flash forward, fp32 out, cast
    SiteCalls{LedgerSite::kOutExchange, CallsWhen::kAlways, 3},   // copy, all-to-all, copy
    SiteCalls{LedgerSite::kDoutExchange, CallsWhen::kAlways, 2},  // input copy, all-to-all
    SiteCalls{LedgerSite::kCoreBackward, CallsWhen::kAlways, 2},  // softmax_lse1, flash backward
    // fp32 copies of dq/dk/dv, the dK/dV send_recv to itself, the casts back to bf16
    SiteCalls{LedgerSite::kGradFinish, CallsWhen::kAlways, 10},
    SiteCalls{LedgerSite::kDqExchange, CallsWhen::kAlways, 3},   // copy, all-to-all, copy
    SiteCalls{LedgerSite::kDkvExchange, CallsWhen::kAlways, 4},  // all-to-all, copy: dv, then dk
    // their input copies (B15): none with one KV head per rank, already contiguous
    SiteCalls{LedgerSite::kDkvExchange, CallsWhen::kKvHeadsPerRankAbove1, 2},
};

constexpr std::array<std::string_view, 4> kLimits = {
    "yunchang-usp: at ring degree > 1 the ring runs cpsim's ring scheme (fp32 accumulators), "
    "without yunchang's merge temporaries and bf16 gradient buffers (ledger F16-F23, B4-B6)",
    "yunchang-usp: the copies' time (ledger traffic) runs as one op before each all-to-all, on "
    "the compute stream, the post-receive copies included; the final casts of the output back to "
    "bf16 (after F14) are not timed; the dK/dV send_recv to itself is timed as a copy",
    "yunchang-usp: PyTorch's caching allocator and NCCL's own buffers are outside the ledger",
    "yunchang-usp: above 4M tokens the UPipe authors' scripts offload checkpoints to pageable "
    "host memory (INP_PIN_MEMORY=False); cpsim times them at the pinned copy bandwidth (no "
    "pageable figure with a source; see docs/implementations/untied-ulysses-upipe.md)",
};

constexpr std::array kMethods = {CpMethod::kUsp, CpMethod::kUlysses, CpMethod::kRing};
constexpr std::array<std::string_view, 1> kLaunchers = {"untied-ulysses"};

// The UPipe authors' TorchTitan fork (recipe alst) runs Ulysses and USP through yunchang, and
// ring through it with FlashAttention kernels.
constexpr ImplementationTable kTable{
    "yunchang-usp",
    "yunchang LongContextAttention: Ulysses all-to-all x zigzag ring flash attention",
    "feifeibear/long-context-attention@56118e0d8fe377d43441226dd8bdd07135c92c22",
    kMethods,
    kLaunchers,
    "alst",
    kRows,
    kLimits,
    "tensor parallelism around yunchang's LongContextAttention in the Untied Ulysses fork is not "
    "modelled by cpsim",
    false,
    "pipeline parallelism around yunchang's LongContextAttention in the Untied Ulysses fork is not "
    "modelled by cpsim"};

class YunchangUsp final : public Implementation {
 public:
  YunchangUsp() : Implementation(kTable) {}
  std::span<const SiteCalls> traced_calls() const override { return kCalls; }
  // yunchang 0.6.4 yunchang/hybrid/attn_layer.py:57-69: LongContextAttention.forward takes
  // query, key, value and `causal`, no cu_seqlens.
  DocumentMasking document_masking(models::CpMethod /*m*/) const override {
    return {DocumentMasking::Kind::kAcrossDocuments,
            {},
            "LongContextAttention.forward takes no cu_seqlens: causal over the packed sequence "
            "(yunchang 0.6.4, hybrid/attn_layer.py:57-69)"};
  }
  // LongContextAttention (yunchang 0.6.4 hybrid/attn_layer.py) replaces the attention only; the
  // Hugging Face model's own MoE block (transformers 4.57.6 MixtralSparseMoeBlock,
  // Qwen3MoeSparseMoeBlock: a loop over the experts on each rank's tokens) runs every expert on
  // every rank: no expert parallelism.
  ExpertSupport experts(models::CpMethod /*m*/) const override { return kHuggingFaceExperts; }
  // yunchang 0.6.4 hybrid/attn_layer.py:65, 128-143 and kernels/attention.py:184, 197-198 pass
  // `window_size` to flash-attn: right with ring degree 1 (one step over the whole sequence).
  // The basic and zigzag rings pass the same window at every step with no offset for the block's
  // position (ring/ring_flash_attn.py:36-48, ring/zigzag_ring_flash_attn.py:29-43): a wrong
  // mask, silently. Its FA3 path drops the window (kernels/attention.py:283-284).
  // yunchang 0.6.4's attention calls flash-attn's functions, none of which takes sinks.
  FeatureSupport latent_attention(models::CpMethod /*m*/) const override {
    return {false,
            "its flash-attn 2 kernels take V as wide as Q and K (flash-attn v2.8.3 "
            "csrc/flash_attn/flash_api.cpp:418): MLA's V would be padded to d by the caller, "
            "which is not modelled"};
  }
  FeatureSupport attention_sinks(models::CpMethod /*m*/) const override {
    return {false, "its flash-attn calls take no sinks (yunchang 0.6.4, kernels/attention.py)"};
  }
  FeatureSupport chunked_attention(models::CpMethod /*m*/) const override {
    return {false, "its flash-attn calls take no chunks (yunchang 0.6.4, kernels/attention.py)"};
  }
  WindowSupport sliding_window(models::CpMethod m) const override {
    if (m == models::CpMethod::kUlysses) {
      return {true,
              "LongContextAttention passes window_size to flash-attn over the whole sequence "
              "(yunchang 0.6.4, hybrid/attn_layer.py:128-143)"};
    }
    return {false,
            "its rings pass the same window_size at every step, without the block's offset: "
            "a wrong mask (yunchang 0.6.4, ring/ring_flash_attn.py:36-48, "
            "ring/zigzag_ring_flash_attn.py:29-43)"};
  }
  // all_to_all_4D splits heads with reshape(bs, s, P, hc // P, hs): no KV-head replication.
  std::optional<ConfigIssue> check(const ScheduleInputs& in,
                                   const HeadLayout& layout) const override {
    if (in.model.kv_heads % layout.ulysses != 0) {
      return ConfigIssue{
          Quantity::kModelHeads,
          fmt::format("yunchang's all_to_all_4D splits the {} KV heads of {} into Ulysses degree "
                      "{} parts and does not replicate them: the Ulysses degree must divide {}",
                      in.model.kv_heads, in.model.name, layout.ulysses, in.model.kv_heads)};
    }
    return std::nullopt;
  }
};

}  // namespace

const Implementation& yunchang_usp() {
  static const YunchangUsp kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::impls
