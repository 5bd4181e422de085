#include "cpsim/planner/evaluate.hpp"

namespace cpsim::planner {
namespace {
constexpr std::size_t kPeakContentsListed = 10;
}  // namespace

Evaluation evaluate(const sim::ScheduleInputs& inputs, const EvaluateOptions& options) {
  sim::BuildOptions build;
  build.all_ranks = options.keep_trace || options.all_ranks;  // a trace shows every rank
  build.merge_ring_steps = options.merge_ring_steps;
  auto workload = std::make_shared<sim::Workload>(sim::build_step(inputs, build));
  if (options.verify_graph) {
    sim::check_acyclic(*workload);  // builders emit program order, so this is a test-time check
  }
  sim::SimOptions sim_options;
  sim_options.record_trace = options.keep_trace || options.explain_peak;
  auto result =
      std::make_shared<sim::SimResult>(sim::simulate(*workload, inputs.hardware, sim_options));
  Evaluation e;
  e.report = sim::summarize(inputs, *workload, *result);
  if (options.explain_peak) {
    e.peak = sim::peak_contents(*workload, *result, e.report.peak_rank, kPeakContentsListed);
  }
  if (options.keep_trace) {
    e.workload = std::move(workload);
    e.result = std::move(result);
  }
  return e;
}

Evaluation evaluate(const sim::ScheduleInputs& inputs,
                    const EvaluateOptions& options,
                    EvaluationScratch& scratch) {
  if (options.keep_trace) {
    return evaluate(inputs, options);
  }
  sim::BuildOptions build;
  build.all_ranks = options.all_ranks;
  build.merge_ring_steps = options.merge_ring_steps;
  sim::build_step(inputs, scratch.workload, build);
  if (options.verify_graph) {
    sim::check_acyclic(scratch.workload);
  }
  const sim::SimResult result = scratch.simulator.run(scratch.workload, inputs.hardware, {});
  Evaluation e;
  e.report = sim::summarize(inputs, scratch.workload, result);
  return e;
}

}  // namespace cpsim::planner
