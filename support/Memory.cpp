#include "support/Memory.h"

#include <cstdint>

#include <malloc.h>
#include <sys/mman.h>

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

void tuneAllocator() {
#ifdef M_TOP_PAD
  // Setting the trim threshold also fixes the mmap threshold (glibc stops adjusting it), so
  // it is set as well.
  mallopt(M_TOP_PAD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kHugeBlockBytes));
#endif
}

} // namespace tally
