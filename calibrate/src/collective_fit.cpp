#include "cpsim/calibrate/collective_fit.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

namespace cpsim::calibrate {
namespace {

/// t = alpha + slope · wire, alpha >= 0, slope >= 0 (seconds per byte).
struct Line {
  double alpha = 0.0;
  double slope = 0.0;
  double at(double wire) const { return alpha + slope * wire; }
};

/// Least squares of the relative residuals (a + b·x − t) / t, with a >= 0 and b >= 0: the normal
/// equations of fit.cpp's weighted fit, solved in closed form on x scaled to [0, 1]; a bound that
/// the free solution violates is set to 0 and the other coefficient refitted.
Line fit_line(const std::vector<CollectivePoint>& pts) {
  double scale = 0.0;
  for (const CollectivePoint& p : pts) {
    scale = std::max(scale, p.wire_bytes);
  }
  scale = scale > 0.0 ? scale : 1.0;
  double s00 = 0.0, s01 = 0.0, s11 = 0.0, b0 = 0.0, b1 = 0.0;
  for (const CollectivePoint& p : pts) {
    const double w = 1.0 / p.time_s;
    const double x = p.wire_bytes / scale;
    s00 += w * w;
    s01 += w * w * x;
    s11 += w * w * x * x;
    b0 += w;
    b1 += w * x;
  }
  double a = b0 / s00;
  double b = 0.0;
  const double det = s00 * s11 - s01 * s01;
  if (pts.size() >= 2 && det > 1e-12 * s00 * s11) {
    a = (b0 * s11 - b1 * s01) / det;
    b = (s00 * b1 - s01 * b0) / det;
  }
  if (b < 0.0) {
    b = 0.0;
    a = b0 / s00;
  }
  if (a < 0.0) {
    a = 0.0;
    b = s11 > 0.0 ? b1 / s11 : 0.0;
  }
  return Line{a, b / scale};
}

double squared_error(const std::vector<CollectivePoint>& pts, const Line& line) {
  double sum = 0.0;
  for (const CollectivePoint& p : pts) {
    const double r = (line.at(p.wire_bytes) - p.time_s) / p.time_s;
    sum += r * r;
  }
  return sum;
}

/// A regime over positions [begin, end) of the kept points.
struct Segment {
  std::size_t begin = 0;
  std::size_t end = 0;
  Line line;
};

/// The kept points (indices into all points, in size order) and their segmentation.
struct Model {
  std::vector<std::size_t> kept;
  std::vector<Segment> segments;
};

std::vector<CollectivePoint> gather(std::span<const CollectivePoint> all,
                                    const std::vector<std::size_t>& kept,
                                    std::size_t begin,
                                    std::size_t end,
                                    std::size_t skip = std::numeric_limits<std::size_t>::max()) {
  std::vector<CollectivePoint> out;
  for (std::size_t q = begin; q < end; ++q) {
    if (q != skip) {
      out.push_back(all[kept[q]]);
    }
  }
  return out;
}

/// Splits the kept points into 1..max_regimes contiguous regimes of at least min_points each,
/// minimising the squared relative error for each regime count (dynamic programming over the
/// boundaries), and picks the count with the least Bayesian information criterion
/// m·ln(SSE/m) + (3K − 1)·ln(m) (2 coefficients per regime, 1 per boundary).
Model segment(std::span<const CollectivePoint> all,
              std::vector<std::size_t> kept,
              const CollectiveFitOptions& options) {
  const std::size_t m = kept.size();
  const std::size_t min_points = std::max<std::size_t>(2, options.min_points_per_regime);
  const std::size_t max_k = std::max<std::size_t>(1, std::min(options.max_regimes, m / min_points));
  const double inf = std::numeric_limits<double>::infinity();
  // cost[i][j]: error of one regime over [i, j).
  std::vector<std::vector<double>> cost(m + 1, std::vector<double>(m + 1, inf));
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = i + min_points; j <= m; ++j) {
      const auto pts = gather(all, kept, i, j);
      cost[i][j] = squared_error(pts, fit_line(pts));
    }
  }
  if (m < min_points) {
    cost[0][m] = squared_error(gather(all, kept, 0, m), fit_line(gather(all, kept, 0, m)));
  }
  // best[k][j]: least error of k regimes over [0, j); from[k][j]: start of the last one.
  std::vector<std::vector<double>> best(max_k + 1, std::vector<double>(m + 1, inf));
  std::vector<std::vector<std::size_t>> from(max_k + 1, std::vector<std::size_t>(m + 1, 0));
  best[0][0] = 0.0;
  for (std::size_t k = 1; k <= max_k; ++k) {
    for (std::size_t j = 1; j <= m; ++j) {
      for (std::size_t i = 0; i < j; ++i) {
        const double c = best[k - 1][i] + cost[i][j];
        if (c < best[k][j]) {
          best[k][j] = c;
          from[k][j] = i;
        }
      }
    }
  }
  std::size_t chosen = 1;
  double chosen_score = inf;
  const double md = static_cast<double>(m);
  for (std::size_t k = 1; k <= max_k; ++k) {
    if (!std::isfinite(best[k][m])) {
      continue;
    }
    const double score = md * std::log(std::max(best[k][m] / md, 1e-14)) +
                         (3.0 * static_cast<double>(k) - 1.0) * std::log(md);
    if (score < chosen_score - 1e-9) {
      chosen_score = score;
      chosen = k;
    }
  }
  Model model;
  for (std::size_t k = chosen, j = m; k > 0; --k) {
    const std::size_t i = from[k][j];
    model.segments.insert(model.segments.begin(), Segment{i, j, Line{}});
    j = i;
  }
  for (Segment& s : model.segments) {
    s.line = fit_line(gather(all, kept, s.begin, s.end));
  }
  model.kept = std::move(kept);
  return model;
}

