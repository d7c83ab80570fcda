// Unit tests for the calibrated host target: the matmul efficiency curve (ir/Target.h: log-space
// interpolation, per-dtype lookup, kernelTime's use of it), the parsing of a calibration file as
// `tally calibrate` writes it (frontend/Sema.cpp: matmul_curve), and `target = host` without the
// tally binary's loader. Also the host terms of kernelTime (a fixed cost per kernel call, a time
// per transcendental evaluation) and the transcendental counts of the op rules.
#include "Support.h"
#include "driver/Compiler.h"
#include "ir/Target.h"
#include "passes/Passes.h"

#include <catch.hpp>

using namespace tally;
using tally::test::Compiled;
using Catch::Matchers::Contains;

namespace {

/// Points at 1e6, 1e8 and 1e10 FLOPs: half-way in log space between two of them is 1e7 and 1e9.
std::vector<CurvePoint> threePoints() { return {{1e6, 0.2}, {1e8, 0.6}, {1e10, 0.8}}; }

/// A calibration file in the form `tally calibrate` writes (numbers chosen by hand).
constexpr const char *kCalibration = R"(
// The host target: a hand-written calibration.
target host {
  memory = 16 GiB
  bandwidth = 10 GB/s
  host_link = 10 GB/s
  peak { fp32 = 100 GFLOP/s, bf16 = 50 GFLOP/s }
  efficiency { matmul = 0.75, elementwise = 0.4 }
  matmul_curve {
    fp32 = [(524288, 0.05), (4.1943e+06, 0.5), (1.71799e+10, 0.75)]
    bf16 = [(1e6, 0.3), (1e9, 0.9)]
  }
}
)";

/// A declared CPU target's settings, its closing brace left to the test that adds its own.
constexpr const char *kCpuTarget = R"(
target Cpu {
  memory = 16 GiB
  bandwidth = 10 GB/s
  peak { fp32 = 100 GFLOP/s }
  efficiency { elementwise = 0.5 }
  kernel_overhead = 2 us
)";

/// Parses `text` and resolves its target `host`; diagnostics are collected, not printed.
std::optional<Target> parseHost(Compilation &c, const std::string &text) {
  c.diags.setOutput(nullptr);
  REQUIRE(c.addSource("host.tally", text));
  return c.sema.resolveTarget(c.program, "host", llvm::SMRange());
}

} // namespace

TEST_CASE("host: the curve interpolates linearly in log(FLOPs)", "[host]") {
  std::vector<CurvePoint> p = threePoints();
  CHECK(interpolateCurve(p, 1e7) == Approx(0.4));  // log-midpoint of 0.2 and 0.6
  CHECK(interpolateCurve(p, 1e9) == Approx(0.7));  // log-midpoint of 0.6 and 0.8
  // A quarter of the way from 1e6 to 1e8 in log space is 10^6.5: 0.2 + 0.25·0.4.
  CHECK(interpolateCurve(p, std::pow(10.0, 6.5)) == Approx(0.3));
  CHECK(interpolateCurve(p, 1e8) == Approx(0.6));  // a measured point
  CHECK(interpolateCurve(p, 10) == 0.2);           // below the range: the first point
  CHECK(interpolateCurve(p, 1e15) == 0.8);         // above: the last
  CHECK(interpolateCurve({}, 1e9) == 0);
  CHECK(interpolateCurve({{5e6, 0.9}}, 1e3) == 0.9);
}

TEST_CASE("host: a dtype without a curve keeps efficiency.matmul", "[host]") {
  Target t;
  t.efficiency.matmul = 0.7;
  CHECK(t.matmulEfficiency(Dtype::F32, 1e7) == 0.7);
  t.matmulCurves.push_back({Dtype::F32, threePoints()});
  CHECK(t.matmulEfficiency(Dtype::F32, 1e7) == Approx(0.4));
  CHECK(t.matmulEfficiency(Dtype::BF16, 1e7) == 0.7);
}

TEST_CASE("host: kernelTime divides matmuls by the curve's efficiency", "[host]") {
  Target t;
  t.peakF32 = 100e9;
  t.bandwidth = 10e9;
  t.efficiency.matmul = 0.7;
  t.efficiency.elementwise = 0.5;
  t.matmulCurves.push_back({Dtype::F32, threePoints()});
  // 1e7 FLOPs at 100 GFLOP/s = 1e-4 s compute (bytes 1e4 / 10 GB/s = 1e-6 s), / 0.4.
  CHECK(kernelTime(t, OpClass::Matmul, Dtype::F32, KernelWork{1e7, 1e4}) == Approx(2.5e-4));
  // 1e10 FLOPs = 0.1 s, / 0.8 (the last point).
  CHECK(kernelTime(t, OpClass::Matmul, Dtype::F32, KernelWork{1e10, 0}) == Approx(0.125));
  // Elementwise ops keep their constant: 1e6 bytes / 10 GB/s = 1e-4 s, / 0.5.
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, KernelWork{0, 1e6}) == Approx(2e-4));
}

