// The tally executable's operator new: malloc, and for blocks of kHugeBlockBytes or more (which
// malloc maps on their own: tuneAllocator sets that threshold) huge pages advised over the
// block's whole 2 MiB extents; a smaller block comes from malloc's one heap (tuneAllocator),
// and when that heap has grown, huge pages are advised over what it grew by. The per-tensor
// and per-op vectors of a deep model's analysis are tens of MB each, and its small records
// hundreds of MB; faulted in 4 KiB at a time they cost more system time than the analysis's
// own work on this project's VMs (docs/performance.md, issue 12). Deletion is
// free(), as the default's. Not in the sanitizer builds: their allocators must see every
// operator new as such.
#include "support/Memory.h"

#include <cstdlib>
#include <new>

#if defined(__SANITIZE_ADDRESS__)
#define TALLY_OWN_NEW 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(memory_sanitizer)
#define TALLY_OWN_NEW 0
#endif
#endif
#ifndef TALLY_OWN_NEW
#define TALLY_OWN_NEW 1
#endif

#if TALLY_OWN_NEW
namespace {
void *allocate(std::size_t n) {
  for (;;) {
    if (void *p = std::malloc(n ? n : 1)) {
      if (n >= tally::kHugeBlockBytes)
        tally::adviseHugePages(p, n);
      else
        tally::adviseHeapGrowth();
      return p;
    }
    std::new_handler h = std::get_new_handler();
    if (!h)
      throw std::bad_alloc();
    h();
  }
}
} // namespace

void *operator new(std::size_t n) { return allocate(n); }
void *operator new[](std::size_t n) { return allocate(n); }
void operator delete(void *p) noexcept { std::free(p); }
void operator delete[](void *p) noexcept { std::free(p); }
void operator delete(void *p, std::size_t) noexcept { std::free(p); }
void operator delete[](void *p, std::size_t) noexcept { std::free(p); }
#endif