/// The model's time at a point: the regime whose sizes hold it, with the boundary between two
/// regimes at the geometric mean of their neighbouring sizes.
double predict_at(std::span<const CollectivePoint> all,
                  const Model& model,
                  const CollectivePoint& p) {
  for (std::size_t r = 0; r < model.segments.size(); ++r) {
    const Segment& s = model.segments[r];
    if (r + 1 == model.segments.size()) {
      return s.line.at(p.wire_bytes);
    }
    const double last = all[model.kept[s.end - 1]].size_bytes;
    const double next = all[model.kept[model.segments[r + 1].begin]].size_bytes;
    if (p.size_bytes <= std::sqrt(last * next)) {
      return s.line.at(p.wire_bytes);
    }
  }
  return p.time_s;
}

/// The kept position's time predicted by the model fitted without it, regimes chosen again. A
/// point between two regimes of that model (its boundary can lie anywhere between their sizes) is
/// predicted by the geometric-mean boundary rule, or, with `closest`, by whichever of the two
/// regimes comes closer to its measured time.
double leave_one_out(std::span<const CollectivePoint> all,
                     const Model& model,
                     std::size_t q,
                     const CollectiveFitOptions& options,
                     bool closest = false) {
  std::vector<std::size_t> rest = model.kept;
  rest.erase(rest.begin() + static_cast<std::ptrdiff_t>(q));
  const Model without = segment(all, std::move(rest), options);
  const CollectivePoint& p = all[model.kept[q]];
  double predicted = predict_at(all, without, p);
  if (!closest) {
    return predicted;
  }
  for (std::size_t r = 0; r + 1 < without.segments.size(); ++r) {
    const Segment& a = without.segments[r];
    const Segment& b = without.segments[r + 1];
    if (p.size_bytes > all[without.kept[a.end - 1]].size_bytes &&
        p.size_bytes < all[without.kept[b.begin]].size_bytes) {
      const double ta = a.line.at(p.wire_bytes);
      const double tb = b.line.at(p.wire_bytes);
      predicted = std::abs(std::log(p.time_s / ta)) <= std::abs(std::log(p.time_s / tb)) ? ta : tb;
    }
  }
  return predicted;
}

