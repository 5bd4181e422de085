// DeepSpeed's FPDT (Fully Pipelined Distributed Transformer, "Ulysses-Offload"),
// deepspeed/sequence/fpdt_layer.py, as Megatron-DeepSpeed runs it with
// `--ds-sequence-parallel-fpdt` (chunks of `--ds-sequence-parallel-fpdt-chunk-size` global
// tokens, offloaded with `--ds-sequence-parallel-fpdt-offloading`).
//
// Derivation (ledger: docs/implementations/deepspeed-fpdt.md, rows by id). cpsim's FPDT scheme
// (attention_fpdt.cpp) holds, per chunk, the projections, the all-to-all results, the fp32
// online-softmax accumulator, the double-buffered K/V prefetch from pinned memory and, in
// backward, the prefetched Q/output/LSE/dOut/dQ bundles, the fp32 dK/dV accumulator and dQ, and
// the kernel's workspace. Beyond that, per chunk (element counts of one chunk: s·H·d etc. with s
// the rank's tokens of one chunk):
//   - every single_all_to_all copies its input (input_t), receives into an empty_like buffer and
//     copies the result again: two transients of the tensor's size (Q; K and V one at a time; the
//     output; dOut; dQ; dK and dV);
//   - the online-softmax update (_update_out_and_lse) upcasts the block output to fp32 and builds
//     the new output from two exp-scaled fp32 products and their sum;
//   - backward: each block allocates new zeroed bf16 dq/dk/dv (torch.zeros) while the previous
//     block's are still referenced, and the kernel writes dq into a bf16 buffer before it is added
//     into the fp32 dQ.
// Not modelled (limits()): the RoPE reference path's transients after the all-to-all (about four
// times the operand), chunk 0's Q/K/V/output/LSE prefetched at the end of the forward and kept to
// the backward, the torch.cat of the output chunks at the end of the forward (the whole local
// output twice), the fp32 weight-gradient accumulators, the non-offloading path's n-chunk fp32
// gradient lists, and FPDT_FFN / FPDT_LogitsLoss.
//
// Sources (REFERENCES.md [DS-FPDT], [Megatron-DeepSpeed], [FPDT]): deepspeedai/DeepSpeed @
// edaa7221267243c7be7fb49c5d5f5c4fb97b4641 (fpdt_layer.py last changed at
// 310eb8cb485ca30cc951f7735f5e342126ea5b55), deepspeed/sequence/fpdt_layer.py,
// deepspeed/sequence/layer.py (single_all_to_all); deepspeedai/Megatron-DeepSpeed @
// 4efb479d5317ce9b86096b9d8e3e8030b0b5263b, megatron/model/transformer.py.
#include <array>

