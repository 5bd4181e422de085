// Ring, all-gather, FPDT and USP schedules against hand-computed cases, the degenerate
// equivalences between methods, and the representative-rank fast path.
#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"
#include "cpsim/sim/cost_model.hpp"
#include "cpsim/sim/schedule.hpp"

#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kM = 1 << 20;
constexpr std::int64_t kK = 1 << 10;

ScheduleInputs with_ring(ScheduleInputs in, int ring) {
  in.parallel.ring_degree = ring;
  return in;
}

const std::string& name_of(const Workload& w, const Op& o) {
  return w.names[static_cast<std::size_t>(o.name)];
}

// Collectives of rank 0's ops in one layer and phase whose name starts with `prefix`.
std::vector<const Collective*> collectives(const Workload& w,
                                           int layer,
                                           Phase phase,
                                           const std::string& prefix) {
  std::vector<const Collective*> out;
  for (const Op& o : w.ops) {
    if (o.rank == 0 && o.layer == layer && o.phase == phase && o.collective != kNone &&
        name_of(w, o).rfind(prefix, 0) == 0) {
      out.push_back(&w.collectives[static_cast<std::size_t>(o.collective)]);
    }
  }
  return out;
}

// Ring over C = 8 on Llama-3-8B, N = 1M: each step sends the local K/V block,
// s·2·H_kv·d·2 = 131072·2·8·128·2 bytes, to the next rank; C − 1 steps forward.
TEST(Ring, PerStepTransferBytes) {
  const ScheduleInputs in = with_ring(inputs(CpMethod::kRing, "llama3-8b", 8, kM), 8);
  const Workload w = build_step(in, {.all_ranks = true});
  const std::int64_t block = 131072LL * 2 * 8 * 128 * 2;
  EXPECT_EQ(attention_buffers(in, derive_head_layout(in)).ring_block_bytes, block);
  const auto fwd = collectives(w, 2, Phase::kForward, "ring_send_kv");
  ASSERT_EQ(fwd.size(), 7U);
  for (const Collective* c : fwd) {
    EXPECT_EQ(c->kind, models::Collective::kSendRecv);
    EXPECT_EQ(c->size_bytes, block);
    EXPECT_EQ(c->wire_bytes, block);
    EXPECT_EQ(w.members(*c).size(), 8U);
  }
  // Backward: K/V again (7 hops) and the fp32 dK/dV accumulator (8 hops, back to its owner).
  EXPECT_EQ(collectives(w, 2, Phase::kBackward, "ring_send_kv").size(), 7U);
  const auto dkv = collectives(w, 2, Phase::kBackward, "ring_send_dkv");
  ASSERT_EQ(dkv.size(), 8U);
  EXPECT_EQ(dkv[0]->size_bytes, block * 2);  // fp32
}

// The overlap condition (REFERENCES.md [RingAttention]): a block's transfer hides behind the
// previous block's attention when it is shorter. Forward ring phase of one layer on rank 0:
//   link-bound    T_x > T_c: the phase lasts ≈ T_c + (C−1)·T_x
//   compute-bound T_x < T_c: it lasts ≈ C·T_c
double ring_phase_s(const models::HardwareProfile& hw,
                    double* block_compute_s,
                    double* block_transfer_s) {
  ScheduleInputs in = with_ring(inputs(CpMethod::kRing, "llama3-8b", 8, 256 * kK), 8);
  in.hardware = hw;
  in.recipe.checkpointing = models::CheckpointMode::kNone;
  in.recipe.checkpoint_offload = false;
  test::EvaluateOptions o;
  o.keep_trace = true;
  const test::Evaluation e = test::evaluate(in, o);
  SimTime first = -1, last = 0;
  std::vector<SimTime> durations;
  for (const OpInterval& iv : e.result->intervals) {
    const Op& op = e.workload->ops[static_cast<std::size_t>(iv.op)];
    if (op.rank == 0 && op.layer == 2 && op.phase == Phase::kForward &&
        name_of(*e.workload, op).rfind("ring_attn_fwd", 0) == 0) {
      first = first < 0 ? iv.start_ns : std::min(first, iv.start_ns);
      last = std::max(last, iv.end_ns);
      durations.push_back(iv.end_ns - iv.start_ns);
    }
    if (op.rank == 0 && op.layer == 2 && op.phase == Phase::kForward &&
        name_of(*e.workload, op) == "ring_send_kv1") {
      *block_transfer_s = simtime_to_seconds(iv.end_ns - iv.start_ns);
    }
  }
  *block_compute_s = simtime_to_seconds(durations.at(3));  // a non-diagonal block
  return simtime_to_seconds(last - first);
}

