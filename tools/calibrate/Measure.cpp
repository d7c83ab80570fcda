// tally calibrate's measurements, run by the executable tally-measure (measure_main.cpp), never
// in tally itself (tools/calibrate/Calibrate.h); the target they become: Target.cpp. Every
// timing runs the CPU runtime's own kernels (codegen/runtime/cpu, compiled with its flags), with the runtime's
// threading: OpenBLAS single-threaded, C tiles on the OpenMP threads (rt_matmul.h).
//
// 1. Matmuls: square M = N = K (16 to 2048) and a few skinny shapes (tokens × width), fp32 and
//    bf16 (16-bit storage converted to fp32 in blocks of K, rt_matmul.h). Every timing below is
//    taken in rounds (class Rounds): one warm-up call, then in each of 4 rounds a share of the
//    calls and of the time, every measurement in turn, and the median of all its calls counts.
//    The median and not the fastest call, because the estimate is compared with the median step,
//    which meets the machine as it usually is: on the 2-vCPU VM the same matmul alternated, seconds
//    at a time, between about 63 and 38 GFLOP/s, and the fastest call priced the step at the
//    fast phase only (fp32 GPT d = 256 estimated 429 ms, measured 785-900 ms). The rounds
//    spread each measurement over the whole calibration. Calls that look like scheduler
//    slices are left out of the median, the rounds must agree, and the threads must not have
//    waited long for a CPU (Robust.cpp; re-measured once, then the calibration is noisy and
//    tally calibrate refuses it). The 1-minute load average is recorded, and a busy machine is
//    warned about.
// 2. Memory bandwidth: a STREAM triad a = b + s·c over arrays far larger than the last-level
//    cache, OpenMP static schedule; bytes = 3 × 4 per element (no write-allocate counted).
//    The cache: sysconf's L2 size × the threads, and the same triad over arrays filling half of
//    it.
// 3. Elementwise: rt::unary_fwd (relu) and rt::scale over the same size, kernels without
//    transcendentals (those are priced apart, 5.); bytes = read + write.
// 4. The fixed cost of a kernel call, measured directly (a difference of two timings of
//    microseconds drowns in their noise), many single calls each: rt::scale on one element (the
//    call, its checks and bookkeeping on the calling thread: kernel_overhead, what a kernel below
//    its threading bound pays), and rt::scale on 8,192 floats, just above the bound, on the
//    runtime's threads less its bytes at the cache's bandwidth (the team's start and join with
//    data to share: fork_overhead, what a kernel above it pays instead; at least an empty
//    OpenMP region's). On the 2-vCPU EPYC VM 30 ns and 3.6-4.0 us (an empty region 2.4 us;
//    kernel_overhead was 1.2 us while a false `if` still entered a region: rt_ctx.h).
// 5. Transcendentals: rt::unary_fwd exp minus the same kernel with relu (same loads, stores,
//    call and threads), on cache-resident inputs spread over [−4, 4], per element: the seconds
//    of one evaluation with all threads. The runtime's erf is a polynomial and at most one expf
//    (tally_math.h), tanh-form gelu one expf.
//    Each unary kernel with transcendentals (gelu, gelu_tanh, silu, tanh, sigmoid, exp) is also
//    measured as itself, forward and gradient, less relu's kernel in the same direction: GELU's
//    erf is two polynomial fits, a division and an exp, several times one exp once the runtime's
//    exp is vectorised (docs/performance.md), so those kinds are priced by their own rates
//    (Target::unaryTimes); the exp rate prices the rest (attention's softmax).
// 5d. The row kernels (layer_norm, rms_norm, softmax, cross_entropy: each row reduced, then
//    written), forward and gradient, fp32, on the same 65,536 floats as 2048 rows of 32 and as
//    256 rows of 256: the difference of the two is the cost of 1792 rows (their reductions'
//    setup and tails, scalar), and the wide shape less that and less relu's kernel in the same
//    direction is the cost per element (their arithmetic and exps). A toy model's [32 × 32]
//    layer norm runs 0.9 us, where its bytes take 0.1: rows, not bytes, set its time.
// 6. Attention: the runtime's fused causal attention, forward and backward, fp32, B 1, H 4,
//    S 256, hd 64 (quick: S 128), and the smaller shapes of the attention curve (B 2, H 4:
//    S 16, hd 16 and, not quick, S 64, hd 32).
// 7. The target (Target.cpp, in tally, from this program's JSON): peak per dtype = the best FLOP/s measured; each sample's efficiency is what
//    makes passes/StepTime.cpp's kernelTime return the measured time (with the fixed cost of
//    the call taken out, since kernelTime adds it back); bandwidth = the triad;
//    efficiency.elementwise = elementwise B/s ÷ triad B/s; kernel_overhead, fork_overhead and
//    transcendental from 4. and 5.; efficiency.attention from 6.: the attention's FLOPs (as the op rules count
//    them) at the fp32 peak over its time less its exps and two calls' fixed cost.
#include "tools/calibrate/Calibrate.h"

