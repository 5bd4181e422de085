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

namespace cpsim::calibrate {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFactory = "cpsim_calibrate_mpi_new_world";

/// Where to look, in order: $CPSIM_CALIBRATE_MPI_MODULE, next to the running executable, the
/// build tree, the dynamic loader's search path.
std::vector<std::string> candidates() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("CPSIM_CALIBRATE_MPI_MODULE"); env != nullptr && *env) {
    out.emplace_back(env);
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / CPSIM_MPI_MODULE_NAME).string());
  }
  out.emplace_back(CPSIM_MPI_MODULE_BUILD_PATH);
  out.emplace_back(CPSIM_MPI_MODULE_NAME);
  return out;
}

using Factory = ProcessGroup* (*)(char*, int);

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_world() {
  std::string errors;
  for (const std::string& path : candidates()) {
    // RTLD_GLOBAL: Open MPI loads its components as plugins that resolve libmpi's symbols from
    // the global scope. The module stays loaded for the life of the process.
    void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
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
    std::array<char, 512> error{};
    ProcessGroup* world = factory(error.data(), static_cast<int>(error.size()));
    if (world == nullptr) {
      throw InputError("--mpi", fmt::format("MPI could not start: {}", error.data()));
    }
    return std::unique_ptr<ProcessGroup>(world);
  }
  throw InputError("--mpi", fmt::format("the MPI module {} could not be loaded ({}); is the MPI "
                                        "library it was built with installed?",
                                        CPSIM_MPI_MODULE_NAME, errors));
}

}  // namespace cpsim::calibrate