TEST_CASE("host: a calibration file parses into the target", "[host]") {
  Compilation c;
  std::optional<Target> t = parseHost(c, kCalibration);
  REQUIRE(t);
  CHECK(t->name == "host");
  CHECK(t->memoryBytes == 16.0 * 1024 * 1024 * 1024);
  CHECK(t->bandwidth == Approx(10e9));
  CHECK(t->hostLink == Approx(10e9));
  CHECK(t->peakF32 == Approx(100e9));
  CHECK(t->peakBF16 == Approx(50e9));
  CHECK(t->efficiency.matmul == Approx(0.75));
  CHECK(t->efficiency.elementwise == Approx(0.4));
  REQUIRE(t->matmulCurves.size() == 2);
  const MatmulCurve &f32 = t->matmulCurves[0];
  CHECK(f32.dtype == Dtype::F32);
  REQUIRE(f32.points.size() == 3);
  CHECK(f32.points[0].flops == 524288);
  CHECK(f32.points[1].flops == Approx(4.1943e6));
  CHECK(f32.points[2].efficiency == Approx(0.75));
  CHECK(t->matmulCurves[1].dtype == Dtype::BF16);
  // 10^7.5 is half-way from 1e6 to 1e9 in log space: (0.3 + 0.9) / 2.
  CHECK(t->matmulEfficiency(Dtype::BF16, std::pow(10.0, 7.5)) == Approx(0.6));
}

TEST_CASE("host: a bad matmul_curve is a diagnostic", "[host]") {
  const char *bad[] = {
      "fp32 = [(1e6, 0.5), (1e5, 0.6)]", // FLOPs not increasing
      "fp32 = [(1e6, 1.5)]",             // efficiency above 1
      "fp32 = [(1e6, 0)]",               // efficiency 0
      "fp32 = [(1e6, 0.5, 3)]",          // not a pair
      "fp32 = []",                       // no points
      "fp32 = [(-1e6, 0.5)]",            // negative FLOPs
  };
  for (const char *curve : bad) {
    INFO(curve);
    Compilation c;
    std::string text = "target host {\n memory = 1 GiB\n bandwidth = 1 GB/s\n"
                       " peak { fp32 = 1 GFLOP/s }\n matmul_curve { " +
                       std::string(curve) + " }\n}\n";
    CHECK_FALSE(parseHost(c, text));
    REQUIRE(c.diags.diagnostics().size() == 1);
    CHECK(c.diags.diagnostics()[0].kind == DiagKind::InvalidValue);
    CHECK_THAT(c.diags.diagnostics()[0].message, Contains("(FLOPs per call, efficiency)"));
  }
  Compilation c;
  CHECK_FALSE(parseHost(c, "target host {\n memory = 1 GiB\n bandwidth = 1 GB/s\n peak { fp32 = "
                           "1 GFLOP/s }\n matmul_curve { fp99 = [(1e6, 0.5)] }\n}\n"));
  REQUIRE(c.diags.diagnostics().size() == 1);
  CHECK(c.diags.diagnostics()[0].kind == DiagKind::UnknownDtype);
}

TEST_CASE("host: without the tally binary's loader, `host` is a diagnostic", "[host]") {
  setExternalTargetLoader(nullptr);
  Compilation c;
  c.diags.setOutput(nullptr);
  REQUIRE(c.addSource("t.tally", "model M(d = 4) {\n param w: [d, d]\n"
                                 " forward(x: f32[batch, d]) { return mean(x @ w) }\n}\n"
                                 "train p {\n model = M()\n batch = 2\n optimizer = SGD(lr = 0.1)\n"
                                 " precision = fp32\n target = host\n}\n"));
  const PlanDecl *p = c.pickPlan("");
  REQUIRE(p);
  CHECK_FALSE(c.lower(*p));
  REQUIRE(c.diags.diagnostics().size() == 1);
  CHECK(c.diags.diagnostics()[0].kind == DiagKind::UnknownTarget);
  CHECK_THAT(c.diags.diagnostics()[0].message, Contains("tally calibrate"));
  CHECK(isExternalTargetName("host"));
  CHECK(isExternalTargetName("calib/host.tally"));
  CHECK_FALSE(isExternalTargetName("H100_SXM"));
}

TEST_CASE("host: the installed loader answers `host`", "[host]") {
  int calls = 0;
  setExternalTargetLoader([&](llvm::StringRef name, std::string &) -> std::optional<Target> {
    ++calls;
    Target t;
    t.name = name.str();
    return t;
  });
  std::string err;
  std::optional<Target> t = loadExternalTarget("host", err);
  setExternalTargetLoader(nullptr);
  REQUIRE(t);
  CHECK(t->name == "host");
  CHECK(calls == 1);
}

TEST_CASE("host: kernelTime adds the call overhead and the transcendentals", "[host]") {
  Target t;
  t.peakF32 = 100e9;
  t.bandwidth = 10e9;
  t.efficiency.elementwise = 0.5;
  KernelWork w;
  w.flops = 8e6;
  w.bytes = 8e6;
  w.transcendentals = 1e6;
  // Without the host terms (a GPU): max(8e6/100e9, 8e6/10e9) / 0.5 = 8e-4 / 0.5 = 1.6e-3 s.
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, w) == Approx(1.6e-3));
  t.kernelOverhead = 2e-6;
  t.transcendentalTime = 1e-9;
  // Compute side 8e-5/0.5 + 1e6 × 1e-9 = 1.16e-3 < memory 1.6e-3; + one call's 2e-6.
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, w) == Approx(1.602e-3));
  // 4e6 evaluations: 1.6e-4 + 4e-3 = 4.16e-3 > 1.6e-3: the transcendentals bound it.
  w.transcendentals = 4e6;
  w.calls = 3;
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, w) == Approx(4.16e-3 + 6e-6));
  // A view (no work) launches nothing: 0 whatever `calls` says.
  CHECK(kernelTime(t, OpClass::View, Dtype::F32, KernelWork()) == 0);
  // FLOPs and bytes alone are one call without transcendentals: 1e6 B / 10 GB/s / 0.5 + 2e-6.
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, KernelWork{0, 1e6}) == Approx(2.02e-4));
}