#include "tally_rt.h"

#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <stdexcept>

namespace tally {
namespace calibrate {

// The estimate prices the runtime's attention by the scores its tiles compute (ir/Target.h):
// the tile it assumes is the kernel's.
static_assert(rt::detail::kAttnQB == kHostAttentionTile && rt::detail::kAttnKB == kHostAttentionTile,
              "kHostAttentionTile must be the CPU runtime's attention tile");

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// The seconds this process's threads have waited on a runqueue (runnable, not running: another
/// task had their CPU), summed over /proc/self/task/*/schedstat's second field; -1 when unreadable.
double runQueueWait() {
  DIR *dir = opendir("/proc/self/task");
  if (!dir)
    return -1;
  double sum = 0;
  bool any = false;
  while (dirent *e = readdir(dir)) {
    if (e->d_name[0] == '.')
      continue;
    std::ifstream in(std::string("/proc/self/task/") + e->d_name + "/schedstat");
    double run = 0, wait = 0;
    if (in >> run >> wait)
      sum += wait * 1e-9, any = true;
  }
  closedir(dir);
  return any ? sum : -1;
}

/// Timings taken in rounds. Each measurement gets one warm-up call, then in each round at least
/// `minCalls` calls and `minSeconds`, at most `maxCalls`; the rounds run every measurement in
/// turn, so each one samples the machine at several moments seconds apart. A measurement's time
/// is the median of its calls less those that look like scheduler slices, and its rounds'
/// medians must agree (summarize, Robust.cpp); one whose rounds do not (noisyReason) is timed
/// again, alone with the others that failed, in twice the rounds, and those times replace the
/// first ones. Test hook: TALLY_MEASURE_TEST_NOISE="NAME=F" records the calls of the
/// measurement NAME F times longer in odd rounds (the calls themselves run as always), so that
/// a test sees a noisy measurement on a quiet machine (tests/lit/calibrate-noisy.tally).
class Rounds {
public:
  Rounds(int rounds, double slice, int threads) : rounds_(rounds), slice_(slice), threads_(threads) {
    if (const char *noise = std::getenv("TALLY_MEASURE_TEST_NOISE")) {
      std::string spec = noise;
      size_t eq = spec.rfind('=');
      if (eq != std::string::npos) {
        noiseName_ = spec.substr(0, eq);
        noiseFactor_ = std::atof(spec.c_str() + eq + 1);
      }
    }
  }

  /// Adds a measurement; its index for median().
  size_t add(std::string name, std::function<void()> f, int minCalls, double minSeconds, int maxCalls) {
    items_.push_back({std::move(name), std::move(f), minCalls, minSeconds, maxCalls, {}, 0, 0, 0, {}});
    return items_.size() - 1;
  }

  void run() {
    for (Item &it : items_)
      it.f();
    std::vector<Item *> all;
    for (Item &it : items_)
      all.push_back(&it);
    runRounds(all, rounds_);
    std::vector<Item *> again;
    for (Item &it : items_)
      if (!noisyReason(it.stats).empty())
        again.push_back(&it);
    runRounds(again, 2 * rounds_);
    for (Item *it : again)
      it->stats.remeasured = true;
  }

  double median(size_t i) const { return items_[i].stats.median; }

  /// Every measurement's statistics, in the order they were added.
  std::vector<Timing> timings() const {
    std::vector<Timing> out;
    for (const Item &it : items_)
      out.push_back(it.stats);
    return out;
  }

private:
  struct Item {
    std::string name;
    std::function<void()> f;
    int minCalls;
    double minSeconds;
    int maxCalls;
    std::vector<std::vector<double>> times; ///< per round
    double fastest = 0;                     ///< the fastest call so far
    double waited = 0, wall = 0;            ///< runQueueWait and wall seconds of its rounds (-1: unknown)
    Timing stats;
  };

