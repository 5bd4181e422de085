// The collective sweep of `calibrate run`: warm-up, repetition sizing, deadlines, abort and notes,
// over a CollectiveRig (the CUDA module's NCCL rig, or the tests' fake). docs/CALIBRATION.md.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/calibrate/run_control.hpp"

namespace cpsim::calibrate {
namespace {

std::string size_label(std::int64_t bytes) {
  const auto b = static_cast<double>(bytes);
  if (bytes >= (std::int64_t{1} << 30)) {
    return fmt::format("{:.1f} GiB", b / static_cast<double>(1 << 30));
  }
  if (bytes >= (std::int64_t{1} << 20)) {
    return fmt::format("{:.1f} MiB", b / static_cast<double>(1 << 20));
  }
  return fmt::format("{:.1f} KiB", b / 1024.0);
}

/// Thrown inside the sweep when a wait did not complete: the group is already aborted.
struct GroupLost {
  std::string note;
  bool timed_out = false;
};

/// One enqueue of `calls` collectives and its deadline wait; throws GroupLost on timeout or error.
double run_calls(CollectiveRig& rig,
                 models::Collective op,
                 int ranks,
                 std::int64_t size_bytes,
                 int calls,
                 const CollectivePlan& plan,
                 const WaitClock& clock) {
  rig.enqueue(op, size_bytes, calls);
  const WaitResult w = wait_with_deadline(rig.poll(), plan.timeout_s, clock);
  if (w.status == WaitStatus::kComplete) {
    return rig.elapsed_s() / calls;
  }
  throw GroupLost{
      fmt::format("{} {} ranks {}: {} ({}); the group's communicators were aborted (ncclCommAbort)",
                  models::to_string(op), ranks, size_label(size_bytes),
                  w.status == WaitStatus::kTimedOut ? "timed out" : "failed", w.message),
      w.status == WaitStatus::kTimedOut};
}

double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// One size of one op: an untimed call, a timed call that sizes `inner`, the repetitions.
double time_size(CollectiveRig& rig,
                 models::Collective op,
                 int ranks,
                 std::int64_t size_bytes,
                 const CollectivePlan& plan,
                 const TimingPlan& timing,
                 const WaitClock& clock) {
  return timed_median(
      timing, [&](int calls) { return run_calls(rig, op, ranks, size_bytes, calls, plan, clock); });
}

/// The effective sizes of `op` over `ranks` ranks (requested sizes too small are left out).
std::vector<std::int64_t> sizes_of(models::Collective op, int ranks, const CollectivePlan& plan) {
  std::vector<std::int64_t> out;
  for (const std::int64_t requested : plan.sizes_bytes) {
    if (const std::int64_t s = effective_collective_size(op, ranks, requested); s > 0) {
      out.push_back(s);
    }
  }
  return out;
}

/// Every op of one group; appends samples. Throws GroupLost.
void run_group(CollectiveRig& rig,
               int ranks,
               const CollectivePlan& plan,
               const TimingPlan& timing,
               const WaitClock& clock,
               const StepFn& step,
               std::vector<CollectiveSample>& samples) {
  for (const models::Collective op : plan.ops) {
    const std::vector<std::int64_t> sizes = sizes_of(op, ranks, plan);
    if (!sizes.empty()) {
      // Per communicator and op: the largest, then the smallest size, untimed.
      (void)run_calls(rig, op, ranks, sizes.back(), 1, plan, clock);
      (void)run_calls(rig, op, ranks, sizes.front(), 1, plan, clock);
    }
    for (const std::int64_t requested : plan.sizes_bytes) {
      const std::string label =
          fmt::format("NCCL {} {} GPUs {}", models::to_string(op), ranks, size_label(requested));
      step(label, false);
      const std::int64_t size = effective_collective_size(op, ranks, requested);
      if (size > 0) {
        const double t = time_size(rig, op, ranks, size, plan, timing, clock);
        const double algbw = static_cast<double>(size) / t;
        samples.push_back({op, ranks, size, t, algbw, algbw * busbw_factor(op, ranks)});
      }
      step(label, true);
    }
  }
}

}  // namespace

double timed_median(const TimingPlan& timing, const std::function<double(int calls)>& calls_s) {
  (void)calls_s(1);
  const double estimate_s = std::max(calls_s(1), 1e-7);
  const int inner =
      static_cast<int>(std::clamp(std::ceil(timing.target_rep_s / estimate_s), 1.0,
                                  static_cast<double>(std::max(1, timing.max_inner))));
  const int reps = estimate_s > 0.25 ? 3 : (estimate_s > 0.05 ? 5 : timing.repetitions);
  std::vector<double> times;
  for (int r = 0; r < reps; ++r) {
    times.push_back(calls_s(inner));
  }
  return median_of(std::move(times));
}

CollectiveSweepResult run_collective_sweep(CollectiveRig& rig,
                                           const CollectivePlan& plan,
                                           const TimingPlan& timing,
                                           const WaitClock& clock,
                                           const StepFn& step) {
  CollectiveSweepResult out;
  const std::int64_t largest =
      plan.sizes_bytes.empty()
          ? 0
          : *std::max_element(plan.sizes_bytes.begin(), plan.sizes_bytes.end());
  for (std::size_t gi = 0; gi < plan.groups.size(); ++gi) {
    const int ranks = plan.groups[gi];
    step(fmt::format("NCCL init, {} GPUs", ranks), false);
    bool opened = false;
    try {
      rig.open(ranks, largest);
      opened = true;
      run_group(rig, ranks, plan, timing, clock, step, out.samples);
      rig.close();
    } catch (const GroupLost& lost) {
      out.notes.push_back(lost.note);
      out.nccl_unusable = true;
      out.timed_out = lost.timed_out;
    } catch (const MeasureError& e) {
      // A call failed synchronously: give the communicators up the same way.
      if (opened) {
        rig.poll().abort();
      }
      out.notes.push_back(fmt::format("{} ranks: {}{}", ranks, e.what(),
                                      opened ? "; the group's communicators were aborted "
                                               "(ncclCommAbort)"
                                             : ""));
      out.nccl_unusable = true;
    }
    if (out.nccl_unusable) {
      if (opened) {
        rig.close();
      }
      std::string rest;
      for (std::size_t later = gi + 1; later < plan.groups.size(); ++later) {
        rest += fmt::format("{}{}", rest.empty() ? "" : ", ", plan.groups[later]);
      }
      out.notes.push_back(fmt::format(
          "collectives stopped: the samples of {} ranks before the failure are kept; {}", ranks,
          rest.empty() ? "no later group size was left"
                       : fmt::format("group sizes {} were skipped", rest)));
      return out;
    }
  }
  return out;
}

}  // namespace cpsim::calibrate
