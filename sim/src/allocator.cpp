#include "cpsim/sim/allocator.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "cpsim/sim/huge_pages.hpp"

namespace cpsim::sim {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr std::int64_t kMinBlockBytes = 512;       // kMinBlockSize
constexpr std::int64_t kSmallRequestBytes = kMiB;  // kSmallSize: the small pool's largest request
constexpr std::int64_t kSmallBufferBytes = 2 * kMiB;     // kSmallBuffer
constexpr std::int64_t kLargeBufferBytes = 20 * kMiB;    // kLargeBuffer
constexpr std::int64_t kMinLargeAllocBytes = 10 * kMiB;  // kMinLargeAlloc
constexpr std::int64_t kRoundLargeBytes = 2 * kMiB;      // kRoundLarge
// A small and a large pool per stream pool (AllocationEvent::stream_pool).
constexpr std::size_t kPoolCount = 2 * std::size_t{kStreamPoolCount};
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

// The free mapped blocks of a pool by (size, address), for best fit: a sorted vector, with a set's
// semantics (a pool holds tens to hundreds of free blocks, where a search and a move of a few
// kilobytes beat a tree's node allocations).
class FreeBlocks {
 public:
  using Entry = std::pair<std::int64_t, std::int64_t>;  // (size, address)
  void insert(Entry b) {
    const auto it = std::lower_bound(blocks_.begin(), blocks_.end(), b);
    if (it == blocks_.end() || *it != b) {
      blocks_.insert(it, b);
    }
  }
  void erase(Entry b) {
    const auto it = std::lower_bound(blocks_.begin(), blocks_.end(), b);
    if (it != blocks_.end() && *it == b) {
      blocks_.erase(it);
    }
  }
  /// The address of the smallest free block of at least `size` bytes (the lowest address among
  /// equal sizes); -1 when none.
  std::int64_t best_fit(std::int64_t size) const {
    const auto it = std::lower_bound(blocks_.begin(), blocks_.end(), Entry{size, -1});
    return it == blocks_.end() ? -1 : it->second;
  }

 private:
  std::vector<Entry> blocks_;
};

// One pool (stream × small/large) of one rank. Blocks are kept by address; free mapped blocks are
// also kept by (size, address) for best fit.
class Pool {
 public:
  Pool(AllocatorMode mode, bool small) : mode_(mode), small_(small) {}

  /// One block as a state comparison sees it.
  struct BlockAt {
    std::int64_t addr = 0;
    Block block;
    bool operator==(const BlockAt& o) const {
      return addr == o.addr && block.size == o.block.size && block.segment == o.block.segment &&
             block.state == o.block.state;
    }
  };
  /// Everything that decides where later requests go: the blocks, and where a new segment goes.
  struct State {
    std::vector<BlockAt> blocks;
    std::int64_t next_segment_addr = 0;
    std::int32_t next_segment = 0;
    bool operator==(const State& o) const = default;
  };
  State state() const {
    State s{{}, next_segment_addr_, next_segment_};
    s.blocks.reserve(blocks_.size());
    for (const auto& [addr, block] : blocks_) {
      s.blocks.push_back({addr, block});
    }
    return s;
  }

  bool small() const { return small_; }
  std::int64_t page() const { return small_ ? kSmallBufferBytes : kLargeBufferBytes; }

  /// The address of the best-fitting free block for `size`, taken and split; -1 on a miss.
  std::int64_t take_free(std::int64_t size) {
    const std::int64_t addr = free_.best_fit(size);
    if (addr < 0) {
      return -1;
    }
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
  FreeBlocks free_;
  std::int64_t next_segment_addr_ = 0;
  std::int32_t next_segment_ = 0;
};

// Where a request was placed: its pool and address.
struct Placement {
  std::uint8_t pool = 0;
  std::int64_t addr = 0;
  bool operator==(const Placement& o) const = default;
};

// Where each live allocation is, found by key. Keys are tensor ids (from 0 up) and workspace keys
// (from −1 down) of one workload, so a vector over their range serves. Each key can also carry a
// mark: the offset of its allocation inside the period or copy being read (a stamp tells which).
class LiveAllocations {
 public:
  /// Keys in [lowest, highest]; `outside` is one more key outside it.
  LiveAllocations(std::int64_t lowest, std::int64_t highest, std::int64_t outside)
      : lowest_(lowest),
        outside_(outside),
        slots_(static_cast<std::size_t>(highest - lowest + 1)) {}

