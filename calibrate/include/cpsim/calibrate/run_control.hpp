#pragma once
/// @file Control flow of `cpsim calibrate run` below which the CUDA module and the tests' fake
/// differ: waiting for a collective with a deadline (cudaEventQuery and ncclCommGetAsyncError
/// polling, ncclCommAbort on timeout or error), the collective rig a sweep drives, and the list
/// of sweeps. Header-only parts (the wait) are used by the CUDA module too, which links no cpsim
/// library. docs/CALIBRATION.md "Robust runs" describes the behaviour.

#include <array>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "cpsim/calibrate/raw.hpp"
#include "cpsim/models/hardware.hpp"

namespace cpsim::calibrate {

/// The sweeps of `calibrate run`, in run order (the names of --only, --skip and context.sweeps).
inline constexpr std::array<std::string_view, 7> kSweepNames = {
    "launch", "memory", "gemm", "attention", "collectives", "host_copies", "interference"};

/// Names of the bits of nvmlDeviceGetCurrentClocksThrottleReasons (nvml.h,
/// nvmlClocksThrottleReason*: GpuIdle 0x1, ApplicationsClocksSetting 0x2, SwPowerCap 0x4,
/// HwSlowdown 0x8, SyncBoost 0x10, SwThermalSlowdown 0x20, HwThermalSlowdown 0x40,
/// HwPowerBrakeSlowdown 0x80, DisplayClockSetting 0x100); other bits as one "0x..".
inline std::vector<std::string> throttle_reason_names(std::uint64_t mask) {
  constexpr std::pair<std::uint64_t, const char*> kReasons[] = {
      {0x1, "gpu_idle"},
      {0x2, "applications_clocks_setting"},
      {0x4, "sw_power_cap"},
      {0x8, "hw_slowdown"},
      {0x10, "sync_boost"},
      {0x20, "sw_thermal_slowdown"},
      {0x40, "hw_thermal_slowdown"},
      {0x80, "hw_power_brake_slowdown"},
      {0x100, "display_clock_setting"},
  };
  std::vector<std::string> out;
  std::uint64_t known = 0;
  for (const auto& [bit, name] : kReasons) {
    known |= bit;
    if ((mask & bit) != 0) {
      out.emplace_back(name);
    }
  }
  if ((mask & ~known) != 0) {
    char hex[32];
    std::snprintf(hex, sizeof(hex), "0x%llx", static_cast<unsigned long long>(mask & ~known));
    out.emplace_back(hex);
  }
  return out;
}

/// What a deadline wait polls. The CUDA module implements it over a group's streams and
/// communicators; tests fake it.
class CompletionPoll {
 public:
  virtual ~CompletionPoll() = default;
  CompletionPoll() = default;
  CompletionPoll(const CompletionPoll&) = delete;
  CompletionPoll& operator=(const CompletionPoll&) = delete;
  /// True when the work waited for has finished on every rank (cudaEventQuery == cudaSuccess on
  /// each rank's stop event).
  virtual bool complete() = 0;
  /// An error seen while polling (ncclCommGetAsyncError other than ncclSuccess/ncclInProgress, or
  /// an event query that failed), naming the rank; nothing while all is well.
  virtual std::optional<std::string> error() = 0;
  /// Gives the group up: ncclCommAbort on every communicator (never ncclCommDestroy, which waits
  /// for the hung work and can block forever).
  virtual void abort() = 0;
};

/// The clock of a wait; tests give a fake one so a 60 s deadline passes in no wall time.
struct WaitClock {
  std::function<double()> now_s;
  std::function<void(double)> sleep_s;
};

inline WaitClock steady_wait_clock() {
  return WaitClock{
      [] {
        return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
            .count();
      },
      [](double s) { std::this_thread::sleep_for(std::chrono::duration<double>(s)); }};
}

enum class WaitStatus { kComplete, kTimedOut, kFailed };

struct WaitResult {
  WaitStatus status = WaitStatus::kComplete;
  std::string message;  ///< the error, or "not complete after N s"
  double waited_s = 0.0;
};

/// Polls `poll` until complete, an error, or `timeout_s` has passed; on error or timeout calls
/// poll.abort() before returning. Polls every 100 µs (the timing comes from the events, not from
/// this loop, so the interval costs no accuracy).
inline WaitResult wait_with_deadline(CompletionPoll& poll,
                                     double timeout_s,
                                     const WaitClock& clock) {
  constexpr double kPollInterval_s = 1e-4;
  const double start_s = clock.now_s();
  while (true) {
    if (auto e = poll.error()) {
      poll.abort();
      return WaitResult{WaitStatus::kFailed, *e, clock.now_s() - start_s};
    }
    if (poll.complete()) {
      return WaitResult{WaitStatus::kComplete, {}, clock.now_s() - start_s};
    }
    const double waited_s = clock.now_s() - start_s;
    if (waited_s >= timeout_s) {
      poll.abort();
      return WaitResult{
          WaitStatus::kTimedOut,
          "not complete after " + std::to_string(static_cast<long long>(timeout_s)) + " s",
          waited_s};
    }
    clock.sleep_s(kPollInterval_s);
  }
}

/// One group of ranks of the collective sweep: communicators, streams, events and buffers on the
/// first `ranks` local GPUs. The CUDA module implements it with NCCL; tests fake it. Calls
/// throw MeasureError when a CUDA or NCCL call fails.
class CollectiveRig {
 public:
  virtual ~CollectiveRig() = default;
  CollectiveRig() = default;
  CollectiveRig(const CollectiveRig&) = delete;
  CollectiveRig& operator=(const CollectiveRig&) = delete;
  /// Creates the group's communicators and buffers for sizes up to `largest_size_bytes`.
  virtual void open(int ranks, std::int64_t largest_size_bytes) = 0;
  /// Enqueues `calls` collectives of nccl-tests size `size_bytes` back to back on every rank,
  /// between a start and a stop event per rank (buffers rotated against L2); returns at once.
  virtual void enqueue(models::Collective op, std::int64_t size_bytes, int calls) = 0;
  /// The completion of the last enqueue (stop events, communicators' asynchronous errors, abort).
  virtual CompletionPoll& poll() = 0;
  /// Seconds from start to stop event of the last enqueue, of the slowest rank (complete only).
  virtual double elapsed_s() = 0;
  /// Frees the group: ncclCommDestroy when no abort happened, else only the memory.
  virtual void close() = 0;
};

/// The timing rules of a run (nccl-tests practice; docs/CALIBRATION.md "Method").
struct TimingPlan {
  int repetitions = 10;        ///< timed repetitions, median kept (5 over 50 ms, 3 over 250 ms)
  double target_rep_s = 2e-3;  ///< back-to-back calls per repetition until about this long
  int max_inner = 64;
};

/// The median time per call of one measured thing, by `timing`: an untimed call, a timed call that
/// sizes the calls per repetition, then the repetitions. `calls_s(n)` runs n calls back to back
/// and returns their time per call (s).
double timed_median(const TimingPlan& timing, const std::function<double(int calls)>& calls_s);

/// What the collective sweep measures.
struct CollectivePlan {
  std::vector<int> groups;  ///< group sizes (ranks), each over GPUs 0..g-1
  std::vector<models::Collective> ops;
  std::vector<std::int64_t> sizes_bytes;  ///< requested nccl-tests sizes, ascending
  double timeout_s = 120.0;               ///< deadline of one wait (one call or one repetition)
};

/// The nccl-tests size actually moved for a requested size: all-gather, reduce-scatter and
/// all-reduce in bf16 elements (2 bytes) split evenly over the ranks where the op splits, the
/// all-to-all in int8 chunks of an even byte count per peer, send/recv as asked; 0 when too small.
inline std::int64_t effective_collective_size(models::Collective op,
                                              int ranks,
                                              std::int64_t size_bytes) {
  const std::int64_t g = ranks;
  switch (op) {
    case models::Collective::kAllToAll:
      return size_bytes / g / 2 * 2 * g;
    case models::Collective::kAllGather:
    case models::Collective::kReduceScatter:
      return size_bytes / (2 * g) * 2 * g;
    case models::Collective::kAllReduce:
      return size_bytes / 2 * 2;
    case models::Collective::kSendRecv:
      return size_bytes;
  }
  return size_bytes;
}

struct CollectiveSweepResult {
  std::vector<CollectiveSample> samples;
  std::vector<std::string> notes;
  bool nccl_unusable = false;  ///< a collective timed out or failed: later NCCL work is skipped
  bool timed_out = false;      ///< ... because a wait passed its deadline
};

/// Progress step callback: a step (one size of one op of one group) starts with this label.
using StepFn = std::function<void(const std::string& label, bool finished)>;

/// The collective sweep over `rig`. Warm-up as nccl-tests: once per communicator and op an
/// untimed call at the largest and at the smallest size (nccl-tests src/common.cu:487-499@cbe7f65,
/// the warm-up of its releases up to 2.13), then per size one untimed call (src/common.cu:924-931
/// @a0b82b2, warmup_iters defaults to 1, src/common.cu:97), one timed call that sizes the
/// repetitions, and the repetitions. Every wait has the plan's deadline; a timeout or an
/// asynchronous error aborts the group's communicators, is noted, and skips every later
/// collective (the notes say which).
CollectiveSweepResult run_collective_sweep(CollectiveRig& rig,
                                           const CollectivePlan& plan,
                                           const TimingPlan& timing,
                                           const WaitClock& clock,
                                           const StepFn& step);

}  // namespace cpsim::calibrate
