// Ring attention: every rank keeps its tokens of all heads; K/V blocks rotate around the CP group
// with send/recv while each rank attends its queries to the block it holds.
//
// Derivation. With C ranks, C steps per layer: step k attends the local queries to the K/V block
// received at step k−1 while the next block is in flight (double buffering), so communication is
// hidden when a block's attention outlasts its transfer. Causal masking makes the contiguous
// layout unbalanced (rank C−1 computes C blocks, rank 0 one); the zigzag layout (2C chunks, rank i
// holds i and 2C−1−i) balances it and needs the sequence divisible by 2C. The backward sends an
// fp32 dK/dV accumulator around the ring with the blocks. Ops: attention_ulysses.cpp with u = 1
// and the ring of attention_core.cpp.
//
// Sources:
//   Liu, Zaharia, Abbeel, "Ring Attention with Blockwise Transformers for Near-Infinite Context",
//   arXiv:2310.01889.
//   github.com/zhuzilin/ring-flash-attention, ring_flash_attn/zigzag_ring_flash_attn.py (zigzag
//   layout, fp32 accumulators); github.com/pytorch/pytorch,
//   torch/distributed/tensor/experimental/_attention.py (TorchTitan's context parallel).
#include <fmt/format.h>

#include "../step_builder.hpp"
#include "common.hpp"

namespace cpsim::sim::methods {
namespace {

class Ring final : public WholeRingImplementation {
 public:
  models::CpMethod id() const override { return models::CpMethod::kRing; }

 protected:
  Words words() const override { return {"ring", "Ring attention", "ring"}; }

 public:
  std::string_view report_color() const override { return "#ff7f0e"; }
  LauncherSupport launchers() const override {
    // TorchTitan's name for passing K/V around the ring; only v0.2.1's training reads it (v0.2.2
    // reads it in validation alone, 0.3.0 and main have no ring).
    return {{{"torchtitan-0.2.1", "alltoall"},
             {"megatron", "p2p"},
             {"nemo", "p2p"},
             {"accelerate", "alltoall"},
             {"untied-ulysses", "usp"}},
            {}};
  }
  // The UPipe fork runs ring as yunchang's zigzag ring flash attention (usp with Ulysses degree
  // 1) with FlashAttention kernels; with any other kernel, as the torch ring (SDPA).
  std::optional<LauncherSelection> launcher_selection(std::string_view launcher,
                                                      const models::ParallelConfig& p,
                                                      std::string_view kernel) const override {
    std::optional<LauncherSelection> s = CpScheme::launcher_selection(launcher, p, kernel);
    if (s && launcher == "untied-ulysses") {
      if (kernel != "fa2" && kernel != "fa3") {
        s->selects = "torch_ring_alltoall";
      } else {
        s->notes.emplace_back(
            "ring runs as usp with Ulysses degree 1 (yunchang zigzag ring flash attention)");
      }
    }
    return s;
  }
};

}  // namespace

const CpScheme& ring() {
  static const Ring kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::methods
