// tally-measure's output, read by tally calibrate (tools/calibrate/Calibrate.h): one JSON object
//   {"protocol": "tally-measure", "version": 3, "quick": false, "cpu_model": "...",
//    "cores": 2, "threads": 2, "memory_bytes": ..., "load_average": ..., "seconds": ...,
//    "triad_bandwidth": ..., "cache_bytes": ..., "cache_bandwidth": ...,
//    "elementwise_bandwidth": ..., "optimizer_bandwidth": ..., "kernel_overhead": ...,
//    "fork_overhead": ..., "transcendental_time": ...,
//    "unary": [{"op": "gelu", "forward": ..., "gradient": ..., "forward_row": ...,
//               "gradient_row": ...}, ...],
//    "matmuls": [{"dtype": "fp32", "M": 64, "N": 64, "K": 64, "seconds": ...}, ...],
//    "attention": {"B": 1, "H": 4, "S": 256, "hd": 64, "forward_seconds": ...,
//                  "backward_seconds": ...},
//    "attention_shapes": [{"B": 2, "H": 4, "S": 16, "hd": 16, ...}, ...],
//    "slice_seconds": 0.0015, "slice_source": "...",
//    "timings": [{"name": "matmul fp32 64x64x64", "rounds": 4, "calls": 48, "rejected": 0,
//                 "median": ..., "spread": 1.05, "remeasured": false, "wait_share": 0.001}, ...]}
// in SI units (bytes, bytes per second, seconds). llvm::json writes doubles with 17 significant
// digits, so the numbers tally reads are the ones measured, bit for bit. Reading checks the
// protocol name and version, every field's presence and type, and that the numbers are
// possible (counts ≥ 1, sizes and times ≥ 0, at least one matmul of each dtype): whatever a
// broken or foreign child prints becomes an error message, never a wrong target.
#include "tools/calibrate/Calibrate.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>

