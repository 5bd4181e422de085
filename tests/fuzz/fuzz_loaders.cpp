// libFuzzer target for every text loader of cpsim. The first byte picks the loader; the rest is
// the input. A loader may accept the input or throw cpsim::InputError; anything else (another
// exception, a crash, a sanitizer report, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>

#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"
#include "cpsim/models/units.hpp"
#include "cpsim/sim/schedule.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) {
    return 0;
  }
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    switch (data[0] % 4) {
      case 0: {
        const cpsim::models::TransformerSpec m = cpsim::models::parse_hf_config(text, "fuzz.json");
        (void)cpsim::models::count_parameters(m);
        break;
      }
      case 1:
        (void)cpsim::models::parse_hardware_profile(text, "fuzz.json");
        break;
      case 2:
        (void)cpsim::models::parse_recipe(text, "fuzz.json");
        break;
      default:
        (void)cpsim::parse_length(text, "--seq");
        break;
    }
  } catch (const cpsim::InputError&) {
    // Expected for bad input.
  }
  return 0;
}
