#pragma once
// Internal: the factories of the implementations (one file each in this folder), listed by the
// registry (registry.cpp).

#include "cpsim/sim/implementation.hpp"

namespace cpsim::sim::impls {

const Implementation& yunchang_usp();
const Implementation& deepspeed_ulysses();
const Implementation& untied_ulysses_upipe();
const Implementation& torch_native_cp();
const Implementation& megatron_core_cp();
const Implementation& deepspeed_fpdt();

}  // namespace cpsim::sim::impls
