// The host issue model (docs/MODEL.md, "Host issue") on hand-built op graphs with hand-computed
// answers, and on built steps: what it adds, and that it changes nothing when its costs are zero.
#include <gtest/gtest.h>

#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

// 100 ns per framework call (60 dispatch + 40 launch), 50 ns per synchronisation.
models::HardwareProfile host_profile(double dispatch_s = 60e-9,
                                     double launch_s = 40e-9,
                                     double sync_s = 50e-9) {
  models::HardwareProfile p = testing::round_profile();
  p.host_issue.dispatch_s = dispatch_s;
  p.host_issue.launch_s = launch_s;
  p.host_issue.sync_s = sync_s;
  return p;
}

struct Graph {
  Workload w;
  explicit Graph(int ranks) {
    w.ranks = ranks;
    w.represented_ranks = ranks;
    w.static_memory.assign(static_cast<std::size_t>(ranks), {});
  }
  OpId op(int rank,
          Stream s,
          SimTime duration_ns,
          std::vector<OpId> deps = {},
          int host_calls = 1,
          bool host_sync = false) {
    Op o;
    o.rank = rank;
    o.stream = s;
    // Copy streams run copies (1 byte/ns in the round profile); the compute stream kernels.
    if (s == Stream::kD2H || s == Stream::kH2D) {
      o.kind = s == Stream::kD2H ? OpKind::kCopyD2H : OpKind::kCopyH2D;
      o.transfer_bytes = duration_ns;
    }
    o.duration_ns = duration_ns;
    o.host_calls = static_cast<std::uint16_t>(host_calls);
    o.host_sync = host_sync;
    o.name = w.intern("op" + std::to_string(w.ops.size()));
    o.deps_begin = static_cast<std::int32_t>(w.edges.size());
    for (OpId d : deps) {
      w.edges.push_back(d);
    }
    o.deps_end = static_cast<std::int32_t>(w.edges.size());
    o.inputs_begin = o.inputs_end = o.outputs_begin = o.outputs_end = o.deps_end;
    w.ops.push_back(o);
    return static_cast<OpId>(w.ops.size() - 1);
  }
};

TEST(HostIssue, ChainOfTinyOpsIsHostBound) {
  // Op i is issued at 100·(i+1) ns and runs 10 ns: the GPU waits for the host every time, so the
  // step is ops × host cost plus the last op: 10·100 + 10.
  Graph g(1);
  for (int i = 0; i < 10; ++i) {
    g.op(0, Stream::kCompute, 10);
  }
  EXPECT_EQ(simulate(g.w, host_profile()).step_time_ns, 1010);
  EXPECT_EQ(simulate(g.w, testing::round_profile()).step_time_ns, 100);
}

TEST(HostIssue, LongOpsHideTheHost) {
  // 1000 ns ops: only the first op's issue (100 ns) shows; the host runs ahead of the GPU.
  Graph g(1);
  for (int i = 0; i < 10; ++i) {
    g.op(0, Stream::kCompute, 1000);
  }
  EXPECT_EQ(simulate(g.w, host_profile()).step_time_ns, 100 + 10 * 1000);
}

TEST(HostIssue, CallsPerOpMultiplyTheCost) {
  // Three framework calls: issued at 300 ns; the next (two calls) at 500 ns.
  Graph g(1);
  g.op(0, Stream::kCompute, 10, {}, 3);
  g.op(0, Stream::kCompute, 10, {}, 2);
  EXPECT_EQ(simulate(g.w, host_profile()).step_time_ns, 510);
}

TEST(HostIssue, SyncPointSerialises) {
  // a (1000 ns) and b (a 10 ns copy, independent): without a synchronisation b is
  // issued at 200 ns and the step is a's end, 100 + 1000. With the host waiting for a, b is issued
  // at 1100 + 50 (sync) + 100 (its call) and ends 10 ns later.
  Graph free(1);
  free.op(0, Stream::kCompute, 1000);
  free.op(0, Stream::kD2H, 10);
  EXPECT_EQ(simulate(free.w, host_profile()).step_time_ns, 1100);
  Graph synced(1);
  synced.op(0, Stream::kCompute, 1000, {}, 1, true);
  synced.op(0, Stream::kD2H, 10);
  EXPECT_EQ(simulate(synced.w, host_profile()).step_time_ns, 1260);
}

