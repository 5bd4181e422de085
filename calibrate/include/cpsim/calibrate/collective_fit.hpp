#pragma once
/// @file Fit of one collective's time-vs-size curve (one op, group size and span) as a piecewise
/// alpha-beta model, one (alpha, bandwidth) per protocol regime, with the regime boundaries chosen
/// from the data; with leave-one-out hold-out over every point (end points included) and outlier
/// detection (docs/CALIBRATION.md "Collectives"). CPU only.

#include <cstddef>
#include <span>
#include <string>
#include <vector>

namespace cpsim::calibrate {

/// One measured size: `size_bytes` in the nccl-tests convention, `wire_bytes` as the cost model
/// counts them (the regressor), `time_s` the measured time.
struct CollectivePoint {
  double size_bytes = 0.0;
  double wire_bytes = 0.0;
  double time_s = 0.0;
};

/// t = alpha_s + wire_bytes / bandwidth over sizes [first_size_bytes, last_size_bytes].
struct CollectiveRegime {
  double first_size_bytes = 0.0;
  double last_size_bytes = 0.0;
  double alpha_s = 0.0;                ///< >= 0
  double bandwidth_bytes_per_s = 0.0;  ///< +inf when time does not grow over the regime
  std::size_t points = 0;
};

/// A point that the fit refused: it disagrees with both the model fitted without it and its
/// neighbours, or breaks the non-decreasing order of time in size.
struct CollectiveOutlier {
  std::size_t index = 0;  ///< into the points given
  double size_bytes = 0.0;
  double measured_s = 0.0;
  double expected_s = 0.0;  ///< the model fitted without it
  std::string reason;
  /// measured / expected - 1.
  double deviation() const { return measured_s / expected_s - 1.0; }
};

struct CollectiveFitOptions {
  /// A point is an outlier when it is off by more than this fraction (in either direction, i.e.
  /// a factor 1 + x) from both its leave-one-out prediction and its neighbours' interpolation.
  double outlier_fraction = 0.5;
  /// Time may fall by this fraction from one size to the next (noise) before it counts as a
  /// violation of monotonicity.
  double monotone_tolerance = 0.1;
  std::size_t max_regimes = 4;
  std::size_t min_points_per_regime = 3;
};

struct CollectiveCurveFit {
  std::vector<CollectiveRegime> regimes;  ///< in size order, covering all points
  std::vector<CollectiveOutlier> outliers;
  std::vector<double> predicted_s;  ///< final model at every point (outliers too)
  /// Relative errors |predicted - measured| / measured (fractions). fit_*: the final model over
  /// all points; holdout_*: every point predicted by the model fitted without it, regimes chosen
  /// again (outliers by the final model, which excludes them), end points included.
  double fit_mape = 0.0;
  double fit_max = 0.0;
  double holdout_mape = 0.0;
  double holdout_max = 0.0;
  std::size_t held_out = 0;

  /// The model's time at a size (regime by size; below the first / above the last: the end one).
  double predict(double size_bytes, double wire_bytes) const;
};

/// @param points one per size, sorted by strictly increasing size, at least 2, times and bytes
///        positive and finite.
/// @throws InputError (field "samples") for fewer than 2 points, unsorted or invalid points.
CollectiveCurveFit fit_collective_curve(std::span<const CollectivePoint> points,
                                        const CollectiveFitOptions& options);

}  // namespace cpsim::calibrate
