#pragma once
/// @file Hardware profile: one GPU kind, its node and the cluster links, as cost-model
/// coefficients. Every coefficient carries its provenance (a publication, or a calibration run with
/// device and date).

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "cpsim/models/curve.hpp"
#include "cpsim/models/nccl_memory.hpp"

namespace cpsim::models {

inline constexpr int kProfileSchemaVersion = 1;

/// Where each coefficient of a profile comes from, keyed by its JSON path
/// ("gpu.peak_bf16_flops_per_s"). Copies share the entries until one of them is changed: a
/// profile is copied with every configuration a search evaluates, and its ~80 source texts were
/// most of that copy's cost.
class Provenance {
 public:
  using Map = std::map<std::string, std::string>;

  const Map& entries() const {
    static const Map kNone;
    return map_ ? *map_ : kNone;
  }
  Map::const_iterator begin() const { return entries().begin(); }
  Map::const_iterator end() const { return entries().end(); }
  Map::const_iterator find(const std::string& path) const { return entries().find(path); }
  const std::string& at(const std::string& path) const { return entries().at(path); }
  std::size_t count(const std::string& path) const { return entries().count(path); }
  std::size_t size() const { return entries().size(); }
  bool empty() const { return entries().empty(); }

  /// The entries to change: this copy's own (copied first when shared).
  Map& edit() {
    if (!map_) {
      map_ = std::make_shared<Map>();
    } else if (map_.use_count() > 1) {
      map_ = std::make_shared<Map>(*map_);
    }
    return *map_;
  }
  std::string& operator[](const std::string& path) { return edit()[path]; }

  friend bool operator==(const Provenance& a, const Provenance& b) {
    return a.entries() == b.entries();
  }

 private:
  std::shared_ptr<Map> map_;
};

/// Collective operations with their own α/β fits.
enum class Collective { kAllToAll, kAllGather, kReduceScatter, kAllReduce, kSendRecv };
inline constexpr int kCollectiveCount = 5;
const char* to_string(Collective c);

/// Where a collective's traffic goes: NVLink/NVSwitch inside a node, or the NICs between nodes.
enum class Span { kIntraNode, kInterNode };
const char* to_string(Span s);

/// Time model of one collective on one span (nccl-tests convention, REFERENCES.md [nccl-tests]):
///   t(S) = alpha_s + wire_bytes(S) / (peak_busbw · efficiency(S))
/// where S is the nccl-tests "size" (per-rank total buffer) and wire_bytes = S·(n−1)/n
/// (×2 for all-reduce; S for send/recv).
struct CollectiveCurve {
  double alpha_s = 0.0;
  double peak_busbw_bytes_per_s = 0.0;
  LogCurve efficiency_by_size;  ///< fraction of peak busbw vs S in bytes
};

/// A collective's curve, plus curves measured at particular group sizes (NCCL picks its
/// algorithm and protocol by rank count, so a 2-rank all-gather is not an 8-rank one scaled).
/// The main curve is the largest group measured (or the published one); `by_ranks` is optional
/// (JSON `by_ranks`, keyed by the rank count) and empty in profiles without it.
struct CollectiveModel : CollectiveCurve {
  std::map<int, CollectiveCurve> by_ranks;

