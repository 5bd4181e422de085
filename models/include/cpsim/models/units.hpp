#pragma once
/// @file Unit vocabulary: simulated time in integer nanoseconds, sizes in bytes, binary multiples.

#include <cstdint>
#include <string>
#include <string_view>

namespace cpsim {

/// Simulated time in integer nanoseconds: event order never depends on floating-point rounding.
using SimTime = std::int64_t;

inline constexpr std::int64_t kKiB = 1024;
inline constexpr std::int64_t kMiB = 1024 * kKiB;
inline constexpr std::int64_t kGiB = 1024 * kMiB;
inline constexpr std::int64_t kTiB = 1024 * kGiB;

/// Bytes per element of the precisions cpsim models.
inline constexpr std::int64_t kBf16Bytes = 2;
inline constexpr std::int64_t kFp32Bytes = 4;

/// Converts seconds to integer nanoseconds, rounding to nearest; negative input clamps to 0.
SimTime seconds_to_simtime(double seconds);
inline double simtime_to_seconds(SimTime t) {
  return static_cast<double>(t) * 1e-9;
}

/// Parses a token count: `131072`, `128K`, `3M`, `1G` (K = 1024, M = 1024², G = 1024³),
/// case-insensitive.
/// @throws InputError naming `field` if the text is not a positive integer with an optional suffix,
///         or if the value exceeds 2^40 tokens.
std::int64_t parse_length(std::string_view text, std::string_view field);

/// Formats a token count compactly: 3145728 -> "3M", 131072 -> "128K", 1000 -> "1000".
std::string format_length(std::int64_t tokens);

/// Formats bytes with a binary unit: "71.3 GiB".
std::string format_bytes(double bytes);

/// Formats seconds with a readable unit: "12.4 ms", "3.21 s".
std::string format_seconds(double seconds);

}  // namespace cpsim
