// Event loop semantics on hand-built op graphs with hand-computed answers.
#include "cpsim/sim/engine.hpp"

#include <gtest/gtest.h>

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

// Minimal graph builder for engine tests (explicit ops, tensors, deps).
struct G {
  Workload w;
  explicit G(int ranks) {
    w.ranks = ranks;
    w.static_memory.assign(static_cast<std::size_t>(ranks), {});
  }
  TensorId tensor(int rank,
                  std::int64_t bytes,
                  MemCategory c = MemCategory::kOther,
                  bool host = false) {
    Tensor t;
    t.rank = rank;
    t.bytes = bytes;
    t.category = c;
    t.on_host = host;
    w.tensors.push_back(t);
    return static_cast<TensorId>(w.tensors.size() - 1);
  }
  OpId op(int rank,
          Stream s,
          SimTime dur,
          std::vector<OpId> deps = {},
          std::vector<TensorId> in = {},
          std::vector<TensorId> out = {},
          OpKind kind = OpKind::kGemm,
          CollectiveId coll = kNone,
          std::int64_t bytes = 0) {
    Op o;
    o.rank = rank;
    o.stream = s;
    o.kind = kind;
    o.duration_ns = dur;
    o.collective = coll;
    o.transfer_bytes = bytes;
    o.name = w.intern("op" + std::to_string(w.ops.size()));
    o.deps_begin = static_cast<std::int32_t>(w.edges.size());
    for (OpId d : deps)
      w.edges.push_back(d);
    o.deps_end = static_cast<std::int32_t>(w.edges.size());
    o.inputs_begin = o.deps_end;
    for (TensorId t : in) {
      w.edges.push_back(t);
      w.tensors[static_cast<std::size_t>(t)].consumers += 1;
    }
    o.inputs_end = static_cast<std::int32_t>(w.edges.size());
    o.outputs_begin = o.inputs_end;
    for (TensorId t : out) {
      w.edges.push_back(t);
      w.tensors[static_cast<std::size_t>(t)].producer = static_cast<OpId>(w.ops.size());
    }
    o.outputs_end = static_cast<std::int32_t>(w.edges.size());
    w.ops.push_back(o);
    return static_cast<OpId>(w.ops.size() - 1);
  }
  CollectiveId collective(std::vector<std::int32_t> members,
                          std::int64_t wire,
                          double bytes_per_s,
                          double alpha_s = 0.0) {
    Collective c;
    c.group = static_cast<std::int32_t>(w.groups.size());
    w.groups.push_back(std::move(members));
    c.wire_bytes = wire;
    c.size_bytes = wire;
    c.nominal_bytes_per_s = bytes_per_s;
    c.alpha_s = alpha_s;
    w.collectives.push_back(c);
    return static_cast<CollectiveId>(w.collectives.size() - 1);
  }
};

const models::HardwareProfile& profile() {
  static const models::HardwareProfile p = testing::round_profile();
  return p;
}

TEST(Engine, StreamRunsOpsInOrder) {
  G g(1);
  g.op(0, Stream::kCompute, 100);
  g.op(0, Stream::kCompute, 250);
  EXPECT_EQ(simulate(g.w, profile()).step_time_ns, 350);
}

TEST(Engine, StreamsOverlapUnlessDependent) {
  G g(1);
  const OpId a = g.op(0, Stream::kCompute, 100);
  g.op(0, Stream::kD2H, 0, {}, {}, {}, OpKind::kCopyD2H, kNone, 80);  // 80 bytes at 1 B/ns
  EXPECT_EQ(simulate(g.w, profile()).step_time_ns, 100);
  g.op(0, Stream::kComm, 0, {a}, {}, {}, OpKind::kCopyH2D, kNone, 50);  // after a: ends at 150
  EXPECT_EQ(simulate(g.w, profile()).step_time_ns, 150);
}

TEST(Engine, CollectiveWaitsForEveryMember) {
  // Rank 1 reaches the collective 300 ns after rank 0; both finish 300 + 1000 ns later.
  G g(2);
  const CollectiveId c = g.collective({0, 1}, 1000, 1e9);
  const OpId late = g.op(1, Stream::kCompute, 300);
  g.op(0, Stream::kComm, 0, {}, {}, {}, OpKind::kCollective, c);
  g.op(1, Stream::kComm, 0, {late}, {}, {}, OpKind::kCollective, c);
  const SimResult r = simulate(g.w, profile());
  EXPECT_EQ(r.step_time_ns, 1300);
}