/// The kept position's time interpolated (log-log) from its kept neighbours; at the ends,
/// extrapolated from the two nearest. Needs at least 3 kept points.
double from_neighbours(std::span<const CollectivePoint> all, const Model& model, std::size_t q) {
  const std::size_t m = model.kept.size();
  std::size_t a = q - 1;
  std::size_t b = q + 1;
  if (q == 0) {
    a = 1;
    b = 2;
  } else if (q + 1 == m) {
    a = m - 3;
    b = m - 2;
  }
  const CollectivePoint& pa = all[model.kept[a]];
  const CollectivePoint& pb = all[model.kept[b]];
  const double x = std::log(all[model.kept[q]].size_bytes);
  const double xa = std::log(pa.size_bytes);
  const double xb = std::log(pb.size_bytes);
  const double ya = std::log(pa.time_s);
  const double yb = std::log(pb.time_s);
  return std::exp(ya + (yb - ya) * (x - xa) / (xb - xa));
}

std::string time_text(double s) {
  return fmt::format("{:.1f} us", s * 1e6);
}

std::string size_text(double bytes) {
  return format_bytes(bytes);
}

struct Candidate {
  std::size_t q = 0;
  double score = 0.0;  ///< |ln(measured / leave-one-out)|
  double expected_s = 0.0;
  std::string reason;
};

/// The worst point that fails the model-and-neighbour check or the monotonicity check; none when
/// every kept point passes.
std::optional<Candidate> worst_point(std::span<const CollectivePoint> all,
                                     const Model& model,
                                     const CollectiveFitOptions& options) {
  const std::size_t m = model.kept.size();
  std::vector<double> loo(m);
  for (std::size_t q = 0; q < m; ++q) {
    loo[q] = leave_one_out(all, model, q, options, true);
  }
  const double limit = std::log1p(options.outlier_fraction);
  std::optional<Candidate> worst;
  auto consider = [&](std::size_t q, std::string reason) {
    const double t = all[model.kept[q]].time_s;
    const double score = std::abs(std::log(t / loo[q]));
    if (!worst || score > worst->score) {
      worst = Candidate{q, score, loo[q], std::move(reason)};
    }
  };
  for (std::size_t q = 0; q < m; ++q) {
    const double t = all[model.kept[q]].time_s;
    const double nb = from_neighbours(all, model, q);
    if (std::abs(std::log(t / loo[q])) > limit && std::abs(std::log(t / nb)) > limit) {
      consider(q, fmt::format("{:+.0f}% from the alpha-beta model fitted without it, {:+.0f}% "
                              "from its neighbours",
                              (t / loo[q] - 1.0) * 100.0, (t / nb - 1.0) * 100.0));
    }
  }
  for (std::size_t q = 0; q + 1 < m; ++q) {
    const CollectivePoint& p = all[model.kept[q]];
    const CollectivePoint& n = all[model.kept[q + 1]];
    if (n.time_s < p.time_s * (1.0 - options.monotone_tolerance)) {
      const double sp = std::abs(std::log(p.time_s / loo[q]));
      const double sn = std::abs(std::log(n.time_s / loo[q + 1]));
      consider(sp >= sn ? q : q + 1,
               fmt::format("time falls from {} at {} to {} at {} (more than {:.0f}%)",
                           time_text(p.time_s), size_text(p.size_bytes), time_text(n.time_s),
                           size_text(n.size_bytes), options.monotone_tolerance * 100.0));
    }
  }
  return worst;
}

void validate(std::span<const CollectivePoint> points) {
  if (points.size() < 2) {
    throw InputError("samples", fmt::format("need at least 2 sizes, got {}", points.size()));
  }
  for (std::size_t i = 0; i < points.size(); ++i) {
    const CollectivePoint& p = points[i];
    if (!(std::isfinite(p.time_s) && p.time_s > 0.0 && std::isfinite(p.wire_bytes) &&
          p.wire_bytes > 0.0 && std::isfinite(p.size_bytes) && p.size_bytes > 0.0)) {
      throw InputError("samples", fmt::format("point {}: sizes and time must be positive", i));
    }
    if (i > 0 && !(p.size_bytes > points[i - 1].size_bytes)) {
      throw InputError("samples", fmt::format("point {}: sizes must increase", i));
    }
  }
}

}  // namespace

