// Fast-forward over periodic blocks (SimOptions::fast_forward): every number of the simulation is
// the one the op-by-op run gives, over methods, implementations, recipes, checkpointing, ZeRO,
// tensor parallelism, one and every simulated rank, with and without stop limits, the allocation
// log entry by entry; and it does skip blocks where the schedule is periodic.
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cpsim/sim/allocator.hpp"
#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/implementation.hpp"
#include "cpsim/sim/result.hpp"
#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CheckpointMode;
using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kK = 1 << 10;

void expect_same(const SimResult& full, const SimResult& fast) {
  EXPECT_EQ(full.step_time_ns, fast.step_time_ns);
  EXPECT_EQ(full.events, fast.events);
  EXPECT_EQ(full.stopped_early, fast.stopped_early);
  ASSERT_EQ(full.memory.size(), fast.memory.size());
  for (std::size_t r = 0; r < full.memory.size(); ++r) {
    SCOPED_TRACE(fmt::format("rank {}", r));
    const RankMemory& a = full.memory[r];
    const RankMemory& b = fast.memory[r];
    EXPECT_EQ(a.peak_bytes, b.peak_bytes);
    EXPECT_EQ(a.peak_time_ns, b.peak_time_ns);
    EXPECT_EQ(a.peak_op, b.peak_op);
    EXPECT_EQ(a.breakdown_at_peak, b.breakdown_at_peak);
    EXPECT_EQ(a.fixed_overhead_bytes, b.fixed_overhead_bytes);
    EXPECT_EQ(a.category_peak, b.category_peak);
    EXPECT_EQ(a.host_peak_bytes, b.host_peak_bytes);
    EXPECT_EQ(full.busy[r].busy_ns, fast.busy[r].busy_ns);
  }
}

void expect_same_log(std::span<const AllocationEvent> full, std::span<const AllocationEvent> fast) {
  ASSERT_EQ(full.size(), fast.size());
  for (std::size_t i = 0; i < full.size(); ++i) {
    const AllocationEvent& a = full[i];
    const AllocationEvent& b = fast[i];
    if (a.key != b.key || a.bytes != b.bytes || a.rank != b.rank ||
        a.stream_pool != b.stream_pool || a.allocate != b.allocate) {
      ADD_FAILURE() << fmt::format(
          "entry {}: key {} bytes {} rank {} pool {} allocate {} vs key {} bytes {} rank {} pool "
          "{} allocate {}",
          i, a.key, a.bytes, a.rank, a.stream_pool, a.allocate, b.key, b.bytes, b.rank,
          b.stream_pool, b.allocate);
      return;
    }
  }
}

// The caching allocator over the fast log, with its repeats, gives what it gives over the full
// log, on every rank, in both modes, with room to spare and with so little that it empties its
// cache. Returns the copies applied without a replay.
std::int64_t expect_same_replays(const SimResult& full, const SimResult& fast) {
  std::int64_t copies = 0;
  for (std::size_t r = 0; r < full.memory.size(); ++r) {
    const auto rank = static_cast<std::int32_t>(r);
    for (const AllocatorMode mode :
         {AllocatorMode::kExpandableSegments, AllocatorMode::kSegments}) {
      for (const double room : {2.0, 1.02}) {
        SCOPED_TRACE(fmt::format("rank {} mode {} room {}", r, static_cast<int>(mode), room));
        AllocatorConfig config;
        config.mode = mode;
        config.capacity_bytes = static_cast<std::int64_t>(
            room * static_cast<double>(std::max<std::int64_t>(full.memory[r].peak_bytes, 1)));
        const AllocatorReplay a = replay_allocator(full.allocations, rank, config);
        const AllocatorReplay b =
            replay_allocator(fast.allocations, fast.allocation_repeats, rank, config);
        EXPECT_EQ(a.peak_reserved_bytes, b.peak_reserved_bytes);
        EXPECT_EQ(a.peak_allocated_bytes, b.peak_allocated_bytes);
        EXPECT_EQ(a.cache_releases, b.cache_releases);
        EXPECT_EQ(a.out_of_memory, b.out_of_memory);
        EXPECT_EQ(a.copies_applied, 0);
        copies += b.copies_applied;
      }
    }
  }
  return copies;
}