  void add(std::int64_t key, Placement at) {
    Slot& s = slot(key);
    if (s.live) {
      throw std::logic_error(fmt::format("allocator replay: {} allocated twice", key));
    }
    s.at = at;
    s.live = true;
  }
  /// Takes the allocation of `key` off the list: where it was.
  Placement remove(std::int64_t key) {
    Slot& s = slot(key);
    if (!s.live) {
      throw std::logic_error(fmt::format("allocator replay: free of {} that is not live", key));
    }
    s.live = false;
    return s.at;
  }
  /// Where `key` is, if live.
  std::optional<Placement> find(std::int64_t key) {
    const Slot& s = slot(key);
    return s.live ? std::optional<Placement>(s.at) : std::nullopt;
  }
  void mark(std::int64_t key, std::uint32_t stamp, std::int32_t offset) {
    Slot& s = slot(key);
    s.stamp = stamp;
    s.offset = offset;
  }
  /// The offset `key` was marked with under `stamp`, or -1.
  std::int32_t marked(std::int64_t key, std::uint32_t stamp) {
    const Slot& s = slot(key);
    return s.stamp == stamp ? s.offset : -1;
  }

 private:
  struct Slot {
    Placement at;
    std::uint32_t stamp = 0;
    std::int32_t offset = -1;
    bool live = false;
  };
  Slot& slot(std::int64_t key) {
    return key == outside_ ? outside_slot_ : slots_[static_cast<std::size_t>(key - lowest_)];
  }
  std::int64_t lowest_;
  std::int64_t outside_;
  Slot outside_slot_;
  std::vector<Slot, HugePageAllocator<Slot>> slots_;  // one per key of the workload: huge pages
};

// What a repeat's copies are checked and applied against: the last few periods before it,
// replayed and recorded. At each period's begin, the replay's state; for each entry, where its
// request went (a free: also the offset of its allocation from the first recorded period's begin,
// -1 when made before it). Blocks often repeat every second period (a buffer used and the other
// one prefetched into), so a copy may repeat the period two before it instead of the one before.
struct RecordedPeriods {
  static constexpr std::size_t kMost = 2;
  struct Boundary {
    std::array<Pool::State, kPoolCount> pools;
    std::int64_t allocated_bytes = 0;
    std::int64_t reserved_bytes = 0;
    std::int32_t cache_releases = 0;  // so far
  };
  struct Entry {
    Placement at;
    std::int32_t made_at = -1;
  };
  std::size_t period = 0;            // entries per period
  std::vector<Boundary> boundaries;  // one per recorded period, at its begin
  std::vector<Entry> entries;        // from the first recorded period's begin (other ranks: unused)
};

class Replay {
 public:
  Replay(const AllocatorConfig& config, LiveAllocations live)
      : config_(config),
        pools_{Pool(config.mode, true),  Pool(config.mode, false), Pool(config.mode, true),
               Pool(config.mode, false), Pool(config.mode, true),  Pool(config.mode, false)},
        live_(std::move(live)) {}

  Placement allocate(std::int64_t key, std::int64_t bytes, std::uint8_t stream_pool) {
    if (stream_pool >= kStreamPoolCount) {
      throw std::logic_error(fmt::format("allocation in stream pool {}, beyond the model's {}",
                                         stream_pool, kStreamPoolCount));
    }
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
    const Placement at{static_cast<std::uint8_t>(p), addr};
    live_.add(key, at);
    allocated_ += bytes;
    out_.peak_allocated_bytes = std::max(out_.peak_allocated_bytes, allocated_);
    out_.peak_reserved_bytes = std::max(out_.peak_reserved_bytes, reserved_);
    return at;
  }

  Placement release(std::int64_t key, std::int64_t bytes) {
    const Placement at = live_.remove(key);
    pools_[at.pool].release(at.addr);
    allocated_ -= bytes;
    return at;
  }

