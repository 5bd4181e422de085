#pragma once
// A CPU emulation of the CUDA features the calibration kernels use, so that the kernels of
// calibrate/cuda/*.cuh run as plain C++ in CI, where there is no GPU: one OS thread per CUDA
// thread, std::barrier for __syncthreads/__syncwarp, a shared exchange for warp shuffles, and
// nvcuda::wmma fragments as whole 16x16 matrices with the load/store/mma semantics of the CUDA
// programming guide (every wmma call waits for the whole warp, as the *_sync functions do).
// It checks the kernels' arithmetic, indexing, masks and tile ranges; it says nothing about
// their speed, and it cannot catch a race that real hardware would expose.

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
#define CPSIM_DYNAMIC_SHARED_MEMORY(name) unsigned char* name = ::cpsim_emulation::shared_memory

struct Dim3Emulation {
  unsigned x = 0;
  unsigned y = 0;
  unsigned z = 0;
};
inline thread_local Dim3Emulation threadIdx;
inline thread_local Dim3Emulation blockIdx;
inline Dim3Emulation blockDim{128, 1, 1};
inline Dim3Emulation gridDim{1, 1, 1};

using cudaError_t = int;
inline constexpr cudaError_t cudaSuccess = 0;
inline constexpr cudaError_t cudaErrorInvalidValue = 1;
using cudaStream_t = void*;

struct int4 {
  int x, y, z, w;
};

struct __nv_bfloat16 {
  std::uint16_t bits;
};
struct __nv_bfloat162 {
  __nv_bfloat16 x, y;
};

inline float __bfloat162float(__nv_bfloat16 v) {
  const std::uint32_t wide = static_cast<std::uint32_t>(v.bits) << 16;
  float f = 0.0f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

/// Round to nearest even, as __float2bfloat16 does.
inline __nv_bfloat16 __float2bfloat16(float f) {
  if (std::isnan(f)) {
    return {0x7fc0};
  }
  std::uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<std::uint16_t>(u >> 16)};
}

inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__float2bfloat16(a), __float2bfloat16(b)};
}

inline int min(int a, int b) {
  return a < b ? a : b;
}
inline int max(int a, int b) {
  return a > b ? a : b;
}

namespace cpsim_emulation {

inline constexpr int kThreadsPerBlock = 128;
inline constexpr int kWarps = kThreadsPerBlock / 32;

struct Block {
  std::barrier<> all{kThreadsPerBlock};
  std::vector<std::unique_ptr<std::barrier<>>> warps;
  float exchange[kThreadsPerBlock] = {};
  Block() {
    for (int w = 0; w < kWarps; ++w) {
      warps.push_back(std::make_unique<std::barrier<>>(32));
    }
  }
};

inline thread_local Block* block = nullptr;
inline thread_local unsigned char* shared_memory = nullptr;

inline int lane() {
  return static_cast<int>(threadIdx.x % 32);
}

/// Runs `body` as a CUDA grid of `grid` blocks of 128 threads, one block at a time, with
/// `shared_bytes` of (garbage-filled) dynamic shared memory.
template <typename F>
void launch(Dim3Emulation grid, std::size_t shared_bytes, F&& body) {
  std::vector<unsigned char> storage(shared_bytes + 256);
  auto* aligned = reinterpret_cast<unsigned char*>(
      (reinterpret_cast<std::uintptr_t>(storage.data()) + 255) & ~std::uintptr_t{255});
  gridDim = grid;
  blockDim = {kThreadsPerBlock, 1, 1};
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      std::fill(storage.begin(), storage.end(), static_cast<unsigned char>(0xCD));
      Block b;
      std::vector<std::thread> threads;
      threads.reserve(kThreadsPerBlock);
      for (unsigned t = 0; t < kThreadsPerBlock; ++t) {
        threads.emplace_back([&, t] {
          threadIdx = {t, 0, 0};
          blockIdx = {bx, by, 0};
          block = &b;
          shared_memory = aligned;
          body();
        });
      }
      for (std::thread& th : threads) {
        th.join();
      }
    }
  }
}

