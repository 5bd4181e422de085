#pragma once
// cpsim-flash: a FlashAttention-2 style kernel of our own (forward and backward), bf16 inputs,
// tensor cores through nvcuda::wmma (16x16x16 bf16 MMA, fp32 accumulate), online softmax, causal
// mask aligned bottom-right, LSE output; the backward recomputes P from Q, K and the LSE and
// produces dQ (fp32 atomics, then bf16), dK and dV.
//
// It is written for clarity and correctness first (S, P and O staged through shared memory, no
// asynchronous copies or warp specialisation), so it runs well below FA3; `cpsim calibrate`
// records its throughput against the published FA3 curve as an explicit kernel-efficiency ratio.
// Only head_dim 64 and 128 are instantiated (compile time); lengths must be multiples of 64.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <mma.h>

#include "kernels.hpp"

// The kernels (device code only). flash_attention.cu launches them; the CPU emulation test
// (tests/calibrate/emulation) includes this header with its own definitions of the CUDA built-ins.
#ifndef CPSIM_DYNAMIC_SHARED_MEMORY
#define CPSIM_DYNAMIC_SHARED_MEMORY(name) extern __shared__ __align__(128) unsigned char name[]
#endif

namespace cpsim::calibrate::cuda::flash {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kBlockM = kFlashBlockM;  // query rows per tile (16 per warp)
constexpr int kBlockN = kFlashBlockN;  // key rows per tile
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

static_assert(kBlockM == 16 * kWarps, "each warp owns 16 rows of a tile");
static_assert(kBlockN == 64, "the softmax lanes split a 64-wide tile row in two halves");

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

/// Shared-memory layout. Leading dimensions are padded against bank conflicts and keep every
/// 16-row / 16-column fragment pointer 32-byte aligned, as WMMA requires.
template <int D>
struct Layout {
  static constexpr int kLdT = D + 8;        // bf16 tiles of head_dim columns (Q, K, V, dO)
  static constexpr int kLdS = kBlockN + 4;  // fp32 score tile
  static constexpr int kLdP = kBlockN + 8;  // bf16 probability tile
  static constexpr int kLdO = D + 4;        // fp32 output accumulator
  static constexpr int kTileBytes = kBlockM * kLdT * 2;
  static constexpr int kScoreBytes = kBlockM * kLdS * 4;
  static constexpr int kProbBytes = kBlockM * kLdP * 2;
  static constexpr int kOutBytes = kBlockM * kLdO * 4;
  static constexpr int kScratchBytes = kWarps * 16 * 16 * 4;
  static constexpr int kRowBytes = kBlockM * 4;
  // forward: Q, K, V tiles, S, P, O
  static constexpr int kFwdBytes = 3 * kTileBytes + kScoreBytes + kProbBytes + kOutBytes;
  // backward: K, V, Q, dO tiles, S/dP, P, dS, per-warp scratch, LSE and delta rows
  static constexpr int kBwdBytes =
      4 * kTileBytes + kScoreBytes + 2 * kProbBytes + kScratchBytes + 2 * kRowBytes;
  static_assert(kTileBytes % 32 == 0 && kScoreBytes % 32 == 0 && kProbBytes % 32 == 0 &&
                    kOutBytes % 32 == 0 && kScratchBytes % 32 == 0 && kRowBytes % 32 == 0,
                "every shared region starts 32-byte aligned");
  static_assert((16 * kLdT * 2) % 32 == 0 && (16 * kLdS * 4) % 32 == 0 &&
                    (16 * kLdP * 2) % 32 == 0 && (16 * kLdO * 4) % 32 == 0,
                "fragment row offsets are 32-byte aligned");
  static_assert(kLdT % 8 == 0 && kLdP % 8 == 0 && kLdS % 4 == 0 && kLdO % 4 == 0,
                "WMMA leading dimensions");
};

/// Copies `rows` rows of `D` bf16 from global (row stride D) into shared memory (row stride
/// `ld`), 16 bytes per thread and step.
template <int D>
__device__ __forceinline__ void load_tile(bf16* __restrict__ dst,
                                          int ld,
                                          const bf16* __restrict__ src,
                                          int rows) {
  constexpr int kChunks = D / 8;  // int4 per row
  for (int c = threadIdx.x; c < rows * kChunks; c += kThreads) {
    const int r = c / kChunks;
    const int col = (c % kChunks) * 8;
    *reinterpret_cast<int4*>(dst + r * ld + col) =
        *reinterpret_cast<const int4*>(src + static_cast<std::size_t>(r) * D + col);
  }
}

// ---------------------------------------------------------------------------------------------
// Forward

template <int D>
__global__ void __launch_bounds__(kThreads, 2) flash_forward_kernel(AttentionArgs a) {
  using L = Layout<D>;
  CPSIM_DYNAMIC_SHARED_MEMORY(smem);
  bf16* s_q = reinterpret_cast<bf16*>(smem);
  bf16* s_k = s_q + kBlockM * L::kLdT;
  bf16* s_v = s_k + kBlockN * L::kLdT;
  float* s_s = reinterpret_cast<float*>(s_v + kBlockN * L::kLdT);
  bf16* s_p = reinterpret_cast<bf16*>(s_s + kBlockM * L::kLdS);
  float* s_o = reinterpret_cast<float*>(s_p + kBlockM * L::kLdP);

  const int head = blockIdx.y;
  const int q0 = blockIdx.x * kBlockM;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const bf16* g_q = a.q + (static_cast<std::size_t>(head) * a.q_len + q0) * D;
  const bf16* g_k = a.k + static_cast<std::size_t>(head) * a.kv_len * D;
  const bf16* g_v = a.v + static_cast<std::size_t>(head) * a.kv_len * D;
  const int offset = a.kv_len - a.q_len;  // bottom-right alignment of the causal mask

  int tiles = a.kv_len / kBlockN;
  if (a.causal) {
    const int last_key = q0 + kBlockM - 1 + offset;  // last key the block's last row sees
    tiles = last_key < 0 ? 0 : min(tiles, last_key / kBlockN + 1);
  }

  load_tile<D>(s_q, L::kLdT, g_q, kBlockM);
  for (int i = threadIdx.x; i < kBlockM * L::kLdO; i += kThreads) {
    s_o[i] = 0.0f;
  }

  // Softmax state: lane pair (2r, 2r+1) of warp w owns tile row 16w + r, one half each.
  const int row = warp * 16 + lane / 2;
  const int half = lane % 2;
  const int q_idx = q0 + row;
  const int last_visible = a.causal ? q_idx + offset : a.kv_len - 1;
  const float scale_log2 = a.scale * kLog2e;
  float m_i = -INFINITY;  // running max of scaled scores, log2 domain
  float l_i = 0.0f;       // running softmax denominator
  __syncthreads();

  for (int t = 0; t < tiles; ++t) {
    const int k0 = t * kBlockN;
    load_tile<D>(s_k, L::kLdT, g_k + static_cast<std::size_t>(k0) * D, kBlockN);
    load_tile<D>(s_v, L::kLdT, g_v + static_cast<std::size_t>(k0) * D, kBlockN);
    __syncthreads();

    // S = Q Kᵀ for this warp's 16 rows.
    for (int j = 0; j < kBlockN / 16; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA fa;
        FragBT fb;
        wmma::load_matrix_sync(fa, s_q + warp * 16 * L::kLdT + kk * 16, L::kLdT);
        wmma::load_matrix_sync(fb, s_k + j * 16 * L::kLdT + kk * 16, L::kLdT);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s_s + warp * 16 * L::kLdS + j * 16, acc, L::kLdS,
                              wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax over this lane's 32 columns.
    const float* s_row = s_s + row * L::kLdS + half * 32;
    bf16* p_row = s_p + row * L::kLdP + half * 32;
    const int key0 = k0 + half * 32;
    float tile_max = -INFINITY;
    for (int c = 0; c < 32; ++c) {
      if (key0 + c <= last_visible) {
        tile_max = fmaxf(tile_max, s_row[c] * scale_log2);
      }
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float m_new = fmaxf(m_i, tile_max);
    float sum = 0.0f;
    float alpha = 1.0f;
    if (m_new == -INFINITY) {
      for (int c = 0; c < 32; ++c) {
        p_row[c] = __float2bfloat16(0.0f);
      }
    } else {
      for (int c = 0; c < 32; ++c) {
        const float p = key0 + c <= last_visible ? exp2f(s_row[c] * scale_log2 - m_new) : 0.0f;
        p_row[c] = __float2bfloat16(p);
        sum += p;
      }
      alpha = exp2f(m_i - m_new);  // 0 when m_i is -inf
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l_i = l_i * alpha + sum;
    m_i = m_new;
    float* o_row = s_o + row * L::kLdO + half * (D / 2);
    for (int c = 0; c < D / 2; ++c) {
      o_row[c] *= alpha;
    }
    __syncwarp();

    // O += P V for this warp's rows.
    for (int j = 0; j < D / 16; ++j) {
      FragC acc;
      wmma::load_matrix_sync(acc, s_o + warp * 16 * L::kLdO + j * 16, L::kLdO, wmma::mem_row_major);
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        FragA fa;
        FragB fb;
        wmma::load_matrix_sync(fa, s_p + warp * 16 * L::kLdP + kk * 16, L::kLdP);
        wmma::load_matrix_sync(fb, s_v + kk * 16 * L::kLdT + j * 16, L::kLdT);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s_o + warp * 16 * L::kLdO + j * 16, acc, L::kLdO,
                              wmma::mem_row_major);
    }
    __syncthreads();  // every warp is done with this K/V tile
  }

  __syncwarp();
  const float inv_l = l_i > 0.0f ? 1.0f / l_i : 0.0f;
  const float* o_row = s_o + row * L::kLdO + half * (D / 2);
  bf16* g_o = a.o + (static_cast<std::size_t>(head) * a.q_len + q_idx) * D + half * (D / 2);
  for (int c = 0; c < D / 2; c += 2) {
    *reinterpret_cast<__nv_bfloat162*>(g_o + c) =
        __floats2bfloat162_rn(o_row[c] * inv_l, o_row[c + 1] * inv_l);
  }
  if (half == 0) {
    a.lse[static_cast<std::size_t>(head) * a.q_len + q_idx] =
        l_i > 0.0f ? (m_i + log2f(l_i)) * kLn2 : -INFINITY;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward

/// delta[h][i] = sum_d dO[h][i][d] * O[h][i][d]; one warp per row.
template <int D>
__global__ void __launch_bounds__(kThreads) flash_backward_delta_kernel(AttentionArgs a) {
  const std::size_t rows = static_cast<std::size_t>(a.heads) * a.q_len;
  const std::size_t r = static_cast<std::size_t>(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (r >= rows) {
    return;
  }
  const int lane = threadIdx.x % 32;
  const bf16* o = a.o + r * D;
  const bf16* d_o = a.d_o + r * D;
  float sum = 0.0f;
  for (int c = lane; c < D; c += 32) {
    sum += __bfloat162float(o[c]) * __bfloat162float(d_o[c]);
  }
  for (int s = 16; s > 0; s /= 2) {
    sum += __shfl_xor_sync(0xffffffffu, sum, s);
  }
  if (lane == 0) {
    a.delta[r] = sum;
  }
}

template <int D>
__global__ void __launch_bounds__(kThreads, 2) flash_backward_kernel(AttentionArgs a) {
  using L = Layout<D>;
  CPSIM_DYNAMIC_SHARED_MEMORY(smem);
  bf16* s_k = reinterpret_cast<bf16*>(smem);
  bf16* s_v = s_k + kBlockN * L::kLdT;
  bf16* s_q = s_v + kBlockN * L::kLdT;
  bf16* s_do = s_q + kBlockM * L::kLdT;
  float* s_s = reinterpret_cast<float*>(s_do + kBlockM * L::kLdT);  // S, then dP
  bf16* s_p = reinterpret_cast<bf16*>(s_s + kBlockM * L::kLdS);
  bf16* s_ds = s_p + kBlockM * L::kLdP;
  float* s_scratch = reinterpret_cast<float*>(s_ds + kBlockM * L::kLdP);
  float* s_lse = s_scratch + kWarps * 256;
  float* s_delta = s_lse + kBlockM;

  const int head = blockIdx.y;
  const int k0 = blockIdx.x * kBlockN;
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const std::size_t q_base = static_cast<std::size_t>(head) * a.q_len;
  const std::size_t k_base = static_cast<std::size_t>(head) * a.kv_len;
  const int offset = a.kv_len - a.q_len;
  float* scratch = s_scratch + warp * 256;

  load_tile<D>(s_k, L::kLdT, a.k + (k_base + k0) * D, kBlockN);
  load_tile<D>(s_v, L::kLdT, a.v + (k_base + k0) * D, kBlockN);

  FragC acc_dk[D / 16];
  FragC acc_dv[D / 16];
  for (int j = 0; j < D / 16; ++j) {
    wmma::fill_fragment(acc_dk[j], 0.0f);
    wmma::fill_fragment(acc_dv[j], 0.0f);
  }

  // Query blocks that see at least one key of this block: i >= k0 - offset when causal.
  const int q_blocks = a.q_len / kBlockM;
  int first = 0;
  if (a.causal) {
    const int first_query = k0 - offset;
    first = first_query >= a.q_len ? q_blocks : max(0, first_query) / kBlockM;
  }
  const int row = warp * 16 + lane / 2;
  const int half = lane % 2;
  const float scale_log2 = a.scale * kLog2e;

  for (int qb = first; qb < q_blocks; ++qb) {
    const int q0 = qb * kBlockM;
    __syncthreads();  // the previous block's tiles are no longer read
    load_tile<D>(s_q, L::kLdT, a.q + (q_base + q0) * D, kBlockM);
    load_tile<D>(s_do, L::kLdT, a.d_o + (q_base + q0) * D, kBlockM);
    if (threadIdx.x < kBlockM) {
      s_lse[threadIdx.x] = a.lse[q_base + q0 + threadIdx.x];
      s_delta[threadIdx.x] = a.delta[q_base + q0 + threadIdx.x];
    }
    __syncthreads();

    // S = Q Kᵀ (this warp's 16 query rows).
    for (int j = 0; j < kBlockN / 16; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA fa;
        FragBT fb;
        wmma::load_matrix_sync(fa, s_q + warp * 16 * L::kLdT + kk * 16, L::kLdT);
        wmma::load_matrix_sync(fb, s_k + j * 16 * L::kLdT + kk * 16, L::kLdT);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s_s + warp * 16 * L::kLdS + j * 16, acc, L::kLdS,
                              wmma::mem_row_major);
    }
    __syncwarp();

    // P = exp(S * scale - LSE), masked.
    const int q_idx = q0 + row;
    const int last_visible = a.causal ? q_idx + offset : a.kv_len - 1;
    const float lse = s_lse[row];
    const float lse_log2 = lse * kLog2e;
    const bool live = lse != -INFINITY;
    {
      const float* s_row = s_s + row * L::kLdS + half * 32;
      bf16* p_row = s_p + row * L::kLdP + half * 32;
      const int key0 = k0 + half * 32;
      for (int c = 0; c < 32; ++c) {
        const float p =
            live && key0 + c <= last_visible ? exp2f(s_row[c] * scale_log2 - lse_log2) : 0.0f;
        p_row[c] = __float2bfloat16(p);
      }
    }
    __syncwarp();

    // dP = dO Vᵀ into the score tile.
    for (int j = 0; j < kBlockN / 16; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA fa;
        FragBT fb;
        wmma::load_matrix_sync(fa, s_do + warp * 16 * L::kLdT + kk * 16, L::kLdT);
        wmma::load_matrix_sync(fb, s_v + j * 16 * L::kLdT + kk * 16, L::kLdT);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(s_s + warp * 16 * L::kLdS + j * 16, acc, L::kLdS,
                              wmma::mem_row_major);
    }
    __syncwarp();

    // dS = P * (dP - delta).
    {
      const float delta = s_delta[row];
      const float* dp_row = s_s + row * L::kLdS + half * 32;
      const bf16* p_row = s_p + row * L::kLdP + half * 32;
      bf16* ds_row = s_ds + row * L::kLdP + half * 32;
      for (int c = 0; c < 32; ++c) {
        ds_row[c] = __float2bfloat16(__bfloat162float(p_row[c]) * (dp_row[c] - delta));
      }
    }
    __syncthreads();  // dV, dK and dQ read every warp's rows of P and dS

    // dV += Pᵀ dO and dK += dSᵀ Q for this warp's 16 key rows.
    for (int j = 0; j < D / 16; ++j) {
      for (int kk = 0; kk < kBlockM / 16; ++kk) {
        FragAT fa;
        FragB fb;
        wmma::load_matrix_sync(fa, s_p + kk * 16 * L::kLdP + warp * 16, L::kLdP);
        wmma::load_matrix_sync(fb, s_do + kk * 16 * L::kLdT + j * 16, L::kLdT);
        wmma::mma_sync(acc_dv[j], fa, fb, acc_dv[j]);
        wmma::load_matrix_sync(fa, s_ds + kk * 16 * L::kLdP + warp * 16, L::kLdP);
        wmma::load_matrix_sync(fb, s_q + kk * 16 * L::kLdT + j * 16, L::kLdT);
        wmma::mma_sync(acc_dk[j], fa, fb, acc_dk[j]);
      }
    }

    // dQ += scale * dS K for this warp's 16 query rows, accumulated in fp32 global memory.
    for (int j = 0; j < D / 16; ++j) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
      for (int kk = 0; kk < kBlockN / 16; ++kk) {
        FragA fa;
        FragB fb;
        wmma::load_matrix_sync(fa, s_ds + warp * 16 * L::kLdP + kk * 16, L::kLdP);
        wmma::load_matrix_sync(fb, s_k + kk * 16 * L::kLdT + j * 16, L::kLdT);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(scratch, acc, 16, wmma::mem_row_major);
      __syncwarp();
      const int r = lane / 2;
      const int c0 = (lane % 2) * 8;
      float* dq = a.dq_accum + (q_base + q0 + warp * 16 + r) * D + j * 16 + c0;
      for (int c = 0; c < 8; ++c) {
        atomicAdd(dq + c, scratch[r * 16 + c0 + c] * a.scale);
      }
      __syncwarp();
    }
  }

  // dK = scale * (dSᵀ Q), dV = Pᵀ dO, written as bf16.
  const int r = lane / 2;
  const int c0 = (lane % 2) * 8;
  for (int j = 0; j < D / 16; ++j) {
    for (int which = 0; which < 2; ++which) {
      wmma::store_matrix_sync(scratch, which == 0 ? acc_dk[j] : acc_dv[j], 16, wmma::mem_row_major);
      __syncwarp();
      const float factor = which == 0 ? a.scale : 1.0f;
      bf16* out = (which == 0 ? a.dk : a.dv) + (k_base + k0 + warp * 16 + r) * D + j * 16 + c0;
      for (int c = 0; c < 8; c += 2) {
        *reinterpret_cast<__nv_bfloat162*>(out + c) = __floats2bfloat162_rn(
            scratch[r * 16 + c0 + c] * factor, scratch[r * 16 + c0 + c + 1] * factor);
      }
      __syncwarp();
    }
  }
}

__global__ void convert_dq_kernel(const float* __restrict__ src,
                                  bf16* __restrict__ dst,
                                  std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = __float2bfloat16(src[i]);
  }
}

}  // namespace cpsim::calibrate::cuda::flash
