// What the kernels of a set-up keep and what they can address: FlashAttention backward workspace
// with GQA, RMSNorm, RoPE and SwiGLU variants, Qwen3's q/k norms, parameter offload and the 32-bit
// indexing limit, each against a hand-computed case.
#include <algorithm>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"
#include "cpsim/sim/schedule.hpp"

#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::data;
using testing::inputs;

ScheduleInputs alst_deepspeed(const char* model, int gpus, std::int64_t seq) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, model, gpus, seq);
  in.recipe = models::load_recipe("alst-deepspeed", data());
  return in;
}

// The first op of rank 0 in `layer` and `phase` whose name is `name`.
const Op* find_op(const Workload& w, const std::string& name, int layer, Phase phase) {
  for (const Op& o : w.ops) {
    if (o.rank == 0 && o.layer == layer && o.phase == phase &&
        w.names[static_cast<std::size_t>(o.name)] == name) {
      return &o;
    }
  }
  return nullptr;
}

std::int64_t tensor_bytes(const Workload& w, const std::string& name) {
  for (const Tensor& t : w.tensors) {
    if (t.rank == 0 && w.names[static_cast<std::size_t>(t.name)] == name) {
      return t.bytes;
    }
  }
  return -1;
}

// Llama-3-8B on 8 GPUs, N = 64K: n_r = 65536, 4 query heads and 1 K/V head per rank, d = 128.
//   dQ accumulator 65536·4·128·4 = 134,217,728; row sums 65536·4·4 = 1,048,576
//   FA2 expands dK, dV to the query heads: 2·65536·4·128·2 = 134,217,728
//   FA3 keeps fp32 dK, dV accumulators at the K/V heads: 2·65536·1·128·4 = 67,108,864
TEST(FlashBackwardWorkspace, GqaExpansionPerKernel) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 65536);
  in.recipe.attention_kernel = "fa2";
  const Workload fa2 = build_step(in);
  const Op* bwd = find_op(fa2, "attn_bwd", 3, Phase::kBackward);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->workspace_bytes, 134217728 + 1048576 + 134217728);

  in.recipe.attention_kernel = "fa3";
  const Workload fa3 = build_step(in);
  bwd = find_op(fa3, "attn_bwd", 3, Phase::kBackward);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->workspace_bytes, 134217728 + 1048576 + 67108864);

  in.recipe.attention_kernel = "cudnn";
  const Workload cudnn = build_step(in);
  bwd = find_op(cudnn, "attn_bwd", 3, Phase::kBackward);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->workspace_bytes, 134217728 + 1048576);
}

// SDPA gets K/V repeated to the query heads: 65536·2·4·128·2 = 134,217,728 bytes kept.
TEST(FlashBackwardWorkspace, SdpaKeepsRepeatedKv) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 65536);
  in.recipe.attention_kernel = "sdpa";
  const Workload w = build_step(in);
  EXPECT_EQ(tensor_bytes(w, "kv_repeated"), 134217728);
}

// Eager RMSNorm keeps fp32 input and bf16 normalised tensor: s·h·6. s = 8192 on 8 GPUs of 64K,
// h = 4096: 201,326,592 bytes per norm. Fused and upcast norms keep nothing extra.
TEST(NormKernel, EagerKeepsFp32InputForBackward) {
  ScheduleInputs in = alst_deepspeed("llama3-8b", 8, 65536);
  in.recipe.norm_kernel = models::NormKernel::kEager;
  const Workload eager = build_step(in);
  EXPECT_EQ(tensor_bytes(eager, "norm1_saved"), 201326592);
  EXPECT_EQ(tensor_bytes(eager, "norm2_saved"), 201326592);
  EXPECT_EQ(tensor_bytes(eager, "final_norm_saved"), 201326592);
  // The upcast norm holds s·h·8 transiently, the fused one nothing.
  const Op* norm = find_op(eager, "norm2", 0, Phase::kForward);
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->workspace_bytes, 8192 * 4096 * 8);

  in.recipe.norm_kernel = models::NormKernel::kFused;
  const Workload fused = build_step(in);
  EXPECT_EQ(tensor_bytes(fused, "norm1_saved"), -1);
  norm = find_op(fused, "norm2", 0, Phase::kForward);
  ASSERT_NE(norm, nullptr);
  EXPECT_EQ(norm->workspace_bytes, 0);

  // More kept means a higher peak, never a lower one.
  const auto peak = [](const ScheduleInputs& x) {
    return test::evaluate(x).report.peak_memory_bytes;
  };
  ScheduleInputs e = in;
  e.recipe.norm_kernel = models::NormKernel::kEager;
  EXPECT_GT(peak(e), peak(in));
}

