// Pre-run checks of `calibrate run`: other processes and memory in use, SM clock against its
// maximum, clock throttle reasons. NVML is loaded with dlopen (libnvidia-ml.so.1 ships with the
// driver, not the toolkit; no link-time dependency and no nvml.h needed): the few entry points
// below are declared here with the signatures of the NVML API reference (nvml.h). Without NVML
// the memory in use comes from cudaMemGetInfo and the rest is unknown.
#include <cstring>
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/format.h>

#include "cpsim/calibrate/run_control.hpp"

#include "measure_internal.hpp"

namespace cpsim::calibrate::cuda {
namespace {

// nvml.h: nvmlReturn_t is an enum (NVML_SUCCESS 0, NVML_ERROR_INSUFFICIENT_SIZE 7), nvmlDevice_t
// an opaque pointer, nvmlClockType_t NVML_CLOCK_SM = 1, nvmlMemory_t {total, free, used} in
// bytes, nvmlProcessInfo_t (v2 layout, used by nvmlDeviceGetComputeRunningProcesses_v3) {pid,
// usedGpuMemory, gpuInstanceId, computeInstanceId}.
using NvmlReturn = int;
using NvmlDevice = void*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr NvmlReturn kNvmlInsufficientSize = 7;
constexpr int kNvmlClockSm = 1;
struct NvmlMemory {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct NvmlProcessInfo {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

/// The NVML entry points used here, resolved from libnvidia-ml.so.1.
class Nvml {
 public:
  Nvml() {
    handle_ = ::dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      return;
    }
    resolve(init_, "nvmlInit_v2");
    resolve(shutdown_, "nvmlShutdown");
    resolve(by_bus_id_, "nvmlDeviceGetHandleByPciBusId_v2");
    resolve(memory_, "nvmlDeviceGetMemoryInfo");
    resolve(processes_, "nvmlDeviceGetComputeRunningProcesses_v3");
    resolve(clock_, "nvmlDeviceGetClockInfo");
    resolve(max_clock_, "nvmlDeviceGetMaxClockInfo");
    resolve(throttle_, "nvmlDeviceGetCurrentClocksThrottleReasons");
    ready_ = init_ != nullptr && by_bus_id_ != nullptr && init_() == kNvmlSuccess;
  }
  ~Nvml() {
    if (ready_ && shutdown_ != nullptr) {
      (void)shutdown_();
    }
    // The library stays mapped: NVML may keep threads alive after nvmlShutdown.
  }
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool ready() const { return ready_; }

  /// Fills what NVML can tell about the GPU with PCI bus id `bus_id`; false when it has no handle.
  bool check(const std::string& bus_id, GpuCheck& c) const {
    NvmlDevice device = nullptr;
    if (by_bus_id_(bus_id.c_str(), &device) != kNvmlSuccess) {
      return false;
    }
    c.source = "nvml";
    NvmlMemory memory{};
    if (memory_ != nullptr && memory_(device, &memory) == kNvmlSuccess) {
      c.memory_used_bytes = static_cast<std::int64_t>(memory.used);
      c.memory_total_bytes = static_cast<std::int64_t>(memory.total);
    }
    c.other_processes = other_processes(device);
    unsigned int mhz = 0;
    if (clock_ != nullptr && clock_(device, kNvmlClockSm, &mhz) == kNvmlSuccess) {
      c.sm_clock_mhz = mhz;
    }
    if (max_clock_ != nullptr && max_clock_(device, kNvmlClockSm, &mhz) == kNvmlSuccess) {
      c.sm_clock_max_mhz = mhz;
    }
    unsigned long long reasons = 0;
    if (throttle_ != nullptr && throttle_(device, &reasons) == kNvmlSuccess) {
      c.throttle_reasons = throttle_reason_names(reasons);
      c.throttle_known = true;
    }
    return true;
  }

 private:
  template <typename F>
  void resolve(F& f, const char* name) {
    void* symbol = ::dlsym(handle_, name);
    static_assert(sizeof(f) == sizeof(symbol));
    std::memcpy(&f, &symbol, sizeof(f));  // object to function pointer (POSIX)
  }

  /// Compute processes on the device other than this one; -1 when unknown.
  int other_processes(NvmlDevice device) const {
    if (processes_ == nullptr) {
      return -1;
    }
    unsigned int count = 0;
    NvmlReturn r = processes_(device, &count, nullptr);
    if (r == kNvmlSuccess) {
      return 0;
    }
    if (r != kNvmlInsufficientSize) {
      return -1;
    }
    std::vector<NvmlProcessInfo> infos(count + 8);
    count = static_cast<unsigned int>(infos.size());
    r = processes_(device, &count, infos.data());
    if (r != kNvmlSuccess) {
      return -1;
    }
    const auto self = static_cast<unsigned int>(::getpid());
    int others = 0;
    for (unsigned int i = 0; i < count; ++i) {
      others += infos[i].pid != self ? 1 : 0;
    }
    return others;
  }

  void* handle_ = nullptr;
  bool ready_ = false;
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  NvmlReturn (*by_bus_id_)(const char*, NvmlDevice*) = nullptr;
  NvmlReturn (*memory_)(NvmlDevice, NvmlMemory*) = nullptr;
  NvmlReturn (*processes_)(NvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;
  NvmlReturn (*clock_)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*max_clock_)(NvmlDevice, int, unsigned int*) = nullptr;
  NvmlReturn (*throttle_)(NvmlDevice, unsigned long long*) = nullptr;
};

/// Memory in use from the CUDA runtime (includes this process's context).
void check_with_cuda(int device, GpuCheck& c) {
  const DeviceGuard guard(device);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    c.source = "cudaMemGetInfo";
    c.memory_used_bytes = static_cast<std::int64_t>(total_bytes - free_bytes);
    c.memory_total_bytes = static_cast<std::int64_t>(total_bytes);
  } else {
    (void)cudaGetLastError();
    c.source = "none";
  }
}

}  // namespace

std::vector<GpuCheck> check_gpus(const std::vector<int>& devices, std::vector<std::string>& notes) {
  const Nvml nvml;
  if (!nvml.ready()) {
    notes.emplace_back(
        "pre-run checks: NVML (libnvidia-ml.so.1) not available: memory in use from "
        "cudaMemGetInfo only; other processes, clocks and throttling unknown");
  }
  std::vector<GpuCheck> out;
  for (const int d : devices) {
    GpuCheck c;
    c.gpu = d;
    char bus_id[32] = {};
    const bool have_bus =
        cudaDeviceGetPCIBusId(bus_id, static_cast<int>(sizeof(bus_id)), d) == cudaSuccess;
    if (!have_bus) {
      (void)cudaGetLastError();
    }
    if (!(nvml.ready() && have_bus && nvml.check(bus_id, c))) {
      check_with_cuda(d, c);
    }
    out.push_back(std::move(c));
  }
  return out;
}

}  // namespace cpsim::calibrate::cuda
