#pragma once
/// @file Piecewise-linear curves over a log2 axis, used for efficiency and throughput tables.

#include <utility>
#include <vector>

namespace cpsim::models {

/// y(x) interpolated linearly in log2(x) between sorted points, clamped to the end values outside.
/// An empty curve evaluates to `fallback`.
class LogCurve {
 public:
  LogCurve() = default;
  /// @throws InputError (field "points") if x values are not positive and strictly increasing.
  explicit LogCurve(std::vector<std::pair<double, double>> points);
  double operator()(double x, double fallback = 1.0) const;
  const std::vector<std::pair<double, double>>& points() const { return points_; }
  bool empty() const { return points_.empty(); }

 private:
  std::vector<std::pair<double, double>> points_;
  std::vector<double> log_x_;
};

}  // namespace cpsim::models
