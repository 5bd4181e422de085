// Small calibration kernels: random fill, streaming copy (achieved HBM bandwidth), empty kernel
// (launch overhead), clock spin (measured SM clock).
#include <cstdint>

#include "kernels.hpp"

namespace cpsim::calibrate::cuda {
namespace {

__device__ __forceinline__ std::uint64_t mix64(std::uint64_t x) {
  // splitmix64 finaliser
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

__global__ void fill_uniform_bf16_kernel(__nv_bfloat16* data,
                                         std::size_t count,
                                         std::uint64_t seed,
                                         float scale) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const std::uint64_t h = mix64(seed * 0x100000001B3ULL + i);
    const float unit = static_cast<float>(h >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    data[i] = __float2bfloat16((2.0f * unit - 1.0f) * scale);
  }
}

__global__ void copy_kernel_impl(const int4* __restrict__ src,
                                 int4* __restrict__ dst,
                                 std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = src[i];
  }
}

__global__ void empty_kernel_impl() {}

__global__ void spin_kernel_impl(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

int grid_for(std::size_t count, int threads) {
  int device = 0;
  int sms = 132;
  if (cudaGetDevice(&device) == cudaSuccess) {
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  }
  const std::size_t blocks = (count + threads - 1) / threads;
  const std::size_t cap = static_cast<std::size_t>(sms) * 16;
  return static_cast<int>(blocks < cap ? (blocks == 0 ? 1 : blocks) : cap);
}

}  // namespace

cudaError_t fill_uniform_bf16(
    __nv_bfloat16* data, std::size_t count, std::uint64_t seed, float scale, cudaStream_t stream) {
  constexpr int kThreads = 256;
  fill_uniform_bf16_kernel<<<grid_for(count, kThreads), kThreads, 0, stream>>>(data, count, seed,
                                                                               scale);
  return cudaGetLastError();
}

cudaError_t copy_kernel(const void* src, void* dst, std::size_t bytes, cudaStream_t stream) {
  constexpr int kThreads = 512;
  const std::size_t count = bytes / sizeof(int4);
  copy_kernel_impl<<<grid_for(count, kThreads), kThreads, 0, stream>>>(
      static_cast<const int4*>(src), static_cast<int4*>(dst), count);
  return cudaGetLastError();
}

cudaError_t empty_kernel(cudaStream_t stream) {
  empty_kernel_impl<<<1, 1, 0, stream>>>();
  return cudaGetLastError();
}

cudaError_t spin_kernel(long long cycles, cudaStream_t stream) {
  spin_kernel_impl<<<1, 32, 0, stream>>>(cycles);
  return cudaGetLastError();
}

}  // namespace cpsim::calibrate::cuda
