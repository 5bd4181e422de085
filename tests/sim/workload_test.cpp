// Name interning: one id per distinct name, stable whatever the order names are asked for in;
// indexed names (per-block names) are the same ids.
#include "cpsim/sim/workload.hpp"

#include <stdexcept>
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

// Indexed names are the names intern gives for the same text, before and after clear(), in any
// order, and distinct per (prefix, suffix).
TEST(Workload, InternIndexedIsInternOfTheFormattedName) {
  Workload w;
  const std::int32_t params3 = w.intern_indexed("layer", 3, ".params");
  EXPECT_EQ(w.names[static_cast<std::size_t>(params3)], "layer3.params");
  EXPECT_EQ(w.intern("layer3.params"), params3);
  const std::int32_t grads3 = w.intern_indexed("layer", 3, ".grads");
  const std::int32_t ckpt3 = w.intern_indexed("ckpt", 3, "");
  const std::int32_t early = w.intern("ckpt0");
  EXPECT_NE(grads3, params3);
  EXPECT_EQ(w.names[static_cast<std::size_t>(ckpt3)], "ckpt3");
  EXPECT_EQ(w.intern_indexed("ckpt", 0, ""), early);  // interned before, by its text
  w.clear();
  EXPECT_EQ(w.intern_indexed("layer", 3, ".grads"), grads3);
  EXPECT_EQ(w.intern_indexed("layer", 3, ".params"), params3);
  EXPECT_EQ(w.intern("ckpt3"), ckpt3);
  const std::size_t names = w.names.size();
  EXPECT_EQ(w.names[static_cast<std::size_t>(w.intern_indexed("layer", 12, ".params"))],
            "layer12.params");
  EXPECT_EQ(w.names.size(), names + 1);
  EXPECT_THROW(w.intern_indexed("layer", -1, ".params"), std::logic_error);
}

}  // namespace
}  // namespace cpsim::sim
