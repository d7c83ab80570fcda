#include "support/BigAlloc.h"

#include <malloc.h>
#include <sys/mman.h>

namespace tally {

namespace {
constexpr size_t kHugePage = size_t(2) << 20;
size_t rounded(size_t bytes) { return (bytes + kHugePage - 1) / kHugePage * kHugePage; }
} // namespace

bool bigMapEnabled() {
#if defined(__SANITIZE_ADDRESS__)
  return false;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
  return false;
#else
  return true;
#endif
#else
  return true;
#endif
}

void *bigMap(size_t bytes) {
  if (bytes > size_t(-1) - kHugePage)
    throw std::bad_alloc();
  void *p = mmap(nullptr, rounded(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    throw std::bad_alloc();
#ifdef MADV_HUGEPAGE
  madvise(p, rounded(bytes), MADV_HUGEPAGE); // advice: without huge pages it works as before
#endif
  return p;
}

void bigUnmap(void *p, size_t bytes) { munmap(p, rounded(bytes)); }

void tuneAllocator() {
#ifdef M_TOP_PAD
  // Setting the trim threshold also fixes the mmap threshold (glibc stops adjusting it), so
  // it is set too: blocks below kBigAllocBytes come from the heap and are reused.
  mallopt(M_TOP_PAD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
  mallopt(M_MMAP_THRESHOLD, static_cast<int>(kBigAllocBytes));
#endif
}

} // namespace tally
