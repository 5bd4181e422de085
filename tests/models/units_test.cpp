#include "cpsim/models/units.hpp"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"

namespace cpsim {
namespace {

TEST(SecondsToSimTime, RoundsToNearestNanosecond) {
  EXPECT_EQ(seconds_to_simtime(0.0), 0);
  EXPECT_EQ(seconds_to_simtime(1.0), 1'000'000'000);
  EXPECT_EQ(seconds_to_simtime(1.4e-9), 1);
  EXPECT_EQ(seconds_to_simtime(1.6e-9), 2);
  EXPECT_EQ(seconds_to_simtime(12.5e-6), 12'500);
}

TEST(SecondsToSimTime, ClampsNegativeNanAndHuge) {
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max() / 4;
  EXPECT_EQ(seconds_to_simtime(-1.0), 0);
  EXPECT_EQ(seconds_to_simtime(std::nan("")), 0);
  EXPECT_EQ(seconds_to_simtime(-std::numeric_limits<double>::infinity()), 0);
  EXPECT_EQ(seconds_to_simtime(std::numeric_limits<double>::infinity()), kMax);
  EXPECT_EQ(seconds_to_simtime(1e30), kMax);
}

TEST(SecondsToSimTime, RoundTripsThroughSeconds) {
  EXPECT_DOUBLE_EQ(simtime_to_seconds(seconds_to_simtime(3.25)), 3.25);
}

TEST(ParseLength, AcceptsPlainAndSuffixed) {
  EXPECT_EQ(parse_length("131072", "--seq"), 131072);
  EXPECT_EQ(parse_length("1", "--seq"), 1);
  EXPECT_EQ(parse_length("128K", "--seq"), 128 * 1024);
  EXPECT_EQ(parse_length("128k", "--seq"), 128 * 1024);
  EXPECT_EQ(parse_length("3M", "--seq"), 3 * 1024 * 1024);
  EXPECT_EQ(parse_length("3m", "--seq"), 3 * 1024 * 1024);
  EXPECT_EQ(parse_length("1G", "--seq"), kGiB);
  EXPECT_EQ(parse_length("1024G", "--seq"), std::int64_t{1} << 40);  // the limit itself
  EXPECT_EQ(parse_length("1099511627776", "--seq"), std::int64_t{1} << 40);
  EXPECT_EQ(parse_length("007", "--seq"), 7);
}

TEST(ParseLength, RejectsBadInputNamingTheField) {
  for (const char* bad :
       {"", "-5", "+5", "1.5M", "12x", "0", "0K", "K", "M", "12 K", " 12", "12KK", "1e6", "1025G",
        "1099511627777", "99999999999999999999999999", "1i", "1Ki"}) {
    try {
      parse_length(bad, "--seq");
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), "--seq") << bad;
      EXPECT_EQ(std::string(e.what()).find('\n'), std::string::npos) << bad;
    }
  }
}

TEST(FormatLength, UsesTheLargestExactBinaryMultiple) {
  EXPECT_EQ(format_length(3 * kMiB), "3M");
  EXPECT_EQ(format_length(131072), "128K");
  EXPECT_EQ(format_length(1000), "1000");
  EXPECT_EQ(format_length(kGiB), "1G");
  EXPECT_EQ(format_length(1536 * kKiB), "1536K");
  EXPECT_EQ(format_length(0), "0");
  EXPECT_EQ(format_length(-1024), "-1024");
}

TEST(FormatLength, RoundTripsWithParseLength) {
  for (const std::int64_t n :
       {std::int64_t{1}, std::int64_t{1000}, 128 * kKiB, 3 * kMiB, 1536 * kKiB, 7 * kGiB}) {
    EXPECT_EQ(parse_length(format_length(n), "x"), n);
  }
}

TEST(FormatBytes, PicksABinaryUnit) {
  EXPECT_EQ(format_bytes(12), "12 B");
  EXPECT_EQ(format_bytes(0), "0 B");
  EXPECT_EQ(format_bytes(1023), "1023 B");
  EXPECT_EQ(format_bytes(1024), "1.0 KiB");
  EXPECT_EQ(format_bytes(512.0 * 1024 * 1024), "512.0 MiB");
  EXPECT_EQ(format_bytes(71.3 * 1024 * 1024 * 1024), "71.3 GiB");
  EXPECT_EQ(format_bytes(2.5 * 1024.0 * kGiB), "2.5 TiB");
  // Never prints "1024.0 MiB": rounding carries into the next unit.
  EXPECT_EQ(format_bytes(1024.0 * 1024 * 1024 - 1), "1.0 GiB");
  EXPECT_EQ(format_bytes(-2048), "-2.0 KiB");
}

TEST(FormatSeconds, UsesThreeSignificantDigits) {
  EXPECT_EQ(format_seconds(12.4e-3), "12.4 ms");
  EXPECT_EQ(format_seconds(3.21), "3.21 s");
  EXPECT_EQ(format_seconds(850e-6), "850 us");
  EXPECT_EQ(format_seconds(42e-9), "42 ns");
  EXPECT_EQ(format_seconds(0.0), "0 ns");
  EXPECT_EQ(format_seconds(1.5e-6), "1.50 us");
  // Long steps and runs in the units a person reads: min from 100 s, h from 100 min, d from 48 h.
  EXPECT_EQ(format_seconds(99.94), "99.9 s");
  EXPECT_EQ(format_seconds(99.96), "1.67 min");  // 100 s
  EXPECT_EQ(format_seconds(2621.0), "43.7 min");
  EXPECT_EQ(format_seconds(3600.0), "60.0 min");
  EXPECT_EQ(format_seconds(6000.0), "1.67 h");
  EXPECT_EQ(format_seconds(47.9 * 3600.0), "47.9 h");
  EXPECT_EQ(format_seconds(48.0 * 3600.0), "2.00 d");
  EXPECT_EQ(format_seconds(1500.0 * 86400.0), "1500 d");
  // 999.96 ms prints as 1.00 s, not 1000 ms.
  EXPECT_EQ(format_seconds(0.99996), "1.00 s");
  EXPECT_EQ(format_seconds(-0.5), "-500 ms");
}

}  // namespace
}  // namespace cpsim