TEST(Ring, OverlapCondition) {
  models::HardwareProfile hw = testing::round_profile();
  hw.compute_slowdown_under_comm = 0.0;
  double tc = 0, tx = 0;
  // Fast link: compute-bound.
  const double fast = ring_phase_s(hw, &tc, &tx);
  ASSERT_LT(tx, tc);
  EXPECT_NEAR(fast, 8 * tc, 0.05 * 8 * tc);  // step 0 (causal, 2c×2c/2) ≈ one block
  // Slow link: 60 × slower send/recv makes every transfer longer than a block's attention.
  auto& sr = hw.collectives[models::Span::kIntraNode][models::Collective::kSendRecv];
  sr.peak_busbw_bytes_per_s /= 60.0;
  const double slow = ring_phase_s(hw, &tc, &tx);
  ASSERT_GT(tx, tc);
  EXPECT_NEAR(slow, tc + 7 * tx, 0.05 * (tc + 7 * tx));
}

// Zigzag gives every rank the same causal work; contiguous leaves rank C−1 with C blocks and rank 0
// with one.
TEST(Ring, ZigzagBalancesCausalWork) {
  auto busy = [](models::RingLayout layout) {
    ScheduleInputs in = with_ring(inputs(CpMethod::kRing, "llama3-8b", 8, 512 * kK), 8);
    in.parallel.ring_layout = layout;
    const test::Evaluation e = test::evaluate(in, {.keep_trace = true});
    std::vector<double> attention(8, 0.0);
    for (const OpInterval& iv : e.result->intervals) {
      const Op& op = e.workload->ops[static_cast<std::size_t>(iv.op)];
      if (op.kind == OpKind::kAttentionFwd && op.layer == 1 && op.phase == Phase::kForward) {
        attention[static_cast<std::size_t>(op.rank)] +=
            op.flops > 0 || iv.end_ns > iv.start_ns ? static_cast<double>(iv.end_ns - iv.start_ns)
                                                    : 0.0;
      }
    }
    return attention;
  };
  const auto zig = busy(models::RingLayout::kZigzag);
  const double zmax = *std::max_element(zig.begin(), zig.end());
  const double zmin = *std::min_element(zig.begin(), zig.end());
  EXPECT_LT(zmax / zmin, 1.02);
  const auto contiguous = busy(models::RingLayout::kContiguous);
  EXPECT_GT(contiguous[7] / contiguous[0], 6.0);  // 1 causal + 7 full blocks vs 1 causal block
}

// All-gather CP: forward gathers K/V of the whole sequence, N·2·H_kv·d·2 bytes; backward gathers
// again and reduce-scatters dK/dV of the same size. (C−1)/C of it crosses the links.
TEST(AllGather, Volumes) {
  const ScheduleInputs in = with_ring(inputs(CpMethod::kAllGather, "llama3-8b", 8, kM), 8);
  const Workload w = build_step(in, {.all_ranks = true});
  const std::int64_t full = kM * 2 * 8 * 128 * 2;
  EXPECT_EQ(attention_buffers(in, derive_head_layout(in)).allgather_kv_bytes, full);
  const auto ag = collectives(w, 4, Phase::kForward, "allgather_kv");
  ASSERT_EQ(ag.size(), 1U);
  EXPECT_EQ(ag[0]->kind, models::Collective::kAllGather);
  EXPECT_EQ(ag[0]->size_bytes, full);
  EXPECT_EQ(ag[0]->wire_bytes, full / 8 * 7);
  EXPECT_EQ(collectives(w, 4, Phase::kBackward, "allgather_kv").size(), 1U);
  const auto rs = collectives(w, 4, Phase::kBackward, "reducescatter_dkv");
  ASSERT_EQ(rs.size(), 1U);
  EXPECT_EQ(rs[0]->size_bytes, full);
}