/// Runs `body` for every thread of `grid` x `threads` one after the other (kernels without
/// barriers or shuffles).
template <typename F>
void launch_serial(Dim3Emulation grid, unsigned threads, F&& body) {
  gridDim = grid;
  blockDim = {threads, 1, 1};
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      for (unsigned t = 0; t < threads; ++t) {
        threadIdx = {t, 0, 0};
        blockIdx = {bx, by, 0};
        body();
      }
    }
  }
  blockDim = {kThreadsPerBlock, 1, 1};
}

}  // namespace cpsim_emulation

inline void __syncthreads() {
  cpsim_emulation::block->all.arrive_and_wait();
}

inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
  cpsim_emulation::block->warps[threadIdx.x / 32]->arrive_and_wait();
}

inline float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask) {
  float* exchange = cpsim_emulation::block->exchange;
  exchange[threadIdx.x] = value;
  __syncwarp();
  const float other = exchange[(threadIdx.x / 32) * 32 +
                               static_cast<unsigned>(cpsim_emulation::lane() ^ lane_mask)];
  __syncwarp();
  return other;
}

inline float atomicAdd(float* address, float value) {
  return std::atomic_ref<float>(*address).fetch_add(value);
}

namespace nvcuda::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

/// The whole 16x16 tile in every lane: a[m][k], b[k][n], c[m][n].
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  float v[16][16];
};

using Accumulator = fragment<accumulator, 16, 16, 16, float>;

template <typename Use, int M, int N, int K, typename T, typename L>
void fill_fragment(fragment<Use, M, N, K, T, L>& f, float value) {
  for (auto& row : f.v) {
    std::fill(std::begin(row), std::end(row), value);
  }
}

template <typename L>
void load_matrix_sync(fragment<matrix_a, 16, 16, 16, __nv_bfloat16, L>& f,
                      const __nv_bfloat16* p,
                      unsigned ld) {
  __syncwarp();
  for (unsigned m = 0; m < 16; ++m) {
    for (unsigned k = 0; k < 16; ++k) {
      f.v[m][k] = __bfloat162float(std::is_same_v<L, row_major> ? p[m * ld + k] : p[m + k * ld]);
    }
  }
  __syncwarp();
}

template <typename L>
void load_matrix_sync(fragment<matrix_b, 16, 16, 16, __nv_bfloat16, L>& f,
                      const __nv_bfloat16* p,
                      unsigned ld) {
  __syncwarp();
  for (unsigned k = 0; k < 16; ++k) {
    for (unsigned n = 0; n < 16; ++n) {
      f.v[k][n] = __bfloat162float(std::is_same_v<L, row_major> ? p[k * ld + n] : p[k + n * ld]);
    }
  }
  __syncwarp();
}

inline void load_matrix_sync(Accumulator& f, const float* p, unsigned ld, layout_t layout) {
  __syncwarp();
  for (unsigned m = 0; m < 16; ++m) {
    for (unsigned n = 0; n < 16; ++n) {
      f.v[m][n] = layout == mem_row_major ? p[m * ld + n] : p[m + n * ld];
    }
  }
  __syncwarp();
}

inline void store_matrix_sync(float* p, const Accumulator& f, unsigned ld, layout_t layout) {
  __syncwarp();
  if (cpsim_emulation::lane() == 0) {
    for (unsigned m = 0; m < 16; ++m) {
      for (unsigned n = 0; n < 16; ++n) {
        (layout == mem_row_major ? p[m * ld + n] : p[m + n * ld]) = f.v[m][n];
      }
    }
  }
  __syncwarp();
}

/// d = a b + c in fp32. Only lane 0 computes: only lane 0 stores (for speed).
template <typename LA, typename LB>
void mma_sync(Accumulator& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const Accumulator& c) {
  if (cpsim_emulation::lane() != 0) {
    return;
  }
  float t[16][16];
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 16; ++n) {
      float s = c.v[m][n];
      for (int k = 0; k < 16; ++k) {
        s += a.v[m][k] * b.v[k][n];
      }
      t[m][n] = s;
    }
  }
  std::memcpy(d.v, t, sizeof(t));
}

}  // namespace nvcuda::wmma
