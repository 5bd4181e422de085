// The CUDA measurement backend: device discovery, the run context (versions, clocks), and the
// sweeps in order. It is the shared module libcpsim_calibrate_cuda.so, which
// calibrate/src/measure_loader.cpp loads only when `cpsim calibrate run` needs it (cuBLASLt alone
// costs ~0.3 s and ~200 MB at load time). CUDA runtime, cuBLASLt and NCCL only; never the driver
// API (libcuda), so the module loads without a GPU driver and reports "no CUDA device" instead.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <fstream>
#include <memory>
#include <nccl.h>
#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/calibrate/mpi_run.hpp"
#include "cpsim/calibrate/utc_time.hpp"
#include "cpsim/models/error.hpp"

#include "kernels.hpp"
#include "measure_internal.hpp"

namespace cpsim::calibrate {
namespace {

using cuda::DeviceGuard;
using cuda::Session;

/// "580.159.04" from /proc/driver/nvidia/version, "unknown" when absent.
std::string driver_release() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  return std::getline(in, line) ? driver_release_from_version_line(line) : "unknown";
}

/// 12080 -> "12.8" (CUDA's major * 1000 + minor * 10).
std::string cuda_version(int code) {
  return fmt::format("{}.{}", code / 1000, (code % 1000) / 10);
}

class CudaBackend final : public MeasureBackend {
 public:
  std::string name() const override { return "cuda"; }

  std::optional<std::string> unavailable_reason() const override {
    int count = 0;
    const cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // reset the last-error state
      return fmt::format("no CUDA device: cudaGetDeviceCount failed with {} ({})",
                         cudaGetErrorName(e), cudaGetErrorString(e));
    }
    if (count == 0) {
      return std::string("no CUDA device: cudaGetDeviceCount found 0 devices");
    }
    return std::nullopt;
  }