  /// `rounds` rounds over `items` (each in turn), replacing their times and statistics. A round
  /// whose calls were mostly slices (above sliceThreshold of the fastest call so far) calls on
  /// until `minCalls` are not, within its most calls and 20 slices more than its seconds: on a
  /// loaded machine a few calls can all be descheduled, and a fastest call that is itself a slice
  /// hides the rest. A quiet round stops where it always did.
  void runRounds(const std::vector<Item *> &items, int rounds) {
    for (Item *it : items)
      it->times.assign(size_t(rounds), {});
    for (int r = 0; r < rounds; ++r)
      for (Item *it : items) {
        const double factor = noiseFactor_ > 0 && r % 2 && it->name == noiseName_ ? noiseFactor_ : 1.0;
        std::vector<double> &times = it->times[size_t(r)];
        double total = 0, wait0 = runQueueWait();
        Clock::time_point start = Clock::now();
        auto quiet = [&] {
          double limit = sliceThreshold(it->fastest, slice_);
          return std::count_if(times.begin(), times.end(), [&](double x) { return x <= limit; }) >= it->minCalls;
        };
        for (int n = 0; n < it->maxCalls; ++n) {
          if (n >= it->minCalls && total >= it->minSeconds && (total >= it->minSeconds + 20 * slice_ || quiet()))
            break;
          Clock::time_point t0 = Clock::now();
          it->f();
          double t = since(t0);
          times.push_back(t * factor);
          it->fastest = it->fastest > 0 ? std::min(it->fastest, t * factor) : t * factor;
          total += t;
        }
        double wait1 = runQueueWait();
        it->waited = wait0 >= 0 && wait1 >= 0 && it->waited >= 0 ? it->waited + (wait1 - wait0) : -1;
        it->wall += since(start);
      }
    for (Item *it : items) {
      it->stats = summarize(it->name, it->times, slice_);
      it->stats.waitShare = it->waited >= 0 && it->wall > 0 ? it->waited / (it->wall * threads_) : -1;
      it->waited = 0, it->wall = 0;
    }
  }

