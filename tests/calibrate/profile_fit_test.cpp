// Fitting raw measurements into a profile: synthetic measurements generated from known
// coefficients with the simulator's formulas give those coefficients back.
#include "cpsim/calibrate/profile_fit.hpp"

#include <cmath>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cpsim/calibrate/profile_io.hpp"
#include "cpsim/calibrate/raw_merge.hpp"
#include "cpsim/models/error.hpp"
#include "cpsim/models/io.hpp"

#include "synthetic.hpp"

namespace cpsim::calibrate {
namespace {

using models::Collective;
using models::Span;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr double kTolerance = 0.01;  // the issue's "within 1 %"

double rel(double value, double expected) {
  return std::abs(value - expected) / std::abs(expected);
}

FitOptions options() {
  FitOptions o;
  o.profile_name = "test-measured";
  o.base_name = "h100-sxm-80g";
  return o;
}

class SyntheticFit : public ::testing::Test {
 protected:
  void SetUp() override {
    truth_ = testing::truth_profile();
    base_ = testing::load_base();
    fit_ = fit_profile(testing::synthetic_raw(truth_), base_, options());
  }
  models::HardwareProfile truth_;
  models::HardwareProfile base_;
  ProfileFit fit_;
};

TEST_F(SyntheticFit, RecoversScalarCoefficients) {
  const models::HardwareProfile& p = fit_.profile;
  EXPECT_LT(rel(p.kernel_launch_s, truth_.kernel_launch_s), kTolerance);
  EXPECT_LT(rel(p.memory_bound_efficiency, truth_.memory_bound_efficiency), kTolerance);
  EXPECT_LT(rel(p.gemm_max_efficiency, truth_.gemm_max_efficiency), kTolerance);
  EXPECT_LT(rel(p.compute_slowdown_under_comm, truth_.compute_slowdown_under_comm), kTolerance);
  EXPECT_LT(rel(p.host_link.alpha_s, truth_.host_link.alpha_s), kTolerance);
  EXPECT_LT(rel(p.host_link.h2d_bytes_per_s, truth_.host_link.h2d_bytes_per_s), kTolerance);
  EXPECT_LT(rel(p.host_link.d2h_bytes_per_s, truth_.host_link.d2h_bytes_per_s), kTolerance);
  EXPECT_LT(rel(p.host_link.duplex_total_bytes_per_s, truth_.host_link.duplex_total_bytes_per_s),
            kTolerance);
}

TEST_F(SyntheticFit, RecoversTheGemmCurveAtTheMeasuredFlops) {
  const models::HardwareProfile& p = fit_.profile;
  for (int e = 35; e <= 44; ++e) {
    const double flops = std::ldexp(1.0, e);
    EXPECT_LT(rel(p.gemm_max_efficiency * p.gemm_efficiency_by_flops(flops),
                  truth_.gemm_max_efficiency * truth_.gemm_efficiency_by_flops(flops)),
              kTolerance)
        << "at 2^" << e << " FLOPs";
  }
}

TEST_F(SyntheticFit, RecoversAttentionCurvesOfTheNewKernel) {
  const models::AttentionKernelModel& got = fit_.profile.attention_kernel("cpsim-flash");
  const models::AttentionKernelModel& want = truth_.attention_kernel("cpsim-flash");
  EXPECT_EQ(got.fwd_block_m, kCpsimFlashBlockM);
  EXPECT_EQ(got.bwd_block_n, kCpsimFlashBlockN);
  EXPECT_EQ(got.head_dim, 128);
  for (std::int64_t len = 1024; len <= 65536; len *= 2) {
    const auto x = static_cast<double>(len);
    EXPECT_LT(rel(got.fwd_causal_flops_per_s(x), want.fwd_causal_flops_per_s(x)), kTolerance);
    EXPECT_LT(rel(got.fwd_full_flops_per_s(x), want.fwd_full_flops_per_s(x)), kTolerance);
    EXPECT_LT(rel(got.bwd_causal_flops_per_s(x), want.bwd_causal_flops_per_s(x)), kTolerance);
    EXPECT_LT(rel(got.bwd_full_flops_per_s(x), want.bwd_full_flops_per_s(x)), kTolerance);
  }
  // The few-head and rectangular shapes are predicted by the same occupancy model.
  for (const CurveFit& r : fit_.curves) {
    if (r.curve.find("cpsim-flash") != std::string::npos) {
      EXPECT_LT(r.fit_max, 1e-9) << r.curve;
    }
  }
}

TEST_F(SyntheticFit, RecordsTheKernelEfficiencyRatioAgainstPublishedFa3) {
  const std::string& source =
      fit_.profile.provenance.at("compute.attention_kernels.cpsim-flash.fwd_full_flops_per_s");
  EXPECT_THAT(source, StartsWith("measured: NVIDIA H100 80GB HBM3, driver 570.86.15, "
                                 "2025-01-01T00:00:00Z, cpsim calibrate, "));
  EXPECT_THAT(source, HasSubstr("samples, MAPE "));
  // 180 / 565 at 1K (the published fa3 forward non-causal figure there).
  EXPECT_THAT(source, HasSubstr("kernel efficiency vs the base's published fa3 curve"));
  EXPECT_THAT(source, HasSubstr("0.32 @1K"));
  // The published kernels stay as they were.
  EXPECT_EQ(fit_.profile.provenance.at("compute.attention_kernels.fa3.fwd_full_flops_per_s"),
            base_.provenance.at("compute.attention_kernels.fa3.fwd_full_flops_per_s"));
}

TEST_F(SyntheticFit, RecoversAlphaBetaOfAPureAlphaBetaCollective) {
  const models::CollectiveModel& got =
      fit_.profile.collective(Span::kIntraNode, Collective::kAllToAll);
  const models::CollectiveModel& want = truth_.collective(Span::kIntraNode, Collective::kAllToAll);
  EXPECT_LT(rel(got.alpha_s, want.alpha_s), kTolerance);
  EXPECT_LT(rel(got.peak_busbw_bytes_per_s, want.peak_busbw_bytes_per_s), kTolerance);
  for (const auto& [x, y] : got.efficiency_by_size.points()) {
    EXPECT_NEAR(y, 1.0, kTolerance) << "at " << x;
  }
}

TEST_F(SyntheticFit, ReproducesCollectiveTimesWithSizeDependentEfficiency) {
  for (const Collective op : {Collective::kAllGather, Collective::kReduceScatter,
                              Collective::kAllReduce, Collective::kSendRecv}) {
    for (int e = 10; e <= 30; ++e) {
      const auto size = std::int64_t{1} << e;
      EXPECT_LT(rel(testing::collective_time(fit_.profile, op, 8, size),
                    testing::collective_time(truth_, op, 8, size)),
                kTolerance)
          << models::to_string(op) << " at 2^" << e;
    }
    const models::CollectiveModel& got = fit_.profile.collective(Span::kIntraNode, op);
    const models::CollectiveModel& want = truth_.collective(Span::kIntraNode, op);
    EXPECT_LT(rel(got.peak_busbw_bytes_per_s, want.peak_busbw_bytes_per_s), kTolerance);
  }
}

TEST_F(SyntheticFit, EveryCheckedCurveHasAHoldOutAndPassesTheGate) {
  std::size_t checked = 0;
  for (const CurveFit& r : fit_.curves) {
    if (!r.checked) {
      continue;
    }
    ++checked;
    EXPECT_GT(r.held_out, 0U) << r.curve;
    EXPECT_LT(r.gate_error(), 0.15) << r.curve;
  }
  EXPECT_GE(checked, 11U);  // gemm, memory, 4 attention, 3 host link, 5 collectives
  EXPECT_NO_THROW(check_fit_quality(fit_, 0.15));
}

TEST_F(SyntheticFit, UncoveredCoefficientsKeepTheBaseValueAndSource) {
  const models::HardwareProfile& p = fit_.profile;
  EXPECT_EQ(p.peak_bf16_flops_per_s, base_.peak_bf16_flops_per_s);
  EXPECT_EQ(p.provenance.at("gpu.peak_bf16_flops_per_s"),
            base_.provenance.at("gpu.peak_bf16_flops_per_s"));
  const models::CollectiveModel& inter = p.collective(Span::kInterNode, Collective::kAllToAll);
  EXPECT_EQ(inter.alpha_s, base_.collective(Span::kInterNode, Collective::kAllToAll).alpha_s);
  EXPECT_EQ(p.provenance.at("collectives.inter_node.all_to_all.alpha_s"),
            base_.provenance.at("collectives.inter_node.all_to_all.alpha_s"));
  EXPECT_EQ(p.cpu_adam_params_per_s, base_.cpu_adam_params_per_s);
  EXPECT_EQ(p.name, "test-measured");
  EXPECT_EQ(p.gpu_name, "NVIDIA H100 80GB HBM3");
  EXPECT_THAT(p.provenance.at("compute.memory_bound_efficiency"), StartsWith("measured: "));
}

TEST_F(SyntheticFit, TheProfileLoadsAndRoundTrips) {
  const std::string text = write_hardware_profile(fit_.profile);
  const models::HardwareProfile back = models::parse_hardware_profile(text, "measured.json");
  EXPECT_EQ(back.attention_kernels.count("cpsim-flash"), 1U);
  EXPECT_EQ(back.provenance, fit_.profile.provenance);
  EXPECT_EQ(write_hardware_profile(back), text);
}

TEST(ProfileFit, NoisyMeasurementsStayClose) {
  const models::HardwareProfile truth = testing::truth_profile();
  const ProfileFit fit =
      fit_profile(testing::synthetic_raw(truth, 0.02, 11), testing::load_base(), options());
  EXPECT_NO_THROW(check_fit_quality(fit, 0.15));
  EXPECT_LT(rel(fit.profile.memory_bound_efficiency, truth.memory_bound_efficiency), 0.03);
  EXPECT_LT(rel(fit.profile.host_link.h2d_bytes_per_s, truth.host_link.h2d_bytes_per_s), 0.03);
  const auto& got = fit.profile.attention_kernel("cpsim-flash");
  const auto& want = truth.attention_kernel("cpsim-flash");
  EXPECT_LT(rel(got.fwd_full_flops_per_s(8192), want.fwd_full_flops_per_s(8192)), 0.05);
}

// The review case: one 1 KiB all-to-all point inflated x10 used to pass with "MAPE 0.0 %, ok" (the
// curve interpolated every point). It is now named and refused above --max-mape.
TEST(ProfileFit, NamesAndRefusesASmallPointInflatedTenTimes) {
  RawCalibration raw = testing::synthetic_raw(testing::truth_profile());
  for (CollectiveSample& s : raw.samples.collectives) {
    if (s.op == Collective::kAllToAll && s.ranks == 8 && s.size_bytes == 1024) {
      s.time_s *= 10.0;
    }
  }
  const ProfileFit fit = fit_profile(raw, testing::load_base(), options());
  try {
    check_fit_quality(fit, 0.15);
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "collectives.intra_node.all_to_all");
    EXPECT_THAT(e.what(), HasSubstr("outlier all_to_all 8 ranks 1.0 KiB: measured"));
    EXPECT_THAT(e.what(), HasSubstr("(+900%"));
    EXPECT_THAT(e.what(), HasSubstr("--force"));
  }
  const std::string report = format_fit_report(fit, 0.15);
  EXPECT_THAT(report, HasSubstr("OUTLIER"));
  EXPECT_THAT(report, HasSubstr("outliers (left out of the fit"));
  // Left out, the point does not bend the profile: alpha and peak stay those of the truth.
  const models::CollectiveModel& got =
      fit.profile.collective(Span::kIntraNode, Collective::kAllToAll);
  const models::HardwareProfile truth = testing::truth_profile();
  const models::CollectiveModel& want = truth.collective(Span::kIntraNode, Collective::kAllToAll);
  EXPECT_LT(rel(got.alpha_s, want.alpha_s), kTolerance);
  EXPECT_LT(rel(got.peak_busbw_bytes_per_s, want.peak_busbw_bytes_per_s), kTolerance);
}

TEST(ProfileFit, KeepsEveryGroupSizeAsItsOwnCheckedCurve) {
  const ProfileFit fit = fit_profile(testing::synthetic_raw(testing::truth_profile()),
                                     testing::load_base(), options());
  bool two = false;
  bool eight = false;
  for (const CurveFit& r : fit.curves) {
    two = two || r.curve == "collectives.intra_node.all_gather (2 ranks)";
    eight = eight ||
            (r.curve == "collectives.intra_node.all_gather" && r.note.rfind("8 ranks", 0) == 0);
  }
  EXPECT_TRUE(two);
  EXPECT_TRUE(eight);
  const models::CollectiveModel& ag =
      fit.profile.collective(Span::kIntraNode, Collective::kAllGather);
  ASSERT_EQ(ag.by_ranks.size(), 2U);
  EXPECT_EQ(ag.by_ranks.count(2), 1U);
  EXPECT_EQ(ag.by_ranks.at(8).alpha_s, ag.alpha_s);  // the largest group is also the main curve
  EXPECT_EQ(fit.profile.provenance.count("collectives.intra_node.all_gather.by_ranks.2.alpha_s"),
            1U);
}

TEST(ProfileFit, AGroupSizeWithItsOwnCurveIsFittedBackIntoByRanks) {
  // The truth's all-to-all on 2 ranks has its own alpha and bandwidth (another NCCL algorithm).
  models::HardwareProfile truth = testing::truth_profile();
  models::CollectiveModel& a2a = truth.collectives[Span::kIntraNode][Collective::kAllToAll];
  models::CollectiveCurve two = a2a;
  two.alpha_s = 4e-6;
  two.peak_busbw_bytes_per_s = 150e9;
  a2a.by_ranks[8] = a2a;  // by_ranks holds every measured size, the largest too
  a2a.by_ranks[2] = two;
  const ProfileFit fit =
      fit_profile(testing::synthetic_raw(truth), testing::load_base(), options());
  const models::CollectiveModel& got =
      fit.profile.collective(Span::kIntraNode, Collective::kAllToAll);
  ASSERT_EQ(got.by_ranks.count(2), 1U);
  EXPECT_LT(rel(got.curve_for(2).alpha_s, 4e-6), kTolerance);
  EXPECT_LT(rel(got.curve_for(3).peak_busbw_bytes_per_s, 150e9), kTolerance);
  EXPECT_LT(rel(got.curve_for(8).peak_busbw_bytes_per_s, a2a.peak_busbw_bytes_per_s), kTolerance);
  EXPECT_LT(rel(got.peak_busbw_bytes_per_s, a2a.peak_busbw_bytes_per_s), kTolerance);
}

/// The synthetic collectives as a `calibrate run --mpi` of 2 nodes x 8 would write them: every
/// group across both nodes (16 ranks; the 2-rank group is one rank per node).
RawCalibration synthetic_mpi_raw() {
  RawCalibration raw = testing::synthetic_raw(testing::truth_profile());
  RawCalibration mpi;
  mpi.context = raw.context;
  mpi.context.gpu_count = 16;
  mpi.context.device_count = 16;
  mpi.context.mpi = RawMpi{16, 2, 8, {"node1", "node2"}};
  for (CollectiveSample c : raw.samples.collectives) {
    if (c.ranks == 8 || c.ranks == 2) {
      c.ranks = c.ranks == 8 ? 16 : 2;
      c.nodes = 2;
      mpi.samples.collectives.push_back(c);
    }
  }
  return mpi;
}

TEST(ProfileFit, AnMpiRunFillsTheInterNodeCurvesAndGpusPerNode) {
  const ProfileFit fit = fit_profile(synthetic_mpi_raw(), testing::load_base(), options());
  EXPECT_EQ(fit.profile.gpus_per_node, 8);  // ranks per node, not the 16 ranks
  EXPECT_THAT(fit.profile.provenance.at("node.gpus_per_node"),
              ::testing::HasSubstr("calibrate run --mpi on 2 nodes"));
  const models::CollectiveModel& ag =
      fit.profile.collective(Span::kInterNode, Collective::kAllGather);
  EXPECT_EQ(ag.by_ranks.count(2), 1U);
  EXPECT_EQ(ag.by_ranks.count(16), 1U);
  EXPECT_THAT(fit.profile.provenance.at("collectives.inter_node.all_gather.alpha_s"),
              ::testing::StartsWith("measured"));
  EXPECT_THAT(fit.profile.provenance.at("collectives.inter_node.all_gather.by_ranks.2.alpha_s"),
              ::testing::StartsWith("measured"));
  for (const std::string& note : fit.notes) {
    EXPECT_EQ(note.find("collectives.inter_node: no samples"), std::string::npos) << note;
  }
}

TEST(ProfileFit, AnMpiFileMergedWithANodeRunKeepsTheNodesGpuCount) {
  const RawCalibration node = testing::synthetic_raw(testing::truth_profile());
  const MergedRaw merged = merge_raw({{"node.json", node}, {"inter.json", synthetic_mpi_raw()}});
  EXPECT_EQ(merged.raw.context.gpu_count, 8);
  EXPECT_EQ(merged.raw.context.device_count, 8);
  const ProfileFit fit = fit_profile(merged.raw, testing::load_base(), options());
  EXPECT_EQ(fit.profile.gpus_per_node, 8);
  EXPECT_THAT(fit.profile.provenance.at("collectives.inter_node.all_reduce.alpha_s"),
              ::testing::StartsWith("measured"));
  EXPECT_THAT(fit.profile.provenance.at("collectives.intra_node.all_reduce.alpha_s"),
              ::testing::StartsWith("measured"));
}

TEST(ProfileFit, RefusesACurveWhoseHoldOutErrorIsTooLarge) {
  RawCalibration raw = testing::synthetic_raw(testing::truth_profile());
  // Scramble the all-gather times: every odd power of two 3x slower.
  for (CollectiveSample& s : raw.samples.collectives) {
    if (s.op == Collective::kAllGather && static_cast<int>(std::log2(s.size_bytes)) % 2 == 1) {
      s.time_s *= 3.0;
    }
  }
  const ProfileFit fit = fit_profile(raw, testing::load_base(), options());
  try {
    check_fit_quality(fit, 0.15);
    ADD_FAILURE() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.field(), "collectives.intra_node.all_gather");
    EXPECT_THAT(e.what(), HasSubstr("exceeds --max-mape 15.0%"));
    EXPECT_THAT(e.what(), HasSubstr("--force"));
  }
  EXPECT_NO_THROW(check_fit_quality(fit, 10.0));
  EXPECT_THAT(format_fit_report(fit, 0.15), HasSubstr("EXCEEDS"));
}

