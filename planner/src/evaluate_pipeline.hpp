#pragma once
/// @file evaluate() of a pipeline-parallel configuration (ParallelConfig::pp_degree > 1): one
/// stage simulated, the step composed from the schedule (docs/MODEL.md, "Pipeline parallelism").

#include "cpsim/planner/evaluate.hpp"

namespace cpsim::planner {

/// As evaluate(); `scratch` may be null. @pre inputs.parallel.pp_degree > 1.
/// @throws sim::ConfigError for refused configurations.
Evaluation evaluate_pipeline(const sim::ScheduleInputs& inputs,
                             const EvaluateOptions& options,
                             EvaluationScratch* scratch);

}  // namespace cpsim::planner
