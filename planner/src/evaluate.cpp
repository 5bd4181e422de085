#include "cpsim/planner/evaluate.hpp"

#include <algorithm>

#include "evaluate_pipeline.hpp"

namespace cpsim::planner {
namespace {
constexpr std::size_t kPeakContentsListed = 10;

// A trace of rank 0 alone needs no other rank when every rank runs the same ops.
bool trace_needs_all_ranks(const sim::ScheduleInputs& inputs, const EvaluateOptions& options) {
  if (!options.keep_trace) {
    return false;
  }
  const std::vector<bool>& ranks = options.trace_ranks;
  const bool rank0_only =
      !ranks.empty() && ranks[0] && std::find(ranks.begin() + 1, ranks.end(), true) == ranks.end();
  return !(rank0_only && sim::has_representative_rank(inputs));
}
}  // namespace

Evaluation evaluate(const sim::ScheduleInputs& inputs, const EvaluateOptions& options) {
  if (inputs.parallel.pp_degree > 1) {
    return evaluate_pipeline(inputs, options, nullptr);
  }
  sim::BuildOptions build;
  build.all_ranks = options.all_ranks || trace_needs_all_ranks(inputs, options);
  build.merge_ring_steps = options.merge_ring_steps;
  auto workload = std::make_shared<sim::Workload>(sim::build_step(inputs, build));
  if (options.verify_graph) {
    sim::check_acyclic(*workload);  // builders emit program order, so this is a test-time check
  }
  // Reserved memory depends on the order of allocations, which ties between ranks can permute: it
  // always comes from the build a run without a trace would make, so a trace changes no number.
  const bool allocator_apart = options.model_allocator && build.all_ranks != options.all_ranks;
  sim::SimOptions sim_options;
  sim_options.record_trace = options.keep_trace || options.explain_peak;
  sim_options.sampled_ranks = options.trace_ranks;
  // A trace shows the reserved memory of its own run.
  sim_options.log_allocations = options.model_allocator && (!allocator_apart || options.keep_trace);
  sim_options.stop_above_device_bytes = options.stop_above_device_bytes;
  sim_options.stop_above_host_bytes = options.stop_above_host_bytes;
  auto result =
      std::make_shared<sim::SimResult>(sim::simulate(*workload, inputs.hardware, sim_options));
  Evaluation e;
  e.report = sim::summarize(inputs, *workload, *result);
  if (options.measure_forward_saved) {
    e.report.forward_saved_bytes = sim::forward_saved_bytes(*workload, e.report.peak_rank);
  }
  if (allocator_apart) {
    sim::BuildOptions plain = build;
    plain.all_ranks = options.all_ranks;
    const sim::Workload w = sim::build_step(inputs, plain);
    sim::SimOptions logged;
    logged.log_allocations = true;
    const sim::StepReport r = sim::summarize(inputs, w, sim::simulate(w, inputs.hardware, logged));
    e.report.reserved_peak_bytes = r.reserved_peak_bytes;
    e.report.allocator_cache_releases = r.allocator_cache_releases;
    e.report.allocator_out_of_memory = r.allocator_out_of_memory;
    // The verdict follows the reserved memory: the plain run's.
    e.report.reserved_checked = r.reserved_checked;
    e.report.gpu_headroom_bytes = r.gpu_headroom_bytes;
    e.report.fits_gpu = r.fits_gpu;
    e.report.binding = r.binding;
  }
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
  if (inputs.parallel.pp_degree > 1) {
    return evaluate_pipeline(inputs, options, &scratch);
  }
  if (options.keep_trace || options.explain_peak) {
    return evaluate(inputs, options);
  }
  sim::BuildOptions build;
  build.all_ranks = options.all_ranks;
  build.merge_ring_steps = options.merge_ring_steps;
  sim::build_step(inputs, scratch.workload, build);
  if (options.verify_graph) {
    sim::check_acyclic(scratch.workload);
  }
  sim::SimOptions sim_options;
  sim_options.log_allocations = options.model_allocator;
  sim_options.stop_above_device_bytes = options.stop_above_device_bytes;
  sim_options.stop_above_host_bytes = options.stop_above_host_bytes;
  sim::SimResult result = scratch.simulator.run(scratch.workload, inputs.hardware, sim_options);
  Evaluation e;
  e.report = sim::summarize(inputs, scratch.workload, result);
  if (options.measure_forward_saved) {
    e.report.forward_saved_bytes = sim::forward_saved_bytes(scratch.workload, e.report.peak_rank);
  }
  if (options.model_allocator && options.allocated_report_too) {
    e.allocated_report =
        sim::summarize(inputs, scratch.workload, result, sim::AllocatorLogUse::kIgnoreLog);
  }
  scratch.simulator.recycle(std::move(result));
  return e;
}

}  // namespace cpsim::planner
