// NCCL's device memory per communicator (models/nccl_memory.hpp) against cases computed by hand
// from NCCL v2.29.7's constants: a connection over NVLink is 2 MiB on the sender (its 4 KiB
// ncclSendMem rounded to 2 MiB) and 10 MiB on the receiver (4 KiB + LL 512 KiB + LL128 4.6875 MiB
// + SIMPLE 4 MiB, rounded); over the network 10 MiB each side.
#include "cpsim/models/nccl_memory.hpp"

#include <cstdint>

#include <gtest/gtest.h>

namespace cpsim::models {
namespace {

constexpr std::int64_t kMiB = 1024 * 1024;

// The H100 profile's topology (data/hardware/h100-sxm-80g.json).
NcclTopology h100() {
  NcclTopology t;
  t.collective_channels_intra_node = 24;
  t.collective_channels_inter_node = 16;
  t.p2p_channels_per_nvlink_peer = 36;
  t.p2p_channels_per_net_peer = 4;
  t.nvls_channels = 16;
  t.allocation_granularity_bytes = 2 * kMiB;
  return t;
}

CommunicatorUse node_of(int ranks) {
  CommunicatorUse u;
  u.ranks = ranks;
  u.ranks_on_node = ranks;
  return u;
}

CommunicatorUse nodes_of(int ranks, int nodes) {
  CommunicatorUse u;
  u.ranks = ranks;
  u.nodes = nodes;
  u.ranks_on_node = ranks / nodes;
  return u;
}

TEST(NcclMemory, InitHoldsTheCommAndEveryP2pChannelAndNvlsSetUp) {
  // 24 collective channels → p2pnChannels = pow2Up(24) = 32 channels of 3 allocations, the device
  // comm and rankToLocalRank: (2 + 96) · 2 MiB; NVLS: 16 channels + credits, 17 · 2 MiB.
  const NcclMemory m = nccl_device_memory(h100(), node_of(8));
  EXPECT_EQ(m.init_bytes, (196 + 34) * kMiB);
  EXPECT_EQ(m.ring_bytes + m.nvls_bytes + m.p2p_bytes,
            0);  // nothing run over it: nothing connected
}

TEST(NcclMemory, CollectivesInOneNodeConnectTheRingAndNvls) {
  CommunicatorUse u = node_of(8);
  u.collectives = true;
  const NcclMemory m = nccl_device_memory(h100(), u);
  EXPECT_EQ(m.ring_bytes, 24 * 12 * kMiB);         // 288 MiB
  EXPECT_EQ(m.nvls_bytes, 16 * 2 * 1 * 8 * kMiB);  // 256 MiB: 16 channels · 2 · 1 MiB · 8 heads
  EXPECT_EQ(m.total(), (230 + 288 + 256) * kMiB);  // 774 MiB
}

TEST(NcclMemory, AllToAllConnectsEveryPeerOnAllItsChannels) {
  // 2 · 18 links = 36 → 64, capped at the 32 p2p channels: 32 connections per peer each way.
  CommunicatorUse u = node_of(8);
  u.all_to_all = true;
  const NcclMemory m = nccl_device_memory(h100(), u);
  EXPECT_EQ(m.p2p_bytes, 7 * 32 * 12 * kMiB);  // 2688 MiB
  EXPECT_EQ(m.ring_bytes + m.nvls_bytes, 0);
}

TEST(NcclMemory, RingNeighboursCostOnePeerEachWay) {
  CommunicatorUse u = node_of(4);
  u.send_peers = u.receive_peers = 1;
  EXPECT_EQ(nccl_device_memory(h100(), u).p2p_bytes, 32 * 12 * kMiB);  // 384 MiB
}

TEST(NcclMemory, AcrossNodesTheRingLeavesTheNodeOnItsShareOfChannels) {
  // 16 ranks on 2 nodes: 16 channels → p2pnChannels 16: init (2 + 48) · 2 MiB, no NVLS. Ring: 16
  // NVLink pairs of 12 MiB, and on ⌈16 / 8⌉ = 2 channels the send is 10 MiB instead of 2.
  CommunicatorUse u = nodes_of(16, 2);
  u.collectives = true;
  const NcclMemory m = nccl_device_memory(h100(), u);
  EXPECT_EQ(m.init_bytes, 100 * kMiB);
  EXPECT_EQ(m.ring_bytes, (16 * 12 + 2 * 8) * kMiB);
  EXPECT_EQ(m.nvls_bytes, 0);
  // One rank per node (a data-parallel group across nodes): every channel over the network.
  CommunicatorUse spread = nodes_of(4, 4);
  spread.collectives = true;
  EXPECT_EQ(nccl_device_memory(h100(), spread).ring_bytes, 16 * 20 * kMiB);
}

TEST(NcclMemory, AcrossNodesPeersGetFewerChannelsAndRemoteOnesSharePools) {
  // min(36, 4) = 4 per peer; 4 · ⌈16 / 8⌉ = 8 ≤ 16 keeps 4: 7 NVLink peers · 4 · 12 MiB, and a
  // send and a receive pool of 16 channels · 16 steps · 128 KiB = 32 MiB each.
  CommunicatorUse u = nodes_of(16, 2);
  u.all_to_all = true;
  EXPECT_EQ(nccl_device_memory(h100(), u).p2p_bytes, (7 * 4 * 12 + 64) * kMiB);
  // 64 ranks on 8 nodes: 4 · 8 = 32 > 16 halves to 2 (2 · 8 = 16).
  CommunicatorUse wide = nodes_of(64, 8);
  wide.all_to_all = true;
  EXPECT_EQ(nccl_device_memory(h100(), wide).p2p_bytes, (7 * 2 * 12 + 64) * kMiB);
}

TEST(NcclMemory, ReadModeMovesSimpleToTheSender) {
  // A100: sender 4 KiB + 4 MiB → 6 MiB; receiver 4 KiB + 512 KiB + 4.6875 MiB → 6 MiB; no NVLS.
  NcclTopology a100 = h100();
  a100.nvlink_p2p_read = true;
  a100.nvls_channels = 0;
  a100.p2p_channels_per_nvlink_peer = 24;
  CommunicatorUse u = node_of(8);
  u.collectives = true;
  const NcclMemory m = nccl_device_memory(a100, u);
  EXPECT_EQ(m.init_bytes, 196 * kMiB);
  EXPECT_EQ(m.ring_bytes, 24 * 12 * kMiB);
  EXPECT_EQ(m.nvls_bytes, 0);
}

TEST(NcclMemory, NothingForOneRankOrAnEmptyTopology) {
  CommunicatorUse one = node_of(1);
  one.collectives = one.all_to_all = true;
  EXPECT_EQ(nccl_device_memory(h100(), one).total(), 0);
  CommunicatorUse u = node_of(8);
  u.collectives = true;
  EXPECT_EQ(nccl_device_memory(NcclTopology{}, u).total(), 0);
}

}  // namespace
}  // namespace cpsim::models
