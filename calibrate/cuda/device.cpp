// RAII wrappers, error reporting, event timing and buffer rotation of the CUDA backend.
#include <algorithm>
#include <cstring>
#include <sched.h>
#include <string>
#include <utility>

#include <fmt/format.h>

#include "measure_internal.hpp"

namespace cpsim::calibrate::cuda {
namespace {

/// The path from "calibrate/" on, so messages do not carry the build machine's folders.
std::string short_file(const char* file) {
  const std::string f = file;
  const auto pos = f.rfind("calibrate/");
  return pos == std::string::npos ? f : f.substr(pos);
}

const char* nccl_error_name(ncclResult_t e) {
  switch (e) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult";
  }
}

}  // namespace

void throw_cuda_error(const char* call, const char* file, int line, cudaError_t e) {
  throw MeasureError(fmt::format("{} failed at {}:{}: {} ({})", call, short_file(file), line,
                                 cudaGetErrorName(e), cudaGetErrorString(e)));
}

void throw_nccl_error(const char* call, const char* file, int line, ncclResult_t e) {
  throw MeasureError(fmt::format("{} failed at {}:{}: {} ({})", call, short_file(file), line,
                                 nccl_error_name(e), ncclGetErrorString(e)));
}

void throw_cublas_error(const char* call, const char* file, int line, cublasStatus_t e) {
  throw MeasureError(fmt::format("{} failed at {}:{}: {} ({})", call, short_file(file), line,
                                 cublasLtGetStatusName(e), cublasLtGetStatusString(e)));
}

DeviceGuard::DeviceGuard(int device) {
  CPSIM_CUDA_CHECK(cudaGetDevice(&previous_));
  CPSIM_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  (void)cudaSetDevice(previous_);
}

DeviceBuffer::DeviceBuffer(int device, std::size_t bytes) : bytes_(bytes), device_(device) {
  const DeviceGuard guard(device);
  CPSIM_CUDA_CHECK(cudaMalloc(&ptr_, bytes));
}

DeviceBuffer::~DeviceBuffer() {
  release();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)),
      bytes_(std::exchange(other.bytes_, 0)),
      device_(other.device_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    release();
    ptr_ = std::exchange(other.ptr_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    device_ = other.device_;
  }
  return *this;
}

void DeviceBuffer::release() noexcept {
  if (ptr_ != nullptr) {
    int previous = 0;
    (void)cudaGetDevice(&previous);
    (void)cudaSetDevice(device_);
    (void)cudaFree(ptr_);
    (void)cudaSetDevice(previous);
    ptr_ = nullptr;
  }
}

namespace {

/// While alive, the calling thread runs only on `cpus` (none, or an affinity the system refuses:
/// unchanged); its previous affinity comes back on destruction.
class ScopedCpuAffinity {
 public:
  explicit ScopedCpuAffinity(const std::vector<int>& cpus) {
    if (cpus.empty() || sched_getaffinity(0, sizeof(saved_), &saved_) != 0) {
      return;
    }
    cpu_set_t wanted;
    CPU_ZERO(&wanted);
    for (const int c : cpus) {
      if (c >= 0 && c < CPU_SETSIZE) {
        CPU_SET(c, &wanted);
      }
    }
    bound_ = sched_setaffinity(0, sizeof(wanted), &wanted) == 0;
  }
  ~ScopedCpuAffinity() {
    if (bound_) {
      (void)sched_setaffinity(0, sizeof(saved_), &saved_);
    }
  }
  ScopedCpuAffinity(const ScopedCpuAffinity&) = delete;
  ScopedCpuAffinity& operator=(const ScopedCpuAffinity&) = delete;

 private:
  cpu_set_t saved_{};
  bool bound_ = false;
};

}  // namespace

PinnedBuffer::PinnedBuffer(std::size_t bytes, const std::vector<int>& cpus) {
  const ScopedCpuAffinity on_node(cpus);
  CPSIM_CUDA_CHECK(cudaHostAlloc(&ptr_, bytes, cudaHostAllocPortable));
  std::memset(ptr_, 0, bytes);  // touch every page before timing
}

NumaPlacement gpu_numa_placement(int device) {
  char bus_id[64] = {};
  if (cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != cudaSuccess) {
    return {};
  }
  return numa_placement(bus_id);
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) {
    (void)cudaFreeHost(ptr_);
  }
}

