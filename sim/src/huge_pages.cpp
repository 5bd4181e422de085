#include "cpsim/sim/huge_pages.hpp"

#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace cpsim::sim::detail {
namespace {

constexpr std::size_t kHugePageBytes = std::size_t{2} << 20;

}  // namespace

// A large block comes from operator new, aligned to 2 MiB (the kernel backs only aligned 2 MiB
// ranges with huge pages), so that the C library can hand a freed block's warm pages to the next
// request of its size (a fresh mapping per block faults every page again on each evaluation). The
// advice is a hint: a kernel with transparent huge pages off ignores it and the block is ordinary
// memory.
void* allocate_large(std::size_t bytes) {
  if (bytes < kHugePageBytes) {
    return ::operator new(bytes);
  }
  void* block = ::operator new (bytes, std::align_val_t{kHugePageBytes});
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const std::size_t whole = bytes / kHugePageBytes * kHugePageBytes;  // inside the block only
  (void)madvise(block, whole, MADV_HUGEPAGE);
#endif
  return block;
}

void release_large(void* p, std::size_t bytes) noexcept {
  if (bytes < kHugePageBytes) {
    ::operator delete(p);
    return;
  }
  ::operator delete (p, std::align_val_t{kHugePageBytes});
}

}  // namespace cpsim::sim::detail
