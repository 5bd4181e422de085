// Compute sweeps on one GPU: kernel launch overhead, SM clock, HBM bandwidth (copy kernel),
// cuBLASLt GEMM, flash attention forward and backward.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cublasLt.h>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "cpsim/calibrate/profile_fit.hpp"

#include "kernels.hpp"
#include "measure_internal.hpp"

namespace cpsim::calibrate::cuda {

static_assert(kFlashBlockM == kCpsimFlashBlockM && kFlashBlockN == kCpsimFlashBlockN,
              "the fit's occupancy model must use the kernel's tile sizes");

namespace {

constexpr int kLaunchLoops = 5;
constexpr int kLaunchesPerLoop = 1000;

std::vector<std::int64_t> memory_sizes(bool quick) {
  std::vector<std::int64_t> sizes;
  if (quick) {
    for (const int e : {22, 26, 30}) {
      sizes.push_back(std::int64_t{1} << e);
    }
  } else {
    for (int e = 20; e <= 32; ++e) {
      sizes.push_back(std::int64_t{1} << e);
    }
  }
  return sizes;
}

std::vector<std::int64_t> gemm_ms(bool quick) {
  if (quick) {
    return {4096, 32768};
  }
  return {1024, 4096, 16384, 65536, 262144};
}

/// Largest FLOPs per GEMM call (time budget: about 0.5 s at H100 speed, 0.06 s when quick).
double gemm_flops_cap(bool quick) {
  return quick ? 5e13 : 4e14;
}

std::vector<int> attention_head_dims(bool quick) {
  return quick ? std::vector<int>{128} : std::vector<int>{128, 64};
}

std::vector<int> attention_heads(bool quick) {
  return quick ? std::vector<int>{1, 4, 16, 32}
               : std::vector<int>{1, 2, 3, 4, 6, 8, 12, 16, 24, 32};
}

/// Time budget of one attention call (forward + backward estimate) before a shape is skipped.
double attention_call_cap_s(bool quick) {
  return quick ? 0.05 : 0.6;
}

std::int64_t default_max_seq(bool quick) {
  return quick ? 16384 : 1048576;
}

std::vector<int> attention_lengths(const Session& s) {
  const std::int64_t cap =
      s.options.max_seq > 0 ? s.options.max_seq : default_max_seq(s.options.quick);
  std::vector<int> lengths;
  for (std::int64_t len = 1024; len <= cap; len *= 2) {
    lengths.push_back(static_cast<int>(len));
  }
  return lengths;
}

struct RectShape {
  int q_len;
  int kv_len;
};

std::vector<RectShape> rect_shapes(bool quick) {
  std::vector<RectShape> out;
  for (const int s : quick ? std::vector<int>{2048} : std::vector<int>{1024, 4096, 16384}) {
    out.push_back({s, 2 * s});  // FPDT: a chunk against the keys so far
    out.push_back({2 * s, s});  // zigzag ring: two query chunks against one key chunk
    out.push_back({s, 4 * s});
  }
  return out;
}

constexpr int kRectHeads = 16;

}  // namespace

// ---------------------------------------------------------------------------------------------
// Launch overhead and clock

std::size_t plan_launch(const Session& /*s*/) {
  return 1;
}

void run_launch(Session& s) {
  s.progress.start("launch overhead (empty kernels)");
  const int device = s.devices.front();
  const DeviceGuard guard(device);
  const Stream stream(device);
  const Event start(device);
  const Event stop(device);
  for (int i = 0; i < 100; ++i) {  // warm-up
    CPSIM_CUDA_CHECK(empty_kernel(stream.get()));
  }
  CPSIM_CUDA_CHECK(cudaStreamSynchronize(stream.get()));
  std::vector<double> device_times;
  for (int loop = 0; loop < kLaunchLoops; ++loop) {
    CPSIM_CUDA_CHECK(cudaEventRecord(start.get(), stream.get()));
    const auto host_start = std::chrono::steady_clock::now();
    for (int i = 0; i < kLaunchesPerLoop; ++i) {
      CPSIM_CUDA_CHECK(empty_kernel(stream.get()));
    }
    const auto host_stop = std::chrono::steady_clock::now();
    CPSIM_CUDA_CHECK(cudaEventRecord(stop.get(), stream.get()));
    CPSIM_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    const double device_s = elapsed_s(start, stop) / kLaunchesPerLoop;
    const double host_s =
        std::chrono::duration<double>(host_stop - host_start).count() / kLaunchesPerLoop;
    s.samples.launch.push_back({kLaunchesPerLoop, device_s, host_s});
    device_times.push_back(device_s);
  }
  s.kernel_launch_s = median(device_times);
  s.progress.done();
}

double measure_sm_clock_mhz(int device) {
  constexpr long long kCycles = 200'000'000;
  const DeviceGuard guard(device);
  const Stream stream(device);
  const Event start(device);
  const Event stop(device);
  CPSIM_CUDA_CHECK(spin_kernel(kCycles / 20, stream.get()));  // let the clock ramp up
  CPSIM_CUDA_CHECK(cudaEventRecord(start.get(), stream.get()));
  CPSIM_CUDA_CHECK(spin_kernel(kCycles, stream.get()));
  CPSIM_CUDA_CHECK(cudaEventRecord(stop.get(), stream.get()));
  CPSIM_CUDA_CHECK(cudaEventSynchronize(stop.get()));
  return static_cast<double>(kCycles) / elapsed_s(start, stop) / 1e6;
}

// ---------------------------------------------------------------------------------------------
// HBM bandwidth

std::size_t plan_memory(const Session& s) {
  return memory_sizes(s.options.quick).size();
}

void run_memory(Session& s) {
  const int device = s.devices.front();
  const DeviceGuard guard(device);
  const Stream stream(device);
  const std::vector<std::int64_t> sizes = memory_sizes(s.options.quick);
  const auto largest = static_cast<std::size_t>(sizes.back());
  const std::size_t arena_bytes =
      std::min(2 * largest + s.rotation_bytes, free_device_memory(device) / 10 * 6);
  const DeviceBuffer arena(device, arena_bytes);
  CPSIM_CUDA_CHECK(cudaMemsetAsync(arena.at<void>(), 1, arena_bytes, stream.get()));
  for (const std::int64_t size : sizes) {
    const auto bytes = static_cast<std::size_t>(size);
    s.progress.start(fmt::format("HBM copy {}", bytes_label(static_cast<double>(size))));
    if (2 * bytes > arena_bytes) {
      s.notes.push_back(fmt::format("copy of {} skipped (not enough free memory)",
                                    bytes_label(static_cast<double>(size))));
      s.progress.done();
      continue;
    }
    const int sets = rotation_sets(2 * bytes, arena_bytes, s.rotation_bytes);
    const double t = time_launches(stream, s.timing, [&](int iteration) {
      const std::size_t base = static_cast<std::size_t>(iteration % sets) * 2 * bytes;
      CPSIM_CUDA_CHECK(
          copy_kernel(arena.at<void>(base), arena.at<void>(base + bytes), bytes, stream.get()));
    });
    s.samples.memory.push_back({"copy", 2 * size, t});
    s.progress.done();
  }
}

// ---------------------------------------------------------------------------------------------
// GEMM

namespace {

/// RAII holder of the cuBLASLt objects of one GEMM shape.
class LtMatmul {
 public:
  LtMatmul(std::int64_t m, std::int64_t n, std::int64_t k) {
    CPSIM_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t transpose = CUBLAS_OP_T;
    const cublasOperation_t none = CUBLAS_OP_N;
    CPSIM_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA,
                                                      &transpose, sizeof(transpose)));
    CPSIM_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof(none)));
    // Column-major view of PyTorch's F.linear: D[n x m] = W[k x n]^T X[k x m].
    const auto um = static_cast<std::uint64_t>(m);
    const auto un = static_cast<std::uint64_t>(n);
    const auto uk = static_cast<std::uint64_t>(k);
    CPSIM_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, uk, un, static_cast<std::int64_t>(uk)));
    CPSIM_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, uk, um, static_cast<std::int64_t>(uk)));
    CPSIM_CUBLAS_CHECK(
        cublasLtMatrixLayoutCreate(&d_, CUDA_R_16BF, un, um, static_cast<std::int64_t>(un)));
  }
  ~LtMatmul() {
    if (d_ != nullptr) {
      (void)cublasLtMatrixLayoutDestroy(d_);
    }
    if (b_ != nullptr) {
      (void)cublasLtMatrixLayoutDestroy(b_);
    }
    if (a_ != nullptr) {
      (void)cublasLtMatrixLayoutDestroy(a_);
    }
    if (desc_ != nullptr) {
      (void)cublasLtMatmulDescDestroy(desc_);
    }
  }
  LtMatmul(const LtMatmul&) = delete;
  LtMatmul& operator=(const LtMatmul&) = delete;

  /// The heuristic's first algorithm; false when cuBLASLt has none for this shape.
  bool choose(cublasLtHandle_t handle, std::size_t workspace_bytes) {
    cublasLtMatmulPreference_t pref = nullptr;
    CPSIM_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const cublasStatus_t set = cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes, sizeof(workspace_bytes));
    int found = 0;
    cublasStatus_t status = set;
    if (set == CUBLAS_STATUS_SUCCESS) {
      status =
          cublasLtMatmulAlgoGetHeuristic(handle, desc_, a_, b_, d_, d_, pref, 1, &result_, &found);
    }
    (void)cublasLtMatmulPreferenceDestroy(pref);
    CPSIM_CUBLAS_CHECK(status);
    return found > 0;
  }

  void run(cublasLtHandle_t handle,
           const void* weight,
           const void* input,
           void* output,
           void* workspace,
           std::size_t workspace_bytes,
           cudaStream_t stream) const {
    const float alpha = 1.0f;
    const float beta = 0.0f;
    CPSIM_CUBLAS_CHECK(cublasLtMatmul(handle, desc_, &alpha, weight, a_, input, b_, &beta, output,
                                      d_, output, d_, &result_.algo, workspace, workspace_bytes,
                                      stream));
  }

 private:
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr;
  cublasLtMatrixLayout_t b_ = nullptr;
  cublasLtMatrixLayout_t d_ = nullptr;
  cublasLtMatmulHeuristicResult_t result_{};
};