Stream::Stream(int device) : device_(device) {
  const DeviceGuard guard(device);
  CPSIM_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

Stream::~Stream() {
  if (stream_ != nullptr) {
    (void)cudaStreamDestroy(stream_);
  }
}

Event::Event(int device) {
  const DeviceGuard guard(device);
  CPSIM_CUDA_CHECK(cudaEventCreate(&event_));
}

Event::~Event() {
  if (event_ != nullptr) {
    (void)cudaEventDestroy(event_);
  }
}

double elapsed_s(const Event& start, const Event& stop) {
  float ms = 0.0f;
  CPSIM_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
  return static_cast<double>(ms) * 1e-3;
}

double median(std::vector<double> values) {
  if (values.empty()) {
    return 0.0;
  }
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double time_launches(const Stream& stream,
                     const TimingConfig& config,
                     const std::function<void(int iteration)>& launch) {
  const DeviceGuard guard(stream.device());
  const Event start(stream.device());
  const Event stop(stream.device());
  int iteration = 0;
  // First warm-up launch, timed, to size the repetitions.
  CPSIM_CUDA_CHECK(cudaEventRecord(start.get(), stream.get()));
  launch(iteration++);
  CPSIM_CUDA_CHECK(cudaEventRecord(stop.get(), stream.get()));
  CPSIM_CUDA_CHECK(cudaEventSynchronize(stop.get()));
  double estimate = elapsed_s(start, stop);
  // Further warm-up only for short kernels (a long one is warm after one call).
  if (estimate < 0.05) {
    for (int w = 1; w < config.warmup; ++w) {
      launch(iteration++);
    }
    CPSIM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  }
  estimate = std::max(estimate, 1e-7);
  const int inner =
      static_cast<int>(std::clamp(std::ceil(config.target_rep_s / estimate), 1.0,
                                  static_cast<double>(std::max(1, config.max_inner))));
  const int reps = estimate > 0.25 ? 3 : (estimate > 0.05 ? 5 : config.repetitions);
  std::vector<double> times;
  times.reserve(static_cast<std::size_t>(reps));
  for (int r = 0; r < reps; ++r) {
    CPSIM_CUDA_CHECK(cudaEventRecord(start.get(), stream.get()));
    for (int i = 0; i < inner; ++i) {
      launch(iteration++);
    }
    CPSIM_CUDA_CHECK(cudaEventRecord(stop.get(), stream.get()));
    CPSIM_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    times.push_back(elapsed_s(start, stop) / inner);
  }
  return median(std::move(times));
}

int rotation_sets(std::size_t set_bytes, std::size_t arena_bytes, std::size_t rotation_bytes) {
  if (set_bytes == 0) {
    return 1;
  }
  const std::size_t wanted = (rotation_bytes + set_bytes - 1) / set_bytes;
  const std::size_t fit = arena_bytes / set_bytes;
  return static_cast<int>(std::max<std::size_t>(1, std::min({wanted, fit, std::size_t{4096}})));
}

RegionLayout layout_regions(const std::vector<std::size_t>& sizes) {
  constexpr std::size_t kAlign = 256;
  RegionLayout layout;
  for (const std::size_t s : sizes) {
    layout.offsets.push_back(layout.total);
    layout.total += (s + kAlign - 1) / kAlign * kAlign;
  }
  return layout;
}

std::size_t free_device_memory(int device) {
  const DeviceGuard guard(device);
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  CPSIM_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
  return free_bytes;
}

std::string bytes_label(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 4) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, units[u]);
}

std::string length_label(std::int64_t tokens) {
  if (tokens >= (std::int64_t{1} << 20) && tokens % (std::int64_t{1} << 20) == 0) {
    return fmt::format("{}M", tokens >> 20);
  }
  if (tokens >= 1024 && tokens % 1024 == 0) {
    return fmt::format("{}K", tokens >> 10);
  }
  return std::to_string(tokens);
}

const char* collective_name(models::Collective op) {
  switch (op) {
    case models::Collective::kAllToAll:
      return "all_to_all";
    case models::Collective::kAllGather:
      return "all_gather";
    case models::Collective::kReduceScatter:
      return "reduce_scatter";
    case models::Collective::kAllReduce:
      return "all_reduce";
    case models::Collective::kSendRecv:
      return "send_recv";
  }
  return "unknown";
}

}  // namespace cpsim::calibrate::cuda
