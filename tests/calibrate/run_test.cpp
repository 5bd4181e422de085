// `calibrate run` control flow without a GPU: a fake backend and a fake NCCL rig below the calls
// that matter (event query, asynchronous error, abort, sweep runner). A hung collective times out
// and the run goes on; a failing sweep leaves the others written; --resume skips what is done;
// --only/--skip; pre-run check warnings; nccl-tests' warm-up order.
#include "cpsim/calibrate/run.hpp"

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/calibrate/mpi_run.hpp"
#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

using models::Collective;

/// A clock that moves only when the wait sleeps.
struct FakeClock {
  double now_s = 0.0;
  WaitClock clock() {
    return WaitClock{[this] { return now_s; }, [this](double s) { now_s += s; }};
  }
};

class FakePoll final : public CompletionPoll {
 public:
  bool hung = false;
  std::optional<std::string> async_error;
  int aborts = 0;
  bool complete() override { return !hung; }
  std::optional<std::string> error() override { return async_error; }
  void abort() override { ++aborts; }
};

struct Enqueue {
  int ranks;
  Collective op;
  std::int64_t size_bytes;
  int calls;
};

/// A rig whose collective takes 10 us + size / 100 GB/s per call; it hangs (never completes) or
/// reports an asynchronous error at one (ranks, op, size).
class FakeRig final : public CollectiveRig {
 public:
  std::optional<std::tuple<int, Collective, std::int64_t>> hang_at;
  std::optional<std::tuple<int, Collective, std::int64_t>> error_at;
  std::vector<Enqueue> enqueues;
  std::vector<int> opened;
  int destroyed = 0;       ///< closes without an abort (ncclCommDestroy)
  int closed_aborted = 0;  ///< closes after an abort (memory only)
  FakePoll fake_poll;

  void open(int ranks, std::int64_t /*largest*/) override {
    ranks_ = ranks;
    opened.push_back(ranks);
    fake_poll.aborts = 0;
  }
  void enqueue(Collective op, std::int64_t size_bytes, int calls) override {
    enqueues.push_back({ranks_, op, size_bytes, calls});
    const auto key = std::make_tuple(ranks_, op, size_bytes);
    fake_poll.hung = hang_at == key;
    if (error_at == key) {
      fake_poll.async_error = "rank 1: asynchronous NCCL error unhandled system error";
    }
    last_s_ = calls * (1e-5 + static_cast<double>(size_bytes) / 1e11);
  }
  CompletionPoll& poll() override { return fake_poll; }
  double elapsed_s() override { return last_s_; }
  void close() override {
    (fake_poll.aborts > 0 ? closed_aborted : destroyed) += 1;
    fake_poll.async_error.reset();
  }

 private:
  int ranks_ = 0;
  double last_s_ = 0.0;
};

/// A backend of 8 fake GPUs: every sweep but the collectives gives one sample of its kind, or
/// fails with a MeasureError when named in `failing`.
class FakeBackend final : public MeasureBackend {
 public:
  std::set<std::string> failing;
  std::vector<std::string> ran;
  std::optional<bool> interference_nccl_usable;
  std::optional<std::tuple<int, Collective, std::int64_t>> hang_at;
  std::optional<std::tuple<int, Collective, std::int64_t>> error_at;
  RawContext context = default_context();

  static RawContext default_context() {
    RawContext c;
    c.device = "Fake H100";
    c.gpu_count = 8;
    c.device_count = 8;
    c.driver_version = "1.0";
    c.cuda_driver_version = "13.0";
    c.cuda_runtime_version = "13.0";
    c.nccl_version = "2.28.9";
    c.cublaslt_version = "13.0.0";
    c.sm_count = 132;
    c.sm_clock_max_mhz = 1980;
    c.sm_clock_measured_mhz = 1980;
    c.date = "2026-11-25T00:00:00Z";
    c.cpsim_version = "test";
    c.method = RawMethod{"cuda-event", "median", 3, 10, 0};
    return c;
  }

