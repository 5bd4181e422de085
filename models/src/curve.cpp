#include "cpsim/models/curve.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {

LogCurve::LogCurve(std::vector<std::pair<double, double>> points) : points_(std::move(points)) {
  log_x_.reserve(points_.size());
  for (std::size_t i = 0; i < points_.size(); ++i) {
    const auto [x, y] = points_[i];
    if (!std::isfinite(x) || x <= 0.0) {
      throw InputError("points",
                       fmt::format("point {}: x must be finite and positive, got {}", i, x));
    }
    if (!std::isfinite(y)) {
      throw InputError("points", fmt::format("point {}: y must be finite, got {}", i, y));
    }
    if (i > 0 && x <= points_[i - 1].first) {
      throw InputError("points", fmt::format("point {}: x values must be strictly increasing ({} "
                                             "after {})",
                                             i, x, points_[i - 1].first));
    }
    log_x_.push_back(std::log2(x));
  }
}

double LogCurve::operator()(double x, double fallback) const {
  if (points_.empty()) {
    return fallback;
  }
  // Non-positive and NaN x clamp to the first point, like any x below the table.
  if (!(x > points_.front().first)) {
    return points_.front().second;
  }
  if (x >= points_.back().first) {
    return points_.back().second;
  }
  const double lx = std::log2(x);
  // First knot strictly above lx, not the first knot (x is inside the table). An x just below the
  // last knot can round to the last knot's log2 (log2(2^40 − 1 ulp) is 40.0): then no knot is
  // above it, and the last interval holds it.
  const auto upper = std::upper_bound(log_x_.begin(), log_x_.end(), lx);
  const std::size_t hi = std::clamp<std::size_t>(
      static_cast<std::size_t>(std::distance(log_x_.begin(), upper)), 1, log_x_.size() - 1);
  const std::size_t lo = hi - 1;
  const double t = (lx - log_x_[lo]) / (log_x_[hi] - log_x_[lo]);
  return points_[lo].second + t * (points_[hi].second - points_[lo].second);
}

}  // namespace cpsim::models
