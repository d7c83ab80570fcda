// An allocator for the few vectors that grow with the model (a graph's tensors and ops, the
// per-op analysis, the memory plan's buffers): a block of at least kBigAllocBytes is mapped
// on its own and marked for transparent huge pages (madvise(MADV_HUGEPAGE)), so the kernel
// fills it 2 MiB at a time instead of 4 KiB at a time. On a 10,000-layer model page faults
// were a third of the wall time of `tally check` (issue 12, docs/performance.md). Smaller
// blocks, and every block in the sanitizer builds (whose allocator must see them), come from
// operator new. Stateless: any two instances are equal.
#pragma once

#include <cstddef>
#include <new>

namespace tally {

/// Blocks this large or larger are mapped with huge pages: two huge pages, so that rounding
/// up to whole huge pages wastes at most a third of the block's address space (never memory
/// that is not touched: the kernel backs only the pages written).
constexpr size_t kBigAllocBytes = size_t(4) << 20;

/// A mapped block of `bytes` (rounded up to 2 MiB) with huge pages advised; throws
/// std::bad_alloc when the mapping fails, as operator new does. bigUnmap takes the same `bytes`.
void *bigMap(size_t bytes);
void bigUnmap(void *p, size_t bytes);
/// Whether blocks are mapped here at all (false in the sanitizer builds).
bool bigMapEnabled();

/// Sets malloc's growth policy for an analysis that builds millions of small objects (the
/// tally CLI calls it first): the heap grows 64 MiB at a time instead of a page at a time, and
/// free memory below 256 MiB is kept for reuse instead of returned and faulted in again.
/// A 10,000-layer check spent half its system time growing and trimming the heap.
void tuneAllocator();

template <class T> struct BigAlloc {
  using value_type = T;
  BigAlloc() = default;
  template <class U> BigAlloc(const BigAlloc<U> &) noexcept {}

  T *allocate(size_t n) {
    if (n > size_t(-1) / sizeof(T))
      throw std::bad_array_new_length();
    size_t bytes = n * sizeof(T);
    if (bytes >= kBigAllocBytes && bigMapEnabled())
      return static_cast<T *>(bigMap(bytes));
    return static_cast<T *>(::operator new(bytes, std::align_val_t(alignof(T))));
  }
  void deallocate(T *p, size_t n) noexcept {
    size_t bytes = n * sizeof(T);
    if (bytes >= kBigAllocBytes && bigMapEnabled())
      return bigUnmap(p, bytes);
    ::operator delete(p, std::align_val_t(alignof(T)));
  }
  template <class U> bool operator==(const BigAlloc<U> &) const noexcept { return true; }
  template <class U> bool operator!=(const BigAlloc<U> &) const noexcept { return false; }
};

} // namespace tally
