// Ulysses and UPipe schedules: buffer sizes, model states, communication volumes, recomputation,
// and the degenerate case U = H, all against hand-computed values.
#include "cpsim/sim/schedule.hpp"

#include <algorithm>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"

#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kM = 1 << 20;

// Llama-3-8B: h = 4096, H = 32, H_kv = 8, d = 128. N = 1M on C = 8: s = 131072.
TEST(AttentionBuffers, UlyssesLlama8B) {
  const ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, kM);
  const HeadLayout L = derive_head_layout(in);
  EXPECT_EQ(L.stages, 1);
  EXPECT_EQ(L.kv_heads_eff, 8);
  const AttentionBuffers a = attention_buffers(in, L);
  const std::int64_t s = 131072;
  EXPECT_EQ(a.qkv_local_bytes, s * (32 + 2 * 8) * 128 * 2);          // 1.5 GiB
  EXPECT_EQ(a.qkv_headsharded_bytes, kM * (32 + 16) / 8 * 128 * 2);  // same bytes
  EXPECT_EQ(a.qkv_local_bytes, a.qkv_headsharded_bytes);
  EXPECT_EQ(a.out_headsharded_bytes, kM * 4 * 128 * 2);  // 1 GiB
  EXPECT_EQ(a.out_local_bytes, s * 32 * 128 * 2);
  EXPECT_EQ(a.lse_bytes, 4 * kM * 4);
  EXPECT_EQ(a.final_out_bytes, 0);
}

TEST(AttentionBuffers, UPipeLlama8BDefaultStage) {
  // U = C = 8: 4 stages of 1 query head per rank; all 8 KV heads fetched once, reused by 4 stages.
  const ScheduleInputs in = inputs(CpMethod::kUPipe, "llama3-8b", 8, kM);
  const HeadLayout L = derive_head_layout(in);
  EXPECT_EQ(L.heads_per_stage, 8);
  EXPECT_EQ(L.stages, 4);
  EXPECT_EQ(L.kv_heads_per_fetch, 8);
  EXPECT_EQ(L.stages_per_kv_fetch, 4);
  const AttentionBuffers a = attention_buffers(in, L);
  const std::int64_t s = 131072;
  EXPECT_EQ(a.qkv_local_bytes, s * (8 + 16) * 128 * 2);
  EXPECT_EQ(a.qkv_headsharded_bytes, kM * 3 * 128 * 2);  // 1 Q + 1 K + 1 V head per rank
  EXPECT_EQ(a.out_headsharded_bytes, kM * 1 * 128 * 2);
  EXPECT_EQ(a.lse_bytes, kM * 4);
  EXPECT_EQ(a.final_out_bytes, s * 32 * 128 * 2);
}

TEST(HeadLayout, Qwen32BStages) {
  // H = 64, H_kv = 8, C = 8, U = 8: 8 stages; KV groups of g = 8 stages.
  const HeadLayout L = derive_head_layout(inputs(CpMethod::kUPipe, "qwen3-32b", 8, kM));
  EXPECT_EQ(L.stages, 8);
  EXPECT_EQ(L.stages_per_kv_fetch, 8);
  // Head-proportional buffers shrink by 1 − U/H = 87.5 % (REFERENCES.md [UPipe]).
  EXPECT_DOUBLE_EQ(1.0 - static_cast<double>(L.heads_per_stage) / static_cast<double>(L.heads),
                   0.875);
}

TEST(HeadLayout, KvHeadsReplicatedWhenFewerThanC) {
  // 16 GPUs, H_kv = 8: each KV head is replicated twice.
  const HeadLayout L = derive_head_layout(inputs(CpMethod::kUlysses, "llama3-8b", 16, kM));
  EXPECT_EQ(L.kv_heads_eff, 16);
  EXPECT_EQ(L.kv_replication, 2);
}

