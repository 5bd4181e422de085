#include "cpsim/planner/batches.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/planner/dynamic_cp.hpp"
#include "cpsim/planner/evaluate.hpp"
#include "cpsim/planner/search.hpp"
#include "cpsim/sim/cp_method.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::planner {

namespace {

struct NamedBalancer {
  sim::Balancer id;
  LoadBalancer balancer;
};
constexpr NamedBalancer kHeads{sim::Balancer::kHeads,
                               {"heads", models::RingLayout::kZigzag, sim::DocumentSplit::kSequence,
                                "Ulysses: every rank attends the whole sequence for its heads"}};
constexpr NamedBalancer kRingBalancers[] = {
    {sim::Balancer::kHeadTail,
     {"head-tail", models::RingLayout::kZigzag, sim::DocumentSplit::kSequence,
      "2R chunks of the packed sequence, r and 2R-1-r on rank r (TorchTitan's headtail balancer "
      "with its block-causal mask)"}},
    {sim::Balancer::kContiguous,
     {"contiguous", models::RingLayout::kContiguous, sim::DocumentSplit::kSequence,
      "R contiguous slices of the packed sequence (ring-flash-attn's llama3 varlen, its HF "
      "adapter)"}},
    {sim::Balancer::kPerDocument,
     {"per-document", models::RingLayout::kZigzag, sim::DocumentSplit::kPerDocument,
      "every document padded to 2R and split head-tail (TransformerEngine THD under Megatron-LM "
      "with cu_seqlens, ring-flash-attn's zigzag varlen)"}},
};

constexpr NamedBalancer kHybridCp{
    sim::Balancer::kHybridCp,
    {"hybrid-cp", models::RingLayout::kZigzag, sim::DocumentSplit::kPerDocument,
     "every document on its own CP group, a power of two of the DP x CP ranks from its length "
     "over S/C tokens per rank, in rounds closed by a barrier (Megatron-Core's "
     "hybrid_context_parallel, 0.16.1)",
     true, LoadBalancer::Regroup::kHybridCp}};
constexpr NamedBalancer kDynamicCp{
    sim::Balancer::kDynamicCp,
    {"dynamic-cp", models::RingLayout::kZigzag, sim::DocumentSplit::kPerDocument,
     "each micro-batch regroups the DP x CP ranks in power-of-two CP groups that run their "
     "documents packed, placed under a work cap (Megatron-LM's --dynamic-context-parallel, dev "
     "branch @ d48bd6b, not in a megatron-core release)",
     true, LoadBalancer::Regroup::kDynamicCp}};

constexpr NamedBalancer kPtrr{
    sim::Balancer::kPtrr,
    {"ptrr", models::RingLayout::kZigzag, sim::DocumentSplit::kPtrrBlocks,
     "FlexAttention blocks of 128 tokens dealt to the ranks by processing-time round-robin on "
     "their masked block counts (PyTorch's _PTRRLoadBalancer, TorchTitan's ptrr balancer; "
     "FlexAttention's CP gathers K/V)"}};

// Why PTRR does not apply to `in` (empty: it does).
std::string ptrr_refusal(const sim::ScheduleInputs& in) {
  const models::ParallelConfig& p = in.parallel;
  if (p.method != models::CpMethod::kAllGather) {
    return "ptrr shards FlexAttention, whose CP all-gathers K/V (--method allgather)";
  }
  if (p.seq_len % (sim::kFlexBlockTokens * p.ring_degree) != 0) {
    return fmt::format(
        "ptrr deals blocks of {} tokens, a multiple of the {} ranks: the packed "
        "length {} is not a multiple of {}",
        sim::kFlexBlockTokens, p.ring_degree, p.seq_len, sim::kFlexBlockTokens * p.ring_degree);
  }
  return {};
}

// DP × CP ranks, the ranks hybrid CP schedules over.
int hybrid_cp_ranks(const sim::ScheduleInputs& in) {
  return in.parallel.data_parallel() * in.parallel.cp_degree;
}

// Span multiple of a document under hybrid CP: any group, up to all DP × CP ranks, splits it
// head-tail, over TP ranks with sequence parallelism (GPTDatasetConfig.hybrid_context_parallel:
// "divisible by the data parallel size * context parallel size * sequence parallel size * 2").
std::int64_t hybrid_cp_span_multiple(const sim::ScheduleInputs& in) {
  return 2 * std::int64_t{hybrid_cp_ranks(in)} * in.parallel.tp_degree;
}

// Why hybrid CP does not apply to `in` (empty: it does).
std::string hybrid_cp_refusal(const sim::ScheduleInputs& in) {
  const models::ParallelConfig& p = in.parallel;
  const int ranks = hybrid_cp_ranks(in);
  if (p.method != models::CpMethod::kRing) {
    return "hybrid-cp schedules ring CP groups (--method ring)";
  }
  if (p.pp_degree > 1) {
    return "hybrid-cp with pipeline stages is not modelled (--pp 1)";
  }
  if ((ranks & (ranks - 1)) != 0) {
    return fmt::format("hybrid-cp is modelled over a power-of-two count of DP x CP ranks, not {}",
                       ranks);
  }
  if (p.seq_len % hybrid_cp_span_multiple(in) != 0) {
    return fmt::format(
        "hybrid-cp pads every document to a multiple of {} (2 x DP x CP x TP); "
        "the packed length {} is not one",
        hybrid_cp_span_multiple(in), p.seq_len);
  }
  return {};
}

struct BatchTotals {
  std::int64_t real_tokens = 0;
  std::int64_t documents = 0;
};

// Quantiles and shares of a study whose per-batch vectors are filled.
void summarize_study(BalancerStudy& out,
                     const BatchTotals& totals,
                     std::size_t sequences,
                     std::int64_t sequence_tokens,
                     const BatchOptions& options) {
  out.p50_s = quantile(out.step_s, 0.5);
  out.p95_s = quantile(out.step_s, 0.95);
  out.max_s = *std::max_element(out.step_s.begin(), out.step_s.end());
  out.tokens_per_s_p50 = quantile(out.tokens_per_s, 0.5);
  out.imbalance_p50 = quantile(out.imbalance, 0.5);
  out.imbalance_max = *std::max_element(out.imbalance.begin(), out.imbalance.end());
  out.document_tokens_per_step =
      static_cast<double>(totals.real_tokens) / static_cast<double>(options.batches);
  out.objective_tokens_per_s = out.document_tokens_per_step /
                               (options.objective == BatchObjective::kP50 ? out.p50_s : out.p95_s);
  const double all_tokens = static_cast<double>(sequences) * static_cast<double>(sequence_tokens);
  out.padding_share = 1.0 - static_cast<double>(totals.real_tokens) / all_tokens;
  out.documents_per_sequence =
      static_cast<double>(totals.documents) / static_cast<double>(sequences);
}

// The micro-batches of a step, `s` per replica and micro-batch (replica-major): the replicas
// reduce gradients after every micro-batch under ZeRO ≥ 2 (and gather parameters in every pass
// under ZeRO-3), so each micro-batch waits for the slowest replica's; under ZeRO 0/1 they
// synchronise once, after the last (sim/src/step_builder.cpp, StepBuilder::build).
double composed_micro_batches_s(const std::vector<double>& s,
                                int replicas,
                                int micro_batches,
                                int zero_stage) {
  auto at = [&](int r, int m) { return s[static_cast<std::size_t>(r * micro_batches + m)]; };
  double total = 0.0;
  if (zero_stage >= 2) {
    for (int m = 0; m < micro_batches; ++m) {
      double slowest = 0.0;
      for (int r = 0; r < replicas; ++r) {
        slowest = std::max(slowest, at(r, m));
      }
      total += slowest;
    }
    return total;
  }
  for (int r = 0; r < replicas; ++r) {
    double replica = 0.0;
    for (int m = 0; m < micro_batches; ++m) {
      replica += at(r, m);
    }
    total = std::max(total, replica);
  }
  return total;
}

// Hybrid or dynamic CP: the documents of a step's sequences (their spans) scheduled over DP × CP
// ranks.
BalancerStudy study_regrouped(const sim::ScheduleInputs& in,
                              const LoadBalancer& balancer,
                              const std::vector<models::PackedSequence>& sequences,
                              int sequences_per_batch,
                              const BatchOptions& options,
                              const std::function<void()>& step_done) {
  BalancerStudy out;
  out.balancer = balancer;
  std::optional<HybridCpTimer> hybrid;
  std::optional<DynamicCpTimer> dynamic;
  if (balancer.regroup == LoadBalancer::Regroup::kHybridCp) {
    hybrid.emplace(in);
  } else {
    dynamic.emplace(in);
  }
  BatchTotals totals;
  for (int b = 0; b < options.batches; ++b) {
    std::vector<std::int64_t> spans;
    std::int64_t real_tokens = 0;
    for (int s = 0; s < sequences_per_batch; ++s) {
      const models::PackedSequence& seq =
          sequences[static_cast<std::size_t>(b * sequences_per_batch + s)];
      real_tokens += seq.real_tokens();
      totals.documents += static_cast<std::int64_t>(seq.documents.size());
      for (std::size_t d = 0; d < seq.documents.size(); ++d) {
        spans.push_back(seq.span(d));
      }
    }
    totals.real_tokens += real_tokens;
    HybridCpStep step = hybrid ? hybrid->step(spans) : dynamic->step(spans);
    out.step_s.push_back(step.step_s);
    out.imbalance.push_back(step.imbalance);
    out.tokens_per_s.push_back(static_cast<double>(real_tokens) / step.step_s);
    out.hybrid_cp_rounds.push_back(std::move(step.rounds));
    if (step_done) {
      step_done();
    }
  }
  summarize_study(out, totals, sequences.size(), in.parallel.seq_len, options);
  out.memory = hybrid ? hybrid->memory() : dynamic->memory();
  return out;
}

BalancerStudy study_one(const sim::ScheduleInputs& base,
                        const LoadBalancer& balancer,
                        int ring,
                        int sequences_per_batch,
                        const BatchOptions& options,
                        const std::function<void()>& step_done) {
  sim::ScheduleInputs in = base;
  in.parallel.ring_layout = balancer.layout;
  const std::int64_t sequence_tokens = in.parallel.seq_len;
  const std::int64_t span_multiple = balancer.regroups() ? hybrid_cp_span_multiple(in)
                                     : balancer.split == sim::DocumentSplit::kPerDocument
                                         ? 2 * std::int64_t{ring}
                                         : 1;
  // The same document stream under every balancer: one sampler per balancer, the same seed.
  models::DocumentSampler sampler(options.lengths, options.seed);
  const std::vector<models::PackedSequence> sequences =
      models::pack_documents(sampler, sequence_tokens, span_multiple, options.packing,
                             options.batches * sequences_per_batch);
  if (balancer.regroups()) {
    return study_regrouped(in, balancer, sequences, sequences_per_batch, options, step_done);
  }
  BalancerStudy out;
  out.balancer = balancer;
  EvaluationScratch scratch;
  BatchTotals totals;
  // Code without a document mask attends over the whole packed sequence: every step is the
  // one-document step.
  std::optional<Evaluation> unmasked;
  double unmasked_imbalance = 1.0;
  if (!balancer.masked) {
    unmasked = evaluate(in, EvaluateOptions{}, scratch);
    out.memory.peak_bytes = unmasked->report.peak_memory_bytes;
    out.memory.fits = unmasked->report.fits();
    unmasked_imbalance =
        sim::document_work(models::PackedSequence{{sequence_tokens}, 1}, sequence_tokens, ring,
                           balancer.layout, sim::DocumentSplit::kSequence)
            .imbalance();
  }
  // Several micro-batches (without pipeline stages): each its own sequence, composed from
  // one-micro-batch steps (micro_batch_s) as the replicas synchronise.
  const int micro_batches = in.parallel.micro_batches;
  const bool composed = balancer.masked && micro_batches > 1 && in.parallel.pp_degree == 1;
  sim::ScheduleInputs one = in;
  one.parallel.micro_batches = 1;
  auto micro_batch_s = [&](sim::DocumentWork w) {
    sim::ScheduleInputs x = one;
    x.documents = std::move(w);
    const double one_s = out.memory.step_s(x, scratch);
    x.parallel.micro_batches = 2;
    return out.memory.step_s(x, scratch) - one_s;
  };
  const double outside_micro_batches_s =
      composed ? out.memory.step_s(one, scratch) - micro_batch_s({}) : 0.0;
  const int replicas = sequences_per_batch / micro_batches;
  for (int b = 0; b < options.batches; ++b) {
    std::int64_t real_tokens = 0;
    sim::DocumentWork slowest;
    double slowest_work = -1.0;
    // Per replica and micro-batch (sequence s = replica × M + micro-batch), when composed.
    std::vector<double> sequence_s;
    for (int s = 0; s < sequences_per_batch; ++s) {
      const models::PackedSequence& seq =
          sequences[static_cast<std::size_t>(b * sequences_per_batch + s)];
      real_tokens += seq.real_tokens();
      totals.documents += static_cast<std::int64_t>(seq.documents.size());
      sim::DocumentWork w =
          sim::document_work(seq, sequence_tokens, ring, balancer.layout, balancer.split);
      if (composed) {
        sequence_s.push_back(micro_batch_s(w));
      }
      if (const double work = w.busiest_work(); work > slowest_work) {
        slowest_work = work;
        slowest = std::move(w);
      }
    }
    totals.real_tokens += real_tokens;
    double step_s = 0.0;
    if (unmasked) {
      out.imbalance.push_back(unmasked_imbalance);
      step_s = unmasked->report.step_time_s;
    } else if (composed) {
      out.imbalance.push_back(slowest.imbalance());
      step_s = outside_micro_batches_s +
               composed_micro_batches_s(sequence_s, replicas, micro_batches, in.recipe.zero_stage);
    } else {
      out.imbalance.push_back(slowest.imbalance());
      in.documents = std::move(slowest);
      step_s = out.memory.step_s(in, scratch);
    }
    out.step_s.push_back(step_s);
    out.tokens_per_s.push_back(static_cast<double>(real_tokens) / step_s);
    if (step_done) {
      step_done();
    }
  }
  summarize_study(out, totals, sequences.size(), sequence_tokens, options);
  return out;
}

}  // namespace

