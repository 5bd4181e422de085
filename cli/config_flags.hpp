#pragma once
// The one table from the simulator's quantities (sim::Quantity) to the flags of the CLI, and the
// CLI's reading of a refused configuration.

#include <string>

#include "cpsim/models/error.hpp"
#include "cpsim/sim/cp_method.hpp"

namespace cpsim::cli {

/// The flag that sets quantity `q` of configuration `p` (the CP degree is `--gpus` when it is all
/// of them, else the flag of the method's CP degree).
std::string flag_for(sim::Quantity q, const models::ParallelConfig& p);
/// The refused configuration as bad input naming the flag at fault.
InputError flag_error(const sim::ConfigError& e);
/// "--flag: message" (planner::RefusalText of the CLI).
std::string refusal_text(const sim::ConfigError& e);
/// A sequence length out of range (every method refuses it), not one a method cannot divide.
bool refuses_every_method(const sim::ConfigError& e);

}  // namespace cpsim::cli
