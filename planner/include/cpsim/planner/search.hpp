#pragma once
/// @file Configuration search: methods × CP factorisations (Ulysses × ring, data-parallel
/// remainder) × UPipe heads per stage × FPDT chunk × recipe knobs, ranked by throughput at a given
/// length or by the longest context. Cheap memory lower bounds prune before simulating.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cpsim/planner/emit.hpp"
#include "cpsim/planner/maxlen.hpp"

namespace cpsim::planner {

/// What the user fixed on the command line: the search keeps these values instead of varying
/// them. A structural value applies only to the methods that read it (heads per stage: UPipe;
/// the chunk: FPDT; the Ulysses degree: methods with a Ulysses part; the ring degree and layout:
/// methods with a ring part); 0 / false = searched.
struct PlanConstraints {
  int tp_degree = 0;  ///< 0: every T dividing the GPUs of a node, the heads and the KV heads
  /// 0: for a mixture of experts every E_p dividing the experts and a stage's GPUs (across nodes
  /// too); 1 for a dense model.
  int ep_degree = 0;
  /// 0: every P dividing the GPUs whose stages split the blocks (evenly, or with one block fewer
  /// on the first and last stage) for the implementations that run PP; 1 when nothing lets the
  /// step grow to P micro-batches (see micro_batches).
  int pp_degree = 0;
  /// The pipeline schedule kept (else 1F1B and interleaved with V = 2, 4, 8 where V divides
  /// every stage's blocks) and its V (0: searched).
  std::optional<models::PipelineSchedule> pp_schedule;
  int virtual_stages = 0;
  int pp_first_stage_layers = 0;  ///< uneven stages kept (both 0: searched)
  int pp_last_stage_layers = 0;
  /// Micro-batches per step kept for every candidate; 0: the base's without PP, and with PP > 1
  /// P (longest context) or P, 2P, 4P (--seq) when the step may hold more sequences than the
  /// base's: --seq with allow_data_parallel, or a PP degree the user fixed.
  int micro_batches = 0;
  int cp_degree = 0;
  int ulysses_degree = 0;
  int ring_degree = 0;
  std::int64_t heads_per_stage = 0;
  std::int64_t fpdt_chunk = 0;
  bool ring_layout = false;  ///< keep the base's ring layout (else zigzag)
  // Recipe knobs kept at the base recipe's value in the --seq search (vary_recipe).
  bool zero_stage = false;
  bool checkpointing = false;
  bool checkpoint_offload = false;
  bool tiled_mlp = false;
  bool fused_loss = false;
};

struct PlanOptions {
  std::vector<models::CpMethod> methods;  ///< empty = all
  PlanConstraints fixed;                  ///< values the search keeps
  std::optional<std::int64_t> seq_len;    ///< rank by throughput at this length; else max context
  std::int64_t granularity = 64 * 1024;   ///< max-context mode
  double max_step_time_s = 0;  ///< max-context mode: above 0, MaxLenOptions::max_step_time_s
  bool vary_recipe = true;     ///< --seq mode: also search AC/offload, tiled MLP, fused loss, ZeRO
  /// --seq mode: also search CP groups smaller than the GPU count, the rest data parallel. That
  /// multiplies the tokens of a step (the global batch), so only when the user allows it; a fixed
  /// CP, Ulysses or ring degree below the GPU count is the user's own choice of it.
  bool allow_data_parallel = false;
  /// Search only what this launcher runs from the file cpsim emits for it: the methods it runs,
  /// each recipe as the file makes it run (recipe_as_run); the emitted file is then what was
  /// simulated. nullopt: every method, the recipes as given.
  std::optional<LauncherFormat> launcher;
  int threads = 2;
  int top = 5;
  RefusalText refusal_text;  ///< candidates' errors (see MaxLenOptions)
  /// Keep every configuration generated, with what became of it (PlanResult::all).
  bool keep_all = false;
  /// Called as the candidates' evaluations end, from the plan's threads one call at a time: the
  /// candidates evaluated so far and how many are to be (those neither refused nor pruned).
  std::function<void(std::int64_t done, std::int64_t total)> on_progress;
};

/// One configuration of the search: what it changes in the plan's base inputs (the model, the
/// hardware and the GPUs are the base's; a candidate does not copy them, so that ten thousand of
/// them cost little), and what its evaluation found.
struct Candidate {
  models::ParallelConfig parallel;  ///< at the plan's length, or at max_seq_len when it fits
  models::TrainingRecipe recipe;
  std::string label;  ///< "upipe u8 r1 U8 | ac full+offload, tiled, fused, zero3"
  /// Candidates with the same non-negative group differ only in the pipeline schedule, virtual
  /// stages or micro-batch count: one simulation of their stage serves them all (--seq).
  std::int64_t stage_group = -1;
  bool pruned = false;
  std::string prune_reason;
  bool evaluated = false;
  bool fits = false;
  /// The caching allocator was replayed at the answer (else it fits on its allocated peak, an
  /// upper bound of what fits): PlanResult checks every candidate it shows.
  bool reserved_checked = false;
  std::string error;             ///< configuration refused by the simulator
  sim::StepReport report;        ///< at the plan's length, or at max_seq_len
  std::int64_t max_seq_len = 0;  ///< max-context mode
  BindingConstraint binding;     ///< max-context mode