TEST(HostIssue, HostAheadOfTheSyncedOpWaitsOnlyForIt) {
  // The host issues a (100), then b and c (200, 300) on the copy streams, then waits for c (a
  // 10 ns copy, ends at 310): d is issued at 310 + 50 + 100 = 460, after the host has passed 300
  // already. a (1000 ns) still runs: the step ends with a at 1100, d at 470 (no dependency on a).
  Graph g(1);
  g.op(0, Stream::kCompute, 1000);
  g.op(0, Stream::kH2D, 10);
  g.op(0, Stream::kD2H, 10, {}, 1, true);
  const OpId d = g.op(0, Stream::kH2D, 10);  // after b on its stream (b ended at 210)
  SimOptions trace;
  trace.record_trace = true;
  const SimResult r = simulate(g.w, host_profile(), trace);
  EXPECT_EQ(r.step_time_ns, 1100);
  for (const OpInterval& i : r.intervals) {
    if (i.op == d) {
      EXPECT_EQ(i.start_ns, 460);
    }
  }
  // The host track: a, b, c issued back to back from 0, d after the synchronisation.
  ASSERT_EQ(r.host_intervals.size(), 4U);
  EXPECT_EQ(r.host_intervals[0].start_ns, 0);
  EXPECT_EQ(r.host_intervals[2].end_ns, 300);
  EXPECT_EQ(r.host_intervals[3].op, d);
  EXPECT_EQ(r.host_intervals[3].start_ns, 360);
  EXPECT_EQ(r.host_intervals[3].end_ns, 460);
}

TEST(HostIssue, EachRankHasItsOwnHost) {
  // Two ranks, five 10 ns ops each: both host-bound, side by side (500 + 10).
  Graph g(2);
  for (int i = 0; i < 5; ++i) {
    g.op(0, Stream::kCompute, 10);
    g.op(1, Stream::kCompute, 10);
  }
  EXPECT_EQ(simulate(g.w, host_profile()).step_time_ns, 510);
}

// A built FPDT step (offloading: host synchronisations in its chunk loop) and a Ulysses step.
ScheduleInputs fpdt_inputs() {
  ScheduleInputs in = testing::inputs(models::CpMethod::kFpdt, "llama3-8b", 8, 512 * 1024);
  in.parallel.fpdt_chunk = 64 * 1024;
  in.parallel.fpdt_offload = true;
  in.parallel.implementation = "deepspeed-fpdt";
  in.recipe = models::load_recipe("deepspeed-fpdt", testing::data());
  return in;
}

TEST(HostIssue, ZeroCostsLeaveBuiltStepsUnchanged) {
  // The host path with costs that round to 0 ns and no synchronisation flags is the engine
  // without a host: the same step time and peaks, to the nanosecond and the byte.
  for (const ScheduleInputs& in :
       {fpdt_inputs(), testing::inputs(models::CpMethod::kUlysses, "llama3-8b", 8, 256 * 1024)}) {
    Workload w = build_step(in);
    for (Op& o : w.ops) {
      o.host_sync = false;
    }
    const SimResult off = simulate(w, testing::round_profile());
    const SimResult zero = simulate(w, host_profile(1e-13, 1e-13, 1e-13));
    EXPECT_EQ(zero.step_time_ns, off.step_time_ns);
    ASSERT_EQ(zero.memory.size(), off.memory.size());
    for (std::size_t r = 0; r < off.memory.size(); ++r) {
      EXPECT_EQ(zero.memory[r].peak_bytes, off.memory[r].peak_bytes);
      EXPECT_EQ(zero.memory[r].host_peak_bytes, off.memory[r].host_peak_bytes);
    }
  }
}

TEST(HostIssue, FpdtSynchronisesPerBlock) {
  // deepspeed-fpdt's offloading loop synchronises the host after every forward block and every
  // backward block (fpdt_layer.py:731-732, 940-941), besides its barriers: the host model makes
  // the step longer, and with zero-cost host calls the synchronisations alone still do.
  const ScheduleInputs in = fpdt_inputs();
  const Workload w = build_step(in);
  std::int64_t syncs = 0;
  for (const Op& o : w.ops) {
    syncs += o.host_sync ? 1 : 0;
  }
  EXPECT_GT(syncs, 0);
  const SimTime off = simulate(w, testing::round_profile()).step_time_ns;
  const SimTime on = simulate(w, host_profile(4.5e-6, 2.7e-6, 6.95e-6)).step_time_ns;
  EXPECT_GT(on, off);
}

TEST(HostIssue, FpdtPrefetchOverlapsTheBlockBeforeIt) {
  // fpdt_layer.py loads the next query chunk's first K/V block before the synchronisation that
  // ends the chunk's last block (F:709-732): with the host model the fetch of chunk 2's first block
  // starts before chunk 1's diagonal block ends (block 0's forward).
  const ScheduleInputs in = fpdt_inputs();
  const Workload w = build_step(in);
  SimOptions trace;
  trace.record_trace = true;
  const SimResult r = simulate(w, in.hardware, trace);
  SimTime fetch_start = -1, diag_end = -1;
  for (const OpInterval& i : r.intervals) {
    const Op& o = w.ops[static_cast<std::size_t>(i.op)];
    if (o.rank != 0 || o.layer != 0 || o.phase != Phase::kForward) {
      continue;
    }
    const std::string& name = w.names[static_cast<std::size_t>(o.name)];
    if (name == "fetch_kv0[c2]") {
      fetch_start = i.start_ns;
    } else if (name == "attn_fwd[diag][c1]") {
      diag_end = i.end_ns;
    }
  }
  ASSERT_GE(fetch_start, 0);
  ASSERT_GE(diag_end, 0);
  EXPECT_LT(fetch_start, diag_end);
}

}  // namespace
}  // namespace cpsim::sim