  int rounds_;
  double slice_;
  int threads_;
  std::string noiseName_;
  double noiseFactor_ = 0;
  std::vector<Item> items_;
};

/// Operands of one matmul shape, filled with small exact values.
template <class T>
struct MatmulOperands {
  std::vector<T> A, B, C;
  MatmulOperands(int64_t M, int64_t N, int64_t K) : A(size_t(M * K)), B(size_t(K * N)), C(size_t(M * N)) {
    for (size_t i = 0; i < A.size(); ++i)
      A[i] = rt::store<T>(float(int(i % 7) - 3) * 0.125f);
    for (size_t i = 0; i < B.size(); ++i)
      B[i] = rt::store<T>(float(int(i % 5) - 2) * 0.25f);
  }
};

template <class T>
std::function<void()> matmulCall(rt::Ctx &ctx, int64_t M, int64_t N, int64_t K) {
  auto ops = std::make_shared<MatmulOperands<T>>(M, N, K);
  return [&ctx, ops, M, N, K] {
    rt::matmul<T>(ctx, false, false, M, N, K, 1.0f, ops->A.data(), K, 0, ops->B.data(), N, 0, 0.0f,
                  ops->C.data(), N, 0, 1);
  };
}

/// Registers a measurement with Rounds: f, and its calls, seconds and most calls in all (each
/// round gets a share); its index for Rounds::median.
using Add = std::function<size_t(std::string name, std::function<void()> f, int calls, double seconds, int maxCalls)>;

/// The machine the measurements run on: CPU model, cores and memory.
void describeMachine(Result &r) {
  r.cpuModel = cpuModelName();
  const char *core = openblas_get_corename(), *forced = std::getenv("OPENBLAS_CORETYPE");
  r.blasCore = core ? core : "";
  r.blasCoreEnv = forced ? forced : "";
  __builtin_cpu_init();
  r.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  long procs = sysconf(_SC_NPROCESSORS_ONLN);
  r.cores = procs > 0 ? int(procs) : 1;
  long pages = sysconf(_SC_PHYS_PAGES), pageSize = sysconf(_SC_PAGE_SIZE);
  r.memoryBytes = pages > 0 && pageSize > 0 ? double(pages) * double(pageSize) : 0;
}

/// The 1-minute load average, or -1 when /proc/loadavg cannot be read.
double loadAverage() {
  double v = -1;
  std::ifstream load("/proc/loadavg");
  if (!(load >> v))
    v = -1;
  return v;
}

/// 1. Matmuls: the samples in r.matmuls (fp32 and bf16 of every shape), their timings in order.
std::vector<size_t> addMatmuls(const Options &o, rt::Ctx &ctx, Result &r, const Add &add) {
  // 16 and 32: a toy model's matmuls, whose calls a fixed cost of OpenBLAS's (~1.3 us on the
  // 2-vCPU EPYC VM) dominates once the runtime's small calls enter no parallel region.
  std::vector<int64_t> squares = o.quick ? std::vector<int64_t>{16, 64, 128, 256}
                                         : std::vector<int64_t>{16, 32, 64, 128, 256, 512, 1024, 2048};
  struct Shape { int64_t M, N, K; };
  std::vector<Shape> shapes;
  for (int64_t s : squares)
    shapes.push_back({s, s, s});
  // Skinny: many tokens by a narrow model (the shapes of small training steps).
  if (o.quick)
    shapes.push_back({1024, 64, 64});
  else
    for (Shape s : {Shape{4096, 64, 64}, Shape{2048, 256, 64}, Shape{4096, 768, 256},
                    Shape{8192, 256, 1024}})
      shapes.push_back(s);
  std::vector<size_t> matmulTimings;
  for (const char *dtype : {"fp32", "bf16"})
    for (const Shape &s : shapes) {
      MatmulSample m;
      m.dtype = dtype;
      m.M = s.M, m.N = s.N, m.K = s.K;
      r.matmuls.push_back(m);
      matmulTimings.push_back(add("matmul " + m.dtype + " " + std::to_string(s.M) + "x" + std::to_string(s.N) +
                                      "x" + std::to_string(s.K),
                                  m.dtype == "fp32" ? matmulCall<float>(ctx, s.M, s.N, s.K)
                                                    : matmulCall<rt::bf16>(ctx, s.M, s.N, s.K),
                                  4, o.quick ? 0.01 : 0.1, 60));
    }
  return matmulTimings;
}

struct AttentionTimings { size_t forward, backward; };

/// 6. The runtime's fused causal attention forward and backward on one shape (q = k = v
/// [B, S, H·hd]).
AttentionTimings addAttention(const Options &o, rt::Ctx &ctx, const AttentionSample &sh, const Add &add) {
  struct Buffers { std::vector<float> q, k, v, out, dO, dq, dk, dv, lse; };
  auto b = std::make_shared<Buffers>();
  const size_t qn = size_t(sh.B * sh.S * sh.H * sh.hd);
  for (std::vector<float> *x : {&b->q, &b->k, &b->v, &b->out, &b->dO, &b->dq, &b->dk, &b->dv})
    x->resize(qn);
  b->lse.resize(size_t(sh.B * sh.H * sh.S));
  for (size_t i = 0; i < qn; ++i) {
    b->q[i] = 0.5f * float(int(i % 13) - 6) / 6.0f;
    b->k[i] = 0.5f * float(int(i % 11) - 5) / 5.0f;
    b->v[i] = float(int(i % 7) - 3) / 3.0f;
    b->dO[i] = float(int(i % 5) - 2) / 2.0f;
  }
  const float scale = 1.0f / std::sqrt(float(sh.hd));
  auto fwd = [&ctx, b, sh, scale] {
    rt::attention_fwd<float>(ctx, b->q.data(), b->k.data(), b->v.data(), b->out.data(), b->lse.data(), nullptr,
                             sh.B, sh.S, sh.S, sh.H, sh.H, sh.hd, scale, true, 0.0f, 0, 0);
  };
  auto bwd = [&ctx, b, sh, scale] {
    rt::attention_bwd<float>(ctx, b->q.data(), b->k.data(), b->v.data(), b->out.data(), b->lse.data(), nullptr,
                             b->dO.data(), b->dq.data(), b->dk.data(), b->dv.data(), sh.B, sh.S, sh.S, sh.H, sh.H,
                             sh.hd, scale, true, 0.0f, 0, 0, false);
  };
  // The forward first: the backward reads its out and lse.
  fwd();
  const std::string shape = " B" + std::to_string(sh.B) + " H" + std::to_string(sh.H) + " S" + std::to_string(sh.S) +
                            " hd" + std::to_string(sh.hd);
  return AttentionTimings{add("attention forward" + shape, fwd, 4, o.quick ? 0.01 : 0.1, 100),
                          add("attention backward" + shape, bwd, 4, o.quick ? 0.01 : 0.1, 100)};
}

/// 5b. Each unary kernel with transcendentals (ir/ops/Unary.def's kinds the runtime evaluates
/// with them), forward and gradient, on the floats of `x` (m of them; exp's forward is 5.'s
/// `expForward`, the same kernel on the same floats), and relu's gradient, the
/// gradients' baseline (relu's gradient reads y and dy, as tanh's, sigmoid's and exp's do;
/// gelu's and silu's read x and dy). `perCall` adds a measurement of many single calls.
struct UnaryTimings {
  struct Kernel {
    rt::UnOp op;
    const char *name; // the op's name in the language (ir/Ops.def)
    size_t forward = 0, gradient = 0;
  };
  std::vector<Kernel> kernels;
  size_t reluGradient = 0;
  size_t dropout = 0; ///< dropout's forward (5c)
};

/// 5d. The row kernels: for each, forward and gradient on 2048 rows of 32 (`narrow`) and on
/// 256 rows of 256 (`wide`), the same 65,536 floats.
struct RowTimings {
  struct Kernel {
    const char *name; // the op's name in the language (ir/Ops.def)
    size_t narrowForward = 0, wideForward = 0, narrowGradient = 0, wideGradient = 0;
  };
  std::vector<Kernel> kernels;
  static constexpr int64_t kNarrowRows = 2048, kNarrowCols = 32, kWideRows = 256, kWideCols = 256;
};
RowTimings addRowKernels(rt::Ctx &ctx, const std::function<size_t(std::string, std::function<void()>)> &perCall) {
  constexpr int64_t m = RowTimings::kNarrowRows * RowTimings::kNarrowCols;
  static_assert(m == RowTimings::kWideRows * RowTimings::kWideCols, "the two shapes hold the same floats");
  struct Buffers {
    std::vector<float> x, y, dy, dx, w, b, dw, db, mean, rstd, lse;
    std::vector<int32_t> labels;
    float loss = 0, dloss = 1;
  };
  auto b = std::make_shared<Buffers>();
  b->x.resize(m);
  for (int64_t i = 0; i < m; ++i)
    b->x[size_t(i)] = -4.0f + 8.0f * float(i % 1001) / 1000.0f;
  b->y.assign(m, 0.0f), b->dy.assign(m, 1.0f), b->dx.assign(m, 0.0f);
  b->w.assign(RowTimings::kWideCols, 1.0f), b->b.assign(RowTimings::kWideCols, 0.0f);
  b->dw.assign(RowTimings::kWideCols, 0.0f), b->db.assign(RowTimings::kWideCols, 0.0f);
  b->mean.assign(RowTimings::kNarrowRows, 0.0f), b->rstd.assign(RowTimings::kNarrowRows, 1.0f);
  b->lse.assign(RowTimings::kNarrowRows, 1.0f), b->labels.assign(RowTimings::kNarrowRows, 1);
  using Call = std::function<void(int64_t rows, int64_t cols)>;
  struct Kind {
    const char *name;
    Call forward, gradient;
  };
  rt::Ctx *c = &ctx;
  std::vector<Kind> kinds = {
      {"layer_norm",
       [c, b](int64_t r, int64_t n) {
         rt::layer_norm_fwd<float>(*c, b->x.data(), b->w.data(), b->b.data(), b->y.data(), b->mean.data(),
                                   b->rstd.data(), r, n, 1e-5f);
       },
       [c, b](int64_t r, int64_t n) {
         rt::layer_norm_bwd<float>(*c, b->x.data(), b->w.data(), b->mean.data(), b->rstd.data(), b->dy.data(),
                                   b->dx.data(), b->dw.data(), b->db.data(), r, n, false);
       }},
      {"rms_norm",
       [c, b](int64_t r, int64_t n) {
         rt::rms_norm_fwd<float>(*c, b->x.data(), b->w.data(), b->y.data(), b->rstd.data(), r, n, 1e-5f);
       },
       [c, b](int64_t r, int64_t n) {
         rt::rms_norm_bwd<float>(*c, b->x.data(), b->w.data(), b->rstd.data(), b->dy.data(), b->dx.data(),
                                 b->dw.data(), r, n, false);
       }},
      {"softmax", [c, b](int64_t r, int64_t n) { rt::softmax_fwd<float>(*c, b->x.data(), b->y.data(), r, n); },
       [c, b](int64_t r, int64_t n) {
         rt::softmax_bwd<float>(*c, b->y.data(), b->dy.data(), b->dx.data(), r, n, false);
       }},
      {"cross_entropy",
       [c, b](int64_t r, int64_t n) {
         rt::cross_entropy_fwd<float>(*c, b->x.data(), b->labels.data(), &b->loss, b->lse.data(), r, n);
       },
       [c, b](int64_t r, int64_t n) {
         rt::cross_entropy_bwd<float>(*c, b->x.data(), b->labels.data(), b->lse.data(), &b->dloss, b->dx.data(), r,
                                      n, false);
       }},
  };
  RowTimings t;
  for (const Kind &k : kinds) {
    RowTimings::Kernel out{k.name};
    auto shape = [](int64_t r, int64_t n) { return " " + std::to_string(r) + "x" + std::to_string(n); };
    const Call fwd = k.forward, grad = k.gradient;
    constexpr int64_t nr = RowTimings::kNarrowRows, nc = RowTimings::kNarrowCols;
    constexpr int64_t wr = RowTimings::kWideRows, wc = RowTimings::kWideCols;
    out.narrowForward = perCall(std::string(k.name) + shape(nr, nc), [fwd] { fwd(nr, nc); });
    out.wideForward = perCall(std::string(k.name) + shape(wr, wc), [fwd] { fwd(wr, wc); });
    out.narrowGradient = perCall(std::string(k.name) + " gradient" + shape(nr, nc), [grad] { grad(nr, nc); });
    out.wideGradient = perCall(std::string(k.name) + " gradient" + shape(wr, wc), [grad] { grad(wr, wc); });
    t.kernels.push_back(out);
  }
  return t;
}
UnaryTimings addUnaryKernels(rt::Ctx &ctx, const std::vector<float> &x, int64_t m, size_t expForward,
                             const std::function<size_t(std::string, std::function<void()>)> &perCall) {
  struct Buffers { std::vector<float> x, ones, y, dx; };
  auto b = std::make_shared<Buffers>();
  b->x = x;
  b->ones.assign(static_cast<size_t>(m), 1.0f); // y = 1 for the gradients that read it, dy = 1
  b->y.resize(static_cast<size_t>(m));
  b->dx.resize(static_cast<size_t>(m));
  UnaryTimings t;
  t.reluGradient = perCall("relu gradient of 65536 floats", [&ctx, b, m] {
    rt::unary_bwd<float>(ctx, rt::UnOp::Relu, b->x.data(), b->x.data(), b->ones.data(), b->dx.data(), m, false);
  });
  t.kernels = {{rt::UnOp::Gelu, "gelu"}, {rt::UnOp::GeluTanh, "gelu_tanh"}, {rt::UnOp::Silu, "silu"},
               {rt::UnOp::Tanh, "tanh"}, {rt::UnOp::Sigmoid, "sigmoid"}, {rt::UnOp::Exp, "exp"}};
  for (UnaryTimings::Kernel &u : t.kernels) {
    const rt::UnOp op = u.op;
    u.forward = op == rt::UnOp::Exp ? expForward // the same kernel on the same floats (5.)
                                    : perCall(std::string(u.name) + " of 65536 floats", [&ctx, b, m, op] {
                                        rt::unary_fwd<float>(ctx, op, b->x.data(), b->y.data(), m);
                                      });
    u.gradient = perCall(std::string(u.name) + " gradient of 65536 floats", [&ctx, b, m, op] {
      rt::unary_bwd<float>(ctx, op, b->x.data(), b->ones.data(), b->ones.data(), b->dx.data(), m, false);
    });
  }
  // 5c. Dropout's forward: a Philox block per 4 elements (codegen/runtime/common/tally_philox.h)
  // and its mask written, against relu's kernel on the same floats; its backward reads the
  // mask and is priced by its bytes.
  auto mask = std::make_shared<std::vector<uint8_t>>(static_cast<size_t>(m));
  t.dropout = perCall("dropout of 65536 floats", [&ctx, b, mask, m] {
    rt::dropout_fwd<float>(ctx, b->x.data(), b->y.data(), mask->data(), m, 0.1f, 1234, 7);
  });
  return t;
}

/// 5d's rates: per row = (narrow − wide) / (narrow rows − wide rows); per element = (wide − its
/// rows − relu's kernel in the same direction, `relu` forward, `reluGradient`) / elements.
void rowRates(const Rounds &timings, const RowTimings &t, size_t relu, size_t reluGradient, Result &r) {
  constexpr double m = double(RowTimings::kWideRows * RowTimings::kWideCols);
  const double rows = double(RowTimings::kNarrowRows - RowTimings::kWideRows);
  auto split = [&](size_t narrow, size_t wide, size_t baseline, double &perRow, double &perElement) {
    perRow = std::max(0.0, timings.median(narrow) - timings.median(wide)) / rows;
    perElement =
        std::max(0.0, timings.median(wide) - perRow * double(RowTimings::kWideRows) - timings.median(baseline)) / m;
  };
  for (const RowTimings::Kernel &k : t.kernels) {
    Result::UnaryTiming u{k.name};
    split(k.narrowForward, k.wideForward, relu, u.forwardRow, u.forward);
    split(k.narrowGradient, k.wideGradient, reluGradient, u.gradientRow, u.gradient);
    r.unary.push_back(u);
  }
}

} // namespace

Result measure(const Options &o) {
  Clock::time_point start = Clock::now();
  Result r;
  r.quick = o.quick;
  describeMachine(r);
  rt::Ctx ctx;
  r.threads = ctx.nthreads();
  r.loadAverage = loadAverage();

  // Every timing is registered here and taken in rounds (Rounds), then read as a median.
  const int rounds = o.quick ? 2 : 4;
  r.sliceSeconds = schedulerSlice(r.cores, r.sliceSource);
  Rounds timings(rounds, r.sliceSeconds, r.threads);
  // Per round: a `share` of the calls and the seconds a measurement gets in all.
  Add add = [&](std::string name, std::function<void()> f, int calls, double seconds, int maxCalls) {
    return timings.add(std::move(name), std::move(f), (calls + rounds - 1) / rounds, seconds / rounds,
                       (maxCalls + rounds - 1) / rounds);
  };

  // 1. Matmuls.
  std::vector<size_t> matmulTimings = addMatmuls(o, ctx, r, add);

  // 2. Triad, over arrays of 3 × n floats well past a 32 MiB last-level cache.
  const int64_t n = o.quick ? (int64_t(8) << 20) : (int64_t(16) << 20);
  // Every array a bandwidth is measured on is a region as the step's (rt::zeroed_region: huge
  // pages), so it streams through the pages the step does: against std::vector's 4 KiB pages,
  // the AdamW loop measured 27% faster (median of 8 runs of each, alternated, every pair faster)
  // and the triad and elementwise kernels about 10%.
  auto floats = [](int64_t count, float value) {
    float *p = reinterpret_cast<float *>(rt::zeroed_region(count * int64_t(sizeof(float))));
    if (!p)
      throw std::runtime_error("cannot allocate " + std::to_string(count) + " floats to measure with");
    std::fill(p, p + count, value);
    return p;
  };
  float *const a = floats(n, 0.0f), *const b = floats(n, 1.0f), *const c = floats(n, 2.0f);
  const int nt = r.threads;
  auto triad = [&] {
    float *pa = a;
    const float *pb = b, *pc = c;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      pa[i] = pb[i] + 3.0f * pc[i];
  };
  const size_t tTriad = add("triad", triad, 8, o.quick ? 0.02 : 0.2, 100);

  // 2b. The cache: one core's L2 × the threads (each thread's share of a kernel's data stays in
  // its core's L2), and the triad over arrays filling half of it, repeated.
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  const int64_t nc = l2 > 0 ? int64_t(double(l2) * double(nt) / 2 / 12) : 0;
  auto cached = [&] {
    float *pa = a;
    const float *pb = b, *pc = c;
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < nc; ++i)
      pa[i] = pb[i] + 3.0f * pc[i];
  };
  const size_t tCached = l2 > 0 ? add("triad in cache", cached, o.quick ? 50 : 300, o.quick ? 0.005 : 0.05, 5000) : 0;

