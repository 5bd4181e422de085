// libFuzzer target for the validation case loader (schema cpsim.validation/1, what `cpsim
// validate` reads from data/validation/). parse_validation_case may accept the input or throw
// cpsim::InputError; anything else (another exception, a crash, a sanitizer report, a hang) is a
// bug, and so is an accepted case that breaks the invariants the parser promises.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "cpsim/models/error.hpp"
#include "cpsim/planner/validation_case.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const cpsim::planner::ValidationCase c =
        cpsim::planner::parse_validation_case(text, "fuzz.json");
    const auto quantities = cpsim::planner::validation_quantities();
    const bool known_quantity =
        std::find(quantities.begin(), quantities.end(), c.quantity) != quantities.end();
    const bool known_bound =
        c.bound == "two-sided" || (c.bound == "lower" && c.quantity == "max_seq_len");
    if (!known_quantity || !known_bound || !(c.published > 0.0) || !(c.tolerance > 0.0) ||
        c.tolerance > 1.0 || c.row < 0) {
      std::fprintf(stderr, "accepted a case that breaks the parser's invariants\n");
      std::abort();
    }
  } catch (const cpsim::InputError&) {
    // Expected for bad input.
  }
  return 0;
}
