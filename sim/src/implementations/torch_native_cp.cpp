// PyTorch's native context parallelism (torch.distributed.tensor.experimental.context_parallel)
// as TorchTitan v0.2.0/v0.2.1 runs it with the ring rotation ("alltoall": K/V blocks passed peer
// to peer), over SDPA (cuDNN, else flash), and the UPipe authors' fork runs it as
// `torch_ring_alltoall`.
//
// Derivation (ledger: docs/implementations/torch-native-cp.md, rows by id). TorchTitan's attention
// calls repeat_kv before SDPA: K and V are materialised at the query heads, so the ring passes,
// saves and differentiates blocks of H heads (shape(): the KV heads of the layout become H). On top
// of cpsim's ring scheme (attention_core.cpp: an fp32 output/LSE accumulator, the current and the
// next K/V block, the block's output in the step; backward: an fp32 dQ accumulator, an fp32 dK/dV
// accumulator with the one in flight, one block's bf16 dQ/dK/dV and the kernel's workspace), the
// code holds per step, in element counts of one rank (s·H·d, s·Hkv·d with Hkv = H after the
// repeat):
//   forward  the send buffer cat(k, v) beside the two received blocks (three pairs live); the
//            merger (_SDPAMerger) upcasts the block output to fp32 and computes the new output
//            through two fp32 temporaries of the output's size; the previous step's LSE;
//   backward a third K/V pair; the previous step's bf16 dQ/dK/dV still held while the next kernel
//            runs; the dK/dV rotation in fp32 with a cat() send buffer and partial-update cats
//            beside the two accumulators cpsim has; the contiguous half of the LSE.
// Not modelled (limits()): the all-gather rotation (TorchTitan's default rotate method), whose
// gathered K/V, per-step merge and fp32 dK/dV all-to-all differ from cpsim's all-gather scheme;
// TorchTitan v0.2.2 (no repeat_kv, enable_gqa); the cuDNN kernel's workspace, which its run-time
// heuristics choose. Time (ledger traffic, per ring step): the cat() send buffer (A:419 region,
// `next_kv = torch.cat(...)` every step but the last: k and v read, the buffer written); the
// merger (`step`: out.to(float32), 2 + 4 bytes; `_merge_one`: out − block_out, sigmoid·(...),
// out − (...): 12 + 8 + 12 bytes per element; the LSE update: 56 bytes per s·H) less the
// scheme's merge (3 × 4 bytes); the dK/dV send cat in fp32 (8 + 8 bytes per s·Hkv·d); the LSE
// half's .contiguous().
//
// Sources (REFERENCES.md [TorchTitan], [torch-cp]): pytorch/pytorch
// torch/distributed/tensor/experimental/_context_parallel/_attention.py @
// 09b101c59aae511b84dfe4bac39b50cc50f7accf (_templated_ring_attention and its backward,
// _SDPAMerger, the rotaters); pytorch/torchtitan v0.2.0 (29624e37fa6dd319fd671b009338651b5c665da2),
// torchtitan/models/llama3/model/model.py (repeat_kv before SDPA),
// torchtitan/models/attention.py (SDPA backend priority: cuDNN, flash, efficient).
#include <array>

