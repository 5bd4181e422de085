// GPU test: the cpsim-flash kernel (forward and backward) against the naive fp32 reference on
// small shapes, causal (bottom-right aligned, incl. fully masked rows) and not, head_dim 64 and
// 128. Skipped without a CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <cuda_runtime_api.h>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels.hpp"

namespace cpsim::calibrate::cuda {
namespace {

bool has_device() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return count > 0;
}

#define CPSIM_SKIP_WITHOUT_DEVICE()               \
  do {                                            \
    if (!has_device()) {                          \
      GTEST_SKIP() << "no CUDA device available"; \
    }                                             \
  } while (false)

#define ASSERT_CUDA(call)                                                                      \
  do {                                                                                         \
    const cudaError_t cpsim_status_ = (call);                                                  \
    ASSERT_EQ(cpsim_status_, cudaSuccess) << #call << ": " << cudaGetErrorName(cpsim_status_); \
  } while (false)

/// A device allocation freed at scope exit.
template <typename T>
class Device {
 public:
  explicit Device(std::size_t count) : count_(count) {
    void* p = nullptr;
    if (cudaMalloc(&p, count * sizeof(T)) == cudaSuccess) {
      ptr_ = static_cast<T*>(p);
    }
  }
  ~Device() { (void)cudaFree(ptr_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  T* get() const { return ptr_; }
  bool ok() const { return ptr_ != nullptr; }
  std::vector<T> to_host() const {
    std::vector<T> out(count_);
    if (cudaMemcpy(out.data(), ptr_, count_ * sizeof(T), cudaMemcpyDeviceToHost) != cudaSuccess) {
      out.clear();
    }
    return out;
  }

 private:
  T* ptr_ = nullptr;
  std::size_t count_;
};

float bf16_to_float(__nv_bfloat16 v) {
  std::uint16_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  float f = 0.0f;
  std::memcpy(&f, &wide, sizeof(f));
  return f;
}

struct Case {
  int head_dim;
  int heads;
  int q_len;
  int kv_len;
  bool causal;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << "head_dim " << c.head_dim << ", " << c.heads << " heads, q_len " << c.q_len << ", kv_len "
      << c.kv_len << (c.causal ? ", causal" : ", full");
}

std::string name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::ostringstream out;
  out << "d" << c.head_dim << "_h" << c.heads << "_q" << c.q_len << "_kv" << c.kv_len
      << (c.causal ? "_causal" : "_full");
  return out.str();
}

/// max |got - want| over the elements; both -inf counts as equal.
template <typename Got>
double max_abs_error(const std::vector<Got>& got,
                     const std::vector<float>& want,
                     float (*to_float)(Got)) {
  double err = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const float g = to_float(got[i]);
    if (std::isinf(want[i]) && std::isinf(g) && (want[i] < 0) == (g < 0)) {
      continue;
    }
    err = std::max(err, static_cast<double>(std::abs(g - want[i])));
  }
  return err;
}

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (const float x : v) {
    if (std::isfinite(x)) {
      m = std::max(m, static_cast<double>(std::abs(x)));
    }
  }
  return m;
}

float identity(float x) {
  return x;
}

class FlashVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(FlashVsReference, ForwardAndBackwardMatch) {
  CPSIM_SKIP_WITHOUT_DEVICE();
  const Case c = GetParam();
  const std::size_t q_elems = static_cast<std::size_t>(c.heads) * c.q_len * c.head_dim;
  const std::size_t kv_elems = static_cast<std::size_t>(c.heads) * c.kv_len * c.head_dim;
  const std::size_t q_rows = static_cast<std::size_t>(c.heads) * c.q_len;
  Device<__nv_bfloat16> q(q_elems), k(kv_elems), v(kv_elems), o(q_elems), d_o(q_elems), dq(q_elems),
      dk(kv_elems), dv(kv_elems);
  Device<float> lse(q_rows), dq_accum(q_elems), delta(q_rows);
  Device<float> o_ref(q_elems), lse_ref(q_rows), lse_ref2(q_rows), delta_ref(q_rows),
      dq_ref(q_elems), dk_ref(kv_elems), dv_ref(kv_elems);
  for (const bool ok : {q.ok(), k.ok(), v.ok(), o.ok(), d_o.ok(), dq.ok(), dk.ok(), dv.ok(),
                        lse.ok(), dq_accum.ok(), delta.ok(), o_ref.ok(), lse_ref.ok(),
                        lse_ref2.ok(), delta_ref.ok(), dq_ref.ok(), dk_ref.ok(), dv_ref.ok()}) {
    ASSERT_TRUE(ok) << "cudaMalloc failed";
  }
  ASSERT_CUDA(fill_uniform_bf16(q.get(), q_elems, 1, 2.0f, nullptr));
  ASSERT_CUDA(fill_uniform_bf16(k.get(), kv_elems, 2, 2.0f, nullptr));
  ASSERT_CUDA(fill_uniform_bf16(v.get(), kv_elems, 3, 1.0f, nullptr));
  ASSERT_CUDA(fill_uniform_bf16(d_o.get(), q_elems, 4, 1.0f, nullptr));