  std::string name() const override { return "fake"; }
  std::optional<std::string> unavailable_reason() const override { return std::nullopt; }
  RawContext open(const MeasureOptions& /*options*/) override { return context; }
  std::size_t plan(std::string_view sweep) const override {
    if (sweep == "collectives") {
      const CollectivePlan p = collective_plan();
      return p.groups.size() * p.ops.size() * p.sizes_bytes.size();
    }
    return 1;
  }
  SweepOutput run_sweep(std::string_view sweep, const SweepControl& control) override {
    const std::string name(sweep);
    ran.push_back(name);
    control.step(name, false);
    if (failing.count(name) != 0) {
      throw MeasureError(fmt_error(name));
    }
    SweepOutput out;
    if (name == "launch") {
      out.samples.launch.push_back({1000, 2e-6, 3e-6});
    } else if (name == "memory") {
      out.samples.memory.push_back({"copy", 1 << 20, 1e-5});
    } else if (name == "gemm") {
      out.samples.gemm.push_back({4096, 4096, 4096, 2e-4});
    } else if (name == "attention") {
      out.samples.attention.push_back(
          {"cpsim-flash", AttentionPass::kForward, true, 128, 32, 4096, 4096, 3e-3});
    } else if (name == "host_copies") {
      out.samples.host_copies.push_back({CopyDirection::kHostToDevice, 0, 1, 1 << 20, 4e-5});
    } else if (name == "interference") {
      interference_nccl_usable = control.nccl_usable;
      out.samples.interference.push_back({"host_copies", "attention_fwd", 1, 1e-3, 1.1e-3});
      if (!control.nccl_usable) {
        out.notes.emplace_back("interference with all-to-all skipped");
      }
    }
    control.step(name, true);
    return out;
  }
  CollectivePlan collective_plan() const override {
    CollectivePlan p;
    p.groups = {2, 4, 8};
    p.ops = {Collective::kAllToAll, Collective::kAllGather};
    p.sizes_bytes = {1 << 10, 1 << 20, 1 << 24};
    return p;
  }
  TimingPlan timing_plan() const override { return TimingPlan{3, 1e-3, 8}; }
  std::unique_ptr<CollectiveRig> collective_rig() override {
    auto r = std::make_unique<FakeRig>();
    r->hang_at = hang_at;
    r->error_at = error_at;
    last_rig_ = r.get();
    return r;
  }
  RawContext open_rank(const MeasureOptions& /*options*/, int /*local_rank*/) override {
    return context;
  }
  std::unique_ptr<RankRig> rank_rig() override { return nullptr; }  // MPI: tests/calibrate/mpi
  /// The rig handed out last (owned and destroyed by the run: compare with nullptr only).
  FakeRig* last_rig_ = nullptr;

 private:
  static std::string fmt_error(const std::string& name) {
    return "cudaMalloc failed with cudaErrorMemoryAllocation (" + name + ")";
  }
};

/// Runs with a fake clock, collecting every text written.
struct Harness {
  std::filesystem::path dir;
  std::vector<std::string> writes;
  FakeClock clock;

