// The UPipe custom op of the Untied Ulysses authors' TorchTitan fork (`--model.attn_impl
// upipe_fa2` / `upipe_fa3`, with the `_offload` and `_tiled_mlp` suffixes, which do not change the
// op).
//
// Derivation (ledger: docs/implementations/untied-ulysses-upipe.md, rows by id). cpsim's UPipe
// scheme (attention_upipe.cpp) follows the op: Q/K/V projected inside it stage by stage, one K/V
// fetch serving H/Hkv stages, a preallocated final_out filled stage by stage and saved with the
// input and one LSE per stage, and a backward that recomputes projections and all-to-alls per
// stage. Beyond that scheme, per stage (one stage's heads: s·U·d elements of Q, s·F·d of K or V),
// the code allocates:
//   - all-to-all send buffers: each all_to_all_4D copies its input with .contiguous() (Q; K and V
//     one after the other); the output and dQ/dK/dV all-to-alls also receive into an empty_like
//     buffer before their final contiguous copy (two transients);
//   - the ring forward at ring degree 1 still builds a RingComm (an unused receive buffer the size
//     of Q) and merges through the kernel's bf16 block_out and an fp32 copy of it before the bf16
//     attn_out;
//   - the ring backward copies half the stage's LSE (lse_second) even at ring degree 1.
// dK/dV accumulate in bf16 across the stages of a fetch and dX in bf16, as the scheme has it.
// The stage size is fixed by the code: U = the Ulysses degree (pipe_degree = H / u).
// Not modelled (limits()): the ring hybrid (ring degree > 1) passes Q around the ring, not K/V as
// cpsim's ring scheme does; RoPE's fp32 cos/sin copies (4·s·d bytes per call) and the weight-
// gradient slices (u·d × hidden); the forward before e465aa8 (2026-05-23, "Delete mem buffers
// proactively during UPipe forward pass"), which held up to five more stage buffers.
//
// Sources (REFERENCES.md [UPipe-code], [UPipe], [FA-code]): togethercomputer/Untied-Ulysses @
// e465aa8e8fec72f448c0d3767a8bc569682586e1, untied_ulysses/fully_fused_attn.py (UpipeAttnGQAFunc
// and its custom ops), untied_ulysses/all_to_all.py, untied_ulysses/flash_attn_utils.py,
// torchtitan/torchtitan/models/llama3/model.py (attn_impl parsing, the GQA reindex).
#include <array>

#include <fmt/format.h>

#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim::impls {
namespace {

using models::CpMethod;

constexpr std::array kRows = {
    LedgerRow{"F5", LedgerSite::kQExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0, hbm(4, 0, 0),
              "Q all-to-all send buffer (contiguous copy, bf16)"},
    LedgerRow{"F7", LedgerSite::kKvExchange, LedgerWhen::kUlyssesAbove1, 0, 2, 0, hbm(0, 8, 0),
              "K or V all-to-all send buffer (one at a time, bf16)"},
    LedgerRow{"F9+F10+F12", LedgerSite::kCoreForward, LedgerWhen::kAlways, 8, 0, 0, hbm(6, 0, 0),
              "unused ring receive buffer and block_out (bf16), block_out's fp32 copy"},
    LedgerRow{"F14+F15", LedgerSite::kOutExchange, LedgerWhen::kUlyssesAbove1, 4, 0, 0,
              hbm(4, 0, 0), "output all-to-all send and receive buffers (bf16)"},
    LedgerRow{"B6", LedgerSite::kCoreBackward, LedgerWhen::kAlways, 0, 0, 2, hbm(0, 0, 4),
              "lse_second: contiguous half of the stage's LSE (fp32)"},
    LedgerRow{"B12", LedgerSite::kDqExchange, LedgerWhen::kUlyssesAbove1, 4, 0, 0, hbm(4, 0, 0),
              "dQ all-to-all send and receive buffers (bf16)"},
    LedgerRow{"B16", LedgerSite::kDkvExchange, LedgerWhen::kUlyssesAbove1, 0, 4, 0, hbm(0, 8, 0),
              "dK or dV all-to-all send and receive buffers (one at a time, bf16)"},
};

constexpr std::array<std::string_view, 4> kLimits = {
    "untied-ulysses-upipe: with a ring degree above 1 the fork passes Q around the ring; cpsim's "
    "ring passes K/V",
    "untied-ulysses-upipe: RoPE's fp32 cos/sin copies and the weight-gradient slices are not "
    "modelled; the copies' time (ledger traffic) runs as one op before each all-to-all, on the "
    "compute stream",
    "untied-ulysses-upipe: models the op after e465aa8 (2026-05-23); the earlier forward held up "
    "to five more stage buffers",
    "untied-ulysses-upipe: above 4M tokens the fork's scripts set INP_PIN_MEMORY=False, so the "
    "checkpoint offloads (save_on_cpu) go to pageable host memory; cpsim still times them at the "
    "profile's pinned copy bandwidth and counts them as pinned (no pageable figure with a source)",
};

constexpr std::array kMethods = {CpMethod::kUPipe};
constexpr std::array<std::string_view, 1> kLaunchers = {"untied-ulysses"};

constexpr ImplementationTable kTable{
    "untied-ulysses-upipe",
    "UPipe custom op (UpipeAttnGQAFunc) of the Untied Ulysses TorchTitan fork",
    "togethercomputer/Untied-Ulysses@e465aa8e8fec72f448c0d3767a8bc569682586e1",
    kMethods,
    kLaunchers,
    "alst",
    kRows,
    kLimits,
    "tensor parallelism around the UPipe op of the Untied Ulysses fork (which projects Q/K/V "
    "inside the op, stage by stage) is not modelled by cpsim",
    false,
    "pipeline parallelism around the UPipe op of the Untied Ulysses fork is not modelled by cpsim"};

class UntiedUlyssesUpipe final : public Implementation {
 public:
  UntiedUlyssesUpipe() : Implementation(kTable) {}
  // pipe_degree = n_heads // ulysses_degree stages of u heads each (fully_fused_attn.py).
  std::optional<ConfigIssue> check(const ScheduleInputs& /*in*/,
                                   const HeadLayout& layout) const override {
    if (layout.heads_per_stage != layout.ulysses) {
      return ConfigIssue{
          Quantity::kHeadsPerStage,
          fmt::format("the UPipe custom op fixes the heads per stage U to the Ulysses degree {}; "
                      "U = {} cannot run there",
                      layout.ulysses, layout.heads_per_stage)};
    }
    return std::nullopt;
  }
  // RoPE inside the op: flash-attn's Triton rotary kernel in place on q and on k
  // (untied_ulysses/rotary.py apply_rotary_emb_flash, called by fully_fused_attn.py:110-122 and
  // its backward at :311 and :338), whatever the model's own RoPE.
  models::RopeKernel rope_kernel(const ScheduleInputs& /*in*/) const override {
    return models::RopeKernel::kFused;
  }
  // fully_fused_attn.py:608: UpipeAttention.forward takes window_size and does not hand it to
  // UpipeAttnGQAFunc.apply (:643-658), whose kernels run with (-1, -1) (flash_attn_utils.py:367).
  WindowSupport sliding_window(models::CpMethod /*m*/) const override {
    return {false,
            "UpipeAttention.forward takes window_size and drops it: full causal attention "
            "(Untied-Ulysses e465aa8, fully_fused_attn.py:608, 643-658)"};
  }
};

}  // namespace

const Implementation& untied_ulysses_upipe() {
  static const UntiedUlyssesUpipe kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::impls