  /// Replays events [from, to) of `rank`, telling `observer` (if any) after each.
  void replay(std::span<const AllocationEvent> events,
              std::size_t from,
              std::size_t to,
              std::int32_t rank,
              const ReservedObserver* observer = nullptr) {
    for (std::size_t i = from; i < to; ++i) {
      const AllocationEvent& e = events[i];
      if (!counted(e, rank)) {
        continue;
      }
      if (e.allocate) {
        allocate(e.key, e.bytes, e.stream_pool);
      } else {
        release(e.key, e.bytes);
      }
      if (observer != nullptr) {
        (*observer)(i + 1, reserved_);
      }
    }
  }

  /// Replays `periods` periods of `period` entries from `from`, recording them.
  RecordedPeriods record(std::span<const AllocationEvent> events,
                         std::size_t from,
                         std::size_t periods,
                         std::size_t period,
                         std::int32_t rank) {
    RecordedPeriods rec;
    rec.period = period;
    rec.entries.resize(periods * period);
    const std::uint32_t stamp = ++stamp_;
    for (std::size_t o = 0; o < periods * period; ++o) {
      if (o % period == 0) {
        rec.boundaries.push_back({pool_states(), allocated_, reserved_, out_.cache_releases});
      }
      const AllocationEvent& e = events[from + o];
      if (!counted(e, rank)) {
        continue;
      }
      RecordedPeriods::Entry& entry = rec.entries[o];
      if (e.allocate) {
        entry.at = allocate(e.key, e.bytes, e.stream_pool);
        live_.mark(e.key, stamp, static_cast<std::int32_t>(o));
      } else {
        entry.made_at = live_.marked(e.key, stamp);
        entry.at = release(e.key, e.bytes);
      }
    }
    return rec;
  }

  /// Applies the copies in [at, end) of `period` entries each, recorded just before `at` in
  /// `rec`, without replaying them, while they repeat: in groups of m copies, for the fewest m
  /// whose state m periods back is the state now and whose first group repeats. Returns where
  /// they stop repeating (`at`: not at all; `end`: to the end).
  std::size_t apply_copies(std::span<const AllocationEvent> events,
                           std::size_t at,
                           std::size_t end,
                           const RecordedPeriods& rec,
                           std::int32_t rank) {
    const std::size_t periods = rec.boundaries.size();
    const std::array<Pool::State, kPoolCount> now = pool_states();
    for (std::size_t m = 1; m <= periods; ++m) {
      const RecordedPeriods::Boundary& b = rec.boundaries[periods - m];
      if (b.allocated_bytes != allocated_ || b.reserved_bytes != reserved_ || b.pools != now) {
        continue;
      }
      const Group group{(periods - m) * rec.period, m * rec.period,
                        out_.cache_releases - b.cache_releases};
      std::size_t x = at;
      for (; x + group.length <= end && group_repeats(events, x, group, rec, rank);
           x += group.length) {
        for (std::size_t o = 0; o < group.length; ++o) {
          const AllocationEvent& e = events[x + o];
          if (!counted(e, rank)) {
            continue;
          }
          if (e.allocate) {
            live_.add(e.key, rec.entries[group.base + o].at);
          } else {
            (void)live_.remove(e.key);
          }
        }
        out_.cache_releases += group.cache_releases;
        out_.copies_applied += static_cast<std::int32_t>(m);
      }
      if (x != at) {
        return x;
      }
    }
    return at;
  }

  AllocatorReplay result() const { return out_; }
  std::int64_t reserved_bytes() const { return reserved_; }

 private:
  static bool counted(const AllocationEvent& e, std::int32_t rank) {
    return e.rank == rank && e.bytes > 0;
  }

  std::array<Pool::State, kPoolCount> pool_states() const {
    return {pools_[0].state(), pools_[1].state(), pools_[2].state(),
            pools_[3].state(), pools_[4].state(), pools_[5].state()};
  }

  // The recorded periods a group of copies repeats: from offset `base` of the record, `length`
  // entries, with `cache_releases` in them.
  struct Group {
    std::size_t base = 0;
    std::size_t length = 0;
    std::int32_t cache_releases = 0;
  };

