// Ulysses: sequence-sharded → head-sharded all-to-all before core attention, and back after it.
//
// Derivation. Each of the C ranks holds N/C tokens of every head. An all-to-all over the CP group
// gives each rank all N tokens of H/C query heads (and of its KV heads, replicated when C exceeds
// the KV heads), core attention runs locally, and a second all-to-all returns the output to the
// sequence layout. Per layer each rank sends (N/C)·(H + 2·H_kv')·d·2 bytes forward for Q/K/V and
// (N/C)·H·d·2 for the output (4Nh/P for MHA). Needs H divisible by C; the sequence by C.
// The ops (attention_ulysses.cpp, attention_core.cpp) are shared with usp, ring and allgather,
// which differ only in the degrees of the all-to-all and of the ring.
//
// Sources:
//   Jacobs et al., "DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme Long
//   Sequence Transformer Models", arXiv:2309.14509; github.com/microsoft/DeepSpeed,
//   deepspeed/sequence/layer.py (DistributedAttention, _SeqAllToAll).
//   Bekman et al., "Arctic Long Sequence Training: Scalable And Efficient Training For
//   Multi-Million Token Sequences", arXiv:2506.13996; github.com/snowflakedb/ArcticTraining
//   (the ALST recipes: Ulysses through Hugging Face models, tiled MLP and loss).
#include <fmt/format.h>

#include "../step_builder.hpp"
#include "common.hpp"

namespace cpsim::sim::methods {
namespace {

class Ulysses final : public UlyssesScheme {
 public:
  models::CpMethod id() const override { return models::CpMethod::kUlysses; }
  bool has_ulysses_part() const override { return true; }
  bool has_ring_part() const override { return false; }

  std::optional<ConfigIssue> check_ring_degree(const models::ParallelConfig& p) const override {
    return no_ring(p);
  }

  void search_candidates(const models::ParallelConfig& base,
                         const SearchSpace& /*space*/,
                         std::vector<models::ParallelConfig>& out) const override {
    models::ParallelConfig p = base;
    p.ring_degree = 1;
    out.push_back(p);
  }

  std::string label(LabelStyle style,
                    const models::ParallelConfig& p,
                    const HeadLayout* /*layout*/) const override {
    switch (style) {
      case LabelStyle::kSearch:
        return fmt::format("ulysses C{}", p.cp_degree);
      case LabelStyle::kDescription:
        return fmt::format("Ulysses (C={})", p.cp_degree);
      case LabelStyle::kDegrees:
        break;
    }
    return fmt::format("Ulysses {}", p.ulysses_degree());
  }
  std::string_view report_color() const override { return "#1f77b4"; }
  LauncherSupport launchers() const override {
    return {{{"arctic", "ulysses"},
             {"deepspeed", "ulysses"},
             {"accelerate", "deepspeed"},  // Accelerate's SP backend: DeepSpeed's ALST Ulysses
             {"megatron", "a2a"},
             {"nemo", "a2a"},
             {"untied-ulysses", "usp"}},
            "megatron and nemo with a2a"};
  }
  std::optional<LauncherSelection> launcher_selection(std::string_view launcher,
                                                      const models::ParallelConfig& p,
                                                      std::string_view kernel) const override {
    std::optional<LauncherSelection> s = CpScheme::launcher_selection(launcher, p, kernel);
    if (s && launcher == "untied-ulysses") {
      s->notes.emplace_back(
          "the fork runs Ulysses as usp (yunchang LongContextAttention) with ring degree 1");
    }
    return s;
  }
};

}  // namespace

const CpScheme& ulysses() {
  static const Ulysses kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::methods
