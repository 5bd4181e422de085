#pragma once
/// @file The current UTC time as ISO 8601 ("2026-11-25T23:40:00Z"), for the dates calibration
/// records (header-only: the CUDA module and the library both use it).

#include <ctime>
#include <string>

namespace cpsim::calibrate {

inline std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

}  // namespace cpsim::calibrate
