#pragma once
/// @file Megatron-Core's hybrid context parallelism (`hybrid_context_parallel`, megatron-core
/// 0.16.1; renamed dynamic CP on its dev branch): the packed sequences of a step are unpacked into
/// their documents, and a scheduler gives every document its own CP group, a power of two of the
/// DP × CP ranks sized from its length, in rounds that each end with a barrier over DP × CP.
/// Each rank runs its documents of a round one after the other, one forward and backward each.
/// REFERENCES.md [HybridCP-Megatron]; docs/PACKING.md, "Hybrid CP".

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "cpsim/planner/evaluate.hpp"
#include "cpsim/sim/schedule_inputs.hpp"

namespace cpsim::planner {

/// One CP group of a round: ranks [first_rank, first_rank + cp) of DP × CP run `documents` (token
/// counts, in the scheduler's order), each over all `cp` ranks.
struct HybridCpGroup {
  int first_rank = 0;
  int cp = 0;
  std::vector<std::int64_t> documents;
  bool operator==(const HybridCpGroup&) const = default;
};

/// One round (Megatron's "group" of sub-samples): groups by rank, covering every rank; a barrier
/// over DP × CP closes it.
struct HybridCpRound {
  std::vector<HybridCpGroup> groups;
  bool operator==(const HybridCpRound&) const = default;
};

/// BalancedCPScheduler.gpus_needed: 2^⌈log2(length / max_tokens_per_rank)⌉, at least 1.
int hybrid_cp_size(std::int64_t length, std::int64_t max_tokens_per_rank);

/// BalancedCPScheduler.get_groups_and_subsamples over `documents` (token counts) on `ranks`
/// DP × CP ranks with `max_tokens_per_rank` (max_seqlen_per_dp_cp_rank): the rounds in order.
/// Requires a power-of-two `ranks` and every document's hybrid_cp_size at most `ranks` (else the
/// upstream code fails or never ends); @throws std::invalid_argument otherwise.
std::vector<HybridCpRound> schedule_hybrid_cp(const std::vector<std::int64_t>& documents,
                                              int ranks,
                                              std::int64_t max_tokens_per_rank);

/// The highest allocated peak (fixed overheads included) of the steps simulated, and whether
/// every one fits.
struct StepsMemory {
  std::int64_t peak_bytes = 0;
  bool fits = true;
  /// Simulates `in` in `scratch`, records its memory, returns its step time.
  double step_s(const sim::ScheduleInputs& in, EvaluationScratch& scratch);
};

/// One step under hybrid CP.
struct HybridCpStep {
  double step_s = 0.0;
  /// Σ over rounds of the busiest rank's attention work over Σ of the mean rank's: what the
  /// barriers make every rank wait for (1: balanced).
  double imbalance = 1.0;
  std::vector<HybridCpRound> rounds;
};

/// Times steps of one configuration (ring CP of degree C over R = DP × C ranks, sequences of S
/// tokens) under hybrid CP. A document of l tokens on a group of g ranks costs one micro-batch of a
/// one-document step at CP degree g and l tokens: the step with two micro-batches less the step
/// with one (the forward and backward without the optimizer). A step is Σ over rounds of its
/// busiest rank's documents, plus the part of the configuration's own step that is not a
/// micro-batch (its one-micro-batch step less one micro-batch of S tokens on C ranks), so one
/// document filling each sequence gives the configuration's step.
class HybridCpTimer {
 public:
  /// `in`: the configuration, method ring, power-of-two DP × C, no pipeline stages.
  /// @throws sim::ConfigError when the configuration is refused.
  explicit HybridCpTimer(const sim::ScheduleInputs& in);

  /// `documents`: the token counts of the step's sequences' documents, in order.
  /// @throws sim::ConfigError when a document's piece of the step is refused.
  HybridCpStep step(const std::vector<std::int64_t>& documents);

  int ranks() const { return ranks_; }
  std::int64_t max_tokens_per_rank() const { return max_tokens_per_rank_; }
  /// The memory of every group's step simulated so far.
  const StepsMemory& memory() const { return memory_; }

 private:
  double micro_batch_s(std::int64_t length, int cp);

  sim::ScheduleInputs base_;
  int ranks_ = 0;
  std::int64_t max_tokens_per_rank_ = 0;
  double outside_micro_batches_s_ = 0.0;
  std::map<std::pair<std::int64_t, int>, double> micro_batch_cache_;
  StepsMemory memory_;
  EvaluationScratch scratch_;
};

}  // namespace cpsim::planner
