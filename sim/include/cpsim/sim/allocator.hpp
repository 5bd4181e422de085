#pragma once
/// @file A model of PyTorch's CUDA caching allocator, replayed over the allocations of one rank,
/// for the memory the process holds (reserved; what nvidia-smi shows above the CUDA context)
/// rather than the bytes live in tensors (allocated).
///
/// Model (c10/cuda/CUDACachingAllocator.cpp, read): requests are rounded to 512 B; requests of at
/// most 1 MiB come from a small pool, larger ones from a large pool, and each pool is kept per
/// CUDA stream (here: one pair of pools for the FSDP or ZeRO-3 all-gather stream, which allocates
/// gathered parameters, one for DeepSpeed ZeRO-3's reduce stream, and one for every other stream).
/// A free cached block is reused best-fit (the smallest one that is large enough, lowest address
/// among equals) and split.
///   - Expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True): a pool is one
///     virtual range; when no free block fits, pages are mapped at the lowest unmapped range that,
///     with the free block before it, is large enough (pages of 2 MiB in the small pool and 20 MiB
///     in the large one). Any remainder of at least 512 B is split off.
///   - Segments (the default): a miss cudaMallocs a new segment of 2 MiB (small requests), 20 MiB
///     (requests under 10 MiB) or the request rounded to 2 MiB; blocks merge only inside their own
///     segment, and a large block is split only when more than 1 MiB would remain.
/// When mapping or cudaMalloc would exceed the capacity, the allocator frees its cached free memory
/// (whole free segments; the free pages of expandable segments) and tries again; a request that
/// still does not fit is an out-of-memory error.
/// Not modelled: max_split_size_mb, roundup_power2_divisions, garbage_collection_threshold, the
/// expandable "best fit by size after growth" tie-break, and record_stream delays of frees.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>

namespace cpsim::sim {

/// Stream pools the model keeps apart: 0 default, 1 FSDP / all-gather stream, 2 reduce stream.
inline constexpr std::uint8_t kStreamPoolCount = 3;

/// One allocation or free of a rank's device memory, in the order the engine made them.
struct AllocationEvent {
  std::int64_t key = 0;    ///< identifies the allocation (tensor id, or an op's workspace)
  std::int64_t bytes = 0;  ///< as requested (already rounded to 512 B by the engine)
  std::int32_t rank = 0;
  /// 0: default pools, 1: the FSDP (ZeRO-3 all-gather) stream's, 2: ZeRO-3's reduce stream's
  std::uint8_t stream_pool = 0;
  bool allocate = true;  ///< false: the allocation with `key` is freed
};

/// Entries [begin, begin + copies × period) of a log are `copies` copies of the `period` entries
/// before `begin`, each the one before with its ops and tensors moved on by one block (the same
/// requests, sizes, ranks, pools and order; frees of the same allocations relative to the block,
/// or of allocations made before it).
struct AllocationRepeat {
  std::size_t begin = 0;
  std::size_t period = 0;
  std::int32_t copies = 0;
};

enum class AllocatorMode : std::uint8_t { kExpandableSegments, kSegments };

struct AllocatorConfig {
  AllocatorMode mode = AllocatorMode::kExpandableSegments;
  /// Bytes the allocator may reserve: device memory less what lives outside it (CUDA context,
  /// NCCL and library workspaces).
  std::int64_t capacity_bytes = 0;
  /// Allocated before the step and never freed (model states), in the default large pool.
  std::int64_t static_bytes = 0;
};

struct AllocatorReplay {
  std::int64_t peak_reserved_bytes = 0;   ///< highest reserved (mapped or cudaMalloc'ed) bytes
  std::int64_t peak_allocated_bytes = 0;  ///< highest allocated bytes (the engine's own peak)
  std::int32_t cache_releases = 0;        ///< times the cache was emptied to satisfy a request
  bool out_of_memory = false;             ///< a request did not fit even with the cache emptied
  /// Copies of a repeated period applied without replaying them request by request.
  std::int32_t copies_applied = 0;
};

/// Replays the events of `rank` (others are skipped) through the model above.
/// @throws std::logic_error when a free names no live allocation (an engine bug).
AllocatorReplay replay_allocator(std::span<const AllocationEvent> events,
                                 std::int32_t rank,
                                 const AllocatorConfig& config);

/// The same for a log with repeated periods (`repeats`, in order, as the engine lists them). When
/// the allocator's blocks at a repeat's begin are those at its period's begin, and every free in a
/// copy of an allocation made before the copy frees the block its period's free freed, the copy
/// does to the blocks what the period did: it is applied without a replay (the blocks, the peaks
/// and the counts stay; only which request holds which block moves on). Any other copy is replayed
/// request by request. The result is the full replay's.
AllocatorReplay replay_allocator(std::span<const AllocationEvent> events,
                                 std::span<const AllocationRepeat> repeats,
                                 std::int32_t rank,
                                 const AllocatorConfig& config);

/// Reserved bytes over a replay: `applied` is how many entries of `events` (all ranks) have been
/// replayed when the reserved bytes are `reserved_bytes`.
using ReservedObserver = std::function<void(std::size_t applied, std::int64_t reserved_bytes)>;

/// The same, telling `observer` the reserved bytes once before the first event (after the static
/// memory, applied = 0) and after every event of `rank`.
AllocatorReplay replay_allocator(std::span<const AllocationEvent> events,
                                 std::int32_t rank,
                                 const AllocatorConfig& config,
                                 const ReservedObserver& observer);

}  // namespace cpsim::sim
