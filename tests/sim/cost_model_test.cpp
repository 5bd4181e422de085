// Cost functions against hand-computed values on the built-in H100 profile.
#include "cpsim/sim/cost_model.hpp"

#include <gtest/gtest.h>

#include "helpers.hpp"

namespace cpsim::sim {
namespace {

const models::HardwareProfile& h100() {
  static const models::HardwareProfile p = models::load_hardware("h100-sxm-80g", testing::data());
  return p;
}

TEST(CostModel, LargeGemmRunsAtTheMaxEfficiency) {
  const CostModel c(h100(), "fa3");
  // 8192³: 2·8192³ FLOPs at 989 TFLOP/s × 0.803, plus 1 µs launch; compute-bound.
  const KernelCost k = c.gemm(8192, 8192, 8192);
  const double flops = 2.0 * 8192.0 * 8192.0 * 8192.0;
  EXPECT_DOUBLE_EQ(k.flops, flops);
  EXPECT_NEAR(k.time_s, 1e-6 + flops / (989e12 * 0.803), 1e-12);
}

TEST(CostModel, SkinnyGemmIsMemoryBound) {
  const CostModel c(h100(), "fa3");
  // 1×4096×4096: bytes 2·(4096 + 4096² + 4096) at 3.35 TB/s × 0.85.
  const KernelCost k = c.gemm(1, 4096, 4096);
  const double bytes = 2.0 * (4096.0 + 4096.0 * 4096.0 + 4096.0);
  EXPECT_NEAR(k.time_s, 1e-6 + bytes / (3.35e12 * 0.85), 1e-12);
}

TEST(CostModel, AttentionAtThePublishedSetupUsesTheCurve) {
  const CostModel c(h100(), "fa3");
  // 16 heads × 16K causal: the FA3 figure's own set-up → 616 TFLOP/s, occupancy factor 1.
  const KernelCost k = c.attention_fwd({16384, 16384, 16, 128, true});
  const double flops = 4.0 * 16384.0 * 8192.0 * 16.0 * 128.0;
  EXPECT_DOUBLE_EQ(k.flops, flops);
  EXPECT_NEAR(k.time_s, 1e-6 + flops / 616e12, 1e-9);
}

TEST(CostModel, FewHeadsAtShortLengthLoseOccupancy) {
  const CostModel c(h100(), "fa3");
  // 1 head × 2K: 16 tiles on 132 SMs: occ = 16/132; reference occ = 2048/(132·16).
  const KernelCost one = c.attention_fwd({2048, 2048, 1, 128, true});
  const double flops = 4.0 * 2048.0 * 1024.0 * 128.0;
  const double occ = (16.0 / 132.0) / (2048.0 / (132.0 * 16.0));
  EXPECT_NEAR(one.time_s, 1e-6 + flops / (521e12 * occ), 1e-9);
  // Eight heads fill the GPU again (128 tiles): per-head time falls ~8x.
  const KernelCost eight = c.attention_fwd({2048, 2048, 8, 128, true});
  EXPECT_LT((eight.time_s - 1e-6) / 8.0, (one.time_s - 1e-6) / 7.0);
}

TEST(CostModel, BackwardIsTwoAndAHalfForwardFlops) {
  const CostModel c(h100(), "fa3");
  const AttentionShape s{65536, 65536, 4, 128, true};
  EXPECT_DOUBLE_EQ(c.attention_bwd(s).flops, 2.5 * c.attention_fwd(s).flops);
}

TEST(CostModel, AllToAllWireBytesAndTime) {
  const CostModel c(h100(), "fa3");
  // 1 GiB per-rank send buffer over 8 ranks: 7/8 leaves; busbw 370.8 GB/s × 0.74 at 1 GiB.
  const CollectiveCost k =
      c.collective(models::Collective::kAllToAll, models::Span::kIntraNode, 8, 1LL << 30);
  EXPECT_EQ(k.wire_bytes, (1LL << 30) / 8 * 7);
  EXPECT_NEAR(k.nominal_bytes_per_s, 370.8e9 * 0.74, 1e3);
  EXPECT_NEAR(k.time_s(), 12.5e-6 + 5e-6 + static_cast<double>(k.wire_bytes) / (370.8e9 * 0.74),
              1e-12);
}

TEST(CostModel, CollectiveUsesTheCurveOfTheNearestGroupSizeNotAbove) {
  models::HardwareProfile p = h100();
  models::CollectiveModel& m =
      p.collectives[models::Span::kIntraNode][models::Collective::kAllGather];
  // Main curve (the largest group) as published; curves measured at 2 and 4 ranks.
  models::CollectiveCurve two;
  two.alpha_s = 3e-6;
  two.peak_busbw_bytes_per_s = 100e9;
  two.efficiency_by_size = models::LogCurve({{1024.0, 0.5}, {1e9, 1.0}});
  models::CollectiveCurve four = two;
  four.alpha_s = 4e-6;
  four.peak_busbw_bytes_per_s = 200e9;
  m.by_ranks = {{2, two}, {4, four}};
  const CostModel c(p, "fa3");
  const auto at = [&c](int ranks) {
    return c.collective(models::Collective::kAllGather, models::Span::kIntraNode, ranks, 1LL << 30);
  };
  // 2 and 3 ranks: the 2-rank curve (alpha 3 us + launch 5 us; 100 GB/s x efficiency at 1 GiB,
  // log-interpolated between (1 KiB, 0.5) and (1e9, 1.0), clamped at 1.0 past 1e9).
  EXPECT_NEAR(at(2).alpha_s, 3e-6 + 5e-6, 1e-15);
  EXPECT_NEAR(at(2).nominal_bytes_per_s, 100e9, 1e-3);
  EXPECT_NEAR(at(3).alpha_s, 3e-6 + 5e-6, 1e-15);
  // 4 to 7 ranks: the 4-rank curve; 8 and 16 too (nearest measured size not above).
  EXPECT_NEAR(at(4).nominal_bytes_per_s, 200e9, 1e-3);
  EXPECT_NEAR(at(7).alpha_s, 4e-6 + 5e-6, 1e-15);
  EXPECT_NEAR(at(16).alpha_s, 4e-6 + 5e-6, 1e-15);
  // Below every measured size: the main curve, as without by_ranks.
  const CostModel plain(h100(), "fa3");
  const auto main_curve =
      plain.collective(models::Collective::kAllGather, models::Span::kIntraNode, 8, 1LL << 30);
  const CollectiveCost one = at(1);
  EXPECT_EQ(one.alpha_s, main_curve.alpha_s);
  EXPECT_EQ(one.nominal_bytes_per_s, main_curve.nominal_bytes_per_s);
  // A profile without by_ranks is unchanged at every group size.
  EXPECT_EQ(plain.collective(models::Collective::kAllGather, models::Span::kIntraNode, 2, 1LL << 30)
                .nominal_bytes_per_s,
            main_curve.nominal_bytes_per_s);
}

TEST(CostModel, HostCopy) {
  const CostModel c(h100(), "fa3");
  EXPECT_NEAR(c.host_copy_s(55'430'000'000, true), 5e-6 + 1.0, 1e-9);
}

}  // namespace
}  // namespace cpsim::sim