struct Case {
  std::string label;
  ScheduleInputs in;
  bool all_ranks = false;
};

std::vector<Case> cases() {
  std::vector<Case> out;
  auto add = [&out](std::string label, ScheduleInputs in, bool all_ranks = false) {
    out.push_back({std::move(label), std::move(in), all_ranks});
  };
  // Every implementation with each recipe it is the default of, at two lengths.
  for (const Implementation* impl : implementations()) {
    for (const char* recipe : {"alst", "alst-deepspeed", "torch-native", "deepspeed-fpdt"}) {
      for (const CpMethod m : impl->methods()) {
        if (!impl->default_for(recipe, m)) {
          continue;
        }
        for (const std::int64_t seq : {128 * kK, 1024 * kK}) {
          ScheduleInputs in = inputs(m, "llama3-8b", 8, seq);
          in.recipe = models::load_recipe(recipe, testing::data());
          in.parallel.implementation = std::string(impl->name());
          in.parallel.ring_degree = cp_scheme(m).has_ulysses_part() ? 1 : 8;
          if (m == CpMethod::kUsp) {
            in.parallel.ring_degree = 2;
          }
          add(fmt::format("{} {} {} {}K", impl->name(), recipe, models::to_string(m), seq / kK),
              in);
        }
      }
    }
  }
  // Methods' schemes over checkpointing, ZeRO and offload; two nodes with every rank simulated.
  for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kRing, CpMethod::kUPipe, CpMethod::kFpdt,
                           CpMethod::kAllGather, CpMethod::kUsp}) {
    for (const CheckpointMode ac :
         {CheckpointMode::kNone, CheckpointMode::kSelective, CheckpointMode::kFull}) {
      for (const int zero : {1, 3}) {
        ScheduleInputs in = inputs(m, "llama3-8b", 8, 256 * kK);
        in.recipe.checkpointing = ac;
        in.recipe.zero_stage = zero;
        in.parallel.ring_degree = m == CpMethod::kRing || m == CpMethod::kAllGather ? 8
                                  : m == CpMethod::kUsp                             ? 2
                                                                                    : 1;
        add(fmt::format("{} ac {} zero {}", models::to_string(m), static_cast<int>(ac), zero), in);
      }
    }
    // Full checkpointing with the checkpoints kept on the GPU: the backward reads each block's
    // input, which has several readers (the next block's forward and recomputation).
    for (const bool tiled : {false, true}) {
      ScheduleInputs in = inputs(m, "llama3-8b", 8, 256 * kK);
      in.recipe.checkpointing = CheckpointMode::kFull;
      in.recipe.checkpoint_offload = false;
      in.recipe.tiled_mlp = tiled;
      in.parallel.ring_degree = m == CpMethod::kRing || m == CpMethod::kAllGather ? 8
                                : m == CpMethod::kUsp                             ? 2
                                                                                  : 1;
      add(fmt::format("{} ac full on the GPU{}", models::to_string(m), tiled ? ", tiled" : ""), in);
    }
    ScheduleInputs two_nodes = inputs(m, "llama3-8b", 16, 512 * kK);
    two_nodes.parallel.ring_degree = m == CpMethod::kRing || m == CpMethod::kAllGather ? 16
                                     : m == CpMethod::kUsp || m == CpMethod::kUPipe    ? 2
                                                                                       : 1;
    if (m == CpMethod::kUlysses || m == CpMethod::kFpdt) {
      two_nodes.parallel.gpus = 8;
      two_nodes.parallel.cp_degree = 8;
    }
    add(fmt::format("{} all ranks", models::to_string(m)), two_nodes, /*all_ranks=*/true);
    two_nodes.recipe.checkpoint_offload = false;
    add(fmt::format("{} all ranks, checkpoints on the GPU", models::to_string(m)), two_nodes,
        /*all_ranks=*/true);
  }
  // Compute slowed beside collectives (compute as activities, not fixed-rate events).
  {
    ScheduleInputs in = inputs(CpMethod::kRing, "llama3-8b", 8, 512 * kK);
    in.parallel.ring_degree = 8;
    in.hardware.compute_slowdown_under_comm = 0.1;
    add("ring slowed compute", in);
  }
  // A slow host (1 ms per framework call): the host binds, and at FPDT's synchronisations the
  // host waits for the GPU; and no host model at all.
  for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kFpdt, CpMethod::kRing}) {
    ScheduleInputs in = inputs(m, "llama3-8b", 8, 256 * kK);
    in.parallel.ring_degree = m == CpMethod::kRing ? 8 : 1;
    if (m == CpMethod::kFpdt) {
      in.recipe = models::load_recipe("deepspeed-fpdt", testing::data());
      in.parallel.implementation = "deepspeed-fpdt";
    }
    ScheduleInputs slow = in;
    slow.hardware.host_issue.dispatch_s = 1e-3;
    add(fmt::format("{} slow host", models::to_string(m)), slow);
    ScheduleInputs none = in;
    none.hardware.host_issue = {};
    add(fmt::format("{} no host model", models::to_string(m)), none);
  }
  // Tensor parallelism around CP.
  {
    ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 256 * kK);
    in.parallel.tp_degree = 2;
    in.parallel.cp_degree = 4;
    add("tp 2 ulysses 4", in);
  }
  return out;
}

