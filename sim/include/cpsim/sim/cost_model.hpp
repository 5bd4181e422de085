#pragma once
/// @file Durations of compute kernels, collectives and host copies from a hardware profile.

#include <cstdint>
#include <string>

#include "cpsim/models/hardware.hpp"

namespace cpsim::sim {

/// Attention call shape on one rank: `heads` query heads of length `q_len` against `kv_len` keys.
struct AttentionShape {
  std::int64_t q_len = 0;
  std::int64_t kv_len = 0;
  std::int64_t heads = 0;
  std::int64_t head_dim = 0;  ///< a query's and a key's
  bool causal = true;
  std::int64_t v_head_dim = 0;  ///< a value's and the output's; 0: head_dim
  /// The FLOPs of one visible (query, key) pair per head: 2·d for QKᵀ and 2·d_v for PV.
  double pair_flops() const {
    return 2.0 * static_cast<double>(head_dim + (v_head_dim > 0 ? v_head_dim : head_dim));
  }
};

struct KernelCost {
  double time_s = 0.0;
  double flops = 0.0;
  /// Framework ops (each with its kernel) the host issues for it: one per cost function's kernel;
  /// builders set what the implementation runs (Op::host_calls).
  std::int64_t host_calls = 1;
};

struct CollectiveCost {
  std::int64_t size_bytes = 0;  ///< nccl-tests size S
  std::int64_t wire_bytes = 0;  ///< bytes each rank puts on its link
  double alpha_s = 0.0;
  double nominal_bytes_per_s = 0.0;
  double time_s() const { return alpha_s + static_cast<double>(wire_bytes) / nominal_bytes_per_s; }
};

/// Stateless cost functions over one profile (held by reference: the profile must outlive it).
class CostModel {
 public:
  CostModel(const models::HardwareProfile& profile, std::string attention_kernel);

  /// C[m,n] = A[m,k]·B[k,n] in bf16. Roofline with the profile's GEMM efficiency:
  ///   t = launch + max(2mnk / (peak · eff), 2(mk + kn + mn) / (hbm_bw · mem_eff)).
  KernelCost gemm(std::int64_t m, std::int64_t n, std::int64_t k) const;
  /// The same GEMM with FP8 inputs (TransformerEngine, per-tensor scaling) and a bf16 output:
  ///   t = launch + max(2mnk / (peak_fp8 · eff), (mk + kn + 2mn) / (hbm_bw · mem_eff)),
  /// eff the bf16 curve at the same FLOPs (no published FP8 efficiency curve in the profile).
  /// @throws InputError naming gpu.peak_fp8_flops_per_s when the profile has no FP8 peak.
  KernelCost gemm_fp8(std::int64_t m, std::int64_t n, std::int64_t k) const;

  /// An elementwise/normalisation kernel moving `bytes` through HBM: t = launch + bytes / (bw ·
  /// eff).
  KernelCost memory_bound(std::int64_t bytes) const;
  /// The same without the launch: bytes / (bw · eff), for traffic added to an op that is launched
  /// anyway (an implementation's copies and casts, LedgerRow::traffic).
  double memory_traffic_s(std::int64_t bytes) const;

  /// Flash-attention forward. FLOPs (FlashAttention convention): 4·q·k_vis·heads·d (2·q·k_vis·
  /// heads·(d + d_v) when the value heads are d_v wide, AttentionShape::pair_flops), where k_vis =
  /// kv/2 for a causal square call (bottom-right aligned: (max(0, kv−q) + kv)/2 in general) and kv
  /// otherwise. Throughput: the profile curve at S = q_len, scaled by head_dim/128 in FLOPs only,
  /// times an occupancy factor for few-head launches (REFERENCES.md [FA-code]):
  ///   tiles T = heads·⌈q/BlockM⌉, occ(T) = T / (SMs·⌈T/SMs⌉), relative to the occupancy of the
  ///   published set-up (16 heads × 16K tokens per launch), capped at 1.
  KernelCost attention_fwd(const AttentionShape& shape) const;
  /// Flash-attention backward: 2.5× forward FLOPs, backward curve, tiles T = heads·⌈kv/BlockN⌉.
  KernelCost attention_bwd(const AttentionShape& shape) const;

  /// Collective over `ranks` members on `span`. `size_bytes` is the nccl-tests size S: per-rank
  /// send buffer (all-to-all), output (all-gather), input (reduce-scatter), buffer (all-reduce),
  /// message (send/recv). Wire bytes per rank: S·(n−1)/n; ×2 for all-reduce; S for send/recv.
  CollectiveCost collective(models::Collective kind,
                            models::Span span,
                            int ranks,
                            std::int64_t size_bytes) const;

  /// Host copy of `bytes` (pinned, copy engine) at the full one-direction bandwidth.
  double host_copy_s(std::int64_t bytes, bool to_device) const;

  const models::HardwareProfile& profile() const { return profile_; }
  const models::AttentionKernelModel& attention_kernel() const { return attention_; }

 private:
  double occupancy_factor(std::int64_t tiles) const;
  KernelCost attention_call(double flops,
                            const models::LogCurve& curve,
                            std::int64_t curve_len,
                            std::int64_t tiles) const;
  const models::HardwareProfile& profile_;
  const models::AttentionKernelModel& attention_;
};

}  // namespace cpsim::sim