  Harness() {
    dir = std::filesystem::temp_directory_path() /
          ("cpsim_run_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
           "_" + ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
  }
  ~Harness() { std::filesystem::remove_all(dir); }
  Harness(const Harness&) = delete;
  Harness& operator=(const Harness&) = delete;

  std::filesystem::path out() const { return dir / "raw.json"; }

  RunRequest request() const {
    RunRequest r;
    r.out = out();
    r.collective_timeout_s = 60.0;
    return r;
  }

  RunSummary run(MeasureBackend& backend, const RunRequest& r) {
    return run_calibration(
        backend, r, {},
        [this](const std::string& text) {
          writes.push_back(text);
          std::ofstream(out()) << text;
        },
        clock.clock());
  }
};

const SweepRecord* find_record(const RawCalibration& raw, const std::string& name) {
  for (const SweepRecord& r : raw.context.sweeps) {
    if (r.name == name) {
      return &r;
    }
  }
  return nullptr;
}

bool any_note_has(const std::vector<std::string>& notes, const std::string& text) {
  for (const std::string& n : notes) {
    if (n.find(text) != std::string::npos) {
      return true;
    }
  }
  return false;
}

TEST(WaitWithDeadline, CompletesWithoutAbort) {
  FakePoll poll;
  FakeClock clock;
  const WaitResult w = wait_with_deadline(poll, 10.0, clock.clock());
  EXPECT_EQ(w.status, WaitStatus::kComplete);
  EXPECT_EQ(poll.aborts, 0);
}

TEST(WaitWithDeadline, HungWorkTimesOutAtTheDeadlineAndAborts) {
  FakePoll poll;
  poll.hung = true;
  FakeClock clock;
  const WaitResult w = wait_with_deadline(poll, 5.0, clock.clock());
  EXPECT_EQ(w.status, WaitStatus::kTimedOut);
  EXPECT_EQ(poll.aborts, 1);
  EXPECT_GE(w.waited_s, 5.0);
  EXPECT_LT(w.waited_s, 5.001);  // polled every 100 us
  EXPECT_EQ(w.message, "not complete after 5 s");
}

TEST(WaitWithDeadline, AsynchronousErrorFailsAtOnceAndAborts) {
  FakePoll poll;
  poll.hung = true;
  poll.async_error = "rank 3: asynchronous NCCL error remote process exited";
  FakeClock clock;
  const WaitResult w = wait_with_deadline(poll, 5.0, clock.clock());
  EXPECT_EQ(w.status, WaitStatus::kFailed);
  EXPECT_EQ(w.message, *poll.async_error);
  EXPECT_EQ(poll.aborts, 1);
  EXPECT_EQ(w.waited_s, 0.0);
}

TEST(CollectiveSweep, WarmsUpPerCommunicatorAndPerSizeAsNcclTests) {
  FakeRig rig;
  FakeClock clock;
  CollectivePlan plan;
  plan.groups = {2};
  plan.ops = {Collective::kAllReduce};
  plan.sizes_bytes = {1 << 10, 1 << 20};
  const TimingPlan timing{3, 1e-3, 8};
  const CollectiveSweepResult r =
      run_collective_sweep(rig, plan, timing, clock.clock(), [](const std::string&, bool) {});
  ASSERT_EQ(r.samples.size(), 2U);
  EXPECT_FALSE(r.nccl_unusable);
  // Largest then smallest once per communicator, then per size: one untimed call, one timed
  // call sizing the repetitions, 3 repetitions of `inner` calls.
  std::vector<std::pair<std::int64_t, int>> seq;
  for (const Enqueue& e : rig.enqueues) {
    seq.emplace_back(e.size_bytes, e.calls);
  }
  // 1 KiB call: 10 us + 10.24 ns -> inner = ceil(1 ms / 10.01 us) = 100, capped at 8.
  // 1 MiB call: 10 us + 10.49 us -> inner = ceil(1 ms / 20.49 us) = 49, capped at 8.
  const std::vector<std::pair<std::int64_t, int>> want = {
      {1 << 20, 1}, {1 << 10, 1}, {1 << 10, 1}, {1 << 10, 1}, {1 << 10, 8}, {1 << 10, 8},
      {1 << 10, 8}, {1 << 20, 1}, {1 << 20, 1}, {1 << 20, 8}, {1 << 20, 8}, {1 << 20, 8}};
  EXPECT_EQ(seq, want);
  EXPECT_EQ(rig.destroyed, 1);
  EXPECT_EQ(rig.closed_aborted, 0);
  // Time per call of the repetitions: 10 us + 1 MiB / 100 GB/s.
  EXPECT_DOUBLE_EQ(r.samples[1].time_s, 1e-5 + 1048576.0 / 1e11);
}

TEST(RunCalibration, HungCollectiveTimesOutIsAbortedAndTheRunContinues) {
  Harness h;
  FakeBackend backend;
  backend.hang_at = std::make_tuple(4, Collective::kAllGather, std::int64_t{1} << 20);
  const RunSummary s = h.run(backend, h.request());

  ASSERT_NE(backend.last_rig_, nullptr);
  const SweepRecord* col = find_record(s.raw, "collectives");
  ASSERT_NE(col, nullptr);
  EXPECT_EQ(col->status, "timed_out");
  EXPECT_TRUE(any_note_has(col->notes,
                           "all_gather 4 ranks 1.0 MiB: timed out (not complete "
                           "after 60 s); the group's communicators were aborted "
                           "(ncclCommAbort)"));
  EXPECT_TRUE(any_note_has(col->notes, "group sizes 8 were skipped"));
  // Samples before the hang kept: 2 ranks (2 ops x 3 sizes) + 4 ranks all-to-all (3) and the
  // all-gather size before the hung one (1 KiB).
  EXPECT_EQ(s.raw.samples.collectives.size(), 6U + 3U + 1U);
  for (const CollectiveSample& c : s.raw.samples.collectives) {
    EXPECT_NE(c.ranks, 8);
  }
  // The run went on: host copies and interference ran, the latter without NCCL.
  EXPECT_EQ(find_record(s.raw, "host_copies")->status, "done");
  EXPECT_EQ(find_record(s.raw, "interference")->status, "done");
  ASSERT_TRUE(backend.interference_nccl_usable.has_value());
  EXPECT_FALSE(*backend.interference_nccl_usable);
  EXPECT_EQ(s.failed, std::vector<std::string>{"collectives"});
  EXPECT_TRUE(any_note_has(s.raw.context.notes, "collectives: all_gather 4 ranks"));
  // The file on disk is the last write and parses.
  const RawCalibration on_disk = load_raw(h.out(), "test");
  EXPECT_EQ(on_disk.context.sweeps.size(), kSweepNames.size());
}

TEST(RunCalibration, AbortNeverDestroysTheHungGroup) {
  FakeRig rig;
  rig.hang_at = std::make_tuple(2, Collective::kAllToAll, std::int64_t{1} << 24);
  FakeClock clock;
  CollectivePlan plan;
  plan.groups = {2, 4};
  plan.ops = {Collective::kAllToAll};
  plan.sizes_bytes = {1 << 10, 1 << 24};
  plan.timeout_s = 30.0;
  const CollectiveSweepResult r = run_collective_sweep(
      rig, plan, TimingPlan{3, 1e-3, 8}, clock.clock(), [](const std::string&, bool) {});
  EXPECT_TRUE(r.nccl_unusable);
  EXPECT_TRUE(r.timed_out);
  EXPECT_EQ(rig.fake_poll.aborts, 1);
  EXPECT_EQ(rig.destroyed, 0);
  EXPECT_EQ(rig.closed_aborted, 1);
  EXPECT_EQ(rig.opened, std::vector<int>{2});  // 4 ranks never opened
  // The hang is in the largest-size warm-up: no sample, the deadline passed once.
  EXPECT_TRUE(r.samples.empty());
  EXPECT_GE(clock.now_s, 30.0);
  EXPECT_LT(clock.now_s, 30.01);
}

TEST(RunCalibration, AsynchronousNcclErrorIsNotedAsFailed) {
  Harness h;
  FakeBackend backend;
  backend.error_at = std::make_tuple(8, Collective::kAllToAll, std::int64_t{1} << 10);
  const RunSummary s = h.run(backend, h.request());
  const SweepRecord* col = find_record(s.raw, "collectives");
  EXPECT_EQ(col->status, "failed");
  EXPECT_TRUE(any_note_has(col->notes,
                           "all_to_all 8 ranks 1.0 KiB: failed (rank 1: asynchronous "
                           "NCCL error unhandled system error)"));
  EXPECT_TRUE(any_note_has(col->notes, "no later group size was left"));
}

TEST(RunCalibration, FailingSweepIsANoteAndTheOthersAreWritten) {
  Harness h;
  FakeBackend backend;
  backend.failing = {"gemm"};
  const RunSummary s = h.run(backend, h.request());
  EXPECT_EQ(s.failed, std::vector<std::string>{"gemm"});
  // One write for the context, one per sweep, one at the end.
  ASSERT_EQ(h.writes.size(), 2 + kSweepNames.size());
  // The write right after the failure holds the sweeps before it and the failure.
  const RawCalibration after_gemm = parse_raw(h.writes[3], "write 3");
  EXPECT_EQ(after_gemm.samples.launch.size(), 1U);
  EXPECT_EQ(after_gemm.samples.memory.size(), 1U);
  EXPECT_TRUE(after_gemm.samples.gemm.empty());
  EXPECT_EQ(find_record(after_gemm, "gemm")->status, "failed");
  EXPECT_TRUE(any_note_has(find_record(after_gemm, "gemm")->notes,
                           "cudaMalloc failed with cudaErrorMemoryAllocation"));
  // The run went on to the end.
  const RawCalibration last = load_raw(h.out(), "raw.json");
  EXPECT_EQ(last.samples.attention.size(), 1U);
  EXPECT_EQ(last.samples.host_copies.size(), 1U);
  EXPECT_EQ(last.samples.interference.size(), 1U);
  EXPECT_FALSE(last.samples.collectives.empty());
  EXPECT_EQ(find_record(last, "interference")->status, "done");
  EXPECT_TRUE(any_note_has(last.context.notes, "gemm: failed, its samples were dropped"));
}

TEST(RunCalibration, ResumeRunsOnlyWhatIsNotDone) {
  Harness h;
  {
    FakeBackend first;
    first.failing = {"gemm", "attention"};
    (void)h.run(first, h.request());
  }
  const RawCalibration before = load_raw(h.out(), "first");
  FakeBackend second;
  RunRequest r = h.request();
  r.resume = true;
  const RunSummary s = h.run(second, r);
  EXPECT_EQ(second.ran, (std::vector<std::string>{"gemm", "attention"}));
  EXPECT_EQ(s.ran, (std::vector<std::string>{"gemm", "attention"}));
  EXPECT_EQ(s.kept, (std::vector<std::string>{"launch", "memory", "collectives", "host_copies",
                                              "interference"}));
  EXPECT_EQ(second.last_rig_, nullptr);  // no collective ran again
  const RawCalibration after = load_raw(h.out(), "second");
  EXPECT_EQ(after.samples.collectives.size(), before.samples.collectives.size());
  EXPECT_EQ(after.samples.gemm.size(), 1U);
  EXPECT_EQ(after.samples.attention.size(), 1U);
  for (const SweepRecord& rec : after.context.sweeps) {
    EXPECT_EQ(rec.status, "done") << rec.name;
  }
  // A third resume has nothing left to do.
  FakeBackend third;
  const RunSummary t = h.run(third, r);
  EXPECT_TRUE(third.ran.empty());
  EXPECT_TRUE(t.ran.empty());
}

TEST(RunCalibration, ResumeRefusesAnotherNodeOrAFileWithoutSweeps) {
  Harness h;
  {
    FakeBackend first;
    (void)h.run(first, h.request());
  }
  FakeBackend other;
  other.context.driver_version = "2.0";
  RunRequest r = h.request();
  r.resume = true;
  try {
    (void)h.run(other, r);
    FAIL() << "resumed a file of another driver";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--resume");
    EXPECT_NE(std::string(e.what()).find("context.driver_version 1.0, this run has 2.0"),
              std::string::npos)
        << e.what();
  }
  RawCalibration old = load_raw(h.out(), "x");
  old.context.sweeps.clear();
  std::ofstream(h.out()) << write_raw(old);
  FakeBackend same;
  try {
    (void)h.run(same, r);
    FAIL() << "resumed a file without sweep records";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "--resume");
  }
  EXPECT_TRUE(same.ran.empty());
}