TEST_CASE("host: a call above kForkElements pays fork_overhead in place of kernel_overhead",
          "[host]") {
  Target t;
  t.peakF32 = 100e9;
  t.bandwidth = 10e9;
  t.efficiency.elementwise = 0.5;
  t.kernelOverhead = 2e-6;
  KernelWork w;
  w.bytes = 1e3; // 1e3 / 10e9 / 0.5 = 2e-7 s
  w.calls = 3;
  w.forks = 2;
  // Without fork_overhead (a calibration of protocol 5) every call pays kernel_overhead.
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, w) == Approx(2e-7 + 6e-6));
  t.forkOverhead = 5e-6;
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, w) == Approx(2e-7 + 2e-6 + 10e-6));
  CHECK(kernelTimeTerms(t, OpClass::Elementwise, Dtype::F32, w).calls == Approx(12e-6));

  // On a plan: fc at micro-batch 2 is 2·128·128 = 32768 multiply-adds, not above
  // kForkMatmulWork: no call starts a team; at micro-batch 1024 it is 16777216 and every call of
  // fc (its forward, its backward's one matmul: x takes no gradient) does, and mean's over
  // 131072 elements.
  auto plan = [](int batch, bool forks) {
    return std::string(kCpuTarget) + (forks ? "  fork_overhead = 5 us\n" : "") + "}\n" + R"(
model M(d = 128) {
  fc = Linear(d, d)
  forward(x: f32[batch, d]) { return mean(fc(x)) }
}
train t { model = M() batch = )" + std::to_string(batch) + R"( optimizer = AdamW(lr = 1e-3)
          precision = fp32 target = Cpu }
)";
  };
  auto matmul = [](const Compiled &c) {
    for (OpId i = 0; i < c.g().ops.size(); ++i)
      if (c.g().ops[i].kind == OpKind::Matmul)
        return i;
    FAIL("no matmul");
    return OpId(0);
  };
  Compiled small(plan(2, true)), smallPlain(plan(2, false));
  const OpId mm = matmul(small);
  const Target &smallT = small.a->plan->target;
  CHECK(forkingCalls(smallT, small.g(), small.g().ops[mm], 1, 1) == 0);
  CHECK(small.a->ops[mm].forwardTime == Approx(smallPlain.a->ops[mm].forwardTime));
  CHECK(small.a->ops[mm].backwardTime == Approx(smallPlain.a->ops[mm].backwardTime));
  Compiled large(plan(1024, true)), largePlain(plan(1024, false));
  const Target &largeT = large.a->plan->target;
  CHECK(forkingCalls(largeT, large.g(), large.g().ops[mm], 1, 3) == 3);
  CHECK(forkingCalls(largeT, large.g(), large.g().ops[mm], 128, 3) == 0); // split 128 ways: 131072 each
  // A target that does not price them apart counts none.
  CHECK(forkingCalls(largePlain.a->plan->target, large.g(), large.g().ops[mm], 1, 3) == 0);
  CHECK(large.a->ops[mm].forwardTime - largePlain.a->ops[mm].forwardTime == Approx(3e-6));
  REQUIRE(large.a->ops[mm].backwardCalls == 1);
  CHECK(large.a->ops[mm].backwardTime - largePlain.a->ops[mm].backwardTime == Approx(3e-6));
  // The optimizer: W's update (16384 elements) starts a team, b's (128) does not, nor zero_grad's
  // fill over all 16512 gradients (rt::fill: a team above 65536).
  CHECK(large.a->time.optimizer - largePlain.a->time.optimizer == Approx(3e-6));
}

TEST_CASE("host: a call that fits in the cache reads at the cache's bandwidth", "[host]") {
  Target t;
  t.peakF32 = 100e9;
  t.bandwidth = 10e9;
  t.efficiency.elementwise = 0.5;
  t.cacheBytes = 2e6;
  t.cacheBandwidth = 40e9;
  KernelWork w;
  w.bytes = 1e6; // fits: 1e6 / 40e9 / 0.5 = 5e-5 s
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, w) == Approx(5e-5));
  w.bytes = 4e6; // does not: 4e6 / 10e9 / 0.5 = 8e-4 s
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, w) == Approx(8e-4));
  w.calls = 2;   // two calls of 2e6 bytes each fit: 4e6 / 40e9 / 0.5 = 2e-4 s
  CHECK(kernelTime(t, OpClass::Elementwise, Dtype::F32, w) == Approx(2e-4));
}

TEST_CASE("host: kernel_overhead and transcendental parse as durations", "[host]") {
  Compilation c;
  std::optional<Target> t = parseHost(c, R"(target host {
  memory = 1 GiB
  bandwidth = 1 GB/s
  peak { fp32 = 1 GFLOP/s }
  kernel_overhead = 2.5 us
  transcendental = 1.25 ns
  cache = 2 MiB
  cache_bandwidth = 40 GB/s
})");
  REQUIRE(t);
  CHECK(t->cacheBytes == 2097152);
  CHECK(t->cacheBandwidth == Approx(40e9));
  CHECK(t->kernelOverhead == Approx(2.5e-6));
  CHECK(t->transcendentalTime == Approx(1.25e-9));
  Compilation bad;
  CHECK_FALSE(parseHost(bad, "target host {\n memory = 1 GiB\n bandwidth = 1 GB/s\n peak { fp32 = 1 "
                             "GFLOP/s }\n transcendental = 3 GB/s\n}\n"));
  CHECK_THAT(bad.diags.diagnostics()[0].message, Contains("'transcendental' must be a duration"));
  // Catalogue GPUs have no host terms; their transcendental rate is their special-function
  // units' (tests/unit/test_target.cpp).
  CHECK(findTarget("H100_SXM")->kernelOverhead == 0);
  CHECK(findTarget("H100_SXM")->cacheBandwidth == 0);
}

