// tally CPU runtime: the context every kernel takes (threads, the per-kernel timer hook), the
// runtime's error type, and the small helpers the kernels share (thread count, scratch, shape
// collapsing for strided loops).
#pragma once

#include "../common/tally_common.h"
#include "../common/tally_error.h"   // rt::Error

#include <omp.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace rt {

/// Called once after every kernel call with the kernel's name (its function name, e.g.
/// "matmul", "attention_bwd") and its wall-clock seconds; `user` is Ctx::timer_user.
using KernelTimerFn = void (*)(void* user, const char* kernel, double seconds);

/// The CPU context: how many OpenMP threads the kernels use, and an optional timer hook.
struct Ctx {
  /// OpenMP threads for the kernels' parallel loops; 0 = omp_get_max_threads().
  /// (OpenBLAS keeps its own thread count: OPENBLAS_NUM_THREADS or openblas_set_num_threads.)
  int threads = 0;
  /// Per-kernel timing: null = no timing (no clock reads at all).
  KernelTimerFn timer = nullptr;
  /// Passed back to `timer` unchanged.
  void* timer_user = nullptr;

  /// The thread count the kernels use.
  int nthreads() const { return threads > 0 ? threads : omp_get_max_threads(); }
};

/// A ready-made timer sink: total seconds and calls by kernel name. Use as
/// `rt::KernelTimes t; ctx.timer = rt::KernelTimes::record; ctx.timer_user = &t;`.
struct KernelTimes {
  /// Calls and total seconds of one kernel name.
  struct Entry {
    int64_t calls = 0;
    double seconds = 0.0;
  };
  std::map<std::string, Entry> by_kernel;
  /// The KernelTimerFn that adds one call to the KernelTimes at `user`.
  static void record(void* user, const char* kernel, double seconds) {
    Entry& e = static_cast<KernelTimes*>(user)->by_kernel[kernel];
    e.calls += 1;
    e.seconds += seconds;
  }
};

/// A zeroed region of `bytes`, 256-byte aligned, that lives until the process exits; null when
/// the system has no memory for it. Regions of 2 MiB or more are anonymous mappings in
/// transparent huge pages where the kernel allows them (madvise): the kernel zeroes each page as
/// it is first touched, so there is no memset pass, and 2 MiB pages fault ~500 times less often.
/// Huge pages also stream faster (a stream crosses no 4 KiB page, where the hardware prefetchers
/// stop): the step's regions come from here, and so do `tally calibrate`'s arrays, so the rates
/// it measures are those of the pages the step runs on.
inline uint8_t* zeroed_region(int64_t bytes) {
  size_t n = static_cast<size_t>((std::max<int64_t>(bytes, 1) + 255) / 256 * 256);
  const size_t kHuge = size_t(1) << 21;
  if (n >= kHuge) {
    size_t m = (n + kHuge - 1) / kHuge * kHuge;
    void* p = mmap(nullptr, m + kHuge, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
      return nullptr;
    uint8_t* a = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + kHuge - 1) & ~(kHuge - 1));
    madvise(a, m, MADV_HUGEPAGE); // advice: without huge pages it is ordinary zeroed memory
    return a;
  }
  void* p = std::aligned_alloc(256, n);
  if (p)
    std::memset(p, 0, n);
  return static_cast<uint8_t*>(p);
}