TEST(Engine, ConcurrentCollectivesShareTheLink) {
  // Two 1000-byte transfers at 1 B/ns on the same link run at half speed: both end at 2000 ns.
  G g(2);
  const CollectiveId c1 = g.collective({0, 1}, 1000, 1e9);
  const CollectiveId c2 = g.collective({0, 1}, 1000, 1e9);
  for (int r = 0; r < 2; ++r) {
    g.op(r, Stream::kComm, 0, {}, {}, {}, OpKind::kCollective, c1);
  }
  for (int r = 0; r < 2; ++r) {
    g.op(r, Stream::kFsdp, 0, {}, {}, {}, OpKind::kCollective, c2);
  }
  EXPECT_EQ(simulate(g.w, profile()).step_time_ns, 2000);
}

TEST(Engine, SharingEndsWhenOneTransferFinishes) {
  // 500 and 1000 bytes together: both at 0.5 B/ns until the first ends at 1000 ns; the second has
  // 500 bytes left at full speed: ends at 1500 ns.
  G g(2);
  const CollectiveId c1 = g.collective({0, 1}, 500, 1e9);
  const CollectiveId c2 = g.collective({0, 1}, 1000, 1e9);
  for (int r = 0; r < 2; ++r)
    g.op(r, Stream::kComm, 0, {}, {}, {}, OpKind::kCollective, c1);
  for (int r = 0; r < 2; ++r)
    g.op(r, Stream::kFsdp, 0, {}, {}, {}, OpKind::kCollective, c2);
  EXPECT_EQ(simulate(g.w, profile()).step_time_ns, 1500);
}

TEST(Engine, CollectiveLatencyAddsToTransfer) {
  G g(2);
  const CollectiveId c = g.collective({0, 1}, 1000, 1e9, 250e-9);
  for (int r = 0; r < 2; ++r)
    g.op(r, Stream::kComm, 0, {}, {}, {}, OpKind::kCollective, c);
  EXPECT_EQ(simulate(g.w, profile()).step_time_ns, 1250);
}

TEST(Engine, ComputeSlowsUnderConcurrentCollective) {
  models::HardwareProfile p = profile();
  p.compute_slowdown_under_comm = 0.25;  // compute at 1/1.25 = 0.8 while the collective runs
  G g(2);
  const CollectiveId c = g.collective({0, 1}, 400, 1e9);
  g.op(0, Stream::kCompute, 1000);
  for (int r = 0; r < 2; ++r)
    g.op(r, Stream::kComm, 0, {}, {}, {}, OpKind::kCollective, c);
  // 400 ns at 0.8 → 320 ns of work done; 680 ns left at full speed: ends at 1080 ns.
  EXPECT_EQ(simulate(g.w, p).step_time_ns, 1080);
}

TEST(Engine, DuplexCopiesShareTheDuplexTotal) {
  // H2D and D2H of 1000 bytes together: 0.5 B/ns each (duplex total 1 B/ns): both end at 2000.
  G g(1);
  g.op(0, Stream::kH2D, 0, {}, {}, {}, OpKind::kCopyH2D, kNone, 1000);
  g.op(0, Stream::kD2H, 0, {}, {}, {}, OpKind::kCopyD2H, kNone, 1000);
  EXPECT_EQ(simulate(g.w, profile()).step_time_ns, 2000);
  models::HardwareProfile p = profile();
  p.host_link.duplex_total_bytes_per_s = 2e9;  // full duplex: both at 1 B/ns
  EXPECT_EQ(simulate(g.w, p).step_time_ns, 1000);
}

TEST(Engine, TensorLivesFromProducerStartToLastConsumerEnd) {
  G g(1);
  const TensorId t = g.tensor(0, 1 << 20, MemCategory::kAttention);
  const TensorId u = g.tensor(0, 1 << 10, MemCategory::kOther);
  const OpId p = g.op(0, Stream::kCompute, 100, {}, {}, {t});
  g.op(0, Stream::kCompute, 100, {p}, {t}, {u});  // t and u live together here: the peak
  g.op(0, Stream::kCompute, 100, {}, {u}, {});
  g.w.static_memory[0].model_states_bytes = 4096;
  const SimResult r = simulate(g.w, profile());
  const RankMemory& m = r.memory[0];
  EXPECT_EQ(m.peak_bytes, 4096 + (1 << 20) + (1 << 10));
  EXPECT_EQ(m.peak_op, 1);
  EXPECT_EQ(m.peak_time_ns, 100);
  EXPECT_EQ(m.breakdown_at_peak[static_cast<std::size_t>(MemCategory::kAttention)], 1 << 20);
  EXPECT_EQ(m.breakdown_at_peak[static_cast<std::size_t>(MemCategory::kModelStates)], 4096);
}

