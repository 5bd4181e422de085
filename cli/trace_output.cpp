#include "trace_output.hpp"

#include <charconv>
#include <chrono>
#include <iostream>
#include <unistd.h>
#include <utility>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"
#include "cpsim/models/units.hpp"

#include "common.hpp"
#include "output.hpp"

namespace cpsim::cli {
namespace {

constexpr std::int64_t kDefaultTraceLimitBytes = std::int64_t{1} << 30;

// A non-negative integer, the whole of `text`.
bool parse_index(std::string_view text, std::int64_t& value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, value);
  return !text.empty() && ec == std::errc{} && ptr == end && value >= 0;
}

// Percent of the events written, on stderr: rewritten in place on a terminal, otherwise a plain
// line every few seconds. Nothing during the first two seconds (short writes stay quiet).
/// Traces from this estimated size on announce their size before writing (non-terminal stderr).
constexpr std::int64_t kEstimateNoticeBytes = std::int64_t{64} << 20;

class TraceProgress {
 public:
  explicit TraceProgress(std::int64_t total_events)
      : total_(std::max<std::int64_t>(1, total_events)),
        tty_(isatty(STDERR_FILENO) != 0),
        start_(Clock::now()),
        last_(start_) {}
  TraceProgress(const TraceProgress&) = delete;
  TraceProgress& operator=(const TraceProgress&) = delete;
  ~TraceProgress() {
    if (shown_ && tty_) {
      std::cerr << "\n" << std::flush;
    }
  }

  void operator()(std::int64_t written) {
    const auto now = Clock::now();
    if (now - start_ < std::chrono::seconds(2) ||
        (!tty_ && now - last_ < std::chrono::seconds(5))) {
      return;
    }
    const int percent = static_cast<int>(std::min<std::int64_t>(100, 100 * written / total_));
    if (percent == last_percent_) {
      return;
    }
    last_percent_ = percent;
    last_ = now;
    shown_ = true;
    const std::string line =
        fmt::format("cpsim simulate: trace {} % written ({} events)", percent, written);
    std::cerr << (tty_ ? "\r" + line : line + "\n") << std::flush;
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::int64_t total_;
  bool tty_;
  Clock::time_point start_;
  Clock::time_point last_;
  int last_percent_ = -1;
  bool shown_ = false;
};

std::string describe_list(const std::string& text, const char* fallback) {
  return text.empty() ? fallback : text;
}

}  // namespace

std::vector<bool> parse_index_list(std::string_view text,
                                   std::int64_t count,
                                   std::string_view field) {
  const std::string f(field);
  if (text == "all") {
    return {};
  }
  if (text.empty()) {
    throw InputError(f, "expected `all` or a list such as 0,3,5-7");
  }
  std::vector<bool> mask(static_cast<std::size_t>(count), false);
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, comma - start);
    const std::size_t dash = item.find('-');
    std::int64_t first = 0;
    std::int64_t last = 0;
    const bool ok =
        dash == std::string_view::npos
            ? parse_index(item, first) && parse_index(item, last)
            : parse_index(item.substr(0, dash), first) && parse_index(item.substr(dash + 1), last);
    if (!ok || first > last) {
      throw InputError(f, fmt::format("'{}' is not an index or a range a-b (expected `all` or a "
                                      "list such as 0,3,5-7)",
                                      item));
    }
    if (last >= count) {
      throw InputError(f, fmt::format("'{}' is out of range: {} from 0 to {}", item,
                                      f == "--trace-ranks" ? "ranks" : "layers", count - 1));
    }
    for (std::int64_t i = first; i <= last; ++i) {
      mask[static_cast<std::size_t>(i)] = true;
    }
    start = comma + 1;
  }
  return mask;
}

sim::TraceSelection trace_selection(const SimulateArgs& a, const sim::ScheduleInputs& in) {
  sim::TraceSelection s;
  if (a.trace.empty()) {
    const std::pair<const char*, bool> given[] = {{"--trace-ranks", !a.trace_ranks.empty()},
                                                  {"--trace-layers", !a.trace_layers.empty()},
                                                  {"--trace-max-bytes", !a.trace_max_bytes.empty()},
                                                  {"--trace-force", a.trace_force}};
    for (const auto& [flag, set] : given) {
      if (set) {
        throw InputError(flag, "needs --trace FILE");
      }
    }
    return s;
  }
  s.ranks = parse_index_list(a.trace_ranks.empty() ? "0" : a.trace_ranks, in.parallel.gpus,
                             "--trace-ranks");
  if (!a.trace_layers.empty()) {
    s.layers = parse_index_list(a.trace_layers, in.model.layers, "--trace-layers");
  }
  if (!a.trace_max_bytes.empty()) {
    (void)parse_length(a.trace_max_bytes, "--trace-max-bytes");
  }
  return s;
}

void write_trace(const SimulateArgs& a,
                 const sim::ScheduleInputs& in,
                 const planner::Evaluation& e,
                 const sim::TraceSelection& selection) {
  sim::TraceOptions opts;
  opts.selection = selection;
  opts.allocator_mode = in.recipe.expandable_segments ? sim::AllocatorMode::kExpandableSegments
                                                      : sim::AllocatorMode::kSegments;
  opts.device_capacity_bytes = in.hardware.hbm_capacity_bytes;
  const sim::TraceEstimate est = sim::estimate_chrome_trace(*e.workload, *e.result, opts);
  const std::string ranks = describe_list(a.trace_ranks, "0");
  const std::string layers = describe_list(a.trace_layers, "all");
  const std::int64_t limit = a.trace_max_bytes.empty()
                                 ? kDefaultTraceLimitBytes
                                 : parse_length(a.trace_max_bytes, "--trace-max-bytes");
  if (est.bytes > limit && !a.trace_force) {
    throw InputError(
        "--trace",
        fmt::format("the trace would be about {} ({} events), above the limit of {}: narrow it "
                    "with --trace-layers (e.g. 0-1) or --trace-ranks, or raise the limit with "
                    "--trace-max-bytes or --trace-force",
                    format_bytes(static_cast<double>(est.bytes)), est.events,
                    format_bytes(static_cast<double>(limit))));
  }
  TraceProgress progress(est.events);
  opts.progress = [&progress](std::int64_t written) { progress(written); };
  OutputFile trace(a.trace, "--trace");
  // Once the file is open (a path that cannot be written gets its one error line only), and only
  // for a trace that takes a while to write or on a terminal: a small trace that fails to write
  // still reports its failure as the one line on stderr.
  if (est.bytes >= kEstimateNoticeBytes || isatty(STDERR_FILENO) != 0) {
    std::cerr << fmt::format("cpsim simulate: trace of ranks {}, layers {}: about {} events, {}\n",
                             ranks, layers, est.events,
                             format_bytes(static_cast<double>(est.bytes)));
  }
  sim::write_chrome_trace(*e.workload, *e.result, trace.stream(), opts);
  trace.commit();
}

}  // namespace cpsim::cli
