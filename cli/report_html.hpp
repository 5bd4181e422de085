#pragma once
// `cpsim report`: the data of a method × length sweep and its rendering as one self-contained HTML
// page (inline CSS and SVG; no scripts, fonts or images fetched from anywhere). Equal inputs give
// byte-identical pages: nothing depends on the clock, the locale or hash order.

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "cpsim/planner/batches.hpp"
#include "cpsim/planner/evaluate.hpp"
#include "cpsim/planner/maxlen.hpp"

namespace cpsim::cli {

/// One (method, length) evaluation of a sweep.
struct SweepPoint {
  std::int64_t seq_len = 0;
  std::string error;  ///< non-empty: the method cannot run at this length (the reason)
  sim::StepReport report;
};

/// One method of a sweep: its resolved configuration, the points, and (report) its longest context.
struct MethodSweep {
  std::string method;  ///< ulysses, upipe, ring, allgather, fpdt, usp
  std::string error;   ///< non-empty: the method cannot run this configuration at any length
  sim::ScheduleInputs inputs;
  std::string degrees;             ///< "Ulysses 8, U=8 (4 stages)"
  std::vector<SweepPoint> points;  ///< one per length of the sweep, in order
  bool has_max = false;            ///< max context searched
  std::string max_error;           ///< the search could not run (the reason)
  planner::MaxLenResult max;
};

/// The step shown in the memory and timeline charts (one rank: rank 0).
struct StepDetail {
  std::string method;
  std::int64_t seq_len = 0;
  planner::Evaluation evaluation;  ///< with the trace (workload, intervals, memory samples)
};

/// `report --lengths`: the step over packed batches of the detail configuration.
struct BatchDetail {
  std::string method;
  std::int64_t seq_len = 0;
  planner::BatchOptions options;
  planner::BatchStudy study;
};

struct ReportPage {
  std::string title;
  std::string version;                ///< "cpsim 0.1.0"
  std::vector<std::int64_t> lengths;  ///< swept lengths, increasing
  std::vector<MethodSweep> methods;
  std::int64_t max_granularity = 0;    ///< length step of the max-context search
  std::optional<StepDetail> detail;    ///< absent when no method runs at any length
  std::optional<BatchDetail> batches;  ///< with --lengths
};

/// The whole page.
std::string render_report_html(const ReportPage& page);

/// Number of points of the memory chart after downsampling (at most 2000; exposed for tests).
inline constexpr int kMaxMemoryPoints = 2000;

}  // namespace cpsim::cli
