#pragma once
// Naive reference attention (fp32 accumulation, one thread per query or key row), the yardstick
// of the flash kernel in the GPU tests. Same layout and mask convention as kernels.hpp.
#include <cmath>
#include <cstdint>

#include "kernels.hpp"

namespace cpsim::calibrate::cuda::reference {

using bf16 = __nv_bfloat16;
constexpr int kMaxHeadDim = 128;

__device__ __forceinline__ float dot(const bf16* x, const bf16* y, int d) {
  float s = 0.0f;
  for (int c = 0; c < d; ++c) {
    s += __bfloat162float(x[c]) * __bfloat162float(y[c]);
  }
  return s;
}

__device__ __forceinline__ bool visible(const AttentionArgs& a, int i, int j) {
  return !a.causal || j <= i + (a.kv_len - a.q_len);
}

/// Row max and log-sum-exp of the scaled scores of query row `q` (over visible keys).
__device__ float row_lse(const AttentionArgs& a, const bf16* q, const bf16* k, int i) {
  const int d = a.head_dim;
  float m = -INFINITY;
  for (int j = 0; j < a.kv_len; ++j) {
    if (visible(a, i, j)) {
      m = fmaxf(m, dot(q, k + static_cast<std::size_t>(j) * d, d) * a.scale);
    }
  }
  if (m == -INFINITY) {
    return -INFINITY;
  }
  float l = 0.0f;
  for (int j = 0; j < a.kv_len; ++j) {
    if (visible(a, i, j)) {
      l += expf(dot(q, k + static_cast<std::size_t>(j) * d, d) * a.scale - m);
    }
  }
  return m + logf(l);
}

__global__ void reference_forward_kernel(AttentionArgs a, float* o_ref, float* lse_ref) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;
  if (i >= a.q_len) {
    return;
  }
  const int d = a.head_dim;
  const bf16* q = a.q + (static_cast<std::size_t>(h) * a.q_len + i) * d;
  const bf16* k = a.k + static_cast<std::size_t>(h) * a.kv_len * d;
  const bf16* v = a.v + static_cast<std::size_t>(h) * a.kv_len * d;
  const float lse = row_lse(a, q, k, i);
  float o[kMaxHeadDim];
  for (int c = 0; c < d; ++c) {
    o[c] = 0.0f;
  }
  if (lse != -INFINITY) {
    for (int j = 0; j < a.kv_len; ++j) {
      if (visible(a, i, j)) {
        const float p = expf(dot(q, k + static_cast<std::size_t>(j) * d, d) * a.scale - lse);
        for (int c = 0; c < d; ++c) {
          o[c] += p * __bfloat162float(v[static_cast<std::size_t>(j) * d + c]);
        }
      }
    }
  }
  float* out = o_ref + (static_cast<std::size_t>(h) * a.q_len + i) * d;
  for (int c = 0; c < d; ++c) {
    out[c] = o[c];
  }
  lse_ref[static_cast<std::size_t>(h) * a.q_len + i] = lse;
}

/// Per query row: LSE, delta = rowsum(dO * O) with O recomputed in fp32, and dQ.
__global__ void reference_backward_rows_kernel(AttentionArgs a,
                                               float* lse_ref,
                                               float* delta_ref,
                                               float* dq_ref) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;
  if (i >= a.q_len) {
    return;
  }
  const int d = a.head_dim;
  const std::size_t row = static_cast<std::size_t>(h) * a.q_len + i;
  const bf16* q = a.q + row * d;
  const bf16* d_o = a.d_o + row * d;
  const bf16* k = a.k + static_cast<std::size_t>(h) * a.kv_len * d;
  const bf16* v = a.v + static_cast<std::size_t>(h) * a.kv_len * d;
  const float lse = row_lse(a, q, k, i);
  float delta = 0.0f;
  float acc[kMaxHeadDim];
  for (int c = 0; c < d; ++c) {
    acc[c] = 0.0f;
  }
  if (lse != -INFINITY) {
    // delta = sum_j P_ij dP_ij with dP_ij = dO_i . v_j (equals rowsum(dO * O)).
    for (int j = 0; j < a.kv_len; ++j) {
      if (visible(a, i, j)) {
        const float p = expf(dot(q, k + static_cast<std::size_t>(j) * d, d) * a.scale - lse);
        delta += p * dot(d_o, v + static_cast<std::size_t>(j) * d, d);
      }
    }
    for (int j = 0; j < a.kv_len; ++j) {
      if (visible(a, i, j)) {
        const float p = expf(dot(q, k + static_cast<std::size_t>(j) * d, d) * a.scale - lse);
        const float ds = p * (dot(d_o, v + static_cast<std::size_t>(j) * d, d) - delta);
        for (int c = 0; c < d; ++c) {
          acc[c] += ds * __bfloat162float(k[static_cast<std::size_t>(j) * d + c]);
        }
      }
    }
  }
  for (int c = 0; c < d; ++c) {
    dq_ref[row * d + c] = acc[c] * a.scale;
  }
  lse_ref[row] = lse;
  delta_ref[row] = delta;
}

/// Per key row: dK and dV from the LSE and delta of every query row.
__global__ void reference_backward_cols_kernel(
    AttentionArgs a, const float* lse_ref, const float* delta_ref, float* dk_ref, float* dv_ref) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  const int h = blockIdx.y;
  if (j >= a.kv_len) {
    return;
  }
  const int d = a.head_dim;
  const std::size_t key = static_cast<std::size_t>(h) * a.kv_len + j;
  const bf16* k = a.k + key * d;
  const bf16* v = a.v + key * d;
  float dk[kMaxHeadDim];
  float dv[kMaxHeadDim];
  for (int c = 0; c < d; ++c) {
    dk[c] = 0.0f;
    dv[c] = 0.0f;
  }
  for (int i = 0; i < a.q_len; ++i) {
    const std::size_t row = static_cast<std::size_t>(h) * a.q_len + i;
    const float lse = lse_ref[row];
    if (lse == -INFINITY || !visible(a, i, j)) {
      continue;
    }
    const bf16* q = a.q + row * d;
    const bf16* d_o = a.d_o + row * d;
    const float p = expf(dot(q, k, d) * a.scale - lse);
    const float ds = p * (dot(d_o, v, d) - delta_ref[row]);
    for (int c = 0; c < d; ++c) {
      dv[c] += p * __bfloat162float(d_o[c]);
      dk[c] += ds * __bfloat162float(q[c]);
    }
  }
  for (int c = 0; c < d; ++c) {
    dk_ref[key * d + c] = dk[c] * a.scale;
    dv_ref[key * d + c] = dv[c];
  }
}

}  // namespace cpsim::calibrate::cuda::reference
