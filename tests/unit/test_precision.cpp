// test_precision.cpp — unit tests for precision: the dtypes issue 3 lists and how precision
// records spell them, the rounding facts the lints rest on (1e-8 is 0 in fp16 and 1.0012e-08 in
// bf16), and each lint of passes/PrecisionLints.cpp firing where it should and not elsewhere.
// Plans are compiled from source through tally::Compilation, as the CLI does.
#include <catch.hpp>

#include "ir/Dtype.h"
#include "tests/unit/Support.h"

#include <cstdio>
#include <string>
#include <vector>

using namespace tally;
using namespace tally::test;

namespace {

std::string g5(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.5g", v);
  return buf;
}

/// A model with a LayerNorm whose eps is given, a matmul and a constant, and one train plan
/// with the given optimizer and precision.
std::string source(const std::string &optimizer, const std::string &precision,
                   const std::string &lnEps = "1e-5", const std::string &constant = "2") {
  return R"(
model M(d = 64) {
  ln = LayerNorm(d, eps = )" + lnEps + R"()
  param w: [d, d]
  forward(x: f32[batch, d]) {
    y = ln(x) @ w
    return mean(y * )" + constant + R"()
  }
}
train t {
  model = M()
  batch = 8
  optimizer = )" + optimizer + R"(
  precision = )" + precision + R"(
  target = H100_SXM
}
)";
}

} // namespace

TEST_CASE("precision: 1e-8 is 0 in fp16 and 1.0012e-08 in bf16", "[precision]") {
  CHECK(roundTo(Dtype::F16, 1e-8) == 0);
  CHECK(roundTo(Dtype::BF16, 1e-8) != 0);
  CHECK(g5(roundTo(Dtype::BF16, 1e-8)) == "1.0012e-08");
  CHECK(roundTo(Dtype::BF16, 1e-8) >= limitsOf(Dtype::BF16).minNormal);
  // The limits the messages quote.
  CHECK(g5(limitsOf(Dtype::F16).minNormal) == "6.1035e-05");
  CHECK(g5(limitsOf(Dtype::F16).minSubnormal) == "5.9605e-08");
  CHECK(limitsOf(Dtype::F16).max == 65504);
  // 1e-5, LayerNorm's default eps, is subnormal in fp16.
  CHECK(roundTo(Dtype::F16, 1e-5) < limitsOf(Dtype::F16).minNormal);
  CHECK(g5(roundTo(Dtype::F16, 1e-5)) == "1.0014e-05");
}

TEST_CASE("precision: the dtypes of issue 3 exist, with their sizes", "[precision]") {
  struct Row {
    const char *name;
    Dtype dtype;
    unsigned bytes;
  };
  const Row rows[] = {{"fp32", Dtype::F32, 4},     {"tf32", Dtype::TF32, 4},
                      {"fp16", Dtype::F16, 2},     {"bf16", Dtype::BF16, 2},
                      {"e4m3", Dtype::FP8E4M3, 1}, {"e5m2", Dtype::FP8E5M2, 1},
                      {"fp8_e4m3", Dtype::FP8E4M3, 1}, {"fp8_e5m2", Dtype::FP8E5M2, 1},
                      {"int8", Dtype::I8, 1},      {"int32", Dtype::I32, 4}};
  for (const Row &r : rows) {
    INFO(r.name);
    REQUIRE(parseDtype(r.name));
    CHECK(*parseDtype(r.name) == r.dtype);
    CHECK(bytesOf(r.dtype) == r.bytes);
  }
  CHECK(limitsOf(Dtype::FP8E4M3).max == 448);
  CHECK(limitsOf(Dtype::FP8E5M2).max == 57344);
}

TEST_CASE("precision: records accept fp8 for params and activations", "[precision]") {
  Compiled l(source("SGD(lr = 0.01)", "{ params = fp8_e4m3, grads = bf16, activations = e5m2, "
                                    "master = fp32, optimizer = fp32 }"));
  const PrecisionPolicy &p = l.a->plan->precision;
  CHECK(p.preset == "custom");
  CHECK(p.params == Dtype::FP8E4M3);
  CHECK(p.grads == Dtype::BF16);
  CHECK(p.activations == Dtype::FP8E5M2);
  CHECK(p.master == Dtype::F32);
  CHECK(l.a->graph->activationDtype == Dtype::FP8E5M2);
}