#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim::impls {
namespace {

using models::CpMethod;

constexpr std::array kRows = {
    LedgerRow{"f4", LedgerSite::kQExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0, hbm(4, 0, 0),
              "q all-to-all: input_t copy (bf16; at batch 1 the receive buffer is the result)"},
    LedgerRow{"f5", LedgerSite::kKvExchange, LedgerWhen::kUlyssesAbove1, 0, 2, 0, hbm(0, 8, 0),
              "k or v all-to-all: input_t copy (one at a time, bf16)"},
    LedgerRow{"f10", LedgerSite::kCoreForward, LedgerWhen::kAlways, 12, 0, 4, hbm(22, 0, 0),
              "_update_out_and_lse: fp32 block output, two exp-scaled fp32 products, LSE-sized "
              "fp32 terms (the new accumulator they sum into is the scheme's)"},
    LedgerRow{"f13", LedgerSite::kOutExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0, hbm(4, 0, 0),
              "output all-to-all: receive buffer (bf16; at batch 1 the input is a view)"},
    LedgerRow{"b5", LedgerSite::kDoutExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0, hbm(4, 0, 0),
              "dout all-to-all: input_t copy (bf16; at batch 1 the receive buffer is the result)"},
    LedgerRow{"b8", LedgerSite::kCoreBackward, LedgerWhen::kAlways, 4, 4, 0, hbm(2, 4, 0),
              "new zeroed dq, dk, dv of the block beside the previous block's (bf16)"},
    LedgerRow{"b13 (dq)", LedgerSite::kDqExchange, LedgerWhen::kUlyssesAbove1, 2, 0, 0,
              hbm(4, 0, 0), "dq all-to-all: receive buffer (bf16; at batch 1 the input is a view)"},
    LedgerRow{"b13 (dk, dv)", LedgerSite::kDkvExchange, LedgerWhen::kUlyssesAbove1, 0, 2, 0,
              hbm(0, 8, 0), "dk or dv all-to-all: receive buffer (one at a time, bf16)"},
};

constexpr std::array<std::string_view, 4> kLimits = {
    "deepspeed-fpdt: RoPE's transients after the all-to-all, chunk 0's prefetch kept from the "
    "forward to the backward and the final torch.cat of the output chunks are not modelled",
    "deepspeed-fpdt: the fp32 weight-gradient accumulators, FPDT_FFN and FPDT_LogitsLoss are not "
    "modelled; without offloading the code keeps n-chunk fp32 gradient lists cpsim does not",
    "deepspeed-fpdt: the copies' time (ledger traffic) runs as one op before each all-to-all, "
    "on the compute stream; the merge's traffic (f10) is the code's four fp32 kernels less the "
    "scheme's generic merge, without the LSE-sized terms",
    "deepspeed-fpdt: synchronisation: the scheme's forward waits for each chunk's Q/K/V offloads "
    "after its first block and for the output offloads before the projection; the host "
    "round trips of torch.cuda.synchronize and dist.barrier (per block and chunk) cost nothing "
    "beyond the launches, and the backward's dQ write-back and prefetches run on two copy "
    "streams sharing the link where the code has one stream",
};

constexpr std::array kMethods = {CpMethod::kFpdt};
constexpr std::array<std::string_view, 1> kLaunchers = {"deepspeed"};

constexpr ImplementationTable kTable{
    "deepspeed-fpdt",
    "DeepSpeed FPDT (fpdt_layer.py) under Megatron-DeepSpeed",
    "deepspeedai/DeepSpeed@edaa7221267243c7be7fb49c5d5f5c4fb97b4641",
    kMethods,
    kLaunchers,
    "deepspeed-fpdt",
    kRows,
    kLimits,
    "Megatron-DeepSpeed's tensor parallelism around deepspeed/sequence/fpdt_layer.py (its chunked "
    "attention, FFN and loss under TP) is not modelled by cpsim",
    false,
    "pipeline parallelism around Megatron-DeepSpeed's FPDT layer "
    "(deepspeed/sequence/fpdt_layer.py) is "
    "not modelled by cpsim"};

// _FPDTGPUOffloadingAttentionImpl_ synchronises the host after every block (fpdt_layer.py:731-732,
// 940-941) and at its barriers; attention_fpdt.cpp counts its calls.
class DeepSpeedFpdt final : public Implementation {
 public:
  using Implementation::Implementation;
  bool synchronised_fpdt_loop() const override { return true; }
  // _update_out_and_lse returns new `out` and `lse` tensors (fpdt_layer.py:51, :53, DeepSpeed
  // 0.19.8) that the caller rebinds; the trace holds old and new during each update.
  bool rebinds_merge_accumulator() const override { return true; }
  // DeepSpeed 0.19.8 deepspeed/sequence/fpdt_layer.py:174 (`assert attention_mask is None`) and
  // :238 (`causal_chunk = i == k_i`): every chunk pair is causal over the whole sequence.
  DocumentMasking document_masking(models::CpMethod /*m*/) const override {
    return {DocumentMasking::Kind::kAcrossDocuments,
            {},
            "fpdt_layer.py asserts attention_mask is None and runs causal chunk pairs (DeepSpeed "
            "0.19.8, fpdt_layer.py:174, :238)"};
  }
  // fpdt_layer.py:195, 625: ctx.window_size = (-1, -1) for every chunk's flash-attn call.
  WindowSupport sliding_window(models::CpMethod /*m*/) const override {
    return {false,
            "its chunks run flash-attn with window_size (-1, -1): full causal attention "
            "(DeepSpeed 0.19.8, fpdt_layer.py:195, 625)"};
  }
};

}  // namespace

const Implementation& deepspeed_fpdt() {
  static const DeepSpeedFpdt kImplementation(kTable);
  return kImplementation;
}

}  // namespace cpsim::sim::impls