TEST(ProfileFit, OneGpuKeepsTheBaseCollectivesWithANote) {
  const models::HardwareProfile base = testing::load_base();
  const ProfileFit fit =
      fit_profile(testing::synthetic_raw(testing::truth_profile(), 0.0, 1, 1), base, options());
  const auto& got = fit.profile.collective(Span::kIntraNode, Collective::kAllToAll);
  EXPECT_EQ(got.alpha_s, base.collective(Span::kIntraNode, Collective::kAllToAll).alpha_s);
  bool noted = false;
  for (const std::string& n : fit.notes) {
    noted = noted || n.find("one GPU measured") != std::string::npos;
  }
  EXPECT_TRUE(noted);
}

// Device-bound launches (the synthetic device time 2.5 us exceeds the host's 2.1 us) give both
// coefficients; host-bound ones (device = host, as measured on an H200 node) only the host's.
TEST_F(SyntheticFit, LaunchesGiveTheHostCostAndTheDeviceGapWhenDeviceBound) {
  EXPECT_NEAR(fit_.profile.host_issue.launch_s, 2.1e-6, 1e-12);
  EXPECT_NEAR(fit_.profile.kernel_launch_s, truth_.kernel_launch_s, 1e-12);
}

TEST(ProfileFit, HostBoundLaunchesKeepTheBaseDeviceGapAndSayWhy) {
  const models::HardwareProfile base = testing::load_base();
  RawCalibration raw = testing::synthetic_raw(testing::truth_profile());
  raw.samples.launch.clear();
  for (const double t : {3.21e-6, 3.34e-6, 3.51e-6}) {
    raw.samples.launch.push_back({1000, t, t - 1e-9});
  }
  const ProfileFit fit = fit_profile(raw, base, options());
  EXPECT_EQ(fit.profile.kernel_launch_s, base.kernel_launch_s);
  EXPECT_NEAR(fit.profile.host_issue.launch_s, 3.34e-6 - 1e-9, 1e-15);
  bool noted = false;
  for (const std::string& n : fit.notes) {
    noted = noted || n.find("host-bound") != std::string::npos;
  }
  EXPECT_TRUE(noted);
}

