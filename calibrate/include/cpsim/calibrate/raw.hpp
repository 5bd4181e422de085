#pragma once
/// @file Raw calibration measurements (schema "cpsim.calibration/1"): what `cpsim calibrate run`
/// (or calibrate/scripts/torch_attention_timing.py) writes and `cpsim calibrate fit` reads.
/// docs/CALIBRATION.md describes every field. nlohmann/json stays inside raw.cpp.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "cpsim/models/hardware.hpp"

namespace cpsim::calibrate {

inline constexpr const char* kRawSchema = "cpsim.calibration/1";

/// How every timing was taken (written into the file so a reader can judge it).
struct RawMethod {
  std::string timer = "cuda-event";  ///< "cuda-event" (cpsim) or "torch-cuda-event" (script)
  std::string statistic = "median";  ///< kept statistic over the repetitions
  int warmup = 0;                    ///< untimed runs before the repetitions
  int repetitions = 0;              ///< timed repetitions per point (at least; long kernels: fewer)
  std::int64_t rotation_bytes = 0;  ///< size of the rotated buffer pool that defeats L2 (0: none)
};

/// One sweep of `calibrate run` as written (context.sweeps): what --resume reads back.
struct SweepRecord {
  std::string name;                ///< one of kSweepNames (run_control.hpp)
  std::string status;              ///< "done", "failed", "timed_out" or "skipped"
  std::string date;                ///< UTC when it finished ("unknown" when skipped)
  std::vector<std::string> notes;  ///< why it failed or was skipped, what it left out
};

/// The state of one GPU before measuring (context.checks): another process or memory in use
/// falsifies every time; clocks below maximum or a throttle reason slow the kernels.
struct GpuCheck {
  int gpu = 0;
  std::string source;                   ///< "nvml" or "cudaMemGetInfo" (no NVML)
  std::int64_t memory_used_bytes = -1;  ///< -1: unknown
  std::int64_t memory_total_bytes = -1;
  int other_processes = -1;       ///< compute processes other than this one, -1: unknown
  double sm_clock_mhz = 0.0;      ///< current SM clock, 0: unknown
  double sm_clock_max_mhz = 0.0;  ///< maximum SM clock, 0: unknown
  /// Active clock throttle reasons (nvmlDeviceGetCurrentClocksThrottleReasons) by name, e.g.
  /// "hw_thermal_slowdown"; empty when none or unknown (`throttle_known` tells).
  std::vector<std::string> throttle_reasons;
  bool throttle_known = false;
};

/// The layout of a `calibrate run --mpi` (context.mpi): one process per GPU.
struct RawMpi {
  int ranks = 0;                   ///< processes of the job; 0: not an MPI run (key absent)
  int nodes = 0;                   ///< distinct nodes
  int ranks_per_node = 0;          ///< the same on every node
  std::vector<std::string> hosts;  ///< one per node, in node order
};

/// Where and how the measurements were taken. Unknown numbers are 0, unknown strings "unknown".
struct RawContext {
  std::string device;                ///< GPU name, e.g. "NVIDIA H100 80GB HBM3"
  int gpu_count = 0;                 ///< GPUs measured (collectives span all of them)
  int device_count = 0;              ///< GPUs visible on the node
  std::string driver_version;        ///< kernel driver release, e.g. "570.86.15"
  std::string cuda_driver_version;   ///< CUDA version the driver supports, e.g. "12.8"
  std::string cuda_runtime_version;  ///< e.g. "13.0"
  std::string nccl_version;          ///< e.g. "2.28.9"; "none" when not used
  std::string cublaslt_version;      ///< e.g. "13.0.0"; "none" when not used
  std::int64_t sm_count = 0;
  std::int64_t hbm_capacity_bytes = 0;
  std::int64_t l2_cache_bytes = 0;
  double sm_clock_max_mhz = 0.0;       ///< cudaDevAttrClockRate
  double memory_clock_max_mhz = 0.0;   ///< cudaDevAttrMemoryClockRate
  double sm_clock_measured_mhz = 0.0;  ///< clock64() cycles / event time on a busy SM
  std::string date;                    ///< UTC, ISO 8601
  std::string cpsim_version;
  std::vector<std::string> argv;
  bool quick = false;
  RawMethod method;
  std::vector<std::string> notes;  ///< e.g. why the collectives were skipped
  /// Sweeps of `calibrate run` with their state, in run order (absent in imported files and in
  /// files of older versions: written only when not empty).
  std::vector<SweepRecord> sweeps;
  std::vector<GpuCheck> checks;  ///< pre-run checks per GPU (written only when not empty)
  RawMpi mpi;                    ///< written only by `calibrate run --mpi` (mpi.ranks > 0)
};

/// One cuBLASLt GEMM: D[m×n] = X[m×k] · W[n×k]ᵀ, bf16 in and out, fp32 accumulate.
/// Which product of a Linear layer Y[m,n] = X[m,k]·W[k,n] a GEMM sample timed: the forward, the
/// input gradient dX = dY·Wᵀ (dgrad) or the weight gradient dW = Xᵀ·dY (wgrad). m, n and k are the
/// layer's in every layout (each does 2mnk FLOPs); raw files say "fwd", "dgrad", "wgrad" and leave
/// out the forward's.
enum class GemmLayout : std::uint8_t { kForward, kDgrad, kWgrad };
inline const char* to_string(GemmLayout layout) {
  switch (layout) {
    case GemmLayout::kDgrad:
      return "dgrad";
    case GemmLayout::kWgrad:
      return "wgrad";
    case GemmLayout::kForward:
      break;
  }
  return "fwd";
}

struct GemmSample {
  std::int64_t m = 0;
  std::int64_t n = 0;
  std::int64_t k = 0;
  double time_s = 0.0;
  GemmLayout layout = GemmLayout::kForward;
};

enum class AttentionPass { kForward, kBackward };
inline const char* to_string(AttentionPass pass) {
  return pass == AttentionPass::kForward ? "fwd" : "bwd";
}

/// One attention call over `heads` heads of one sequence (batch 1), bf16. A causal mask is
/// aligned bottom-right (query i sees key j iff j <= i + kv_len - q_len).
struct AttentionSample {
  std::string kernel;  ///< "cpsim-flash", "sdpa", "fa2", "fa3", "cudnn", ...
  AttentionPass pass = AttentionPass::kForward;
  bool causal = false;
  std::int64_t head_dim = 0;
  std::int64_t heads = 0;
  std::int64_t q_len = 0;
  std::int64_t kv_len = 0;
  double time_s = 0.0;
};

/// A memory-bound kernel moving `bytes` through HBM (read + written).
struct MemorySample {
  std::string kernel;  ///< "copy"
  std::int64_t bytes = 0;
  double time_s = 0.0;
};

/// One NCCL collective, nccl-tests conventions (REFERENCES.md [nccl-tests]): `size_bytes` is the
/// nccl-tests size (all-gather: output; reduce-scatter: input; all-to-all: per-rank send buffer;
/// all-reduce: buffer; send/recv: bytes sent per rank); algbw = size / t; busbw = algbw × factor.
/// `nodes` and `in_place` are written only when they differ from 1 and false (imported
/// nccl-tests logs), so files of `calibrate run` are unchanged.
struct CollectiveSample {
  models::Collective op = models::Collective::kAllToAll;
  int ranks = 0;
  std::int64_t size_bytes = 0;
  double time_s = 0.0;
  double algbw_bytes_per_s = 0.0;
  double busbw_bytes_per_s = 0.0;
  int nodes = 1;          ///< nodes the ranks span (> 1: measured across the network)
  bool in_place = false;  ///< nccl-tests in-place half (output buffer = input buffer)
};

enum class CopyDirection { kHostToDevice, kDeviceToHost, kDuplex };
inline const char* to_string(CopyDirection direction) {
  switch (direction) {
    case CopyDirection::kHostToDevice:
      return "h2d";
    case CopyDirection::kDeviceToHost:
      return "d2h";
    case CopyDirection::kDuplex:
      return "duplex";
  }
  return "unknown";
}

/// Pinned host memory <-> device copies (copy engines). `bytes` per GPU and per direction; for
/// duplex both directions move `bytes` at once. `gpu` is the device index, -1 when `gpus` devices
/// copied at once (time: until the last one finished).
struct HostCopySample {
  CopyDirection direction = CopyDirection::kHostToDevice;
  int gpu = 0;
  int gpus = 1;
  std::int64_t bytes = 0;
  double time_s = 0.0;
};

/// A compute kernel timed alone and while `background` runs on other streams.
struct InterferenceSample {
  std::string background;  ///< "all_to_all" (NCCL, SM-driven) or "host_copies" (copy engines)
  std::string foreground;  ///< e.g. "attention_fwd cpsim-flash d128 h32 s8192"
  int gpus = 1;
  double time_alone_s = 0.0;
  double time_concurrent_s = 0.0;
};

/// Back-to-back empty kernels: per-launch device time (events around the loop / kernels) and
/// host time of the launch call.
struct LaunchSample {
  std::int64_t kernels = 0;
  double device_time_s = 0.0;
  double host_time_s = 0.0;
};

struct RawSamples {
  std::vector<GemmSample> gemm;
  std::vector<AttentionSample> attention;
  std::vector<MemorySample> memory;
  std::vector<CollectiveSample> collectives;
  std::vector<HostCopySample> host_copies;
  std::vector<InterferenceSample> interference;
  std::vector<LaunchSample> launch;
};

struct RawCalibration {
  RawContext context;
  RawSamples samples;
};

/// nccl-tests bus-bandwidth factor of `op` over `ranks` ranks (REFERENCES.md [nccl-tests]).
inline double busbw_factor(models::Collective op, int ranks) {
  const double n = static_cast<double>(ranks);
  switch (op) {
    case models::Collective::kAllReduce:
      return 2.0 * (n - 1.0) / n;
    case models::Collective::kSendRecv:
      return 1.0;
    case models::Collective::kAllToAll:
    case models::Collective::kAllGather:
    case models::Collective::kReduceScatter:
      return (n - 1.0) / n;
  }
  return 1.0;
}

/// Strict parse: unknown keys, missing keys, wrong types, non-positive sizes or times are refused.
/// @throws InputError whose field is `<origin>:<json path>`, e.g.
/// "raw.json:samples.gemm[3].time_s".
RawCalibration parse_raw(const std::string& json_text, const std::string& origin);

/// Reads and parses a raw file; the origin in errors is the path as given.
/// @throws InputError (field `field` when the file cannot be read).
RawCalibration load_raw(const std::filesystem::path& path, const std::string& field);

/// JSON text (2-space indent, trailing newline) that parse_raw reads back to an equal value.
std::string write_raw(const RawCalibration& raw);

}  // namespace cpsim::calibrate
