// USP (unified sequence parallelism): Ulysses inside a group of u ranks × ring across r groups,
// C = u·r.
//
// Derivation. The all-to-all runs over the u ranks of a Ulysses group (usually one node, where
// the all-to-all is fast), leaving each rank N/r tokens of H/u heads; core attention then runs as
// a ring over the r groups (across nodes, where send/recv overlaps compute). Needs H divisible by
// u and, with the zigzag ring layout, N divisible by 2C. The CLI's default places Ulysses inside a
// node and the ring across nodes (yunchang's "ulysses low" placement). Ops: attention_ulysses.cpp
// with the ring of attention_core.cpp.
//
// Sources:
//   Fang, Zhao, "USP: A Unified Sequence Parallelism Approach for Long Context Generative AI",
//   arXiv:2405.07719.
//   github.com/feifeibear/long-context-attention (yunchang), yunchang/hybrid/attn_layer.py
//   (LongContextAttention); Megatron-LM's hierarchical cp_comm_type "a2a+p2p".
#include <fmt/format.h>

#include "../step_builder.hpp"
#include "common.hpp"

namespace cpsim::sim::methods {
namespace {

class Usp final : public UlyssesScheme {
 public:
  models::CpMethod id() const override { return models::CpMethod::kUsp; }
  bool has_ulysses_part() const override { return true; }
  bool has_ring_part() const override { return true; }

  std::optional<ConfigIssue> check_ring_degree(const models::ParallelConfig& /*p*/) const override {
    return std::nullopt;  // any split of C
  }

  // Proper splits only: r = 1 is ulysses, r = C is ring.
  void search_candidates(const models::ParallelConfig& base,
                         const SearchSpace& /*space*/,
                         std::vector<models::ParallelConfig>& out) const override {
    for (const int r : divisors(base.cp_degree)) {
      if (r > 1 && r < base.cp_degree) {
        models::ParallelConfig p = base;
        p.ring_degree = r;
        out.push_back(p);
      }
    }
  }

  std::string label(LabelStyle style,
                    const models::ParallelConfig& p,
                    const HeadLayout* /*layout*/) const override {
    const char* layout = models::to_string(p.ring_layout);
    switch (style) {
      case LabelStyle::kSearch:
        return fmt::format("usp C{} {}", p.cp_degree, degrees_pair(p));
      case LabelStyle::kDescription:
        return fmt::format("USP (Ulysses {} x ring {}, {} ring)", p.ulysses_degree(), p.ring_degree,
                           layout);
      case LabelStyle::kDegrees:
        break;
    }
    return fmt::format("Ulysses {} × ring {} ({})", p.ulysses_degree(), p.ring_degree, layout);
  }
  std::string_view report_color() const override { return "#17becf"; }
  LauncherSupport launchers() const override {
    return {{{"megatron", "a2a+p2p"}, {"untied-ulysses", "usp"}}, "megatron with a2a+p2p"};
  }
  // Megatron-LM's hierarchical a2a+p2p needs both parts; a degree-1 part is the plain other one.
  std::optional<LauncherSelection> launcher_selection(std::string_view launcher,
                                                      const models::ParallelConfig& p,
                                                      std::string_view kernel) const override {
    std::optional<LauncherSelection> s = CpScheme::launcher_selection(launcher, p, kernel);
    if (s && launcher == "megatron") {
      if (p.ring_degree == 1) {
        s->selects = "a2a";
        s->notes.emplace_back("usp with ring degree 1 is plain a2a");
      } else if (p.ulysses_degree() == 1) {
        s->selects = "p2p";
        s->notes.emplace_back("usp with Ulysses degree 1 is plain p2p");
      }
    }
    return s;
  }
};

}  // namespace

const CpScheme& usp() {
  static const Usp kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::methods