TEST(Engine, UnconsumedOutputIsFreedWhenItsProducerEnds) {
  G g(1);
  const TensorId t = g.tensor(0, 1 << 20);
  const TensorId u = g.tensor(0, 1 << 20);
  g.op(0, Stream::kCompute, 10, {}, {}, {t});
  g.op(0, Stream::kCompute, 10, {}, {}, {u});
  EXPECT_EQ(simulate(g.w, profile()).memory[0].peak_bytes, 1 << 20);
}

TEST(Engine, AllocationsRoundTo512Bytes) {
  G g(1);
  const TensorId t = g.tensor(0, 1);
  g.op(0, Stream::kCompute, 10, {}, {}, {t});
  EXPECT_EQ(simulate(g.w, profile()).memory[0].peak_bytes, 512);
}

TEST(Engine, HostTensorsCountAsHostMemory) {
  G g(1);
  const TensorId h = g.tensor(0, 5000, MemCategory::kActivations, /*host=*/true);
  g.op(0, Stream::kD2H, 0, {}, {}, {h}, OpKind::kCopyD2H, kNone, 10);
  g.op(0, Stream::kCompute, 100, {}, {h}, {});
  const SimResult r = simulate(g.w, profile());
  EXPECT_EQ(r.memory[0].host_peak_bytes, 5000);
  EXPECT_EQ(r.memory[0].peak_bytes, 0);
}

// Memory 4096 static, then +1 MiB, +2 MiB (peak 4096 + 3 MiB at op 1), then freed; a third op.
TEST(Engine, StopsOnceDeviceMemoryPassesTheLimit) {
  G g(1);
  const TensorId t = g.tensor(0, 1 << 20);
  const TensorId u = g.tensor(0, 2 << 20);
  const OpId p = g.op(0, Stream::kCompute, 100, {}, {}, {t});
  g.op(0, Stream::kCompute, 100, {p}, {t}, {u});
  g.op(0, Stream::kCompute, 100, {}, {u}, {});
  g.w.static_memory[0].model_states_bytes = 4096;
  const SimResult full = simulate(g.w, profile());
  EXPECT_FALSE(full.stopped_early);
  EXPECT_EQ(full.step_time_ns, 300);

  SimOptions o;
  o.stop_above_device_bytes = 4096 + (2 << 20);  // passed when op 1 allocates u
  const SimResult stopped = simulate(g.w, profile(), o);
  EXPECT_TRUE(stopped.stopped_early);
  EXPECT_EQ(stopped.memory[0].peak_bytes, 4096 + (3 << 20));
  EXPECT_EQ(stopped.memory[0].peak_op, 1);
  EXPECT_EQ(stopped.step_time_ns, 100);  // op 1 started at 100; nothing after it ran
  EXPECT_LT(stopped.events, full.events);

  o.stop_above_device_bytes = full.memory[0].peak_bytes;  // reached, not passed: a whole run
  const SimResult exact = simulate(g.w, profile(), o);
  EXPECT_FALSE(exact.stopped_early);
  EXPECT_EQ(exact.step_time_ns, full.step_time_ns);
  EXPECT_EQ(exact.events, full.events);
  EXPECT_EQ(exact.memory[0].peak_bytes, full.memory[0].peak_bytes);

  o.stop_above_device_bytes = 1000;  // static memory alone passes it: nothing runs
  const SimResult at_once = simulate(g.w, profile(), o);
  EXPECT_TRUE(at_once.stopped_early);
  EXPECT_EQ(at_once.events, 0);
}