// FPDT on Llama-3-8B, 8 GPUs, N = 512K, chunk 64K: 8 chunks; every chunk's K/V (64K tokens, one
// KV head per rank: 65536·2·1·128·2 bytes) goes to host in the forward; Q and output + LSE are
// offloaded too in the pass that saves them for backward.
TEST(Fpdt, ChunksAndOffloadedBytes) {
  ScheduleInputs in = inputs(CpMethod::kFpdt, "llama3-8b", 8, 512 * kK);
  in.parallel.fpdt_chunk = 64 * kK;
  const HeadLayout L = derive_head_layout(in);
  EXPECT_EQ(L.fpdt_chunks, 8);
  const Workload w = build_step(in, {.all_ranks = true});
  const std::int64_t kv_chunk = 65536LL * 2 * 1 * 128 * 2;
  const std::int64_t q_chunk = 65536LL * 4 * 128 * 2;
  const std::int64_t lse_chunk = 4 * 65536LL * 4;
  std::map<Phase, std::int64_t> d2h;
  int kv_offloads = 0;
  for (const Op& o : w.ops) {
    if (o.rank == 0 && o.layer == 5 && o.kind == OpKind::kCopyD2H &&
        name_of(w, o).rfind("offload_ckpt", 0) != 0) {
      d2h[o.phase] += o.transfer_bytes;
      kv_offloads += o.phase == Phase::kForward && name_of(w, o).rfind("offload_kv", 0) == 0;
    }
  }
  EXPECT_EQ(kv_offloads, 8);
  EXPECT_EQ(d2h[Phase::kForward], 8 * kv_chunk);  // full AC: the first forward saves nothing
  EXPECT_EQ(d2h[Phase::kRecompute], 8 * (kv_chunk + q_chunk + q_chunk + lse_chunk));
  // Host memory holds at least one layer's saved chunks on top of the block checkpoints.
  const auto rep = test::evaluate(in).report;
  const std::int64_t checkpoints = 8LL * 30 * (512 * kK / 8) * 4096 * 2;
  EXPECT_GE(rep.host_memory_bytes, checkpoints + 8 * 8 * (kv_chunk + 2 * q_chunk + lse_chunk));
  // The chunk must divide the sequence and be a multiple of the CP degree.
  in.parallel.fpdt_chunk = 100000;
  try {
    derive_head_layout(in);
    ADD_FAILURE() << "chunk 100000 accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(e.quantity(), Quantity::kFpdtChunk);
  }
}