TEST_CASE("host: op rules count the runtime's transcendentals; the step times price them",
          "[host]") {
  // micro-batch 2, seq 16, d 32, 2 heads, vocabulary 64.
  Compiled t(std::string(kCpuTarget) + "  transcendental = 4 ns\n}\n" + R"(
model M(vocab = 64, d = 32) {
  wte = Embedding(vocab, d)
  qkv = Linear(d, 3 * d)
  fc  = Linear(d, d)
  forward(tokens: i32[batch, seq]) {
    q, k, v = split(qkv(wte(tokens)), 3, dim = -1)
    a = attention(q, k, v, heads = 2, causal = true)
    x = gelu(fc(a))
    return cross_entropy(x @ transpose(wte.weight), next_tokens(tokens))
  }
}
train t { model = M() batch = 4 seq = 16 micro_batch = 2 optimizer = SGD(lr = 0.1)
          precision = fp32 target = Cpu }
)");
  const Graph &g = t.g();
  auto first = [&](OpKind k) {
    for (OpId i = 0; i < g.ops.size(); ++i)
      if (g.ops[i].kind == k)
        return i;
    FAIL("no op of that kind");
    return OpId(0);
  };
  const OpAnalysis &gelu = t.a->ops[first(OpKind::Gelu)];
  // gelu over [2, 16, 32] = 1024 elements: one erf each forward; erf + exp in the gradient,
  // one backward kernel (unary_backward).
  CHECK(gelu.forward.transcendentals == 1024);
  CHECK(gelu.backwardTranscendentals == 2048);
  CHECK(gelu.backwardCalls == 1);
  // Forward: 8 FLOPs and 8 bytes per element: compute 8192 / 100e9 / 0.5 = 1.6384e-7 s plus
  // 1024 × 4 ns = 4.096e-6 s, above memory 8192 / 10e9 / 0.5 = 1.6384e-6 s; + 2 us.
  CHECK(gelu.forwardTime == Approx(1.6384e-7 + 4.096e-6 + 2e-6));
  // Backward: 12 FLOPs per element (12288 / 100e9 / 0.5 = 2.4576e-7 s) + 2048 × 4 ns =
  // 8.192e-6 s, above its bytes (x, dy read, dx written: 12288 B: 2.4576e-6 s); + 2 us.
  CHECK(gelu.backwardTime == Approx(2.4576e-7 + 8.192e-6 + 2e-6));
  // Causal fused attention, b·h·s·s = 2·2·16·16 = 1024 scores of which (16 + 1)/32 are
  // computed: 544 exps forward, and the backward recomputes P: 544 again.
  const OpAnalysis &attn = t.a->ops[first(OpKind::Attention)];
  CHECK(attn.forward.transcendentals == 544);
  CHECK(attn.backwardTranscendentals == 544);
  // Cross entropy over [2, 16, 64] logits: an exp per logit and a log per row forward (2048 +
  // 32), p = exp(x − lse) per logit backward (2048).
  const OpAnalysis &ce = t.a->ops[first(OpKind::CrossEntropy)];
  CHECK(ce.forward.transcendentals == 2080);
  CHECK(ce.backwardTranscendentals == 2048);
  // A matmul evaluates none.
  CHECK(t.a->ops[first(OpKind::Matmul)].forward.transcendentals == 0);
}

TEST_CASE("host: elementwise_time prices a measured unary kind by its own rate", "[host]") {
  // The same model as above; gelu measured at 3 ns an element forward, 5 ns its gradient;
  // silu's forward measured (not used here), and no other kind.
  const std::string model = R"(
model M(vocab = 64, d = 32) {
  wte = Embedding(vocab, d)
  fc  = Linear(d, d)
  forward(tokens: i32[batch, seq]) {
    x = gelu(fc(wte(tokens)))
    return cross_entropy(x @ transpose(wte.weight), next_tokens(tokens))
  }
}
train t { model = M() batch = 4 seq = 16 micro_batch = 2 optimizer = SGD(lr = 0.1)
          precision = fp32 target = Cpu }
)";
  const std::string target = std::string(kCpuTarget) + "  transcendental = 4 ns\n";
  Compiled t(target + "  elementwise_time { gelu = 3 ns, gelu_grad = 5 ns, silu = 1 ns }\n}\n" + model);
  REQUIRE(t.a->plan->target.unaryTimes.size() == 2);
  CHECK(t.a->plan->target.unaryTime("gelu", false) == Approx(3e-9));
  CHECK(t.a->plan->target.unaryTime("gelu", true) == Approx(5e-9));
  CHECK(t.a->plan->target.unaryTime("silu", true) == 0); // measured forward only
  CHECK(t.a->plan->target.unaryTime("tanh", false) == 0);
  const OpId gelu = t.op("gelu");
  // 1024 elements: the forward's arithmetic is 1024 × 3 ns = 3.072e-6 s, in place of its 8192
  // FLOPs at the peak and its 1024 erfs at 4 ns; above its bytes (1.6384e-6 s); + 2 us.
  CHECK(t.a->ops[gelu].forwardTime == Approx(3.072e-6 + 2e-6));
  // The gradient: 1024 × 5 ns = 5.12e-6 s, above its 12288 bytes (2.4576e-6 s); + 2 us.
  CHECK(t.a->ops[gelu].backwardTime == Approx(5.12e-6 + 2e-6));
  // Without the table the FLOPs and transcendentals price it (the test above).
  Compiled plain(target + "}\n" + model);
  CHECK(plain.a->ops[gelu].forwardTime == Approx(1.6384e-7 + 4.096e-6 + 2e-6));
  // Tally explain shows the measured arithmetic in the kernel's formula.
  KernelTimeTerms k = kernelTimeTerms(t.a->plan->target, OpClass::Elementwise, Dtype::F32,
                                      forwardWork(*t.a, gelu, t.a->ops[gelu]));
  CHECK(k.measuredArithmetic);
  CHECK(k.compute == Approx(3.072e-6));
  CHECK(k.transcendental == 0);
  // A name that is no unary kind, and a value that is no duration, are diagnostics.
  Compilation bad;
  CHECK_FALSE(parseHost(bad, "target host {\n memory = 1 GiB\n bandwidth = 1 GB/s\n peak { fp32 = 1 "
                             "GFLOP/s }\n elementwise_time { gelu_bwd = 1 ns }\n}\n"));
  CHECK_THAT(bad.diags.diagnostics()[0].message, Contains("unary op"));
  CHECK_THAT(bad.diags.diagnostics()[0].message, Contains("gelu_bwd"));
  Compilation unit;
  CHECK_FALSE(parseHost(unit, "target host {\n memory = 1 GiB\n bandwidth = 1 GB/s\n peak { fp32 = 1 "
                              "GFLOP/s }\n elementwise_time { gelu = 2 GB/s }\n}\n"));
  CHECK_THAT(unit.diags.diagnostics()[0].message, Contains("'elementwise_time.gelu' must be a duration"));
}

