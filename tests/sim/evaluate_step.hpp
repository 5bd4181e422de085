#pragma once
// Test helper: build → simulate → summarise one configuration with the simulator alone (the sim
// tests do not link the planner). Same steps as planner::evaluate, without its reused buffers.

#include <memory>

#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/result.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim::test {

struct EvaluateOptions {
  bool keep_trace = false;  ///< keep the workload and the result (every rank is simulated)
  bool all_ranks = false;
  bool merge_ring_steps = true;
  bool explain_peak = false;  ///< fill Evaluation::peak (records op intervals)
  bool verify_graph = false;  ///< check_acyclic before simulating
  bool model_allocator = false;
};

struct Evaluation {
  StepReport report;
  std::shared_ptr<const Workload> workload;  ///< when keep_trace
  std::shared_ptr<const SimResult> result;   ///< when keep_trace
  PeakContents peak;                         ///< when explain_peak
};

inline Evaluation evaluate(const ScheduleInputs& inputs, const EvaluateOptions& options = {}) {
  BuildOptions build;
  build.all_ranks = options.keep_trace || options.all_ranks;
  build.merge_ring_steps = options.merge_ring_steps;
  auto workload = std::make_shared<Workload>(build_step(inputs, build));
  if (options.verify_graph) {
    check_acyclic(*workload);
  }
  // The allocator model replays the build a run without a trace would make (as the planner does).
  const bool allocator_apart = options.model_allocator && build.all_ranks != options.all_ranks;
  SimOptions sim_options;
  sim_options.record_trace = options.keep_trace || options.explain_peak;
  // A trace shows the reserved memory of its own run.
  sim_options.log_allocations = options.model_allocator && (!allocator_apart || options.keep_trace);
  auto result = std::make_shared<SimResult>(simulate(*workload, inputs.hardware, sim_options));
  Evaluation e;
  e.report = summarize(inputs, *workload, *result);
  if (allocator_apart) {
    BuildOptions plain = build;
    plain.all_ranks = options.all_ranks;
    const Workload w = build_step(inputs, plain);
    SimOptions logged;
    logged.log_allocations = true;
    const StepReport r = summarize(inputs, w, simulate(w, inputs.hardware, logged));
    e.report.reserved_peak_bytes = r.reserved_peak_bytes;
    e.report.allocator_cache_releases = r.allocator_cache_releases;
    e.report.allocator_out_of_memory = r.allocator_out_of_memory;
  }
  if (options.explain_peak) {
    e.peak = peak_contents(*workload, *result, e.report.peak_rank, 10);
  }
  if (options.keep_trace) {
    e.workload = std::move(workload);
    e.result = std::move(result);
  }
  return e;
}

}  // namespace cpsim::sim::test