// Eager RMSNorm's time: each op of Hugging Face's composite chain is a kernel over the whole
// [s, h] tensor (step_builder.cpp, norm_cost): forward 6 kernels moving 36 bytes per element,
// backward 13 moving 92; a fused norm one kernel moving 4 (forward) and 8 (backward). s = 8192,
// h = 4096: E = 33,554,432 elements; time = kernels × launch + bytes / (HBM bandwidth ×
// memory-bound efficiency). Host calls: 8 forward and 16 backward for the composite, 1 and 2 fused.
TEST(NormKernel, EagerRunsItsCompositeChainKernelByKernel) {
  ScheduleInputs in = alst_deepspeed("llama3-8b", 8, 65536);
  const double elements = 8192.0 * 4096.0;
  const double launch = in.hardware.kernel_launch_s;
  const double rate = in.hardware.hbm_bandwidth_bytes_per_s * in.hardware.memory_bound_efficiency;
  const auto expect_ns = [&](double kernels, double bytes_per_element) {
    return (kernels * launch + bytes_per_element * elements / rate) * 1e9;
  };
  const auto check = [&](const Workload& w, const char* name, Phase phase, double kernels,
                         double bytes_per_element, int host_calls) {
    SCOPED_TRACE(name);
    const Op* op = find_op(w, name, 0, phase);
    ASSERT_NE(op, nullptr);
    EXPECT_NEAR(static_cast<double>(op->duration_ns), expect_ns(kernels, bytes_per_element),
                kernels + 1.0);
    EXPECT_EQ(op->host_calls, host_calls);
  };
  in.recipe.norm_kernel = models::NormKernel::kEager;
  const Workload eager = build_step(in);
  check(eager, "norm2", Phase::kForward, 6, 36, 8);
  check(eager, "norm2_bwd", Phase::kBackward, 13, 92, 16);
  in.recipe.norm_kernel = models::NormKernel::kFused;
  const Workload fused = build_step(in);
  check(fused, "norm2", Phase::kForward, 1, 4, 1);
  check(fused, "norm2_bwd", Phase::kBackward, 1, 8, 2);
}

// Eager SwiGLU's time (step_builder.cpp, swiglu_cost): `silu` and the product are two kernels,
// 10 bytes per element of [s, f] forward; the backward's three kernels move 18. Other MLP kernels:
// one kernel of 6 and 12. s = 8192, f = 14336: E = 117,440,512 elements. The backward op also
// holds the GEMMs, the same for both: their difference is 2 launches + 6 bytes per element.
TEST(MlpKernel, EagerRunsSiluAndTheProductAsKernelsOfTheirOwn) {
  ScheduleInputs in = alst_deepspeed("llama3-8b", 8, 65536);
  in.recipe.tiled_mlp = false;
  const double elements = 8192.0 * 14336.0;
  const double launch = in.hardware.kernel_launch_s;
  const double rate = in.hardware.hbm_bandwidth_bytes_per_s * in.hardware.memory_bound_efficiency;
  const auto ns = [&](double kernels, double bytes_per_element) {
    return (kernels * launch + bytes_per_element * elements / rate) * 1e9;
  };
  in.recipe.mlp_kernel = models::MlpKernel::kEager;
  const Workload eager = build_step(in);
  in.recipe.mlp_kernel = models::MlpKernel::kUnfused;
  const Workload unfused = build_step(in);
  const Op* act_eager = find_op(eager, "mlp_act", 0, Phase::kForward);
  const Op* act_unfused = find_op(unfused, "mlp_act", 0, Phase::kForward);
  const Op* bwd_eager = find_op(eager, "mlp_bwd", 0, Phase::kBackward);
  const Op* bwd_unfused = find_op(unfused, "mlp_bwd", 0, Phase::kBackward);
  ASSERT_TRUE(act_eager && act_unfused && bwd_eager && bwd_unfused);
  EXPECT_NEAR(static_cast<double>(act_eager->duration_ns), ns(2, 10), 3.0);
  EXPECT_NEAR(static_cast<double>(act_unfused->duration_ns), ns(1, 6), 2.0);
  EXPECT_NEAR(static_cast<double>(bwd_eager->duration_ns - bwd_unfused->duration_ns), ns(2, 6),
              10.0);
}