TEST_CASE("host: the generated CPU step's kernels around its data-parallel collectives are priced",
          "[host]") {
  // fc: 64·64 + 64 = 4160 fp32 parameters in 2 tensors: G = 16640 bytes; 2 ranks under ZeRO-1.
  const std::string plan = std::string(kCpuTarget) + "}\n" + R"(
model M(d = 64) {
  fc = Linear(d, d)
  forward(x: f32[batch, d]) { return mean(fc(x)) }
}
train t { model = M() batch = 8 optimizer = AdamW(lr = 1e-3) precision = fp32
          target = 2 x Cpu { data = 2, zero = 1 } }
)";
  PlanOverrides built;
  built.generatedStep = true;
  Compiled step(plan, "", built), framework(plan);
  // At 10 GB/s × 0.5, + 2 us a call: the 1/2 scale of G (2G = 33280 bytes, one bucket):
  // 6.656 + 2 us; the ring's sums (3G · (2 - 1)/2 = 24960 bytes, inside the collective's
  // call): 4.992 us; the update's copies (the shard into G and every parameter out of it:
  // 2G/2 + 2G = 49920 bytes; 1 + 2 calls): 9.984 + 6 us. 29.632 us in all.
  CHECK(step.a->time.dataParallelComm - framework.a->time.dataParallelComm == Approx(29.632e-6));
  // Without ZeRO only the scale: its collective is MPI's all-reduce, whose sums are in the link's rate.
  std::string plain = plan;
  plain.replace(plain.find(", zero = 1"), 10, "");
  Compiled plainStep(plain, "", built), plainFramework(plain);
  CHECK(plainStep.a->time.dataParallelComm - plainFramework.a->time.dataParallelComm == Approx(8.656e-6));
}

TEST_CASE("host: optimizer_bandwidth prices the update at the step's measured loop", "[host]") {
  // 64·64 + 64 = 4160 fp32 parameters, AdamW: 2 × (4 + 4 + 2 × 4) = 32 bytes each.
  const std::string plan = R"(
model M(d = 64) {
  fc = Linear(d, d)
  forward(x: f32[batch, d]) { return mean(fc(x)) }
}
train t { model = M() batch = 8 optimizer = AdamW(lr = 1e-3) precision = fp32 target = Cpu }
)";
  const std::string base = kCpuTarget;
  Compiled measured(base + "  optimizer_bandwidth = 40 GB/s\n}\n" + plan), derived(base + "}\n" + plan);
  CHECK(measured.a->plan->target.optimizerBandwidth == Approx(40e9));
  // Two parameter tensors + zero_grad: 3 calls of 2 us; the bytes at 40 GB/s (its FLOPs,
  // 4160 × AdamW's per element at 100 GFLOP/s × 0.5, are below them).
  const double bytes = 4160.0 * 32;
  CHECK(measured.a->time.optimizer == Approx(bytes / 40e9 + 3 * 2e-6));
  // Without it: the bandwidth at the elementwise efficiency.
  CHECK(derived.a->time.optimizer == Approx(bytes / 10e9 / 0.5 + 3 * 2e-6));
  // A rank's share of the machine shares the loop's rate too.
  Target half = measured.a->plan->target;
  half.name = "host"; // shareHost applies to the calibrated host only
  half.shareHost(2);
  CHECK(half.optimizerBandwidth == Approx(20e9));
}