struct GemmPoint {
  std::int64_t m, n, k;
  std::string origin;
};

std::vector<GemmPoint> gemm_points(const Session& s) {
  std::vector<GemmPoint> out;
  for (const GemmWidth& w : s.options.gemm_widths) {
    for (const std::int64_t m : gemm_ms(s.options.quick)) {
      out.push_back({m, w.n, w.k, w.origin});
    }
  }
  return out;
}

}  // namespace

std::size_t plan_gemm(const Session& s) {
  return gemm_points(s).size();
}

void run_gemm(Session& s) {
  const std::vector<GemmPoint> points = gemm_points(s);
  if (points.empty()) {
    s.notes.push_back("no model widths given; sweep skipped");
    return;
  }
  const int device = s.devices.front();
  const DeviceGuard guard(device);
  const Stream stream(device);
  cublasLtHandle_t handle = nullptr;
  CPSIM_CUBLAS_CHECK(cublasLtCreate(&handle));
  struct HandleGuard {
    cublasLtHandle_t h;
    ~HandleGuard() { (void)cublasLtDestroy(h); }
  } handle_guard{handle};
  constexpr std::size_t kWorkspace = 32 * 1024 * 1024;
  const DeviceBuffer workspace(device, kWorkspace);
  const std::size_t arena_bytes = free_device_memory(device) / 10 * 6;
  const DeviceBuffer arena(device, arena_bytes);
  CPSIM_CUDA_CHECK(
      fill_uniform_bf16(arena.at<__nv_bfloat16>(), arena_bytes / 2, 17, 1.0f, stream.get()));
  const double cap = gemm_flops_cap(s.options.quick);
  std::size_t skipped_flops = 0;
  for (const GemmPoint& p : points) {
    s.progress.start(fmt::format("GEMM m={} n={} k={} ({})", p.m, p.n, p.k, p.origin));
    const double flops =
        2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);
    const RegionLayout layout = layout_regions({static_cast<std::size_t>(p.k * p.n * 2),
                                                static_cast<std::size_t>(p.k * p.m * 2),
                                                static_cast<std::size_t>(p.n * p.m * 2)});
    if (flops > cap || layout.total > arena_bytes) {
      ++skipped_flops;
      s.progress.done();
      continue;
    }
    LtMatmul mm(p.m, p.n, p.k);
    if (!mm.choose(handle, kWorkspace)) {
      s.notes.push_back(
          fmt::format("gemm m={} n={} k={}: cuBLASLt has no algorithm; skipped", p.m, p.n, p.k));
      s.progress.done();
      continue;
    }
    const int sets = rotation_sets(layout.total, arena_bytes, s.rotation_bytes);
    const double t = time_launches(stream, s.timing, [&](int iteration) {
      const std::size_t base = static_cast<std::size_t>(iteration % sets) * layout.total;
      mm.run(handle, arena.at<void>(base + layout.offsets[0]),
             arena.at<void>(base + layout.offsets[1]), arena.at<void>(base + layout.offsets[2]),
             workspace.at<void>(), kWorkspace, stream.get());
    });
    s.samples.gemm.push_back({p.m, p.n, p.k, t});
    s.progress.done();
  }
  if (skipped_flops > 0) {
    s.notes.push_back(
        fmt::format("{} shapes above {:.0e} FLOPs per call or larger than the free memory skipped",
                    skipped_flops, cap));
  }
}