TEST(HeadLayout, RejectsBadCombinations) {
  // The quantity at fault, from the result value and from the exception alike.
  auto quantity_of = [](const ScheduleInputs& in) {
    const LayoutCheck checked = check_head_layout(in);
    std::string thrown = "none";
    try {
      derive_head_layout(in);
    } catch (const ConfigError& e) {
      thrown = to_string(e.quantity());
      EXPECT_EQ(e.what(), checked.issue->message);
    }
    EXPECT_EQ(thrown, checked.issue ? to_string(checked.issue->quantity) : "none");
    return thrown;
  };
  EXPECT_EQ(quantity_of(inputs(CpMethod::kUlysses, "llama3-8b", 12, 12 * kM)),
            "model_heads");  // 32 % 12, checked first
  EXPECT_EQ(quantity_of(inputs(CpMethod::kUPipe, "llama3-8b", 8, kM, 12)), "heads_per_stage");
  EXPECT_EQ(quantity_of(inputs(CpMethod::kUPipe, "llama3-8b", 8, kM, 24)), "heads_per_stage");
  EXPECT_EQ(quantity_of(inputs(CpMethod::kUlysses, "llama3-8b", 8, kM, 8)), "heads_per_stage");
  EXPECT_EQ(quantity_of(inputs(CpMethod::kUlysses, "llama3-8b", 8, kM + 1)), "seq_len_multiple");
  EXPECT_EQ(quantity_of(inputs(CpMethod::kUlysses, "llama3-8b", 8, -8)), "seq_len");
  EXPECT_EQ(quantity_of(inputs(CpMethod::kUlysses, "llama3-8b", 0, kM)), "gpus");
  // 1G tokens of Llama-3.1-405B on one node: months per step before recomputation. Refused.
  EXPECT_EQ(quantity_of(inputs(CpMethod::kUlysses, "llama3.1-405b", 8, 1024 * kM)), "seq_len");
  ScheduleInputs ring = inputs(CpMethod::kRing, "llama3-8b", 8, kM);
  ring.parallel.ring_degree = 4;
  EXPECT_EQ(quantity_of(ring), "ring_degree");
  ScheduleInputs ulysses = inputs(CpMethod::kUlysses, "llama3-8b", 8, kM);
  ulysses.parallel.ring_degree = 2;
  EXPECT_EQ(quantity_of(ulysses), "ring_degree");
  ulysses.parallel.ring_degree = 1;
  ulysses.parallel.cp_degree = 3;
  EXPECT_EQ(quantity_of(ulysses), "cp_degree");
  EXPECT_EQ(quantity_of(inputs(CpMethod::kUlysses, "llama3-8b", 8, kM)), "none");
}

// FSDP full shard: 16 bytes per parameter sharded over all GPUs (fp32 master 4, fp32 grad 4,
// AdamW exp_avg + exp_avg_sq 8), plus the fixed overheads of the profile and NCCL's
// (nccl_communicators_test.cpp).
TEST(ModelStates, SixteenBytesPerParamSharded) {
  const ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, kM);
  const Workload w = build_step(in);
  const std::int64_t params = 8030261248;
  EXPECT_EQ(w.static_memory[0].model_states_bytes, params / 8 * 16);
  EXPECT_EQ(w.static_memory[0].fixed_overhead_bytes,
            in.hardware.fixed_overhead_bytes() + w.static_memory[0].nccl_bytes);
}

// ZeRO stages (ZeRO paper §5), P = 8,030,261,248, G = 8, bytes p = 2, m = 4, g = 4, o = 8.
TEST(ModelStates, ZeroStagesAndOptimizerOffload) {
  const std::int64_t params = 8030261248, shard = params / 8;
  auto states = [](int zero, bool offload) {
    ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * 1024);
    in.recipe.zero_stage = zero;
    in.recipe.optimizer_offload = offload;
    return build_step(in).static_memory[0].model_states_bytes;
  };
  EXPECT_EQ(states(0, false), params * (2 + 4 + 4 + 8));
  EXPECT_EQ(states(1, false), params * (2 + 4) + shard * (4 + 8));
  EXPECT_EQ(states(2, false), params * 2 + shard * (4 + 4 + 8));
  EXPECT_EQ(states(3, false), shard * (4 + 4 + 8));
  EXPECT_EQ(states(3, true), 0);  // master, Adam states and gradient partitions on the host
  EXPECT_EQ(states(1, true), params * (2 + 4));
  // DeepSpeed keeps a bf16 parameter shard besides the fp32 master: 2 + 2 + 12 = 16 bytes/param.
  ScheduleInputs ds = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * 1024);
  ds.recipe = models::load_recipe("deepspeed-fpdt", testing::data());
  EXPECT_EQ(build_step(ds).static_memory[0].model_states_bytes, shard * (2 + 2 + 4 + 8));
  // Offloaded optimizer states are host memory: m + o + an fp32 gradient copy per parameter.
  ScheduleInputs off = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * 1024);
  off.recipe.optimizer_offload = true;
  off.recipe.checkpoint_offload = false;
  EXPECT_EQ(test::evaluate(off).report.host_memory_bytes, 8 * shard * (4 + 8 + 4));
}

