// tally calibrate: the measurements and the `target host` file they become. Every timing runs the
// CPU runtime's own kernels (codegen/runtime/cpu, compiled with its flags), with the runtime's
// threading: OpenBLAS single-threaded, C tiles on the OpenMP threads (rt_matmul.h).
//
// 1. Matmuls: square M = N = K and a few skinny shapes (tokens × width), fp32 and bf16 (16-bit
//    storage converted to fp32 in blocks of K, rt_matmul.h). Each shape: one warm-up call, then
//    calls until both a minimum count and a minimum time are reached; the fastest call counts
//    (as STREAM and BLAS benchmarks report: on a shared machine the others measure the
//    neighbours). The 1-minute load average is recorded, and a busy machine is warned about.
// 2. Memory bandwidth: a STREAM triad a = b + s·c over arrays far larger than the last-level
//    cache, OpenMP static schedule; bytes = 3 × 4 per element (no write-allocate counted).
//    The cache: sysconf's L2 size × the threads, and the same triad over arrays filling half of
//    it (fastest of many calls).
// 3. Elementwise: rt::unary_fwd (relu) and rt::scale over the same size, kernels without
//    transcendentals (those are priced apart, 5.); bytes = read + write.
// 4. The fixed cost of a kernel call, measured directly (a difference of two timings of
//    microseconds drowns in their noise): rt::scale on one element (the call, its checks and
//    bookkeeping) plus an empty OpenMP parallel region on the runtime's threads (the fork and
//    join a kernel above 4,096 elements pays); the fastest of many single calls each.
// 5. Transcendentals: rt::unary_fwd exp minus the same kernel with relu (same loads, stores,
//    call and threads), on cache-resident inputs spread over [−4, 4], per element: the seconds
//    of one evaluation with all threads. The runtime's erf is a polynomial and at most one expf
//    (tally_math.h), tanh-form gelu one expf, so one rate prices them all.
// 6. Attention: the runtime's fused causal attention, forward and backward, fp32, B 1, H 4,
//    S 256, hd 64 (quick: S 128), the fastest call of each.
// 7. The target: peak per dtype = the best FLOP/s measured; each sample's efficiency is what
//    makes passes/StepTime.cpp's kernelTime return the measured time (with the fixed cost of
//    the call taken out, since kernelTime adds it back); bandwidth = the triad;
//    efficiency.elementwise = elementwise B/s ÷ triad B/s; kernel_overhead and transcendental
//    from 4. and 5.; efficiency.attention from 6.: the attention's FLOPs (as the op rules count
//    them) at the fp32 peak over its time less its exps and two calls' fixed cost.
#include "tools/calibrate/Calibrate.h"

#include "tally_rt.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

namespace tally {
namespace calibrate {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// The fastest call of `f`, in seconds, after one warm-up: at least `minCalls` calls and `minSeconds` in all,
/// at most `maxCalls`.
double timeBest(const std::function<void()> &f, int minCalls, double minSeconds, int maxCalls) {
  f();
  std::vector<double> t;
  double total = 0;
  while ((int(t.size()) < minCalls || total < minSeconds) && int(t.size()) < maxCalls) {
    Clock::time_point t0 = Clock::now();
    f();
    t.push_back(since(t0));
    total += t.back();
  }
  return *std::min_element(t.begin(), t.end());
}

template <class T>
double timeMatmul(rt::Ctx &ctx, int64_t M, int64_t N, int64_t K, const Options &o) {
  std::vector<T> A(size_t(M * K)), B(size_t(K * N)), C(size_t(M * N));
  for (size_t i = 0; i < A.size(); ++i)
    A[i] = rt::store<T>(float(int(i % 7) - 3) * 0.125f);
  for (size_t i = 0; i < B.size(); ++i)
    B[i] = rt::store<T>(float(int(i % 5) - 2) * 0.25f);
  auto call = [&] {
    rt::matmul<T>(ctx, false, false, M, N, K, 1.0f, A.data(), K, 0, B.data(), N, 0, 0.0f,
                  C.data(), N, 0, 1);
  };
  return o.quick ? timeBest(call, 3, 0.01, 50) : timeBest(call, 3, 0.1, 50);
}

std::string cpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string m = line.substr(colon + 1);
        size_t b = m.find_first_not_of(" \t");
        return b == std::string::npos ? "unknown CPU" : m.substr(b);
      }
    }
  return "unknown CPU";
}