// ---------------------------------------------------------------------------------------------
// Attention

AttentionBench::AttentionBench(int device, std::size_t arena_bytes, std::size_t rotation_bytes)
    : arena_(device, arena_bytes), rotation_bytes_(rotation_bytes) {
  const DeviceGuard guard(device);
  CPSIM_CUDA_CHECK(
      fill_uniform_bf16(arena_.at<__nv_bfloat16>(), arena_bytes / 2, 29, 1.0f, nullptr));
  CPSIM_CUDA_CHECK(cudaDeviceSynchronize());
}

namespace {

/// Regions of one set: q, k, v, o, lse, do, dq, dk, dv, dq_accum, delta.
RegionLayout attention_layout(const AttentionShape& sh) {
  const auto h = static_cast<std::size_t>(sh.heads);
  const auto d = static_cast<std::size_t>(sh.head_dim);
  const std::size_t q = h * static_cast<std::size_t>(sh.q_len);
  const std::size_t kv = h * static_cast<std::size_t>(sh.kv_len);
  return layout_regions({q * d * 2, kv * d * 2, kv * d * 2, q * d * 2, q * 4, q * d * 2, q * d * 2,
                         kv * d * 2, kv * d * 2, q * d * 4, q * 4});
}

}  // namespace

std::size_t AttentionBench::set_bytes(const AttentionShape& shape) {
  return attention_layout(shape).total;
}