// RoPE's time (step_builder.cpp, rope_cost) on Llama-3-8B's layer 0, Ulysses over 8 GPUs at 64K:
// s = 8192 local tokens, q = s·32·128 = 33,554,432 and k = s·8·128 = 8,388,608 elements (E =
// 41,943,040), and V's copy beside it, 2·s·8·128·2 = 33,554,432 bytes (one kernel of its own
// unless fused). Bytes per element of q and k and kernels per tensor:
//   fused    4, one kernel for everything (the scheme's RoPE op before kernels were told apart)
//   eager    20 in 5 forward; 30 in 9 (autograd) backward
//   complex  20 in 3, forward and backward
// The op also issues one framework call per kernel. FPDT's own backward (DeepSpeed's
// apply_rotary_pos_emb_backward): 20 in 5 per tensor, on each chunk's q and k (lc = 8192 at 128K
// over 8 GPUs, the same element counts), with FPDT's own host-call count (10).
TEST(RopeKernel, EachImplementationRunsItsOwnChain) {
  ScheduleInputs in = alst_deepspeed("llama3-8b", 8, 65536);
  const double elements = 41943040.0;
  const double pass_bytes = 33554432.0;
  const double launch = in.hardware.kernel_launch_s;
  const double rate = in.hardware.hbm_bandwidth_bytes_per_s * in.hardware.memory_bound_efficiency;
  const auto check = [&](const Op* op, double kernels, double bytes_per_element, int host_calls) {
    ASSERT_NE(op, nullptr);
    const double ns = (kernels * launch + (bytes_per_element * elements + pass_bytes) / rate) * 1e9;
    EXPECT_NEAR(static_cast<double>(op->duration_ns), ns, kernels + 1.0);
    EXPECT_EQ(op->host_calls, host_calls);
  };
  struct Expected {
    models::RopeKernel kernel;
    double forward_kernels, forward_bytes, backward_kernels, backward_bytes;
  };
  for (const Expected& x : {Expected{models::RopeKernel::kFused, 1, 4, 1, 4},
                            Expected{models::RopeKernel::kEager, 11, 20, 19, 30},
                            Expected{models::RopeKernel::kComplex, 7, 20, 7, 20}}) {
    SCOPED_TRACE(models::to_string(x.kernel));
    in.recipe.rope_kernel = x.kernel;
    const Workload w = build_step(in);
    const auto calls = [](double kernels) { return static_cast<int>(kernels); };
    check(find_op(w, "rope", 0, Phase::kForward), x.forward_kernels, x.forward_bytes,
          calls(x.forward_kernels));
    check(find_op(w, "rope_bwd", 0, Phase::kBackward), x.backward_kernels, x.backward_bytes,
          calls(x.backward_kernels));
  }
  ScheduleInputs fpdt = inputs(CpMethod::kFpdt, "llama3-8b", 8, 131072);
  fpdt.recipe = models::load_recipe("deepspeed-fpdt", data());
  fpdt.parallel.implementation = "deepspeed-fpdt";
  ASSERT_EQ(fpdt.recipe.rope_kernel, models::RopeKernel::kEager);
  const Workload w = build_step(fpdt);
  check(find_op(w, "rope[c0]", 0, Phase::kForward), 11, 20, 10);
  check(find_op(w, "rope_bwd[k0]", 0, Phase::kBackward), 11, 20, 10);
}

// Untiled SwiGLU backward, s = 8192, f = 14336: the product's gradient is s·f·2 = 234,881,024
// bytes; unfused and eager hold dgate and dup as well (×3); eager keeps silu(gate) (s·f·2).
TEST(MlpKernel, LigerWritesGradientsInPlace) {
  ScheduleInputs in = alst_deepspeed("llama3-8b", 8, 65536);
  in.recipe.tiled_mlp = false;
  in.recipe.mlp_kernel = models::MlpKernel::kFused;
  const Workload fused = build_step(in);
  const Op* bwd = find_op(fused, "mlp_bwd", 2, Phase::kBackward);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->workspace_bytes, 234881024);
  EXPECT_EQ(tensor_bytes(fused, "mlp_silu"), -1);

  in.recipe.mlp_kernel = models::MlpKernel::kEager;
  const Workload eager = build_step(in);
  bwd = find_op(eager, "mlp_bwd", 2, Phase::kBackward);
  ASSERT_NE(bwd, nullptr);
  EXPECT_EQ(bwd->workspace_bytes, 3 * 234881024);
  EXPECT_EQ(tensor_bytes(eager, "mlp_silu"), 234881024);
}