namespace detail {

/// Throws rt::Error("rt::<kernel>: <what>") unless ok. `what` is the message, or a callable that
/// makes it: a check that passes builds no string (every kernel call runs several checks, and
/// messages built eagerly cost a few heap allocations per call, most of them in a toy model's
/// microsecond kernels).
template <class What>
inline void require(bool ok, const char* kernel, const What& what) {
  if (ok) return;
  if constexpr (std::is_invocable_v<const What&>)
    throw Error(std::string("rt::") + kernel + ": " + what());
  else
    throw Error(std::string("rt::") + kernel + ": " + what);
}

/// Runs f() on a team of `threads` OpenMP threads when `threaded` (and there is more than one),
/// else directly on the calling thread. The kernels' loops inside f are orphaned `omp for`
/// constructs (and per-thread shares from omp_get_thread_num), which the calling thread alone
/// runs whole outside a region. Not `#pragma omp parallel if (threaded)`: libgomp sets up a team
/// of one for a region whose `if` is false, 1.2 us a call on the 2-vCPU EPYC VM (an empty
/// region on two threads 2.7 us), most of what a kernel of a few thousand elements costs
/// (docs/performance.md).
template <class F> inline void region(int threads, bool threaded, const F& f) {
  if (!threaded || threads <= 1) {
    f();
    return;
  }
#pragma omp parallel num_threads(threads)
  f();
}

/// Checks that every size is >= 0.
inline void require_sizes(const char* kernel, std::initializer_list<int64_t> sizes) {
  for (int64_t s : sizes) require(s >= 0, kernel, [s] { return "negative size " + std::to_string(s); });
}

/// Times one kernel call when ctx.timer is set (RAII: reports on scope exit).
class KernelScope {
 public:
  KernelScope(Ctx& ctx, const char* name) : ctx_(ctx), name_(name) {
    if (ctx_.timer) t0_ = std::chrono::steady_clock::now();
  }
  ~KernelScope() {
    if (ctx_.timer) {
      std::chrono::duration<double> d = std::chrono::steady_clock::now() - t0_;
      ctx_.timer(ctx_.timer_user, name_, d.count());
    }
  }
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  Ctx& ctx_;
  const char* name_;
  std::chrono::steady_clock::time_point t0_{};
};

/// Most dimensions a strided kernel takes.
constexpr int kMaxRank = 8;

/// A shape with up to three stride vectors, after dropping size-1 dimensions and merging
/// neighbours that are contiguous in every operand (so the innermost loop is as long as possible).
constexpr int kMaxOperands = 4;   ///< operands collapse() walks together (div_bwd has four)
struct Collapsed {
  int rank = 0;
  int64_t shape[kMaxRank];
  int64_t st[kMaxOperands][kMaxRank];
  int64_t count = 1;   // elements in the shape
};

/// Collapse `shape` with `nops` stride vectors (strides[k] may be null = dense row-major).
inline Collapsed collapse(const char* kernel, const int64_t* shape, int rank, int nops,
                          const int64_t* const* strides) {
  require(rank >= 0 && rank <= kMaxRank, kernel, [&] { return "rank " + std::to_string(rank) + " is not in 0..8"; });
  require(nops >= 1 && nops <= kMaxOperands, kernel, "too many operands");
  require(rank == 0 || shape != nullptr, kernel, "shape is null");
  int64_t dense[kMaxRank];
  int64_t acc = 1;
  for (int d = rank - 1; d >= 0; --d) {
    require(shape[d] >= 0, kernel, [&] { return "negative dimension " + std::to_string(shape[d]); });
    dense[d] = acc;
    acc = shape[d] == 0 ? acc : acc * shape[d];
  }
  Collapsed c;
  for (int d = 0; d < rank; ++d) c.count *= shape[d];
  if (c.count == 0) return c;
  for (int d = 0; d < rank; ++d) {
    if (shape[d] == 1) continue;
    int r = c.rank;
    if (r > 0) {
      bool merge = true;
      for (int k = 0; k < nops; ++k) {
        int64_t s = strides[k] ? strides[k][d] : dense[d];
        if (c.st[k][r - 1] != s * shape[d]) merge = false;
      }
      if (merge) {
        c.shape[r - 1] *= shape[d];
        for (int k = 0; k < nops; ++k) c.st[k][r - 1] = strides[k] ? strides[k][d] : dense[d];
        continue;
      }
    }
    c.shape[r] = shape[d];
    for (int k = 0; k < nops; ++k) c.st[k][r] = strides[k] ? strides[k][d] : dense[d];
    c.rank = r + 1;
  }
  if (c.rank == 0) {   // every dimension was 1: one element
    c.rank = 1;
    c.shape[0] = 1;
    for (int k = 0; k < nops; ++k) c.st[k][0] = 0;
  }
  return c;
}

/// Offsets of operand k for the `row`-th combination of all but the last collapsed dimension.
inline void row_offsets(const Collapsed& c, int nops, int64_t row, int64_t* off) {
  for (int k = 0; k < nops; ++k) off[k] = 0;
  for (int d = c.rank - 2; d >= 0; --d) {
    int64_t i = row % c.shape[d];
    row /= c.shape[d];
    for (int k = 0; k < nops; ++k) off[k] += i * c.st[k][d];
  }
}

/// A per-thread scratch vector of at least n elements (reused across calls).
template <class A> inline A* scratch(std::vector<A>& v, int64_t n) {
  if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
  return v.data();
}

/// out = v, or out += v when accumulate.
template <class T> inline void put(T& out, acc_t<T> v, bool accumulate) {
  out = accumulate ? store<T>(load(out) + v) : store<T>(v);
}

} // namespace detail
} // namespace rt
