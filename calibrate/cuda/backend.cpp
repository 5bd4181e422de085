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
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/models/error.hpp"

#include "kernels.hpp"
#include "measure_internal.hpp"

namespace cpsim::calibrate {
namespace {

using cuda::DeviceGuard;
using cuda::Session;

/// "570.86.15" from /proc/driver/nvidia/version, "unknown" when absent.
std::string driver_release() {
  std::ifstream in("/proc/driver/nvidia/version");
  std::string line;
  if (!std::getline(in, line)) {
    return "unknown";
  }
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  570.86.15  Tue ..."
  const auto pos = line.find("Kernel Module");
  std::istringstream words(pos == std::string::npos ? line : line.substr(pos + 13));
  std::string version;
  words >> version;
  return version.empty() ? "unknown" : version;
}

/// 12080 -> "12.8" (CUDA's major * 1000 + minor * 10).
std::string cuda_version(int code) {
  return fmt::format("{}.{}", code / 1000, (code % 1000) / 10);
}

std::string utc_now() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
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

  RawCalibration run(const MeasureOptions& options, const ProgressFn& progress) override {
    if (const auto reason = unavailable_reason()) {
      throw InputError("calibrate", *reason);
    }
    int count = 0;
    CPSIM_CUDA_CHECK(cudaGetDeviceCount(&count));
    if (options.gpus > count) {
      throw InputError("--gpus", fmt::format("{} GPUs requested, {} visible", options.gpus, count));
    }
    Session s(options, progress);
    s.gpus = options.gpus > 0 ? options.gpus : count;
    for (int d = 0; d < s.gpus; ++d) {
      s.devices.push_back(d);
    }
    if (options.quick) {
      s.timing = cuda::TimingConfig{2, 5, 1e-3, 32};
    }

    RawCalibration raw;
    RawContext& c = raw.context;
    cudaDeviceProp prop{};
    CPSIM_CUDA_CHECK(cudaGetDeviceProperties(&prop, s.devices.front()));
    c.device = prop.name;
    for (int d = 1; d < s.gpus; ++d) {
      cudaDeviceProp other{};
      CPSIM_CUDA_CHECK(cudaGetDeviceProperties(&other, d));
      if (std::string(other.name) != c.device) {
        s.notes.push_back(fmt::format("GPU {} is a {}, GPU 0 a {}: compute sweeps ran on GPU 0", d,
                                      other.name, c.device));
      }
    }
    check_kernels_load(s.devices.front(), prop);
    c.gpu_count = s.gpus;
    c.device_count = count;
    c.driver_version = driver_release();
    int version = 0;
    CPSIM_CUDA_CHECK(cudaDriverGetVersion(&version));
    c.cuda_driver_version = cuda_version(version);
    CPSIM_CUDA_CHECK(cudaRuntimeGetVersion(&version));
    c.cuda_runtime_version = cuda_version(version);
    if (s.gpus >= 2) {
      CPSIM_NCCL_CHECK(ncclGetVersion(&version));
      c.nccl_version =
          fmt::format("{}.{}.{}", version / 10000, (version % 10000) / 100, version % 100);
    } else {
      c.nccl_version = "none";
    }
    const std::size_t lt = cublasLtGetVersion();
    c.cublaslt_version = fmt::format("{}.{}.{}", lt / 10000, (lt % 10000) / 100, lt % 100);
    c.sm_count = prop.multiProcessorCount;
    c.hbm_capacity_bytes = static_cast<std::int64_t>(prop.totalGlobalMem);
    c.l2_cache_bytes = prop.l2CacheSize;
    int khz = 0;
    CPSIM_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, s.devices.front()));
    c.sm_clock_max_mhz = khz / 1000.0;
    CPSIM_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrMemoryClockRate, s.devices.front()));
    c.memory_clock_max_mhz = khz / 1000.0;
    c.date = utc_now();
    c.cpsim_version = options.cpsim_version;
    c.argv = options.argv;
    c.quick = options.quick;
    s.rotation_bytes = std::max<std::size_t>(2 * static_cast<std::size_t>(prop.l2CacheSize),
                                             std::size_t{100} << 20);
    s.sm_count = prop.multiProcessorCount;
    c.method = RawMethod{"cuda-event", "median", s.timing.warmup, s.timing.repetitions,
                         static_cast<std::int64_t>(s.rotation_bytes)};

    s.progress.set_total(cuda::plan_launch(s) + 1 + cuda::plan_memory(s) + cuda::plan_gemm(s) +
                         cuda::plan_attention(s) + cuda::plan_collectives(s) +
                         cuda::plan_host_copies(s) + cuda::plan_interference(s));
    cuda::run_launch(s);
    s.progress.start("SM clock");
    c.sm_clock_measured_mhz = cuda::measure_sm_clock_mhz(s.devices.front());
    s.progress.done();
    cuda::run_memory(s);
    cuda::run_gemm(s);
    cuda::run_attention(s);
    cuda::run_collectives(s);
    cuda::run_host_copies(s);
    cuda::run_interference(s);
    s.progress.finish("done");

    c.notes = std::move(s.notes);
    raw.samples = std::move(s.samples);
    return raw;
  }

 private:
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