  // 3. Elementwise kernels of the runtime.
  const size_t tRelu = add("relu", [&] { rt::unary_fwd<float>(ctx, rt::UnOp::Relu, b, a, n); }, 4,
                           o.quick ? 0.02 : 0.1, 60);
  const size_t tScale = add("scale", [&] { rt::scale<float>(ctx, a, 1.0f, n); }, 4, o.quick ? 0.02 : 0.1, 60);

  // 3b. The optimizer: the step's fused AdamW loop over fp32 param, grad, m and v, then the
  // gradients' fill (zero_grad), on arrays of their own as large as the triad's (more streams
  // than the triad's three: it is measured as itself, not derived from it).
  float *const op = floats(n, 0.01f), *const og = floats(n, 1e-3f), *const om = floats(n, 0.0f),
              *const ov = floats(n, 0.0f);
  int64_t optStep = 0;
  const size_t tOptimizer = add("adamw update + zero_grad", [&ctx, op, og, om, ov, n, &optStep] {
    rt::adam_update<float>(ctx, op, nullptr, og, om, ov, n, 1e-4f, 0.9f, 0.999f, 1e-8f, 0.01f, true, ++optStep,
                           1.0f);
    rt::fill<float>(ctx, og, 0.0f, n);
  }, 4, o.quick ? 0.02 : 0.1, 60);

