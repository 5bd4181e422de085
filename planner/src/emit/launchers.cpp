#include "emit_common.hpp"

namespace cpsim::planner::emit_detail {

/// Launchers that can run a method (reference/launchers.md §0), as `--emit` values.
const char* launchers_for(CpMethod m) {
  switch (m) {
    case CpMethod::kUlysses:
      return "--emit deepspeed, accelerate or arctic (or untied-ulysses, megatron with a2a)";
    case CpMethod::kUPipe:
      return "--emit untied-ulysses (UPipe exists only in the authors' TorchTitan fork)";
    case CpMethod::kRing:
      return "--emit torchtitan, accelerate, megatron or untied-ulysses";
    case CpMethod::kAllGather:
      return "--emit torchtitan, accelerate or megatron";
    case CpMethod::kFpdt:
      return "--emit deepspeed (Megatron-DeepSpeed flags)";
    case CpMethod::kUsp:
      return "--emit untied-ulysses or megatron (a2a+p2p)";
  }
  return "";
}

}  // namespace cpsim::planner::emit_detail
