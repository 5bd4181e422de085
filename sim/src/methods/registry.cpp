// The registry of CP implementations and the behaviour most of them share (overridden in
// methods/<name>.cpp where a method differs). Adding an implementation: one file in this folder,
// one factory in common.hpp and one line in kAll below (docs/ADDING_AN_IMPLEMENTATION.md).
#include <algorithm>
#include <array>
#include <stdexcept>

#include <fmt/format.h>

#include "cpsim/models/units.hpp"

#include "../step_builder.hpp"
#include "common.hpp"

namespace cpsim::sim {

const char* to_string(Quantity q) {
  switch (q) {
    case Quantity::kGpus:
      return "gpus";
    case Quantity::kGpusPerNode:
      return "gpus_per_node";
    case Quantity::kCpDegree:
      return "cp_degree";
    case Quantity::kRingDegree:
      return "ring_degree";
    case Quantity::kSeqLen:
      return "seq_len";
    case Quantity::kSeqLenMultiple:
      return "seq_len_multiple";
    case Quantity::kModelHeads:
      return "model_heads";
    case Quantity::kHeadsPerStage:
      return "heads_per_stage";
    case Quantity::kFpdtChunk:
      return "fpdt_chunk";
    case Quantity::kTpDegree:
      return "tp_degree";
    case Quantity::kMicroBatches:
      return "micro_batches";
    case Quantity::kPpDegree:
      return "pp_degree";
    case Quantity::kImplementation:
      return "implementation";
    case Quantity::kDocuments:
      return "documents";
    case Quantity::kAttentionWindow:
      return "attention_window";
    case Quantity::kAttentionSinks:
      return "attention_sinks";
    case Quantity::kAttentionChunks:
      return "attention_chunks";
    case Quantity::kLatentAttention:
      return "latent_attention";
    case Quantity::kExperts:
      return "experts";
    case Quantity::kExpertParallel:
      return "ep_degree";
    case Quantity::kExpertImbalance:
      return "expert_imbalance";
  }
  return "?";
}

std::span<const CpScheme* const> cp_schemes() {
  // One line per method; the count follows the list.
  static const auto kAll = std::to_array<const CpScheme*>({
      &methods::ulysses(),
      &methods::upipe(),
      &methods::ring(),
      &methods::allgather(),
      &methods::fpdt(),
      &methods::usp(),
  });
  return kAll;
}

const CpScheme& cp_scheme(models::CpMethod method) {
  for (const CpScheme* m : cp_schemes()) {
    if (m->id() == method) {
      return *m;
    }
  }
  throw std::logic_error(
      fmt::format("no CP scheme registered for method {}", static_cast<int>(method)));
}

bool LauncherSupport::runs_on(std::string_view launcher) const {
  return selects_on(launcher).has_value();
}

std::optional<std::string_view> LauncherSupport::selects_on(std::string_view launcher) const {
  for (const LauncherRun& r : runs) {
    if (r.launcher == launcher) {
      return r.selects;
    }
  }
  return std::nullopt;
}

std::string LauncherSupport::list() const {
  std::string s;
  for (const LauncherRun& r : runs) {
    s += s.empty() ? "" : ", ";
    s += r.launcher;
  }
  return s;
}

std::string LauncherSupport::sentence() const {
  if (runs.empty()) {
    return std::string(note);
  }
  std::string s;
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (i > 0) {
      s += i + 1 == runs.size() ? " or " : ", ";
    }
    s += runs[i].launcher;
  }
  if (!note.empty()) {
    s += fmt::format(" ({})", note);
  }
  return s;
}

std::optional<LauncherSelection> CpScheme::launcher_selection(
    std::string_view launcher,
    const models::ParallelConfig& /*p*/,
    std::string_view /*attention_kernel*/) const {
  const std::optional<std::string_view> selects = launchers().selects_on(launcher);
  if (!selects) {
    return std::nullopt;
  }
  return LauncherSelection{std::string(*selects), {}};
}

// Every method but UPipe runs all heads in one stage; K/V of all (replicated) KV heads are
// fetched once per layer.
std::optional<ConfigIssue> CpScheme::stage_heads(const ScheduleInputs& in, HeadLayout& L) const {
  if (in.parallel.heads_per_stage != 0) {
    return ConfigIssue{Quantity::kHeadsPerStage, "applies to --method upipe only"};
  }
  L.heads_per_stage = in.model.heads;
  L.stages = 1;
  L.kv_heads_per_fetch = L.kv_heads_eff;
  L.stages_per_kv_fetch = 1;
  L.fpdt_chunks = 0;
  return std::nullopt;
}

