#include "cpsim/sim/allocator.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

namespace cpsim::sim {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kMinBlockBytes = 512;       // kMinBlockSize
constexpr std::int64_t kSmallRequestBytes = kMiB;  // kSmallSize: the small pool's largest request
constexpr std::int64_t kSmallBufferBytes = 2 * kMiB;     // kSmallBuffer
constexpr std::int64_t kLargeBufferBytes = 20 * kMiB;    // kLargeBuffer
constexpr std::int64_t kMinLargeAllocBytes = 10 * kMiB;  // kMinLargeAlloc
constexpr std::int64_t kRoundLargeBytes = 2 * kMiB;      // kRoundLarge
// Virtual size of an expandable segment: larger than any device.
constexpr std::int64_t kSegmentSpan = std::int64_t{1} << 48;

std::int64_t round_up(std::int64_t x, std::int64_t unit) {
  return (x + unit - 1) / unit * unit;
}

enum class BlockState : std::uint8_t { kUsed, kFree, kUnmapped };

struct Block {
  std::int64_t size = 0;
  std::int32_t segment = 0;
  BlockState state = BlockState::kFree;
};

// One pool (stream × small/large) of one rank. Blocks are kept by address; free mapped blocks are
// also kept by (size, address) for best fit.
class Pool {
 public:
  Pool(AllocatorMode mode, bool small) : mode_(mode), small_(small) {}

  bool small() const { return small_; }
  std::int64_t page() const { return small_ ? kSmallBufferBytes : kLargeBufferBytes; }

  /// The address of the best-fitting free block for `size`, taken and split; -1 on a miss.
  std::int64_t take_free(std::int64_t size) {
    const auto it = free_.lower_bound({size, std::int64_t{-1}});
    if (it == free_.end()) {
      return -1;
    }
    const std::int64_t addr = it->second;
    take(addr, size);
    return addr;
  }

  /// Frees the block at `addr` and merges it with free neighbours of its segment.
  void release(std::int64_t addr) {
    auto it = blocks_.find(addr);
    assert(it != blocks_.end() && it->second.state == BlockState::kUsed);
    it->second.state = BlockState::kFree;
    it = merge_with_neighbours(it);
    free_.insert({it->second.size, it->first});
  }

  // ---- expandable segments ----

  /// Maps pages so that a free block of at least `size` exists and takes it. Returns its address,
  /// or -1 when mapping would take reserved bytes above `capacity`.
  std::int64_t map_and_take(std::int64_t size, std::int64_t& reserved, std::int64_t capacity) {
    if (blocks_.empty()) {
      blocks_.emplace(0, Block{kSegmentSpan, 0, BlockState::kUnmapped});
    }
    // The lowest unmapped range that, with the free block before it, has room.
    auto candidate = blocks_.end();
    for (auto it = blocks_.begin(); it != blocks_.end(); ++it) {
      if (it->second.state != BlockState::kUnmapped) {
        continue;
      }
      auto start = it;
      if (it != blocks_.begin() && std::prev(it)->second.state == BlockState::kFree) {
        start = std::prev(it);
      }
      std::int64_t room = 0;
      for (auto c = start;
           c != blocks_.end() && c->second.state != BlockState::kUsed && room < size; ++c) {
        room += c->second.size;
      }
      if (room >= size) {
        candidate = start;
        break;
      }
    }
    assert(candidate != blocks_.end());  // the segment's span exceeds any device
    // Bytes to map: what the free and unmapped run from the candidate lacks, in whole pages.
    std::int64_t need = 0;
    std::int64_t room = 0;
    for (auto c = candidate; room < size; ++c) {
      if (c->second.state == BlockState::kFree) {
        room += c->second.size;
      } else {
        const std::int64_t m = std::min(c->second.size, round_up(size - room, page()));
        need += m;
        room += m;
      }
    }
    if (reserved + need > capacity) {
      return -1;
    }
    reserved += need;
    // Map piece by piece; each mapped piece merges into the free block that starts the run.
    const std::int64_t start = candidate->first;
    for (;;) {
      auto block = std::prev(blocks_.upper_bound(start));
      std::int64_t have = 0;
      auto after = block;
      if (block->second.state == BlockState::kFree) {
        have = block->second.size;
        ++after;
      }
      if (have >= size) {
        take(block->first, size);
        return block->first;
      }
      assert(after != blocks_.end() && after->second.state == BlockState::kUnmapped);
      map_front(after, std::min(after->second.size, round_up(size - have, page())));
    }
  }