TEST(FastForward, SameResultsAsOpByOp) {
  int skipping_cases = 0;
  std::int64_t copies_applied = 0;
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label);
    const Workload w = build_step(c.in, {.all_ranks = c.all_ranks});
    SimOptions off;
    off.fast_forward = false;
    const SimResult full = simulate(w, c.in.hardware, off);
    const SimResult fast = simulate(w, c.in.hardware);
    expect_same(full, fast);
    EXPECT_EQ(full.fast_forwarded_blocks, 0);
    skipping_cases += fast.fast_forwarded_blocks > 0 ? 1 : 0;
    // The allocation log, entry by entry (the caching allocator replays it).
    SimOptions log_off = off, log_on;
    log_off.log_allocations = log_on.log_allocations = true;
    const SimResult logged_full = simulate(w, c.in.hardware, log_off);
    const SimResult logged_fast = simulate(w, c.in.hardware, log_on);
    expect_same(logged_full, logged_fast);
    EXPECT_EQ(logged_fast.fast_forwarded_blocks, fast.fast_forwarded_blocks);
    expect_same_log(logged_full.allocations, logged_fast.allocations);
    copies_applied += expect_same_replays(logged_full, logged_fast);
    // Stop limits inside the step: the run stops at the same op either way.
    for (const double fraction : {0.9, 0.99}) {
      SimOptions stop_off = off, stop_on;
      std::int64_t device = 0, host = 0;
      for (const RankMemory& m : full.memory) {
        device = std::max(device, m.peak_bytes);
        host += m.host_peak_bytes;
      }
      stop_off.stop_above_device_bytes = stop_on.stop_above_device_bytes =
          static_cast<std::int64_t>(fraction * static_cast<double>(device));
      expect_same(simulate(w, c.in.hardware, stop_off), simulate(w, c.in.hardware, stop_on));
      if (host > 0) {
        SimOptions host_off = off, host_on;
        host_off.stop_above_host_bytes = host_on.stop_above_host_bytes =
            static_cast<std::int64_t>(fraction * static_cast<double>(host));
        expect_same(simulate(w, c.in.hardware, host_off), simulate(w, c.in.hardware, host_on));
      }
    }
  }
  // Most schedules are periodic from their third block on.
  EXPECT_GT(skipping_cases, 20);
  // Some blocks leave the caching allocator's blocks as they found them.
  EXPECT_GT(copies_applied, 0);
}

