#include "kernel_costs.hpp"

#include <cmath>
#include <vector>

#include "cpsim/models/units.hpp"
#include "cpsim/sim/implementation.hpp"

namespace cpsim::sim::detail {

KernelCosts::KernelCosts(const CostModel& cost,
                         const ScheduleInputs& in,
                         const Implementation* implementation)
    : rope_kernel_(implementation != nullptr ? implementation->rope_kernel(in)
                                             : in.recipe.rope_kernel),
      cost_model_(cost),
      recipe_(in.recipe),
      activation_bytes_(in.recipe.activation_bytes) {}

KernelCost KernelCosts::gemm(std::int64_t m, std::int64_t n, std::int64_t k) const {
  return cost_model_.gemm(m, n, k);
}
// FP8 Linear as TransformerEngine runs it with delayed scaling (transformer_engine/pytorch/module/
// linear.py @ d0067d0, REFERENCES.md [TE]). Forward: the input X [m, k] is quantized (read bf16,
// write the FP8 row-wise copy for the GEMM and, when a backward needs it, the column-wise
// (transposed) copy for wgrad: linear.py:595-616), 2 + 1 + 1 bytes per element; the amax for the
// next step's scale is computed in the same pass. The weight [k, n] is quantized with its
// transpose (linear.py:479-490: re-quantized unless a later micro-batch reuses the cache; cpsim
// charges it in every forward, exact for one micro-batch), 4 bytes per element. Backward: the
// output gradient dY [m, n] is quantized row- and column-wise (4 bytes per element) before dgrad
// (dY · Wᵀ) and wgrad (Xᵀ · dY), both FP8 GEMMs. The casts are memory-bound traffic inside the
// GEMM's op (no launch of their own).
KernelCost KernelCosts::linear_fwd(std::int64_t m,
                                   std::int64_t n,
                                   std::int64_t k,
                                   bool grad) const {
  if (!recipe_.fp8) {
    return gemm(m, n, k);
  }
  const std::int64_t cast_bytes = (grad ? 4 : 3) * m * k + 4 * k * n;
  KernelCost c = cost_model_.gemm_fp8(m, n, k);
  c.time_s += cost_model_.memory_traffic_s(cast_bytes);
  return c;
}
KernelCost KernelCosts::linear_dgrad(std::int64_t m, std::int64_t n, std::int64_t k) const {
  if (!recipe_.fp8) {
    return gemm(m, n, k);
  }
  KernelCost c = cost_model_.gemm_fp8(m, k, n);
  c.time_s += cost_model_.memory_traffic_s(4 * m * n);
  return c;
}
KernelCost KernelCosts::linear_wgrad(std::int64_t m, std::int64_t n, std::int64_t k) const {
  return recipe_.fp8 ? cost_model_.gemm_fp8(k, n, m) : gemm(m, n, k);
}
KernelCost KernelCosts::linear_bwd(std::int64_t m, std::int64_t n, std::int64_t k) const {
  return plus(linear_dgrad(m, n, k), linear_wgrad(m, n, k));
}
// Host calls of one RMSNorm (docs/MODEL.md, "Host issue"). Fused (Liger, Apex): one kernel
// forward, the kernel and the weight gradient's sum backward. Upcast and eager: the composite
// Hugging Face LlamaRMSNorm runs (models/recipe.hpp, NormKernel): `.to(float32)`, `pow`, `mean`,
// the epsilon add, `rsqrt`, `mul`, `.to(bf16)` and the weight product, 8 calls; its autograd
// backward is counted as two per forward op (an estimate: most of them have two inputs).
KernelCost KernelCosts::norm_calls(KernelCost k, bool backward) const {
  const bool fused = recipe_.norm_kernel == models::NormKernel::kFused;
  k.host_calls = fused ? (backward ? 2 : 1) : (backward ? 16 : 8);
  return k;
}
// Eager RMSNorm's time (Hugging Face LlamaRMSNorm.forward, REFERENCES.md [HF-transformers]; its
// backward from PyTorch's autograd formulas, REFERENCES.md [PyTorch-autograd]). Each op is one
// kernel over the whole [rows, h] tensor. Bytes per element, with a = the activation dtype's size
// (2, bf16) and fp32 = 4; per-row values (the variance, rsqrt) are h times smaller, left out:
//   forward                                       backward (reverse order)
//   x.to(fp32)          a read, 4 written  a+4    weight*c: dc = dy·w   a read, a written      2a
//   .pow(2)             4 read, 4 written    8              dw = Σ dy·c  2a read, a written,
//   .mean(-1)           4 read               4                  then the row sum reads a   4a
//   a·rsqrt(var+eps)    4 read, 4 written    8    c.to(bf16): dc.to(fp32)  a read, 4 written  a+4
//   .to(bf16)           4 read, a written  4+a    b = x32·r: db·r  4 read, 4 written           8
//   weight * c          a read, a written   2a                 Σ db·x32 (8 read, 4 written,
//                                                              then the row sum reads 4)      16
//                                                 mean: the expanded gradient / h, 4 written    4
//                                                 pow: grad·(2·x32.pow(1)): the copy 8, the
//                                                      scalar product 8, the product 12       28
//                                                 the two gradients of x32 summed: 8 read, 4 w 12
//                                                 x.to(fp32): grad.to(bf16)  4 read, a written 4+a
// Forward 28 + 4a = 36 bytes per element in 6 kernels (the per-row add and rsqrt left out),
// backward 76 + 8a = 92 in 13; a fused kernel moves about 4 and 8. Measured on one H200
// (data/measurements/h200-2026-11-26, the 8K profile): `pow` ran 129 times (2 norms × 32 layers
// × forward and recompute, plus the final norm) at 65 us each, 268 MB at the measured 4.0 TB/s;
// the backward's scalar product of `pow` ran 65 times.
KernelCost KernelCosts::norm_cost(std::int64_t elements,
                                  std::int64_t single_pass_bytes,
                                  bool backward) const {
  if (recipe_.norm_kernel != models::NormKernel::kEager) {
    return norm_calls(mem(single_pass_bytes), backward);
  }
  const std::int64_t a = activation_bytes_;
  const std::int64_t fp32 = kFp32Bytes;
  const std::vector<std::int64_t> forward = {a + fp32, 2 * fp32, fp32, 2 * fp32, fp32 + a, 2 * a};
  const std::vector<std::int64_t> backward_kernels = {
      2 * a, 3 * a,    a,        a + fp32, 2 * fp32, 3 * fp32, fp32,
      fp32,  2 * fp32, 2 * fp32, 3 * fp32, 3 * fp32, fp32 + a};
  KernelCost k;
  for (const std::int64_t per_element : backward ? backward_kernels : forward) {
    k = plus(k, mem(per_element * elements));
  }
  return norm_calls(k, backward);
}
// Hugging Face's eager MLP, down_proj(act_fn(gate_proj(x)) * up_proj(x)) (LlamaMLP.forward,
// REFERENCES.md [HF-transformers]), runs `silu` and the product as two
// kernels: a + a and 2a + a bytes per element of [s, f] (a = the activation dtype's size). Its
// backward (PyTorch's autograd formulas for mul and silu): the product's two gradients, dy·up and
// dy·silu(gate), 2a read and a written each, then silu_backward(d, gate), 2a read and a written:
// 5a = 10 bytes forward in 2 kernels, 9a = 18 backward in 3. Measured on one H200
// (data/measurements/h200-2026-11-26, Llama-3-8B at 8K): `silu` 64 kernels at 126 us (s·f·4 bytes
// = 470 MB), silu_backward 32 at 180 us (704 MB). Otherwise one kernel of 3a (forward) and 6a.
KernelCost KernelCosts::swiglu_cost(std::int64_t elements, bool backward) const {
  if (recipe_.mlp_kernel != models::MlpKernel::kEager) {
    return mem((backward ? 6 : 3) * elements * activation_bytes_);
  }
  if (!backward) {
    return plus(mem(2 * activation_bytes_ * elements), mem(3 * activation_bytes_ * elements));
  }
  return plus(plus(mem(3 * activation_bytes_ * elements), mem(3 * activation_bytes_ * elements)),
              mem(3 * activation_bytes_ * elements));
}
// RoPE (models/recipe.hpp, RopeKernel; the implementation's when it runs its own, e.g. the UPipe
// op's Triton kernel). Sources: REFERENCES.md [HF-transformers], [DeepSpeed], [PyTorch-autograd],
// [TorchTitan], [Liger]. Bytes per element of q or k, a = the activation dtype's size (2),
// fp32 = 4, each op one kernel over one tensor (cos and sin are [s, d] tables, h times smaller,
// left out):
//   eager, forward (Hugging Face apply_rotary_pos_emb and rotate_half; DeepSpeed's reference
//   path, deepspeed/sequence/layer.py:99-128):
//     x·cos 2a, neg of one half a, cat(−x2, x1) 2a, ·sin 2a, the sum 3a               10a, 5
//     kernels
//   eager, autograd backward (derivatives.yaml: mul, neg, cat, slice): dy·cos 2a, dy·sin 2a, the
//     half's neg a, two slice backwards (zeros a, the half copied in a) 4a, the three gradients
//     of x summed twice 6a                                                             15a, 9
//     kernels
//   eager, FPDT's own backward (deepspeed/sequence/fpdt_layer.py:33-38): dy·cos 2a, dy·sin 2a,
//     neg of one half a, cat 2a, the sum 3a                                            10a, 5
//     kernels
//   complex (TorchTitan's apply_rotary_emb, torchtitan/models/llama3/model/model.py:164-169):
//     x.float() a+4, the complex product 8, type_as 4+a; backward the same three in reverse (to
//     fp32, dy·conj(freqs), to bf16)                                                   2a+16, 3
//     kernels
//   fused (Liger's rope kernel over q and k in place, src/liger_kernel/ops/rope.py:115-158;
//     TransformerEngine's fused RoPE): 2a, one kernel for both tensors and the pass-through copy.
// At a = 2: eager 20 bytes forward and 30 (autograd) or 20 (FPDT) backward, complex 20 and 20,
// fused 4 and 4. Measured on one H200 (data/measurements/h200-2026-11-26, Llama-3-8B at 8K,
// Hugging Face eager): `neg` ran 192 times (q and k × 32 layers × forward, recompute and
// backward) and `cat` 128 times (forward and recompute), the chain above; both ran at 22–38 % of
// the measured copy bandwidth (strided inputs), which this cost, at the profile's memory-bound
// rate, does not model: it is a lower bound for the eager chain's time.
KernelCost KernelCosts::rope_cost(std::int64_t q_elements,
                                  std::int64_t k_elements,
                                  std::int64_t pass_bytes,
                                  RopeBackward backward) const {
  const std::int64_t a = activation_bytes_;
  const std::int64_t fp32 = kFp32Bytes;
  if (rope_kernel_ == models::RopeKernel::kFused) {
    return mem(2 * a * (q_elements + k_elements) + pass_bytes);
  }
  std::vector<std::int64_t> chain;  // bytes per element, one kernel each
  if (rope_kernel_ == models::RopeKernel::kComplex) {
    chain = {a + fp32, 2 * fp32, fp32 + a};
  } else if (backward == RopeBackward::kAutograd) {
    chain = {2 * a, 2 * a, a, a, a, a, a, 3 * a, 3 * a};
  } else {
    chain = {2 * a, a, 2 * a, 2 * a, 3 * a};  // the forward, and FPDT's own backward
  }
  KernelCost k{0.0, 0.0, 0};
  for (const std::int64_t elements : {q_elements, k_elements}) {
    for (const std::int64_t per_element : elements > 0 ? chain : std::vector<std::int64_t>{}) {
      k = plus(k, mem(per_element * elements));
    }
  }
  return pass_bytes > 0 ? plus(k, mem(pass_bytes)) : k;
}
// `factor` kernels or calls of `k` (their host calls too, rounded up); a + b: both kernels.
KernelCost KernelCosts::times(KernelCost k, double factor) {
  return {k.time_s * factor, k.flops * factor,
          static_cast<std::int64_t>(std::ceil(static_cast<double>(k.host_calls) * factor))};
}
KernelCost KernelCosts::plus(KernelCost a, KernelCost b) {
  return {a.time_s + b.time_s, a.flops + b.flops, a.host_calls + b.host_calls};
}

}  // namespace cpsim::sim::detail
