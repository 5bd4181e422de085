// The attention kernels of calibrate/cuda (cpsim-flash forward/backward and the naive reference),
// run on the CPU through cuda_emulation.hpp and compared with a double-precision reference. This
// checks the kernels' arithmetic, WMMA operand layouts, masks and tile ranges in CI, where there
// is no GPU; the GPU test (tests/calibrate/gpu) runs the same comparison on a device.
#include <cmath>
#include <cstdint>
#include <ostream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "cuda_emulation.hpp"
#include "flash_attention.cuh"
#include "reference_attention.cuh"

namespace cpsim::calibrate::cuda {
namespace {

using bf16 = __nv_bfloat16;

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

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  std::ostringstream out;
  out << "d" << c.head_dim << "_h" << c.heads << "_q" << c.q_len << "_kv" << c.kv_len
      << (c.causal ? "_causal" : "_full");
  return out.str();
}

float to_float(bf16 v) {
  return __bfloat162float(v);
}

/// Double-precision attention forward and backward (bottom-right aligned causal mask).
struct Expected {
  std::vector<double> o, lse, dq, dk, dv;
};

Expected reference(const Case& c,
                   const std::vector<bf16>& q,
                   const std::vector<bf16>& k,
                   const std::vector<bf16>& v,
                   const std::vector<bf16>& d_o,
                   double scale) {
  const auto d = static_cast<std::size_t>(c.head_dim);
  const std::size_t q_rows = static_cast<std::size_t>(c.heads) * c.q_len;
  const std::size_t k_rows = static_cast<std::size_t>(c.heads) * c.kv_len;
  Expected e{std::vector<double>(q_rows * d, 0.0), std::vector<double>(q_rows, 0.0),
             std::vector<double>(q_rows * d, 0.0), std::vector<double>(k_rows * d, 0.0),
             std::vector<double>(k_rows * d, 0.0)};
  auto dot = [d](const bf16* x, const bf16* y) {
    double s = 0.0;
    for (std::size_t i = 0; i < d; ++i) {
      s += static_cast<double>(to_float(x[i])) * to_float(y[i]);
    }
    return s;
  };
  const int offset = c.kv_len - c.q_len;
  for (int h = 0; h < c.heads; ++h) {
    const std::size_t q0 = static_cast<std::size_t>(h) * c.q_len;
    const std::size_t k0 = static_cast<std::size_t>(h) * c.kv_len;
    for (int i = 0; i < c.q_len; ++i) {
      const std::size_t row = q0 + static_cast<std::size_t>(i);
      const int last = c.causal ? std::min(c.kv_len - 1, i + offset) : c.kv_len - 1;
      if (last < 0) {
        e.lse[row] = -INFINITY;
        continue;
      }
      std::vector<double> s(static_cast<std::size_t>(last + 1));
      double m = -INFINITY;
      for (int j = 0; j <= last; ++j) {
        s[static_cast<std::size_t>(j)] =
            scale * dot(&q[row * d], &k[(k0 + static_cast<std::size_t>(j)) * d]);
        m = std::max(m, s[static_cast<std::size_t>(j)]);
      }
      double l = 0.0;
      for (const double x : s) {
        l += std::exp(x - m);
      }
      e.lse[row] = m + std::log(l);
      std::vector<double> p(s.size());
      for (std::size_t j = 0; j < s.size(); ++j) {
        p[j] = std::exp(s[j] - e.lse[row]);
        for (std::size_t x = 0; x < d; ++x) {
          e.o[row * d + x] += p[j] * to_float(v[(k0 + j) * d + x]);
        }
      }
      double delta = 0.0;
      for (std::size_t x = 0; x < d; ++x) {
        delta += e.o[row * d + x] * to_float(d_o[row * d + x]);
      }
      for (std::size_t j = 0; j < s.size(); ++j) {
        const double ds = p[j] * (dot(&d_o[row * d], &v[(k0 + j) * d]) - delta);
        for (std::size_t x = 0; x < d; ++x) {
          e.dq[row * d + x] += scale * ds * to_float(k[(k0 + j) * d + x]);
          e.dk[(k0 + j) * d + x] += scale * ds * to_float(q[row * d + x]);
          e.dv[(k0 + j) * d + x] += p[j] * to_float(d_o[row * d + x]);
        }
      }
    }
  }
  return e;
}

/// max |got - want| <= abs_tol + rel_tol * max |want|; both -inf counts as equal.
template <typename F>
void expect_close(
    const char* what, const std::vector<double>& want, F&& got, double rel_tol, double abs_tol) {
  double err = 0.0;
  double magnitude = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double g = got(i);
    if (std::isinf(want[i]) && std::isinf(g) && (want[i] < 0) == (g < 0)) {
      continue;
    }
    err = std::max(err, std::abs(g - want[i]));
    magnitude = std::max(magnitude, std::abs(want[i]));
  }
  EXPECT_LE(err, abs_tol + rel_tol * magnitude) << what << ": max |ref| " << magnitude;
}

