#include "module_loader.hpp"

#include <algorithm>
#include <cstdlib>
#include <dlfcn.h>
#include <filesystem>
#include <system_error>
#include <vector>

#include <fmt/format.h>

namespace cpsim::calibrate::detail {
namespace {

std::vector<std::string> candidates(const char* env_var,
                                    const char* module_name,
                                    const char* build_path) {
  std::vector<std::string> out;
  if (const char* env = std::getenv(env_var); env != nullptr && *env) {
    out.emplace_back(env);
  }
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    out.push_back((exe.parent_path() / module_name).string());
  }
  out.emplace_back(build_path);
  out.emplace_back(module_name);
  std::vector<std::string> unique;
  for (std::string& path : out) {
    if (std::find(unique.begin(), unique.end(), path) == unique.end()) {
      unique.push_back(std::move(path));
    }
  }
  return unique;
}

}  // namespace

ModuleSymbol load_module_symbol(const char* env_var,
                                const char* module_name,
                                const char* build_path,
                                const char* symbol,
                                int dlopen_flags) {
  ModuleSymbol found;
  for (const std::string& path : candidates(env_var, module_name, build_path)) {
    void* handle = ::dlopen(path.c_str(), dlopen_flags);
    if (handle == nullptr) {
      const char* e = ::dlerror();
      found.errors +=
          fmt::format("{}{}", found.errors.empty() ? "" : "; ", e != nullptr ? e : path);
      continue;
    }
    found.symbol = ::dlsym(handle, symbol);
    if (found.symbol != nullptr) {
      return found;
    }
    found.errors +=
        fmt::format("{}{}: no symbol {}", found.errors.empty() ? "" : "; ", path, symbol);
  }
  return found;
}

}  // namespace cpsim::calibrate::detail
