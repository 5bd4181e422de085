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

#include "module_loader.hpp"

namespace cpsim::calibrate {
namespace {

constexpr const char* kFactory = "cpsim_calibrate_cuda_new_backend";

using Factory = MeasureBackend* (*)();

}  // namespace

std::unique_ptr<MeasureBackend> make_measure_backend() {
  const detail::ModuleSymbol found =
      detail::load_module_symbol("CPSIM_CALIBRATE_CUDA_MODULE", CPSIM_CUDA_MODULE_NAME,
                                 CPSIM_CUDA_MODULE_BUILD_PATH, kFactory, RTLD_NOW | RTLD_LOCAL);
  if (found.symbol != nullptr) {
    Factory factory = nullptr;
    static_assert(sizeof(factory) == sizeof(found.symbol));
    std::memcpy(&factory, &found.symbol, sizeof(factory));  // object to function pointer (POSIX)
    return std::unique_ptr<MeasureBackend>(factory());
  }
  return std::make_unique<RefusingBackend>(
      "cuda (not loaded)",
      fmt::format(
          "no CUDA device can be used: the CUDA measurement module {} could not be loaded ({}); "
          "is the CUDA runtime (libcudart, libcublasLt, libnccl) installed?",
          CPSIM_CUDA_MODULE_NAME, found.errors));
}

}  // namespace cpsim::calibrate
