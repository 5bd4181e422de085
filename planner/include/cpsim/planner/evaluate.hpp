#pragma once
/// @file Evaluating one configuration: build the step's op graph, check it, simulate it, summarise.
/// The unit of work of every search (maxlen, plan) and of `cpsim simulate`.

#include <memory>
#include <optional>
#include <vector>

#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/result.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::planner {

struct EvaluateOptions {
  bool keep_trace = false;  ///< keep the workload and per-op intervals for a trace file
  /// With keep_trace: the ranks the trace shows (index = rank; empty: every rank), whose memory
  /// samples are kept. Rank 0 alone of a schedule where every rank runs the same ops
  /// (sim::has_representative_rank) is simulated on the representative-rank path; otherwise every
  /// rank is simulated.
  std::vector<bool> trace_ranks{};
  bool all_ranks = false;        ///< simulate every rank even when one representative rank suffices
  bool merge_ring_steps = true;  ///< sim::BuildOptions::merge_ring_steps
  /// List the largest tensors live at the memory peak (Evaluation::peak); records op intervals.
  bool explain_peak = false;
  /// Check the op graph for cycles with Boost.Graph before simulating (tests; the engine also
  /// reports a stalled schedule instead of hanging).
  bool verify_graph = false;
  /// Replay the allocations through the caching-allocator model (StepReport::reserved_peak_bytes).
  bool model_allocator = false;
  /// With model_allocator, on the reused-scratch path: also the report of the same run without the
  /// replay (Evaluation::allocated_report), equal to what an evaluation without model_allocator
  /// reports.
  bool allocated_report_too = false;
  /// sim::SimOptions::stop_above_device_bytes: a search that drops configurations which do not
  /// fit stops simulating one as soon as its device memory passes this (0: never).
  std::int64_t stop_above_device_bytes = 0;
  /// sim::SimOptions::stop_above_host_bytes: likewise for a node's pinned host memory.
  std::int64_t stop_above_host_bytes = 0;
  /// Measure what one micro-batch holds between its forward and its backward
  /// (StepReport::forward_saved_bytes; a pipeline stage's run).
  bool measure_forward_saved = false;
};

struct Evaluation {
  sim::StepReport report;
  /// Present when keep_trace: the op graph and the simulation with intervals and memory samples.
  std::shared_ptr<const sim::Workload> workload;
  std::shared_ptr<const sim::SimResult> result;
  sim::PeakContents peak;  ///< when explain_peak: the 10 largest allocations at the peak
  /// When allocated_report_too: `report` without the caching allocator's replay.
  std::optional<sim::StepReport> allocated_report;
};

/// @throws sim::ConfigError for refused configurations, InputError for an invalid model or recipe.
Evaluation evaluate(const sim::ScheduleInputs& inputs, const EvaluateOptions& options = {});

/// Buffers that evaluate() reuses from call to call: one per thread of a search.
struct EvaluationScratch {
  sim::Workload workload;
  sim::Simulator simulator;
};

/// The same, building and simulating in `scratch` (the result does not depend on what `scratch`
/// held before). With keep_trace the workload is not reused (the Evaluation owns it).
Evaluation evaluate(const sim::ScheduleInputs& inputs,
                    const EvaluateOptions& options,
                    EvaluationScratch& scratch);

}  // namespace cpsim::planner
