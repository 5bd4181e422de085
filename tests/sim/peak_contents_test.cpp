// The tensors listed as live at the peak add up to the engine's peak, for every method.
#include <gtest/gtest.h>

#include "cpsim/sim/result.hpp"

#include "evaluate_step.hpp"
#include "helpers.hpp"

namespace cpsim::sim {
namespace {

using models::CpMethod;
using testing::data;
using testing::inputs;

struct Case {
  CpMethod method;
  const char* recipe;
  int gpus;
  std::int64_t seq;
};

class PeakContentsTest : public ::testing::TestWithParam<Case> {};

TEST_P(PeakContentsTest, AddsUpToThePeak) {
  const Case c = GetParam();
  ScheduleInputs in = inputs(c.method, "llama3-8b", c.gpus, c.seq);
  in.recipe = models::load_recipe(c.recipe, data());
  if (c.method == CpMethod::kRing || c.method == CpMethod::kAllGather) {
    in.parallel.ring_degree = c.gpus;  // these rotate over the whole CP group
  }
  test::EvaluateOptions opts;
  opts.keep_trace = true;
  const test::Evaluation e = test::evaluate(in, opts);
  const int rank = e.report.peak_rank;
  const PeakContents pc = peak_contents(*e.workload, *e.result, rank, 5);
  const RankMemory& m = e.result->memory[static_cast<std::size_t>(rank)];
  const std::int64_t static_bytes =
      m.breakdown_at_peak[static_cast<std::size_t>(MemCategory::kModelStates)] +
      m.fixed_overhead_bytes;
  EXPECT_EQ(pc.listed_bytes + pc.other_bytes, m.peak_bytes - static_bytes);
  ASSERT_EQ(pc.largest.size(), 5U);
  for (std::size_t i = 1; i < pc.largest.size(); ++i) {
    EXPECT_GE(pc.largest[i - 1].bytes, pc.largest[i].bytes);
  }
  // By category, the listed and unlisted tensors are the engine's breakdown at the peak.
  std::array<std::int64_t, kMemCategoryCount> by_category{};
  const PeakContents all = peak_contents(*e.workload, *e.result, rank, 1U << 30);
  for (const LiveTensor& t : all.largest) {
    by_category[static_cast<std::size_t>(t.category)] += t.bytes;
  }
  for (int k = 0; k < kMemCategoryCount; ++k) {
    if (static_cast<MemCategory>(k) != MemCategory::kModelStates) {
      EXPECT_EQ(by_category[static_cast<std::size_t>(k)],
                m.breakdown_at_peak[static_cast<std::size_t>(k)])
          << to_string(static_cast<MemCategory>(k));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Methods,
                         PeakContentsTest,
                         ::testing::Values(Case{CpMethod::kUlysses, "alst", 8, 1 << 20},
                                           Case{CpMethod::kUPipe, "alst", 8, 1 << 20},
                                           Case{CpMethod::kRing, "torch-native", 8, 1 << 19},
                                           Case{CpMethod::kAllGather, "torch-native", 8, 1 << 19},
                                           Case{CpMethod::kFpdt, "deepspeed-fpdt", 8, 1 << 20},
                                           Case{CpMethod::kUlysses, "alst-deepspeed", 1, 65536}));

}  // namespace
}  // namespace cpsim::sim