  /// The curve for a group of `ranks`: the by_ranks entry of the largest group size not above
  /// `ranks`, else (none that small, or none at all) the main curve.
  const CollectiveCurve& curve_for(int ranks) const {
    auto it = by_ranks.upper_bound(ranks);
    if (it == by_ranks.begin()) {
      return *this;
    }
    return (--it)->second;
  }
};

/// Attention kernel throughput (TFLOP/s in the FlashAttention FLOP convention) vs sequence length,
/// measured with many heads (no occupancy loss), plus the tile shape used for the occupancy model.
struct AttentionKernelModel {
  LogCurve fwd_causal_flops_per_s;
  LogCurve fwd_full_flops_per_s;
  LogCurve bwd_causal_flops_per_s;
  LogCurve bwd_full_flops_per_s;
  std::int64_t fwd_block_m = 128;  ///< query rows per forward tile
  std::int64_t bwd_block_n = 128;  ///< key rows per backward tile
  std::int64_t head_dim = 128;     ///< head dim the curves were measured at
};

/// Host link of one GPU (PCIe, pinned memory, copy engines), per direction and duplex.
struct HostLinkModel {
  double alpha_s = 0.0;
  double h2d_bytes_per_s = 0.0;
  double d2h_bytes_per_s = 0.0;
  double duplex_total_bytes_per_s = 0.0;  ///< H2D + D2H together when both are active
};

/// The training process's host thread, which issues every op of its rank in program order
/// (docs/MODEL.md, "Host issue"). All zero (a profile without `node.host_issue`): the host model
/// is off and ops start as soon as the GPU can run them.
struct HostIssueModel {
  double dispatch_s = 0.0;  ///< PyTorch eager dispatch of one framework op (Python to ATen)
  double launch_s = 0.0;    ///< host side of one kernel launch (cudaLaunchKernel)
  double sync_s = 0.0;      ///< a host synchronisation's round trip beyond the work it waits for
  /// Host time to issue one framework op with its kernel.
  double per_call_s() const { return dispatch_s + launch_s; }
  bool enabled() const { return per_call_s() > 0.0 || sync_s > 0.0; }
};

struct HardwareProfile {
  int schema_version = kProfileSchemaVersion;
  std::string name;
  std::string description;
  std::string gpu_name;

  // GPU
  std::int64_t hbm_capacity_bytes = 0;  ///< device memory as reported by the driver
  std::int64_t sm_count = 0;
  double peak_bf16_flops_per_s = 0.0;  ///< dense tensor-core peak
  /// Dense FP8 tensor-core peak; 0 when the profile gives none (no FP8 tensor cores: A100).
  double peak_fp8_flops_per_s = 0.0;
  double hbm_bandwidth_bytes_per_s = 0.0;

  // Compute efficiency
  double gemm_max_efficiency = 1.0;      ///< fraction of peak reached by large GEMMs
  LogCurve gemm_efficiency_by_flops;     ///< optional refinement vs GEMM FLOPs (multiplies the max)
  double memory_bound_efficiency = 1.0;  ///< fraction of HBM bandwidth reached by elementwise ops
  std::map<std::string, AttentionKernelModel> attention_kernels;  ///< by name: fa3, fa2, cudnn, ...
  double kernel_launch_s = 0.0;                                   ///< device-side gap per kernel
  double collective_launch_s = 0.0;                               ///< NCCL kernel launch
  /// Compute slowdown while an SM-driven collective runs on the same GPU: duration × (1 + f).
  double compute_slowdown_under_comm = 0.0;

  // Memory outside the caching allocator's tensors: fixed, and NCCL's per communicator
  std::int64_t cuda_context_bytes = 0;
  std::int64_t cublas_workspace_bytes = 0;
  NcclTopology nccl;  ///< what NCCL's memory per communicator depends on (nccl_memory.hpp)

  // Node and cluster
  int gpus_per_node = 8;
  std::int64_t host_memory_bytes_per_node = 0;
  double cpu_adam_params_per_s = 0.0;  ///< CPU Adam throughput of one node (optimizer offload)
  std::map<Span, std::map<Collective, CollectiveModel>> collectives;
  HostLinkModel host_link;
  HostIssueModel host_issue;

  /// Provenance of each coefficient, keyed by its JSON path ("gpu.peak_bf16_flops_per_s").
  Provenance provenance;

  const CollectiveModel& collective(Span span, Collective c) const;
  const AttentionKernelModel& attention_kernel(const std::string& name) const;
  /// The CUDA context and cuBLAS workspace: per rank whatever the job (NCCL's memory depends on
  /// the communicators a step uses: sim adds it).
  std::int64_t fixed_overhead_bytes() const { return cuda_context_bytes + cublas_workspace_bytes; }
};

}  // namespace cpsim::models