TEST_CASE("precision-underflow: AdamW eps in an fp16 optimizer state", "[precision]") {
  Compiled l(source("AdamW(lr = 3e-4, eps = 1e-8)",
                  "{ params = bf16, master = fp32, optimizer = fp16 }"));
  auto u = l.of(DiagKind::PrecisionUnderflow);
  REQUIRE(u.size() == 1);
  CHECK(u[0]->message == "eps = 1e-08 underflows to 0 in f16 (smallest normal 6.1035e-05, "
                         "smallest subnormal 5.9605e-08)");
  CHECK(u[0]->severity == Severity::Warning);
  CHECK(u[0]->line == 13); // the eps literal in the optimizer setting
}

TEST_CASE("precision-underflow: eps in an fp32 or bf16 optimizer state is fine", "[precision]") {
  CHECK(Compiled(source("AdamW(lr = 3e-4, eps = 1e-8)", "mixed_fp16", "1e-4"))
            .count(DiagKind::PrecisionUnderflow) == 0);
  CHECK(Compiled(source("AdamW(lr = 3e-4, eps = 1e-8)", "{ params = bf16, optimizer = bf16 }"))
            .count(DiagKind::PrecisionUnderflow) == 0);
}

TEST_CASE("precision-underflow: layer norm eps in fp16 activations, not in bf16", "[precision]") {
  Compiled fp16(source("SGD(lr = 0.01)", "mixed_fp16", "1e-8"));
  auto u = fp16.of(DiagKind::PrecisionUnderflow);
  REQUIRE(u.size() == 1);
  CHECK(u[0]->message.rfind("eps = 1e-08 underflows to 0 in f16", 0) == 0);
  Compiled bf16(source("SGD(lr = 0.01)", "mixed_bf16", "1e-8"));
  CHECK(bf16.count(DiagKind::PrecisionUnderflow) == 0);
  // The default 1e-5 is subnormal in fp16: still a warning, with the stored value.
  Compiled sub(source("SGD(lr = 0.01)", "mixed_fp16"));
  auto s = sub.of(DiagKind::PrecisionUnderflow);
  REQUIRE(s.size() == 1);
  CHECK(s[0]->message.find("is subnormal in f16 and is stored as 1.0014e-05") != std::string::npos);
  CHECK(Compiled(source("SGD(lr = 0.01)", "fp32", "1e-8")).count(DiagKind::PrecisionUnderflow) == 0);
}

TEST_CASE("precision-underflow: the learning rate in fp16 parameters without a master copy",
          "[precision]") {
  Compiled pure(source("SGD(lr = 1e-8)", "fp16", "1e-4"));
  auto u = pure.of(DiagKind::PrecisionUnderflow);
  REQUIRE(u.size() == 1);
  CHECK(u[0]->message.rfind("lr = 1e-08 underflows to 0 in f16", 0) == 0);
  // With an fp32 master copy the update happens in fp32.
  CHECK(Compiled(source("SGD(lr = 1e-8)", "mixed_fp16", "1e-4")).count(DiagKind::PrecisionUnderflow) == 0);
}

TEST_CASE("precision-underflow: one warning for a literal used by many ops", "[precision]") {
  Compiled l(R"(
block B(d) {
  ln = LayerNorm(d, eps = 1e-9)
  forward(x) { return ln(x) }
}
model M(d = 64) {
  h = repeat(4) B(d)
  forward(x: f32[batch, d]) { return mean(h(x)) }
}
train t { model = M() batch = 8 precision = mixed_fp16 target = H100_SXM }
)");
  auto u = l.of(DiagKind::PrecisionUnderflow);
  REQUIRE(u.size() == 1);
  // Raised in the standard library's LayerNorm: reported at `ln = LayerNorm(...)`, the library's
  // line first among the notes, then the repeat, then the precision setting.
  REQUIRE(u[0]->notes.size() >= 3);
  CHECK(u[0]->notes[0].message == "raised in the standard library, in 'LayerNorm' instantiated as h[0].ln");
  CHECK(u[0]->line == 3);
  CHECK(u[0]->notes[2].message.find("h[0].ln.layer_norm and 3 more") != std::string::npos);
}