double CollectiveCurveFit::predict(double size_bytes, double wire_bytes) const {
  for (std::size_t r = 0; r < regimes.size(); ++r) {
    const CollectiveRegime& g = regimes[r];
    if (r + 1 == regimes.size() ||
        size_bytes <= std::sqrt(g.last_size_bytes * regimes[r + 1].first_size_bytes)) {
      const double per_byte =
          std::isinf(g.bandwidth_bytes_per_s) ? 0.0 : 1.0 / g.bandwidth_bytes_per_s;
      return g.alpha_s + wire_bytes * per_byte;
    }
  }
  return 0.0;
}

CollectiveCurveFit fit_collective_curve(std::span<const CollectivePoint> points,
                                        const CollectiveFitOptions& options) {
  validate(points);
  std::vector<std::size_t> kept(points.size());
  for (std::size_t i = 0; i < kept.size(); ++i) {
    kept[i] = i;
  }
  CollectiveCurveFit out;
  Model model = segment(points, kept, options);
  // Remove the worst offender and refit, while one is found; at most a quarter of the points.
  while (model.kept.size() >= 4 && out.outliers.size() < points.size() / 4) {
    const std::optional<Candidate> c = worst_point(points, model, options);
    if (!c) {
      break;
    }
    const std::size_t index = model.kept[c->q];
    out.outliers.push_back(CollectiveOutlier{index, points[index].size_bytes, points[index].time_s,
                                             c->expected_s, c->reason});
    kept = model.kept;
    kept.erase(kept.begin() + static_cast<std::ptrdiff_t>(c->q));
    model = segment(points, kept, options);
  }
  std::sort(
      out.outliers.begin(), out.outliers.end(),
      [](const CollectiveOutlier& a, const CollectiveOutlier& b) { return a.index < b.index; });
  for (const Segment& s : model.segments) {
    CollectiveRegime g;
    g.first_size_bytes = points[model.kept[s.begin]].size_bytes;
    g.last_size_bytes = points[model.kept[s.end - 1]].size_bytes;
    g.alpha_s = s.line.alpha;
    g.bandwidth_bytes_per_s =
        s.line.slope > 0.0 ? 1.0 / s.line.slope : std::numeric_limits<double>::infinity();
    g.points = s.end - s.begin;
    out.regimes.push_back(g);
  }
  std::vector<double> holdout(points.size(), 0.0);
  for (std::size_t i = 0; i < points.size(); ++i) {
    out.predicted_s.push_back(out.predict(points[i].size_bytes, points[i].wire_bytes));
    holdout[i] = out.predicted_s.back();  // outliers: the final model never saw them
  }
  if (model.kept.size() >= 3) {
    for (std::size_t q = 0; q < model.kept.size(); ++q) {
      holdout[model.kept[q]] = leave_one_out(points, model, q, options);
    }
    out.held_out = points.size();
  }
  double fit_sum = 0.0;
  double held_sum = 0.0;
  for (std::size_t i = 0; i < points.size(); ++i) {
    const double fe = std::abs(out.predicted_s[i] - points[i].time_s) / points[i].time_s;
    const double he = std::abs(holdout[i] - points[i].time_s) / points[i].time_s;
    fit_sum += fe;
    held_sum += he;
    out.fit_max = std::max(out.fit_max, fe);
    out.holdout_max = std::max(out.holdout_max, he);
  }
  const auto n = static_cast<double>(points.size());
  out.fit_mape = fit_sum / n;
  if (out.held_out > 0) {
    out.holdout_mape = held_sum / n;
  } else {
    out.holdout_max = 0.0;
  }
  return out;
}

}  // namespace cpsim::calibrate