TEST_CASE("host: a rank of a shared machine runs its unthreaded curve-priced calls at the curve's rate",
          "[host]") {
  // The curve was measured as the runtime runs each call on the whole machine: a call below
  // the threading bound ran on one thread there and runs so on a rank; one that starts the
  // team runs at the rank's share (Target::shareHost).
  Compilation c;
  std::optional<Target> host = parseHost(c, kCalibration);
  REQUIRE(host);
  Target whole = *host;
  whole.forkOverhead = 1e-6;
  Target half = whole;
  half.shareHost(2);
  KernelWork w;
  w.flops = 4.1943e+06; // 0.5 on the fp32 curve
  w.calls = 2;
  auto compute = [&](const Target &t, double forks) {
    KernelWork x = w;
    x.forks = forks;
    return kernelTimeTerms(t, OpClass::Matmul, Dtype::F32, x).compute;
  };
  CHECK(compute(whole, 0) == Approx(4.1943e+06 / 100e9 / 0.5));
  CHECK(compute(half, 0) == Approx(compute(whole, 0)));     // both calls on one thread
  CHECK(compute(half, 2) == Approx(2 * compute(whole, 2))); // both on the team
  CHECK(compute(half, 1) == Approx(1.5 * compute(whole, 1)));
  // tally explain prints the factor (KernelTimeTerms::shareFactor): 1 - 1/2 + 1/2 × 1/2.
  KernelWork one = w;
  one.forks = 1;
  CHECK(kernelTimeTerms(half, OpClass::Matmul, Dtype::F32, one).shareFactor == Approx(0.75));
  CHECK(kernelTimeTerms(whole, OpClass::Matmul, Dtype::F32, one).shareFactor == 1);
  // A target that measured no threading prices every call at the share, as before.
  Target unthreaded = *host;
  unthreaded.shareHost(2);
  CHECK(compute(unthreaded, 0) == Approx(2 * compute(whole, 0)));
}

TEST_CASE("host: row_time and elementwise_time price a row kernel by its rows and elements", "[host]") {
  // A layer norm over [2, 16, 32] (32 rows of 32): the runtime's kernel costs per row (its
  // reductions' setup and tails) and per element (tools/calibrate/Measure.cpp, 5d).
  const std::string model = R"(
model M(d = 32) {
  ln = LayerNorm(d)
  fc = Linear(d, d)
  forward(x: f32[batch, seq, d]) { return mean(fc(ln(x))) }
}
train t { model = M() batch = 2 seq = 16 optimizer = SGD(lr = 0.1) precision = fp32 target = Cpu }
)";
  Compiled t(std::string(kCpuTarget) + "  elementwise_time { layer_norm = 0.5 ns, layer_norm_grad = 1 ns }\n" +
             "  row_time { layer_norm = 20 ns, layer_norm_grad = 40 ns }\n}\n" + model);
  const Target &target = t.a->plan->target;
  CHECK(target.rowTime("layer_norm", false) == Approx(20e-9));
  CHECK(target.rowTime("layer_norm", true) == Approx(40e-9));
  CHECK(target.unaryTime("layer_norm", true) == Approx(1e-9));
  const OpId ln = t.op("ln.layer_norm");
  // Forward: 32 rows × 20 ns + 1024 elements × 0.5 ns = 1.152e-6 s of arithmetic, the compute
  // side of its roofline in place of its FLOPs at the peak (its bytes are the memory side).
  KernelTimeTerms f = kernelTimeTerms(target, OpClass::Elementwise, Dtype::F32, forwardWork(*t.a, ln, t.a->ops[ln]));
  CHECK(f.measuredArithmetic);
  CHECK(f.compute == Approx(32 * 20e-9 + 1024 * 0.5e-9));
  CHECK(f.transcendental == 0);
  // Backward: 32 × 40 ns + 1024 × 1 ns = 2.304e-6 s.
  KernelTimeTerms b = kernelTimeTerms(target, OpClass::Elementwise, Dtype::F32, backwardWork(*t.a, ln, t.a->ops[ln]));
  CHECK(b.measuredArithmetic);
  CHECK(b.compute == Approx(32 * 40e-9 + 1024 * 1e-9));
  // Without row_time the per-element rate alone; without either the FLOPs at the peak.
  Compiled elements(std::string(kCpuTarget) + "  elementwise_time { layer_norm = 0.5 ns }\n}\n" + model);
  CHECK(kernelTimeTerms(elements.a->plan->target, OpClass::Elementwise, Dtype::F32,
                        forwardWork(*elements.a, ln, elements.a->ops[ln]))
            .compute == Approx(1024 * 0.5e-9));
  Compiled plain(std::string(kCpuTarget) + "}\n" + model);
  CHECK_FALSE(kernelTimeTerms(plain.a->plan->target, OpClass::Elementwise, Dtype::F32,
                              forwardWork(*plain.a, ln, plain.a->ops[ln]))
                  .measuredArithmetic);
  // A name that is no row kernel is a diagnostic naming the ones there are.
  Compilation bad;
  CHECK_FALSE(parseHost(bad, "target host {\n memory = 1 GiB\n bandwidth = 1 GB/s\n peak { fp32 = 1 "
                             "GFLOP/s }\n row_time { gelu = 1 ns }\n}\n"));
  CHECK_THAT(bad.diags.diagnostics()[0].message, Contains("row kernel"));
  CHECK_THAT(bad.diags.diagnostics()[0].message, Contains("gelu"));
}

