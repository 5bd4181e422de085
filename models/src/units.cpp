#include "cpsim/models/units.hpp"

#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim {
namespace {

constexpr std::int64_t kMaxSimTime = std::numeric_limits<std::int64_t>::max() / 4;
constexpr std::int64_t kMaxLengthTokens = std::int64_t{1} << 40;

/// Rounds `value` (>= 0) to three significant digits and formats it without trailing noise:
/// 3.21, 12.4, 850.
std::string format_three_digits(double value) {
  if (value >= 100.0) {
    return fmt::format("{:.0f}", value);
  }
  if (value >= 10.0) {
    return fmt::format("{:.1f}", value);
  }
  return fmt::format("{:.2f}", value);
}

/// Rounds to three significant digits, so that the unit choice sees the printed value.
double round_three_digits(double value) {
  if (value >= 100.0) {
    return std::round(value);
  }
  if (value >= 10.0) {
    return std::round(value * 10.0) / 10.0;
  }
  return std::round(value * 100.0) / 100.0;
}

}  // namespace

SimTime seconds_to_simtime(double seconds) {
  if (std::isnan(seconds) || seconds <= 0.0) {
    return 0;
  }
  const double ns = seconds * 1e9;
  if (ns >= static_cast<double>(kMaxSimTime)) {
    return kMaxSimTime;
  }
  return static_cast<SimTime>(std::llround(ns));
}

std::int64_t parse_length(std::string_view text, std::string_view field) {
  const auto fail = [&](const std::string& why) -> InputError {
    return InputError(std::string(field), fmt::format("invalid length '{}': {}", text, why));
  };
  if (text.empty()) {
    throw fail("empty; expected a positive integer such as 131072, 128K or 3M");
  }
  std::int64_t multiplier = 1;
  std::string_view digits = text;
  switch (text.back()) {
    case 'k':
    case 'K':
      multiplier = kKiB;
      break;
    case 'm':
    case 'M':
      multiplier = kMiB;
      break;
    case 'g':
    case 'G':
      multiplier = kGiB;
      break;
    default:
      break;
  }
  if (multiplier != 1) {
    digits.remove_suffix(1);
  }
  if (digits.empty()) {
    throw fail("no digits before the suffix");
  }
  std::int64_t value = 0;
  for (const char c : digits) {
    if (c < '0' || c > '9') {
      throw fail("expected a positive integer with an optional K, M or G suffix (K = 1024)");
    }
    value = value * 10 + (c - '0');
    if (value > kMaxLengthTokens) {
      throw fail("exceeds the limit of 2^40 tokens");
    }
  }
  if (value == 0) {
    throw fail("must be positive");
  }
  if (value > kMaxLengthTokens / multiplier) {
    throw fail("exceeds the limit of 2^40 tokens");
  }
  return value * multiplier;
}

std::string format_length(std::int64_t tokens) {
  if (tokens > 0) {
    if (tokens % kGiB == 0) {
      return fmt::format("{}G", tokens / kGiB);
    }
    if (tokens % kMiB == 0) {
      return fmt::format("{}M", tokens / kMiB);
    }
    if (tokens % kKiB == 0) {
      return fmt::format("{}K", tokens / kKiB);
    }
  }
  return fmt::format("{}", tokens);
}

std::string format_bytes(double bytes) {
  if (!std::isfinite(bytes)) {
    return fmt::format("{} B", bytes);
  }
  const char* sign = bytes < 0.0 ? "-" : "";
  const double magnitude = std::fabs(bytes);
  if (std::round(magnitude) < 1024.0) {
    return fmt::format("{}{:.0f} B", sign, magnitude);
  }
  static constexpr std::array<const char*, 5> kUnits = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double scaled = magnitude / 1024.0;
  std::size_t unit = 0;
  // Move up while the printed value (one decimal) would reach 1024.
  while (unit + 1 < kUnits.size() && std::round(scaled * 10.0) / 10.0 >= 1024.0) {
    scaled /= 1024.0;
    ++unit;
  }
  return fmt::format("{}{:.1f} {}", sign, scaled, kUnits[unit]);
}

std::string format_seconds(double seconds) {
  if (!std::isfinite(seconds)) {
    return fmt::format("{} s", seconds);
  }
  const char* sign = seconds < 0.0 ? "-" : "";
  const double magnitude = std::fabs(seconds);
  const double ns = magnitude * 1e9;
  if (std::round(ns) < 1000.0) {
    return fmt::format("{}{:.0f} ns", sign, ns);
  }
  struct Unit {
    double scale;
    const char* name;
  };
  // Each unit is used while the value printed in it stays below `below` (three significant
  // digits): 100 s and more read as minutes, 100 min as hours, 48 h as days.
  struct Range {
    Unit unit;
    double below;
  };
  static constexpr std::array<Range, 6> kRanges = {{{{1e-6, "us"}, 1000.0},
                                                    {{1e-3, "ms"}, 1000.0},
                                                    {{1.0, "s"}, 100.0},
                                                    {{60.0, "min"}, 100.0},
                                                    {{3600.0, "h"}, 48.0},
                                                    {{86400.0, "d"}, 0.0}}};
  for (std::size_t i = 0; i + 1 < kRanges.size(); ++i) {
    const double scaled = magnitude / kRanges[i].unit.scale;
    if (round_three_digits(scaled) < kRanges[i].below) {
      return fmt::format("{}{} {}", sign, format_three_digits(scaled), kRanges[i].unit.name);
    }
  }
  return fmt::format("{}{} d", sign, format_three_digits(magnitude / kRanges.back().unit.scale));
}

}  // namespace cpsim
