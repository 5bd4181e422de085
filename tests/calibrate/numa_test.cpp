// A GPU's NUMA node and CPUs from sysfs (numa.hpp): CPU lists as Linux writes them, and a fake
// sysfs tree with a two-socket node's entries.
#include "cpsim/calibrate/numa.hpp"

#include <filesystem>
#include <fstream>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

namespace cpsim::calibrate {
namespace {

namespace fs = std::filesystem;

TEST(CpuList, ParsesRangesAndSingles) {
  EXPECT_EQ(parse_cpu_list("0-3,8,10-11\n"), (std::vector<int>{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parse_cpu_list("5"), (std::vector<int>{5}));
  EXPECT_TRUE(parse_cpu_list("").empty());
  for (const char* bad : {"3-1", "a", "1,,2", "1-", "-2", "1,", "0-3 x"}) {
    EXPECT_TRUE(parse_cpu_list(bad).empty()) << bad;
  }
}

class FakeSysfs : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("cpsim-sysfs-" + std::to_string(::getpid()));
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  void write(const fs::path& relative, const std::string& text) {
    fs::create_directories((root_ / relative).parent_path());
    std::ofstream(root_ / relative) << text;
  }
  fs::path root_;
};

TEST_F(FakeSysfs, TheGpusNodeAndItsCpus) {
  // cudaDeviceGetPCIBusId writes upper-case hex; sysfs names the device in lower case.
  write("bus/pci/devices/0000:9b:00.0/numa_node", "1\n");
  write("devices/system/node/node1/cpulist", "56-111,168-223\n");
  const NumaPlacement p = numa_placement("0000:9B:00.0", root_);
  EXPECT_EQ(p.node, 1);
  ASSERT_EQ(p.cpus.size(), 112U);
  EXPECT_EQ(p.cpus.front(), 56);
  EXPECT_EQ(p.cpus.back(), 223);
}

TEST_F(FakeSysfs, UnknownWithoutAnEntryOrWithNodeMinusOne) {
  EXPECT_EQ(numa_placement("0000:01:00.0", root_).node, -1);
  // A single-node host (or a VM) reports -1.
  write("bus/pci/devices/0000:00:06.0/numa_node", "-1\n");
  const NumaPlacement p = numa_placement("0000:00:06.0", root_);
  EXPECT_EQ(p.node, -1);
  EXPECT_TRUE(p.cpus.empty());
  // A node without a readable CPU list is unknown too.
  write("bus/pci/devices/0000:00:07.0/numa_node", "0\n");
  EXPECT_EQ(numa_placement("0000:00:07.0", root_).node, -1);
}

}  // namespace
}  // namespace cpsim::calibrate
