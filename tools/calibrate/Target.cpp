// tally calibrate's target: the efficiency curves and the `target host { ... }` declaration
// made from tally-measure's Result (tools/calibrate/Calibrate.h), and the cache file's name.
// No BLAS here: this is what the tally binary links (step 7 of Measure.cpp's list).
#include "tools/calibrate/Calibrate.h"

#include "support/Format.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <ostream>
#include <sstream>
#include <thread>
#include <utility>

namespace tally {
namespace calibrate {

namespace {

/// The number as tally source text: plain decimal with `digits` significant digits.
std::string num(double v, int digits = 6) { return significant(v, digits); }

/// The comment block on the robust statistics (Robust.cpp): the rule, then per measurement its
/// rejected calls and its rounds' spread, and "NOISY" with the reason where it failed.
void renderTimings(std::ostream &os, const Result &r) {
  if (r.timings.empty())
    return;
  os << "// Calls more than max(the fastest, half a scheduler slice) above their measurement's fastest call are\n"
     << "// rejected as descheduled before the median (slice " << num(r.sliceSeconds * 1e3, 3) << " ms: "
     << r.sliceSource << "); each measurement's rounds' medians must agree within " << num(kSpreadBound, 3)
     << "x\n// (re-measured in twice the rounds once when not), and its threads may wait for a CPU at most "
     << num(100 * kWaitBound, 3) << "% of its time.\n// Per measurement: rejected calls, the rounds' spread, the threads' wait:\n";
  for (const Timing &t : r.timings) {
    os << "//   " << t.name << ": " << t.rejected << " of " << t.calls << " calls rejected, rounds within "
       << num(t.spread, 3) << "x"
       << (t.waitShare >= 0 ? ", waited for a CPU " + num(100 * t.waitShare, 2) + "%" : std::string())
       << (t.remeasured ? " (re-measured, " + std::to_string(t.rounds) + " rounds)" : "");
    if (std::string why = noisyReason(t); !why.empty())
      os << "; NOISY: " << why;
    os << "\n";
  }
}

} // namespace

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

double MatmulSample::bytes() const {
  double elem = dtype == "fp32" ? 4 : 2;
  return (double(M) * double(K) + double(K) * double(N) + double(M) * double(N)) * elem;
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

double AttentionSample::tiledScores() const {
  return double(B) * double(H) * tiledCausalScores(double(S), kHostAttentionTile);
}

double attentionEfficiency(const Result &r) {
  const AttentionSample &at = r.attention;
  double peak = peakOf(r, "fp32"), seconds = at.forwardSeconds + at.backwardSeconds;
  if (peak <= 0 || seconds <= 0)
    return 0;
  // The FLOPs per score as ir/ops/Attention.cpp counts fused attention: forward 4·hd + 5 per
  // score (QKᵀ, P·V, scale and softmax); backward 4·hd + 4 (dq) + 2·hd (dk) + 2·hd (dv) + 2·hd
  // + 5 (the recomputed scores and softmax), over the scores the kernel's tiles compute
  // (attention_tile). One exp per score of the triangle each way.
  double flops = (14.0 * double(at.hd) + 14.0) * at.tiledScores();
  double work = seconds - 2 * at.scores() * r.transcendentalTime - 2 * r.callSeconds(at.threaded());
  if (work <= 0)
    return 0;
  return std::min(1.0, flops / peak / work);
}

namespace {

/// Sorted by FLOPs, with points within 2% of each other's FLOPs merged into their mean: a curve
/// by FLOPs holds one value there.
std::vector<Point> mergedCurve(std::vector<Point> pts) {
  std::sort(pts.begin(), pts.end(), [](const Point &x, const Point &y) { return x.flops < y.flops; });
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

/// A record of kernel times (`elementwise_time` per element, `row_time` per row): each measured
/// kind's forward and gradient (`_grad`) by `field`, those above zero, or "" when none was.
std::string kernelTimes(const Result &r, const char *record,
                        double Result::UnaryTiming::*forward, double Result::UnaryTiming::*gradient) {
  std::string items;
  for (const Result::UnaryTiming &u : r.unary)
    for (bool isGradient : {false, true})
      if (double seconds = u.*(isGradient ? gradient : forward); seconds > 0)
        items += (items.empty() ? "" : ", ") + u.op + (isGradient ? "_grad" : "") + " = " +
                 num(seconds * 1e9, 4) + " ns";
  return items.empty() ? "" : "  " + std::string(record) + " { " + items + " }\n";
}

} // namespace

bool blasHeldToAvx2(const Result &r) {
  std::string core = r.blasCore;
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
  return !r.blasCoreEnv.empty() && r.avx512 && (core == "haswell" || core == "zen");
}

std::string blasCoreNote(const Result &r) {
  if (r.blasCoreEnv.empty())
    return "";
  std::string note = "// OpenBLAS's kernels were chosen by OPENBLAS_CORETYPE=" + r.blasCoreEnv + " in the environment";
  if (blasHeldToAvx2(r))
    note += ": its AVX2 kernels on a CPU with AVX-512, which OpenBLAS's SkylakeX and Cooperlake kernels\n"
            "// use (on a 2-vCPU AMD EPYC with AVX-512, twice the fp32 peak: docs/performance.md); steps run\n"
            "// in the same environment take the same kernels";
  return note + ".\n";
}

std::vector<Point> attentionCurveOf(const Result &r) {
  double peak = peakOf(r, "fp32");
  std::vector<Point> pts;
  if (peak <= 0)
    return pts;
  std::vector<AttentionSample> all = r.attentionShapes;
  all.push_back(r.attention);
  for (const AttentionSample &a : all) {
    // The FLOPs of each call as ir/ops/Attention.cpp counts fused causal attention, over the
    // scores the tiles compute (attentionEfficiency); the exps of the triangle's.
    double hd = double(a.hd), scores = a.scores(), tiled = a.tiledScores();
    for (auto [flops, seconds] : {std::pair<double, double>{(4 * hd + 5) * tiled, a.forwardSeconds},
                                  std::pair<double, double>{(10 * hd + 9) * tiled, a.backwardSeconds}}) {
      double work = seconds - scores * r.transcendentalTime - r.callSeconds(a.threaded());
      if (seconds > 0 && work > 0)
        pts.push_back({flops, std::min(1.0, flops / peak / work)});
    }
  }
  return mergedCurve(std::move(pts));
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
    const double call = r.callSeconds(m.threaded());
    double work = m.seconds > call ? m.seconds - call : m.seconds;
    pts.push_back({m.flops(), std::min(1.0, model / work)});
  }
  return mergedCurve(std::move(pts));
}

std::string renderTarget(const Result &r, const std::string &when) {
  std::ostringstream os;
  os << "// The host target: this machine, measured by `tally calibrate"
     << (r.quick ? " --quick" : "") << "` on " << when << " in " << num(r.seconds, 3)
     << " s.\n"
     << "// CPU: " << r.cpuModel << ", " << r.cores << " cores; kernels on " << r.threads
     << " OpenMP threads, OpenBLAS single-threaded per tile (codegen/runtime/cpu)"
     << (r.blasCore.empty() ? std::string() : ", its " + r.blasCore + " kernels") << ".\n"
     << blasCoreNote(r)
     << "// Load average before measuring: " << num(r.loadAverage, 3)
     << (r.busy() ? " (busy: other processes shared the cores; calibrate again when idle)" : "")
     << ".\n"
     << (r.quick ? "// A quick calibration: small sizes and short timings, not for estimates.\n" : "");
  renderTimings(os, r);
  os << "// Matmuls measured (one rt::matmul call, the median of " << (r.quick ? 2 : 4) << " rounds of calls):\n";
  for (const MatmulSample &m : r.matmuls)
    os << "//   " << m.dtype << " " << m.M << " x " << m.N << " x " << m.K << ": "
       << num(m.seconds * 1e3, 4) << " ms, " << num(m.flops() / m.seconds / 1e9, 4)
       << " GFLOP/s\n";
  os << "// STREAM triad: " << num(r.triadBandwidth / 1e9, 4) << " GB/s; in the cache ("
     << num(r.cacheBytes / 1048576.0, 4) << " MiB: L2 × threads): " << num(r.cacheBandwidth / 1e9, 4)
     << " GB/s; elementwise (relu, scale): " << num(r.elementwiseBandwidth / 1e9, 4)
     << " GB/s; the optimizer (fp32 AdamW and zero_grad, 32 bytes an element): "
     << num(r.optimizerBandwidth / 1e9, 4) << " GB/s.\n"
     << "// Interconnect (data parallel over MPI): " << (r.linkNote.empty() ? "not measured" : r.linkNote) << ".\n"
     << "// kernel_overhead: the fixed cost of one runtime kernel call on the calling thread (scale\n"
     << "// of 1 float); fork_overhead: a call's that starts the team of threads instead (scale of 8192\n"
     << "// floats on the team less its bytes at the cache's bandwidth, at least an empty OpenMP\n"
     << "// region's; kernels over 4096 elements); transcendental: one exp with all threads (exp minus relu over 65536 floats);\n"
     << "// elementwise_time: each unary kernel with transcendentals per element, all threads, less\n"
     << "// relu's kernel in the same direction (forward, _grad: the gradient), on the same floats;\n"
     << "// dropout: its forward's Philox and mask (its backward reads the mask).\n"
     << "// row kernels (layer_norm, rms_norm, softmax, cross_entropy): elementwise_time per element\n"
     << "// and row_time per row, from 2048 rows of 32 and 256 rows of 256 (the same 65536 floats):\n"
     << "// row_time = their difference over 1792 rows, elementwise_time = the wide shape less its\n"
     << "// rows and less relu's kernel in the same direction.\n"
     << "// Attention, fused causal fp32, B " << r.attention.B << " H " << r.attention.H << " S "
     << r.attention.S << " hd " << r.attention.hd << ": forward " << num(r.attention.forwardSeconds * 1e3, 4)
     << " ms, backward " << num(r.attention.backwardSeconds * 1e3, 4)
     << " ms; efficiency.attention = its FLOPs at the fp32 peak / (time − its exps − 2 calls).\n";
  for (const AttentionSample &a : r.attentionShapes)
    os << "//   and B " << a.B << " H " << a.H << " S " << a.S << " hd " << a.hd << ": forward "
       << num(a.forwardSeconds * 1e3, 4) << " ms, backward " << num(a.backwardSeconds * 1e3, 4) << " ms\n";
  os << "// attention_curve = per call, forward and backward of every shape, (FLOPs, efficiency), the\n"
     << "// FLOPs of the scores its tiles of attention_tile queries and keys compute (every tile up to\n"
     << "// the diagonal whole).\n"
     << "// peak = the best FLOP/s measured per dtype; fp16 is converted like bf16 and takes\n"
     << "// bf16's numbers (not measured apart); matmul_curve = (FLOPs per call, efficiency).\n";
  double f32 = peakOf(r, "fp32"), b16 = peakOf(r, "bf16");
  double elem = r.triadBandwidth > 0 ? std::min(1.0, r.elementwiseBandwidth / r.triadBandwidth) : 1;
  double attn = attentionEfficiency(r);
  std::vector<Point> c32 = curveOf(r, "fp32"), c16 = curveOf(r, "bf16"), ca = attentionCurveOf(r);
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
     << "  threads = " << r.threads << "\n"
     << (r.kernelOverhead > 0 ? "  kernel_overhead = " + num(r.kernelOverhead * 1e9, 4) + " ns\n" : "")
     << (r.forkOverhead > 0 ? "  fork_overhead = " + num(r.forkOverhead * 1e9, 4) + " ns\n" : "")
     << (r.optimizerBandwidth > 0 ? "  optimizer_bandwidth = " + num(r.optimizerBandwidth / 1e9, 6) + " GB/s\n" : "")
     << (r.cacheBytes > 0 && r.cacheBandwidth > 0
             ? "  cache = " + num(r.cacheBytes / 1048576.0, 6) + " MiB\n  cache_bandwidth = " +
                   num(r.cacheBandwidth / 1e9, 6) + " GB/s\n"
             : "")
     << (r.transcendentalTime > 0
             ? "  transcendental = " + num(r.transcendentalTime * 1e9, 4) + " ns\n"
             : "")
     << kernelTimes(r, "elementwise_time", &Result::UnaryTiming::forward, &Result::UnaryTiming::gradient)
     << kernelTimes(r, "row_time", &Result::UnaryTiming::forwardRow, &Result::UnaryTiming::gradientRow)
     << (ca.empty() ? "" : "  attention_curve = " + curve(ca) + "\n  attention_tile = " +
                               num(kHostAttentionTile, 4) + "\n")
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
  // new file, and so does a tally that measures more or otherwise (version 3: the call cost,
  // transcendentals, the cache and attention; the interconnect; version 4: medians of rounds,
  // `threads`; version 5: the optimizer loop), so an older calibration is not silently used.
  std::string key = cpuModelName() + "/" + std::to_string(std::thread::hardware_concurrency()) + "/5";
  uint32_t hash = 2166136261u;
  for (unsigned char ch : key)
    hash = (hash ^ ch) * 16777619u;
  char hex[16];
  std::snprintf(hex, sizeof hex, "%08x", hash);
  return "host-" + h + "-" + hex + ".tally";
}

double recordedLoadAverage(const std::string &text) {
  const std::string key = "// Load average before measuring: ";
  size_t at = text.find(key);
  if (at == std::string::npos)
    return -1;
  const char *start = text.c_str() + at + key.size();
  char *end = nullptr;
  double v = std::strtod(start, &end);
  return end != start && std::isfinite(v) && v >= 0 ? v : -1;
}

std::string overwriteRefusal(const Result &r, double oldLoad) {
  if (!underLoad(r) || oldLoad < 0 || oldLoad >= r.loadAverage)
    return "";
  return "this calibration was measured at a load average of " + num(r.loadAverage, 3) + " on " +
         std::to_string(r.cores) + " core" + (r.cores == 1 ? "" : "s") +
         " (other processes competed for the cores, so its numbers are low), and the existing one at " +
         num(oldLoad, 3) + "; keeping the existing one (calibrate again when the machine is idle, or --force to "
         "replace it anyway)";
}

} // namespace calibrate
} // namespace tally
