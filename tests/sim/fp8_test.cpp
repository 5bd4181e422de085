// FP8 compute as TransformerEngine runs it (recipe.fp8): hand-computed GEMM times at the FP8 peak,
// the casts around each Linear, the FP8 weight cache and scaling state, and what stays in bf16.
#include <cmath>
#include <string>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"
#include "cpsim/sim/cost_model.hpp"
#include "cpsim/sim/schedule.hpp"

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::inputs;

constexpr std::int64_t kK = 1024;
constexpr double kLaunchS = 1e-6;         // h100 profile kernel_launch_s
constexpr double kGemmEff = 0.803;        // h100 profile gemm_max_efficiency (no curve)
constexpr double kHbmS = 3.35e12 * 0.85;  // h100 HBM bandwidth × memory_bound_efficiency

const models::HardwareProfile& h100() {
  static const models::HardwareProfile p = models::load_hardware("h100-sxm-80g", testing::data());
  return p;
}

TEST(Fp8, LargeGemmRunsAtTwiceTheBf16Peak) {
  const CostModel c(h100(), "fa3");
  // 8192³: 2·8192³ FLOPs at 1,979 TFLOP/s × 0.803 (the bf16 efficiency), compute-bound.
  const double flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
  const KernelCost fp8 = c.gemm_fp8(8192, 8192, 8192);
  const KernelCost bf16 = c.gemm(8192, 8192, 8192);
  EXPECT_DOUBLE_EQ(fp8.flops, flops);
  EXPECT_NEAR(fp8.time_s, kLaunchS + flops / (1979e12 * kGemmEff), 1e-12);
  // The GEMM's time (without its launch) is the bf16 time × 989 / 1979: half, to 0.05 %.
  EXPECT_NEAR((fp8.time_s - kLaunchS) / (bf16.time_s - kLaunchS), 989.0 / 1979.0, 1e-12);
}

TEST(Fp8, SkinnyGemmReadsOneBytePerInputElement) {
  const CostModel c(h100(), "fa3");
  // 1×4096×4096: FP8 inputs 4096 + 4096² bytes, bf16 output 2·4096 bytes.
  const double bytes = 4096.0 + 4096.0 * 4096.0 + 2.0 * 4096.0;
  EXPECT_NEAR(c.gemm_fp8(1, 4096, 4096).time_s, kLaunchS + bytes / kHbmS, 1e-12);
}

TEST(Fp8, ProfileWithoutAnFp8PeakRefuses) {
  const models::HardwareProfile a100 = models::load_hardware("a100-sxm-80g", testing::data());
  const CostModel c(a100, "fa2");
  try {
    (void)c.gemm_fp8(1024, 1024, 1024);
    FAIL() << "no FP8 peak on A100";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "gpu.peak_fp8_flops_per_s");
  }
}

// Llama 3 8B on 8 GPUs as TP 2 × Ulysses 4, 64K tokens: s = 16384 tokens per GEMM, the TP rank's
// share h = 4096, 16 query heads, 4 KV heads, d = 128, f = 7168, 32 layers.
ScheduleInputs tp2_ulysses4(bool fp8) {
  ScheduleInputs in = inputs(CpMethod::kUlysses, "llama3-8b", 8, 64 * kK);
  in.parallel.cp_degree = 4;
  in.parallel.tp_degree = 2;
  in.recipe.tiled_mlp = false;
  in.recipe.zero_stage = 1;
  in.recipe.checkpointing = models::CheckpointMode::kNone;
  in.recipe.checkpoint_offload = false;
  in.recipe.fp8 = fp8;
  return in;
}

TEST(Fp8, WeightCacheAndScalingStateBytes) {
  // Per layer: weights 4096·(16 + 8)·128 + 2048·4096 + 3·7168·4096 = 109,051,904 elements, FP8
  // and its transpose: 2 bytes each; 4 Linears × 5 quantizers × (1024 · 4 + 4) bytes of scaling.
  const std::int64_t per_layer = 2 * 109'051'904LL + 4 * 5 * (1024 * 4 + 4);
  const ModelStates off = model_states(tp2_ulysses4(false));
  const ModelStates on = model_states(tp2_ulysses4(true));
  EXPECT_EQ(on.gpu_bytes - off.gpu_bytes, 32 * per_layer);
  EXPECT_EQ(on.host_bytes, off.host_bytes);
}

// Duration of the first op named `name` in block 0 of `phase`.
SimTime duration_of(const Workload& w, const std::string& name, Phase phase) {
  for (const Op& op : w.ops) {
    if (op.layer == 0 && op.phase == phase && w.names[static_cast<std::size_t>(op.name)] == name) {
      return op.duration_ns;
    }
  }
  ADD_FAILURE() << "no op " << name;
  return -1;
}