/// The number as tally source text: plain decimal with `digits` significant digits.
std::string num(double v, int digits = 6) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

} // namespace

double MatmulSample::bytes() const {
  double elem = dtype == "fp32" ? 4 : 2;
  return (double(M) * double(K) + double(K) * double(N) + double(M) * double(N)) * elem;
}

Result measure(const Options &o) {
  Clock::time_point start = Clock::now();
  Result r;
  r.quick = o.quick;
  r.cpuModel = cpuModelName();
  long procs = sysconf(_SC_NPROCESSORS_ONLN);
  r.cores = procs > 0 ? int(procs) : 1;
  long pages = sysconf(_SC_PHYS_PAGES), pageSize = sysconf(_SC_PAGE_SIZE);
  r.memoryBytes = pages > 0 && pageSize > 0 ? double(pages) * double(pageSize) : 0;
  rt::Ctx ctx;
  r.threads = ctx.nthreads();
  std::ifstream load("/proc/loadavg");
  if (!(load >> r.loadAverage))
    r.loadAverage = -1;

  // 1. Matmuls.
  std::vector<int64_t> squares = o.quick ? std::vector<int64_t>{64, 128, 256}
                                         : std::vector<int64_t>{64, 128, 256, 512, 1024, 2048};
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
  for (const char *dtype : {"fp32", "bf16"})
    for (const Shape &s : shapes) {
      MatmulSample m;
      m.dtype = dtype;
      m.M = s.M, m.N = s.N, m.K = s.K;
      m.seconds = m.dtype == "fp32" ? timeMatmul<float>(ctx, s.M, s.N, s.K, o)
                                    : timeMatmul<rt::bf16>(ctx, s.M, s.N, s.K, o);
      r.matmuls.push_back(m);
    }

  // 2. Triad, over arrays of 3 × n floats well past a 32 MiB last-level cache.
  const int64_t n = o.quick ? (int64_t(8) << 20) : (int64_t(16) << 20);
  std::vector<float> a(size_t(n), 0.0f), b(size_t(n), 1.0f), c(size_t(n), 2.0f);
  const int nt = r.threads;
  auto triad = [&] {
    float *pa = a.data();
    const float *pb = b.data(), *pc = c.data();
#pragma omp parallel for num_threads(nt) schedule(static)
    for (int64_t i = 0; i < n; ++i)
      pa[i] = pb[i] + 3.0f * pc[i];
  };
  double tTriad = timeBest(triad, 5, o.quick ? 0.02 : 0.2, 100);
  r.triadBandwidth = 3.0 * 4.0 * double(n) / tTriad;

  // 2b. The cache: one core's L2 × the threads (each thread's share of a kernel's data stays in
  // its core's L2), and the triad over arrays filling half of it, repeated.
  long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
  if (l2 > 0) {
    r.cacheBytes = double(l2) * double(nt);
    const int64_t nc = int64_t(r.cacheBytes / 2 / 12);
    auto cached = [&] {
      float *pa = a.data();
      const float *pb = b.data(), *pc = c.data();
#pragma omp parallel for num_threads(nt) schedule(static)
      for (int64_t i = 0; i < nc; ++i)
        pa[i] = pb[i] + 3.0f * pc[i];
    };
    double tCached = timeBest(cached, o.quick ? 50 : 300, o.quick ? 0.005 : 0.05, 5000);
    r.cacheBandwidth = 3.0 * 4.0 * double(nc) / tCached;
  }

  // 3. Elementwise kernels of the runtime.
  auto relu = [&] { rt::unary_fwd<float>(ctx, rt::UnOp::Relu, b.data(), a.data(), n); };
  auto scale = [&] { rt::scale<float>(ctx, a.data(), 1.0f, n); };
  double tRelu = timeBest(relu, 3, o.quick ? 0.02 : 0.1, 50);
  double tScale = timeBest(scale, 3, o.quick ? 0.02 : 0.1, 50);
  r.elementwiseBandwidth = 2.0 * 4.0 * double(n) * 2.0 / (tRelu + tScale);

  // 4. The fixed cost of a call. Single calls of a few microseconds, the fastest of many: on a
  // shared machine a short call is likelier to run uninterrupted than a batch of them.
  auto perCall = [&](const std::function<void()> &f) {
    return timeBest(f, o.quick ? 50 : 300, o.quick ? 0.005 : 0.05, o.quick ? 500 : 5000);
  };
  double tCall = perCall([&] { rt::scale<float>(ctx, a.data(), 1.0f, 1); });
  double tFork = perCall([&] {
#pragma omp parallel num_threads(nt)
    { asm volatile("" ::: "memory"); }
  });
  r.kernelOverhead = tCall + tFork;

  // 5. Transcendentals: exp against relu over the same cache-resident elements.
  const int64_t m = 65536;
  for (int64_t i = 0; i < m; ++i)
    b[size_t(i)] = -4.0f + 8.0f * float(i % 1001) / 1000.0f;
  double tExp = perCall([&] { rt::unary_fwd<float>(ctx, rt::UnOp::Exp, b.data(), a.data(), m); });
  double tRelu2 = perCall([&] { rt::unary_fwd<float>(ctx, rt::UnOp::Relu, b.data(), a.data(), m); });
  r.transcendentalTime = std::max(0.0, tExp - tRelu2) / double(m);

  // 6. Attention: the runtime's fused causal attention forward and backward on one shape.
  AttentionSample &at = r.attention;
  at.B = 1, at.H = 4, at.S = o.quick ? 128 : 256, at.hd = 64;
  const size_t qn = size_t(at.B * at.S * at.H * at.hd);
  std::vector<float> q(qn), k(qn), v(qn), out(qn), dO(qn), dq(qn), dk(qn), dv(qn);
  std::vector<float> lse(size_t(at.B * at.H * at.S));
  for (size_t i = 0; i < qn; ++i) {
    q[i] = 0.5f * float(int(i % 13) - 6) / 6.0f;
    k[i] = 0.5f * float(int(i % 11) - 5) / 5.0f;
    v[i] = float(int(i % 7) - 3) / 3.0f;
    dO[i] = float(int(i % 5) - 2) / 2.0f;
  }
  const float attnScale = 1.0f / std::sqrt(float(at.hd));
  auto attnFwd = [&] {
    rt::attention_fwd<float>(ctx, q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr, at.B,
                             at.S, at.S, at.H, at.H, at.hd, attnScale, true, 0.0f, 0, 0);
  };
  auto attnBwd = [&] {
    rt::attention_bwd<float>(ctx, q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr, dO.data(),
                             dq.data(), dk.data(), dv.data(), at.B, at.S, at.S, at.H, at.H, at.hd, attnScale,
                             true, 0.0f, 0, 0, false);
  };
  at.forwardSeconds = timeBest(attnFwd, 3, o.quick ? 0.01 : 0.1, 100);
  at.backwardSeconds = timeBest(attnBwd, 3, o.quick ? 0.01 : 0.1, 100);

  r.seconds = since(start);
  return r;
}

