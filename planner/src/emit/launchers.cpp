#include "cpsim/sim/cp_method.hpp"

#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

/// Launchers that can run a method, as `--emit` values (the method's table).
std::string launchers_for(CpMethod m) {
  return "--emit " + sim::cp_implementation(m).launchers().sentence();
}

}  // namespace cpsim::planner::emit_detail
