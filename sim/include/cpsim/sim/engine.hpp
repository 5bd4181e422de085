#pragma once
/// @file Discrete-event simulation of one training step over a Workload.
///
/// Model. Time is integer nanoseconds; ties are broken by insertion order, so equal inputs give
/// byte-identical results. An op starts when (1) all its dependencies have ended, (2) it is at the
/// head of its stream (CUDA in-order semantics), and (3) for a collective, every member rank has
/// reached its op. Running work is fluid: each activity has remaining work and a rate that is
/// recomputed whenever an activity starts or ends on the same rank:
///   - compute op: work = duration at full speed; rate = 1 / (1 + slowdown) while an SM-driven
///     collective runs on that rank (profile `compute_slowdown_under_comm`), else 1;
///   - collective: work = wire bytes + alpha·nominal_bw; rate = nominal_bw × min over members of
///     1 / (collectives running on that member's link). Latency therefore stretches under sharing,
///     a small pessimism we accept;
///   - host copy: rate = per-direction PCIe bandwidth / (copies in that direction), and at most
///     half the duplex total when both directions are busy on the rank.
/// Memory. A tensor is allocated when its producer starts and freed when its last consumer ends
/// (or when the producer ends if nothing consumes it); an op's workspace lives while it runs.
/// Allocations are rounded up to 512 B as in PyTorch's caching allocator.

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cpsim/models/units.hpp"
#include "cpsim/sim/allocator.hpp"
#include "cpsim/sim/huge_pages.hpp"
#include "cpsim/sim/workload.hpp"

namespace cpsim::sim {

/// Bytes the engine allocates for a request: rounded up to 512 B (PyTorch's kMinBlockSize).
constexpr std::int64_t allocation_bytes(std::int64_t requested) {
  return (requested + 511) / 512 * 512;
}

struct SimOptions {
  bool record_trace = false;  ///< keep per-op intervals and memory samples for a trace file
  /// With record_trace: the ranks whose memory samples are kept (index = rank; empty: every
  /// rank). Intervals are kept for every rank (peak_contents needs the peak rank's).
  std::vector<bool> sampled_ranks{};
  /// Keep every device allocation and free in order (SimResult::allocations), for the caching
  /// allocator model (allocator.hpp).
  bool log_allocations = false;
  /// Stop once a rank's device memory exceeds this many bytes (0: never). For searches that only
  /// need to know that a configuration does not fit: the run then stops early and its times and
  /// busy totals cover the step only up to that instant (SimResult::stopped_early).
  std::int64_t stop_above_device_bytes = 0;
  /// Stop once the pinned host bytes of one node exceed this many bytes (0: never), counted as
  /// summarize() counts them: the sum of the host peaks so far of the node's ranks (on the
  /// representative-rank path, rank 0's times the ranks of its node). Peaks only grow, so the
  /// step's host memory is then above it too (StepReport::fits_host is false for this capacity).
  std::int64_t stop_above_host_bytes = 0;
  /// Skip over transformer blocks the engine finds exactly periodic: at the start of a block whose
  /// state (queues, running activities, pending events, relative to the block) is the previous
  /// block's shifted, and whose ops, tensors and collectives up to the last block but one are the
  /// previous ones shifted, the blocks in between are not simulated but added (times, busy
  /// totals, memory deltas). Every reported number is the one the full run gives
  /// (engine_fast_forward.inc, "Fast-forward"), the allocation log included (the skipped blocks'
  /// entries are the block before's, moved). Off with record_trace, which needs every op's
  /// interval.
  bool fast_forward = true;
};

/// Interval an op ran in (trace only).
struct OpInterval {
  OpId op = kNone;
  SimTime start_ns = 0;
  SimTime end_ns = 0;
};

/// Memory counter sample of one rank (trace only): its memory after a change. Consecutive changes
/// of one rank at one instant are one sample (the state after the last).
struct MemorySample {
  std::int32_t rank = 0;
  SimTime time_ns = 0;
  std::array<std::int64_t, kMemCategoryCount> device_bytes{};  ///< live, by category
  std::int64_t host_bytes = 0;                                 ///< pinned host memory held
  /// SimResult::allocations made so far (all ranks): the sample shows the state after them.
  std::int64_t allocations = 0;
};

struct RankMemory {
  /// Device peak of allocated tensors incl. static memory (model states) and fixed overheads.
  std::int64_t peak_bytes = 0;
  SimTime peak_time_ns = 0;
  OpId peak_op = kNone;  ///< the op whose allocation set the peak
  std::array<std::int64_t, kMemCategoryCount> breakdown_at_peak{};  ///< by category at the peak
  std::int64_t fixed_overhead_bytes = 0;                            ///< incl. nccl_bytes
  std::int64_t nccl_bytes = 0;  ///< NCCL's communicators (StaticMemory::nccl_bytes)
  /// Highest live bytes of each category on its own over the step (not at the same instant).
  std::array<std::int64_t, kMemCategoryCount> category_peak{};
  std::int64_t host_peak_bytes = 0;  ///< pinned host memory held by this rank at its peak
};

struct StreamBusy {
  std::array<SimTime, kStreamCount> busy_ns{};
};

struct SimResult {
  SimTime step_time_ns = 0;
  std::vector<RankMemory> memory;     ///< per rank
  std::vector<StreamBusy> busy;       ///< per rank
  std::int64_t events = 0;            ///< events processed by the loop
  std::vector<OpInterval> intervals;  ///< when record_trace
  /// When record_trace and the host issue model is on: each op with host calls as its rank's host
  /// issued it (from its first call to its issue), in issue order per rank.
  std::vector<OpInterval> host_intervals;
  std::vector<MemorySample> memory_samples;  ///< when record_trace
  /// When log_allocations, in the order made (hundreds of thousands of entries in a long step:
  /// huge pages).
  std::vector<AllocationEvent, HugePageAllocator<AllocationEvent>> allocations;
  /// The runs of `allocations` a fast-forward added as copies of the block before (in order).
  std::vector<AllocationRepeat> allocation_repeats;
  /// Device memory exceeded SimOptions::stop_above_device_bytes, or a node's host memory
  /// SimOptions::stop_above_host_bytes, and the run stopped there: that peak is at least the
  /// limit; times are not the step's.
  bool stopped_early = false;
  /// Blocks SimOptions::fast_forward added instead of simulating op by op.
  std::int32_t fast_forwarded_blocks = 0;
};

/// Runs one step. @throws std::logic_error if the workload is malformed (a builder bug): a cycle,
/// or a collective some member never reaches.
SimResult simulate(const Workload& workload,
                   const models::HardwareProfile& profile,
                   const SimOptions& options = {});

/// The same with buffers kept from run to run: evaluations in a loop (one Simulator per thread)
/// reuse their capacity instead of allocating and faulting in fresh memory every time.
class Simulator {
 public:
  Simulator();
  ~Simulator();
  Simulator(Simulator&&) noexcept;
  Simulator& operator=(Simulator&&) noexcept;
  /// As simulate().
  SimResult run(const Workload& workload,
                const models::HardwareProfile& profile,
                const SimOptions& options = {});
  /// Takes back the buffers of a result read to the end (its allocation log), for the next run
  /// to fill instead of faulting fresh pages in: the next result does not depend on it.
  void recycle(SimResult&& spent);

  struct Scratch;

 private:
  std::unique_ptr<Scratch> scratch_;
};

/// Checks that the op graph (deps, stream order, collective rendezvous) is acyclic, with
/// Boost.Graph's topological sort. @throws std::logic_error naming an op on a cycle.
void check_acyclic(const Workload& workload);

}  // namespace cpsim::sim