// Host memory: rank 0 holds 3000 B on the host from t = 0 to 100, rank 1 2500 B from t = 200 to
// 300. summarize() counts a node's host memory as the sum of its ranks' host peaks: 5500 B when
// both are on one node, though never live together; the run stops when the sum so far passes the
// limit.
TEST(Engine, StopsOnceANodesHostMemoryPassesTheLimit) {
  G g(2);
  const TensorId h0 = g.tensor(0, 3000, MemCategory::kActivations, /*host=*/true);
  const TensorId h1 = g.tensor(1, 2500, MemCategory::kActivations, /*host=*/true);
  g.op(0, Stream::kCompute, 100, {}, {}, {h0});
  g.op(0, Stream::kCompute, 100, {}, {h0}, {});
  g.op(1, Stream::kCompute, 200, {}, {}, {});
  g.op(1, Stream::kCompute, 100, {}, {}, {h1});
  g.op(1, Stream::kCompute, 100, {}, {h1}, {});
  const SimResult full = simulate(g.w, profile());
  EXPECT_FALSE(full.stopped_early);
  EXPECT_EQ(full.step_time_ns, 400);

  SimOptions o;
  o.stop_above_host_bytes = 5499;  // passed when rank 1 allocates at t = 200 (3000 + 2500)
  const SimResult stopped = simulate(g.w, profile(), o);
  EXPECT_TRUE(stopped.stopped_early);
  EXPECT_EQ(stopped.step_time_ns, 200);
  EXPECT_EQ(stopped.memory[1].host_peak_bytes, 2500);

  o.stop_above_host_bytes = 5500;  // reached, not passed: the whole run
  const SimResult exact = simulate(g.w, profile(), o);
  EXPECT_FALSE(exact.stopped_early);
  EXPECT_EQ(exact.step_time_ns, full.step_time_ns);
  EXPECT_EQ(exact.events, full.events);

  o.stop_above_host_bytes = 2999;  // rank 0 alone passes it at t = 0
  EXPECT_EQ(simulate(g.w, profile(), o).step_time_ns, 0);

  g.w.gpus_per_node = 1;  // a node per rank: 3000 and 2500 apart, neither above 5499 or 3000
  o.stop_above_host_bytes = 3000;
  EXPECT_FALSE(simulate(g.w, profile(), o).stopped_early);
  o.stop_above_host_bytes = 2999;
  EXPECT_TRUE(simulate(g.w, profile(), o).stopped_early);
}

// On the representative-rank path rank 0 stands for every rank of its node: 1000 B of host memory
// on rank 0 of a job of 16 ranks with 8 per node is 8000 B per node.
TEST(Engine, HostStopCountsTheRanksRank0StandsFor) {
  G g(1);
  g.w.represented_ranks = 16;
  g.w.gpus_per_node = 8;
  const TensorId h = g.tensor(0, 1000, MemCategory::kActivations, /*host=*/true);
  g.op(0, Stream::kCompute, 100, {}, {}, {h});
  g.op(0, Stream::kCompute, 100, {}, {h}, {});
  SimOptions o;
  o.stop_above_host_bytes = 7999;
  EXPECT_TRUE(simulate(g.w, profile(), o).stopped_early);
  o.stop_above_host_bytes = 8000;
  const SimResult r = simulate(g.w, profile(), o);
  EXPECT_FALSE(r.stopped_early);
  EXPECT_EQ(r.step_time_ns, 200);
}

TEST(Engine, CycleFromMismatchedCollectiveOrderIsDetected) {
  // Rank 0 issues A then B on one stream, rank 1 issues B then A: a deadlock.
  G g(2);
  const CollectiveId a = g.collective({0, 1}, 10, 1e9);
  const CollectiveId b = g.collective({0, 1}, 10, 1e9);
  g.op(0, Stream::kComm, 0, {}, {}, {}, OpKind::kCollective, a);
  g.op(0, Stream::kComm, 0, {}, {}, {}, OpKind::kCollective, b);
  g.op(1, Stream::kComm, 0, {}, {}, {}, OpKind::kCollective, b);
  g.op(1, Stream::kComm, 0, {}, {}, {}, OpKind::kCollective, a);
  EXPECT_THROW(check_acyclic(g.w), std::logic_error);
  EXPECT_THROW(simulate(g.w, profile()), std::logic_error);  // stalls: reported, never hangs
}

TEST(Engine, SameInputsSameResult) {
  const ScheduleInputs in = testing::inputs(models::CpMethod::kUPipe, "llama3-8b", 8, 1 << 20);
  const Workload w = build_step(in);
  SimOptions o;
  o.record_trace = true;
  const SimResult a = simulate(w, in.hardware, o);
  const SimResult b = simulate(w, in.hardware, o);
  EXPECT_EQ(a.step_time_ns, b.step_time_ns);
  EXPECT_EQ(a.events, b.events);
  ASSERT_EQ(a.intervals.size(), b.intervals.size());
  for (std::size_t i = 0; i < a.intervals.size(); ++i) {
    EXPECT_EQ(a.intervals[i].start_ns, b.intervals[i].start_ns);
    EXPECT_EQ(a.intervals[i].end_ns, b.intervals[i].end_ns);
  }
  for (std::size_t r = 0; r < a.memory.size(); ++r) {
    EXPECT_EQ(a.memory[r].peak_bytes, b.memory[r].peak_bytes);
  }
}

}  // namespace
}  // namespace cpsim::sim