TEST_CASE("precision-overflow: a constant past fp16's max", "[precision]") {
  Compiled l(source("SGD(lr = 0.01)", "mixed_fp16", "1e-5", "1e5"));
  auto o = l.of(DiagKind::PrecisionOverflow);
  REQUIRE(o.size() == 1);
  CHECK(o[0]->message == "the constant 1e+05 is past the largest finite f16 value, 65504, and "
                         "becomes inf");
  CHECK(Compiled(source("SGD(lr = 0.01)", "mixed_fp16", "1e-5", "65504")).count(DiagKind::PrecisionOverflow) == 0);
  CHECK(Compiled(source("SGD(lr = 0.01)", "mixed_bf16", "1e-5", "1e5")).count(DiagKind::PrecisionOverflow) == 0);
}

TEST_CASE("fp16-no-loss-scaling: fp16 gradients need loss scaling", "[precision]") {
  Compiled pure(source("SGD(lr = 0.01)", "fp16"));
  auto w = pure.of(DiagKind::Fp16NoLossScaling);
  REQUIRE(w.size() == 1);
  CHECK(w[0]->message.rfind("f16 gradients without loss scaling", 0) == 0);
  REQUIRE(w[0]->fixits.size() == 1);
  CHECK(w[0]->fixits[0].getText() == "mixed_fp16");
  CHECK(Compiled(source("SGD(lr = 0.01)", "mixed_fp16")).count(DiagKind::Fp16NoLossScaling) == 0);
  CHECK(Compiled(source("SGD(lr = 0.01)", "bf16")).count(DiagKind::Fp16NoLossScaling) == 0);
  CHECK(Compiled(source("SGD(lr = 0.01)", "{ params = fp16, loss_scaling = true }"))
            .count(DiagKind::Fp16NoLossScaling) == 0);
  CHECK(Compiled(source("SGD(lr = 0.01)", "{ params = fp32, grads = fp16 }"))
            .count(DiagKind::Fp16NoLossScaling) == 1);
}

TEST_CASE("low-precision-optimizer-state: moments below fp32", "[precision]") {
  Compiled bf16(source("AdamW(lr = 3e-4)", "{ params = bf16, optimizer = bf16 }"));
  auto w = bf16.of(DiagKind::LowPrecisionOptimizerState);
  REQUIRE(w.size() == 1);
  CHECK(w[0]->message == "AdamW keeps its optimizer state in bf16, below fp32: 8 significant "
                         "bits against fp32's 24");
  // beta2 = 0.999 is 1 in bf16: the reason is given as a note.
  bool decays = false;
  for (const DiagNote &n : w[0]->notes)
    decays |= n.message.find("beta2 = 0.999 rounds to 1 in bf16") != std::string::npos;
  CHECK(decays);
  CHECK(roundTo(Dtype::BF16, 0.999) == 1);
  // Optimizers without state, and fp32 state, are fine.
  CHECK(Compiled(source("SGD(lr = 0.01)", "{ params = bf16, optimizer = bf16 }"))
            .count(DiagKind::LowPrecisionOptimizerState) == 0);
  CHECK(Compiled(source("AdamW(lr = 3e-4)", "mixed_bf16")).count(DiagKind::LowPrecisionOptimizerState) == 0);
  CHECK(Compiled(source("SGD(lr = 0.01, momentum = 0.9)", "{ params = fp16, optimizer = fp8_e4m3 }"))
            .count(DiagKind::LowPrecisionOptimizerState) == 1);
}

TEST_CASE("precision lints: the presets used by the examples are clean", "[precision]") {
  for (const char *preset : {"fp32", "bf16", "mixed_bf16", "mixed_fp16"}) {
    INFO(preset);
    Compiled l(source("AdamW(lr = 3e-4, eps = 1e-8)", preset, "1e-4"));
    CHECK(l.c.diags.warningCount() == 0);
  }
}

// ---- FP8 training as Transformer Engine runs it (issue 45, passes/Fp8.cpp) -----------------