namespace tally {
namespace calibrate {

using llvm::json::Array;
using llvm::json::Object;
using llvm::json::Value;

std::string resultToJSON(const Result &r) {
  std::vector<double> numbers = {r.memoryBytes,    r.loadAverage,          r.seconds,
                                 r.triadBandwidth, r.cacheBytes,           r.cacheBandwidth,
                                 r.elementwiseBandwidth, r.kernelOverhead, r.forkOverhead,
                                 r.transcendentalTime, r.optimizerBandwidth, r.attention.forwardSeconds,
                                 r.attention.backwardSeconds};
  for (const MatmulSample &m : r.matmuls)
    numbers.push_back(m.seconds);
  for (const AttentionSample &a : r.attentionShapes)
    numbers.insert(numbers.end(), {a.forwardSeconds, a.backwardSeconds});
  for (const Result::UnaryTiming &u : r.unary)
    numbers.insert(numbers.end(), {u.forward, u.gradient, u.forwardRow, u.gradientRow});
  numbers.push_back(r.sliceSeconds);
  for (const Timing &t : r.timings)
    numbers.insert(numbers.end(), {t.median, t.spread, t.waitShare});
  for (double x : numbers)
    if (!std::isfinite(x))
      return "";
  Array matmuls;
  for (const MatmulSample &m : r.matmuls)
    matmuls.push_back(Object{{"dtype", m.dtype}, {"M", m.M}, {"N", m.N}, {"K", m.K}, {"seconds", m.seconds}});
  auto attention = [](const AttentionSample &a) {
    return Object{{"B", a.B}, {"H", a.H}, {"S", a.S}, {"hd", a.hd}, {"forward_seconds", a.forwardSeconds},
                  {"backward_seconds", a.backwardSeconds}};
  };
  Array shapes;
  for (const AttentionSample &a : r.attentionShapes)
    shapes.push_back(attention(a));
  Array unary;
  for (const Result::UnaryTiming &u : r.unary)
    unary.push_back(Object{{"op", u.op}, {"forward", u.forward}, {"gradient", u.gradient},
                           {"forward_row", u.forwardRow}, {"gradient_row", u.gradientRow}});
  Array timings;
  for (const Timing &t : r.timings)
    timings.push_back(Object{{"name", t.name}, {"rounds", t.rounds}, {"calls", t.calls}, {"rejected", t.rejected},
                             {"median", t.median}, {"spread", t.spread}, {"remeasured", t.remeasured},
                             {"wait_share", t.waitShare}});
  Object o{{"protocol", "tally-measure"},
           {"version", kProtocolVersion},
           {"quick", r.quick},
           {"cpu_model", r.cpuModel},
           {"blas_core", r.blasCore},
           {"blas_core_env", r.blasCoreEnv},
           {"avx512", r.avx512},
           {"cores", r.cores},
           {"threads", r.threads},
           {"memory_bytes", r.memoryBytes},
           {"load_average", r.loadAverage},
           {"seconds", r.seconds},
           {"triad_bandwidth", r.triadBandwidth},
           {"cache_bytes", r.cacheBytes},
           {"cache_bandwidth", r.cacheBandwidth},
           {"elementwise_bandwidth", r.elementwiseBandwidth},
           {"optimizer_bandwidth", r.optimizerBandwidth},
           {"kernel_overhead", r.kernelOverhead},
           {"fork_overhead", r.forkOverhead},
           {"transcendental_time", r.transcendentalTime},
           {"unary", std::move(unary)},
           {"matmuls", std::move(matmuls)},
           {"attention", attention(r.attention)},
           {"attention_shapes", std::move(shapes)},
           {"slice_seconds", r.sliceSeconds},
           {"slice_source", r.sliceSource},
           {"timings", std::move(timings)}};
  std::string text;
  llvm::raw_string_ostream os(text);
  os << Value(std::move(o));
  return os.str();
}

// Found by llvm::json::ObjectMapper through argument-dependent lookup: in this namespace.
static bool fromJSON(const Value &v, MatmulSample &m, llvm::json::Path p) {
  llvm::json::ObjectMapper o(v, p);
  return o && o.map("dtype", m.dtype) && o.map("M", m.M) && o.map("N", m.N) && o.map("K", m.K) &&
         o.map("seconds", m.seconds);
}

static bool fromJSON(const Value &v, AttentionSample &a, llvm::json::Path p) {
  llvm::json::ObjectMapper o(v, p);
  return o && o.map("B", a.B) && o.map("H", a.H) && o.map("S", a.S) && o.map("hd", a.hd) &&
         o.map("forward_seconds", a.forwardSeconds) && o.map("backward_seconds", a.backwardSeconds);
}

static bool fromJSON(const Value &v, Result::UnaryTiming &u, llvm::json::Path p) {
  llvm::json::ObjectMapper o(v, p);
  return o && o.map("op", u.op) && o.map("forward", u.forward) && o.map("gradient", u.gradient) &&
         o.map("forward_row", u.forwardRow) && o.map("gradient_row", u.gradientRow);
}

static bool fromJSON(const Value &v, Timing &t, llvm::json::Path p) {
  llvm::json::ObjectMapper o(v, p);
  return o && o.map("name", t.name) && o.map("rounds", t.rounds) && o.map("calls", t.calls) &&
         o.map("rejected", t.rejected) && o.map("median", t.median) && o.map("spread", t.spread) &&
         o.map("remeasured", t.remeasured) && o.map("wait_share", t.waitShare);
}

namespace {

/// The first impossible value of `r`, or "" when there is none.
std::string impossible(const Result &r) {
  if (r.cores < 1 || r.threads < 1)
    return "cores and threads must be at least 1";
  for (double x : {r.memoryBytes, r.seconds, r.triadBandwidth, r.cacheBytes, r.cacheBandwidth,
                   r.elementwiseBandwidth, r.kernelOverhead, r.forkOverhead, r.transcendentalTime,
                   r.optimizerBandwidth,
                   r.attention.forwardSeconds, r.attention.backwardSeconds})
    if (x < 0)
      return "a size, rate or time is negative";
  if (r.triadBandwidth <= 0)
    return "the memory bandwidth is not positive";
  for (const Result::UnaryTiming &u : r.unary)
    if (u.forward < 0 || u.gradient < 0 || u.forwardRow < 0 || u.gradientRow < 0)
      return "the time of unary kernel '" + u.op + "' is negative";
  bool fp32 = false, bf16 = false;
  for (const MatmulSample &m : r.matmuls) {
    if (m.dtype != "fp32" && m.dtype != "bf16")
      return "a matmul's dtype is '" + m.dtype + "' (fp32 or bf16)";
    if (m.M < 1 || m.N < 1 || m.K < 1 || m.seconds < 0)
      return "a matmul's shape or time is not possible";
    (m.dtype == "fp32" ? fp32 : bf16) = true;
  }
  if (!fp32 || !bf16)
    return "no fp32 or no bf16 matmul was measured";
  std::vector<AttentionSample> all = r.attentionShapes;
  all.push_back(r.attention);
  for (const AttentionSample &a : all)
    if (a.B < 1 || a.H < 1 || a.S < 1 || a.hd < 1 || a.forwardSeconds < 0 || a.backwardSeconds < 0)
      return "an attention's shape or time is not possible";
  if (r.sliceSeconds < 0)
    return "the scheduler slice is negative";
  for (const Timing &t : r.timings)
    if (t.rounds < 1 || t.calls < 1 || t.rejected < 0 || t.rejected > t.calls || t.median < 0 || !(t.spread >= 1))
      return "the timing of '" + t.name + "' is not possible (rounds and calls at least 1, rejected calls " +
             "at most the calls, spread at least 1)";
  return "";
}

} // namespace

bool resultFromJSON(const std::string &text, Result &r, std::string &error) {
  llvm::Expected<Value> parsed = llvm::json::parse(text);
  if (!parsed) {
    error = "not JSON (" + llvm::toString(parsed.takeError()) + ")";
    return false;
  }
  const Object *obj = parsed->getAsObject();
  if (!obj) {
    error = "not a JSON object";
    return false;
  }
  llvm::Optional<llvm::StringRef> protocol = obj->getString("protocol");
  if (!protocol || *protocol != "tally-measure") {
    error = "not tally-measure's output (no \"protocol\": \"tally-measure\")";
    return false;
  }
  llvm::Optional<int64_t> version = obj->getInteger("version");
  if (!version || *version != kProtocolVersion) {
    error = "protocol version " + (version ? std::to_string(*version) : std::string("(none)")) +
            ", and this tally reads version " + std::to_string(kProtocolVersion) +
            " (tally and tally-measure are built together: rebuild both)";
    return false;
  }
  Result out;
  llvm::json::Path::Root root("tally-measure");
  llvm::json::ObjectMapper o(*parsed, root);
  bool ok = o.map("quick", out.quick) && o.map("cpu_model", out.cpuModel) && o.map("blas_core", out.blasCore) &&
            o.map("blas_core_env", out.blasCoreEnv) && o.map("avx512", out.avx512) && o.map("cores", out.cores) &&
            o.map("threads", out.threads) && o.map("memory_bytes", out.memoryBytes) &&
            o.map("load_average", out.loadAverage) && o.map("seconds", out.seconds) &&
            o.map("triad_bandwidth", out.triadBandwidth) && o.map("cache_bytes", out.cacheBytes) &&
            o.map("cache_bandwidth", out.cacheBandwidth) &&
            o.map("elementwise_bandwidth", out.elementwiseBandwidth) &&
            o.map("optimizer_bandwidth", out.optimizerBandwidth) &&
            o.map("kernel_overhead", out.kernelOverhead) && o.map("fork_overhead", out.forkOverhead) &&
            o.map("transcendental_time", out.transcendentalTime) && o.map("unary", out.unary) &&
            o.map("matmuls", out.matmuls) &&
            o.map("attention", out.attention) && o.map("attention_shapes", out.attentionShapes) &&
            o.map("slice_seconds", out.sliceSeconds) && o.map("slice_source", out.sliceSource) &&
            o.map("timings", out.timings);
  if (!ok) {
    error = llvm::toString(root.getError());
    return false;
  }
  if (std::string why = impossible(out); !why.empty()) {
    error = "impossible values: " + why;
    return false;
  }
  r = std::move(out);
  return true;
}

} // namespace calibrate
} // namespace tally