  /// Unmaps the whole pages inside free blocks; returns the bytes unmapped.
  std::int64_t unmap_free() {
    std::int64_t unmapped = 0;
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      if (it->second.state != BlockState::kFree) {
        ++it;
        continue;
      }
      const std::int64_t begin = it->first;
      const std::int64_t end = begin + it->second.size;
      const std::int64_t page_begin = round_up(begin, page());
      const std::int64_t page_end = end / page() * page();
      if (page_end <= page_begin) {
        ++it;
        continue;
      }
      free_.erase({it->second.size, begin});
      const std::int32_t segment = it->second.segment;
      blocks_.erase(it);
      if (page_begin > begin) {
        blocks_.emplace(begin, Block{page_begin - begin, segment, BlockState::kFree});
        free_.insert({page_begin - begin, begin});
      }
      if (end > page_end) {
        blocks_.emplace(page_end, Block{end - page_end, segment, BlockState::kFree});
        free_.insert({end - page_end, page_end});
      }
      auto hole =
          blocks_.emplace(page_begin, Block{page_end - page_begin, segment, BlockState::kUnmapped})
              .first;
      unmapped += page_end - page_begin;
      hole = merge_with_neighbours(hole);
      it = std::next(hole);
    }
    return unmapped;
  }

  // ---- cudaMalloc'ed segments ----

  /// Adds a free segment of `bytes` (a cudaMalloc) and takes `size` from it.
  std::int64_t add_segment_and_take(std::int64_t bytes, std::int64_t size) {
    const std::int64_t addr = next_segment_addr_;
    next_segment_addr_ += bytes + kSegmentGap;
    blocks_.emplace(addr, Block{bytes, next_segment_++, BlockState::kFree});
    free_.insert({bytes, addr});
    take(addr, size);
    return addr;
  }

  /// cudaFrees every free block that is a whole segment; returns the bytes freed.
  std::int64_t free_whole_segments() {
    std::int64_t freed = 0;
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      if (it->second.state == BlockState::kFree && whole_segment(it)) {
        freed += it->second.size;
        free_.erase({it->second.size, it->first});
        it = blocks_.erase(it);
      } else {
        ++it;
      }
    }
    return freed;
  }

 private:
  using Iter = std::map<std::int64_t, Block>::iterator;
  // Addresses left between cudaMalloc'ed segments, so that blocks of two segments are never
  // adjacent (the segment number already keeps them apart; this keeps addresses unambiguous).
  static constexpr std::int64_t kSegmentGap = kMinBlockBytes;

  bool should_split(std::int64_t remaining) const {
    if (small_ || mode_ == AllocatorMode::kExpandableSegments) {
      return remaining >= kMinBlockBytes;
    }
    return remaining > kSmallRequestBytes;
  }

  bool whole_segment(Iter it) const {
    const bool first = it == blocks_.begin() || std::prev(it)->second.segment != it->second.segment;
    const auto next = std::next(it);
    const bool last = next == blocks_.end() || next->second.segment != it->second.segment;
    return first && last;
  }

  // Marks the free block at addr used for `size` bytes, splitting off the remainder.
  void take(std::int64_t addr, std::int64_t size) {
    auto it = blocks_.find(addr);
    assert(it != blocks_.end() && it->second.state == BlockState::kFree);
    free_.erase({it->second.size, addr});
    const std::int64_t remaining = it->second.size - size;
    it->second.state = BlockState::kUsed;
    if (should_split(remaining)) {
      it->second.size = size;
      blocks_.emplace(addr + size, Block{remaining, it->second.segment, BlockState::kFree});
      free_.insert({remaining, addr + size});
    }
  }

  // Maps the first `bytes` of the unmapped block `it`: they become a free block, merged with free
  // neighbours. Returns the free block that holds them.
  Iter map_front(Iter it, std::int64_t bytes) {
    const std::int64_t addr = it->first;
    const std::int64_t rest = it->second.size - bytes;
    const std::int32_t segment = it->second.segment;
    it->second.size = bytes;
    it->second.state = BlockState::kFree;
    if (rest > 0) {
      blocks_.emplace(addr + bytes, Block{rest, segment, BlockState::kUnmapped});
    }
    it = merge_with_neighbours(it);
    free_.insert({it->second.size, it->first});
    return it;
  }

  // Merges the block at `it` (free or unmapped, not in free_) with neighbours of the same state
  // and segment; returns the merged block (not in free_).
  Iter merge_with_neighbours(Iter it) {
    const BlockState state = it->second.state;
    const auto mergeable = [&](Iter other) {
      return other->second.state == state && other->second.segment == it->second.segment &&
             !(mode_ == AllocatorMode::kSegments && state == BlockState::kUnmapped);
    };
    if (const auto next = std::next(it);
        next != blocks_.end() && mergeable(next) && next->first == it->first + it->second.size) {
      if (state == BlockState::kFree) {
        free_.erase({next->second.size, next->first});
      }
      it->second.size += next->second.size;
      blocks_.erase(next);
    }
    if (it != blocks_.begin()) {
      const auto prev = std::prev(it);
      if (mergeable(prev) && prev->first + prev->second.size == it->first) {
        if (state == BlockState::kFree) {
          free_.erase({prev->second.size, prev->first});
        }
        prev->second.size += it->second.size;
        blocks_.erase(it);
        it = prev;
      }
    }
    return it;
  }

  AllocatorMode mode_;
  bool small_;
  std::map<std::int64_t, Block> blocks_;
  std::set<std::pair<std::int64_t, std::int64_t>> free_;  // (size, address) of free mapped blocks
  std::int64_t next_segment_addr_ = 0;
  std::int32_t next_segment_ = 0;
};

