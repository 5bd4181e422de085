#pragma once
/// @file NCCL's device memory per communicator and rank: what NCCL 2.29.7 (the version PyTorch
/// 2.13.0 pins) allocates at init and when a communicator first runs an algorithm, from its source
/// and the topology a hardware profile states. Derivation and sources: docs/MODEL.md "NCCL memory",
/// REFERENCES.md [NCCL-memory].
#include <cstdint>

namespace cpsim::models {

/// What NCCL's topology search gives on one kind of node (`memory_overheads.nccl` of a hardware
/// profile): channel counts, NVLink SHARP, P2P read mode and the allocation granularity.
struct NcclTopology {
  int collective_channels_intra_node = 0;  ///< ring/tree channels of a communicator in one node
  int collective_channels_inter_node = 0;  ///< of a communicator spanning nodes
  int p2p_channels_per_nvlink_peer = 0;    ///< before the communicator-wide cap and halving
  int p2p_channels_per_net_peer = 0;       ///< before the communicator-wide halving
  int nvls_channels = 0;                   ///< NVLink SHARP channels; 0: no NVLS
  bool nvlink_p2p_read = false;            ///< the SIMPLE buffer on the sender (A100)
  std::int64_t allocation_granularity_bytes = 0;  ///< cuMem's, every allocation rounded up to it
};

/// How a rank uses one communicator (NCCL connects an algorithm's channels, and a peer's, on
/// first use). The counts are those of the rank that holds the most.
struct CommunicatorUse {
  int ranks = 0;             ///< members
  int nodes = 1;             ///< nodes the members span
  int ranks_on_node = 0;     ///< members on the rank's node
  bool collectives = false;  ///< all-gather, reduce-scatter or all-reduce run over it
  bool all_to_all = false;   ///< send and receive with every other member
  /// Point-to-point neighbours besides an all-to-all's (a ring's next and previous rank, a
  /// pipeline's stages): connections the rank sends on and receives on.
  int send_peers = 0, receive_peers = 0;
};

/// Device bytes one communicator holds on a rank, by when NCCL allocates them.
struct NcclMemory {
  std::int64_t init_bytes = 0;  ///< at ncclCommInitRank: the device comm and every channel
  std::int64_t ring_bytes = 0;  ///< ring connections, at the first ring collective
  std::int64_t nvls_bytes = 0;  ///< NVLS buffers (set-up at init, buffers at the first use)
  std::int64_t p2p_bytes = 0;   ///< point-to-point connections and pools, per peer on first use
  std::int64_t total() const { return init_bytes + ring_bytes + nvls_bytes + p2p_bytes; }
};

/// NCCL's device memory for one communicator used as `use` describes (none below two ranks, and
/// none for a topology left empty: a profile built in code without one).
NcclMemory nccl_device_memory(const NcclTopology& topology, const CommunicatorUse& use);

}  // namespace cpsim::models