// Qwen3-32B: H = 64, H_kv = 8, d = 128. The q/k norms keep the projection output for backward:
// s·(64 + 8)·128·2 bytes; s = 8192 (64K on 8 GPUs): 150,994,944.
TEST(QkNorm, KeepsProjectionOutput) {
  const ScheduleInputs in = alst_deepspeed("qwen3-32b", 8, 65536);
  const Workload w = build_step(in);
  EXPECT_EQ(tensor_bytes(w, "qk_norm_saved"), 150994944);
  EXPECT_NE(find_op(w, "qk_norm_bwd", 0, Phase::kBackward), nullptr);
}

// ZeRO-3 offload_param moves the bf16 shard to host: Llama-3-8B (8,030,261,248 parameters) on one
// GPU with optimizer offload keeps nothing on the GPU and P·(4 + 8 + 4) + P·2 bytes on host, plus
// DeepSpeed's bf16 gradient-partition buffer (P·2), which lives with the offloaded optimizer.
TEST(ParamOffload, ShardsLiveOnHost) {
  ScheduleInputs in = alst_deepspeed("llama3-8b", 1, 65536);
  in.recipe.param_offload = true;
  const ModelStates s = model_states(in);
  const std::int64_t p = 8030261248;
  EXPECT_EQ(s.gpu_bytes, 0);
  EXPECT_EQ(s.host_bytes, p * 16 + p * 2 + p * 2);
  // Each block's parameters come from host before use (issued while the block before runs).
  const Workload w = build_step(in);
  const Op* copy = find_op(w, "allgather.layer4(from host)", 3, Phase::kForward);
  ASSERT_NE(copy, nullptr);
  EXPECT_EQ(copy->kind, OpKind::kCopyH2D);
  EXPECT_EQ(copy->transfer_bytes, models::count_parameters(in.model).per_layer * 2);

  in.recipe.zero_stage = 2;
  EXPECT_THROW(in.recipe.validate(), InputError);
}

// DeepSpeed ZeRO-3 buffers of recipe alst-deepspeed (DeepSpeed defaults: reduce_bucket_size 5e8,
// contiguous_gradients on; gradients bf16). Llama-3-8B on 8 GPUs, s = 8192:
//   - the reduce bucket, 500,000,000 bf16 elements = 1,000,000,000 bytes on the GPU, is live from
//     the step's start to the optimizer, so the peak (inside the backward) grows by exactly that;
//   - with the optimizer offloaded, the bf16 gradient partitions ⌈P/8⌉·2 = 2,007,565,312 bytes
//     per rank sit in host memory: 8 ranks per node, 16,060,522,496 bytes more per node.
TEST(DeepSpeedZero3, ReduceBucketAndHostGradientPartitions) {
  ScheduleInputs in = alst_deepspeed("llama3-8b", 8, 65536);
  in.recipe.checkpoint_offload = false;
  const Workload w = build_step(in);
  EXPECT_EQ(tensor_bytes(w, "zero3_reduce_bucket"), 1000000000);
  const test::Evaluation with = test::evaluate(in);

  // The bucket alone: without the host gradient partitions, hence without the reduce-stream
  // transients that depend on the bucket too (zero3_reduce_test.cpp).
  ScheduleInputs bucket_only = in;
  bucket_only.recipe.host_grad_partition_buffer = false;
  const test::Evaluation bucket = test::evaluate(bucket_only);
  ScheduleInputs without_bucket = bucket_only;
  without_bucket.recipe.reduce_bucket_elements = 0;
  const test::Evaluation plain = test::evaluate(without_bucket);
  ASSERT_EQ(plain.report.peak_op, bucket.report.peak_op);
  EXPECT_EQ(bucket.report.peak_memory_bytes - plain.report.peak_memory_bytes, 1000000000);
  EXPECT_EQ(tensor_bytes(build_step(without_bucket), "zero3_reduce_bucket"), -1);  // none

  ScheduleInputs gpu_grads = in;
  gpu_grads.recipe.host_grad_partition_buffer = false;
  EXPECT_EQ(with.report.host_memory_bytes - test::evaluate(gpu_grads).report.host_memory_bytes,
            8 * 2007565312LL);
  // Only with the optimizer offloaded (on the GPU the buffer is the model states' g term).
  in.recipe.optimizer_offload = false;
  gpu_grads.recipe.optimizer_offload = false;
  EXPECT_EQ(model_states(in).host_bytes, model_states(gpu_grads).host_bytes);
}

