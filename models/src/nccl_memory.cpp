// NCCL's device memory per communicator. Derivation (NCCL v2.29.7-1, REFERENCES.md
// [NCCL-memory]; file:line at that tag; "inferred" marks what is arithmetic, not a line read):
//
// Allocation. With cuMem (NCCL_CUMEM_ENABLE auto: on; PyTorch leaves it) every device allocation
// is its own cuMemCreate rounded up to the granularity g (include/alloc.h:255-282), 2 MiB on
// Hopper: no sub-allocator. Connections and their buffers are made on first use of an algorithm
// or a peer (NCCL_RUNTIME_CONNECT=1 since 2.22.3, init.cc:54, active with cuMem, init.cc:1362).
//
// Init (ncclCommInitRank): the device comm and rankToLocalRank (init.cc:557,559), and 3
// allocations per channel (channel.cc:41-58) for every channel up to p2pnChannels =
// pow2Up(nChannels) (graph/paths.cc:895-911): (2 + 3·P)·g. With NVLink SHARP, one allocation
// per NVLS channel (channel.cc:95) and the credits (nvls.cc:402-431): (n_nvls + 1)·g.
//
// A connection's buffers: SIMPLE 4 MiB (DEFAULT_BUFFSIZE), LL 8·512·8·16 B = 512 KiB, LL128
// 120·640·8·8 B = 4,915,200 B (init.cc:753-755, device.h), all three for every connection
// whatever the protocol used (transport/p2p.cc:466-468, transport/net.cc:887-891,1054-1058),
// beside a 4 KiB ncclSendMem/ncclRecvMem (comm.h:41,49). Over NVLink (P2P transport, write mode
// on Hopper: paths.cc:372-376) the sender holds its ncclSendMem and the receiver its ncclRecvMem
// and the three buffers, each side rounded to CUDA_IPC_MIN = 2 MiB (p2p.cc:397-400,466-469) and
// to g: 2 MiB + 10 MiB on H100. In read mode (A100) SIMPLE moves to the sender. Over the network
// with GPUDirect RDMA: the sender SIMPLE + LL128 on the GPU (net.cc:887-917), the receiver all
// three (net.cc:1054-1087), each rounded likewise: 10 MiB + 10 MiB.
//
// Ring (the first ring collective, group.cc:148-190): per channel one send and one receive
// connection. Inside a node both are NVLink. Across nodes each channel's ring enters and leaves a
// node once, so a rank sends and receives over the network on about ⌈C / ranks on its node⌉
// channels (inferred) and over NVLink on the rest.
// Trees (all-reduce across nodes) and CollNet are not modelled.
//
// NVLS (set up at init where multicast is supported and the node has ≥ 2 of the communicator's
// GPUs, nvls.cc:157-200; buffers at the first all-gather/reduce-scatter/all-reduce NCCL runs
// with it, assumed to be the first of those: on one node only, as plain NVLS across nodes needs
// CollNet, tuning.cc:469-472; NVLS_TREE is not modelled): n_nvls · 2 ·
// (128 KiB · 8 steps) · n_heads (nvls.cc:331-335), n_heads = the communicator's GPUs on the node
// (search.cc:1065-1073): 256 MiB on 8 H100s.
//
// Point to point (ncclSend/ncclRecv; ncclAlltoAll is a send and a receive per peer,
// enqueue.cc:2936-2943): the first call to a peer connects all its channels (enqueue.cc:2527-2556).
// Channels per peer: the minimum over the peers of 2·max(1, bw/nvlBw) for an NVLink peer and
// max(NICs, ⌈NIC GB/s / 14⌉) for a remote one, rounded up to a power of two; within a node
// capped at P; across nodes halved while per_peer · ⌈n / 8⌉ > P (paths.cc:834-906). NVLink peers
// cost a connection per channel; remote peers share one pool per direction of P · 16 steps ·
// 128 KiB (net.cc:636-672, NCCL_P2P_NET_CHUNKSIZE), on the GPU with GDR.
#include "cpsim/models/nccl_memory.hpp"

#include <algorithm>
#include <cassert>

