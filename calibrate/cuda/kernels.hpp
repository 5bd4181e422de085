#pragma once
// Launch wrappers of the calibration kernels (compiled by nvcc in the .cu files, called from the
// host code compiled by the C++ compiler). Every wrapper returns the launch error
// (cudaGetLastError) so that callers wrap it in CPSIM_CUDA_CHECK.
//
// Attention tensors are laid out [heads][len][head_dim], bf16, one sequence (batch 1). A causal
// mask is aligned bottom-right: query i sees key j iff j <= i + kv_len - q_len. Rows that see no
// key give O = 0 and LSE = -inf.

#include <cstddef>
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

namespace cpsim::calibrate::cuda {

struct AttentionArgs {
  const __nv_bfloat16* q = nullptr;  ///< [heads][q_len][head_dim]
  const __nv_bfloat16* k = nullptr;  ///< [heads][kv_len][head_dim]
  const __nv_bfloat16* v = nullptr;  ///< [heads][kv_len][head_dim]
  __nv_bfloat16* o = nullptr;        ///< [heads][q_len][head_dim]
  float* lse = nullptr;              ///< [heads][q_len], natural log of the softmax denominator
  // Backward only
  const __nv_bfloat16* d_o = nullptr;  ///< [heads][q_len][head_dim]
  __nv_bfloat16* dq = nullptr;         ///< [heads][q_len][head_dim]
  __nv_bfloat16* dk = nullptr;         ///< [heads][kv_len][head_dim]
  __nv_bfloat16* dv = nullptr;         ///< [heads][kv_len][head_dim]
  float* dq_accum = nullptr;           ///< [heads][q_len][head_dim] fp32 workspace
  float* delta = nullptr;              ///< [heads][q_len] workspace: rowsum(dO * O)
  int heads = 0;
  int q_len = 0;
  int kv_len = 0;
  int head_dim = 0;  ///< 64 or 128
  bool causal = false;
  float scale = 0.0f;  ///< softmax scale, usually 1/sqrt(head_dim)
};

/// Tile sizes of the flash kernels (profile_fit.hpp kCpsimFlashBlockM/N must match).
inline constexpr int kFlashBlockM = 64;  ///< query rows per forward CTA
inline constexpr int kFlashBlockN = 64;  ///< key rows per backward CTA

/// True when the flash kernels support the shape: head_dim 64 or 128, lengths multiples of 64.
bool flash_attention_supported(int head_dim, int q_len, int kv_len);

/// Sets the dynamic shared memory limits of the flash kernels (call once per device).
cudaError_t flash_attention_prepare();

/// Tensor-core (WMMA bf16, fp32 accumulate) flash attention forward: O and LSE.
cudaError_t flash_attention_forward(const AttentionArgs& args, cudaStream_t stream);

/// Flash attention backward: dQ, dK, dV from Q, K, V, O, dO and LSE (three kernels: delta and
/// zeroing of dq_accum, the main pass, dq_accum to bf16).
cudaError_t flash_attention_backward(const AttentionArgs& args, cudaStream_t stream);

/// Naive reference forward, fp32 accumulation, one thread per query row; writes fp32 output.
cudaError_t reference_attention_forward(const AttentionArgs& args,
                                        float* o_ref,
                                        float* lse_ref,
                                        cudaStream_t stream);

/// Naive reference backward, fp32: dq_ref, dk_ref, dv_ref (fp32 outputs, shapes as dq/dk/dv).
/// `lse_ref` and `delta_ref` are [heads][q_len] fp32 workspaces it fills itself.
cudaError_t reference_attention_backward(const AttentionArgs& args,
                                         float* lse_ref,
                                         float* delta_ref,
                                         float* dq_ref,
                                         float* dk_ref,
                                         float* dv_ref,
                                         cudaStream_t stream);

/// Fills `count` bf16 values with a deterministic hash of (seed, index), uniform in
/// [-scale, scale).
cudaError_t fill_uniform_bf16(
    __nv_bfloat16* data, std::size_t count, std::uint64_t seed, float scale, cudaStream_t stream);

/// Streaming copy of `bytes` (a multiple of 16) from src to dst with 16-byte vector loads.
cudaError_t copy_kernel(const void* src, void* dst, std::size_t bytes, cudaStream_t stream);

/// One launch of an empty kernel (1 block, 1 thread).
cudaError_t empty_kernel(cudaStream_t stream);

/// One block spinning for `cycles` SM clock cycles (clock64), for the measured SM clock.
cudaError_t spin_kernel(long long cycles, cudaStream_t stream);

}  // namespace cpsim::calibrate::cuda