  /// The whole inputs of this configuration: `base` with its parallel configuration and recipe.
  sim::ScheduleInputs inputs(const sim::ScheduleInputs& base) const;
  /// The same written into `into` (already a copy of the base: only the two parts change).
  void apply_to(sim::ScheduleInputs& into) const;
};

/// The margin is the base's (ScheduleInputs::margin).
struct PlanResult {
  /// Fitting candidates, best first. Those shown (the first max(2, top), each method's best, the
  /// Pareto front) have their reserved memory checked; the others fit on their allocated peak.
  std::vector<Candidate> ranked;
  std::vector<Candidate> pareto;  ///< non-dominated (throughput vs peak, or vs max context)
  std::vector<Candidate> best_per_method;
  /// With PlanOptions::keep_all: every configuration generated, in generation order, as the plan
  /// left it (refused: `error`; pruned by the memory bound; evaluated, fitting or not).
  std::vector<Candidate> all;
  std::int64_t generated = 0, pruned = 0, evaluated = 0, refused = 0, simulations = 0;
  std::string why_best;  ///< why the best beats the runner-up
  /// When nothing fits: the candidate closest to fitting (smallest memory need against what is
  /// usable) and by how much it misses, or the first refusal when every candidate was refused.
  std::string closest_miss;
  /// Nothing was evaluated because every candidate was refused: the first refusal (the refusal
  /// text of PlanOptions, "--flag: why"); empty otherwise. Such a plan is bad input, not a miss.
  std::string every_candidate_refused;
  /// The methods searched that have no fitting configuration (not in best_per_method), in the
  /// order searched, each with why: its first refusal when every configuration of it was
  /// refused, else that none fits.
  struct MethodWithoutFit {
    models::CpMethod method;
    std::string why;
  };
  std::vector<MethodWithoutFit> methods_without_fit;
  bool max_context = false;
};

/// A lower bound of the simulated peak GPU memory, from what is certainly alive at two instants:
/// the unfused loss (logits, their gradient, the fp32 softmax workspace) and the MLP backward of
/// the last block (its gradients; untiled, its gate/up and product, recomputed under full AC). Both
/// add model states, fixed overheads and every block's saved tensors (checkpoints not offloaded;
/// with AC none/selective the block input, norm outputs, residual and untiled MLP intermediates).
/// With PP > 1 the larger of the same for the two stages simulated (sim::pipeline_stage_inputs
/// without and with the output layer), each with its saved tensors times its micro-batches in
/// flight (PipelineShape::activation_factor, last_stage_activation_factor). Tested ≤ the
/// simulation over methods, recipes and lengths; it only prunes, never ranks.
std::int64_t memory_lower_bound(const sim::ScheduleInputs& inputs);
/// The same with `scratch`, a copy of `inputs` with the same hardware profile, for the stage of a
/// pipeline (no copy of the profile per call).
std::int64_t memory_lower_bound(const sim::ScheduleInputs& inputs, sim::ScheduleInputs& scratch);

/// All candidate configurations of the space around `base` (its model, hardware, GPUs).
std::vector<Candidate> enumerate_candidates(const sim::ScheduleInputs& base,
                                            const PlanOptions& options);

PlanResult plan(const sim::ScheduleInputs& base, const PlanOptions& options);

/// Checks a candidate of a plan that PlanResult did not (reserved_checked false) the way it checks
/// those it shows; true when that lowered its longest context or it no longer fits.
bool check_reserved_memory(const sim::ScheduleInputs& base,
                           const PlanOptions& options,
                           Candidate& candidate,
                           bool max_context);

/// The candidates of `ranked` (best first, as PlanResult::ranked) that no other dominates: at
/// least as fast and at most as much peak memory, one strictly (`max_context`: at least as long a
/// context and as fast, one strictly), in ranked order.
std::vector<Candidate> pareto_front(const std::vector<Candidate>& ranked, bool max_context);

}  // namespace cpsim::planner
