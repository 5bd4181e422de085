#pragma once
// Internal: the kernels of a step's ops as the recipe and the implementation run them, composed
// from the cost model's GEMM and memory-bound costs: Linear layers (bf16, or FP8 with
// TransformerEngine's casts), RMSNorm, SwiGLU and RoPE, each with its host calls. The
// derivations and their sources are in kernel_costs.cpp.

#include <cstdint>

#include "cpsim/models/recipe.hpp"
#include "cpsim/sim/cost_model.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim::detail {

class KernelCosts {
 public:
  /// `cost` outlives this; `implementation` (nullptr: none): its RoPE kernel, if it runs its own.
  KernelCosts(const CostModel& cost,
              const ScheduleInputs& in,
              const Implementation* implementation);

  KernelCost gemm(std::int64_t m, std::int64_t n, std::int64_t k) const;
  /// A Linear layer's GEMMs, Y[m,n] = X[m,k]·W[k,n] (Q/K/V, output projection, gate/up, down): in
  /// bf16 each is `gemm(m, n, k)`; with `recipe.fp8` each is an FP8 GEMM plus the casts
  /// TransformerEngine runs before it (see kernel_costs.cpp). `grad`: the forward's input is kept
  /// for a backward (its transposed FP8 copy is written too).
  KernelCost linear_fwd(std::int64_t m, std::int64_t n, std::int64_t k, bool grad = true) const;
  KernelCost linear_dgrad(std::int64_t m, std::int64_t n, std::int64_t k) const;
  KernelCost linear_wgrad(std::int64_t m, std::int64_t n, std::int64_t k) const;
  /// dgrad + wgrad.
  KernelCost linear_bwd(std::int64_t m, std::int64_t n, std::int64_t k) const;
  /// `k` with the host calls of one RMSNorm of the recipe's kind (forward or backward).
  KernelCost norm_calls(KernelCost k, bool backward) const;
  /// One RMSNorm over `elements` activations, forward or backward, host calls included. Fused and
  /// upcast kernels: one pass moving `single_pass_bytes`. Eager (Hugging Face LlamaRMSNorm):
  /// every op of its composite chain is a kernel of its own (see kernel_costs.cpp).
  KernelCost norm_cost(std::int64_t elements, std::int64_t single_pass_bytes, bool backward) const;
  /// The SwiGLU activation over `elements` of [s, f], forward or backward, without its GEMMs:
  /// one kernel (3 and 6 activation-sized passes) unless the recipe's MLP is Hugging Face's eager
  /// one, whose ops run as kernels of their own (see kernel_costs.cpp).
  KernelCost swiglu_cost(std::int64_t elements, bool backward) const;
  /// Which backward a RoPE runs: autograd's over the forward's ops, or an implementation's own
  /// (DeepSpeed FPDT's apply_rotary_pos_emb_backward).
  enum class RopeBackward { kNone, kAutograd, kOwn };
  /// RoPE over the query's and the key's elements as the recipe's kernel runs it (forward when
  /// `backward` is kNone), plus `pass_bytes` of layout copy moved beside it (the value's part of
  /// the scheme's RoPE op): one kernel when fused, otherwise a chain per tensor (see
  /// kernel_costs.cpp).
  KernelCost rope_cost(std::int64_t q_elements,
                       std::int64_t k_elements,
                       std::int64_t pass_bytes,
                       RopeBackward backward) const;
  static KernelCost times(KernelCost k, double factor);
  static KernelCost plus(KernelCost a, KernelCost b);
  /// A memory-bound kernel moving `bytes` (CostModel::memory_bound).
  KernelCost mem(std::int64_t bytes) const { return cost_model_.memory_bound(bytes); }

 protected:
  const models::RopeKernel rope_kernel_;  ///< the implementation's, or the recipe's

 private:
  const CostModel& cost_model_;
  const models::TrainingRecipe& recipe_;
  const std::int64_t activation_bytes_;
};

}  // namespace cpsim::sim::detail