// Reentrant checkpointing holds the recomputed block output and the incoming gradient until the
// block's backward ends: both are inputs of the block's last backward op (norm1_bwd). On one GPU
// with s = 65,536 and h = 4096 each is s·h·2 = 536,870,912 bytes; with the peak inside the same
// backward op, the peak grows by exactly their sum, 1,073,741,824 bytes.
TEST(ReentrantCheckpoint, HoldsBlockOutputAndGradient) {
  ScheduleInputs in = alst_deepspeed("llama3-8b", 1, 65536);
  in.recipe.int32_kernel_indexing = false;
  const auto held_names = [](const Workload& w, int layer) {
    const Op* last = find_op(w, "norm1_bwd", layer, Phase::kBackward);
    std::vector<std::string> names;
    if (last != nullptr) {
      for (std::int32_t i = last->inputs_begin; i < last->inputs_end; ++i) {
        const Tensor& t = w.tensors[static_cast<std::size_t>(w.edges[static_cast<std::size_t>(i)])];
        names.push_back(w.names[static_cast<std::size_t>(t.name)]);
      }
    }
    return names;
  };
  in.recipe.checkpoint_reentrant = false;
  const test::Evaluation plain = test::evaluate(in);
  const auto plain_in = held_names(build_step(in), 5);
  EXPECT_EQ(std::count(plain_in.begin(), plain_in.end(), "block_out"), 0);

  in.recipe.checkpoint_reentrant = true;
  const test::Evaluation reentrant = test::evaluate(in);
  const auto reentrant_in = held_names(build_step(in), 5);
  EXPECT_EQ(std::count(reentrant_in.begin(), reentrant_in.end(), "block_out"), 1);
  EXPECT_EQ(reentrant_in.size(), plain_in.size() + 2);

  ASSERT_EQ(plain.report.peak_op, reentrant.report.peak_op);
  EXPECT_EQ(reentrant.report.peak_memory_bytes - plain.report.peak_memory_bytes, 2 * 536870912LL);
}

// 32-bit offsets: Llama-3-8B's norm input [s, 4096] reaches 2^31 elements at s = 524,288.
TEST(Int32Indexing, NormInputAtTwoToThe31) {
  ScheduleInputs in = alst_deepspeed("llama3-8b", 1, 524287);
  EXPECT_EQ(int32_index_violation(in, derive_head_layout(in)), "");
  in.parallel.seq_len = 524288;
  const std::string v = int32_index_violation(in, derive_head_layout(in));
  EXPECT_NE(v.find("RMSNorm input [524288 × 4096]"), std::string::npos) << v;
  EXPECT_NE(v.find("2147483648"), std::string::npos) << v;
  const sim::StepReport r = test::evaluate(in).report;
  EXPECT_FALSE(r.fits_kernels);
  EXPECT_FALSE(r.fits());
  EXPECT_EQ(r.binding, v);
  in.recipe.int32_kernel_indexing = false;
  EXPECT_EQ(int32_index_violation(in, derive_head_layout(in)), "");
}

// Qwen3-32B's query is wider than its hidden size (64·128 = 8192 > 5120): RoPE's query tensor
// binds first, at 262,144 tokens per GPU (8 GPUs: N = 2,097,152).
TEST(Int32Indexing, WideQueryBindsFirst) {
  ScheduleInputs in = alst_deepspeed("qwen3-32b", 8, 2097152 - 8);
  EXPECT_EQ(int32_index_violation(in, derive_head_layout(in)), "");
  in.parallel.seq_len = 2097152;
  const std::string v = int32_index_violation(in, derive_head_layout(in));
  EXPECT_NE(v.find("RoPE query [262144 × 8192]"), std::string::npos) << v;
}

}  // namespace
}  // namespace cpsim::sim
