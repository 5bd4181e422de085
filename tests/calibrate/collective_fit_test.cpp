// The piecewise alpha-beta fit of collective curves: regimes, leave-one-out hold-out over every
// point, outliers (model and neighbours, monotonicity), on constructed curves.
#include "cpsim/calibrate/collective_fit.hpp"

#include <cmath>
#include <cstdint>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

using ::testing::HasSubstr;

double rel(double got, double want) {
  return std::abs(got - want) / std::abs(want);
}

/// Sizes 1K .. 1G (powers of two); wire = size · 7/8 (8 ranks); time from `time_of(wire)`.
template <typename F>
std::vector<CollectivePoint> curve(F&& time_of) {
  std::vector<CollectivePoint> points;
  for (int e = 10; e <= 30; ++e) {
    const double size = std::ldexp(1.0, e);
    const double wire = size * 7.0 / 8.0;
    points.push_back({size, wire, time_of(wire)});
  }
  return points;
}

std::vector<CollectivePoint> alpha_beta_curve() {
  return curve([](double wire) { return 12e-6 + wire / 300e9; });
}

/// LL up to 64 KiB (low latency, low bandwidth), Simple above (higher latency, full bandwidth).
std::vector<CollectivePoint> two_protocol_curve() {
  return curve([](double wire) {
    return wire <= 65536.0 * 7.0 / 8.0 ? 8e-6 + wire / 20e9 : 25e-6 + wire / 350e9;
  });
}

TEST(CollectiveFit, APureAlphaBetaCurveIsOneRegime) {
  const CollectiveCurveFit f = fit_collective_curve(alpha_beta_curve(), {});
  ASSERT_EQ(f.regimes.size(), 1U);
  EXPECT_LT(rel(f.regimes[0].alpha_s, 12e-6), 1e-6);
  EXPECT_LT(rel(f.regimes[0].bandwidth_bytes_per_s, 300e9), 1e-6);
  EXPECT_TRUE(f.outliers.empty());
  EXPECT_LT(f.fit_mape, 1e-9);
  EXPECT_LT(f.holdout_mape, 1e-9);
}

TEST(CollectiveFit, FindsTheProtocolSwitchAndFitsEachRegime) {
  const CollectiveCurveFit f = fit_collective_curve(two_protocol_curve(), {});
  ASSERT_EQ(f.regimes.size(), 2U);
  EXPECT_EQ(f.regimes[0].last_size_bytes, 65536.0);
  EXPECT_EQ(f.regimes[1].first_size_bytes, 131072.0);
  EXPECT_LT(rel(f.regimes[0].bandwidth_bytes_per_s, 20e9), 1e-6);
  EXPECT_LT(rel(f.regimes[1].alpha_s, 25e-6), 1e-6);
  EXPECT_LT(rel(f.regimes[1].bandwidth_bytes_per_s, 350e9), 1e-6);
  EXPECT_TRUE(f.outliers.empty());
}

TEST(CollectiveFit, TheErrorIsAModelErrorNotZeroByConstruction) {
  // A smooth efficiency ramp is not exactly piecewise alpha-beta: the fit reports what it misses.
  const CollectiveCurveFit f = fit_collective_curve(
      curve([](double wire) {
        const double eff = std::min(1.0, 0.05 + 0.06 * std::log2(wire / 896.0));
        return 10e-6 + wire / (400e9 * eff);
      }),
      {});
  EXPECT_GT(f.fit_mape, 1e-4);
  EXPECT_GT(f.holdout_mape, f.fit_mape);
  EXPECT_LT(f.holdout_mape, 0.15);
}

TEST(CollectiveFit, HoldOutPredictsEveryPointEndPointsIncluded) {
  std::vector<CollectivePoint> points = alpha_beta_curve();
  points.back().time_s *= 1.3;  // the largest size 30 % slow: only its hold-out can see it
  const CollectiveCurveFit f = fit_collective_curve(points, {});
  EXPECT_EQ(f.held_out, points.size());
  EXPECT_GT(f.holdout_max, 0.2);
}

TEST(CollectiveFit, NamesAPointInflatedTenTimes) {
  std::vector<CollectivePoint> points = alpha_beta_curve();
  points[0].time_s *= 10.0;  // 1 KiB, the first point
  const CollectiveCurveFit f = fit_collective_curve(points, {});
  ASSERT_EQ(f.outliers.size(), 1U);
  EXPECT_EQ(f.outliers[0].index, 0U);
  EXPECT_EQ(f.outliers[0].size_bytes, 1024.0);
  EXPECT_NEAR(f.outliers[0].deviation(), 9.0, 0.05);
  EXPECT_THAT(f.outliers[0].reason, HasSubstr("from the alpha-beta model fitted without it"));
  // Left out of the fit: the rest is recovered.
  ASSERT_EQ(f.regimes.size(), 1U);
  EXPECT_LT(rel(f.regimes[0].alpha_s, 12e-6), 1e-6);
}

TEST(CollectiveFit, NamesAnOutlierInTheMiddleAndAtTheLargeEnd) {
  std::vector<CollectivePoint> points = two_protocol_curve();
  points[10].time_s *= 3.0;     // 1 MiB
  points.back().time_s *= 0.2;  // 1 GiB five times faster than possible
  const CollectiveCurveFit f = fit_collective_curve(points, {});
  ASSERT_EQ(f.outliers.size(), 2U);
  EXPECT_EQ(f.outliers[0].index, 10U);
  EXPECT_EQ(f.outliers[1].index, points.size() - 1);
}

TEST(CollectiveFit, TimeFallingWithSizeIsFlagged) {
  std::vector<CollectivePoint> points = alpha_beta_curve();
  points[6].time_s *= 1.4;  // 64 KiB: 40 % slow, under the outlier fraction, but 128 KiB is faster
  const CollectiveCurveFit f = fit_collective_curve(points, {});
  ASSERT_EQ(f.outliers.size(), 1U);
  EXPECT_EQ(f.outliers[0].index, 6U);
  EXPECT_THAT(f.outliers[0].reason, HasSubstr("time falls from"));
}

TEST(CollectiveFit, NoiseWithinTheToleranceIsNotFlagged) {
  std::vector<CollectivePoint> points = two_protocol_curve();
  for (std::size_t i = 0; i < points.size(); ++i) {
    points[i].time_s *= i % 2 == 0 ? 1.04 : 0.96;
  }
  const CollectiveCurveFit f = fit_collective_curve(points, {});
  EXPECT_TRUE(f.outliers.empty());
  EXPECT_LT(f.holdout_mape, 0.1);
}

TEST(CollectiveFit, TwoPointsAreALineWithoutHoldOut) {
  const std::vector<CollectivePoint> points = {{1024, 896, 10e-6}, {2048, 1792, 11e-6}};
  const CollectiveCurveFit f = fit_collective_curve(points, {});
  EXPECT_EQ(f.held_out, 0U);
  EXPECT_LT(rel(f.predict(1024, 896), 10e-6), 1e-9);
}

TEST(CollectiveFit, RefusesUnsortedOrInvalidPoints) {
  EXPECT_THROW(fit_collective_curve(std::vector<CollectivePoint>{{1024, 896, 1e-5}}, {}),
               InputError);
  EXPECT_THROW(
      fit_collective_curve(std::vector<CollectivePoint>{{2048, 1792, 1e-5}, {1024, 896, 1e-5}}, {}),
      InputError);
  EXPECT_THROW(
      fit_collective_curve(std::vector<CollectivePoint>{{1024, 896, 0.0}, {2048, 1792, 1e-5}}, {}),
      InputError);
}

}  // namespace
}  // namespace cpsim::calibrate
