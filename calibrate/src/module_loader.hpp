#pragma once
// Internal: finding a factory function in a shared module of cpsim's (the CUDA measurement module,
// the MPI module), which the cpsim binary loads with dlopen only when a command needs it.

#include <string>

namespace cpsim::calibrate::detail {

/// The factory found, or every place tried with why it failed.
struct ModuleSymbol {
  void* symbol = nullptr;
  std::string errors;  ///< "<dlerror>; <path>: no symbol <name>; ..." when symbol is null
};

/// Looks for `module_name` in order: the path in environment variable `env_var`, next to the
/// running executable, `build_path` (where the build tree made it), then the dynamic loader's
/// search path; dlopens each with `dlopen_flags` until one exports `symbol`. A module loaded stays
/// loaded for the life of the process.
ModuleSymbol load_module_symbol(const char* env_var,
                                const char* module_name,
                                const char* build_path,
                                const char* symbol,
                                int dlopen_flags);

}  // namespace cpsim::calibrate::detail