  // 4. The fixed cost of a call: single calls of a few microseconds, many of them.
  auto perCall = [&](std::string name, std::function<void()> f) {
    return add(std::move(name), std::move(f), o.quick ? 50 : 300, o.quick ? 0.005 : 0.05, o.quick ? 500 : 5000);
  };
  const size_t tCall = perCall("call (scale of 1 float)", [&] { rt::scale<float>(ctx, a, 1.0f, 1); });
  const size_t tFork = perCall("empty OpenMP region", [&] {
#pragma omp parallel num_threads(nt)
    { asm volatile("" ::: "memory"); }
  });
  // A call with data, just above the threading bound (2 × kForkElements floats, in the cache):
  // once the team's threads touch the data, starting it costs more than an empty region (the
  // cache lines move between the cores), and fork_overhead is this call less its bytes at the
  // cache's bandwidth.
  const int64_t forkN = 2 * static_cast<int64_t>(kForkElements);
  float *const fd = floats(forkN, 1.0f);
  const size_t tForkData = perCall("scale of 8192 floats (threaded)", [&] { rt::scale<float>(ctx, fd, 1.0f, forkN); });

  // 5. Transcendentals: exp against relu over the same cache-resident elements (the separate
  // array e, spread over [-4, 4]).
  const int64_t m = 65536;
  std::vector<float> e(static_cast<size_t>(m)), eOut(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i)
    e[size_t(i)] = -4.0f + 8.0f * float(i % 1001) / 1000.0f;
  const size_t tExp = perCall("exp of 65536 floats", [&] { rt::unary_fwd<float>(ctx, rt::UnOp::Exp, e.data(), eOut.data(), m); });
  const size_t tRelu2 = perCall("relu of 65536 floats", [&] { rt::unary_fwd<float>(ctx, rt::UnOp::Relu, e.data(), eOut.data(), m); });
  const UnaryTimings tUnary = addUnaryKernels(ctx, e, m, tExp, perCall);
  const RowTimings tRows = addRowKernels(ctx, perCall);