  AttentionArgs a;
  a.q = q.get();
  a.k = k.get();
  a.v = v.get();
  a.o = o.get();
  a.lse = lse.get();
  a.d_o = d_o.get();
  a.dq = dq.get();
  a.dk = dk.get();
  a.dv = dv.get();
  a.dq_accum = dq_accum.get();
  a.delta = delta.get();
  a.heads = c.heads;
  a.q_len = c.q_len;
  a.kv_len = c.kv_len;
  a.head_dim = c.head_dim;
  a.causal = c.causal;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  ASSERT_TRUE(flash_attention_supported(c.head_dim, c.q_len, c.kv_len));
  ASSERT_CUDA(flash_attention_prepare());
  ASSERT_CUDA(flash_attention_forward(a, nullptr));
  ASSERT_CUDA(flash_attention_backward(a, nullptr));
  ASSERT_CUDA(reference_attention_forward(a, o_ref.get(), lse_ref.get(), nullptr));
  ASSERT_CUDA(reference_attention_backward(a, lse_ref2.get(), delta_ref.get(), dq_ref.get(),
                                           dk_ref.get(), dv_ref.get(), nullptr));
  ASSERT_CUDA(cudaDeviceSynchronize());

  const std::vector<float> want_o = o_ref.to_host();
  const std::vector<float> want_lse = lse_ref.to_host();
  const std::vector<float> want_dq = dq_ref.to_host();
  const std::vector<float> want_dk = dk_ref.to_host();
  const std::vector<float> want_dv = dv_ref.to_host();
  ASSERT_EQ(want_o.size(), q_elems);

  // bf16 outputs (8 significant bits) against fp32: absolute error relative to the magnitude.
  const double o_err = max_abs_error(o.to_host(), want_o, &bf16_to_float);
  EXPECT_LE(o_err, 1e-2 + 1e-2 * max_abs(want_o)) << "O";
  const double lse_err = max_abs_error(lse.to_host(), want_lse, &identity);
  EXPECT_LE(lse_err, 2e-3 + 1e-3 * max_abs(want_lse)) << "LSE";
  const double dq_err = max_abs_error(dq.to_host(), want_dq, &bf16_to_float);
  EXPECT_LE(dq_err, 1e-2 + 3e-2 * max_abs(want_dq)) << "dQ, max |dQ| " << max_abs(want_dq);
  const double dk_err = max_abs_error(dk.to_host(), want_dk, &bf16_to_float);
  EXPECT_LE(dk_err, 1e-2 + 3e-2 * max_abs(want_dk)) << "dK, max |dK| " << max_abs(want_dk);
  const double dv_err = max_abs_error(dv.to_host(), want_dv, &bf16_to_float);
  EXPECT_LE(dv_err, 1e-2 + 3e-2 * max_abs(want_dv)) << "dV, max |dV| " << max_abs(want_dv);

  // The reference's own two LSE computations agree (a sanity check of the harness).
  const std::vector<float> lse2 = lse_ref2.to_host();
  EXPECT_LE(max_abs_error(lse2, want_lse, &identity), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Shapes,
                         FlashVsReference,
                         ::testing::Values(Case{128, 2, 128, 128, false},
                                           Case{128, 2, 128, 128, true},
                                           Case{64, 3, 192, 192, false},
                                           Case{64, 3, 192, 192, true},
                                           Case{128, 1, 64, 256, true},   // FPDT-like: q < kv
                                           Case{128, 1, 256, 64, true},   // fully masked rows
                                           Case{64, 2, 128, 320, false},  // ring step, q != kv
                                           Case{128, 4, 512, 512, true}),
                         name);

TEST(FlashShapes, SupportedShapes) {
  EXPECT_TRUE(flash_attention_supported(128, 1024, 4096));
  EXPECT_TRUE(flash_attention_supported(64, 64, 64));
  EXPECT_FALSE(flash_attention_supported(96, 1024, 1024));
  EXPECT_FALSE(flash_attention_supported(128, 1000, 1024));
  EXPECT_FALSE(flash_attention_supported(128, 1024, 0));
}

}  // namespace
}  // namespace cpsim::calibrate::cuda
