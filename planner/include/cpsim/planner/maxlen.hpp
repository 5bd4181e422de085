#pragma once
/// @file The longest sequence a configuration can train, over multiples of a granularity: a secant
/// search on memory pressure (peak / usable capacity, about linear in the length) with doubling and
/// bisection as fallbacks, then a check of the neighbours for non-monotone memory. When memory is
/// not monotone, the answer is the first fit/fail boundary the search meets (others may exist).

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cpsim/planner/evaluate.hpp"

namespace cpsim::planner {

/// What stops a configuration from going one step longer.
struct BindingConstraint {
  enum class Kind { kNone, kGpuMemory, kHostMemory, kLengthLimit, kDivisibility, kKernelLimit };
  Kind kind = Kind::kNone;
  std::string text;              ///< one line for humans
  std::int64_t seq_len = 0;      ///< the length that failed
  int rank = 0;                  ///< GPU memory: the rank at the peak
  std::string category;          ///< GPU memory: largest sequence-dependent category at the peak
  std::string op;                ///< GPU memory: the op at the peak
  std::int64_t used_bytes = 0;   ///< peak (GPU) or per-node host bytes
  std::int64_t limit_bytes = 0;  ///< capacity minus margin
};
const char* to_string(BindingConstraint::Kind k);

/// How a refused configuration reads in results (refusals, errors of candidates): a front end
/// names the input at fault in its own terms. Empty: default_refusal_text.
using RefusalText = std::function<std::string(const sim::ConfigError&)>;
/// "<quantity>: <message>", e.g. "seq_len: must be positive".
std::string default_refusal_text(const sim::ConfigError& e);

struct MaxLenOptions {
  std::int64_t granularity = 64 * 1024;             ///< tokens
  std::int64_t memory_margin_bytes = 0;             ///< kept free on every GPU
  std::int64_t max_tokens = std::int64_t{1} << 30;  ///< search ceiling
  /// Evaluations at once: above 1, a helper thread evaluates the length the search is likely to
  /// probe next while the current one runs. The search only reads the lengths it asks for, so
  /// every field of the result is the same for any value and any timing.
  int threads = 2;
  RefusalText refusal_text;
};

struct MaxLenResult {
  std::int64_t max_seq_len = 0;     ///< 0 when not even one step fits
  std::int64_t step = 0;            ///< granularity combined with what the method requires
  sim::StepReport at_max;           ///< the step at max_seq_len (when > 0)
  BindingConstraint binding;        ///< why max_seq_len + step does not fit
  std::int64_t headroom_bytes = 0;  ///< GPU capacity − margin − peak at max_seq_len
  int evaluations = 0;  ///< lengths the search probed (speculative evaluations not counted)
  bool monotone = true;
  std::vector<std::string> warnings;
};

/// Sequence length multiple a configuration requires: C (CP degree), 2·C for zigzag rings, and
/// the FPDT chunk.
std::int64_t required_multiple(const sim::ScheduleInputs& inputs);

/// Whether a report fits under a margin: peak + margin ≤ GPU capacity and host ≤ host capacity.
bool fits_with_margin(const sim::StepReport& report, std::int64_t margin_bytes);

/// @throws InputError for configurations that cannot run at any length (heads vs degrees, flags).
MaxLenResult max_seq_len(const sim::ScheduleInputs& base, const MaxLenOptions& options = {});

}  // namespace cpsim::planner
