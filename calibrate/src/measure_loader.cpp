// The measurement backend of a cpsim built with CUDA: the CUDA code lives in the shared module
// libcpsim_calibrate_cuda.so (calibrate/cuda), loaded here with dlopen on first use. The cpsim
// binary itself links no CUDA library, so every other subcommand starts fast and runs on machines
// without the CUDA runtime, cuBLASLt or NCCL.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFactory = "cpsim_calibrate_cuda_new_backend";

/// Where to look for the module, in order: $CPSIM_CALIBRATE_CUDA_MODULE, next to the running
/// executable, the build tree it was built in, the dynamic loader's search path.
std::vector<std::string> candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("CPSIM_CALIBRATE_CUDA_MODULE"); env != nullptr && *env) {
    out.emplace_back(env);
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / CPSIM_CUDA_MODULE_NAME).string());
  }
  out.emplace_back(CPSIM_CUDA_MODULE_BUILD_PATH);
  out.emplace_back(CPSIM_CUDA_MODULE_NAME);
  std::vector<std::string> unique;
  for (std::string& path : out) {
    if (std::find(unique.begin(), unique.end(), path) == unique.end()) {
      unique.push_back(std::move(path));
    }
  }
  return unique;
}

using Factory = MeasureBackend* (*)();

}  // namespace

std::unique_ptr<MeasureBackend> make_measure_backend() {
  std::string errors;
  for (const std::string& path : candidates()) {
    // The module stays loaded for the life of the process (the backend's code lives in it).
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = ::dlerror();
      errors += fmt::format("{}{}", errors.empty() ? "" : "; ", e != nullptr ? e : path);
      continue;
    }
    void* symbol = ::dlsym(handle, kFactory);
    if (symbol == nullptr) {
      errors += fmt::format("{}{}: no symbol {}", errors.empty() ? "" : "; ", path, kFactory);
      continue;
    }
    Factory factory = nullptr;
    static_assert(sizeof(factory) == sizeof(symbol));
    std::memcpy(&factory, &symbol, sizeof(factory));  // object to function pointer (POSIX)
    return std::unique_ptr<MeasureBackend>(factory());
  }
  return std::make_unique<RefusingBackend>(
      "cuda (not loaded)",
      fmt::format(
          "no CUDA device can be used: the CUDA measurement module {} could not be loaded ({}); "
          "is the CUDA runtime (libcudart, libcublasLt, libnccl) installed?",
          CPSIM_CUDA_MODULE_NAME, errors));
}

}  // namespace cpsim::calibrate