TEST(RunCalibration, OnlyAndSkipChooseSweeps) {
  Harness h;
  FakeBackend backend;
  RunRequest r = h.request();
  r.only = parse_sweep_list("attention,gemm,collectives", "--only");
  r.skip = parse_sweep_list("collectives", "--skip");
  const RunSummary s = h.run(backend, r);
  EXPECT_EQ(backend.ran, (std::vector<std::string>{"gemm", "attention"}));
  ASSERT_EQ(s.raw.context.sweeps.size(), kSweepNames.size());
  EXPECT_EQ(find_record(s.raw, "launch")->status, "skipped");
  EXPECT_EQ(find_record(s.raw, "collectives")->status, "skipped");
  EXPECT_EQ(find_record(s.raw, "gemm")->status, "done");
  EXPECT_EQ(find_record(load_raw(h.out(), "raw.json"), "interference")->status, "skipped");
  // A later --resume runs the skipped ones.
  FakeBackend rest;
  RunRequest again = h.request();
  again.resume = true;
  (void)h.run(rest, again);
  EXPECT_EQ(rest.ran,
            (std::vector<std::string>{"launch", "memory", "host_copies", "interference"}));
}

TEST(RunCalibration, UnknownSweepNamesTheFlag) {
  for (const char* flag : {"--only", "--skip"}) {
    try {
      (void)parse_sweep_list("gemm,nccl", flag);
      FAIL() << "accepted an unknown sweep";
    } catch (const InputError& e) {
      EXPECT_EQ(e.field(), flag);
      EXPECT_NE(std::string(e.what()).find("unknown sweep 'nccl'; known: launch, memory, gemm, "
                                           "attention, collectives, host_copies, interference"),
                std::string::npos);
    }
  }
  EXPECT_THROW((void)parse_sweep_list("", "--only"), InputError);
  EXPECT_THROW((void)parse_sweep_list("gemm,", "--only"), InputError);
}

