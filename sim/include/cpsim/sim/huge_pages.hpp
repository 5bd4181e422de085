#pragma once
/// @file An allocator for the large per-op arrays of a workload and of a run. A block of 2 MiB or
/// more is aligned to 2 MiB and marked for transparent huge pages (Linux MADV_HUGEPAGE), so that
/// filling a 100 MB op graph takes far fewer page faults (a search's first long probe spent about
/// a third of its time in them). Blocks still come from operator new, so a freed block's pages,
/// already faulted in, serve the next evaluation of a similar size. Smaller blocks are plain
/// operator new; where huge pages are not available the advice is left out. Results do not depend
/// on it.

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace cpsim::sim {

namespace detail {
/// At least `bytes` bytes aligned for any fundamental type; release with release_large(p, bytes).
void* allocate_large(std::size_t bytes);
void release_large(void* p, std::size_t bytes) noexcept;
}  // namespace detail

template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) { return static_cast<T*>(detail::allocate_large(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { detail::release_large(p, n * sizeof(T)); }
  /// Elements made without arguments are default-initialised, not value-initialised: resize()
  /// leaves plain integers unset (their writer fills them) instead of zeroing them first.
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
};

}  // namespace cpsim::sim
