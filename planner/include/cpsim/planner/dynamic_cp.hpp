#pragma once
/// @file Megatron-LM's dynamic context parallelism (`--dynamic-context-parallel`, the `dev`
/// branch's successor of hybrid CP, not in a megatron-core release): the documents of a step are
/// scheduled into micro-batches; in each, every rank belongs to one power-of-two CP group that
/// runs its documents packed (THD, each document split head-tail over the group). A group's
/// micro-batch starts when all its ranks are done with their previous one; no barrier over DP × CP
/// until the gradients. REFERENCES.md [DynamicCP-Megatron]; docs/PACKING.md, "Dynamic CP".

#include <cstdint>
#include <vector>

#include "cpsim/planner/evaluate.hpp"
#include "cpsim/planner/hybrid_cp.hpp"
#include "cpsim/sim/schedule_inputs.hpp"

namespace cpsim::planner {

/// DefaultDynamicCPScheduler.get_groups_and_subsamples over `documents` (token counts) on `ranks`
/// DP × CP ranks with `max_tokens_per_rank` (`--max-seqlen-per-dp-cp-rank`): the micro-batches in
/// order, each a HybridCpRound whose groups run their documents packed. Requires a power-of-two
/// `ranks` and every document's CP size (hybrid_cp_size) at most `ranks`; @throws
/// std::invalid_argument otherwise.
std::vector<HybridCpRound> schedule_dynamic_cp(const std::vector<std::int64_t>& documents,
                                               int ranks,
                                               std::int64_t max_tokens_per_rank);

/// Times steps of one configuration (ring CP of degree C over R = DP × C ranks, sequences of S
/// tokens, each document padded to a multiple of 2R·T) under dynamic CP. A group of g ranks with
/// documents D costs one micro-batch of the step at CP degree g over the packed D with a
/// per-document split (the step with two such micro-batches less the step with one). Each rank
/// starts a micro-batch when every rank of its group is done with its previous one; the step is
/// the last rank's finish plus what the configuration's own step holds outside its micro-batch.
class DynamicCpTimer {
 public:
  /// `in`: the configuration, method ring, power-of-two DP × C, no pipeline stages.
  explicit DynamicCpTimer(const sim::ScheduleInputs& in);

  /// `documents`: the spans of the step's sequences' documents, in order.
  HybridCpStep step(const std::vector<std::int64_t>& documents);

  /// One micro-batch of `group`: its documents packed on its ranks, forward and backward.
  double micro_batch_s(const HybridCpGroup& group);
  /// What the configuration's step holds outside its micro-batches (optimizer, last reduction).
  double outside_micro_batches_s() const { return outside_micro_batches_s_; }
  /// The memory of every group's step simulated so far.
  const StepsMemory& memory() const { return memory_; }

 private:
  sim::ScheduleInputs base_;
  int ranks_ = 0;
  std::int64_t max_tokens_per_rank_ = 0;
  std::int64_t span_multiple_ = 0;
  double outside_micro_batches_s_ = 0.0;
  StepsMemory memory_;
  EvaluationScratch scratch_;
};

}  // namespace cpsim::planner