// Gradients are reduced once they exist: each reduce starts after the last forward op has ended
// and after the backward op that finishes its gradients (under ZeRO 0/1 the persistent gradients
// are no tensor of the graph, so the dependency must be explicit), and its workspace is a gradient
// buffer, not a parameter gather.
TEST(GradientReduce, WaitsForTheBackwardThatWritesTheGradients) {
  for (const int zero : {0, 1, 2, 3}) {
    ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 32 * 1024);
    in.recipe.zero_stage = zero;
    in.recipe.grad_reduce_bytes = 4;
    in.recipe.checkpointing = models::CheckpointMode::kFull;
    in.recipe.checkpoint_offload = false;
    in.recipe.fused_loss = true;
    test::EvaluateOptions opts;
    opts.keep_trace = true;
    const test::Evaluation e = test::evaluate(in, opts);
    const Workload& w = *e.workload;
    std::map<std::string, SimTime> end_of;
    std::map<std::int32_t, SimTime> backward_end_of_layer;  // compute stream
    SimTime last_forward_end = 0;
    for (const OpInterval& iv : e.result->intervals) {
      const Op& op = w.ops[static_cast<std::size_t>(iv.op)];
      if (op.rank != 0) {
        continue;
      }
      end_of[w.names[static_cast<std::size_t>(op.name)]] = iv.end_ns;
      if (op.phase == Phase::kForward && op.layer >= 0) {  // the blocks' forward
        last_forward_end = std::max(last_forward_end, iv.end_ns);
      }
      if (op.phase == Phase::kBackward && op.stream == Stream::kCompute) {
        SimTime& end = backward_end_of_layer[op.layer];
        end = std::max(end, iv.end_ns);
      }
    }
    int reduces = 0;
    for (const OpInterval& iv : e.result->intervals) {
      const Op& op = w.ops[static_cast<std::size_t>(iv.op)];
      const std::string& name = w.names[static_cast<std::size_t>(op.name)];
      if (op.rank != 0 || name.rfind("reduce.", 0) != 0) {
        continue;
      }
      ++reduces;
      if (name != "reduce.head") {  // the fused loss writes the head's gradients in the forward
        EXPECT_GE(iv.start_ns, last_forward_end) << "ZeRO-" << zero << " " << name;
      } else {
        EXPECT_GE(iv.start_ns, end_of.at("fused_linear_ce")) << "ZeRO-" << zero;
      }
      EXPECT_EQ(op.workspace_category, MemCategory::kGradBuffers) << name;
      if (name == "reduce.embedding") {
        EXPECT_GE(iv.start_ns, end_of.at("embedding_bwd")) << "ZeRO-" << zero;
      } else if (op.layer >= 0) {
        EXPECT_GE(iv.start_ns, backward_end_of_layer.at(op.layer)) << "ZeRO-" << zero << name;
      }
    }
    EXPECT_EQ(reduces, 32 + 2) << "ZeRO-" << zero;  // every block, the head and the embedding
  }
}

TEST(ModelStates, GatheredLayerIsBf16OfOneBlock) {
  const ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, kM);
  const Workload w = build_step(in);
  const std::int64_t per_layer = models::count_parameters(in.model).per_layer;  // 218,112,000
  EXPECT_EQ(per_layer, 218112000);
  int found = 0;
  for (const Tensor& t : w.tensors) {
    if (w.names[static_cast<std::size_t>(t.name)] == "layer5.params" && t.rank == 0) {
      EXPECT_EQ(t.bytes, per_layer * 2);
      EXPECT_EQ(t.category, MemCategory::kParamGather);
      ++found;
    }
  }
  EXPECT_EQ(found, 2);  // gathered once for forward, once for recompute + backward
}

