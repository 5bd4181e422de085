#include "cpsim/calibrate/fit.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <string>
#include <vector>

#include <Eigen/Dense>

#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

constexpr const char* kSamplesField = "samples";

std::string to_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}

/// Every sample must have finite, strictly positive bytes and time (the weights are 1/time).
void validate_samples(std::span<const TimingSample> samples) {
  for (std::size_t i = 0; i < samples.size(); ++i) {
    const TimingSample& s = samples[i];
    if (!(std::isfinite(s.bytes) && s.bytes > 0.0)) {
      throw InputError(kSamplesField, "sample " + std::to_string(i) +
                                          ": bytes must be positive and finite, got " +
                                          to_text(s.bytes));
    }
    if (!(std::isfinite(s.time_s) && s.time_s > 0.0)) {
      throw InputError(kSamplesField, "sample " + std::to_string(i) +
                                          ": time_s must be positive and finite, got " +
                                          to_text(s.time_s));
    }
  }
}

struct RelativeErrors {
  double mean = 0.0;
  double max = 0.0;
};

/// |alpha + slope * bytes - t| / t over `samples` (non-empty, validated).
RelativeErrors relative_errors(std::span<const TimingSample> samples, double alpha, double slope) {
  RelativeErrors errors;
  double sum = 0.0;
  for (const TimingSample& s : samples) {
    const double rel = std::abs(alpha + slope * s.bytes - s.time_s) / s.time_s;
    sum += rel;
    errors.max = std::max(errors.max, rel);
  }
  errors.mean = sum / static_cast<double>(samples.size());
  return errors;
}

}  // namespace

// Derivation. Model t_i ≈ a + b·x_i with x_i = bytes, a = alpha, b = 1 / bandwidth. We minimise the
// sum of squared *relative* residuals, i.e. least squares with weights w_i = 1/t_i:
//
//   S(a, b) = Σ_i ((a + b·x_i − t_i) / t_i)² = Σ_i (a·(1/t_i) + b·(x_i/t_i) − 1)² = ‖A·p − 1‖²,
//
// where row i of the n×2 matrix A is [1/t_i, x_i/t_i], p = [a, b]ᵀ and 1 is the all-ones vector.
// Setting ∂S/∂a = ∂S/∂b = 0 gives the normal equations of the weighted problem, AᵀA·p = Aᵀ·1:
//
//   | Σ 1/t_i²      Σ x_i/t_i²   | |a|   | Σ 1/t_i   |
//   | Σ x_i/t_i²    Σ x_i²/t_i²  | |b| = | Σ x_i/t_i |
//
// Its determinant Σw²·Σw²x² − (Σw²x)² is ≥ 0 by Cauchy–Schwarz and zero exactly when all x_i are
// equal, so the solution is unique as soon as two samples differ in bytes (with exactly two samples
// the line passes through both points and the weights play no part).
//
// Solving: forming AᵀA squares the condition number, and with bytes spanning 1 KiB..4 GiB the two
// columns of A differ in scale by ~10⁶. So we scale each column of A to unit norm (p_j = p'_j /
// s_j) and factor the scaled A with Eigen's ColPivHouseholderQR, A·P = Q·R; the least-squares
// solution p' = P·R⁻¹·Qᵀ·1 satisfies the normal equations above (in exact arithmetic) without
// forming them. The rank it reports (< 2 for numerically indistinguishable bytes) is a backstop for
// the all-bytes-equal check. Finally bandwidth = 1/b, which must be positive and finite.
AlphaBetaFit fit_alpha_beta(std::span<const TimingSample> samples) {
  if (samples.size() < 2) {
    throw InputError(kSamplesField, "need at least 2 samples to fit alpha and bandwidth, got " +
                                        std::to_string(samples.size()));
  }
  validate_samples(samples);
  const double first_bytes = samples.front().bytes;
  if (std::all_of(samples.begin(), samples.end(),
                  [first_bytes](const TimingSample& s) { return s.bytes == first_bytes; })) {
    throw InputError(kSamplesField, "all samples have the same bytes (" + to_text(first_bytes) +
                                        "); alpha and bandwidth cannot be separated");
  }

  const auto n = static_cast<Eigen::Index>(samples.size());
  Eigen::MatrixX2d a(n, 2);
  for (Eigen::Index i = 0; i < n; ++i) {
    const TimingSample& s = samples[static_cast<std::size_t>(i)];
    a(i, 0) = 1.0 / s.time_s;
    a(i, 1) = s.bytes / s.time_s;
  }
  if (!a.allFinite()) {
    throw InputError(kSamplesField, "bytes / time_s overflows a double; rescale the samples");
  }
  Eigen::Array2d scale;
  for (Eigen::Index j = 0; j < 2; ++j) {
    scale(j) = a.col(j).stableNorm();  // > 0: every entry is positive
    a.col(j) /= scale(j);
  }

  const Eigen::ColPivHouseholderQR<Eigen::MatrixX2d> qr(a);
  if (qr.rank() < 2) {
    throw InputError(kSamplesField,
                     "bytes values are too close together to separate alpha and bandwidth");
  }
  const Eigen::Vector2d p = qr.solve(Eigen::VectorXd::Ones(n)).array() / scale;
  const double alpha = p(0);
  const double slope = p(1);  // seconds per byte
  const double bandwidth = 1.0 / slope;
  if (!(std::isfinite(slope) && slope > 0.0 && std::isfinite(bandwidth))) {
    throw InputError(kSamplesField, "fitted bandwidth is not positive and finite (slope " +
                                        to_text(slope) + " s/byte): time does not grow with bytes");
  }

  const RelativeErrors errors = relative_errors(samples, alpha, slope);
  return AlphaBetaFit{alpha, bandwidth, errors.mean, errors.max, samples.size()};
}

HoldoutError holdout_error(std::span<const TimingSample> samples, std::size_t every_kth) {
  if (every_kth < 2) {
    throw InputError("every_kth", "must be at least 2, got " + std::to_string(every_kth));
  }
  validate_samples(samples);  // held-out samples too: their times are divisors below
  if (samples.size() < every_kth) {
    throw InputError(kSamplesField, "holding out every " + std::to_string(every_kth) +
                                        "-th sample needs at least " + std::to_string(every_kth) +
                                        " samples, got " + std::to_string(samples.size()));
  }

  std::vector<TimingSample> train;
  std::vector<TimingSample> held;
  train.reserve(samples.size());
  held.reserve(samples.size() / every_kth);
  for (std::size_t i = 0; i < samples.size(); ++i) {
    ((i + 1) % every_kth == 0 ? held : train).push_back(samples[i]);
  }
  if (train.size() < 2) {
    throw InputError(kSamplesField, "holding out every " + std::to_string(every_kth) + "-th of " +
                                        std::to_string(samples.size()) +
                                        " samples leaves fewer than 2 to fit");
  }

  const AlphaBetaFit fit = fit_alpha_beta(train);
  const RelativeErrors errors = relative_errors(held, fit.alpha_s, 1.0 / fit.bandwidth_bytes_per_s);
  return HoldoutError{errors.mean, errors.max, held.size()};
}

}  // namespace cpsim::calibrate