std::vector<LoadBalancer> load_balancers(const sim::ScheduleInputs& in) {
  const sim::LayoutCheck checked = sim::checked_layout(in);
  std::vector<NamedBalancer> method;
  if (checked.layout.ring == 1) {
    method.push_back(kHeads);
  } else {
    method.assign(std::begin(kRingBalancers), std::end(kRingBalancers));
    if (hybrid_cp_refusal(in).empty()) {
      method.push_back(kHybridCp);
      method.push_back(kDynamicCp);
    }
    if (ptrr_refusal(in).empty()) {
      method.push_back(kPtrr);
    }
  }
  std::vector<LoadBalancer> out;
  if (checked.implementation == nullptr) {
    for (const NamedBalancer& b : method) {
      out.push_back(b.balancer);
    }
    return out;
  }
  const sim::Implementation& impl = *checked.implementation;
  const sim::DocumentMasking masking = impl.document_masking(in.parallel.method);
  switch (masking.kind) {
    case sim::DocumentMasking::Kind::kNotRead:
      throw sim::ConfigError(
          {sim::Quantity::kDocuments,
           fmt::format("packed documents under {}: {}; --impl none gives the {} scheme with a "
                       "document mask",
                       impl.name(), masking.source, models::to_string(in.parallel.method))},
          in.parallel);
    case sim::DocumentMasking::Kind::kAcrossDocuments:
      return {LoadBalancer{"unmasked", in.parallel.ring_layout, sim::DocumentSplit::kSequence,
                           masking.source, false}};
    case sim::DocumentMasking::Kind::kMasked:
      break;
  }
  for (const NamedBalancer& b : method) {
    if (std::find(masking.balancers.begin(), masking.balancers.end(), b.id) !=
        masking.balancers.end()) {
      out.push_back(b.balancer);
    }
  }
  if (out.empty()) {
    throw sim::ConfigError(
        {sim::Quantity::kDocuments,
         fmt::format("{} masks documents with no load balancer of {} ({})", impl.name(),
                     models::to_string(in.parallel.method), masking.source)},
        in.parallel);
  }
  return out;
}