TEST(RunCalibration, PreRunChecksAreRecordedWithWarningsNeverFatal) {
  Harness h;
  FakeBackend backend;
  GpuCheck busy;
  busy.gpu = 0;
  busy.source = "nvml";
  busy.memory_used_bytes = std::int64_t{10} << 30;
  busy.memory_total_bytes = std::int64_t{80} << 30;
  busy.other_processes = 2;
  busy.sm_clock_mhz = 1200;
  busy.sm_clock_max_mhz = 1980;
  busy.throttle_reasons = throttle_reason_names(0x41);
  busy.throttle_known = true;
  GpuCheck idle;
  idle.gpu = 1;
  idle.source = "nvml";
  idle.memory_used_bytes = std::int64_t{1} << 29;
  idle.memory_total_bytes = std::int64_t{80} << 30;
  idle.other_processes = 0;
  idle.sm_clock_mhz = 345;
  idle.sm_clock_max_mhz = 1980;
  idle.throttle_reasons = throttle_reason_names(0x1);
  idle.throttle_known = true;
  GpuCheck unknown;
  unknown.gpu = 2;
  unknown.source = "cudaMemGetInfo";
  unknown.memory_used_bytes = std::int64_t{1} << 29;
  unknown.memory_total_bytes = std::int64_t{80} << 30;
  backend.context.checks = {busy, idle, unknown};
  backend.context.sm_clock_measured_mhz = 1500;
  const RunSummary s = h.run(backend, h.request());
  EXPECT_TRUE(s.failed.empty());
  EXPECT_EQ(backend.ran.size(), kSweepNames.size() - 1);  // collectives run through the rig
  const std::vector<std::string> want = {
      "GPU 0: 2 other compute process(es) use it (nvml): every time measured on it may be too "
      "slow; stop them and measure again",
      "GPU 0: 10.0 GiB of 80.0 GiB in use before measuring (nvml)",
      "GPU 0: clocks held down by hw_thermal_slowdown (SM clock 1200 of 1980 MHz)",
      "the SM clock measured under load is 1500 MHz, under 90 % of the maximum 1980 MHz: clocks "
      "locked low, power capping or throttling slow every kernel"};
  EXPECT_EQ(s.warnings, want);
  const RawCalibration on_disk = load_raw(h.out(), "raw.json");
  ASSERT_EQ(on_disk.context.checks.size(), 3U);
  EXPECT_EQ(on_disk.context.checks[0].throttle_reasons,
            (std::vector<std::string>{"gpu_idle", "hw_thermal_slowdown"}));
  EXPECT_TRUE(on_disk.context.checks[1].throttle_known);
  EXPECT_FALSE(on_disk.context.checks[2].throttle_known);
  EXPECT_EQ(on_disk.context.checks[2].other_processes, -1);
  EXPECT_TRUE(any_note_has(on_disk.context.notes, "GPU 0: 2 other compute process(es)"));
}