int AttentionBench::sets(const AttentionShape& shape) const {
  return rotation_sets(set_bytes(shape), arena_.bytes(), rotation_bytes_);
}

AttentionArgs AttentionBench::args(const AttentionShape& shape, int set) const {
  const RegionLayout l = attention_layout(shape);
  const std::size_t base = static_cast<std::size_t>(set) * l.total;
  auto bf = [&](int region) { return arena_.at<__nv_bfloat16>(base + l.offsets[region]); };
  auto fp = [&](int region) { return arena_.at<float>(base + l.offsets[region]); };
  AttentionArgs a;
  a.q = bf(0);
  a.k = bf(1);
  a.v = bf(2);
  a.o = bf(3);
  a.lse = fp(4);
  a.d_o = bf(5);
  a.dq = bf(6);
  a.dk = bf(7);
  a.dv = bf(8);
  a.dq_accum = fp(9);
  a.delta = fp(10);
  a.heads = shape.heads;
  a.q_len = shape.q_len;
  a.kv_len = shape.kv_len;
  a.head_dim = shape.head_dim;
  a.causal = shape.causal;
  a.scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
  return a;
}

void AttentionBench::launch_forward(const Stream& stream, const AttentionShape& shape, int set) {
  CPSIM_CUDA_CHECK(flash_attention_forward(args(shape, set % sets(shape)), stream.get()));
}

double AttentionBench::time_forward(const Stream& stream,
                                    const TimingConfig& timing,
                                    const AttentionShape& shape) {
  const int n = sets(shape);
  return time_launches(stream, timing, [&](int iteration) {
    CPSIM_CUDA_CHECK(flash_attention_forward(args(shape, iteration % n), stream.get()));
  });
}

double AttentionBench::time_backward(const Stream& stream,
                                     const TimingConfig& timing,
                                     const AttentionShape& shape) {
  const int n = sets(shape);
  for (int set = 0; set < n; ++set) {
    CPSIM_CUDA_CHECK(flash_attention_forward(args(shape, set), stream.get()));
  }
  return time_launches(stream, timing, [&](int iteration) {
    CPSIM_CUDA_CHECK(flash_attention_backward(args(shape, iteration % n), stream.get()));
  });
}

