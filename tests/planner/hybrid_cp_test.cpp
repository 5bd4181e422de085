// Megatron-Core's hybrid CP (planner/hybrid_cp.hpp): the scheduler on a case traced by hand (and
// confirmed by megatron-core 0.16.1's own BalancedCPScheduler), the CP size rule, and steps whose
// documents fill each sequence, which are the configuration's own step.
#include "cpsim/planner/hybrid_cp.hpp"

#include <algorithm>
#include <stdexcept>

#include <gtest/gtest.h>

#include "cpsim/models/error.hpp"
#include "cpsim/planner/batches.hpp"
#include "cpsim/planner/evaluate.hpp"

#include "ring_config.hpp"

namespace cpsim::planner {
namespace {

using test_configs::megatron_ring_config;

TEST(HybridCp, CpSizeIsTheLeastPowerOfTwoThatFits) {
  // 2^ceil(log2(l / 16384)), at least 1.
  EXPECT_EQ(hybrid_cp_size(16, 16384), 1);
  EXPECT_EQ(hybrid_cp_size(16384, 16384), 1);
  EXPECT_EQ(hybrid_cp_size(16400, 16384), 2);
  EXPECT_EQ(hybrid_cp_size(32768, 16384), 2);
  EXPECT_EQ(hybrid_cp_size(32784, 16384), 4);
  EXPECT_EQ(hybrid_cp_size(131072, 16384), 8);
}

// 4 ranks, 100 tokens a rank; documents 400, 100, 100, 50 (CP sizes 4, 1, 1, 1; work l²/g:
// 40000, 10000, 10000, 2500; two sizes, target 31250 a bucket).
// Round 1: buckets [400] | [100, 100, 50] (40000 + 10000 passes 1.1 × 31250). 400 takes all four
// ranks; no group of size 1 and no free rank for the 100s: they are left over.
// Round 2: one size; buckets [100, 100] | [50] (one document left, one bucket to make). 100 on
// rank 0; the second 100 on free rank 1 (work 0 < 10000); 50 on free rank 2. Rank 3 is idle:
// the first group of the smallest size (rank 0) doubles to ranks 0-1, the others move up.
TEST(HybridCp, ScheduleTracedByHand) {
  const std::vector<HybridCpRound> rounds = schedule_hybrid_cp({100, 50, 400, 100}, 4, 100);
  ASSERT_EQ(rounds.size(), 2U);
  EXPECT_EQ(rounds[0], (HybridCpRound{{{0, 4, {400}}}}));
  EXPECT_EQ(rounds[1], (HybridCpRound{{{0, 2, {100}}, {2, 1, {100}}, {3, 1, {50}}}}));
}

TEST(HybridCp, EveryDocumentRunsOnceOnItsWholeGroup) {
  std::vector<std::int64_t> documents;
  for (int i = 0; i < 40; ++i) {
    documents.push_back(16 * (1 + (i * 7919) % 4096));  // 16 .. 65536 tokens, scrambled
  }
  const std::vector<HybridCpRound> rounds = schedule_hybrid_cp(documents, 8, 8192);
  std::vector<std::int64_t> seen;
  for (const HybridCpRound& round : rounds) {
    int next_rank = 0;
    for (const HybridCpGroup& g : round.groups) {
      EXPECT_EQ(g.first_rank, next_rank);  // groups cover the ranks in order
      EXPECT_EQ(g.first_rank % g.cp, 0);   // on the aligned process groups upstream creates
      next_rank += g.cp;
      for (const std::int64_t l : g.documents) {
        EXPECT_GE(g.cp, hybrid_cp_size(l, 8192));  // at least the size its length needs
        seen.push_back(l);
      }
    }
    EXPECT_EQ(next_rank, 8);
  }
  std::sort(seen.begin(), seen.end());
  std::sort(documents.begin(), documents.end());
  EXPECT_EQ(seen, documents);
}

TEST(HybridCp, RefusesWhatUpstreamCannotRun) {
  EXPECT_THROW(schedule_hybrid_cp({100}, 6, 100), std::invalid_argument);  // not a power of two
  EXPECT_THROW(schedule_hybrid_cp({900}, 8, 100), std::invalid_argument);  // needs 16 ranks
}

TEST(HybridCp, DocumentsFillingTheSequencesGiveTheConfigurationsStep) {
  const sim::ScheduleInputs in = megatron_ring_config(8, 8);
  HybridCpTimer timer(in);
  const HybridCpStep one = timer.step({in.parallel.seq_len});
  ASSERT_EQ(one.rounds.size(), 1U);
  EXPECT_EQ(one.rounds[0].groups[0].cp, 8);
  EXPECT_NEAR(one.step_s, evaluate(in).report.step_time_s, 1e-12 * one.step_s);
  EXPECT_DOUBLE_EQ(one.imbalance, 1.0);

  // Two halves: each on 4 ranks in one round, shorter than the whole.
  const std::int64_t half = in.parallel.seq_len / 2;
  const HybridCpStep halves = timer.step({half, half});
  ASSERT_EQ(halves.rounds.size(), 1U);
  EXPECT_EQ(halves.rounds[0], (HybridCpRound{{{0, 4, {half}}, {4, 4, {half}}}}));
  EXPECT_LT(halves.step_s, one.step_s);
  EXPECT_GT(halves.step_s, 0.5 * one.step_s);
}

TEST(HybridCp, TwoReplicasOfWholeSequencesGiveTheConfigurationsStep) {
  const sim::ScheduleInputs in = megatron_ring_config(16, 8);  // DP 2: two sequences a step
  HybridCpTimer timer(in);
  const HybridCpStep step = timer.step({in.parallel.seq_len, in.parallel.seq_len});
  EXPECT_NEAR(step.step_s, evaluate(in).report.step_time_s, 1e-12 * step.step_s);
}

TEST(HybridCp, OfferedForRingOnPowerOfTwoRanksOnly) {
  sim::ScheduleInputs in = megatron_ring_config(8, 8);
  EXPECT_EQ(load_balancer(in, "hybrid-cp", "--balancer").name, "hybrid-cp");
  in.parallel.gpus = 12;
  in.parallel.cp_degree = 4;
  in.parallel.ring_degree = 4;
  in.parallel.seq_len = 96 * 1024;
  try {
    load_balancer(in, "hybrid-cp", "--balancer");
    FAIL() << "12 DP x CP ranks";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("power-of-two"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace cpsim::planner
