#include "support/Memory.h"

#include <atomic>
#include <cstdint>

#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

namespace tally {

void adviseHugePages(void *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
  constexpr uintptr_t kHugePage = uintptr_t(2) << 20;
  uintptr_t begin = reinterpret_cast<uintptr_t>(p), end = begin + bytes;
  uintptr_t from = (begin + kHugePage - 1) / kHugePage * kHugePage, to = end / kHugePage * kHugePage;
  if (from < to)
    madvise(reinterpret_cast<void *>(from), to - from, MADV_HUGEPAGE);
#endif
}

void adviseHeapGrowth() {
  static std::atomic<uintptr_t> seen{0}; // the heap's end when last looked at
  uintptr_t now = reinterpret_cast<uintptr_t>(sbrk(0));
  uintptr_t before = seen.load(std::memory_order_relaxed);
  if (now == before || !seen.compare_exchange_strong(before, now, std::memory_order_relaxed))
    return;
  if (before != 0 && now > before) // the first look only notes where the heap ends
    adviseHugePages(reinterpret_cast<void *>(before), now - before);
}

void tuneAllocator() {
#ifdef M_TOP_PAD
  // Setting the trim threshold also fixes the mmap threshold (glibc stops adjusting it), so
  // it is set as well.
  mallopt(M_TOP_PAD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHugeBlockBytes));
#endif
#ifdef M_ARENA_MAX
  // One arena: the frontend thread (frontend/Stack.cpp), where the analysis runs, allocates
  // from the main heap too, which grows by brk in M_TOP_PAD steps that operator new advises
  // huge pages (tools/tally/Allocation.cpp). A thread's own arena is 64 MiB mappings that
  // malloc opens page by page: at 100,000 layers, half of `check`'s 40,000 page faults.
  mallopt(M_ARENA_MAX, 1);
#endif
}

} // namespace tally
