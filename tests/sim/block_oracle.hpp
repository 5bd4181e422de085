#pragma once
// Test helper: a step built from the block template against the same step built block by block
// (BuildOptions::repeat_layers off, the oracle): the same step time and per-rank peaks.

#include <gtest/gtest.h>

#include "cpsim/sim/engine.hpp"
#include "cpsim/sim/schedule.hpp"

namespace cpsim::sim::test {

inline void expect_repeated_blocks_equal_oracle(const ScheduleInputs& in) {
  BuildOptions one_by_one;
  one_by_one.repeat_layers = false;
  const SimResult repeated = simulate(build_step(in), in.hardware);
  const SimResult oracle = simulate(build_step(in, one_by_one), in.hardware);
  EXPECT_EQ(repeated.step_time_ns, oracle.step_time_ns);
  ASSERT_EQ(repeated.memory.size(), oracle.memory.size());
  for (std::size_t r = 0; r < oracle.memory.size(); ++r) {
    EXPECT_EQ(repeated.memory[r].peak_bytes, oracle.memory[r].peak_bytes);
  }
}

}  // namespace cpsim::sim::test