// A run that logged its allocations, summarised without the caching allocator's replay, reports
// what the run without the log reports, field by field (maxlen reads both from one run).
TEST(FastForward, LoggedRunWithoutReplayReportsAsUnlogged) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.label);
    const Workload w = build_step(c.in, {.all_ranks = c.all_ranks});
    SimOptions logged;
    logged.log_allocations = true;
    const StepReport plain = summarize(c.in, w, simulate(w, c.in.hardware));
    const SimResult logged_run = simulate(w, c.in.hardware, logged);
    const StepReport ignored = summarize(c.in, w, logged_run, AllocatorLogUse::kIgnoreLog);
    EXPECT_EQ(ignored.step_time_s, plain.step_time_s);
    EXPECT_EQ(ignored.stream_busy_s, plain.stream_busy_s);
    EXPECT_EQ(ignored.peak_memory_bytes, plain.peak_memory_bytes);
    EXPECT_EQ(ignored.peak_rank, plain.peak_rank);
    EXPECT_EQ(ignored.peak_op, plain.peak_op);
    EXPECT_EQ(ignored.breakdown_at_peak, plain.breakdown_at_peak);
    EXPECT_EQ(ignored.category_peak, plain.category_peak);
    EXPECT_EQ(ignored.host_memory_bytes, plain.host_memory_bytes);
    EXPECT_EQ(ignored.reserved_peak_bytes, 0);
    EXPECT_FALSE(ignored.reserved_checked);
    EXPECT_EQ(ignored.gpu_headroom_bytes, plain.gpu_headroom_bytes);
    EXPECT_EQ(ignored.fits_gpu, plain.fits_gpu);
    EXPECT_EQ(ignored.binding, plain.binding);
    EXPECT_EQ(ignored.events, plain.events);
    EXPECT_EQ(ignored.ops, plain.ops);
    // The replay itself is what summarize() with the log gives.
    const StepReport replayed = summarize(c.in, w, logged_run);
    EXPECT_TRUE(replayed.reserved_checked);
    EXPECT_GE(replayed.reserved_peak_bytes, replayed.peak_memory_bytes);
    EXPECT_EQ(replayed.peak_memory_bytes, plain.peak_memory_bytes);
  }
}

TEST(FastForward, SkipsAllButAFewBlocksOfAPeriodicStep) {
  ScheduleInputs in = inputs(CpMethod::kFpdt, "llama3-8b", 8, 1024 * kK);
  in.recipe = models::load_recipe("deepspeed-fpdt", testing::data());
  in.parallel.implementation = "deepspeed-fpdt";
  const Workload w = build_step(in);
  const SimResult r = simulate(w, in.hardware);
  // 32 forward and 32 backward blocks: a few at the start and the end of each are simulated.
  EXPECT_GE(r.fast_forwarded_blocks, 2 * (32 - 8));
}

// Backwards that read forward tensors with several readers: with full checkpointing kept on the
// GPU each block's input (the next block's forward and recomputation read it too, all on the
// compute stream); without checkpointing or with selective checkpointing the tensors the forward
// saved, read by the backward on the compute and communication streams.
TEST(FastForward, SkipsBackwardsReadingForwardTensorsWithSeveralReaders) {
  for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kUPipe, CpMethod::kRing}) {
    for (const CheckpointMode ac :
         {CheckpointMode::kFull, CheckpointMode::kSelective, CheckpointMode::kNone}) {
      ScheduleInputs in = inputs(m, "llama3-8b", 8, 256 * kK);
      in.recipe.checkpointing = ac;
      in.recipe.checkpoint_offload = false;
      in.parallel.ring_degree = m == CpMethod::kRing ? 8 : 1;
      const Workload w = build_step(in);
      const SimResult r = simulate(w, in.hardware);
      EXPECT_GE(r.fast_forwarded_blocks, 2 * (32 - 8))
          << models::to_string(m) << " ac " << static_cast<int>(ac);
    }
  }
}

TEST(FastForward, OffWithTraceOnWithAllocationLog) {
  const ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 256 * kK);
  const Workload w = build_step(in);
  SimOptions trace;
  trace.record_trace = true;
  EXPECT_EQ(simulate(w, in.hardware, trace).fast_forwarded_blocks, 0);
  SimOptions log;
  log.log_allocations = true;
  EXPECT_GT(simulate(w, in.hardware, log).fast_forwarded_blocks, 0);
  EXPECT_GT(simulate(w, in.hardware).fast_forwarded_blocks, 0);
}

}  // namespace
}  // namespace cpsim::sim
