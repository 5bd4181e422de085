#include "cpsim/calibrate/fit.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

constexpr double kAlpha = 12.5e-6;  // s, ~ small-message NCCL latency (REFERENCES.md [DeepEP-303])
constexpr double kBandwidth = 370e9;  // B/s, ~ NVLink busbw plateau (REFERENCES.md [NCCL])

/// t = alpha + bytes / bandwidth for bytes = 1 KiB, 2 KiB, ..., 4 GiB (23 samples).
std::vector<TimingSample> clean_sweep(double alpha = kAlpha, double bandwidth = kBandwidth) {
  std::vector<TimingSample> samples;
  for (int e = 10; e <= 32; ++e) {
    const double bytes = std::ldexp(1.0, e);
    samples.push_back({bytes, alpha + bytes / bandwidth});
  }
  return samples;
}

/// Multiplies every time by 1 + u, u uniform in [-amplitude, amplitude). The mapping from the raw
/// 32-bit mt19937 output is done by hand (std::uniform_real_distribution is
/// implementation-defined), so the noise is bit-identical across standard libraries.
std::vector<TimingSample> with_noise(std::vector<TimingSample> samples,
                                     double amplitude,
                                     std::uint32_t seed) {
  std::mt19937 gen(seed);
  for (TimingSample& s : samples) {
    const double unit = static_cast<double>(gen()) / 4294967296.0;  // [0, 1)
    s.time_s *= 1.0 + amplitude * (2.0 * unit - 1.0);
  }
  return samples;
}

double rel_diff(double value, double expected) {
  return std::abs(value - expected) / std::abs(expected);
}

/// Runs `f` and checks that it throws InputError naming `field`.
template <typename F>
void expect_input_error(F&& f, const char* field) {
  try {
    f();
    ADD_FAILURE() << "expected InputError for field " << field;
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), field) << e.what();
  }
}

TEST(FitAlphaBeta, RecoversCleanParameters) {
  const auto samples = clean_sweep();
  const AlphaBetaFit fit = fit_alpha_beta(samples);
  EXPECT_LT(rel_diff(fit.alpha_s, kAlpha), 0.01);
  EXPECT_LT(rel_diff(fit.bandwidth_bytes_per_s, kBandwidth), 0.01);
  // Noise-free data lies on the line: the fit is exact up to rounding.
  EXPECT_LT(rel_diff(fit.alpha_s, kAlpha), 1e-9);
  EXPECT_LT(rel_diff(fit.bandwidth_bytes_per_s, kBandwidth), 1e-9);
  EXPECT_LT(fit.mape, 1e-10);
  EXPECT_LT(fit.max_abs_rel_error, 1e-10);
  EXPECT_LE(fit.mape, fit.max_abs_rel_error);
  EXPECT_EQ(fit.samples, samples.size());
  EXPECT_EQ(fit.samples, 23u);
}

TEST(FitAlphaBeta, OrderOfSamplesDoesNotMatter) {
  auto samples = with_noise(clean_sweep(), 0.02, 7);
  const AlphaBetaFit forward = fit_alpha_beta(samples);
  std::vector<TimingSample> reversed(samples.rbegin(), samples.rend());
  const AlphaBetaFit backward = fit_alpha_beta(reversed);
  EXPECT_LT(rel_diff(backward.alpha_s, forward.alpha_s), 1e-9);
  EXPECT_LT(rel_diff(backward.bandwidth_bytes_per_s, forward.bandwidth_bytes_per_s), 1e-9);
}

TEST(FitAlphaBeta, RecoversParametersUnderTwoPercentNoise) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(seed);
    const auto samples = with_noise(clean_sweep(), 0.02, seed);
    const AlphaBetaFit fit = fit_alpha_beta(samples);
    EXPECT_LT(rel_diff(fit.alpha_s, kAlpha), 0.03);
    EXPECT_LT(rel_diff(fit.bandwidth_bytes_per_s, kBandwidth), 0.03);
    // The true line is within 2 % of every sample, so the best fit cannot be much worse.
    EXPECT_LT(fit.mape, 0.02);
    EXPECT_LT(fit.max_abs_rel_error, 0.04);
  }
}

