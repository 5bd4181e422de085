// Provenance: copies share their entries until one is changed, and a change never reaches the
// other copies.
#include <string>

#include <gtest/gtest.h>

#include "cpsim/models/hardware.hpp"

namespace cpsim::models {
namespace {

TEST(Provenance, CopiesShareUntilOneIsChanged) {
  Provenance a;
  EXPECT_TRUE(a.empty());
  EXPECT_EQ(a.find("x"), a.end());
  a["gpu.sm_count"] = "(read) 132";
  a["compute.kernel_launch_s"] = "(read) 1 us";
  Provenance b = a;
  EXPECT_EQ(&a.entries(), &b.entries());  // shared
  EXPECT_EQ(a, b);

  b["compute.kernel_launch_s"] = "measured: 3.3 us";
  EXPECT_NE(&a.entries(), &b.entries());
  EXPECT_EQ(a.at("compute.kernel_launch_s"), "(read) 1 us");
  EXPECT_EQ(b.at("compute.kernel_launch_s"), "measured: 3.3 us");
  EXPECT_FALSE(a == b);

  Provenance c = b;
  c.edit().erase("gpu.sm_count");
  EXPECT_EQ(c.count("gpu.sm_count"), 0U);
  EXPECT_EQ(b.count("gpu.sm_count"), 1U);
  EXPECT_EQ(a.size(), 2U);
}

}  // namespace
}  // namespace cpsim::models
