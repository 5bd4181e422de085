#pragma once
// Shared pieces of the CUDA measurement backend: RAII wrappers, event timing with warm-up and
// median, buffer rotation against L2, progress, and the sweeps. Private to calibrate/cuda.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cuda_runtime_api.h>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/calibrate/numa.hpp"
#include "cpsim/calibrate/raw.hpp"
#include "cpsim/calibrate/run_control.hpp"

#include "cuda_check.hpp"
#include "kernels.hpp"

namespace cpsim::calibrate::cuda {

// ---------------------------------------------------------------------------------------------
// RAII

/// Makes `device` current for the scope and restores the previous one.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
};

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(int device, std::size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::size_t bytes() const { return bytes_; }
  /// Pointer `offset` bytes into the buffer.
  template <typename T>
  T* at(std::size_t offset = 0) const {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(ptr_) + offset);
  }

 private:
  void release() noexcept;
  void* ptr_ = nullptr;
  std::size_t bytes_ = 0;
  int device_ = 0;
};

/// Page-locked host memory (cudaHostAlloc), for copy-engine transfers. With `cpus` given, the
/// allocation and the first touch of every page run from a thread bound to them (the GPU's own
/// NUMA node: numa.hpp), so that the pages lie in that node.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(std::size_t bytes, const std::vector<int>& cpus = {});
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

/// The NUMA node and CPUs of GPU `device` (cudaDeviceGetPCIBusId, then sysfs); unknown when
/// either says nothing.
NumaPlacement gpu_numa_placement(int device);

class Stream {
 public:
  explicit Stream(int device);
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  int device() const { return device_; }

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

class Event {
 public:
  explicit Event(int device);
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

/// Seconds between two recorded, completed events.
double elapsed_s(const Event& start, const Event& stop);

// ---------------------------------------------------------------------------------------------
// Timing

struct TimingConfig {
  int warmup = 3;              ///< untimed launches first
  int repetitions = 10;        ///< timed repetitions (fewer for long kernels), median kept
  double target_rep_s = 2e-3;  ///< back-to-back launches per repetition until about this long
  int max_inner = 64;
};

/// Median seconds per launch of `launch(iteration)` on `stream`: warm-up, then repetitions of
/// `inner` back-to-back launches between two CUDA events. `iteration` increases by one per
/// launch, for buffer rotation.
double time_launches(const Stream& stream,
                     const TimingConfig& config,
                     const std::function<void(int iteration)>& launch);

double median(std::vector<double> values);

/// Number of buffer sets of `set_bytes` to rotate through so that consecutive launches touch at
/// least `rotation_bytes` of distinct memory (L2 is 50 MB on H100): 1 when one set is already that
/// large; at most what fits in `arena_bytes`.
int rotation_sets(std::size_t set_bytes, std::size_t arena_bytes, std::size_t rotation_bytes);

/// Offsets (256-byte aligned) of consecutive regions of the given sizes, and their total.
struct RegionLayout {
  std::vector<std::size_t> offsets;
  std::size_t total = 0;
};
RegionLayout layout_regions(const std::vector<std::size_t>& sizes);

/// Free device memory of the current device, bytes.
std::size_t free_device_memory(int device);

// Labels for progress and notes (the CUDA module uses no symbol of the models library).
std::string bytes_label(double bytes);               ///< "64.0 MiB"
std::string length_label(std::int64_t tokens);       ///< "8K", "1M", "1000"
const char* collective_name(models::Collective op);  ///< "all_to_all", ...

// ---------------------------------------------------------------------------------------------
// A run

/// Progress steps of the sweep that runs: forwarded to the run's step callback.
class Progress {
 public:
  void set_step(std::function<void(const std::string&, bool)> step) { step_ = std::move(step); }
  /// A step starts: report it.
  void start(const std::string& label) {
    label_ = label;
    if (step_) {
      step_(label_, false);
    }
  }
  /// `n` steps are done (measured or skipped).
  void done(std::size_t n = 1) {
    for (std::size_t i = 0; i < n && step_; ++i) {
      step_(label_, true);
    }
  }

 private:
  std::function<void(const std::string&, bool)> step_;
  std::string label_;
};

struct Session {
  MeasureOptions options;
  int gpus = 1;
  std::vector<int> devices;        ///< device ids measured
  std::size_t rotation_bytes = 0;  ///< max(2 x L2, 100 MiB)
  std::int64_t sm_count = 0;
  TimingConfig timing;
  std::vector<std::string> notes;  ///< of the sweep that runs
  RawSamples samples;              ///< of the sweep that runs
  Progress progress;
  SweepControl control;          ///< of the sweep that runs
  double kernel_launch_s = 0.0;  ///< filled by the launch sweep, for estimates

  explicit Session(const MeasureOptions& o) : options(o) {}
};

// Sweeps: plan_* counts the progress steps, run_* measures and appends samples.
std::size_t plan_launch(const Session& s);
void run_launch(Session& s);
double measure_sm_clock_mhz(int device);
std::size_t plan_memory(const Session& s);
void run_memory(Session& s);
std::size_t plan_gemm(const Session& s);
void run_gemm(Session& s);
std::size_t plan_attention(const Session& s);
void run_attention(Session& s);
std::size_t plan_collectives(const Session& s);
CollectivePlan collective_plan(const Session& s);
/// The NCCL rig of the collective sweep over the session's GPUs.
std::unique_ptr<CollectiveRig> make_nccl_rig(const Session& s);
/// This rank's NCCL side in an MPI run, on the session's one GPU (calibrate run --mpi).
std::unique_ptr<RankRig> make_nccl_rank_rig(const Session& s);
std::size_t plan_host_copies(const Session& s);
void run_host_copies(Session& s);
std::size_t plan_interference(const Session& s);
void run_interference(Session& s);

/// Pre-run state of each measured GPU: NVML (loaded with dlopen, no link-time dependency) when
/// libnvidia-ml.so.1 is there, else cudaMemGetInfo (memory only). Never throws for a missing
/// NVML; the reasons it could not read something are appended to `notes`.
std::vector<GpuCheck> check_gpus(const std::vector<int>& devices, std::vector<std::string>& notes);

/// One attention configuration of the flash kernel.
struct AttentionShape {
  int head_dim = 128;
  int heads = 1;
  int q_len = 1024;
  int kv_len = 1024;
  bool causal = false;
};

/// Flash-attention buffers on one device, rotated against L2: an arena of random bf16 carved into
/// sets of Q, K, V, O, LSE, dO, dQ, dK, dV and the fp32 workspaces for each shape.
class AttentionBench {
 public:
  AttentionBench(int device, std::size_t arena_bytes, std::size_t rotation_bytes);
  /// Bytes of one set of buffers for `shape`.
  static std::size_t set_bytes(const AttentionShape& shape);
  bool fits(const AttentionShape& shape) const { return set_bytes(shape) <= arena_.bytes(); }
  /// Seconds per forward call (median).
  double time_forward(const Stream& stream,
                      const TimingConfig& timing,
                      const AttentionShape& shape);
  /// Seconds per backward call (median); runs the forward on every set first for valid O and LSE.
  double time_backward(const Stream& stream,
                       const TimingConfig& timing,
                       const AttentionShape& shape);
  /// Enqueues one forward call on set `set` (rotation index) without timing.
  void launch_forward(const Stream& stream, const AttentionShape& shape, int set);

 private:
  AttentionArgs args(const AttentionShape& shape, int set) const;
  int sets(const AttentionShape& shape) const;
  DeviceBuffer arena_;
  std::size_t rotation_bytes_;
};

}  // namespace cpsim::calibrate::cuda
