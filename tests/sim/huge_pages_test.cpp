// The large-array allocator: small blocks from operator new, large ones on 2 MiB boundaries; either
// way usable memory of the size asked, and vectors using it behave as usual.
#include "cpsim/sim/huge_pages.hpp"

#include <cstdint>
#include <numeric>
#include <vector>

#include <gtest/gtest.h>

namespace cpsim::sim {
namespace {

TEST(HugePageAllocator, SmallAndLargeBlocksHoldWhatIsWritten) {
  HugePageAllocator<std::int64_t> a;
  for (const std::size_t n : {std::size_t{1}, std::size_t{1000}, std::size_t{(3 << 20) / 8 + 7}}) {
    std::int64_t* p = a.allocate(n);
    ASSERT_NE(p, nullptr);
    for (std::size_t i = 0; i < n; ++i) {
      p[i] = static_cast<std::int64_t>(i) * 3;
    }
    EXPECT_EQ(p[n - 1], static_cast<std::int64_t>(n - 1) * 3);
    EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % alignof(std::int64_t), 0U);
#if defined(__linux__)
    if (n * sizeof(std::int64_t) >= (std::size_t{2} << 20)) {
      EXPECT_EQ(reinterpret_cast<std::uintptr_t>(p) % (std::size_t{2} << 20), 0U);
    }
#endif
    a.deallocate(p, n);
  }
}

TEST(HugePageAllocator, VectorsGrowCopyAndCompareAsUsual) {
  std::vector<std::int32_t, HugePageAllocator<std::int32_t>> v;
  for (std::int32_t i = 0; i < 3'000'000; ++i) {  // 12 MB: grows through small and large blocks
    v.push_back(i);
  }
  const auto copy = v;
  EXPECT_EQ(copy, v);
  EXPECT_EQ(std::accumulate(v.begin(), v.end(), std::int64_t{0}), 2'999'999LL * 3'000'000 / 2);
  v.clear();
  v.shrink_to_fit();
  EXPECT_EQ(copy.back(), 2'999'999);
}

}  // namespace
}  // namespace cpsim::sim