double compute_bound_fp8_s(double m, double n, double k) {
  return 2.0 * m * n * k / (1979e12 * kGemmEff);
}

TEST(Fp8, LinearForwardIsAnFp8GemmPlusItsCasts) {
  const Workload w = build_step(tp2_ulysses4(true));
  // gate/up: X [16384, 4096] quantized row- and column-wise (4 bytes per element), W [4096, 14336]
  // with its transpose (4 bytes per element); the GEMM is compute-bound.
  const double m = 16384, n = 2 * 7168, k = 4096;
  const double cast_bytes = 4 * m * k + 4 * k * n;
  const double expect_s = kLaunchS + compute_bound_fp8_s(m, n, k) + cast_bytes / kHbmS;
  EXPECT_NEAR(static_cast<double>(duration_of(w, "mlp_gate_up", Phase::kForward)), expect_s * 1e9,
              1.0);
}

TEST(Fp8, LinearBackwardQuantizesTheOutputGradientOnce) {
  const Workload w = build_step(tp2_ulysses4(true));
  // o_proj backward: dY [16384, 4096] quantized row- and column-wise (4 bytes per element), then
  // dgrad [16384, 4096] × [4096, 2048] and wgrad [2048, 16384] × [16384, 4096], both FP8.
  const double m = 16384, n = 4096, k = 16 * 128;
  const double expect_s = 2 * kLaunchS + 2 * compute_bound_fp8_s(m, n, k) + 4 * m * n / kHbmS;
  EXPECT_NEAR(static_cast<double>(duration_of(w, "o_proj_bwd", Phase::kBackward)), expect_s * 1e9,
              1.0);
}

TEST(Fp8, AttentionCoreNormsAndLossStayBf16) {
  const Workload off = build_step(tp2_ulysses4(false));
  const Workload on = build_step(tp2_ulysses4(true));
  ASSERT_EQ(on.ops.size(), off.ops.size());
  int linear = 0;
  for (std::size_t i = 0; i < on.ops.size(); ++i) {
    const std::string& name = on.names[static_cast<std::size_t>(on.ops[i].name)];
    const bool is_linear = name.rfind("qkv_proj", 0) == 0 || name.rfind("o_proj", 0) == 0 ||
                           name.rfind("mlp_gate_up", 0) == 0 || name.rfind("mlp_down", 0) == 0 ||
                           name == "mlp_bwd" || name == "mlp_wgrad";
    if (is_linear) {
      ++linear;
      EXPECT_LT(on.ops[i].duration_ns, off.ops[i].duration_ns) << name;
    } else {
      EXPECT_EQ(on.ops[i].duration_ns, off.ops[i].duration_ns) << name;
    }
  }
  // Per block: Q/K/V, o_proj, gate/up, down forward and Q/K/V, o_proj, MLP backward (+ gate/up's
  // wgrad of its own under Megatron-style regathering).
  EXPECT_EQ(linear, 32 * 8);
}

TEST(Fp8, LinearsSaveFp8CopiesOfTheirInputs) {
  const Workload off = build_step(tp2_ulysses4(false));
  const Workload on = build_step(tp2_ulysses4(true));
  // bytes and count of kept activations named `name` over the step.
  auto kept = [](const Workload& w, const std::string& name) {
    std::int64_t bytes = -1;
    int count = 0;
    for (const Tensor& t : w.tensors) {
      if (w.names[static_cast<std::size_t>(t.name)] == name) {
        EXPECT_EQ(t.category, MemCategory::kActivations) << name;
        bytes = t.bytes;
        ++count;
      }
    }
    return std::pair{bytes, count};
  };
  // o_proj keeps [16384, 16·128] in FP8 beside the attention's bf16 output, one per layer.
  EXPECT_EQ(kept(on, "o_fp8"), (std::pair<std::int64_t, int>{16384LL * 2048, 32}));
  EXPECT_EQ(kept(off, "o_fp8").second, 0);
  // down keeps its input [16384, 7168] in FP8; the bf16 product lives only until down has run.
  EXPECT_EQ(kept(on, "mlp_act_fp8"), (std::pair<std::int64_t, int>{16384LL * 7168, 32}));
  EXPECT_EQ(kept(off, "mlp_act_fp8").second, 0);
  for (const Workload* w : {&on, &off}) {
    for (const Tensor& t : w->tensors) {
      if (w->names[static_cast<std::size_t>(t.name)] == "mlp_act") {
        EXPECT_EQ(t.consumers, w == &on ? 1 : 2);  // fp8: mlp_down only; bf16: also mlp_bwd
      }
    }
  }
}

}  // namespace
}  // namespace cpsim::sim
