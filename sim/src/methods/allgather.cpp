// All-gather CP: K/V of the whole sequence are gathered on every rank before attention; each rank
// attends its local queries to the visible prefix.
//
// Derivation. One all-gather of N·2·H_kv·d·2 bytes per layer forward (exposed: attention waits
// for it), and in the backward a second all-gather and a reduce-scatter of dK/dV. Only the local
// K/V are kept for backward. Cheaper than a ring when K/V are small (GQA) and latency matters;
// the gathered K/V grow with N. Token layouts as for ring (zigzag balances causal work). Ops:
// attention_ulysses.cpp with u = 1 and the all-gather path of attention_core.cpp.
//
// Sources:
//   Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783 (§3.3.2, all-gather based CP).
//   github.com/pytorch/pytorch, torch/distributed/tensor/experimental/_attention.py (rotate
//   method "allgather"); github.com/NVIDIA/Megatron-LM (cp_comm_type all_gather, via
//   TransformerEngine).
#include <fmt/format.h>

#include "../step_builder.hpp"
#include "common.hpp"

namespace cpsim::sim::methods {
namespace {

class AllGather final : public WholeRingImplementation {
 public:
  models::CpMethod id() const override { return models::CpMethod::kAllGather; }
  bool gathers_kv() const override { return true; }

 protected:
  Words words() const override { return {"allgather", "all-gather CP", "all-gather"}; }

 public:
  std::string_view report_color() const override { return "#9467bd"; }
  // Megatron-LM and NeMo run all_gather through TransformerEngine, which v2.11 refuses for MLA
  // under CP (context_parallel.py:4031-4035: p2p or a2a+p2p only; REFERENCES.md [MLA-sources]).
  std::optional<std::string> launcher_refuses(std::string_view launcher,
                                              const models::TransformerSpec& model) const override {
    if (model.is_mla() && (launcher == "megatron" || launcher == "nemo")) {
      return fmt::format(
          "{} has multi-head latent attention, which TransformerEngine v2.11 runs "
          "under CP with cp_comm_type p2p or a2a+p2p only, not all_gather",
          model.name);
    }
    return std::nullopt;
  }
  LauncherSupport launchers() const override {
    // Transformer Engine accepts only "all_gather" (Megatron-LM's argparse help says allgather).
    // TorchTitan 0.3.0 and main have no rotate key: their CP is FlexAttention with K/V
    // all-gathered at the attention's local_map boundary (torchtitan/models/common/
    // decoder_sharding.py:275-284 @b5bcd76), the only CP attention they accept
    // (models/common/decoder.py:173-183 @b5bcd76; update_from_config in 0.3.0). v0.2.2's training
    // runs PyTorch's default rotation, the all-gather, whatever its TOML's rotate method.
    return {{{"torchtitan", "flex"},
             {"torchtitan-0.2.2", "allgather"},
             {"torchtitan-0.2.1", "allgather"},
             {"torchtitan-main", "flex"},
             {"megatron", "all_gather"},
             {"nemo", "all_gather"},
             {"accelerate", "allgather"}},
            {}};
  }
};

}  // namespace

const CpScheme& allgather() {
  static const AllGather kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::methods