struct CommVolume {
  std::int64_t a2a_send_bytes = 0;  // per-rank send buffers of all-to-alls
  int a2a_calls = 0;
  int attn_fwd = 0;
  int attn_bwd = 0;
  int qkv_projections = 0;  // GEMMs that project Q, K or V (forward or recomputed)
};

CommVolume count(const Workload& w, int layer, Phase phase) {
  CommVolume v;
  for (const Op& o : w.ops) {
    if (o.rank != 0 || o.layer != layer || o.phase != phase)
      continue;
    const std::string& n = w.names[static_cast<std::size_t>(o.name)];
    if (o.collective != kNone && w.collectives[static_cast<std::size_t>(o.collective)].kind ==
                                     models::Collective::kAllToAll) {
      v.a2a_send_bytes += w.collectives[static_cast<std::size_t>(o.collective)].size_bytes;
      v.a2a_calls += 1;
    }
    if (o.kind == OpKind::kAttentionFwd)
      v.attn_fwd += 1;
    if (o.kind == OpKind::kAttentionBwd)
      v.attn_bwd += 1;
    if (o.kind == OpKind::kGemm &&
        (n.rfind("qkv_proj", 0) == 0 || n.rfind("q_proj", 0) == 0 || n.rfind("kv_proj", 0) == 0) &&
        n.find("_bwd") == std::string::npos) {
      v.qkv_projections += 1;
    }
  }
  return v;
}

// All-to-all volume per layer (REFERENCES.md [Ulysses], GQA form): the forward sends the local
// QKV, s·(H + 2H_kv)·d·2 bytes, and the output, s·H·d·2 bytes, per rank; (C−1)/C of it leaves.
TEST(CommVolume, UlyssesForwardLayer) {
  const ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, kM);
  const Workload w = build_step(in);
  const std::int64_t s = kM / 8;
  const CommVolume f = count(w, 3, Phase::kForward);
  EXPECT_EQ(f.a2a_calls, 3);  // Q, K/V, output
  EXPECT_EQ(f.a2a_send_bytes, s * 48 * 128 * 2 + s * 32 * 128 * 2);
  EXPECT_EQ(f.a2a_send_bytes,
            attention_buffers(in, derive_head_layout(in)).a2a_send_bytes_per_layer_fwd);
  // Wire bytes of the QKV all-to-all: (C − 1)/C of the send buffer.
  for (const Op& o : w.ops) {
    if (o.rank == 0 && o.layer == 3 && o.phase == Phase::kForward && o.collective != kNone &&
        w.names[static_cast<std::size_t>(o.name)] == "a2a_kv") {
      EXPECT_EQ(w.collectives[static_cast<std::size_t>(o.collective)].wire_bytes,
                s * 16 * 128 * 2 / 8 * 7);
    }
  }
  // Backward: dOut and dQKV all-to-alls, the same volume again.
  const CommVolume b = count(w, 3, Phase::kBackward);
  EXPECT_EQ(b.a2a_send_bytes, f.a2a_send_bytes);
  // Full AC: the recompute sends the forward volume once more, and runs attention forward again.
  const CommVolume r = count(w, 3, Phase::kRecompute);
  EXPECT_EQ(r.a2a_send_bytes, f.a2a_send_bytes);
  EXPECT_EQ(f.attn_fwd, 1);
  EXPECT_EQ(r.attn_fwd, 1);
  EXPECT_EQ(b.attn_bwd, 1);
}

TEST(CommVolume, UPipeSplitsTheSameVolumeOverStages) {
  const ScheduleInputs in = inputs(CpMethod::kUPipe, "llama3-8b", 8, kM);
  const Workload w = build_step(in);
  const std::int64_t s = kM / 8;
  const CommVolume f = count(w, 3, Phase::kForward);
  // One K/V all-to-all (8 KV heads), 4 Q and 4 output all-to-alls of 8 heads each.
  EXPECT_EQ(f.a2a_calls, 1 + 4 + 4);
  EXPECT_EQ(f.a2a_send_bytes, s * 48 * 128 * 2 + s * 32 * 128 * 2);
  EXPECT_EQ(f.attn_fwd, 4);
  // Backward re-sends Q and K/V (recomputed), the stage's output and dOut, and returns dQ, dK/dV.
  const CommVolume b = count(w, 3, Phase::kBackward);
  EXPECT_EQ(b.a2a_send_bytes, s * 48 * 128 * 2 /*QKV again*/ + 2 * s * 32 * 128 * 2 /*out, dOut*/ +
                                  s * 48 * 128 * 2 /*dQ, dK, dV*/);
  EXPECT_EQ(b.attn_bwd, 4);
  EXPECT_EQ(b.attn_fwd, 0);  // the saved LSE and final_out make attention forward unnecessary
  // Under full AC the Q/K/V projections run three times per step: forward, recompute, backward.
  const CommVolume r = count(w, 3, Phase::kRecompute);
  EXPECT_EQ(f.qkv_projections, 5);
  EXPECT_EQ(r.qkv_projections, 5);
  EXPECT_EQ(b.qkv_projections, 5);
}