  // 6. Attention: the runtime's fused causal attention forward and backward, on the main shape
  // and on the smaller ones of the curve (q = k = v [B, S, H·hd]).
  AttentionSample &at = r.attention;
  at.B = 1, at.H = 4, at.S = o.quick ? 128 : 256, at.hd = 64;
  r.attentionShapes = {AttentionSample{2, 4, 16, 16}};
  if (!o.quick)
    r.attentionShapes.push_back(AttentionSample{2, 4, 64, 32});
  const AttentionTimings tAttn = addAttention(o, ctx, at, add);
  std::vector<AttentionTimings> tShapes;
  for (const AttentionSample &sh : r.attentionShapes)
    tShapes.push_back(addAttention(o, ctx, sh, add));

  timings.run();
  r.timings = timings.timings();

  for (size_t i = 0; i < r.matmuls.size(); ++i)
    r.matmuls[i].seconds = timings.median(matmulTimings[i]);
  r.triadBandwidth = 3.0 * 4.0 * double(n) / timings.median(tTriad);
  if (l2 > 0) {
    r.cacheBytes = double(l2) * double(nt);
    r.cacheBandwidth = 3.0 * 4.0 * double(nc) / timings.median(tCached);
  }
  r.elementwiseBandwidth = 2.0 * 4.0 * double(n) * 2.0 / (timings.median(tRelu) + timings.median(tScale));
  r.optimizerBandwidth = 2.0 * 4.0 * 4.0 * double(n) / timings.median(tOptimizer);
  r.kernelOverhead = timings.median(tCall);
  // The threaded call less its bytes (read and written) at the bandwidth kernelTime gives them;
  // at least the empty region.
  const double forkBandwidth = r.cacheBandwidth > 0 ? r.cacheBandwidth : r.triadBandwidth;
  r.forkOverhead = std::max(timings.median(tFork),
                            timings.median(tForkData) - (forkBandwidth > 0 ? 8.0 * double(forkN) / forkBandwidth : 0));
  r.transcendentalTime = std::max(0.0, timings.median(tExp) - timings.median(tRelu2)) / double(m);
  for (const UnaryTimings::Kernel &u : tUnary.kernels)
    r.unary.push_back({u.name, std::max(0.0, timings.median(u.forward) - timings.median(tRelu2)) / double(m),
                       std::max(0.0, timings.median(u.gradient) - timings.median(tUnary.reluGradient)) / double(m)});
  r.unary.push_back({"dropout", std::max(0.0, timings.median(tUnary.dropout) - timings.median(tRelu2)) / double(m), 0});
  rowRates(timings, tRows, tRelu2, tUnary.reluGradient, r);
  at.forwardSeconds = timings.median(tAttn.forward);
  at.backwardSeconds = timings.median(tAttn.backward);
  for (size_t i = 0; i < r.attentionShapes.size(); ++i) {
    r.attentionShapes[i].forwardSeconds = timings.median(tShapes[i].forward);
    r.attentionShapes[i].backwardSeconds = timings.median(tShapes[i].backward);
  }

  r.seconds = since(start);
  return r;
}

} // namespace calibrate
} // namespace tally