class KernelEmulation : public ::testing::TestWithParam<Case> {};

TEST_P(KernelEmulation, FlashAndNaiveKernelsMatchADoubleReference) {
  const Case c = GetParam();
  const auto d = static_cast<std::size_t>(c.head_dim);
  const std::size_t q_rows = static_cast<std::size_t>(c.heads) * c.q_len;
  const std::size_t k_rows = static_cast<std::size_t>(c.heads) * c.kv_len;
  std::mt19937 gen(static_cast<unsigned>(c.head_dim * 7 + c.q_len + c.kv_len * 3 + c.causal));
  auto random = [&gen](std::size_t n, float scale) {
    std::vector<bf16> out(n);
    for (bf16& x : out) {
      const double unit = static_cast<double>(gen()) / 4294967296.0;  // [0, 1)
      x = __float2bfloat16(static_cast<float>((2.0 * unit - 1.0) * scale));
    }
    return out;
  };
  std::vector<bf16> q = random(q_rows * d, 2.0f);
  std::vector<bf16> k = random(k_rows * d, 2.0f);
  std::vector<bf16> v = random(k_rows * d, 1.0f);
  std::vector<bf16> d_o = random(q_rows * d, 1.0f);
  // Outputs start as garbage: every element must be written.
  std::vector<bf16> o(q_rows * d, __float2bfloat16(55.0f));
  std::vector<bf16> dq(q_rows * d, __float2bfloat16(55.0f));
  std::vector<bf16> dk(k_rows * d, __float2bfloat16(55.0f));
  std::vector<bf16> dv(k_rows * d, __float2bfloat16(55.0f));
  std::vector<float> lse(q_rows, 123.0f);
  std::vector<float> delta(q_rows, 99.0f);
  std::vector<float> dq_accum(q_rows * d, 0.0f);  // zeroed by cudaMemsetAsync on a device

  AttentionArgs a;
  a.q = q.data();
  a.k = k.data();
  a.v = v.data();
  a.o = o.data();
  a.lse = lse.data();
  a.d_o = d_o.data();
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  a.dq_accum = dq_accum.data();
  a.delta = delta.data();
  a.heads = c.heads;
  a.q_len = c.q_len;
  a.kv_len = c.kv_len;
  a.head_dim = c.head_dim;
  a.causal = c.causal;
  a.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  using cpsim_emulation::launch;
  using cpsim_emulation::launch_serial;
  const Dim3Emulation fwd_grid{static_cast<unsigned>(c.q_len / kFlashBlockM),
                               static_cast<unsigned>(c.heads), 1};
  const Dim3Emulation bwd_grid{static_cast<unsigned>(c.kv_len / kFlashBlockN),
                               static_cast<unsigned>(c.heads), 1};
  const Dim3Emulation delta_grid{static_cast<unsigned>(q_rows / 4), 1, 1};
  if (c.head_dim == 128) {
    launch(fwd_grid, flash::Layout<128>::kFwdBytes, [&] { flash::flash_forward_kernel<128>(a); });
    launch(delta_grid, 0, [&] { flash::flash_backward_delta_kernel<128>(a); });
    launch(bwd_grid, flash::Layout<128>::kBwdBytes, [&] { flash::flash_backward_kernel<128>(a); });
  } else {
    launch(fwd_grid, flash::Layout<64>::kFwdBytes, [&] { flash::flash_forward_kernel<64>(a); });
    launch(delta_grid, 0, [&] { flash::flash_backward_delta_kernel<64>(a); });
    launch(bwd_grid, flash::Layout<64>::kBwdBytes, [&] { flash::flash_backward_kernel<64>(a); });
  }
  launch_serial({4, 1, 1}, 256,
                [&] { flash::convert_dq_kernel(dq_accum.data(), dq.data(), q_rows * d); });

  std::vector<float> o_ref(q_rows * d), lse_ref(q_rows), lse_rows(q_rows), delta_ref(q_rows),
      dq_ref(q_rows * d), dk_ref(k_rows * d), dv_ref(k_rows * d);
  const Dim3Emulation rows{static_cast<unsigned>((c.q_len + 127) / 128),
                           static_cast<unsigned>(c.heads), 1};
  const Dim3Emulation cols{static_cast<unsigned>((c.kv_len + 127) / 128),
                           static_cast<unsigned>(c.heads), 1};
  launch_serial(rows, 128,
                [&] { reference::reference_forward_kernel(a, o_ref.data(), lse_ref.data()); });
  launch_serial(rows, 128, [&] {
    reference::reference_backward_rows_kernel(a, lse_rows.data(), delta_ref.data(), dq_ref.data());
  });
  launch_serial(cols, 128, [&] {
    reference::reference_backward_cols_kernel(a, lse_rows.data(), delta_ref.data(), dk_ref.data(),
                                              dv_ref.data());
  });

  const Expected want = reference(c, q, k, v, d_o, static_cast<double>(a.scale));
  // Same tolerances as the GPU test: bf16 outputs against the exact values.
  expect_close(
      "flash O", want.o, [&](std::size_t i) { return to_float(o[i]); }, 1e-2, 1e-2);
  expect_close(
      "flash LSE", want.lse, [&](std::size_t i) { return lse[i]; }, 1e-3, 2e-3);
  expect_close(
      "flash dQ", want.dq, [&](std::size_t i) { return to_float(dq[i]); }, 3e-2, 1e-2);
  expect_close(
      "flash dK", want.dk, [&](std::size_t i) { return to_float(dk[i]); }, 3e-2, 1e-2);
  expect_close(
      "flash dV", want.dv, [&](std::size_t i) { return to_float(dv[i]); }, 3e-2, 1e-2);
  // The naive kernels accumulate in fp32 from the same bf16 inputs: much closer.
  expect_close(
      "naive O", want.o, [&](std::size_t i) { return o_ref[i]; }, 1e-4, 1e-5);
  expect_close(
      "naive LSE", want.lse, [&](std::size_t i) { return lse_ref[i]; }, 1e-5, 1e-5);
  expect_close(
      "naive dQ", want.dq, [&](std::size_t i) { return dq_ref[i]; }, 1e-4, 1e-5);
  expect_close(
      "naive dK", want.dk, [&](std::size_t i) { return dk_ref[i]; }, 1e-4, 1e-5);
  expect_close(
      "naive dV", want.dv, [&](std::size_t i) { return dv_ref[i]; }, 1e-4, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Shapes,
                         KernelEmulation,
                         ::testing::Values(Case{128, 2, 128, 128, false},
                                           Case{128, 1, 128, 128, true},
                                           Case{64, 2, 192, 192, true},
                                           Case{128, 1, 64, 256, true},    // q < kv (FPDT chunk)
                                           Case{128, 1, 256, 64, true},    // fully masked rows
                                           Case{64, 1, 128, 320, false}),  // ring step, q != kv
                         case_name);

}  // namespace
}  // namespace cpsim::calibrate::cuda