TEST(Recompute, NoCheckpointingRunsNoRecomputePhase) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 256 * 1024);
  in.recipe.checkpointing = models::CheckpointMode::kNone;
  in.recipe.checkpoint_offload = false;
  const Workload w = build_step(in);
  for (const Op& o : w.ops) {
    EXPECT_NE(o.phase, Phase::kRecompute);
  }
  // Selective: the attention core runs again in backward.
  in.recipe.checkpointing = models::CheckpointMode::kSelective;
  const Workload ws = build_step(in);
  EXPECT_EQ(count(ws, 3, Phase::kBackward).attn_fwd, 1);
}

TEST(Offload, CheckpointsOfInnerLayersGoToHost) {
  const ScheduleInputs in = inputs(CpMethod::kUPipe, "llama3-8b", 8, kM);
  const test::Evaluation e = test::evaluate(in);
  // 30 of 32 block inputs offloaded (first and last stay), s·h·2 bytes each, 8 ranks per node.
  const std::int64_t per_rank = 30LL * (kM / 8) * 4096 * 2;
  EXPECT_EQ(e.report.host_memory_bytes, 8 * per_rank);
  ScheduleInputs no = in;
  no.recipe.checkpoint_offload = false;
  const test::Evaluation e2 = test::evaluate(no);
  EXPECT_EQ(e2.report.host_memory_bytes, 0);
  EXPECT_GT(e2.report.peak_memory_bytes, e.report.peak_memory_bytes + 25LL * (kM / 8) * 4096 * 2);
}

// UPipe keeps fewer attention bytes than Ulysses; with U = H it degenerates to one stage holding
// every head, and its attention intermediates equal Ulysses' exactly.
TEST(UPipeVsUlysses, AttentionMemory) {
  const std::int64_t n = 3 * kM;
  const auto uly = test::evaluate(inputs(CpMethod::kUlysses, "llama3-8b", 8, n)).report;
  const auto up = test::evaluate(inputs(CpMethod::kUPipe, "llama3-8b", 8, n)).report;
  const auto up_h = test::evaluate(inputs(CpMethod::kUPipe, "llama3-8b", 8, n, 32)).report;
  const auto att = static_cast<std::size_t>(MemCategory::kAttention);
  EXPECT_LT(up.category_peak[att], uly.category_peak[att]);
  EXPECT_EQ(up_h.category_peak[att], uly.category_peak[att]);
  EXPECT_LT(up.peak_memory_bytes, uly.peak_memory_bytes);
}

TEST(Degenerate, OneGpuHasNoCollectivesButFsdp) {
  const ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 1, 64 * 1024);
  const Workload w = build_step(in);
  for (const Op& o : w.ops) {
    if (o.collective != kNone) {
      EXPECT_NE(w.collectives[static_cast<std::size_t>(o.collective)].kind,
                models::Collective::kAllToAll);
    }
  }
  EXPECT_GT(test::evaluate(in).report.step_time_s, 0.0);
}

TEST(Throughput, ComputeBoundStepMatchesKernelSum) {
  // With nothing overlapping but communication, the step is at least the compute-stream busy time.
  const auto rep = test::evaluate(inputs(CpMethod::kUPipe, "llama3-8b", 8, kM)).report;
  EXPECT_GE(rep.step_time_s, rep.stream_busy_s[0]);
  EXPECT_NEAR(rep.tokens_per_s_per_gpu, static_cast<double>(kM) / rep.step_time_s / 8.0, 1e-9);
}

}  // namespace
}  // namespace cpsim::sim
