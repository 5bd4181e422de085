// Tensor parallelism with sequence parallelism around CP, and gradient accumulation: hand-computed
// collective bytes, sharded model states, activation memory, placement, refusals and the step
// time of M micro-batches.
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "cpsim/sim/schedule.hpp"

#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kK = 1024;

// Llama 3 8B (h 4096, 32 heads, 8 KV heads, d 128, f 14336, V 128256, 32 layers) on 8 GPUs as
// TP 2 × Ulysses 4, 64K tokens: s = 16384 per CP rank, 8192 per TP rank.
ScheduleInputs tp2_ulysses4() {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * kK);
  in.parallel.cp_degree = 4;
  in.parallel.tp_degree = 2;
  return in;
}

std::string issue_of(const ScheduleInputs& in) {
  const LayoutCheck c = check_head_layout(in);
  return c.issue ? to_string(c.issue->quantity) : "";
}

TEST(TensorParallel, CollectiveBytesPerLayer) {
  ScheduleInputs in = tp2_ulysses4();
  in.recipe.checkpointing = models::CheckpointMode::kNone;
  in.recipe.checkpoint_offload = false;
  const Workload w = build_step(in);
  // S = s·h·2 = 16384 · 4096 · 2 bytes for every all-gather and reduce-scatter; wire S·(T−1)/T.
  constexpr std::int64_t kS = 16384LL * 4096 * 2;
  std::map<std::string, int> forward, backward;
  for (const Op& op : w.ops) {
    const std::string& name = w.names[static_cast<std::size_t>(op.name)];
    if (op.layer != 0 || name.rfind("tp_", 0) != 0) {
      continue;
    }
    const Collective& c = w.collectives[static_cast<std::size_t>(op.collective)];
    EXPECT_EQ(c.size_bytes, kS) << name;
    EXPECT_EQ(c.wire_bytes, kS / 2) << name;
    EXPECT_EQ(c.span, models::Span::kIntraNode) << name;
    (op.phase == Phase::kForward ? forward : backward)[name.substr(0, 6)]++;
  }
  // Forward: all-gather before Q/K/V and gate/up, reduce-scatter after o_proj and down.
  EXPECT_EQ(forward["tp_ag."], 2);
  EXPECT_EQ(forward["tp_rs."], 2);
  // Backward (the scheme alone saves the [s/T, h] inputs, as Megatron): the all-gathers of dy and
  // dh1, the two inputs gathered again, the reduce-scatters of dh1n and dxn.
  EXPECT_EQ(backward["tp_ag."], 4);
  EXPECT_EQ(backward["tp_rs."], 2);
}

TEST(TensorParallel, MlpReduceScatterOverlapsWeightGradient) {
  // Megatron (and the scheme alone) reduce-scatter dh1n while gate/up's wgrad GEMM runs
  // (layers.py:700-707); torch-native-cp's DTensor backward reduce-scatters after it.
  ScheduleInputs in = tp2_ulysses4();
  in.recipe.tiled_mlp = false;
  in.recipe.checkpoint_offload = false;
  test::EvaluateOptions keep;
  keep.keep_trace = true;
  const test::Evaluation e = test::evaluate(in, keep);
  const Workload& w = *e.workload;
  SimTime wgrad_start = -1, wgrad_end = -1, rs_start = -1;
  for (const OpInterval& t : e.result->intervals) {  // in the order ops ended
    const Op& op = w.ops[static_cast<std::size_t>(t.op)];
    if (op.rank != 0 || op.layer != 0 || op.phase != Phase::kBackward) {
      continue;
    }
    const std::string& name = w.names[static_cast<std::size_t>(op.name)];
    if (name == "mlp_wgrad") {
      wgrad_start = t.start_ns;
      wgrad_end = t.end_ns;
    } else if (name == "tp_rs.dh1n") {
      rs_start = t.start_ns;
    }
  }
  ASSERT_GE(wgrad_start, 0);
  ASSERT_GE(rs_start, 0);
  EXPECT_EQ(rs_start, wgrad_start);  // both wait for mlp_bwd only
  EXPECT_LT(rs_start, wgrad_end);
}