TEST(ProfileFit, AttentionOnlyRawUpdatesOnlyThatKernel) {
  // What calibrate/scripts/torch_attention_timing.py writes: attention samples of "sdpa".
  const models::HardwareProfile base = testing::load_base();
  models::HardwareProfile truth = testing::truth_profile();
  truth.attention_kernels["sdpa"] = truth.attention_kernel("cpsim-flash");
  truth.attention_kernels["sdpa"].fwd_block_m = base.attention_kernel("sdpa").fwd_block_m;
  truth.attention_kernels["sdpa"].bwd_block_n = base.attention_kernel("sdpa").bwd_block_n;
  truth.kernel_launch_s = base.kernel_launch_s;
  RawCalibration raw = testing::synthetic_raw(truth);
  RawSamples only;
  for (AttentionSample s : raw.samples.attention) {
    s.kernel = "sdpa";
    s.time_s = testing::attention_time(truth, s);
    only.attention.push_back(s);
  }
  raw.samples = only;
  const ProfileFit fit = fit_profile(raw, base, options());
  EXPECT_EQ(fit.profile.attention_kernels.count("cpsim-flash"), 0U);
  const auto& got = fit.profile.attention_kernel("sdpa");
  EXPECT_LT(rel(got.bwd_full_flops_per_s(4096),
                truth.attention_kernel("sdpa").bwd_full_flops_per_s(4096)),
            kTolerance);
  EXPECT_EQ(got.fwd_block_m, base.attention_kernel("sdpa").fwd_block_m);
  EXPECT_EQ(fit.profile.gemm_max_efficiency, base.gemm_max_efficiency);
  EXPECT_EQ(fit.profile.provenance.at("compute.gemm_max_efficiency"),
            base.provenance.at("compute.gemm_max_efficiency"));

  // The report says which kernels predictions now use measured curves for.
  ASSERT_GE(fit.attention_origins.size(), 5U);
  std::vector<std::string> order;
  for (const AttentionKernelOrigin& o : fit.attention_origins) {
    order.push_back(o.kernel);
  }
  EXPECT_EQ(std::vector<std::string>(order.begin(), order.begin() + 5),
            (std::vector<std::string>{"fa3", "fa2", "cudnn", "sdpa", "cpsim-flash"}));
  EXPECT_EQ(fit.attention_origins[3].measured_curves, 4);
  EXPECT_EQ(fit.attention_origins[3].samples, only.attention.size());
  EXPECT_EQ(fit.attention_origins[0].measured_curves, 0);
  EXPECT_EQ(fit.attention_origins[0].curves, 4);
  EXPECT_EQ(fit.attention_origins[4].curves, 0);
  const std::string report = format_fit_report(fit, 0.15);
  EXPECT_NE(report.find("  sdpa             measured (" + std::to_string(only.attention.size()) +
                        " samples)\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("  fa3              published (the base profile's curves; not measured "
                        "here)\n"),
            std::string::npos)
      << report;
  EXPECT_NE(report.find("  cpsim-flash      absent from the profile\n"), std::string::npos)
      << report;
}

TEST(ProfileFit, OccupancyAndFlopsFollowTheSimulator) {
  // 16 heads x 16K tokens is the reference set-up: factor 1.
  EXPECT_DOUBLE_EQ(attention_occupancy_factor(16 * 16384 / 128, 132, 128), 1.0);
  // One tile on 132 SMs fills 1/132 of a wave.
  EXPECT_NEAR(attention_occupancy_factor(1, 132, 128), (1.0 / 132.0) / (2048.0 / (132.0 * 16.0)),
              1e-12);
  AttentionSample s{"x", AttentionPass::kForward, true, 128, 2, 1024, 3072, 1.0};
  // visible keys = (2048 + 3072) / 2 = 2560
  EXPECT_DOUBLE_EQ(attention_flops(s), 4.0 * 1024 * 2560 * 2 * 128);
  s.pass = AttentionPass::kBackward;
  EXPECT_DOUBLE_EQ(attention_flops(s), 2.5 * 4.0 * 1024 * 2560 * 2 * 128);
}

// The h200-141g profile's measured coefficients are what `calibrate fit` gives from the raw files
// committed under data/measurements/h200-2026-11-26 (the README there gives the command), so the
// profile and its data cannot drift apart: the cudnn and sdpa curves, HBM efficiency, the host
// link and the host's launch cost. The profile keeps the published GEMM rate and device launch
// gap (README: why), which this test leaves out.
TEST(ProfileFit, TheH200ProfileIsTheFitOfItsCommittedMeasurements) {
  const models::DataDir data{CPSIM_TEST_DATA_DIR};
  const auto folder = data.root / "measurements" / "h200-2026-11-26";
  std::vector<NamedRaw> files;
  for (const char* name : {"calibrate_full.json", "attention_cudnn.json",
                           "attention_sdpa_flash.json", "attention_torch_quick.json"}) {
    files.push_back({name, load_raw(folder / name, "RAW")});
  }
  const models::HardwareProfile shipped = models::load_hardware("h200-141g", data);
  FitOptions o;
  o.base_name = "h200-141g";
  const ProfileFit fit = fit_profile(merge_raw(files).raw, shipped, o);
  const models::HardwareProfile& p = fit.profile;
  EXPECT_DOUBLE_EQ(p.memory_bound_efficiency, shipped.memory_bound_efficiency);
  EXPECT_DOUBLE_EQ(p.host_link.alpha_s, shipped.host_link.alpha_s);
  EXPECT_DOUBLE_EQ(p.host_link.h2d_bytes_per_s, shipped.host_link.h2d_bytes_per_s);
  EXPECT_DOUBLE_EQ(p.host_link.d2h_bytes_per_s, shipped.host_link.d2h_bytes_per_s);
  EXPECT_DOUBLE_EQ(p.host_link.duplex_total_bytes_per_s,
                   shipped.host_link.duplex_total_bytes_per_s);
  EXPECT_DOUBLE_EQ(p.host_issue.launch_s, shipped.host_issue.launch_s);
  for (const char* kernel : {"cudnn", "sdpa"}) {
    SCOPED_TRACE(kernel);
    const models::AttentionKernelModel& got = p.attention_kernel(kernel);
    const models::AttentionKernelModel& want = shipped.attention_kernel(kernel);
    EXPECT_EQ(got.fwd_causal_flops_per_s.points(), want.fwd_causal_flops_per_s.points());
    EXPECT_EQ(got.fwd_full_flops_per_s.points(), want.fwd_full_flops_per_s.points());
    EXPECT_EQ(got.bwd_causal_flops_per_s.points(), want.bwd_causal_flops_per_s.points());
    EXPECT_EQ(got.bwd_full_flops_per_s.points(), want.bwd_full_flops_per_s.points());
  }
  // What the profile keeps published although the files measured it.
  EXPECT_NE(p.gemm_max_efficiency, shipped.gemm_max_efficiency);
  EXPECT_TRUE(shipped.gemm_efficiency_by_flops.points().empty());
}

}  // namespace
}  // namespace cpsim::calibrate
