#include "cpsim/models/curve.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {

LogCurve::LogCurve(std::vector<std::pair<double, double>> points) {
  if (points.empty()) {
    return;
  }
  auto data = std::make_shared<Data>();
  data->points = std::move(points);
  const std::vector<std::pair<double, double>>& p = data->points;
  data->log_x.reserve(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) {
    const auto [x, y] = p[i];
    if (!std::isfinite(x) || x <= 0.0) {
      throw InputError("points",
                       fmt::format("point {}: x must be finite and positive, got {}", i, x));
    }
    if (!std::isfinite(y)) {
      throw InputError("points", fmt::format("point {}: y must be finite, got {}", i, y));
    }
    if (i > 0 && x <= p[i - 1].first) {
      throw InputError("points", fmt::format("point {}: x values must be strictly increasing ({} "
                                             "after {})",
                                             i, x, p[i - 1].first));
    }
    data->log_x.push_back(std::log2(x));
  }
  data_ = std::move(data);
}

const std::vector<std::pair<double, double>>& LogCurve::points() const {
  static const std::vector<std::pair<double, double>> kNoPoints;
  return data_ ? data_->points : kNoPoints;
}

double LogCurve::operator()(double x, double fallback) const {
  if (!data_) {
    return fallback;
  }
  const std::vector<std::pair<double, double>>& points = data_->points;
  const std::vector<double>& log_x = data_->log_x;
  // Non-positive and NaN x clamp to the first point, like any x below the table.
  if (!(x > points.front().first)) {
    return points.front().second;
  }
  if (x >= points.back().first) {
    return points.back().second;
  }
  const double lx = std::log2(x);
  // First knot strictly above lx, not the first knot (x is inside the table). An x just below the
  // last knot can round to the last knot's log2 (log2(2^40 − 1 ulp) is 40.0): then no knot is
  // above it, and the last interval holds it.
  const auto upper = std::upper_bound(log_x.begin(), log_x.end(), lx);
  const std::size_t hi = std::clamp<std::size_t>(
      static_cast<std::size_t>(std::distance(log_x.begin(), upper)), 1, log_x.size() - 1);
  const std::size_t lo = hi - 1;
  const double t = (lx - log_x[lo]) / (log_x[hi] - log_x[lo]);
  return points[lo].second + t * (points[hi].second - points[lo].second);
}

}  // namespace cpsim::models