LoadBalancer load_balancer(const sim::ScheduleInputs& in,
                           const std::string& name,
                           const std::string& field) {
  std::string names;
  for (const LoadBalancer& b : load_balancers(in)) {
    if (b.name == name) {
      return b;
    }
    names += (names.empty() ? "" : ", ") + std::string(b.name);
  }
  for (const auto& [balancer, refusal] :
       {std::pair{kHybridCp, &hybrid_cp_refusal}, std::pair{kDynamicCp, &hybrid_cp_refusal},
        std::pair{kPtrr, &ptrr_refusal}}) {
    if (name == balancer.balancer.name) {
      if (const std::string why = refusal(in); !why.empty()) {
        throw InputError(field, fmt::format("{} ({})", why, names));
      }
    }
  }
  throw InputError(
      field, fmt::format("'{}' is not a load balancer of this configuration ({})", name, names));
}

double quantile(std::vector<double> values, double q) {
  if (values.empty()) {
    return 0.0;
  }
  std::sort(values.begin(), values.end());
  const double at = q * static_cast<double>(values.size() - 1);
  const auto below = static_cast<std::size_t>(std::floor(at));
  const std::size_t above = std::min(below + 1, values.size() - 1);
  return values[below] + (at - static_cast<double>(below)) * (values[above] - values[below]);
}

