// How tally asks the system for memory. A deep model's analysis builds millions of small
// objects and per-op and per-tensor vectors of tens of MB; on this project's VMs faulting them
// in 4 KiB at a time cost more system time than the analysis's own work (a 10,000-layer check:
// 128,800 page faults, half of its wall time; docs/performance.md, issue 12). The tally
// executable therefore sets malloc's growth policy first thing (tuneAllocator) and advises
// huge pages for every block of kHugeBlockBytes or more that its operator new hands out
// (tools/tally/Allocation.cpp), and for each step by which the heap grows.
#pragma once

#include <cstddef>

namespace tally {

/// Blocks this large or larger are mapped by malloc on their own (tuneAllocator sets that
/// threshold) and advised huge pages: two huge pages, so that at least one whole 2 MiB
/// extent lies inside.
constexpr size_t kHugeBlockBytes = size_t(4) << 20;

/// Advises transparent huge pages (madvise(MADV_HUGEPAGE)) for the whole 2 MiB extents inside
/// [p, p + bytes). Advice only: where the kernel has none, memory works as before.
void adviseHugePages(void *p, size_t bytes);

/// Advises huge pages over what malloc's heap (its brk) has grown by since the last call. The
/// heap grows in steps of 64 MiB (tuneAllocator), each a new mapping without advice; operator
/// new calls this after each block it takes from the heap (a read of a cached value when the
/// heap has not grown). Thread-safe.
void adviseHeapGrowth();

/// Sets malloc's growth policy: one heap for every thread (no per-thread arenas), which grows
/// 64 MiB at a time instead of a page at a time, free memory below 256 MiB is kept for reuse
/// instead of returned and faulted in again, and blocks from kHugeBlockBytes on are mapped on
/// their own (so freeing one returns it whole).
void tuneAllocator();

} // namespace tally