#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim::impls {
namespace {

using models::CpMethod;

constexpr std::array kRows = {
    LedgerRow{"F4+F7", LedgerSite::kRingForwardStep, LedgerWhen::kAlways, 0, 4, 0, hbm(0, 8, 0),
              "send buffer cat(k, v) beside the two received blocks (bf16)"},
    LedgerRow{"F11+F13", LedgerSite::kRingForwardStep, LedgerWhen::kAlways, 12, 0, 0,
              hbm(26, 0, 56), "merger: block output upcast to fp32 and two fp32 temporaries"},
    LedgerRow{"F9", LedgerSite::kRingForwardStep, LedgerWhen::kAlways, 0, 0, 4, hbm(0, 0, 0),
              "the previous step's LSE (fp32)"},
    LedgerRow{"B6", LedgerSite::kRingBackwardStep, LedgerWhen::kAlways, 0, 8, 0, hbm(0, 8, 0),
              "send buffers cat(k, v) of this step and the previous one (bf16; next_kv keeps the "
              "previous until the new cat returns)"},
    LedgerRow{"B8", LedgerSite::kRingBackwardStep, LedgerWhen::kAlways, 2, 4, 0, hbm(0, 0, 0),
              "the previous step's dQ, dK, dV (bf16), held while the next kernel runs"},
    LedgerRow{"B14+B15", LedgerSite::kRingBackwardStep, LedgerWhen::kAlways, 0, 16, 0,
              hbm(0, 16, 0), "dK/dV rotation in fp32: cat() send buffer and partial-update cats"},
    LedgerRow{"B7", LedgerSite::kRingBackwardStep, LedgerWhen::kAlways, 0, 0, 2, hbm(0, 0, 4),
              "contiguous half of the LSE (fp32)"},
};

constexpr std::array<std::string_view, 4> kLimits = {
    "torch-native-cp: models the ring rotation (alltoall) of TorchTitan v0.2.0/v0.2.1 with "
    "repeat_kv; the all-gather rotation and v0.2.2 (enable_gqa) are not modelled",
    "torch-native-cp: the cuDNN kernel's workspace (chosen at run time) is not modelled",
    "torch-native-cp: the merger's and rotation's traffic is timed on every ring step at the "
    "full block size, though the partial steps work on half the queries (B7 only runs there); "
    "_partial_update's cats (B15) are not timed; the merger's last cast back to bf16 is the "
    "scheme's",
    "torch-native-cp: with the recipe's sdpa kernel the attention is timed with the profile's "
    "cudnn curves (TorchTitan puts cuDNN first and can_use_cudnn_attention passes for bf16, "
    "head_dim <= 128); a cuDNN older than 9, a deterministic run or a profile without cudnn "
    "curves would fall back to flash, which only the last case follows",
};

constexpr std::array kMethods = {CpMethod::kRing};
constexpr std::array<std::string_view, 3> kLaunchers = {"torchtitan-0.2.1", "accelerate",
                                                        "untied-ulysses"};

constexpr ImplementationTable kTable{
    "torch-native-cp",
    "PyTorch context_parallel (ring rotation) over SDPA, as TorchTitan runs it",
    "pytorch/pytorch@09b101c59aae511b84dfe4bac39b50cc50f7accf",
    kMethods,
    kLaunchers,
    "torch-native",
    kRows,
    kLimits,
    "",
    false,
    ""};

class TorchNativeCp final : public Implementation {
 public:
  TorchNativeCp() : Implementation(kTable) {}
  // PyTorch 2.13.0 torch/distributed/tensor/experimental/_context_parallel/_attention.py:324-406:
  // the ring's SDPA ops take `is_causal` and no mask.
  DocumentMasking document_masking(models::CpMethod /*m*/) const override {
    return {DocumentMasking::Kind::kAcrossDocuments,
            {},
            "context_parallel's SDPA ring takes is_causal and no mask (PyTorch 2.13.0, "
            "_context_parallel/_attention.py:324-406)"};
  }
  // TorchTitan's MoE (torchtitan/models/common/moe.py: token-choice top-k router, grouped
  // experts through torch._grouped_mm) with expert parallelism over its sparse mesh
  // [dp_replicate, efsdp, ep], EP innermost over dp_shard · cp · tp ranks
  // (distributed/parallel_dims.py:187-191, 281-282 @ b5bcd76c66d0acb1a08b176d9639425bc55e0b2a).
  // What its block keeps (torchtitan 0.3.0, traced on the CPU by tests/models/test_titan_moe.py;
  // on the GPU the router runs under autocast to fp32, TokenChoiceTopKRouter.forward, which the
  // CPU disables): the gate's fp32 copy of its input [s, h] (4 bytes per element), the fp32
  // softmax scores [s, E], per copy the top-k index (int64), the renormalised fp32 top-k score and
  // its fp32 per-row copy, the sorted and token indices (int64): 32 bytes, and per token the fp32
  // renormalisation sum (4); GroupedExperts' eager SwiGLU keeps silu(gate) beside gate, up and the
  // product; the routed outputs are weighted in fp32 (moe.py: `.to(torch.float32) * scores`),
  // which keeps their fp32 copy [s·k, h].
  ExpertSupport experts(models::CpMethod /*m*/) const override {
    return {.runs = true,
            .expert_parallel = true,
            .source =
                "TorchTitan's MoE with EP innermost over its dp_shard · cp · tp ranks "
                "(torchtitan@b5bcd76 models/common/moe.py, distributed/parallel_dims.py:"
                "187-191, 281-282)",
            .routing_bytes_per_copy = 32,
            .routing_bytes_per_token = 4,
            .keeps_renormalisation = false,
            .router_input_bytes = 4,
            .combined_bytes = 4,
            .eager_expert_activation = true};
  }
  // TorchTitan runs gpt-oss's sinks by rescaling FlexAttention's or varlen attention's output
  // through its LSE (torchtitan 0.3.0 models/gpt_oss/model.py:34-40, 116-131); the SDPA ops that
  // torch-native-cp models take none.
  FeatureSupport attention_sinks(models::CpMethod /*m*/) const override {
    return {false,
            "TorchTitan rescales FlexAttention's output by the sinks (torchtitan 0.3.0 "
            "models/gpt_oss/model.py:34-40, 116-131); its FlexAttention under CP is not "
            "modelled, and context_parallel's SDPA ops take no sinks"};
  }
  FeatureSupport latent_attention(models::CpMethod /*m*/) const override {
    return {false,
            "TorchTitan 0.3.0 runs DeepSeek-V3 on FlexAttention only, its K/V all-gathered under "
            "CP (models/common/config_utils.py:71-103, context_parallel/api.py:57-78); "
            "FlexAttention under CP is not modelled"};
  }
  FeatureSupport chunked_attention(models::CpMethod /*m*/) const override {
    return {false,
            "context_parallel's SDPA ops refuse an attention mask (PyTorch 2.13.0, "
            "_context_parallel/_attention.py:700-701, 738-739); TorchTitan 0.3.0 has no Llama 4"};
  }
  // The SDPA ops context_parallel handles take no window, and the efficient and cuDNN ones refuse
  // a mask ("attn_bias is not supported yet", _attention.py:700-701, 738-739).
  WindowSupport sliding_window(models::CpMethod /*m*/) const override {
    return {false,
            "context_parallel's SDPA ops take no window and refuse an attention mask (PyTorch "
            "2.13.0, _context_parallel/_attention.py:700-701, 738-739)"};
  }
  // repeat_kv before SDPA: every K/V tensor of the attention has the query heads.
  void shape(const ScheduleInputs& in, HeadLayout& layout) const override {
    layout.kv_heads_eff = in.model.heads;
    layout.kv_replication = in.model.heads / in.model.kv_heads;
    layout.kv_heads_per_fetch = in.model.heads;
  }
  // TorchTitan runs SDPA under sdpa_kernel([CUDNN, FLASH, EFFICIENT(, MATH)], set_priority=True)
  // (torchtitan/models/attention.py, ScaledDotProductAttentionWrapper, @ 0012170a; v0.2.0
  // :83-104 per the ledger document), so select_sdp_backend (PyTorch
  // aten/src/ATen/native/transformers/cuda/sdp_utils.cpp @ 001f694a) tries cuDNN first.
  // can_use_cudnn_attention passes for these calls: dense bf16/fp16 tensors (check_dtypes_low_
  // precision), no mask, no dropout, batch and heads ≤ 65535, head_dim a multiple of 8 and
  // ≤ 128 (check_cudnn_tensor_shapes; 256 only with newer cuDNN on sm90/sm10x), GQA allowed
  // (check_batch_size_and_num_heads_dense<true, false, true>; repeat_kv makes Hkv = H anyway),
  // sm80-sm121, not deterministic. The CP dispatcher then runs
  // aten._scaled_dot_product_cudnn_attention per ring step. Otherwise flash (the recipe's sdpa).
  std::string attention_kernel(const ScheduleInputs& in) const override {
    const bool cudnn = in.recipe.attention_kernel == "sdpa" && in.recipe.activation_bytes == 2 &&
                       in.model.head_dim % 8 == 0 && in.model.head_dim <= 128 &&
                       in.hardware.attention_kernels.count("cudnn") > 0;
    return cudnn ? std::string("cudnn") : in.recipe.attention_kernel;
  }
};

}  // namespace

const Implementation& torch_native_cp() {
  static const TorchNativeCp kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::impls
