#include "cpsim/sim/huge_pages.hpp"

#include <cstdint>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cpsim::sim::detail {
namespace {

constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

std::size_t whole_pages(std::size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

}  // namespace

#if defined(__linux__) && defined(MADV_HUGEPAGE)

// Maps one huge page more than needed and unmaps the ends, so that the block starts on a 2 MiB
// boundary (the kernel backs only aligned 2 MiB ranges with huge pages). The advice is a hint: a
// kernel with transparent huge pages off ignores it and the block is ordinary memory.
void* allocate_large(std::size_t bytes) {
  if (bytes < kHugePageBytes) {
    return ::operator new(bytes);
  }
  const std::size_t length = whole_pages(bytes);
  void* mapped = mmap(nullptr, length + kHugePageBytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    throw std::bad_alloc();
  }
  const auto start = reinterpret_cast<std::uintptr_t>(mapped);
  const std::uintptr_t aligned = (start + kHugePageBytes - 1) & ~(kHugePageBytes - 1);
  if (aligned > start) {
    munmap(mapped, aligned - start);
  }
  const std::uintptr_t end = start + length + kHugePageBytes;
  if (end > aligned + length) {
    munmap(reinterpret_cast<void*>(aligned + length), end - (aligned + length));
  }
  void* block = reinterpret_cast<void*>(aligned);
  (void)madvise(block, length, MADV_HUGEPAGE);
  return block;
}

void release_large(void* p, std::size_t bytes) noexcept {
  if (bytes < kHugePageBytes) {
    ::operator delete(p);
    return;
  }
  munmap(p, whole_pages(bytes));
}

#else

void* allocate_large(std::size_t bytes) {
  return ::operator new(bytes);
}

void release_large(void* p, std::size_t /*bytes*/) noexcept {
  ::operator delete(p);
}

#endif

}  // namespace cpsim::sim::detail
