// Name interning: one id per distinct name, stable whatever the order names are asked for in.
#include "cpsim/sim/workload.hpp"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace cpsim::sim {
namespace {

TEST(Workload, InternGivesOneIdPerName) {
  Workload w;
  const std::vector<std::string> layer = {"norm1", "q", "kv", "a2a_q", "attn_fwd", "o_proj"};
  std::vector<std::int32_t> first;
  for (const std::string& n : layer) {
    first.push_back(w.intern(n));
  }
  // The same sequence again (the cached successor is right), then a different order and a new
  // name in the middle (the cached successor is wrong).
  for (std::size_t i = 0; i < layer.size(); ++i) {
    EXPECT_EQ(w.intern(layer[i]), first[i]);
  }
  EXPECT_EQ(w.intern("o_proj"), first[5]);
  EXPECT_EQ(w.intern("q"), first[1]);
  const std::int32_t fresh = w.intern("residual1");
  EXPECT_EQ(w.intern("norm1"), first[0]);
  EXPECT_EQ(w.intern("residual1"), fresh);
  EXPECT_EQ(w.intern("q"), first[1]);
  ASSERT_EQ(w.names.size(), layer.size() + 1);
  for (std::size_t i = 0; i < layer.size(); ++i) {
    EXPECT_EQ(w.names[static_cast<std::size_t>(first[i])], layer[i]);
  }
  EXPECT_EQ(w.names[static_cast<std::size_t>(fresh)], "residual1");
}

}  // namespace
}  // namespace cpsim::sim
