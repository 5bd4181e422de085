// libFuzzer target for the raw calibration loader (schema cpsim.calibration/1, what `cpsim
// calibrate fit` reads). parse_raw may accept the input or throw cpsim::InputError; anything else
// (another exception, a crash, a sanitizer report, a hang) is a bug. An accepted input must also
// round-trip: write_raw's text parses again and writes the same text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cpsim/calibrate/raw.hpp"
#include "cpsim/models/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  cpsim::calibrate::RawCalibration raw;
  try {
    raw = cpsim::calibrate::parse_raw(text, "fuzz.json");
  } catch (const cpsim::InputError&) {
    return 0;  // Expected for bad input.
  }
  const std::string written = cpsim::calibrate::write_raw(raw);
  try {
    const std::string again =
        cpsim::calibrate::write_raw(cpsim::calibrate::parse_raw(written, "written.json"));
    if (again != written) {
      std::fprintf(stderr, "write_raw is not stable:\n%s\n---\n%s\n", written.c_str(),
                   again.c_str());
      std::abort();
    }
  } catch (const cpsim::InputError& e) {
    std::fprintf(stderr, "write_raw's output is refused: %s\n%s\n", e.what(), written.c_str());
    std::abort();
  }
  return 0;
}