TEST_CASE("host: a measured dropout rate prices the forward's random numbers", "[host]") {
  const std::string model = R"(
model M(vocab = 64, d = 32) {
  wte = Embedding(vocab, d)
  fc  = Linear(d, d)
  forward(tokens: i32[batch, seq]) {
    x = dropout(fc(wte(tokens)), 0.1)
    return cross_entropy(x @ transpose(wte.weight), next_tokens(tokens))
  }
}
train t { model = M() batch = 4 seq = 16 micro_batch = 2 optimizer = SGD(lr = 0.1)
          precision = fp32 target = Cpu }
)";
  Compiled t(std::string(kCpuTarget) + "  elementwise_time { dropout = 6 ns }\n}\n" + model);
  CHECK(t.a->plan->target.unaryTime("dropout", false) == Approx(6e-9));
  Compiled plain(std::string(kCpuTarget) + "}\n" + model);
  const OpId drop = t.op("dropout");
  // 1024 elements × 6 ns = 6.144e-6 s, above its bytes; + 2 us for the call.
  CHECK(t.a->ops[drop].forwardTime == Approx(6.144e-6 + 2e-6));
  CHECK(plain.a->ops[drop].forwardTime < 4e-6);
  // The backward reads the mask: its bytes alone, as without the rate.
  CHECK(t.a->ops[drop].backwardTime == Approx(plain.a->ops[drop].backwardTime));
  // No gradient rate is accepted for it.
  Compilation bad;
  CHECK_FALSE(parseHost(bad, "target host {\n memory = 1 GiB\n bandwidth = 1 GB/s\n peak { fp32 = 1 "
                             "GFLOP/s }\n elementwise_time { dropout_grad = 1 ns }\n}\n"));
}

TEST_CASE("host: the ranks of a plan share the one machine", "[host]") {
  Compilation c;
  std::optional<Target> host = parseHost(c, kCalibration);
  REQUIRE(host);
  // Two ranks: each half the FLOP/s, bandwidth and memory of the machine.
  Target t = *host;
  t.shareHost(2);
  CHECK(t.share == 0.5);
  CHECK(t.peakF32 == Approx(50e9));
  CHECK(t.peakBF16 == Approx(25e9));
  CHECK(t.bandwidth == Approx(5e9));
  CHECK(t.hostLink == Approx(5e9));
  CHECK(t.memoryBytes == Approx(8.0 * 1024 * 1024 * 1024));
  // Efficiencies are ratios: unchanged.
  CHECK(t.matmulEfficiency(Dtype::BF16, std::pow(10.0, 7.5)) == Approx(0.6));
  // Another count rescales from the share the target has, not from the halved numbers.
  t.shareHost(4);
  CHECK(t.peakF32 == Approx(25e9));
  t.shareHost(1);
  CHECK(t.peakF32 == Approx(100e9));
  CHECK(t.memoryBytes == Approx(16.0 * 1024 * 1024 * 1024));
  // A GPU is a device of its own.
  const Target *gpu = findTarget("H100_SXM");
  REQUIRE(gpu);
  Target g = *gpu;
  g.shareHost(8, 1);
  CHECK(g.peakBF16 == gpu->peakBF16);
  CHECK(g.share == 1);

  // Threads: a calibration made with 4 threads, run with 1 thread per rank: a quarter of the
  // machine per rank, however few the ranks; more threads than the machine's share per rank
  // do not give a rank more than 1/ranks.
  Target h = *host;
  h.threads = 4;
  h.transcendentalTime = 1e-9;
  h.shareHost(1, 1);
  CHECK(h.peakF32 == Approx(25e9));
  CHECK(h.transcendentalTime == Approx(4e-9));
  h.shareHost(2); // the run's 1 thread per rank is kept
  CHECK(h.peakF32 == Approx(25e9));
  h.shareHost(2, 4);
  CHECK(h.peakF32 == Approx(50e9));
  h.shareHost(1, 4);
  CHECK(h.peakF32 == Approx(100e9));

  // A plan of 2 ranks on the host prices each rank at half the machine; its MFU is over
  // both ranks' share, so one plan and the other agree on the machine's utilisation when
  // the step time doubles with half the FLOP/s.
  std::string model = std::string(kCalibration) + R"(
model M(d = 256) {
  fc = Linear(d, d)
  forward(x: f32[batch, d]) { return sum(fc(x)) }
}
train one { model = M() batch = 1024 micro_batch = 1024 optimizer = SGD(lr = 0.1) precision = fp32
            target = host }
train two { model = M() batch = 1024 micro_batch = 512 optimizer = SGD(lr = 0.1) precision = fp32
            target = 2 x host { data = 2, overlap = false } }
)";
  Compiled one(model, "one"), two(model, "two");
  CHECK(one.a->plan->target.peakF32 == Approx(100e9));
  CHECK(two.a->plan->target.peakF32 == Approx(50e9));
  CHECK(two.a->plan->target.memoryBytes == Approx(8.0 * 1024 * 1024 * 1024));
  // Each rank's matmul is priced at its share: 2·512·256·256 FLOPs at 50 GFLOP/s × the curve's
  // efficiency for that size (compute-bound: 1.3 MB at 5 GB/s is a tenth of it).
  auto matmulTime = [](const Compiled &t, double tokens, double peak) {
    double flops = 2 * tokens * 256 * 256;
    CHECK(t.a->ops[t.op("fc.matmul")].forwardTime ==
          Approx(flops / (peak * t.a->plan->target.matmulEfficiency(Dtype::F32, flops))));
  };
  matmulTime(one, 1024, 100e9);
  matmulTime(two, 512, 50e9);

  // `threads = 2` in the file (as tally calibrate writes it) and `tally run --threads 1`
  // (PlanOverrides::hostThreads): the one process has half the machine.
  std::string threaded = model;
  threaded.replace(threaded.find("host_link = 10 GB/s"), 19, "host_link = 10 GB/s\n  threads = 2");
  PlanOverrides oneThread;
  oneThread.hostThreads = 1;
  Compiled half(threaded, "one", oneThread), whole(threaded, "one");
  CHECK(whole.a->plan->target.threads == 2);
  CHECK(whole.a->plan->target.peakF32 == Approx(100e9));
  CHECK(half.a->plan->target.peakF32 == Approx(50e9));
  matmulTime(half, 1024, 50e9);
}

