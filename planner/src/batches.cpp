#include "cpsim/planner/batches.hpp"

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
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

// Busiest ring position's visible area: what the slowest rank of a sequence computes.
double busiest_work(const sim::DocumentWork& w) {
  double busiest = 0.0;
  for (int i = 0; i < w.ring; ++i) {
    double row = 0.0;
    for (int j = 0; j < w.ring; ++j) {
      row += w.visible[static_cast<std::size_t>(i * w.ring + j)];
    }
    busiest = std::max(busiest, row);
  }
  return busiest;
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
  const std::int64_t span_multiple =
      balancer.split == sim::DocumentSplit::kPerDocument ? 2 * std::int64_t{ring} : 1;
  // The same document stream under every balancer: one sampler per balancer, the same seed.
  models::DocumentSampler sampler(options.lengths, options.seed);
  const std::vector<models::PackedSequence> sequences =
      models::pack_documents(sampler, sequence_tokens, span_multiple, options.packing,
                             options.batches * sequences_per_batch);
  BalancerStudy out;
  out.balancer = balancer;
  EvaluationScratch scratch;
  std::int64_t real_total = 0, documents = 0;
  // Code without a document mask attends over the whole packed sequence: every step is the
  // one-document step.
  std::optional<Evaluation> unmasked;
  double unmasked_imbalance = 1.0;
  if (!balancer.masked) {
    unmasked = evaluate(in, EvaluateOptions{}, scratch);
    unmasked_imbalance =
        sim::document_work(models::PackedSequence{{sequence_tokens}, 1}, sequence_tokens, ring,
                           balancer.layout, sim::DocumentSplit::kSequence)
            .imbalance();
  }
  for (int b = 0; b < options.batches; ++b) {
    std::int64_t real_tokens = 0;
    sim::DocumentWork slowest;
    double slowest_work = -1.0;
    for (int s = 0; s < sequences_per_batch; ++s) {
      const models::PackedSequence& seq =
          sequences[static_cast<std::size_t>(b * sequences_per_batch + s)];
      real_tokens += seq.real_tokens();
      documents += static_cast<std::int64_t>(seq.documents.size());
      sim::DocumentWork w =
          sim::document_work(seq, sequence_tokens, ring, balancer.layout, balancer.split);
      if (const double work = busiest_work(w); work > slowest_work) {
        slowest_work = work;
        slowest = std::move(w);
      }
    }
    real_total += real_tokens;
    double step_s = 0.0;
    if (unmasked) {
      out.imbalance.push_back(unmasked_imbalance);
      step_s = unmasked->report.step_time_s;
    } else {
      out.imbalance.push_back(slowest.imbalance());
      in.documents = std::move(slowest);
      step_s = evaluate(in, EvaluateOptions{}, scratch).report.step_time_s;
    }
    out.step_s.push_back(step_s);
    out.tokens_per_s.push_back(static_cast<double>(real_tokens) / step_s);
    if (step_done) {
      step_done();
    }
  }
  out.p50_s = quantile(out.step_s, 0.5);
  out.p95_s = quantile(out.step_s, 0.95);
  out.max_s = *std::max_element(out.step_s.begin(), out.step_s.end());
  out.tokens_per_s_p50 = quantile(out.tokens_per_s, 0.5);
  out.imbalance_p50 = quantile(out.imbalance, 0.5);
  out.imbalance_max = *std::max_element(out.imbalance.begin(), out.imbalance.end());
  out.document_tokens_per_step =
      static_cast<double>(real_total) / static_cast<double>(options.batches);
  out.objective_tokens_per_s = out.document_tokens_per_step /
                               (options.objective == BatchObjective::kP50 ? out.p50_s : out.p95_s);
  const double all_tokens =
      static_cast<double>(sequences.size()) * static_cast<double>(sequence_tokens);
  out.padding_share = 1.0 - static_cast<double>(real_total) / all_tokens;
  out.documents_per_sequence =
      static_cast<double>(documents) / static_cast<double>(sequences.size());
  return out;
}

}  // namespace

std::vector<LoadBalancer> load_balancers(const sim::ScheduleInputs& in) {
  const sim::LayoutCheck checked = sim::checked_layout(in);
  const std::span<const NamedBalancer> method =
      checked.layout.ring == 1 ? std::span<const NamedBalancer>(&kHeads, 1)
                               : std::span<const NamedBalancer>(kRingBalancers);
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
  for (std::size_t i = 1; i < study.balancers.size(); ++i) {
    if (study.balancers[i].objective_tokens_per_s >
        study.balancers[study.recommended].objective_tokens_per_s) {
      study.recommended = i;
    }
  }
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