TEST_CASE("fp8: presets and the recipe record", "[precision][fp8]") {
  auto hybrid = precisionPreset("fp8_hybrid");
  REQUIRE(hybrid);
  CHECK(hybrid->fp8.format == Fp8Recipe::Format::Hybrid);
  CHECK(hybrid->fp8.gradDtype() == Dtype::FP8E5M2);
  CHECK(hybrid->fp8.amaxHistory == 1024); // TE's DelayedScaling default
  CHECK(hybrid->params == Dtype::BF16);
  CHECK(hybrid->master == Dtype::F32);
  CHECK(precisionPreset("fp8_e4m3")->fp8.gradDtype() == Dtype::FP8E4M3);
  Compiled l(source("AdamW(lr = 3e-4)",
                    "{ params = bf16, master = fp32, fp8 = { format = e4m3, amax_history = 16, "
                    "keep_first_last_bf16 = true } }"));
  const Fp8Recipe &r = l.a->plan->precision.fp8;
  CHECK(r.format == Fp8Recipe::Format::E4M3);
  CHECK(r.amaxHistory == 16);
  CHECK(r.keepFirstLastBf16);
  // One weight matmul and no repeat blocks: it is the first and last, kept in bf16.
  CHECK(l.a->fp8.gemms == 0);
  CHECK(l.a->fp8.keptBf16 == 1);
}

TEST_CASE("fp8: Llama-3-8B's fp8/bf16 step-time ratio on H100 comes from the op mix",
          "[precision][fp8]") {
  std::string path = sourceDir() + "/tests/lit/fp8-llama3.tally";
  Compiled bf(FromFile{}, path, "bf16"), f8(FromFile{}, path, "fp8");
  const Analysis &b = *bf.a, &f = *f8.a;
  const auto &x = f.fp8;
  REQUIRE(x.active);
  CHECK(x.gemms == 224);
  // Every GEMM is compute-bound: in fp8 it runs at 1979 TFLOP/s against bf16's 989.5.
  const Target &h100 = f.plan->target;
  CHECK(x.gemmForwardBf16 / x.gemmForward == Approx(h100.peakFP8 / h100.peakBF16).epsilon(1e-3));
  CHECK(x.gemmBackwardBf16 / x.gemmBackward == Approx(h100.peakFP8 / h100.peakBF16).epsilon(1e-3));
  // The bf16 plan's compute is the same GEMMs at the bf16 rate and the same other ops; the fp8
  // plan's adds the casts, and the weights' casts once per step.
  double m = static_cast<double>(f.time.accumulationSteps);
  CHECK(m == 1);
  CHECK(b.time.forward == Approx(m * (x.gemmForwardBf16 + x.otherForward)));
  CHECK(b.time.backward == Approx(m * (x.gemmBackwardBf16 + x.otherBackward)));
  CHECK(f.time.forward == Approx(m * (x.gemmForward + x.castForward + x.otherForward) + x.weightCast));
  CHECK(f.time.backward == Approx(m * (x.gemmBackward + x.castBackward + x.otherBackward)));
  // The rest of the step (optimizer, exposed communication) is each plan's own.
  double restB = b.time.step - b.time.forward - b.time.backward;
  double restF = f.time.step - f.time.forward - f.time.backward;
  CHECK(b.time.optimizer == Approx(f.time.optimizer));
  double fromMix = (m * (x.gemmForwardBf16 + x.gemmBackwardBf16 + x.otherForward + x.otherBackward) + restB) /
                   (m * (x.gemmForward + x.gemmBackward + x.castForward + x.castBackward +
                         x.otherForward + x.otherBackward) + x.weightCast + restF);
  CHECK(fromMix == Approx(b.time.step / f.time.step));
  std::printf("fp8/bf16 step-time ratio, Llama-3-8B on 8 x H100_SXM: %.4f (bf16 %.4g s, fp8 %.4g s;"
              " GEMMs %.4g -> %.4g s, casts %.4g s, weight casts %.4g s, other ops %.4g s)\n",
              fromMix, b.time.step, f.time.step, x.gemmForwardBf16 + x.gemmBackwardBf16,
              x.gemmForward + x.gemmBackward, x.castForward + x.castBackward, x.weightCast,
              x.otherForward + x.otherBackward);
  // Not 2x: only the GEMMs speed up.
  CHECK(fromMix > 1.25);
  CHECK(fromMix < 1.45);
  // Memory: the states are the same; the fp8 weight copies come on top, the saved GEMM inputs
  // shrink (tests/lit/fp8-llama3.tally derives the bytes).
  CHECK(f.memory.params == b.memory.params);
  CHECK(f.memory.master == b.memory.master);
  CHECK(f.memory.optimizer == b.memory.optimizer);
  CHECK(f.memory.fp8Weights == 13958643712.0);
  CHECK(b.memory.activations - f.memory.activations == 2415919104.0);
}
