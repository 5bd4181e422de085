// Megatron-LM's dynamic CP (planner/dynamic_cp.hpp): the scheduler against a trace of the
// upstream code (data/schedules/megatron-dynamic-cp.json, scripts/trace_dynamic_cp.py), a case by
// hand, and steps whose documents fill each sequence, which are the configuration's own step.
#include "cpsim/planner/dynamic_cp.hpp"

#include <algorithm>
#include <fstream>
#include <stdexcept>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cpsim/planner/evaluate.hpp"

#include "ring_config.hpp"

namespace cpsim::planner {
namespace {

using test_configs::megatron_ring_config;

// Per micro-batch, per rank: the documents it runs.
std::vector<std::vector<std::vector<std::int64_t>>> per_rank(
    const std::vector<HybridCpRound>& rounds, int ranks) {
  std::vector<std::vector<std::vector<std::int64_t>>> out;
  for (const HybridCpRound& round : rounds) {
    std::vector<std::vector<std::int64_t>> table(static_cast<std::size_t>(ranks));
    for (const HybridCpGroup& g : round.groups) {
      for (int r = g.first_rank; r < g.first_rank + g.cp; ++r) {
        table[static_cast<std::size_t>(r)] = g.documents;
      }
    }
    out.push_back(std::move(table));
  }
  return out;
}

TEST(DynamicCp, ScheduleIsTheTracedUpstreamSchedule) {
  const std::string path = std::string(CPSIM_TEST_DATA_DIR) + "/schedules/megatron-dynamic-cp.json";
  std::ifstream file(path);
  ASSERT_TRUE(file) << path;
  const nlohmann::json trace = nlohmann::json::parse(file);
  ASSERT_GE(trace["cases"].size(), 50U);
  int several_micro_batches = 0;
  for (const nlohmann::json& c : trace["cases"]) {
    const int ranks = c["ranks"].get<int>();
    const auto documents = c["documents"].get<std::vector<std::int64_t>>();
    const std::vector<HybridCpRound> rounds =
        schedule_dynamic_cp(documents, ranks, c["max_tokens_per_rank"].get<std::int64_t>());
    const auto expected = c["rounds"].get<std::vector<std::vector<std::vector<std::int64_t>>>>();
    EXPECT_EQ(per_rank(rounds, ranks), expected) << c["documents"].dump();
    several_micro_batches += rounds.size() > 1 ? 1 : 0;
  }
  EXPECT_GT(several_micro_batches, 10);  // leftovers and later micro-batches are exercised
}

// 4 ranks, 100 tokens a rank; documents 400, 100, 100, 50 (CP sizes 4, 1, 1, 1).
// Micro-batch 1 (cap 400 × 100 × 1.05): 400 opens a group of all four ranks. The 100s and the 50
// have no free rank and no group of size 1 or 2; the group of 4 would hold 100 + 100/4 (or
// + 50/4) tokens a rank, over 100: all three are left over.
// Micro-batch 2 (cap 100 × 100 × 1.05 = 10500): 100 opens rank 0 (work 10000). The second 100
// cannot join it (100 + 100 tokens) and opens free rank 1 (projected max 10000; two free ranks
// for size 2 project 10000 too, not less). 50 likewise opens rank 2. Rank 3 is idle: the first
// group of size 1 (rank 0) doubles to ranks 0-1, the others move up.
TEST(DynamicCp, ScheduleTracedByHand) {
  const std::vector<HybridCpRound> rounds = schedule_dynamic_cp({100, 50, 400, 100}, 4, 100);
  ASSERT_EQ(rounds.size(), 2U);
  EXPECT_EQ(rounds[0], (HybridCpRound{{{0, 4, {400}}}}));
  EXPECT_EQ(rounds[1], (HybridCpRound{{{0, 2, {100}}, {2, 1, {100}}, {3, 1, {50}}}}));
}

TEST(DynamicCp, DocumentsFillingTheSequencesGiveTheConfigurationsStep) {
  const sim::ScheduleInputs in = megatron_ring_config(8, 8);
  DynamicCpTimer timer(in);
  const HybridCpStep one = timer.step({in.parallel.seq_len});
  EXPECT_NEAR(one.step_s, evaluate(in).report.step_time_s, 1e-12 * one.step_s);
  EXPECT_DOUBLE_EQ(one.imbalance, 1.0);
  // Two halves of 64K (CP size 4 each at 16K tokens a rank): shorter than the whole.
  const std::int64_t half = in.parallel.seq_len / 2;
  const HybridCpStep halves = timer.step({half, half});
  EXPECT_LT(halves.step_s, one.step_s);
}

TEST(DynamicCp, GroupsWaitForTheirRanksNotForAll) {
  // 8 ranks, 16K tokens a rank: 64K on ranks 0-3 and, packed two by two, the eight 8K documents on
  // ranks 4-7, all in one micro-batch (traced upstream the same way).
  const sim::ScheduleInputs in = megatron_ring_config(8, 8);
  DynamicCpTimer timer(in);
  const HybridCpStep step = timer.step({65536, 8192, 8192, 8192, 8192, 8192, 8192, 8192, 8192});
  ASSERT_EQ(step.rounds.size(), 1U);
  EXPECT_EQ(step.rounds[0], (HybridCpRound{{{0, 4, {65536}},
                                            {4, 1, {8192, 8192}},
                                            {5, 1, {8192, 8192}},
                                            {6, 1, {8192, 8192}},
                                            {7, 1, {8192, 8192}}}}));
  // Attention: 65536²/2/4 on ranks 0-3, 2 × 8192²/2 on ranks 4-7: the busiest over the mean.
  const double big = 65536.0 * 65536.0 / 8.0, small = 8192.0 * 8192.0;
  EXPECT_DOUBLE_EQ(step.imbalance, big / ((4 * big + 4 * small) / 8.0));
  // The groups run side by side: the step is the slowest group's micro-batch, not a sum.
  double slowest_s = 0.0, sum_s = 0.0;
  for (const HybridCpGroup& g : step.rounds[0].groups) {
    slowest_s = std::max(slowest_s, timer.micro_batch_s(g));
    sum_s += timer.micro_batch_s(g);
  }
  EXPECT_DOUBLE_EQ(step.step_s, timer.outside_micro_batches_s() + slowest_s);
  EXPECT_LT(step.step_s, timer.outside_micro_batches_s() + sum_s);
}

TEST(DynamicCp, RefusesWhatUpstreamCannotRun) {
  EXPECT_THROW(schedule_dynamic_cp({100}, 6, 100), std::invalid_argument);
  EXPECT_THROW(schedule_dynamic_cp({900}, 8, 100), std::invalid_argument);
}

}  // namespace
}  // namespace cpsim::planner