  // Whether the group at `at` makes the recorded group's requests and frees its blocks: each
  // entry the recorded one's (request, size, pool); each free of an allocation of the group frees
  // the one made at the recorded offset, and each free of an older one frees the recorded block.
  bool group_repeats(std::span<const AllocationEvent> events,
                     std::size_t at,
                     const Group& group,
                     const RecordedPeriods& rec,
                     std::int32_t rank) {
    const std::uint32_t stamp = ++stamp_;
    for (std::size_t o = 0; o < group.length; ++o) {
      const AllocationEvent& e = events[at + o];
      const AllocationEvent& q = events[at - group.length + o];
      if (counted(e, rank) != counted(q, rank)) {
        return false;
      }
      if (!counted(e, rank)) {
        continue;
      }
      if (e.bytes != q.bytes || e.allocate != q.allocate || e.stream_pool != q.stream_pool) {
        return false;
      }
      const auto offset = static_cast<std::int32_t>(o);
      if (e.allocate) {
        live_.mark(e.key, stamp, offset);
        continue;
      }
      const RecordedPeriods::Entry& entry = rec.entries[group.base + o];
      const auto base = static_cast<std::int32_t>(group.base);
      const std::int32_t made_at = entry.made_at >= base ? entry.made_at - base : -1;
      const std::int32_t made_in_group = live_.marked(e.key, stamp);
      if (made_in_group != made_at ||
          (made_at < 0 && live_.find(e.key) != std::optional<Placement>(entry.at))) {
        return false;
      }
    }
    return true;
  }

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
  // [stream pool × small/large]: 0 small, 1 large (default streams); 2, 3 (FSDP or all-gather
  // stream); 4, 5 (DeepSpeed's reduce stream).
  std::array<Pool, kPoolCount> pools_;
  LiveAllocations live_;
  std::uint32_t stamp_ = 0;  // marks of the period or copy being read
  std::int64_t allocated_ = 0;
  std::int64_t reserved_ = 0;
  AllocatorReplay out_;
};

// The replay with the static memory allocated, its live list sized to the keys of `rank`.
Replay start_replay(std::span<const AllocationEvent> events,
                    std::int32_t rank,
                    const AllocatorConfig& config) {
  constexpr std::int64_t kStaticKey = std::numeric_limits<std::int64_t>::min();
  std::int64_t lowest = 0, highest = 0;
  for (const AllocationEvent& e : events) {
    if (e.rank == rank) {
      lowest = std::min(lowest, e.key);
      highest = std::max(highest, e.key);
    }
  }
  Replay replay(config, LiveAllocations(lowest, highest, kStaticKey));
  if (config.static_bytes > 0) {
    replay.allocate(kStaticKey, config.static_bytes, 0);
  }
  return replay;
}

}  // namespace

AllocatorReplay replay_allocator(std::span<const AllocationEvent> events,
                                 std::int32_t rank,
                                 const AllocatorConfig& config) {
  return replay_allocator(events, {}, rank, config);
}

AllocatorReplay replay_allocator(std::span<const AllocationEvent> events,
                                 std::span<const AllocationRepeat> repeats,
                                 std::int32_t rank,
                                 const AllocatorConfig& config) {
  Replay replay = start_replay(events, rank, config);
  std::size_t next = 0;  // the first event not yet replayed or applied
  for (const AllocationRepeat& r : repeats) {
    const std::size_t end = r.begin + static_cast<std::size_t>(std::max(0, r.copies)) * r.period;
    if (r.period == 0 || r.begin < next + r.period || end > events.size()) {
      continue;  // no whole period before it: replayed request by request
    }
    // The periods before the copies, recorded; where the copies stop repeating, the next ones.
    std::size_t at =
        r.begin - std::min(RecordedPeriods::kMost, (r.begin - next) / r.period) * r.period;
    replay.replay(events, next, at, rank);
    RecordedPeriods rec;
    while (at < end) {
      const std::size_t periods = std::min(RecordedPeriods::kMost, (end - at) / r.period);
      rec = replay.record(events, at, periods, r.period, rank);
      at += periods * r.period;
      at = replay.apply_copies(events, at, end, rec, rank);
    }
    next = end;
  }
  replay.replay(events, next, events.size(), rank);
  return replay.result();
}

AllocatorReplay replay_allocator(std::span<const AllocationEvent> events,
                                 std::int32_t rank,
                                 const AllocatorConfig& config,
                                 const ReservedObserver& observer) {
  Replay replay = start_replay(events, rank, config);
  if (observer) {
    observer(0, replay.reserved_bytes());
  }
  replay.replay(events, 0, events.size(), rank, observer ? &observer : nullptr);
  return replay.result();
}

}  // namespace cpsim::sim
