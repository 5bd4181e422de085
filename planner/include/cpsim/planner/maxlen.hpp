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
  enum class Kind {
    kNone,
    kGpuMemory,
    kHostMemory,
    kLengthLimit,
    kDivisibility,
    kKernelLimit,
    kStepTime,  ///< MaxLenOptions::max_step_time_s: the step one step longer is slower than that
  };
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
  std::int64_t granularity = 64 * 1024;  ///< tokens
  /// Replay the caching allocator at the answer and step down while its reserved memory does not
  /// fit (check_reserved_memory). Off: the answer holds for the allocated peak only (an upper
  /// bound), for searches that check the few answers they show.
  bool check_reserved = true;
  std::int64_t max_tokens = std::int64_t{1} << 30;  ///< search ceiling
  /// Evaluations at once: above 1, a helper thread evaluates the length the search is likely to
  /// probe next while the current one runs. The search only reads the lengths it asks for, so
  /// every field of the result is the same for any value and any timing.
  int threads = 2;
  RefusalText refusal_text;
  /// Above 0: the answer is also the longest length whose step takes at most this many seconds
  /// (the cap binds where it is shorter than what memory allows; kStepTime).
  double max_step_time_s = 0;
  /// The calling thread's buffers to build and simulate in (nullptr: the search's own), so that
  /// a caller running many searches (plan's workers) reuses memory already faulted in.
  EvaluationScratch* scratch = nullptr;
};

struct MaxLenResult {
  std::int64_t max_seq_len = 0;     ///< 0 when not even one step fits
  std::int64_t step = 0;            ///< granularity combined with what the method requires
  sim::StepReport at_max;           ///< the step at max_seq_len (when > 0)
  BindingConstraint binding;        ///< why max_seq_len + step does not fit
  std::int64_t headroom_bytes = 0;  ///< GPU capacity − margin − peak (reserved) at max_seq_len
  int evaluations = 0;  ///< lengths the search probed (speculative evaluations not counted)
  bool monotone = true;
  std::vector<std::string> warnings;
};

/// Sequence length multiple a configuration requires: C (CP degree), 2·C for zigzag rings, and
/// the FPDT chunk.
std::int64_t required_multiple(const sim::ScheduleInputs& inputs);

/// Replays the caching allocator at `result.max_seq_len` (base's margin) and lowers the length,
/// binding and step report to the longest length whose reserved memory fits. Memory is taken to
/// be monotone in the length below the answer.
void check_reserved_memory(const sim::ScheduleInputs& base,
                           MaxLenResult& result,
                           EvaluationScratch* scratch = nullptr);

/// The margin is `base.margin`; the GPU peak is checked against it on the allocated peak during the
/// search and on the reserved memory at the answer (check_reserved).
/// @throws InputError for configurations that cannot run at any length (heads vs degrees, flags).
MaxLenResult max_seq_len(const sim::ScheduleInputs& base, const MaxLenOptions& options = {});

}  // namespace cpsim::planner
