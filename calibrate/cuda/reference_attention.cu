// Launch wrappers of the naive reference attention kernels (reference_attention.cuh).
#include "kernels.hpp"
#include "reference_attention.cuh"

namespace cpsim::calibrate::cuda {
namespace {

using namespace reference;  // NOLINT(google-build-using-namespace): the reference kernels

constexpr int kThreads = 128;

bool valid(const AttentionArgs& a) {
  return a.head_dim > 0 && a.head_dim <= kMaxHeadDim && a.heads > 0 && a.q_len > 0 && a.kv_len > 0;
}

}  // namespace

cudaError_t reference_attention_forward(const AttentionArgs& a,
                                        float* o_ref,
                                        float* lse_ref,
                                        cudaStream_t stream) {
  if (!valid(a)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid((a.q_len + kThreads - 1) / kThreads, a.heads);
  reference_forward_kernel<<<grid, kThreads, 0, stream>>>(a, o_ref, lse_ref);
  return cudaGetLastError();
}

cudaError_t reference_attention_backward(const AttentionArgs& a,
                                         float* lse_ref,
                                         float* delta_ref,
                                         float* dq_ref,
                                         float* dk_ref,
                                         float* dv_ref,
                                         cudaStream_t stream) {
  if (!valid(a)) {
    return cudaErrorInvalidValue;
  }
  const dim3 rows((a.q_len + kThreads - 1) / kThreads, a.heads);
  reference_backward_rows_kernel<<<rows, kThreads, 0, stream>>>(a, lse_ref, delta_ref, dq_ref);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    return e;
  }
  const dim3 cols((a.kv_len + kThreads - 1) / kThreads, a.heads);
  reference_backward_cols_kernel<<<cols, kThreads, 0, stream>>>(a, lse_ref, delta_ref, dk_ref,
                                                                dv_ref);
  return cudaGetLastError();
}

}  // namespace cpsim::calibrate::cuda
