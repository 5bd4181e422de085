#pragma once
// Synthetic raw calibration data generated from known coefficients with the simulator's own cost
// formulas (sim/src/cost_model.cpp), for the fit tests: fitting them must give the coefficients
// back.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "cpsim/calibrate/profile_fit.hpp"
#include "cpsim/calibrate/raw.hpp"
#include "cpsim/models/hardware.hpp"
#include "cpsim/models/io.hpp"

namespace cpsim::calibrate::testing {

inline models::HardwareProfile load_base() {
  return models::load_hardware("h100-sxm-80g", models::DataDir{CPSIM_TEST_DATA_DIR});
}

/// The coefficients the synthetic measurements are generated from: the H100 profile with
/// different, known values for everything the calibration measures.
inline models::HardwareProfile truth_profile() {
  models::HardwareProfile t = load_base();
  t.kernel_launch_s = 2.5e-6;
  t.memory_bound_efficiency = 0.9;
  t.gemm_max_efficiency = 0.75;
  t.gemm_efficiency_by_flops = models::LogCurve(
      {{std::ldexp(1.0, 35), 0.6}, {std::ldexp(1.0, 40), 0.9}, {std::ldexp(1.0, 44), 1.0}});
  t.compute_slowdown_under_comm = 0.12;
  models::AttentionKernelModel flash;
  flash.fwd_block_m = kCpsimFlashBlockM;
  flash.bwd_block_n = kCpsimFlashBlockN;
  flash.head_dim = 128;
  flash.fwd_causal_flops_per_s =
      models::LogCurve({{1024, 120e12}, {4096, 200e12}, {16384, 230e12}, {65536, 240e12}});
  flash.fwd_full_flops_per_s =
      models::LogCurve({{1024, 180e12}, {4096, 250e12}, {16384, 270e12}, {65536, 275e12}});
  flash.bwd_causal_flops_per_s =
      models::LogCurve({{1024, 80e12}, {4096, 140e12}, {16384, 170e12}, {65536, 180e12}});
  flash.bwd_full_flops_per_s =
      models::LogCurve({{1024, 120e12}, {4096, 170e12}, {16384, 190e12}, {65536, 200e12}});
  t.attention_kernels["cpsim-flash"] = flash;
  t.host_link = {8e-6, 50e9, 45e9, 70e9};
  using models::Collective;
  auto& intra = t.collectives[models::Span::kIntraNode];
  // all_to_all: a pure alpha-beta line (efficiency 1 at every size).
  intra[Collective::kAllToAll] = {{9e-6, 300e9, models::LogCurve({{1024, 1.0}})}, {}};
  // the others: efficiency rising with size, as NCCL's protocols switch.
  const models::LogCurve rising({{1024, 0.05},
                                 {65536, 0.3},
                                 {1048576, 0.6},
                                 {16777216, 0.85},
                                 {268435456, 0.97},
                                 {1073741824, 1.0}});
  intra[Collective::kAllGather] = {{7e-6, 360e9, rising}, {}};
  intra[Collective::kReduceScatter] = {{7e-6, 355e9, rising}, {}};
  intra[Collective::kAllReduce] = {{11e-6, 470e9, rising}, {}};
  intra[Collective::kSendRecv] = {{6e-6, 340e9, rising}, {}};
  return t;
}

inline RawContext synthetic_context(int gpus) {
  RawContext c;
  c.device = "NVIDIA H100 80GB HBM3";
  c.gpu_count = gpus;
  c.device_count = gpus;
  c.driver_version = "570.86.15";
  c.cuda_driver_version = "12.8";
  c.cuda_runtime_version = "13.0";
  c.nccl_version = "2.28.9";
  c.cublaslt_version = "13.0.0";
  c.sm_count = 132;
  c.hbm_capacity_bytes = 85520809984;
  c.l2_cache_bytes = 52428800;
  c.sm_clock_max_mhz = 1980;
  c.memory_clock_max_mhz = 2619;
  c.sm_clock_measured_mhz = 1755;
  c.date = "2025-01-01T00:00:00Z";
  c.cpsim_version = "0.1.0";
  c.argv = {"cpsim", "calibrate", "run", "--out", "raw.json"};
  c.quick = false;
  c.method = RawMethod{"cuda-event", "median", 3, 10, 104857600};
  c.notes = {"synthetic measurements generated from known coefficients"};
  return c;
}

inline double attention_time(const models::HardwareProfile& t, const AttentionSample& s) {
  const models::AttentionKernelModel& k = t.attention_kernel(s.kernel);
  const bool fwd = s.pass == AttentionPass::kForward;
  const std::int64_t len = fwd ? s.q_len : s.kv_len;
  const std::int64_t block = fwd ? k.fwd_block_m : k.bwd_block_n;
  const models::LogCurve& curve =
      fwd ? (s.causal ? k.fwd_causal_flops_per_s : k.fwd_full_flops_per_s)
          : (s.causal ? k.bwd_causal_flops_per_s : k.bwd_full_flops_per_s);
  const double occ =
      attention_occupancy_factor(s.heads * ((len + block - 1) / block), t.sm_count, k.fwd_block_m);
  return t.kernel_launch_s + attention_flops(s) / (curve(static_cast<double>(len), 0.0) * occ);
}

inline double collective_time(const models::HardwareProfile& t,
                              models::Collective op,
                              int ranks,
                              std::int64_t size) {
  const models::CollectiveCurve& m = t.collective(models::Span::kIntraNode, op).curve_for(ranks);
  const std::int64_t n = ranks;
  double wire = static_cast<double>((size / n) * (n - 1));
  if (op == models::Collective::kAllReduce) {
    wire *= 2.0;
  } else if (op == models::Collective::kSendRecv) {
    wire = static_cast<double>(size);
  }
  return m.alpha_s + t.collective_launch_s +
         wire / (m.peak_busbw_bytes_per_s * m.efficiency_by_size(static_cast<double>(size), 1.0));
}

/// Measurements of every kind generated from `t` with the cost model's formulas, optionally with
/// multiplicative noise uniform in [-noise, noise].
inline RawCalibration synthetic_raw(const models::HardwareProfile& t,
                                    double noise = 0.0,
                                    unsigned seed = 1,
                                    int gpus = 8) {
  std::mt19937 gen(seed);
  auto jitter = [&](double time) {
    const double unit = static_cast<double>(gen()) / 4294967296.0;  // [0, 1)
    return time * (1.0 + noise * (2.0 * unit - 1.0));
  };
  RawCalibration raw;
  raw.context = synthetic_context(gpus);
  RawSamples& s = raw.samples;

  for (int i = 0; i < 3; ++i) {
    s.launch.push_back({1000, t.kernel_launch_s, 2.1e-6});
  }
  for (int e = 20; e <= 32; ++e) {
    const auto bytes = std::int64_t{1} << e;
    s.memory.push_back(
        {"copy", bytes,
         jitter(t.kernel_launch_s + static_cast<double>(bytes) / (t.hbm_bandwidth_bytes_per_s *
                                                                  t.memory_bound_efficiency))});
  }
  // GEMM: n = k = 4096, m = 1K .. 512K: FLOPs 2^35 .. 2^44, one per quarter-octave bin.
  for (int e = 10; e <= 19; ++e) {
    const std::int64_t m = std::int64_t{1} << e;
    const std::int64_t n = 4096;
    const std::int64_t k = 4096;
    const double flops = 2.0 * static_cast<double>(m * n * k);
    const double bytes = 2.0 * static_cast<double>(m * k + k * n + m * n);
    const double eff = t.gemm_max_efficiency * t.gemm_efficiency_by_flops(flops);
    const double time = t.kernel_launch_s +
                        std::max(flops / (t.peak_bf16_flops_per_s * eff),
                                 bytes / (t.hbm_bandwidth_bytes_per_s * t.memory_bound_efficiency));
    s.gemm.push_back({m, n, k, jitter(time)});
  }
  for (const AttentionPass pass : {AttentionPass::kForward, AttentionPass::kBackward}) {
    for (const bool causal : {true, false}) {
      for (std::int64_t len = 1024; len <= 65536; len *= 2) {
        for (const std::int64_t heads : {1, 4, 16, 32}) {
          AttentionSample a{"cpsim-flash", pass, causal, 128, heads, len, len, 0.0};
          a.time_s = jitter(attention_time(t, a));
          s.attention.push_back(a);
        }
      }
      for (const auto& [q, kv] : std::vector<std::pair<std::int64_t, std::int64_t>>{
               {1024, 2048}, {4096, 8192}, {8192, 4096}, {2048, 16384}}) {
        AttentionSample a{"cpsim-flash", pass, causal, 128, 16, q, kv, 0.0};
        a.time_s = jitter(attention_time(t, a));
        s.attention.push_back(a);
      }
    }
  }
  for (const CopyDirection d :
       {CopyDirection::kHostToDevice, CopyDirection::kDeviceToHost, CopyDirection::kDuplex}) {
    const double bw = d == CopyDirection::kHostToDevice   ? t.host_link.h2d_bytes_per_s
                      : d == CopyDirection::kDeviceToHost ? t.host_link.d2h_bytes_per_s
                                                          : t.host_link.duplex_total_bytes_per_s;
    const double factor = d == CopyDirection::kDuplex ? 2.0 : 1.0;
    for (int gpu = 0; gpu < 2; ++gpu) {
      for (int e = 16; e <= 30; e += 2) {
        const auto bytes = std::int64_t{1} << e;
        s.host_copies.push_back(
            {d, gpu, 1, bytes,
             jitter(t.host_link.alpha_s + factor * static_cast<double>(bytes) / bw)});
      }
    }
    s.host_copies.push_back(
        {d, -1, gpus, std::int64_t{1} << 28,
         t.host_link.alpha_s + 1.5 * factor * static_cast<double>(std::int64_t{1} << 28) / bw});
  }
  if (gpus >= 2) {
    for (const models::Collective op :
         {models::Collective::kAllToAll, models::Collective::kAllGather,
          models::Collective::kReduceScatter, models::Collective::kAllReduce,
          models::Collective::kSendRecv}) {
      for (const int ranks : {2, gpus}) {
        for (int e = 10; e <= 30; ++e) {
          const auto size = std::int64_t{1} << e;
          const double time = jitter(collective_time(t, op, ranks, size));
          const double algbw = static_cast<double>(size) / time;
          s.collectives.push_back({op, ranks, size, time, algbw, algbw * busbw_factor(op, ranks)});
        }
      }
    }
  }
  s.interference.push_back({"all_to_all", "attention_fwd cpsim-flash d128 h32 s8192", gpus, 1e-3,
                            1e-3 * (1.0 + t.compute_slowdown_under_comm)});
  s.interference.push_back(
      {"host_copies", "attention_fwd cpsim-flash d128 h32 s8192", 1, 1e-3, 1.02e-3});
  return raw;
}

}  // namespace cpsim::calibrate::testing