BatchStudy study_batches(const sim::ScheduleInputs& in,
                         const BatchOptions& options,
                         const std::function<void(int, int)>& progress) {
  if (options.batches < 1) {
    throw InputError("batches", "at least one batch");
  }
  const sim::LayoutCheck checked = sim::checked_layout(in);
  const auto ring = static_cast<int>(checked.layout.ring);
  // What the configuration's code runs, checked before anything is sampled.
  const std::vector<LoadBalancer> applicable = load_balancers(in);
  const std::vector<LoadBalancer>& balancers =
      options.balancers.empty() ? applicable : options.balancers;

  BatchStudy study;
  study.sequences_per_batch = in.parallel.data_parallel() * in.parallel.micro_batches;
  const Evaluation one = evaluate(in);
  study.one_document_step_s = one.report.step_time_s;
  study.one_document_tokens_per_s =
      static_cast<double>(one.report.tokens_per_step) / one.report.step_time_s;
  const int total = options.batches * static_cast<int>(balancers.size());
  int done = 0;
  for (const LoadBalancer& b : balancers) {
    study.balancers.push_back(study_one(in, b, ring, study.sequences_per_batch, options, [&] {
      if (progress) {
        progress(++done, total);
      }
    }));
  }
  const bool any_fits = std::any_of(study.balancers.begin(), study.balancers.end(),
                                    [](const BalancerStudy& b) { return b.memory.fits; });
  std::optional<std::size_t> best;
  for (std::size_t i = 0; i < study.balancers.size(); ++i) {
    const BalancerStudy& b = study.balancers[i];
    if ((b.memory.fits || !any_fits) &&
        (!best || b.objective_tokens_per_s > study.balancers[*best].objective_tokens_per_s)) {
      best = i;
    }
  }
  study.recommended = best.value_or(0);
  return study;
}