// Attention buffers of one layer, per rank (bf16 = 2 bytes, LSE fp32). s = N/C local tokens,
// n_r = N/ring tokens after the Ulysses all-to-all, u the Ulysses degree, U heads per stage (H
// unless UPipe), F K/V heads per fetch (H_kv' after replication unless UPipe):
//     QKV local          s·(U + 2F)·d·2       before the all-to-all (one stage)
//     QKV head-sharded   n_r·(U + 2F)/u·d·2   after it: the same bytes
//     out head-sharded   n_r·(U/u)·d·2,   out local s·U·d·2,   LSE (U/u)·n_r·4
//     ring block         n_r·2(F/u)·d·2 sent per ring step; all-gather: N·2(F/u)·d·2 gathered
// All-to-all bytes sent per rank in one forward layer (u > 1): s·(H + 2H_kv')·d·2 + s·H·d·2
// (REFERENCES.md [Ulysses]: 4Nh/P for MHA). UPipe and FPDT add to this in their files.
AttentionBuffers CpScheme::buffers(const ScheduleInputs& in, const HeadLayout& L) const {
  const std::int64_t n = in.parallel.seq_len;
  const std::int64_t s = n / L.cp;
  const std::int64_t nr = n / L.ring;
  // MLA (value heads d_v wide): every "2·d" of a K/V pair is d + d_v, every output's d is d_v.
  const std::int64_t d = in.model.head_dim, dv = in.model.value_head_dim();
  const std::int64_t b = in.recipe.activation_bytes;
  const std::int64_t u = L.heads_per_stage;
  const std::int64_t f = L.kv_heads_per_fetch;
  AttentionBuffers a;
  a.qkv_local_bytes = s * (u * d + f * (d + dv)) * b;
  a.qkv_headsharded_bytes = nr * (u * d + f * (d + dv)) / L.ulysses * b;
  a.out_headsharded_bytes = nr * (u / L.ulysses) * dv * b;
  a.out_local_bytes = s * u * dv * b;
  a.lse_bytes = (u / L.ulysses) * nr * kFp32Bytes;
  if (L.ring > 1) {
    if (gathers_kv()) {
      a.allgather_kv_bytes = n * (f / L.ulysses) * (d + dv) * b;
    } else {
      a.ring_block_bytes = nr * (f / L.ulysses) * (d + dv) * b;
    }
  }
  a.a2a_send_bytes_per_layer_fwd =
      L.ulysses > 1 ? s * (L.heads * d + L.kv_heads_eff * (d + dv)) * b + s * L.heads * dv * b : 0;
  return a;
}

std::int64_t CpScheme::seq_multiple(const models::ParallelConfig& p) const {
  return methods::layout_seq_multiple(p);
}

std::int64_t CpScheme::ops_per_block_estimate(const ScheduleInputs& in) const {
  return 40 + 10 * std::max(1, in.parallel.ring_degree);
}

namespace methods {

void UlyssesScheme::attention_forward(detail::StepBuilder& b,
                                      detail::SavedLayer& sv,
                                      detail::TensorSet params,
                                      bool grad) const {
  b.ulysses_forward(sv, params, grad);
}

detail::InputGrad UlyssesScheme::attention_backward(detail::StepBuilder& b,
                                                    const detail::SavedLayer& sv,
                                                    detail::TensorSet d_o,
                                                    detail::TensorSet params,
                                                    detail::TensorSet grads) const {
  return b.ulysses_backward(sv, d_o, params, grads);
}

std::vector<int> divisors(int n) {
  std::vector<int> d;
  for (int i = 1; i <= n; ++i) {
    if (n % i == 0) {
      d.push_back(i);
    }
  }
  return d;
}

std::int64_t layout_seq_multiple(const models::ParallelConfig& p) {
  const bool zigzag = p.ring_layout == models::RingLayout::kZigzag && p.ring_degree > 1;
  return zigzag ? std::int64_t{2} * p.cp_degree : p.cp_degree;
}

std::optional<ConfigIssue> no_ring(const models::ParallelConfig& p) {
  if (p.ring_degree != 1) {
    return ConfigIssue{Quantity::kRingDegree,
                       fmt::format("--method {} has no ring; use --method usp (or upipe) for "
                                   "Ulysses × ring",
                                   models::to_string(p.method))};
  }
  return std::nullopt;
}

std::optional<ConfigIssue> WholeRingImplementation::check_ring_degree(
    const models::ParallelConfig& p) const {
  return whole_ring(p);
}

void WholeRingImplementation::search_candidates(const models::ParallelConfig& base,
                                                const SearchSpace& /*space*/,
                                                std::vector<models::ParallelConfig>& out) const {
  if (base.cp_degree > 1) {
    models::ParallelConfig p = base;
    p.ring_degree = base.cp_degree;
    out.push_back(p);
  }
}

std::string WholeRingImplementation::label(LabelStyle style,
                                           const models::ParallelConfig& p,
                                           const HeadLayout* /*layout*/) const {
  const Words w = words();
  const char* layout = models::to_string(p.ring_layout);
  switch (style) {
    case LabelStyle::kSearch:
      return fmt::format("{} C{}", w.search, p.cp_degree);
    case LabelStyle::kDescription:
      return fmt::format("{} (C={}, {} layout)", w.description, p.cp_degree, layout);
    case LabelStyle::kDegrees:
      break;
  }
  return fmt::format("{} {} ({})", w.degrees, p.ring_degree, layout);
}

std::optional<ConfigIssue> whole_ring(const models::ParallelConfig& p) {
  if (p.ring_degree != p.cp_degree) {
    return ConfigIssue{Quantity::kRingDegree,
                       fmt::format("--method {} rotates over the whole CP group: ring degree "
                                   "must equal the CP degree {}",
                                   models::to_string(p.method), p.cp_degree)};
  }
  return std::nullopt;
}

std::string degrees_pair(const models::ParallelConfig& p) {
  return fmt::format("(u{} x r{})", p.ulysses_degree(), p.ring_degree);
}

}  // namespace methods
}  // namespace cpsim::sim
