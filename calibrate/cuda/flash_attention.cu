// Launch wrappers of the cpsim-flash kernels (flash_attention.cuh).
#include <algorithm>
#include <cstddef>

#include "flash_attention.cuh"
#include "kernels.hpp"

namespace cpsim::calibrate::cuda {
namespace {

using namespace flash;  // NOLINT(google-build-using-namespace): the kernels and their layout

template <int D>
cudaError_t forward(const AttentionArgs& a, cudaStream_t stream) {
  const dim3 grid(a.q_len / kBlockM, a.heads);
  flash_forward_kernel<D><<<grid, kThreads, Layout<D>::kFwdBytes, stream>>>(a);
  return cudaGetLastError();
}

template <int D>
cudaError_t backward(const AttentionArgs& a, cudaStream_t stream) {
  const std::size_t rows = static_cast<std::size_t>(a.heads) * a.q_len;
  cudaError_t e = cudaMemsetAsync(a.dq_accum, 0, rows * D * sizeof(float), stream);
  if (e != cudaSuccess) {
    return e;
  }
  flash_backward_delta_kernel<D>
      <<<static_cast<unsigned>((rows + kWarps - 1) / kWarps), kThreads, 0, stream>>>(a);
  if ((e = cudaGetLastError()) != cudaSuccess) {
    return e;
  }
  const dim3 grid(a.kv_len / kBlockN, a.heads);
  flash_backward_kernel<D><<<grid, kThreads, Layout<D>::kBwdBytes, stream>>>(a);
  if ((e = cudaGetLastError()) != cudaSuccess) {
    return e;
  }
  const std::size_t count = rows * D;
  const auto blocks = static_cast<unsigned>(std::min<std::size_t>((count + 255) / 256, 4096));
  convert_dq_kernel<<<blocks, 256, 0, stream>>>(a.dq_accum, a.dq, count);
  return cudaGetLastError();
}

}  // namespace

bool flash_attention_supported(int head_dim, int q_len, int kv_len) {
  return (head_dim == 64 || head_dim == 128) && q_len > 0 && kv_len > 0 && q_len % kBlockM == 0 &&
         kv_len % kBlockN == 0;
}

cudaError_t flash_attention_prepare() {
  cudaError_t e = cudaFuncSetAttribute(
      flash_forward_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<64>::kFwdBytes);
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(flash_forward_kernel<128>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Layout<128>::kFwdBytes);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(flash_backward_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             Layout<64>::kBwdBytes);
  }
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(flash_backward_kernel<128>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, Layout<128>::kBwdBytes);
  }
  return e;
}

cudaError_t flash_attention_forward(const AttentionArgs& a, cudaStream_t stream) {
  if (!flash_attention_supported(a.head_dim, a.q_len, a.kv_len) || a.heads <= 0) {
    return cudaErrorInvalidValue;
  }
  return a.head_dim == 64 ? forward<64>(a, stream) : forward<128>(a, stream);
}

cudaError_t flash_attention_backward(const AttentionArgs& a, cudaStream_t stream) {
  if (!flash_attention_supported(a.head_dim, a.q_len, a.kv_len) || a.heads <= 0) {
    return cudaErrorInvalidValue;
  }
  return a.head_dim == 64 ? backward<64>(a, stream) : backward<128>(a, stream);
}

}  // namespace cpsim::calibrate::cuda