TEST(FitAlphaBeta, RecoversOtherScales) {
  // Host<->device copy scale (REFERENCES.md [ml-engineering]): ~55 GB/s, a few microseconds of
  // latency.
  const auto samples = with_noise(clean_sweep(4e-6, 55e9), 0.02, 42);
  const AlphaBetaFit fit = fit_alpha_beta(samples);
  EXPECT_LT(rel_diff(fit.alpha_s, 4e-6), 0.03);
  EXPECT_LT(rel_diff(fit.bandwidth_bytes_per_s, 55e9), 0.03);
}

TEST(FitAlphaBeta, TwoPointsGiveTheExactLine) {
  // (1 MB, 30 us) and (3 MB, 50 us): slope = (50 - 30) us / 2e6 B = 1e-11 s/B, so the bandwidth is
  // 1e11 B/s, and alpha = 30 us - 1e6 B * 1e-11 s/B = 20 us.
  const std::vector<TimingSample> samples = {{1e6, 30e-6}, {3e6, 50e-6}};
  const AlphaBetaFit fit = fit_alpha_beta(samples);
  EXPECT_NEAR(fit.alpha_s, 20e-6, 1e-6 * 20e-6);
  EXPECT_NEAR(fit.bandwidth_bytes_per_s, 1e11, 1e-6 * 1e11);
  EXPECT_LT(fit.max_abs_rel_error, 1e-12);
  EXPECT_EQ(fit.samples, 2u);
}

TEST(FitAlphaBeta, SatisfiesWeightedNormalEquations) {
  // At the optimum the relative residuals r_i = (a + b x_i - t_i) / t_i are orthogonal to both
  // columns of the weighted design matrix: sum r_i / t_i = 0 and sum r_i x_i / t_i = 0.
  const auto samples = with_noise(clean_sweep(), 0.02, 3);
  const AlphaBetaFit fit = fit_alpha_beta(samples);
  const double slope = 1.0 / fit.bandwidth_bytes_per_s;
  double g0 = 0.0;
  double g1 = 0.0;
  double n0 = 0.0;
  double n1 = 0.0;
  for (const TimingSample& s : samples) {
    const double r = (fit.alpha_s + slope * s.bytes - s.time_s) / s.time_s;
    g0 += r / s.time_s;
    g1 += r * s.bytes / s.time_s;
    n0 += std::abs(r) / s.time_s;
    n1 += std::abs(r) * s.bytes / s.time_s;
  }
  EXPECT_LT(std::abs(g0), 1e-9 * n0);
  EXPECT_LT(std::abs(g1), 1e-9 * n1);
}

TEST(FitAlphaBeta, WeightsMakeSmallMessagesCount) {
  // One large message is 10 % slow. An unweighted fit would bend the line towards it and spoil the
  // small-message latency; minimising relative error keeps alpha close.
  auto samples = clean_sweep();
  samples.back().time_s *= 1.10;
  const AlphaBetaFit fit = fit_alpha_beta(samples);
  EXPECT_LT(rel_diff(fit.alpha_s, kAlpha), 0.01);

  // Contrast: ordinary (unweighted) least squares, closed form. Its alpha comes out negative.
  const double n = static_cast<double>(samples.size());
  double sx = 0.0;
  double sy = 0.0;
  double sxx = 0.0;
  double sxy = 0.0;
  for (const TimingSample& s : samples) {
    sx += s.bytes;
    sy += s.time_s;
    sxx += s.bytes * s.bytes;
    sxy += s.bytes * s.time_s;
  }
  const double unweighted_slope = (n * sxy - sx * sy) / (n * sxx - sx * sx);
  const double unweighted_alpha = (sy - unweighted_slope * sx) / n;
  EXPECT_GT(rel_diff(unweighted_alpha, kAlpha), 0.5);
}

TEST(FitAlphaBeta, RejectsTooFewSamples) {
  expect_input_error([] { fit_alpha_beta({}); }, "samples");
  const std::vector<TimingSample> one = {{1024.0, 1e-5}};
  expect_input_error([&] { fit_alpha_beta(one); }, "samples");
}