std::size_t plan_attention(const Session& s) {
  const bool q = s.options.quick;
  return attention_head_dims(q).size() * 2 * attention_lengths(s).size() *
             attention_heads(q).size() * 2 +
         rect_shapes(q).size() * 2 * 2;
}

void run_attention(Session& s) {
  const bool quick = s.options.quick;
  const int device = s.devices.front();
  const DeviceGuard guard(device);
  const Stream stream(device);
  CPSIM_CUDA_CHECK(flash_attention_prepare());
  const std::vector<int> lengths = attention_lengths(s);
  const std::vector<int> heads_list = attention_heads(quick);
  const double cap_s = attention_call_cap_s(quick);
  const std::size_t arena_bytes = free_device_memory(device) / 10 * 6;
  AttentionBench bench(device, arena_bytes, s.rotation_bytes);
  int longest = 0;
  std::size_t skipped = 0;

  auto record = [&](const AttentionShape& sh, AttentionPass pass, double t) {
    s.samples.attention.push_back(
        {"cpsim-flash", pass, sh.causal, sh.head_dim, sh.heads, sh.q_len, sh.kv_len, t});
  };
  // Forward FLOPs in the FlashAttention convention (profile_fit.cpp attention_flops).
  auto flops_of = [](const AttentionShape& sh) {
    const double visible = sh.causal ? (std::max(0, sh.kv_len - sh.q_len) + sh.kv_len) / 2.0
                                     : static_cast<double>(sh.kv_len);
    return 4.0 * sh.q_len * visible * sh.heads * sh.head_dim;
  };

  for (const int d : attention_head_dims(quick)) {
    for (const bool causal : {false, true}) {
      double rate = 50e12;  // FLOP/s estimate for the time cap, updated as we go
      bool stop_lengths = false;
      for (const int len : lengths) {
        for (std::size_t hi = 0; hi < heads_list.size(); ++hi) {
          const AttentionShape sh{d, heads_list[hi], len, len, causal};
          const double estimate = 5.0 * flops_of(sh) / rate;  // forward + slower backward
          if (stop_lengths || estimate > cap_s || !bench.fits(sh)) {
            // More heads (and, at one head, longer sequences) only take longer.
            if (hi == 0) {
              stop_lengths = true;
            }
            const std::size_t left = (heads_list.size() - hi) * 2;
            skipped += left;
            s.progress.done(left);
            break;
          }
          const std::string label =
              fmt::format("attention d{} {} h{} S {}", d, causal ? "causal" : "full", sh.heads,
                          length_label(len));
          s.progress.start(label + " fwd");
          const double t_fwd = bench.time_forward(stream, s.timing, sh);
          record(sh, AttentionPass::kForward, t_fwd);
          rate = std::max(1e12, flops_of(sh) / t_fwd);
          s.progress.done();
          s.progress.start(label + " bwd");
          record(sh, AttentionPass::kBackward, bench.time_backward(stream, s.timing, sh));
          s.progress.done();
          longest = std::max(longest, len);
        }
      }
    }
  }
  for (const RectShape& r : rect_shapes(quick)) {
    for (const bool causal : {false, true}) {
      const AttentionShape sh{128, kRectHeads, r.q_len, r.kv_len, causal};
      s.progress.start(fmt::format("attention d128 {} h{} q {} kv {}", causal ? "causal" : "full",
                                   kRectHeads, length_label(r.q_len), length_label(r.kv_len)));
      if (!bench.fits(sh)) {
        skipped += 2;
        s.progress.done(2);
        continue;
      }
      record(sh, AttentionPass::kForward, bench.time_forward(stream, s.timing, sh));
      s.progress.done();
      record(sh, AttentionPass::kBackward, bench.time_backward(stream, s.timing, sh));
      s.progress.done();
    }
  }
  s.notes.push_back(fmt::format(
      "cpsim-flash up to S = {} ({} points skipped: over {:.2f} s per call or larger "
      "than {} of free memory; --max-seq sets the longest length tried)",
      length_label(longest), skipped, cap_s, bytes_label(static_cast<double>(arena_bytes))));
}

}  // namespace cpsim::calibrate::cuda
