#include "cpsim/models/curve.hpp"

#include <cmath>
#include <limits>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"

namespace cpsim::models {
namespace {

using Points = std::vector<std::pair<double, double>>;

TEST(LogCurve, EmptyCurveReturnsTheFallback) {
  const LogCurve empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_DOUBLE_EQ(empty(123.0), 1.0);
  EXPECT_DOUBLE_EQ(empty(123.0, 0.25), 0.25);
  EXPECT_TRUE(LogCurve(Points{}).empty());
}

TEST(LogCurve, SinglePointIsConstant) {
  const LogCurve c(Points{{8.0, 0.5}});
  EXPECT_DOUBLE_EQ(c(1.0), 0.5);
  EXPECT_DOUBLE_EQ(c(8.0), 0.5);
  EXPECT_DOUBLE_EQ(c(1e9), 0.5);
}

TEST(LogCurve, InterpolatesLinearlyInLog2) {
  const LogCurve c(Points{{1.0, 0.0}, {4.0, 1.0}, {16.0, 3.0}});
  EXPECT_DOUBLE_EQ(c(1.0), 0.0);
  EXPECT_DOUBLE_EQ(c(2.0), 0.5);  // log2 = 1, halfway between 0 and 2
  EXPECT_DOUBLE_EQ(c(4.0), 1.0);  // on a knot
  EXPECT_DOUBLE_EQ(c(8.0), 2.0);  // halfway between log2 4 = 2 and log2 16 = 4
  EXPECT_DOUBLE_EQ(c(16.0), 3.0);
  EXPECT_NEAR(c(std::sqrt(2.0)), 0.25, 1e-12);
}

TEST(LogCurve, ClampsOutsideTheTable) {
  const LogCurve c(Points{{512.0, 0.3}, {16384.0, 0.6}});
  EXPECT_DOUBLE_EQ(c(1.0), 0.3);
  EXPECT_DOUBLE_EQ(c(0.0), 0.3);
  EXPECT_DOUBLE_EQ(c(-5.0), 0.3);
  EXPECT_DOUBLE_EQ(c(std::nan("")), 0.3);
  EXPECT_DOUBLE_EQ(c(1e12), 0.6);
  EXPECT_DOUBLE_EQ(c(std::numeric_limits<double>::infinity()), 0.6);
}

// An x one ulp below the last knot whose log2 rounds to the knot's own (log2(2^40 − 1 ulp) is
// 40.0 in double): it lies in the last interval, at its end. The lookup once read one knot past
// the table there (found by AddressSanitizer through a GEMM fit whose FLOP bins met a knot).
TEST(LogCurve, AnXWhoseLog2RoundsToTheLastKnotIsInTheLastInterval) {
  const double last = std::ldexp(1.0, 40);
  const LogCurve c({{1.0, 0.0}, {last, 1.0}});
  const double below = std::nextafter(last, 0.0);
  ASSERT_LT(below, last);
  ASSERT_EQ(std::log2(below), 40.0);
  EXPECT_DOUBLE_EQ(c(below), 1.0);
  const LogCurve three({{1.0, 0.0}, {2.0, 0.5}, {last, 1.0}});
  EXPECT_DOUBLE_EQ(three(below), 1.0);
}

TEST(LogCurve, KeepsThePoints) {
  const Points p{{1.0, 2.0}, {3.0, 4.0}};
  EXPECT_EQ(LogCurve(p).points(), p);
}

TEST(LogCurve, RejectsBadPoints) {
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  for (const Points& bad : {Points{{0.0, 1.0}}, Points{{-1.0, 1.0}}, Points{{nan, 1.0}},
                            Points{{inf, 1.0}}, Points{{1.0, nan}}, Points{{1.0, inf}},
                            Points{{2.0, 1.0}, {2.0, 1.0}}, Points{{4.0, 1.0}, {2.0, 1.0}}}) {
    try {
      const LogCurve c(bad);
      ADD_FAILURE() << "accepted a bad curve";
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "points");
    }
  }
}

}  // namespace
}  // namespace cpsim::models