TEST(TensorParallel, GroupsPlaceTpInsideCpStride) {
  const ScheduleInputs in = tp2_ulysses4();
  BuildOptions all;
  all.all_ranks = true;
  const Workload w = build_step(in, all);
  bool tp_seen = false, a2a_seen = false;
  for (const Op& op : w.ops) {
    if (op.rank != 0 || op.collective < 0) {
      continue;
    }
    const std::string& name = w.names[static_cast<std::size_t>(op.name)];
    const auto& members = w.groups[static_cast<std::size_t>(
        w.collectives[static_cast<std::size_t>(op.collective)].group)];
    if (name == "tp_ag.xn") {
      EXPECT_EQ(members, (std::vector<std::int32_t>{0, 1}));
      tp_seen = true;
    } else if (name.rfind("a2a", 0) == 0) {
      EXPECT_EQ(members, (std::vector<std::int32_t>{0, 2, 4, 6}));
      a2a_seen = true;
    }
  }
  EXPECT_TRUE(tp_seen);
  EXPECT_TRUE(a2a_seen);
}

TEST(TensorParallel, RepresentativeRankIsExact) {
  // Without a ring every rank runs the same ops; TP groups and stride-T CP groups included.
  const ScheduleInputs in = tp2_ulysses4();
  test::EvaluateOptions all;
  all.all_ranks = true;
  const test::Evaluation fast = test::evaluate(in);
  const test::Evaluation full = test::evaluate(in, all);
  EXPECT_EQ(fast.report.step_time_s, full.report.step_time_s);
  EXPECT_EQ(fast.report.peak_memory_bytes, full.report.peak_memory_bytes);
}

TEST(TensorParallel, TpStaysInsideANodeWhenCpSpansTwo) {
  // 16 GPUs, 8 per node, TP 2 × CP 8: a CP group covers ranks 0, 2, ..., 14 (two nodes), a TP
  // group ranks 0 and 1 (one node).
  ScheduleInputs in = tp2_ulysses4();
  in.parallel.gpus = 16;
  in.parallel.cp_degree = 8;
  const Workload w = build_step(in);
  int tp_ops = 0, a2a_ops = 0;
  for (const Op& op : w.ops) {
    const std::string& name = w.names[static_cast<std::size_t>(op.name)];
    if (op.collective < 0 || op.layer != 0) {
      continue;
    }
    const Collective& c = w.collectives[static_cast<std::size_t>(op.collective)];
    if (name.rfind("tp_", 0) == 0) {
      EXPECT_EQ(c.span, models::Span::kIntraNode) << name;
      ++tp_ops;
    } else if (name.rfind("a2a", 0) == 0) {
      EXPECT_EQ(c.span, models::Span::kInterNode) << name;
      ++a2a_ops;
    }
  }
  EXPECT_GT(tp_ops, 0);
  EXPECT_GT(a2a_ops, 0);
}

