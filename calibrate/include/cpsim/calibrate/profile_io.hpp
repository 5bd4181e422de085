#pragma once
/// @file Writes a hardware profile in the format of data/hardware/*.json (schema
/// "cpsim.hardware/1"), the inverse of cpsim::models::parse_hardware_profile.

#include <string>

#include "cpsim/models/hardware.hpp"

namespace cpsim::calibrate {

/// JSON text (2-space indent, trailing newline) of `profile`: every coefficient as
/// {"value", "source"} and every curve as {"points", "source"}, the source taken from
/// `profile.provenance` under the coefficient's JSON path ("gpu.sm_count",
/// "collectives.intra_node.all_to_all.alpha_s", ...). parse_hardware_profile reads it back to an
/// equal profile.
/// @throws InputError (field "provenance.<path>") when a coefficient has no source.
std::string write_hardware_profile(const models::HardwareProfile& profile);

}  // namespace cpsim::calibrate