// USP on 16 GPUs (2 nodes), Ulysses 8 × ring 2: Ulysses groups are the 8 GPUs of a node, ring
// groups pair rank i with rank i + 8 across the nodes.
TEST(Usp, GroupMembershipAndLinks) {
  ScheduleInputs in = with_ring(inputs(CpMethod::kUsp, "llama3-8b", 16, kM), 2);
  const Workload w = build_step(in, {.all_ranks = true});
  const Collective* a2a = nullptr;
  const Collective* send = nullptr;
  for (const Op& o : w.ops) {
    if (o.rank == 3 && o.layer == 0 && o.phase == Phase::kForward && o.collective != kNone) {
      const Collective& c = w.collectives[static_cast<std::size_t>(o.collective)];
      if (name_of(w, o) == "a2a_q")
        a2a = &c;
      if (name_of(w, o).rfind("ring_send_kv", 0) == 0)
        send = &c;
    }
  }
  ASSERT_NE(a2a, nullptr);
  ASSERT_NE(send, nullptr);
  EXPECT_EQ(w.members(*a2a), (std::vector<std::int32_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(a2a->span, models::Span::kIntraNode);
  EXPECT_EQ(w.members(*send), (std::vector<std::int32_t>{3, 11}));
  EXPECT_EQ(send->span, models::Span::kInterNode);
  // Per rank: the Q all-to-all sends s·H·d·2 (s = N/16), 7/8 of it over NVLink; each ring step
  // sends the K/V block of N/2 tokens with one KV head: (N/2)·2·1·128·2 over the NIC.
  EXPECT_EQ(a2a->size_bytes, kM / 16 * 32 * 128 * 2);
  EXPECT_EQ(a2a->wire_bytes, kM / 16 * 32 * 128 * 2 / 8 * 7);
  EXPECT_EQ(send->size_bytes, kM / 2 * 2 * 1 * 128 * 2);
}

void expect_same_step(const test::Evaluation& a, const test::Evaluation& b) {
  EXPECT_EQ(a.report.step_time_s, b.report.step_time_s);
  EXPECT_EQ(a.report.peak_memory_bytes, b.report.peak_memory_bytes);
  EXPECT_EQ(a.report.host_memory_bytes, b.report.host_memory_bytes);
  for (std::size_t c = 0; c < kMemCategoryCount; ++c) {
    EXPECT_EQ(a.report.category_peak[c], b.report.category_peak[c]) << c;
  }
}

TEST(Degenerate, RingWithOneRankIsNoCp) {
  expect_same_step(test::evaluate(with_ring(inputs(CpMethod::kRing, "llama3-8b", 1, 64 * kK), 1)),
                   test::evaluate(inputs(CpMethod::kUlysses, "llama3-8b", 1, 64 * kK)));
}

TEST(Degenerate, UspWithRingOneIsUlysses) {
  expect_same_step(test::evaluate(with_ring(inputs(CpMethod::kUsp, "llama3-8b", 8, kM), 1)),
                   test::evaluate(inputs(CpMethod::kUlysses, "llama3-8b", 8, kM)));
}

TEST(Degenerate, FpdtWithOneChunkOnGpuIsUlysses) {
  ScheduleInputs in = inputs(CpMethod::kFpdt, "llama3-8b", 8, 256 * kK);
  in.parallel.fpdt_chunk = 256 * kK;
  in.parallel.fpdt_offload = false;
  expect_same_step(test::evaluate(in),
                   test::evaluate(inputs(CpMethod::kUlysses, "llama3-8b", 8, 256 * kK)));
}

TEST(Degenerate, UspWithUlyssesOneIsRing) {
  expect_same_step(test::evaluate(with_ring(inputs(CpMethod::kUsp, "llama3-8b", 8, kM), 8)),
                   test::evaluate(with_ring(inputs(CpMethod::kRing, "llama3-8b", 8, kM), 8)));
}

// The representative-rank fast path agrees with simulating every rank.
TEST(FastPath, AgreesWithAllRanks) {
  std::vector<ScheduleInputs> cases = {inputs(CpMethod::kUlysses, "llama3-8b", 8, kM),
                                       inputs(CpMethod::kUPipe, "qwen3-32b", 8, 512 * kK),
                                       inputs(CpMethod::kFpdt, "llama3-8b", 8, 512 * kK),
                                       inputs(CpMethod::kUlysses, "qwen3-4b", 16, 256 * kK)};
  cases[3].parallel.cp_degree = 8;  // 2 data-parallel replicas
  for (const ScheduleInputs& in : cases) {
    ASSERT_TRUE(has_representative_rank(in));
    const test::Evaluation fast = test::evaluate(in);
    const test::Evaluation full = test::evaluate(in, {.all_ranks = true});
    EXPECT_EQ(fast.report.simulated_ranks, 1);
    EXPECT_EQ(full.report.simulated_ranks, in.parallel.gpus);
    expect_same_step(fast, full);
  }
}

// With a ring the representative rank takes each step's slowest position: exact for contiguous
// rings (the last rank computes every block), within a few percent for zigzag.
TEST(FastPath, RingWithinTolerance) {
  for (const auto layout : {models::RingLayout::kZigzag, models::RingLayout::kContiguous}) {
    for (const CpMethod m : {CpMethod::kRing, CpMethod::kAllGather, CpMethod::kUsp}) {
      ScheduleInputs in = with_ring(inputs(m, "llama3-8b", 16, kM), m == CpMethod::kUsp ? 2 : 16);
      in.parallel.ring_layout = layout;
      const auto fast = test::evaluate(in).report;
      const auto full = test::evaluate(in, {.all_ranks = true}).report;
      SCOPED_TRACE(std::string(models::to_string(m)) + " " + models::to_string(layout));
      EXPECT_EQ(fast.simulated_ranks, 1);
      EXPECT_NEAR(fast.step_time_s, full.step_time_s, 0.03 * full.step_time_s);
      EXPECT_GE(fast.step_time_s, full.step_time_s * 0.999);  // never optimistic
      EXPECT_EQ(fast.peak_memory_bytes, full.peak_memory_bytes);
    }
  }
}

// Merged ring steps (BuildOptions::merge_ring_steps) against the step-by-step ring. With nothing
// beside the ring (ZeRO-0, no offload) the two schedules are the same up to nanosecond rounding:
// equal peak, step time within 1e-6. With FSDP gathers and checkpoint offload overlapping the
// steps differently, within 0.5 % in time and 1 % in peak.
TEST(MergedRing, AgreesWithStepByStep) {
  struct Case {
    CpMethod method;
    const char* model;
    int gpus;
    int ring;
    std::int64_t seq;
    std::int64_t heads_per_stage;
  };
  const Case cases[] = {
      {CpMethod::kRing, "llama3-8b", 8, 8, 64 * kK, 0},  // communication-bound steps
      {CpMethod::kRing, "llama3-8b", 8, 8, 2 * kM, 0},   // compute-bound steps
      {CpMethod::kRing, "llama3-8b", 16, 16, kM, 0},     // across nodes
      {CpMethod::kUsp, "llama3-8b", 32, 4, kM, 0},
      {CpMethod::kUPipe, "llama3-8b", 64, 32, kM, 2},
      {CpMethod::kUPipe, "qwen3-4b", 32, 8, 512 * kK, 4},
  };
  for (const Case& c : cases) {
    for (const bool isolated : {true, false}) {
      ScheduleInputs in =
          with_ring(inputs(c.method, c.model, c.gpus, c.seq, c.heads_per_stage), c.ring);
      if (isolated) {
        in.recipe.zero_stage = 0;
        in.recipe.checkpoint_offload = false;
      }
      SCOPED_TRACE(fmt::format("{} {} gpus {} ring {} seq {} {}", models::to_string(c.method),
                               c.model, c.gpus, c.ring, c.seq, isolated ? "isolated" : "alst"));
      const auto merged = test::evaluate(in).report;
      const auto steps = test::evaluate(in, {.merge_ring_steps = false}).report;
      EXPECT_LT(merged.ops, steps.ops);
      if (isolated) {
        EXPECT_NEAR(merged.step_time_s, steps.step_time_s, 1e-6 * steps.step_time_s);
        EXPECT_EQ(merged.peak_memory_bytes, steps.peak_memory_bytes);
      } else {
        EXPECT_NEAR(merged.step_time_s, steps.step_time_s, 0.005 * steps.step_time_s);
        EXPECT_NEAR(static_cast<double>(merged.peak_memory_bytes),
                    static_cast<double>(steps.peak_memory_bytes),
                    0.01 * static_cast<double>(steps.peak_memory_bytes));
      }
    }
  }
}

TEST(Trace, RingSendOverlapsAttention) {
  const ScheduleInputs in = with_ring(inputs(CpMethod::kRing, "llama3-8b", 8, 512 * kK), 8);
  const test::Evaluation e = test::evaluate(in, {.keep_trace = true});
  std::vector<OpInterval> sends, attn;
  for (const OpInterval& iv : e.result->intervals) {
    const Op& op = e.workload->ops[static_cast<std::size_t>(iv.op)];
    if (op.rank != 0)
      continue;
    const std::string& n = name_of(*e.workload, op);
    if (n.rfind("ring_send_kv", 0) == 0)
      sends.push_back(iv);
    if (n.rfind("ring_attn_fwd", 0) == 0)
      attn.push_back(iv);
  }
  int overlapping = 0;
  for (const OpInterval& s : sends) {
    for (const OpInterval& a : attn) {
      overlapping += s.start_ns < a.end_ns && a.start_ns < s.end_ns;
    }
  }
  EXPECT_GT(overlapping, static_cast<int>(sends.size()) / 2);
}

TEST(Trace, FpdtCopiesOverlapCompute) {
  ScheduleInputs in = inputs(CpMethod::kFpdt, "llama3-8b", 8, 512 * kK);
  const test::Evaluation e = test::evaluate(in, {.keep_trace = true});
  std::vector<OpInterval> copies, compute;
  for (const OpInterval& iv : e.result->intervals) {
    const Op& op = e.workload->ops[static_cast<std::size_t>(iv.op)];
    if (op.rank != 0 || op.layer != 3)
      continue;
    if (op.kind == OpKind::kCopyH2D || op.kind == OpKind::kCopyD2H)
      copies.push_back(iv);
    if (op.kind == OpKind::kAttentionFwd || op.kind == OpKind::kAttentionBwd)
      compute.push_back(iv);
  }
  ASSERT_FALSE(copies.empty());
  int overlapping = 0;
  for (const OpInterval& c : copies) {
    for (const OpInterval& a : compute) {
      if (c.start_ns < a.end_ns && a.start_ns < c.end_ns) {
        ++overlapping;
        break;
      }
    }
  }
  EXPECT_GT(overlapping, static_cast<int>(copies.size()) / 2);
}

}  // namespace
}  // namespace cpsim::sim

namespace cpsim::sim {
namespace {

// Every builder emits an acyclic graph (checked with Boost.Graph's topological sort), for every
// method on one and two nodes, full and representative ranks.
TEST(Graph, EveryMethodIsAcyclic) {
  for (const CpMethod m : {CpMethod::kUlysses, CpMethod::kUPipe, CpMethod::kRing,
                           CpMethod::kAllGather, CpMethod::kFpdt, CpMethod::kUsp}) {
    for (const int gpus : {8, 16}) {
      ScheduleInputs in = inputs(m, "qwen3-4b", gpus, 256 * kK);
      in.parallel.ring_degree = m == CpMethod::kRing || m == CpMethod::kAllGather ? gpus
                                : (m == CpMethod::kUsp || m == CpMethod::kUPipe) && gpus == 16 ? 2
                                                                                               : 1;
      SCOPED_TRACE(std::string(models::to_string(m)) + " gpus " + std::to_string(gpus));
      EXPECT_NO_THROW(test::evaluate(in, {.all_ranks = true, .verify_graph = true}));
    }
  }
}

}  // namespace
}  // namespace cpsim::sim
