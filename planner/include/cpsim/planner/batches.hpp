#pragma once
/// @file Step time over real batches: documents of sampled lengths packed into sequences, each
/// sequence split over the CP ranks by a load balancer, the step simulated with every rank's
/// attention under the document mask (sim/document_work.hpp). The answer is a distribution over
/// seeded batches, per load balancer, beside the one-document step (docs/PACKING.md).

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "cpsim/models/documents.hpp"
#include "cpsim/planner/hybrid_cp.hpp"
#include "cpsim/sim/document_work.hpp"
#include "cpsim/sim/schedule_inputs.hpp"

namespace cpsim::planner {

struct Candidate;  // search.hpp

/// How a packed sequence's tokens go to the ranks of a ring.
struct LoadBalancer {
  /// "head-tail", "contiguous", "per-document", "heads"; "unmasked" for code that attends across
  /// documents (every batch is then the one-document step).
  std::string_view name;
  models::RingLayout layout = models::RingLayout::kZigzag;
  sim::DocumentSplit split = sim::DocumentSplit::kSequence;
  std::string_view runs;  ///< who splits this way, or where the code says it does not mask
  bool masked = true;
  /// Megatron's hybrid or dynamic CP: the step's documents regrouped over DP × CP ranks
  /// (planner/hybrid_cp.hpp, planner/dynamic_cp.hpp); `layout` and `split` are each group's.
  enum class Regroup : std::uint8_t { kNone, kHybridCp, kDynamicCp };
  Regroup regroup = Regroup::kNone;
  bool regroups() const { return regroup != Regroup::kNone; }
};

/// The load balancers that apply to `in`: the method's (head-tail, contiguous and per-document
/// with a ring part, "heads" without one) that its implementation runs with a document mask
/// (Implementation::document_masking; all of them for the scheme alone), or "unmasked" when its
/// code attends across documents.
/// @throws sim::ConfigError for a refused configuration, or an implementation whose handling of
/// packed documents was not read (Quantity::kDocuments).
std::vector<LoadBalancer> load_balancers(const sim::ScheduleInputs& in);
/// @throws InputError naming `field` for a name load_balancers(in) does not list.
LoadBalancer load_balancer(const sim::ScheduleInputs& in,
                           const std::string& name,
                           const std::string& field);

/// What ranks configurations and load balancers: document tokens per second at the p50 or at the
/// p95 step time (document tokens per step, averaged, over that step time).
enum class BatchObjective : std::uint8_t { kP50, kP95 };
const char* to_string(BatchObjective o);
/// @throws InputError naming `field`.
BatchObjective parse_batch_objective(const std::string& text, const std::string& field);

struct BatchOptions {
  models::LengthDistribution lengths;
  models::Packing packing = models::Packing::kConcat;
  int batches = 100;
  std::uint64_t seed = 0;
  /// Empty: every load balancer of load_balancers(in).
  std::vector<LoadBalancer> balancers;
  BatchObjective objective = BatchObjective::kP50;
};

/// The distribution under one load balancer.
struct BalancerStudy {
  LoadBalancer balancer;
  std::vector<double> step_s;        ///< per batch, in batch order
  std::vector<double> imbalance;     ///< per batch: busiest ring position's attention / mean
  std::vector<double> tokens_per_s;  ///< per batch: the step's document tokens / its time
  /// Hybrid and dynamic CP only: per batch, the scheduler's rounds (micro-batches).
  std::vector<std::vector<HybridCpRound>> hybrid_cp_rounds;
  double p50_s = 0.0, p95_s = 0.0, max_s = 0.0;
  double tokens_per_s_p50 = 0.0;
  double imbalance_p50 = 0.0, imbalance_max = 0.0;
  double padding_share = 0.0;  ///< tokens of the sequences that are padding
  double documents_per_sequence = 0.0;
  double document_tokens_per_step = 0.0;  ///< averaged over the batches
  /// document_tokens_per_step over the objective's step time (p50 or p95).
  double objective_tokens_per_s = 0.0;
  /// The highest allocated peak of the steps simulated (hybrid and dynamic CP: of every group's),
  /// fixed overheads included; whether every one fits GPU and host memory.
  StepsMemory memory;
};

struct BatchStudy {
  double one_document_step_s = 0.0;  ///< the same configuration with one document a sequence
  double one_document_tokens_per_s = 0.0;
  int sequences_per_batch = 0;  ///< data-parallel replicas × micro-batches
  std::vector<BalancerStudy> balancers;
  /// Index in `balancers` of the highest objective_tokens_per_s among those whose steps fit
  /// (ties: the first listed; none fits: among all).
  std::size_t recommended = 0;
  const BalancerStudy& best() const { return balancers[recommended]; }
};

/// Samples options.batches batches (seeded: the same batches for the same seed), packs them and
/// simulates each step. A step holds one sequence per data-parallel replica and micro-batch; with
/// one micro-batch it is simulated with the sequence whose busiest ring position works most (the
/// slowest replica sets the step); with several and no pipeline stages each sequence is timed as
/// its own micro-batch and the step composed as the replicas synchronise (docs/PACKING.md); with
/// pipeline stages every micro-batch is given the slowest sequence, an upper bound.
/// `progress(done, total)` is called after each step simulated.
/// @throws sim::ConfigError for a refused configuration (FPDT, ...), InputError for lengths that
/// cannot be packed.
BatchStudy study_batches(const sim::ScheduleInputs& in,
                         const BatchOptions& options,
                         const std::function<void(int, int)>& progress = {});

/// The configurations of a plan under packed batches, best first by the objective.
struct BatchRanking {
  std::size_t candidate = 0;  ///< index into the candidates given
  BatchStudy study;           ///< empty balancers when refused
  std::string refused;        ///< why the configuration has no answer (FPDT, ...)
};
/// study_batches for each of `candidates` (the plan's, applied to `base`), ranked by their best
/// balancer's objective_tokens_per_s; refused ones (and those whose best balancer's steps do not
/// fit) last, in the order given.
std::vector<BatchRanking> rank_by_batches(const sim::ScheduleInputs& base,
                                          const std::vector<Candidate>& candidates,
                                          const BatchOptions& options,
                                          const std::function<void(int, int)>& progress = {});

/// The configurations a plan studies under packed batches: its `ranked` ones, best first, that
/// packed batches apply to (refused ones skipped) until `count` are found among the first `scan`,
/// each followed by the same configuration under every other implementation of its method whose
/// code masks documents (label suffixed " [NAME]"), simulated again and kept when it fits.
std::vector<Candidate> batch_candidates(const sim::ScheduleInputs& base,
                                        const std::vector<Candidate>& ranked,
                                        std::size_t count,
                                        std::size_t scan = 50);

/// The q-quantile (0..1) of `values` by linear interpolation between order statistics.
double quantile(std::vector<double> values, double q);

}  // namespace cpsim::planner
