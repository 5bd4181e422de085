#include "cpsim/sim/cp_method.hpp"

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

/// Launchers that can run a method, as `--emit` values (the method's table).
std::string launchers_for(CpMethod m) {
  const sim::LauncherSupport l = sim::cp_scheme(m).launchers();
  return l.runs.empty() ? l.sentence() : "--emit " + l.sentence();
}

}  // namespace cpsim::planner::emit_detail
