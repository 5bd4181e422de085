#pragma once
/// @file Configuration search: methods × CP factorisations (Ulysses × ring, data-parallel
/// remainder) × UPipe heads per stage × FPDT chunk × recipe knobs, ranked by throughput at a given
/// length or by the longest context. Cheap memory lower bounds prune before simulating.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cpsim/planner/maxlen.hpp"

namespace cpsim::planner {

struct PlanOptions {
  std::vector<models::CpMethod> methods;  ///< empty = all
  std::optional<std::int64_t> seq_len;    ///< rank by throughput at this length; else max context
  std::int64_t memory_margin_bytes = 0;
  std::int64_t granularity = 64 * 1024;  ///< max-context mode
  bool vary_recipe = true;  ///< --seq mode: also search AC/offload, tiled MLP, fused loss, ZeRO
  int threads = 2;
  int top = 5;
};

struct Candidate {
  sim::ScheduleInputs inputs;
  std::string label;  ///< "upipe u8 r1 U8 | ac full+offload, tiled, fused, zero3"
  bool pruned = false;
  std::string prune_reason;
  bool evaluated = false;
  bool fits = false;
  std::string error;             ///< configuration refused by the simulator
  sim::StepReport report;        ///< at the plan's length, or at max_seq_len
  std::int64_t max_seq_len = 0;  ///< max-context mode
  BindingConstraint binding;     ///< max-context mode
};

struct PlanResult {
  std::vector<Candidate> ranked;  ///< fitting candidates, best first
  std::vector<Candidate> pareto;  ///< non-dominated (throughput vs peak, or vs max context)
  std::vector<Candidate> best_per_method;
  std::int64_t generated = 0, pruned = 0, evaluated = 0, refused = 0, simulations = 0;
  std::string why_best;  ///< why the best beats the runner-up
  bool max_context = false;
};

/// A lower bound of the simulated peak GPU memory, from what is certainly alive when the backward
/// of the last block starts: model states + fixed overheads + every block's saved tensors
/// (checkpoints not offloaded; with AC none/selective the block input, norm outputs and residual;
/// untiled MLP intermediates) + saved logits when the loss is not fused. Tested ≤ the simulation.
std::int64_t memory_lower_bound(const sim::ScheduleInputs& inputs);

/// All candidate configurations of the space around `base` (its model, hardware, GPUs).
std::vector<Candidate> enumerate_candidates(const sim::ScheduleInputs& base,
                                            const PlanOptions& options);

PlanResult plan(const sim::ScheduleInputs& base, const PlanOptions& options);

}  // namespace cpsim::planner