double peakOf(const Result &r, const std::string &dtype) {
  double best = 0;
  for (const MatmulSample &m : r.matmuls)
    if (m.dtype == dtype && m.seconds > 0)
      best = std::max(best, m.flops() / m.seconds);
  return best;
}

double AttentionSample::scores() const {
  return double(B) * double(H) * double(S) * double(S) * (double(S) + 1) / (2 * double(S));
}

double attentionEfficiency(const Result &r) {
  const AttentionSample &at = r.attention;
  double peak = peakOf(r, "fp32"), seconds = at.forwardSeconds + at.backwardSeconds;
  if (peak <= 0 || seconds <= 0)
    return 0;
  // The computed (causal) scores' FLOPs, as ir/OpRules.cpp counts fused attention: forward
  // 4·hd + 5 per score (QKᵀ, P·V, scale and softmax); backward 4·hd + 4 (dq) + 2·hd (dk) +
  // 2·hd (dv) + 2·hd + 5 (the recomputed scores and softmax). One exp per score each way.
  double flops = (14.0 * double(at.hd) + 14.0) * at.scores();
  double work = seconds - 2 * at.scores() * r.transcendentalTime - 2 * r.kernelOverhead;
  if (work <= 0)
    return 0;
  return std::min(1.0, flops / peak / work);
}

