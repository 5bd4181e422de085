// The measurement backend of a cpsim built without CUDA: it explains and refuses.
#include <memory>

#include "cpsim/calibrate/measure.hpp"
#include "cpsim/models/error.hpp"

namespace cpsim::calibrate {
namespace {

constexpr const char* kWithoutCuda =
    "this cpsim was built without CUDA (no nvcc found, or CPSIM_ENABLE_CUDA=OFF), so it cannot "
    "measure; rebuild on a machine with the CUDA toolkit, NCCL and cuBLASLt "
    "(cmake -DCPSIM_ENABLE_CUDA=ON), or fit timings measured elsewhere with `cpsim calibrate fit`";

}  // namespace

std::unique_ptr<MeasureBackend> make_measure_backend() {
  return std::make_unique<RefusingBackend>("none", kWithoutCuda);
}

}  // namespace cpsim::calibrate