TEST(ThrottleReasons, NamesEveryNvmlBitAndKeepsUnknownOnes) {
  EXPECT_EQ(throttle_reason_names(0), std::vector<std::string>{});
  EXPECT_EQ(throttle_reason_names(0x1ff),
            (std::vector<std::string>{"gpu_idle", "applications_clocks_setting", "sw_power_cap",
                                      "hw_slowdown", "sync_boost", "sw_thermal_slowdown",
                                      "hw_thermal_slowdown", "hw_power_brake_slowdown",
                                      "display_clock_setting"}));
  EXPECT_EQ(throttle_reason_names(0x1004), (std::vector<std::string>{"sw_power_cap", "0x1000"}));
}

// The first line of /proc/driver/nvidia/version as the two kernel modules print it; the open
// module's was read on an H200 node (driver 580.159.04), where the word after "Kernel Module" is
// "for" and an earlier parser recorded that as the driver.
TEST(DriverRelease, ReadsTheOpenAndTheProprietaryModulesLines) {
  EXPECT_EQ(driver_release_from_version_line(
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release "
                "Build  (dvs-builder@U22-I3-AE18-09-3)  Mon Jun  2 18:34:53 UTC 2025"),
            "580.159.04");
  EXPECT_EQ(driver_release_from_version_line(
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Tue Jan 28 2025"),
            "570.86.15");
  EXPECT_EQ(driver_release_from_version_line("NVRM version: something else"), "unknown");
  EXPECT_EQ(driver_release_from_version_line(""), "unknown");
}

}  // namespace
}  // namespace cpsim::calibrate