  RawContext open(const MeasureOptions& options) override {
    if (const auto reason = unavailable_reason()) {
      throw InputError("calibrate", *reason);
    }
    int count = 0;
    CPSIM_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (options.gpus > count) {
      throw InputError("--gpus", fmt::format("{} GPUs requested, {} visible", options.gpus, count));
    }
    session_ = std::make_unique<Session>(options);
    Session& s = *session_;
    s.gpus = options.gpus > 0 ? options.gpus : count;
    for (int d = 0; d < s.gpus; ++d) {
      s.devices.push_back(d);
    }
    if (options.quick) {
      s.timing = cuda::TimingConfig{2, 5, 1e-3, 32};
    }
    // Before any allocation of ours: who else uses the GPUs, clocks, throttling.
    RawContext c;
    c.checks = cuda::check_gpus(s.devices, c.notes);
    cudaDeviceProp prop{};
    CPSIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, s.devices.front()));
    c.device = prop.name;
    for (int d = 1; d < s.gpus; ++d) {
      cudaDeviceProp other{};
      CPSIM_CUDA_CHECK(cudaGetDeviceProperties(&other, d));
      if (std::string(other.name) != c.device) {
        c.notes.push_back(fmt::format("GPU {} is a {}, GPU 0 a {}: compute sweeps ran on GPU 0", d,
                                      other.name, c.device));
      }
    }
    check_kernels_load(s.devices.front(), prop);
    fill_versions(c, s.gpus, count);
    fill_device(c, prop, s.devices.front());
    c.sm_clock_measured_mhz = cuda::measure_sm_clock_mhz(s.devices.front());
    finish_context(c, s, options, prop);
    return c;
  }

  std::size_t plan(std::string_view sweep) const override {
    const Session& s = session();
    if (sweep == "launch") {
      return cuda::plan_launch(s);
    }
    if (sweep == "memory") {
      return cuda::plan_memory(s);
    }
    if (sweep == "gemm") {
      return cuda::plan_gemm(s);
    }
    if (sweep == "attention") {
      return cuda::plan_attention(s);
    }
    if (sweep == "collectives") {
      return cuda::plan_collectives(s);
    }
    if (sweep == "host_copies") {
      return cuda::plan_host_copies(s);
    }
    return cuda::plan_interference(s);
  }

  SweepOutput run_sweep(std::string_view sweep, const SweepControl& control) override {
    Session& s = session();
    s.samples = RawSamples{};
    s.notes.clear();
    s.control = control;
    s.progress.set_step(control.step);
    if (sweep == "launch") {
      cuda::run_launch(s);
    } else if (sweep == "memory") {
      cuda::run_memory(s);
    } else if (sweep == "gemm") {
      cuda::run_gemm(s);
    } else if (sweep == "attention") {
      cuda::run_attention(s);
    } else if (sweep == "host_copies") {
      cuda::run_host_copies(s);
    } else if (sweep == "interference") {
      cuda::run_interference(s);
    } else {
      throw std::logic_error(fmt::format("run_sweep: no sweep '{}' here", sweep));
    }
    s.progress.set_step({});
    return SweepOutput{std::move(s.samples), std::move(s.notes)};
  }

  RawContext open_rank(const MeasureOptions& options, int local_rank) override {
    if (const auto reason = unavailable_reason()) {
      throw InputError("calibrate", *reason);
    }
    int count = 0;
    CPSIM_CUDA_CHECK(cudaGetDeviceCount(&count));
    // One GPU per rank: the local rank's device, or the only one the launcher left visible.
    const int device = count == 1 ? 0 : local_rank;
    if (device >= count) {
      throw InputError("--mpi", fmt::format("local rank {} has no GPU of its own: {} visible on "
                                            "this node; start one rank per GPU",
                                            local_rank, count));
    }
    session_ = std::make_unique<Session>(options);
    Session& s = *session_;
    s.gpus = 1;
    s.devices = {device};
    if (options.quick) {
      s.timing = cuda::TimingConfig{2, 5, 1e-3, 32};
    }
    RawContext c;
    c.checks = cuda::check_gpus(s.devices, c.notes);
    cudaDeviceProp prop{};
    CPSIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
    c.device = prop.name;
    fill_versions(c, 1, count);
    int version = 0;
    CPSIM_NCCL_CHECK(ncclGetVersion(&version));
    c.nccl_version =
        fmt::format("{}.{}.{}", version / 10000, (version % 10000) / 100, version % 100);
    fill_device(c, prop, device);
    c.sm_clock_measured_mhz = 0.0;  // no kernel of ours runs in MPI mode
    finish_context(c, s, options, prop);
    return c;
  }

  std::unique_ptr<RankRig> rank_rig() override { return cuda::make_nccl_rank_rig(session()); }

  CollectivePlan collective_plan() const override { return cuda::collective_plan(session()); }

  TimingPlan timing_plan() const override {
    const cuda::TimingConfig& t = session().timing;
    return TimingPlan{t.repetitions, t.target_rep_s, t.max_inner};
  }

  std::unique_ptr<CollectiveRig> collective_rig() override {
    return cuda::make_nccl_rig(session());
  }

 private:
  Session& session() const {
    if (!session_) {
      throw std::logic_error("the CUDA backend was used before open()");
    }
    return *session_;
  }

  /// Driver, CUDA, NCCL and cuBLASLt versions.
  static void fill_versions(RawContext& c, int gpus, int count) {
    c.gpu_count = gpus;
    c.device_count = count;
    c.driver_version = driver_release();
    int version = 0;
    CPSIM_CUDA_CHECK(cudaDriverGetVersion(&version));
    c.cuda_driver_version = cuda_version(version);
    CPSIM_CUDA_CHECK(cudaRuntimeGetVersion(&version));
    c.cuda_runtime_version = cuda_version(version);
    if (gpus >= 2) {
      CPSIM_NCCL_CHECK(ncclGetVersion(&version));
      c.nccl_version =
          fmt::format("{}.{}.{}", version / 10000, (version % 10000) / 100, version % 100);
    } else {
      c.nccl_version = "none";
    }
    const std::size_t lt = cublasLtGetVersion();
    c.cublaslt_version = fmt::format("{}.{}.{}", lt / 10000, (lt % 10000) / 100, lt % 100);
  }

  /// SM count, memory, L2, maximum clocks of `device`, and the date.
  /// What every run records alike: the command, the L2-flushing rotation buffer size (twice the L2,
  /// at least 100 MiB), the SM count and the timing method.
  static void finish_context(RawContext& c,
                             Session& s,
                             const MeasureOptions& options,
                             const cudaDeviceProp& prop) {
    c.cpsim_version = options.cpsim_version;
    c.argv = options.argv;
    c.quick = options.quick;
    s.rotation_bytes = std::max<std::size_t>(2 * static_cast<std::size_t>(prop.l2CacheSize),
                                             std::size_t{100} << 20);
    s.sm_count = prop.multiProcessorCount;
    c.method = RawMethod{"cuda-event", "median", s.timing.warmup, s.timing.repetitions,
                         static_cast<std::int64_t>(s.rotation_bytes)};
  }

  static void fill_device(RawContext& c, const cudaDeviceProp& prop, int device) {
    c.sm_count = prop.multiProcessorCount;
    c.hbm_capacity_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
    c.l2_cache_bytes = prop.l2CacheSize;
    int khz = 0;
    CPSIM_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, device));
    c.sm_clock_max_mhz = khz / 1000.0;
    CPSIM_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, device));
    c.memory_clock_max_mhz = khz / 1000.0;
    c.date = utc_now();
  }

  std::unique_ptr<Session> session_;

  /// The kernels are built for CMAKE_CUDA_ARCHITECTURES (90 by default); another GPU generation
  /// needs a rebuild. Refuse before measuring rather than fail in the middle.
  static void check_kernels_load(int device, const cudaDeviceProp& prop) {
    const DeviceGuard guard(device);
    const cudaError_t e = cuda::flash_attention_prepare();
    if (e == cudaErrorNoKernelImageForDevice || e == cudaErrorInvalidDeviceFunction ||
        e == cudaErrorUnsupportedPtxVersion) {
      (void)cudaGetLastError();
      throw InputError("calibrate",
                       fmt::format("{} (compute capability {}.{}) cannot run this build's kernels "
                                   "({}); rebuild with -DCMAKE_CUDA_ARCHITECTURES={}{}",
                                   prop.name, prop.major, prop.minor, cudaGetErrorName(e),
                                   prop.major, prop.minor));
    }
    CPSIM_CUDA_CHECK(e);
  }
};

}  // namespace

}  // namespace cpsim::calibrate

/// The entry point calibrate/src/measure_loader.cpp looks up after dlopen: a new backend, owned by
/// the caller.
extern "C" cpsim::calibrate::MeasureBackend* cpsim_calibrate_cuda_new_backend() {
  return new cpsim::calibrate::CudaBackend();  // NOLINT(cppcoreguidelines-owning-memory)
}