TEST(FitAlphaBeta, RejectsNonPositiveOrNonFiniteValues) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<TimingSample> bad_points = {{0.0, 1e-5},   {-1024.0, 1e-5}, {nan, 1e-5},
                                                {inf, 1e-5},   {1024.0, 0.0},   {1024.0, -1e-5},
                                                {1024.0, nan}, {1024.0, inf}};
  for (const TimingSample& bad : bad_points) {
    SCOPED_TRACE(testing::Message() << "bytes=" << bad.bytes << " time_s=" << bad.time_s);
    auto samples = clean_sweep();
    samples[5] = bad;
    expect_input_error([&] { fit_alpha_beta(samples); }, "samples");
  }
}

TEST(FitAlphaBeta, RejectsAllBytesEqual) {
  const std::vector<TimingSample> samples = {{4096.0, 1e-5}, {4096.0, 1.1e-5}, {4096.0, 0.9e-5}};
  expect_input_error([&] { fit_alpha_beta(samples); }, "samples");
}

TEST(FitAlphaBeta, RejectsNonPositiveBandwidth) {
  // Time falls as bytes grow: the fitted slope is negative.
  const std::vector<TimingSample> falling = {{1e3, 2e-6}, {2e3, 1e-6}};
  expect_input_error([&] { fit_alpha_beta(falling); }, "samples");
  const std::vector<TimingSample> falling3 = {{1e3, 5e-6}, {2e3, 4.9e-6}, {4e3, 4.7e-6}};
  expect_input_error([&] { fit_alpha_beta(falling3); }, "samples");
}

TEST(FitAlphaBeta, ErrorMessageNamesTheField) {
  const std::vector<TimingSample> samples = {{1024.0, 1e-5}, {2048.0, -1.0}};
  try {
    fit_alpha_beta(samples);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("samples: ", 0), 0u) << what;
    EXPECT_NE(what.find("sample 1"), std::string::npos) << what;
    EXPECT_NE(what.find("time_s"), std::string::npos) << what;
  }
}

TEST(HoldoutError, SmallOnCleanData) {
  const auto samples = clean_sweep();
  for (std::size_t k = 2; k <= 5; ++k) {
    SCOPED_TRACE(k);
    const HoldoutError err = holdout_error(samples, k);
    EXPECT_EQ(err.held_out, samples.size() / k);
    EXPECT_LT(err.mape, 1e-9);
    EXPECT_LT(err.max_abs_rel_error, 1e-9);
  }
}

TEST(HoldoutError, BoundedOnNoisyData) {
  const auto samples = with_noise(clean_sweep(), 0.02, 11);
  const HoldoutError err = holdout_error(samples, 3);
  EXPECT_EQ(err.held_out, 7u);
  EXPECT_LT(err.mape, 0.03);
  EXPECT_LT(err.max_abs_rel_error, 0.05);
  EXPECT_LE(err.mape, err.max_abs_rel_error);
}

TEST(HoldoutError, HoldsOutTheKthSamples) {
  // Corrupt the 3rd sample (0-based index 2): with k = 3 it is held out, so the fit on the rest is
  // exact and the held-out prediction is half the corrupted time (relative error 0.5).
  auto samples = clean_sweep();
  samples[2].time_s *= 2.0;
  const HoldoutError err = holdout_error(samples, 3);
  EXPECT_EQ(err.held_out, 7u);
  EXPECT_NEAR(err.max_abs_rel_error, 0.5, 1e-9);
  EXPECT_NEAR(err.mape, 0.5 / 7.0, 1e-9);
}

TEST(HoldoutError, RejectsBadArguments) {
  const auto samples = clean_sweep();
  expect_input_error([&] { holdout_error(samples, 0); }, "every_kth");
  expect_input_error([&] { holdout_error(samples, 1); }, "every_kth");
  // Nothing to hold out.
  expect_input_error([&] { holdout_error(samples, samples.size() + 1); }, "samples");
  // Two samples, k = 2: one left to fit.
  const std::vector<TimingSample> two = {{1e3, 1e-5}, {2e3, 2e-5}};
  expect_input_error([&] { holdout_error(two, 2); }, "samples");
  // An invalid held-out sample is reported, not divided by.
  auto bad = samples;
  bad[1].time_s = 0.0;
  expect_input_error([&] { holdout_error(bad, 2); }, "samples");
}

}  // namespace
}  // namespace cpsim::calibrate
