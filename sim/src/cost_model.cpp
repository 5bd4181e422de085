#include "cpsim/sim/cost_model.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "cpsim/models/error.hpp"

namespace cpsim::sim {
namespace {

std::int64_t ceil_div(std::int64_t a, std::int64_t b) {
  return (a + b - 1) / b;
}

// Occupancy of the published attention set-up: 16 heads × 16K tokens per launch.
constexpr std::int64_t kReferenceTokensTimesHeads = 16 * 16384;

}  // namespace

CostModel::CostModel(const models::HardwareProfile& profile, std::string attention_kernel)
    : profile_(profile), attention_(profile.attention_kernel(attention_kernel)) {}

KernelCost CostModel::gemm(std::int64_t m, std::int64_t n, std::int64_t k) const {
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  double eff = profile_.gemm_max_efficiency;
  if (!profile_.gemm_efficiency_by_flops.empty()) {
    eff *= profile_.gemm_efficiency_by_flops(flops);
  }
  const double bytes = 2.0 * (static_cast<double>(m) * static_cast<double>(k) +
                              static_cast<double>(k) * static_cast<double>(n) +
                              static_cast<double>(m) * static_cast<double>(n));
  const double t_compute = flops / (profile_.peak_bf16_flops_per_s * eff);
  const double t_memory =
      bytes / (profile_.hbm_bandwidth_bytes_per_s * profile_.memory_bound_efficiency);
  return {profile_.kernel_launch_s + std::max(t_compute, t_memory), flops};
}

// FP8 GEMM (TransformerEngine's general_gemm on Float8Tensors): both operands one byte per
// element, the output in the activation dtype (bf16). Peak: the datasheet's dense FP8 tensor-core
// rate (H100/H200 SXM 1,979 TFLOP/s, twice BF16; B200 4,500; REFERENCES.md [H100-datasheet],
// [B200-datasheet]). Efficiency: the profile's bf16 GEMM curve at the same FLOPs; no
// microbenchmark of FP8 GEMM efficiency is in the profile, so the ratio to bf16 is the peak ratio.
KernelCost CostModel::gemm_fp8(std::int64_t m, std::int64_t n, std::int64_t k) const {
  if (profile_.peak_fp8_flops_per_s <= 0.0) {
    throw InputError("gpu.peak_fp8_flops_per_s",
                     fmt::format("profile {} gives no FP8 tensor-core peak: FP8 compute needs one",
                                 profile_.name));
  }
  const double flops =
      2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  double eff = profile_.gemm_max_efficiency;
  if (!profile_.gemm_efficiency_by_flops.empty()) {
    eff *= profile_.gemm_efficiency_by_flops(flops);
  }
  const double bytes = static_cast<double>(m) * static_cast<double>(k) +
                       static_cast<double>(k) * static_cast<double>(n) +
                       2.0 * static_cast<double>(m) * static_cast<double>(n);
  const double t_compute = flops / (profile_.peak_fp8_flops_per_s * eff);
  const double t_memory =
      bytes / (profile_.hbm_bandwidth_bytes_per_s * profile_.memory_bound_efficiency);
  return {profile_.kernel_launch_s + std::max(t_compute, t_memory), flops};
}

KernelCost CostModel::memory_bound(std::int64_t bytes) const {
  return {profile_.kernel_launch_s + memory_traffic_s(bytes), 0.0};
}

double CostModel::memory_traffic_s(std::int64_t bytes) const {
  return static_cast<double>(bytes) /
         (profile_.hbm_bandwidth_bytes_per_s * profile_.memory_bound_efficiency);
}

double CostModel::occupancy_factor(std::int64_t tiles) const {
  const std::int64_t sms = std::max<std::int64_t>(1, profile_.sm_count);
  auto occ = [sms](std::int64_t t) {
    t = std::max<std::int64_t>(1, t);
    return static_cast<double>(t) / static_cast<double>(sms * ceil_div(t, sms));
  };
  const std::int64_t ref_tiles =
      kReferenceTokensTimesHeads / std::max<std::int64_t>(1, attention_.fwd_block_m);
  return std::min(1.0, occ(tiles) / occ(ref_tiles));
}

namespace {
// Visible key count per query row, averaged, for a bottom-right aligned causal mask.
double visible_keys(const AttentionShape& s) {
  if (!s.causal) {
    return static_cast<double>(s.kv_len);
  }
  const double extra = static_cast<double>(std::max<std::int64_t>(0, s.kv_len - s.q_len));
  return (extra + static_cast<double>(s.kv_len)) / 2.0;
}
}  // namespace

KernelCost CostModel::attention_call(double flops,
                                     const models::LogCurve& curve,
                                     std::int64_t curve_len,
                                     std::int64_t tiles) const {
  const double rate = curve(static_cast<double>(curve_len), 0.0);
  return {profile_.kernel_launch_s + flops / (rate * occupancy_factor(tiles)), flops};
}

KernelCost CostModel::attention_fwd(const AttentionShape& s) const {
  const double flops = static_cast<double>(s.q_len) * visible_keys(s) *
                       static_cast<double>(s.heads) * s.pair_flops();
  return attention_call(
      flops, s.causal ? attention_.fwd_causal_flops_per_s : attention_.fwd_full_flops_per_s,
      s.q_len, s.heads * ceil_div(s.q_len, attention_.fwd_block_m));
}

KernelCost CostModel::attention_bwd(const AttentionShape& s) const {
  const double flops = 2.5 * static_cast<double>(s.q_len) * visible_keys(s) *
                       static_cast<double>(s.heads) * s.pair_flops();
  return attention_call(
      flops, s.causal ? attention_.bwd_causal_flops_per_s : attention_.bwd_full_flops_per_s,
      s.kv_len, s.heads * ceil_div(s.kv_len, attention_.bwd_block_n));
}

CollectiveCost CostModel::collective(models::Collective kind,
                                     models::Span span,
                                     int ranks,
                                     std::int64_t size_bytes) const {
  // The curve measured for this group size when the profile has one (nearest not above), else
  // the collective's main curve (models/hardware.hpp, CollectiveModel::curve_for).
  const models::CollectiveCurve& m = profile_.collective(span, kind).curve_for(ranks);
  CollectiveCost c;
  c.size_bytes = size_bytes;
  const std::int64_t n = std::max(1, ranks);
  switch (kind) {
    case models::Collective::kSendRecv:
      c.wire_bytes = size_bytes;
      break;
    case models::Collective::kAllReduce:
      c.wire_bytes = 2 * (size_bytes / n) * (n - 1);
      break;
    default:
      c.wire_bytes = (size_bytes / n) * (n - 1);
      break;
  }
  c.alpha_s = m.alpha_s + profile_.collective_launch_s;
  c.nominal_bytes_per_s =
      m.peak_busbw_bytes_per_s * m.efficiency_by_size(static_cast<double>(size_bytes), 1.0);
  return c;
}

double CostModel::host_copy_s(std::int64_t bytes, bool to_device) const {
  const auto& h = profile_.host_link;
  const double bw = to_device ? h.h2d_bytes_per_s : h.d2h_bytes_per_s;
  return h.alpha_s + static_cast<double>(bytes) / bw;
}

}  // namespace cpsim::sim
