#pragma once
/// @file evaluate() of a pipeline-parallel configuration (ParallelConfig::pp_degree > 1): one
/// stage simulated, the step composed from the schedule (docs/MODEL.md, "Pipeline parallelism").

#include "cpsim/planner/evaluate.hpp"

namespace cpsim::planner {

/// The simulations of one pipeline stage a pipelined step is composed from: with the LM head and
/// the loss (the last stage) with one micro-batch and with two, and without them (the stages
/// before it) with one. They depend only on the stage (its blocks, GPUs, CP/TP layout and
/// recipe), not on the schedule, the virtual stages or the micro-batch count, so that `plan`
/// shares them between the configurations that differ only in those.
struct StageRuns {
  Evaluation one;
  sim::StepReport two;
  Evaluation inner;
};

/// @pre inputs.parallel.pp_degree > 1 and check_head_layout(inputs) found nothing.
/// `options.stop_above_device_bytes` applies to the stage's own peak (the composed peak is at
/// least that): a run stopped there is not simulated with two micro-batches.
StageRuns simulate_pipeline_stage(const sim::ScheduleInputs& inputs,
                                  const EvaluateOptions& options,
                                  EvaluationScratch* scratch);

/// The runs apart (`plan` skips the second when no configuration of the stage fits). A run with
/// one micro-batch measures StepReport::forward_saved_bytes.
Evaluation simulate_pipeline_stage_one(const sim::ScheduleInputs& inputs,
                                       const EvaluateOptions& options,
                                       EvaluationScratch* scratch,
                                       sim::PipelineStage stage);
sim::StepReport simulate_pipeline_stage_two(const sim::ScheduleInputs& inputs,
                                            const EvaluateOptions& options,
                                            EvaluationScratch* scratch);

/// Whether the step of `inputs` fits, from its stage's one-micro-batch runs alone (the memory
/// does not depend on the second run).
bool pipeline_fits(const sim::ScheduleInputs& inputs,
                   const sim::StepReport& one,
                   const sim::StepReport& inner);

/// The step of `inputs` composed from its stage's runs (a stage group composes each member's
/// from the same runs).
Evaluation compose_pipeline(const sim::ScheduleInputs& inputs, const StageRuns& runs);

/// As evaluate(); `scratch` may be null. @pre inputs.parallel.pp_degree > 1.
/// @throws sim::ConfigError for refused configurations.
Evaluation evaluate_pipeline(const sim::ScheduleInputs& inputs,
                             const EvaluateOptions& options,
                             EvaluationScratch* scratch);

}  // namespace cpsim::planner