std::vector<Point> curveOf(const Result &r, const std::string &dtype) {
  double peak = peakOf(r, dtype);
  std::vector<Point> pts;
  if (peak <= 0 || r.triadBandwidth <= 0)
    return pts;
  for (const MatmulSample &m : r.matmuls) {
    if (m.dtype != dtype || m.seconds <= 0)
      continue;
    // The bandwidth as kernelTime picks it (passes/StepTime.cpp, hostBandwidth).
    double bw = r.cacheBandwidth > 0 && m.bytes() <= r.cacheBytes ? r.cacheBandwidth : r.triadBandwidth;
    double model = std::max(m.flops() / peak, m.bytes() / bw);
    // kernelTime adds the call's fixed cost to model / efficiency: take it out here.
    double work = m.seconds > r.kernelOverhead ? m.seconds - r.kernelOverhead : m.seconds;
    pts.push_back({m.flops(), std::min(1.0, model / work)});
  }
  std::sort(pts.begin(), pts.end(), [](const Point &x, const Point &y) { return x.flops < y.flops; });
  // Merge samples whose FLOPs are within 2%: a curve by FLOPs holds one value there.
  std::vector<Point> out;
  for (size_t i = 0; i < pts.size();) {
    size_t j = i;
    double f = 0, e = 0;
    while (j < pts.size() && pts[j].flops <= pts[i].flops * 1.02)
      f += pts[j].flops, e += pts[j].efficiency, ++j;
    out.push_back({f / double(j - i), e / double(j - i)});
    i = j;
  }
  return out;
}

