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
// 3. Elementwise: rt::unary_fwd (gelu) and rt::scale over the same size; bytes = read + write.
// 4. The target: peak per dtype = the best FLOP/s measured; each sample's efficiency is what
//    makes passes/StepTime.cpp's kernelTime return the measured time; bandwidth = the triad;
//    efficiency.elementwise = elementwise B/s ÷ triad B/s.
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

  // 3. Elementwise kernels of the runtime.
  auto gelu = [&] { rt::unary_fwd<float>(ctx, rt::UnOp::Gelu, b.data(), a.data(), n); };
  auto scale = [&] { rt::scale<float>(ctx, a.data(), 1.0f, n); };
  double tGelu = timeBest(gelu, 3, o.quick ? 0.02 : 0.1, 50);
  double tScale = timeBest(scale, 3, o.quick ? 0.02 : 0.1, 50);
  r.elementwiseBandwidth = 2.0 * 4.0 * double(n) * 2.0 / (tGelu + tScale);

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

std::vector<Point> curveOf(const Result &r, const std::string &dtype) {
  double peak = peakOf(r, dtype);
  std::vector<Point> pts;
  if (peak <= 0 || r.triadBandwidth <= 0)
    return pts;
  for (const MatmulSample &m : r.matmuls) {
    if (m.dtype != dtype || m.seconds <= 0)
      continue;
    double model = std::max(m.flops() / peak, m.bytes() / r.triadBandwidth);
    pts.push_back({m.flops(), std::min(1.0, model / m.seconds)});
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
  os << "// STREAM triad: " << num(r.triadBandwidth / 1e9, 4)
     << " GB/s; elementwise (gelu, scale): " << num(r.elementwiseBandwidth / 1e9, 4)
     << " GB/s.\n"
     << "// Interconnect (data parallel over MPI): " << (r.linkNote.empty() ? "not measured" : r.linkNote) << ".\n"
     << "// peak = the best FLOP/s measured per dtype; fp16 is converted like bf16 and takes\n"
     << "// bf16's numbers (not measured apart); matmul_curve = (FLOPs per call, efficiency).\n";
  double f32 = peakOf(r, "fp32"), b16 = peakOf(r, "bf16");
  double elem = r.triadBandwidth > 0 ? std::min(1.0, r.elementwiseBandwidth / r.triadBandwidth) : 1;
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
     << (r.linkBandwidth > 0 ? ", communication = 1" : "") << " }\n"
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
  // FNV-1a over the CPU model and the core count: a new CPU gets a new file.
  // "/link": files from before the interconnect was measured are not read.
  std::string key = cpuModelName() + "/" + std::to_string(std::thread::hardware_concurrency()) + "/link";
  uint32_t hash = 2166136261u;
  for (unsigned char ch : key)
    hash = (hash ^ ch) * 16777619u;
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", hash);
  return "host-" + h + "-" + hex + ".tally";
}

} // namespace calibrate
} // namespace tally
