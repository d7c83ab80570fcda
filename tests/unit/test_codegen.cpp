// The CPU emitter (codegen/EmitCpu.cpp): every example's training step is generated on one
// device without the step and the memory plan disagreeing (each operand has a live buffer at
// its schedule step), and the calls carry the numbers the shapes give. The generated steps
// are compiled and run against PyTorch by tests/step/e2e (ctest e2e).
#include "Support.h"

#include "codegen/Emit.h"

using namespace tally;
using namespace tally::test;

namespace {

std::string emit(const Analysis &a, std::string &text) {
  std::vector<codegen::File> files;
  codegen::EmitOptions o;
  o.source = "t.tally";
  std::string err = codegen::emitCpuStep(a, o, files);
  for (const codegen::File &f : files)
    if (f.path == "step.cpp")
      text = f.text;
  return err;
}

size_t count(const std::string &text, const std::string &what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1))
    ++n;
  return n;
}

} // namespace

TEST_CASE("codegen: every example's plan generates on one device", "[codegen]") {
  PlanOverrides one;
  one.target = "H100_SXM";
  for (const char *file : {"gpt2.tally", "lecture.tally", "llama2_7b.tally", "tour.tally"}) {
    INFO(file);
    Compiled t(fromFile, example(file), "", one);
    std::string text;
    CHECK(emit(*t.a, text) == "");
    // One call per non-view op of the schedule's micro-batch entries, each under a comment.
    size_t calls = 0;
    for (const StepEntry &e : t.a->stepSchedule)
      if (e.kind != StepEntry::Optimizer && opClass(t.a->step->ops[e.op].kind) != OpClass::View)
        ++calls;
    CHECK(count(text, "  op_class = ") == calls + 2); // + the optimizer update and zero-grad
  }
}

TEST_CASE("codegen: the e2e GPT's tied head, fused qkv and recompute", "[codegen]") {
  Compiled t(fromFile, sourceDir() + "/tests/step/e2e/gpt.tally");
  std::string text;
  REQUIRE(emit(*t.a, text) == "");
  // q, k, v are column slices of the [2, 16, 192] qkv output: row stride 3·64.
  CHECK(count(text, "rt::AttnRows{192, 192, 192}") == 4); // 2 layers × (forward, backward)
  // The tied head's weight gradient is the transposed view of wte's gradient: written as
  // dWᵀ[128 × 64] = dlogitsᵀ[128 × 32] · x[32 × 64] (32 = 2 × 16 tokens of a micro-batch),
  // added into the grads region at wte's offset 0.
  CHECK(count(text, "rt::matmul<float>(ctx, true, false, 128, 64, 32, 1.0f,") == 1);
  CHECK(count(text, ", 1.0f, G<float>(0), 64, 0, 1);") == 1);
  // The loss gradient: 1 / 2 micro-steps.
  CHECK(count(text, "rt::fill<float>(ctx, A<float>(") >= 1);
  CHECK(count(text, "5.000000000e-01f, 1);") == 1);
}

TEST_CASE("codegen: checkpointed blocks are recomputed into their own buffers", "[codegen]") {
  Compiled t(R"(
block Layer(d) {
  ln = LayerNorm(d)
  fc = Linear(d, 2 * d)
  forward(x) { return x + dropout(gelu(fc(ln(x))), 0.1) @ transpose(fc.weight) }
}
model M(d = 16, layers = 3) {
  h = repeat(layers) Layer(d)
  w = RMSNorm(d)
  forward(x: f32[batch, seq, d]) {
    y = softmax(w(h(x)), dim = -1)
    return mean(y * y - 2 * y)
  }
}
train t { model = M() batch = 4 seq = 8 micro_batch = 2 optimizer = AdamW(lr = 1e-3)
          precision = mixed_fp16 checkpoint = full target = H100_SXM }
)");
  std::string text;
  REQUIRE(emit(*t.a, text) == "");
  // Three layers of six forward ops (ln, matmul, add, gelu, dropout, matmul; the transpose
  // is a view and the residual add the seventh) run again before their backward.
  CHECK(count(text, "(recompute)") == 3 * 7);
  // The same dropout stream and seed in the forward, the recompute and the backward.
  CHECK(count(text, "rt::dropout_fwd<rt::f16>") == 6);
  CHECK(count(text, "rt::dropout_bwd<rt::f16>") == 3);
  // fp16 loss scaling: the overflow check skips the update; the update unscales.
  CHECK(count(text, "rt::sum_squares<rt::f16>") == 1);
  CHECK(count(text, "1.0f / kLossScale") == 1);
}

TEST_CASE("codegen: plans the CPU backend cannot run are refused with the reason; 1/x runs", "[codegen]") {
  Compiled t(fromFile, example("gpt2.tally"));
  std::string text;
  CHECK(emit(*t.a, text).find("uses 8 devices") != std::string::npos);
  Compiled d(R"(
model M(d = 8) {
  param w: [d, d]
  forward(x: f32[batch, d]) { return mean(1 / (x @ w)) }
}
train t { model = M() batch = 2 optimizer = SGD(lr = 0.1) precision = fp32 target = H100_SXM }
)");
  CHECK(emit(*d.a, text) == "");
  CHECK(count(text, "rt::div_scalar_bwd<float>(ctx, ") == 1); // d(1/u)/du from the output
  CHECK(count(text, "rt::matmul<float>(ctx, false, false, 2, 8, 8, 1.0f,") == 1);
}

TEST_CASE("codegen: a division by a tensor and a gradient written into a split part", "[codegen]") {
  Compiled t(R"(
model M(d = 8) {
  param w: [d, 2 * d]
  forward(x: f32[batch, d]) {
    a, b = split(x @ w, 2, dim = -1)
    return mean(a * sigmoid(b) / (b * b + 1))
  }
}
train t { model = M() batch = 2 optimizer = SGD(lr = 0.1) precision = fp32 target = H100_SXM }
)");
  std::string text;
  REQUIRE(emit(*t.a, text) == "");
  CHECK(count(text, "rt::div_bwd<float>(ctx, ") == 1);
  // The gradients of a and b go into the halves of the [2, 16] product's gradient, which starts
  // from a zero fill (b is read three times): one write into a's half (from a · sigmoid(b)),
  // three into b's (sigmoid(b), and b · b's two operands), each with row stride 16.
  CHECK(count(text, "rt::fill<float>(ctx, A<float>(0), 0.0f, 32);") == 1);
  CHECK(count(text, "dims{{16, 1}}, dims{{2, 8}}, 2, true);") == 4);
}