std::string renderTarget(const Result &r, const std::string &when) {
  std::ostringstream os;
  os << "// The host target: this machine, measured by `tally calibrate"
     << (r.quick ? " --quick" : "") << "` on " << when << " in " << num(r.seconds, 3)
     << " s.\n"
     << "// CPU: " << r.cpuModel << ", " << r.cores << " cores; kernels on " << r.threads
     << " OpenMP threads, OpenBLAS single-threaded per tile (codegen/runtime/cpu).\n"
     << "// Load average before measuring: " << num(r.loadAverage, 3)
     << (r.busy() ? " (busy: other processes shared the cores; calibrate again when idle)" : "")
     << ".\n"
     << (r.quick ? "// A quick calibration: small sizes and short timings, not for estimates.\n" : "")
     << "// Matmuls measured (one rt::matmul call, the fastest of several):\n";
  for (const MatmulSample &m : r.matmuls)
    os << "//   " << m.dtype << " " << m.M << " x " << m.N << " x " << m.K << ": "
       << num(m.seconds * 1e3, 4) << " ms, " << num(m.flops() / m.seconds / 1e9, 4)
       << " GFLOP/s\n";
  os << "// STREAM triad: " << num(r.triadBandwidth / 1e9, 4) << " GB/s; in the cache ("
     << num(r.cacheBytes / 1048576.0, 4) << " MiB: L2 × threads): " << num(r.cacheBandwidth / 1e9, 4)
     << " GB/s; elementwise (relu, scale): " << num(r.elementwiseBandwidth / 1e9, 4)
     << " GB/s.\n"
     << "// Interconnect (data parallel over MPI): " << (r.linkNote.empty() ? "not measured" : r.linkNote) << ".\n"
     << "// kernel_overhead: the fixed cost of one runtime kernel call (scale on 1 float + an empty\n"
     << "// OpenMP region); transcendental: one exp with all threads (exp minus relu over 65536 floats).\n"
     << "// Attention, fused causal fp32, B " << r.attention.B << " H " << r.attention.H << " S "
     << r.attention.S << " hd " << r.attention.hd << ": forward " << num(r.attention.forwardSeconds * 1e3, 4)
     << " ms, backward " << num(r.attention.backwardSeconds * 1e3, 4)
     << " ms; efficiency.attention = its FLOPs at the fp32 peak / (time − its exps − 2 calls).\n"
     << "// peak = the best FLOP/s measured per dtype; fp16 is converted like bf16 and takes\n"
     << "// bf16's numbers (not measured apart); matmul_curve = (FLOPs per call, efficiency).\n";
  double f32 = peakOf(r, "fp32"), b16 = peakOf(r, "bf16");
  double elem = r.triadBandwidth > 0 ? std::min(1.0, r.elementwiseBandwidth / r.triadBandwidth) : 1;
  double attn = attentionEfficiency(r);
  std::vector<Point> c32 = curveOf(r, "fp32"), c16 = curveOf(r, "bf16");
  auto curve = [&](const std::vector<Point> &c) {
    std::string s = "[";
    for (size_t i = 0; i < c.size(); ++i)
      s += (i ? ", (" : "(") + num(c[i].flops, 6) + ", " + num(std::max(c[i].efficiency, 1e-4), 4) + ")";
    return s + "]";
  };
  os << "target host {\n"
     << "  memory = " << num(r.memoryBytes / 1073741824.0, 6) << " GiB\n"
     << "  bandwidth = " << num(r.triadBandwidth / 1e9, 6) << " GB/s\n"
     << "  host_link = " << num(r.triadBandwidth / 1e9, 6) << " GB/s\n"
     << "  host_memory = " << num(r.memoryBytes / 1073741824.0, 6) << " GiB\n";
  if (r.linkBandwidth > 0)
    os << "  interconnect = " << num(r.linkBandwidth / 1e9, 6) << " GB/s\n"
       << "  link_latency = " << num(r.linkLatency * 1e6, 6) << " us\n";
  os
     << "  peak { fp32 = " << num(f32 / 1e9, 6) << " GFLOP/s, bf16 = " << num(b16 / 1e9, 6)
     << " GFLOP/s, fp16 = " << num(b16 / 1e9, 6) << " GFLOP/s }\n"
     << "  efficiency { matmul = " << num(c32.empty() ? 1 : std::max(c32.back().efficiency, 1e-4), 4)
     << ", elementwise = " << num(std::max(elem, 1e-4), 4)
     << (r.linkBandwidth > 0 ? ", communication = 1" : "")
     << (attn > 0 ? ", attention = " + num(std::max(attn, 1e-4), 4) : std::string()) << " }\n"
     << (r.kernelOverhead > 0 ? "  kernel_overhead = " + num(r.kernelOverhead * 1e9, 4) + " ns\n" : "")
     << (r.cacheBytes > 0 && r.cacheBandwidth > 0
             ? "  cache = " + num(r.cacheBytes / 1048576.0, 6) + " MiB\n  cache_bandwidth = " +
                   num(r.cacheBandwidth / 1e9, 6) + " GB/s\n"
             : "")
     << (r.transcendentalTime > 0
             ? "  transcendental = " + num(r.transcendentalTime * 1e9, 4) + " ns\n"
             : "")
     << "  matmul_curve {\n"
     << "    fp32 = " << curve(c32) << "\n"
     << "    bf16 = " << curve(c16) << "\n"
     << "    fp16 = " << curve(c16) << "\n"
     << "  }\n"
     << "}\n";
  return os.str();
}

std::string cacheFileName() {
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) != 0 || !host[0])
    std::snprintf(host, sizeof host, "unknown");
  std::string h;
  for (const char *p = host; *p; ++p)
    h += (std::isalnum(static_cast<unsigned char>(*p)) || *p == '-' || *p == '.') ? *p : '_';
  // FNV-1a over the CPU model, the core count and the file's contents version: a new CPU gets a
  // new file, and so does a tally that measures more (version 3: the call cost, transcendentals,
  // the cache and attention; the interconnect), so an older calibration is not silently used.
  std::string key = cpuModelName() + "/" + std::to_string(std::thread::hardware_concurrency()) + "/3";
  uint32_t hash = 2166136261u;
  for (unsigned char ch : key)
    hash = (hash ^ ch) * 16777619u;
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", hash);
  return "host-" + h + "-" + hex + ".tally";
}

} // namespace calibrate
} // namespace tally
