// The MPI world of `cpsim calibrate run --mpi` in a cpsim built with MPI: the MPI code lives in
// the shared module libcpsim_calibrate_mpi.so (calibrate/mpi), loaded here with dlopen only for
// --mpi, so the cpsim binary starts where no MPI library is installed and no other subcommand
// loads one.
#include <array>
#include <cstdlib>
#include <cstring>
#include <dlfcn.h>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>

#include "cpsim/calibrate/mpi_run.hpp"
#include "cpsim/models/error.hpp"

#include "module_loader.hpp"

namespace cpsim::calibrate {
namespace {

constexpr const char* kFactory = "cpsim_calibrate_mpi_new_world";

using Factory = ProcessGroup* (*)(char*, int);

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_world() {
  // RTLD_GLOBAL: Open MPI loads its components as plugins that resolve libmpi's symbols from the
  // global scope.
  const detail::ModuleSymbol found =
      detail::load_module_symbol("CPSIM_CALIBRATE_MPI_MODULE", CPSIM_MPI_MODULE_NAME,
                                 CPSIM_MPI_MODULE_BUILD_PATH, kFactory, RTLD_NOW | RTLD_GLOBAL);
  if (found.symbol == nullptr) {
    throw InputError("--mpi", fmt::format("the MPI module {} could not be loaded ({}); is the MPI "
                                          "library it was built with installed?",
                                          CPSIM_MPI_MODULE_NAME, found.errors));
  }
  Factory factory = nullptr;
  static_assert(sizeof(factory) == sizeof(found.symbol));
  std::memcpy(&factory, &found.symbol, sizeof(factory));  // object to function pointer (POSIX)
  std::array<char, 512> error{};
  ProcessGroup* world = factory(error.data(), static_cast<int>(error.size()));
  if (world == nullptr) {
    throw InputError("--mpi", fmt::format("MPI could not start: {}", error.data()));
  }
  return std::unique_ptr<ProcessGroup>(world);
}

}  // namespace cpsim::calibrate