namespace cpsim::models {
namespace {

constexpr std::int64_t kKiB = 1024;
constexpr std::int64_t kMiB = 1024 * kKiB;
constexpr std::int64_t kSimpleBytes = 4 * kMiB;          // DEFAULT_BUFFSIZE
constexpr std::int64_t kLlBytes = 8 * 512 * 8 * 16;      // DEFAULT_LL_BUFFSIZE
constexpr std::int64_t kLl128Bytes = 120 * 640 * 8 * 8;  // DEFAULT_LL128_BUFFSIZE
constexpr std::int64_t kConnectionInfoBytes = 4096;      // ncclSendMem / ncclRecvMem
constexpr std::int64_t kIpcMinBytes = 2 * kMiB;          // CUDA_IPC_MIN
constexpr std::int64_t kNvlsStepBytes = 128 * kKiB * 8;  // NCCL_NVLS_CHUNKSIZE · NCCL_STEPS
constexpr std::int64_t kNetPoolBytesPerChannel = 16 * 128 * kKiB;  // NCCL_SHARED_STEPS · chunk
constexpr int kP2pPerBatch = 8;  // NCCL_MAX_DEV_WORK_P2P_PER_BATCH

std::int64_t round_up(std::int64_t bytes, std::int64_t granularity) {
  return granularity > 0 ? (bytes + granularity - 1) / granularity * granularity : bytes;
}

int pow2_up(int n) {
  int p = 1;
  while (p < n) {
    p *= 2;
  }
  return p;
}

struct ConnectionBytes {
  std::int64_t nvlink_send, nvlink_receive, net_send, net_receive;
};

ConnectionBytes connection_bytes(const NcclTopology& t) {
  const std::int64_t g = t.allocation_granularity_bytes;
  const auto alloc = [&](std::int64_t bytes) { return round_up(round_up(bytes, kIpcMinBytes), g); };
  const std::int64_t simple_on_sender = t.nvlink_p2p_read ? kSimpleBytes : 0;
  return {alloc(kConnectionInfoBytes + simple_on_sender),
          alloc(kConnectionInfoBytes + kLlBytes + kLl128Bytes + kSimpleBytes - simple_on_sender),
          alloc(kSimpleBytes + kLl128Bytes), alloc(kSimpleBytes + kLlBytes + kLl128Bytes)};
}

}  // namespace

NcclMemory nccl_device_memory(const NcclTopology& t, const CommunicatorUse& use) {
  NcclMemory m;
  if (use.ranks < 2 || t.collective_channels_intra_node <= 0) {
    return m;
  }
  assert(use.nodes >= 1 && use.ranks_on_node >= 1);
  const std::int64_t g = t.allocation_granularity_bytes;
  const bool one_node = use.nodes == 1;
  const int channels =
      one_node ? t.collective_channels_intra_node : t.collective_channels_inter_node;
  const int p2p_channels = pow2_up(std::min(channels, 64));
  const bool nvls = t.nvls_channels > 0 && one_node;
  m.init_bytes = round_up(1, g) * (2 + 3 * static_cast<std::int64_t>(p2p_channels));
  if (nvls) {
    m.init_bytes += round_up(1, g) * (t.nvls_channels + 1);
  }
  const ConnectionBytes c = connection_bytes(t);
  if (use.collectives) {
    // Channels whose ring leaves (and enters) the node at this rank.
    const std::int64_t net_channels =
        one_node ? 0 : (channels + use.ranks_on_node - 1) / use.ranks_on_node;
    m.ring_bytes = channels * (c.nvlink_send + c.nvlink_receive) +
                   net_channels * (c.net_send - c.nvlink_send + c.net_receive - c.nvlink_receive);
    if (nvls) {
      m.nvls_bytes = round_up(t.nvls_channels * 2 * kNvlsStepBytes * use.ranks_on_node, g);
    }
  }
  const int local_peers = use.all_to_all ? use.ranks_on_node - 1 : 0;
  const int sends = local_peers + std::min(use.send_peers, use.ranks_on_node - 1);
  const int receives = local_peers + std::min(use.receive_peers, use.ranks_on_node - 1);
  const bool remote_peers =
      !one_node && (use.all_to_all || use.send_peers > 0 || use.receive_peers > 0);
  if (sends + receives > 0 || remote_peers) {
    int per_peer =
        pow2_up(one_node ? t.p2p_channels_per_nvlink_peer
                         : std::min(t.p2p_channels_per_nvlink_peer, t.p2p_channels_per_net_peer));
    if (one_node) {
      per_peer = std::min(per_peer, p2p_channels);
    } else {
      while (per_peer * ((use.ranks + kP2pPerBatch - 1) / kP2pPerBatch) > p2p_channels &&
             per_peer > 1) {
        per_peer /= 2;
      }
    }
    m.p2p_bytes =
        static_cast<std::int64_t>(per_peer) * (sends * c.nvlink_send + receives * c.nvlink_receive);
    if (remote_peers) {
      m.p2p_bytes += 2 * round_up(p2p_channels * kNetPoolBytesPerChannel, g);
    }
  }
  return m;
}

}  // namespace cpsim::models
