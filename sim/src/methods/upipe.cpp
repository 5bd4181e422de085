// UPipe (Untied Ulysses): Ulysses with headwise chunking. The attention of a layer runs in H/U
// stages of U query heads instead of all H at once, so the head-sharded Q/K/V/output buffers
// hold U/u heads, not H/u; optionally × a ring across nodes as in USP.
//
// Derivation. U is a multiple of the Ulysses degree u (each rank gets U/u heads per stage) and
// divides H. K/V are fetched (projected and sent) once per GQA group of stages: with H_kv' KV
// heads after replication, when U ≤ H_kv' a fetch carries U KV heads and serves H/H_kv' stages,
// else one fetch carries all H_kv' and serves every stage; U and H_kv' must divide one another.
// The custom op keeps its input, the full output [N/C, H·d] and one LSE per stage for backward,
// and recomputes the per-stage projections in backward (attention_upipe.cpp), so selective
// checkpointing adds nothing. Buffers: those of Ulysses with U heads per stage, plus the full
// output s·H·d·2.
//
// Sources:
//   The UPipe / Untied Ulysses scheme as implemented in the authors' TorchTitan fork (launcher
//   "untied-ulysses"); the paper's arXiv id and the fork's commit are not recorded here.
//   Jacobs et al., "DeepSpeed Ulysses", arXiv:2309.14509 (the all-to-all it chunks).
#include <fmt/format.h>

#include "../step_builder.hpp"
#include "common.hpp"

namespace cpsim::sim::methods {
namespace {

class UPipe final : public CpScheme {
 public:
  models::CpMethod id() const override { return models::CpMethod::kUPipe; }
  bool has_ulysses_part() const override { return true; }
  bool has_ring_part() const override { return true; }
  bool uses_heads_per_stage() const override { return true; }
  bool builds_latent_attention() const override {
    return false;
  }  // one head width (attention_upipe)
  /// The custom op saves its input, output and LSEs whatever the checkpointing (see above).
  bool recomputes_selectively(const models::ParallelConfig& /*p*/) const override { return false; }

  std::optional<ConfigIssue> check_ring_degree(const models::ParallelConfig& /*p*/) const override {
    return std::nullopt;  // any split of C
  }

  std::optional<ConfigIssue> stage_heads(const ScheduleInputs& in, HeadLayout& L) const override {
    const auto& m = in.model;
    const std::int64_t u = L.ulysses;
    const std::int64_t hs = in.parallel.heads_per_stage == 0 ? u : in.parallel.heads_per_stage;
    if (hs <= 0 || hs % u != 0) {
      return ConfigIssue{
          Quantity::kHeadsPerStage,
          fmt::format("U = {} must be a positive multiple of the Ulysses degree {}", hs, u)};
    }
    if (m.heads % hs != 0) {
      return ConfigIssue{
          Quantity::kHeadsPerStage,
          fmt::format("U = {} must divide the {} query heads of {}", hs, m.heads, m.name)};
    }
    if ((hs <= L.kv_heads_eff && L.kv_heads_eff % hs != 0) ||
        (hs > L.kv_heads_eff && hs % L.kv_heads_eff != 0)) {
      return ConfigIssue{Quantity::kHeadsPerStage,
                         fmt::format("U = {} is not compatible with {} KV heads (after "
                                     "replication): one must divide the other",
                                     hs, L.kv_heads_eff)};
    }
    L.heads_per_stage = hs;
    L.stages = m.heads / hs;
    if (hs <= L.kv_heads_eff) {
      L.kv_heads_per_fetch = hs;
      L.stages_per_kv_fetch = m.heads / L.kv_heads_eff;
    } else {
      L.kv_heads_per_fetch = L.kv_heads_eff;
      L.stages_per_kv_fetch = L.stages;
    }
    L.fpdt_chunks = 0;
    return std::nullopt;
  }

  AttentionBuffers buffers(const ScheduleInputs& in, const HeadLayout& L) const override {
    AttentionBuffers a = CpScheme::buffers(in, L);
    a.final_out_bytes =
        in.parallel.local_seq() * L.heads * in.model.head_dim * in.recipe.activation_bytes;
    return a;
  }

  void attention_forward(detail::StepBuilder& b,
                         detail::SavedLayer& sv,
                         detail::TensorSet params,
                         bool /*grad*/) const override {
    b.upipe_forward(sv, params);
  }
  detail::InputGrad attention_backward(detail::StepBuilder& b,
                                       const detail::SavedLayer& sv,
                                       detail::TensorSet d_o,
                                       detail::TensorSet params,
                                       detail::TensorSet grads) const override {
    return b.upipe_backward(sv, d_o, params, grads);
  }

  // Every split of C but u = 1 (no headwise all-to-all left), and every U that divides H.
  void search_candidates(const models::ParallelConfig& base,
                         const SearchSpace& space,
                         std::vector<models::ParallelConfig>& out) const override {
    const int c = base.cp_degree;
    for (const int r : divisors(c)) {
      if (r == c && c > 1) {
        continue;
      }
      models::ParallelConfig p = base;
      p.ring_degree = r;
      const int u = c / r;
      for (std::int64_t heads = u; heads <= space.heads; heads += u) {
        if (space.heads % heads == 0) {
          p.heads_per_stage = heads;
          out.push_back(p);
        }
      }
    }
  }

  std::int64_t ops_per_block_estimate(const ScheduleInputs& in) const override {
    const auto& p = in.parallel;
    const std::int64_t ring = std::max(1, p.ring_degree);
    const std::int64_t u = std::max<std::int64_t>(1, p.cp_degree / ring);
    const std::int64_t stage = p.heads_per_stage == 0 ? u : p.heads_per_stage;
    return 40 + (20 + 10 * ring) * std::max<std::int64_t>(1, in.model.heads / stage);
  }

  std::string label(LabelStyle style,
                    const models::ParallelConfig& p,
                    const HeadLayout* L) const override {
    const char* layout = models::to_string(p.ring_layout);
    switch (style) {
      case LabelStyle::kSearch:
        return fmt::format("upipe C{} {} U{}", p.cp_degree, degrees_pair(p),
                           p.heads_per_stage == 0 ? p.ulysses_degree() : p.heads_per_stage);
      case LabelStyle::kDescription: {
        const std::string ring =
            p.ring_degree > 1 ? fmt::format(" x ring {} ({})", p.ring_degree, layout) : "";
        if (L == nullptr) {
          return fmt::format("UPipe (Ulysses {}{})", p.ulysses_degree(), ring);
        }
        return fmt::format("UPipe (Ulysses {}{}, U={}: {} stages, K/V fetched every {} stage{})",
                           L->ulysses, ring, L->heads_per_stage, L->stages, L->stages_per_kv_fetch,
                           L->stages_per_kv_fetch == 1 ? "" : "s");
      }
      case LabelStyle::kDegrees:
        break;
    }
    std::string s = fmt::format("Ulysses {}", p.ulysses_degree());
    if (p.ring_degree > 1) {
      s += fmt::format(" × ring {} ({})", p.ring_degree, layout);
    }
    if (L != nullptr) {
      s += fmt::format(", U={} ({} stages)", L->heads_per_stage, L->stages);
    }
    return s;
  }
  std::string_view report_color() const override { return "#2ca02c"; }
  LauncherSupport launchers() const override {
    return {{{"untied-ulysses", "upipe"}}, "UPipe exists only in the authors' TorchTitan fork"};
  }
};

}  // namespace

const CpScheme& upipe() {
  static const UPipe kImplementation;
  return kImplementation;
}

}  // namespace cpsim::sim::methods