class Replay {
 public:
  explicit Replay(const AllocatorConfig& config)
      : config_(config),
        pools_{Pool(config.mode, true), Pool(config.mode, false), Pool(config.mode, true),
               Pool(config.mode, false)} {}

  void allocate(std::int64_t key, std::int64_t bytes, std::uint8_t stream_pool) {
    const std::size_t p = 2 * std::size_t{stream_pool} + (bytes <= kSmallRequestBytes ? 0 : 1);
    Pool& pool = pools_[p];
    std::int64_t addr = pool.take_free(bytes);
    if (addr < 0) {
      addr = grow(pool, bytes);
      if (addr < 0) {
        ++out_.cache_releases;
        release_cache();
        addr = grow(pool, bytes);
      }
      if (addr < 0) {
        // Out of memory: carry on with the capacity ignored, so that the peak is still measured.
        out_.out_of_memory = true;
        const std::int64_t capacity = config_.capacity_bytes;
        config_.capacity_bytes = std::numeric_limits<std::int64_t>::max();
        addr = grow(pool, bytes);
        config_.capacity_bytes = capacity;
      }
    }
    live_.emplace(key, std::pair{p, addr});
    allocated_ += bytes;
    out_.peak_allocated_bytes = std::max(out_.peak_allocated_bytes, allocated_);
    out_.peak_reserved_bytes = std::max(out_.peak_reserved_bytes, reserved_);
  }

  void release(std::int64_t key, std::int64_t bytes) {
    const auto it = live_.find(key);
    if (it == live_.end()) {
      throw std::logic_error(fmt::format("allocator replay: free of {} that is not live", key));
    }
    pools_[it->second.first].release(it->second.second);
    live_.erase(it);
    allocated_ -= bytes;
  }

  AllocatorReplay result() const { return out_; }
  std::int64_t reserved_bytes() const { return reserved_; }

 private:
  std::int64_t grow(Pool& pool, std::int64_t bytes) {
    if (config_.mode == AllocatorMode::kExpandableSegments) {
      return pool.map_and_take(bytes, reserved_, config_.capacity_bytes);
    }
    // get_allocation_size: the bytes cudaMalloc'ed for a request that missed the cache.
    std::int64_t segment = kSmallBufferBytes;
    if (!pool.small()) {
      segment = bytes < kMinLargeAllocBytes ? kLargeBufferBytes : round_up(bytes, kRoundLargeBytes);
    }
    if (reserved_ + segment > config_.capacity_bytes) {
      return -1;
    }
    reserved_ += segment;
    return pool.add_segment_and_take(segment, bytes);
  }

  void release_cache() {
    for (Pool& pool : pools_) {
      reserved_ -= config_.mode == AllocatorMode::kExpandableSegments ? pool.unmap_free()
                                                                      : pool.free_whole_segments();
    }
  }

  AllocatorConfig config_;
  // [stream pool × small/large]: 0 small, 1 large (default streams); 2, 3 (FSDP stream).
  std::array<Pool, 4> pools_;
  std::unordered_map<std::int64_t, std::pair<std::size_t, std::int64_t>> live_;
  std::int64_t allocated_ = 0;
  std::int64_t reserved_ = 0;
  AllocatorReplay out_;
};

}  // namespace

AllocatorReplay replay_allocator(std::span<const AllocationEvent> events,
                                 std::int32_t rank,
                                 const AllocatorConfig& config) {
  return replay_allocator(events, rank, config, nullptr);
}

AllocatorReplay replay_allocator(std::span<const AllocationEvent> events,
                                 std::int32_t rank,
                                 const AllocatorConfig& config,
                                 const ReservedObserver& observer) {
  Replay replay(config);
  constexpr std::int64_t kStaticKey = std::numeric_limits<std::int64_t>::min();
  if (config.static_bytes > 0) {
    replay.allocate(kStaticKey, config.static_bytes, 0);
  }
  if (observer) {
    observer(0, replay.reserved_bytes());
  }
  for (std::size_t i = 0; i < events.size(); ++i) {
    const AllocationEvent& e = events[i];
    if (e.rank != rank || e.bytes <= 0) {
      continue;
    }
    if (e.allocate) {
      replay.allocate(e.key, e.bytes, e.stream_pool);
    } else {
      replay.release(e.key, e.bytes);
    }
    if (observer) {
      observer(i + 1, replay.reserved_bytes());
    }
  }
  return replay.result();
}

}  // namespace cpsim::sim