TEST(TensorParallel, ShardedModelStates) {
  // One TP rank's parameters: attention (2·4096·4096 + 2·4096·1024)/2 = 20,971,520, MLP
  // 3·4096·14336/2 = 88,080,384, norms 2·4096 = 8,192 (replicated): 109,060,096 per layer;
  // 32 layers = 3,489,923,072; embedding and LM head ⌈128256/2⌉·4096 = 262,668,288 each; final
  // norm 4,096: 4,015,263,744. FSDP2 (recipe alst: 4 + 4 + 8 bytes) over the G/T = 4 ranks of
  // one TP position: ⌈P/4⌉ = 1,003,815,936 parameters, 16,061,054,976 bytes.
  const ModelStates ms = model_states(tp2_ulysses4());
  EXPECT_EQ(ms.gpu_bytes, 16'061'054'976LL);
  const ScheduleInputs rank = tensor_parallel_rank(tp2_ulysses4());
  EXPECT_EQ(models::count_parameters(rank.model).total, 4'015'263'744LL);
}

// Sum of the bytes of saved (activation and attention) tensors written by block 0's forward.
std::int64_t block0_saved_bytes(const Workload& w) {
  std::int64_t sum = 0;
  for (const Tensor& t : w.tensors) {
    if (t.producer < 0 || t.rank != 0) {
      continue;
    }
    const Op& op = w.ops[static_cast<std::size_t>(t.producer)];
    if (op.layer == 0 && op.phase == Phase::kForward &&
        (t.category == MemCategory::kActivations || t.category == MemCategory::kAttention)) {
      sum += t.bytes;
    }
  }
  return sum;
}

TEST(TensorParallel, SequenceParallelHalvesBlockActivations) {
  // Korthikanti et al. 2022 (§4.2.2): with sequence parallelism every activation a block
  // keeps is divided by t. Same s per CP rank: T = 1 on 4 GPUs against T = 2 on 8, no
  // checkpointing, untiled MLP: block 0 writes exactly half the bytes.
  ScheduleInputs one = inputs(CpMethod::kUlysses, "llama3-8b", 4, 64 * kK);
  one.recipe.checkpointing = models::CheckpointMode::kNone;
  one.recipe.checkpoint_offload = false;
  one.recipe.tiled_mlp = false;
  ScheduleInputs two = tp2_ulysses4();
  two.recipe = one.recipe;
  const std::int64_t t1 = block0_saved_bytes(build_step(one));
  const std::int64_t t2 = block0_saved_bytes(build_step(two));
  ASSERT_GT(t1, 0);
  EXPECT_EQ(2 * t2, t1);
}

TEST(TensorParallel, RefusalsNameTheTpDegree) {
  ScheduleInputs in = tp2_ulysses4();
  EXPECT_EQ(issue_of(in), "");
  in.parallel.tp_degree = 3;  // does not divide 8 GPUs per node
  EXPECT_EQ(issue_of(in), "tp_degree");
  in = tp2_ulysses4();
  in.parallel.tp_degree = 16;
  in.parallel.gpus_per_node = 16;
  in.parallel.gpus = 16;
  in.parallel.cp_degree = 1;
  EXPECT_EQ(issue_of(in), "tp_degree");  // 8 KV heads
  in = tp2_ulysses4();
  in.parallel.cp_degree = 8;  // TP 2 × CP 8 > 8 GPUs
  EXPECT_EQ(issue_of(in), "tp_degree");
  in = tp2_ulysses4();
  in.parallel.implementation = "deepspeed-ulysses";
  EXPECT_EQ(issue_of(in), "tp_degree");
  in = tp2_ulysses4();
  in.parallel.seq_len = 64 * kK + 4;  // a multiple of C = 4, not of C·T = 8
  EXPECT_EQ(issue_of(in), "seq_len_multiple");
}

TEST(TensorParallel, ImplementationsThatRunIt) {
  ScheduleInputs in = tp2_ulysses4();
  in.parallel.implementation = "megatron-core-cp";
  EXPECT_EQ(issue_of(in), "");
  in.parallel.method = CpMethod::kRing;
  in.parallel.ring_degree = 4;
  in.parallel.implementation = "torch-native-cp";
  EXPECT_EQ(issue_of(in), "");
}

TEST(MicroBatches, StepIsMPassesAndOneOptimizerStep) {
  // One GPU, ZeRO 0, nothing offloaded: every op runs on the compute stream one after the other,
  // so t(M) = M · t_pass + t_optimizer, and the gradient reduction (local, after the last
  // micro-batch only under ZeRO 0) is part of t_optimizer's side.
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 1, 8 * kK);
  in.recipe.zero_stage = 0;
  in.recipe.checkpoint_offload = false;
  in.recipe.optimizer_offload = false;
  // Without the host issue model: its first issue delay shows once per step, not once per pass.
  in.hardware.host_issue = {};
  const test::Evaluation one = test::evaluate(in);
  in.parallel.micro_batches = 3;
  const test::Evaluation three = test::evaluate(in);
  // t_pass = t(1) − (the optimizer and the gradient reductions, which run once).
  const Workload w1 = build_step([&] {
    ScheduleInputs x = in;
    x.parallel.micro_batches = 1;
    return x;
  }());
  std::int64_t once_ns = 0;
  for (const Op& op : w1.ops) {
    const std::string& name = w1.names[static_cast<std::size_t>(op.name)];
    if (op.phase == Phase::kOptimizer || name.rfind("reduce.", 0) == 0) {
      once_ns += op.duration_ns;
    }
  }
  const double pass_s = one.report.step_time_s - static_cast<double>(once_ns) * 1e-9;
  EXPECT_NEAR(three.report.step_time_s, 3 * pass_s + static_cast<double>(once_ns) * 1e-9, 1e-8);
  EXPECT_EQ(three.report.tokens_per_step, 3 * 8 * kK);
  // One micro-batch's activations are live at a time: the same peak.
  EXPECT_EQ(three.report.peak_memory_bytes, one.report.peak_memory_bytes);
}

}  // namespace
}  // namespace cpsim::sim