TEST_CASE("host: attention_curve prices attention by FLOPs per call", "[host]") {
  Compilation c;
  std::string text = kCalibration;
  text.replace(text.find("  matmul_curve {"), 0, "  attention_curve = [(1e5, 0.05), (1e7, 0.25), (1e8, 0.4)]\n");
  std::optional<Target> t = parseHost(c, text);
  REQUIRE(t);
  REQUIRE(t->attentionCurve.size() == 3);
  CHECK(t->attentionEfficiency(1e6) == Approx(0.15)); // log-midpoint of 0.05 and 0.25
  CHECK(t->attentionEfficiency(1e3) == 0.05);
  CHECK(t->attentionEfficiency(1e9) == 0.4);
  // kernelTime divides an attention call's compute by the curve at its FLOPs.
  KernelWork w;
  w.flops = 1e6;
  CHECK(kernelTime(*t, OpClass::Attention, Dtype::F32, w) == Approx(1e6 / 100e9 / 0.15));
  // A curve's efficiency is a rate of FLOPs: a memory-bound call's bytes move at the elementwise
  // efficiency (0.4), not at the curve's (0.05 here would make them 8x slower).
  KernelWork tiny;
  tiny.flops = 1e3;
  tiny.bytes = 1e5;
  KernelTimeTerms k = kernelTimeTerms(*t, OpClass::Attention, Dtype::F32, tiny);
  CHECK(k.fromCurve);
  CHECK(k.efficiency == 0.05);
  CHECK(k.byteEfficiency == 0.4);
  CHECK(k.memory == Approx(1e5 / 10e9 / 0.4));
  CHECK(k.compute == Approx(1e3 / 100e9 / 0.05));
  CHECK(kernelTime(*t, OpClass::Attention, Dtype::F32, tiny) == Approx(1e5 / 10e9 / 0.4));
  // Without a curve: efficiency.attention.
  Target plain = *t;
  plain.attentionCurve.clear();
  plain.efficiency.attention = 0.5;
  CHECK(kernelTime(plain, OpClass::Attention, Dtype::F32, w) == Approx(1e6 / 100e9 / 0.5));

  // A bad curve is an invalid-value diagnostic.
  Compilation bad;
  std::string wrong = kCalibration;
  wrong.replace(wrong.find("  matmul_curve {"), 0, "  attention_curve = [(1e7, 0.25), (1e5, 0.05)]\n");
  CHECK_FALSE(parseHost(bad, wrong));
  CHECK(bad.diags.errorCount() > 0);
}

TEST_CASE("host: attention_tile prices a causal call at the scores its tiles compute", "[host]") {
  // tiledCausalScores against the runtime kernel's loop (rt_attention.h: each query tile of qb
  // rows computes the keys up to its last row, i0 + qb), for lengths around the tile.
  for (int64_t s : {1, 16, 63, 64, 65, 100, 128, 129, 256, 1000}) {
    double loop = 0;
    for (int64_t i0 = 0; i0 < s; i0 += 64) {
      const int64_t qb = std::min<int64_t>(64, s - i0);
      loop += double(qb) * double(i0 + qb);
    }
    INFO("s = " << s);
    CHECK(tiledCausalScores(double(s), kHostAttentionTile) == loop);
  }
  CHECK(tiledCausalScores(128, 64) == 12288);
  // A causal attention at s = 128 on a target whose curve is flat (0.25 at every size), with
  // and without attention_tile: its compute grows by 12288 / (128·129/2) = 1.488.
  const std::string model = R"(
model M(vocab = 64, d = 32) {
  wte = Embedding(vocab, d)
  qkv = Linear(d, 3 * d)
  forward(tokens: i32[batch, seq]) {
    q, k, v = split(qkv(wte(tokens)), 3, dim = -1)
    a = attention(q, k, v, heads = 2, causal = ATTN)
    return cross_entropy(a @ transpose(wte.weight), next_tokens(tokens))
  }
}
train t { model = M() batch = 2 seq = 128 micro_batch = 2 optimizer = SGD(lr = 0.1)
          precision = fp32 target = Cpu }
)";
  auto attentionTimes = [&](bool tiled, bool causal) {
    std::string m = model;
    m.replace(m.find("ATTN"), 4, causal ? "true" : "false");
    Compiled t(std::string(kCpuTarget) + "  attention_curve = [(1e3, 0.25), (1e12, 0.25)]\n" +
               (tiled ? "  attention_tile = 64\n" : "") + "}\n" + m);
    const Graph &g = t.g();
    for (OpId i = 0; i < g.ops.size(); ++i)
      if (g.ops[i].kind == OpKind::Attention) {
        CHECK(tiledScoreRatio(g, g.ops[i], 64) == Approx(causal ? 12288.0 / 8256.0 : 1.0));
        return std::pair<double, double>{t.a->ops[i].forwardTime, t.a->ops[i].backwardTime};
      }
    FAIL("no attention");
    return std::pair<double, double>{0, 0};
  };
  const double call = 2e-6; // kernel_overhead; the compute is far above the bytes here
  auto [f0, b0] = attentionTimes(false, true);
  auto [f1, b1] = attentionTimes(true, true);
  CHECK((f1 - call) / (f0 - call) == Approx(12288.0 / 8256.0));
  CHECK((b1 - call) / (b0 - call) == Approx(12288.0 / 8256.0));
  // Not causal: the kernel computes every score, as the FLOPs count them.
  auto [f2, b2] = attentionTimes(false, false);
  auto [f3, b3] = attentionTimes(true, false);
  CHECK(f3 == f2);
  CHECK(b3 == b2);
}