std::vector<BatchRanking> rank_by_batches(const sim::ScheduleInputs& base,
                                          const std::vector<Candidate>& candidates,
                                          const BatchOptions& options,
                                          const std::function<void(int, int)>& progress) {
  std::vector<BatchRanking> answered, refused;
  int done = 0;
  const auto total = static_cast<int>(candidates.size());
  for (std::size_t c = 0; c < candidates.size(); ++c) {
    BatchRanking r;
    r.candidate = c;
    try {
      r.study = study_batches(candidates[c].inputs(base), options);
      if (const StepsMemory& m = r.study.best().memory; !m.fits) {
        r.refused = fmt::format("does not fit under packed batches (peak {:.1f} GiB)",
                                static_cast<double>(m.peak_bytes) / (1024.0 * 1024.0 * 1024.0));
      }
    } catch (const sim::ConfigError& e) {
      r.refused = e.what();
    }
    (r.refused.empty() ? answered : refused).push_back(std::move(r));
    if (progress) {
      progress(++done, total);
    }
  }
  std::stable_sort(
      answered.begin(), answered.end(), [](const BatchRanking& a, const BatchRanking& b) {
        return a.study.best().objective_tokens_per_s > b.study.best().objective_tokens_per_s;
      });
  answered.insert(answered.end(), std::make_move_iterator(refused.begin()),
                  std::make_move_iterator(refused.end()));
  return answered;
}

std::vector<Candidate> batch_candidates(const sim::ScheduleInputs& base,
                                        const std::vector<Candidate>& ranked,
                                        std::size_t count,
                                        std::size_t scan) {
  auto applies = [&](const Candidate& c) {
    try {
      load_balancers(c.inputs(base));
      return true;
    } catch (const sim::ConfigError&) {
      return false;
    }
  };
  std::vector<Candidate> out;
  std::size_t found = 0;
  for (std::size_t i = 0; i < ranked.size() && i < scan && found < count; ++i) {
    const Candidate& c = ranked[i];
    if (applies(c)) {
      out.push_back(c);
      ++found;
    }
    const sim::Implementation* own = sim::checked_layout(c.inputs(base)).implementation;
    for (const sim::Implementation* impl : sim::implementations()) {
      if (impl == own || !impl->runs(c.parallel.method) ||
          impl->document_masking(c.parallel.method).kind != sim::DocumentMasking::Kind::kMasked) {
        continue;
      }
      Candidate variant = c;
      variant.parallel.implementation = std::string(impl->name());
      variant.label = fmt::format("{} [{}]", c.label, impl->name());
      try {
        variant.report = evaluate(variant.inputs(base)).report;
      } catch (const sim::ConfigError&) {
        continue;  // the implementation refuses this configuration
      }
      if (variant.report.fits() && applies(variant)) {
        variant.fits = true;
        variant.evaluated = true;
        out.push_back(std::move(variant));
      }
    }
  }
  return out;
}

const char* to_string(BatchObjective o) {
  return o == BatchObjective::kP50 ? "p50" : "p95";
}

BatchObjective parse_batch_objective(const std::string& text, const std::string& field) {
  if (text == "p50") {
    return BatchObjective::kP50;
  }
  if (text == "p95") {
    return BatchObjective::kP95;
  }
  throw InputError(field, fmt::format("expected p50 or p95, got '{}'", text));
}

}  // namespace cpsim::planner
