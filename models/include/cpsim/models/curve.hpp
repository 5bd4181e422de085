#pragma once
/// @file Piecewise-linear curves over a log2 axis, used for efficiency and throughput tables.

#include <memory>
#include <utility>
#include <vector>

namespace cpsim::models {

/// y(x) interpolated linearly in log2(x) between sorted points, clamped to the end values outside.
/// An empty curve evaluates to `fallback`. A curve does not change once made: its copies (every
/// copy of a hardware profile) share its points.
class LogCurve {
 public:
  LogCurve() = default;
  /// @throws InputError (field "points") if x values are not positive and strictly increasing.
  explicit LogCurve(std::vector<std::pair<double, double>> points);
  double operator()(double x, double fallback = 1.0) const;
  const std::vector<std::pair<double, double>>& points() const;
  bool empty() const { return data_ == nullptr; }

 private:
  struct Data {
    std::vector<std::pair<double, double>> points;
    std::vector<double> log_x;
  };
  std::shared_ptr<const Data> data_;  ///< null for an empty curve
};

}  // namespace cpsim::models
