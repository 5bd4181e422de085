#pragma once
// What `cpsim report` shows, reduced from a ReportPage: memory by category over one step, the time
// each op class covers per stream, the series of the length charts and the set-up rows. Drawing
// (SVG/HTML) is in report_html.cpp. Categories, op kinds and phases come from the enums of sim/
// and models/ (their counts and to_string), never from lists whose order must match them.

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cpsim/models/hardware.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/workload.hpp"

#include "report_html.hpp"

namespace cpsim::cli {

/// Bytes as the report prints them ("12.3 GiB").
std::string gib(double bytes);

// ---- Memory over one step -----------------------------------------------------------------------

/// Bands of the memory chart, bottom to top: the fixed overhead (CUDA context, NCCL buffers, cuBLAS
/// workspace), then one per sim::MemCategory in enum order.
inline constexpr int kMemoryBandCount = 1 + sim::kMemCategoryCount;

struct MemoryBand {
  bool fixed = true;  ///< the fixed overhead; else `category`
  sim::MemCategory category = sim::MemCategory::kModelStates;
};
constexpr MemoryBand memory_band(int band) {
  return band == 0 ? MemoryBand{} : MemoryBand{false, static_cast<sim::MemCategory>(band - 1)};
}
/// "fixed", else the category's sim::to_string.
std::string_view memory_band_name(int band);

/// Rank 0's device memory by band at time `t` (the model-states band includes the static sharded
/// states).
struct MemPoint {
  SimTime t = 0;
  std::array<double, kMemoryBandCount> v{};
  double total() const;
};

struct MemorySeries {
  std::vector<MemPoint> points;  ///< downsampled, starting at 0, equal neighbours merged
  int states = 0;                ///< distinct memory states before downsampling
};

/// Rank 0's memory over the step, downsampled to the upper envelope of `buckets_wanted` equal time
/// buckets (at most kMaxMemoryPoints): each bucket shows the highest total it reaches.
MemorySeries memory_series(const sim::Workload& w, const sim::SimResult& r, int buckets_wanted);

// ---- Step timeline ------------------------------------------------------------------------------

/// A bar class of the timeline: an op kind, with collectives split by collective kind.
struct OpClass {
  sim::OpKind kind = sim::OpKind::kGemm;
  models::Collective collective = models::Collective::kAllToAll;  ///< kind kCollective only
};
inline constexpr int kOpClassCount = sim::kOpKindCount - 1 + models::kCollectiveCount;

/// Position of a class: sim::OpKind order with kCollective expanded in models::Collective order.
constexpr int op_class_index(OpClass c) {
  const int kind = static_cast<int>(c.kind);
  constexpr int kCollectiveKind = static_cast<int>(sim::OpKind::kCollective);
  if (kind < kCollectiveKind) {
    return kind;
  }
  if (kind == kCollectiveKind) {
    return kind + static_cast<int>(c.collective);
  }
  return kind - 1 + models::kCollectiveCount;
}

/// Every class, in index order.
constexpr std::array<OpClass, kOpClassCount> all_op_classes() {
  std::array<OpClass, kOpClassCount> out{};
  std::size_t i = 0;
  for (int k = 0; k < sim::kOpKindCount; ++k) {
    const auto kind = static_cast<sim::OpKind>(k);
    if (kind != sim::OpKind::kCollective) {
      out[i++] = OpClass{kind};
      continue;
    }
    for (int c = 0; c < models::kCollectiveCount; ++c) {
      out[i++] = OpClass{kind, static_cast<models::Collective>(c)};
    }
  }
  return out;
}

/// The class of one op (a collective without a group counts as all-to-all).
OpClass op_class(const sim::Workload& w, const sim::Op& op);
/// Legend name: "GEMM", "attention fwd", ..., "all-to-all", ..., "copy H2D".
std::string_view op_class_name(OpClass c);

/// Time (ns) each op class covers in each pixel column of rank 0's streams, and each phase on the
/// compute stream.
struct TimelineCoverage {
  int columns = 1;
  double column_ns = 1.0;
  /// [stream][column][op class index]
  std::vector<std::vector<std::array<double, kOpClassCount>>> by_class;
  /// [column][phase]
  std::vector<std::array<double, sim::kPhaseCount>> by_phase;
  std::array<bool, kOpClassCount> used{};  ///< classes with at least one op of rank 0
  std::int64_t ops = 0;                    ///< ops of rank 0 that take time
};
TimelineCoverage timeline_coverage(const sim::Workload& w, const sim::SimResult& r, int columns);

// ---- Throughput and peak vs length --------------------------------------------------------------

struct SeriesPoint {
  std::int64_t seq = 0;
  double value = 0;
  bool fits = true;
  std::string tip;
};

struct Series {
  std::string name;
  std::size_t method_index = 0;  ///< position in ReportPage::methods (for its colour)
  std::vector<SeriesPoint> points;
};

struct LengthSeries {
  std::vector<Series> throughput;  ///< tokens/s per GPU
  /// Throughput in % of the fastest method that fits at the same length (of the fastest
  /// simulated where none fits): methods within a few % of each other stay apart.
  std::vector<Series> relative_throughput;
  std::vector<Series> peak;        ///< peak GPU memory in GiB
  std::vector<std::string> notes;  ///< methods and points that cannot run
  double usable_gib = 0;           ///< the largest GPU capacity less the margin of any point
};
LengthSeries length_series(const ReportPage& page);

// ---- Configuration ------------------------------------------------------------------------------

/// The set-up table (label, text), from the first method that runs; empty when none does.
std::vector<std::pair<std::string, std::string>> setup_rows(const ReportPage& page);

}  // namespace cpsim::cli
