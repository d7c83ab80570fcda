// test_examples.cpp — the numbers language.md promises for its examples, computed through
// tally::Compilation exactly as the CLI does: GPT-2 small's and Llama-2-7B's parameter counts,
// the lecture's forward matmul FLOPs, 16 bytes per parameter for fp32 AdamW on 8 × H100, and
// the §1.4 declarations (the inference plan, `target MyGPU`) parsing and resolving.
// The examples are read from $TALLY_SOURCE_DIR/examples (ctest sets it to the repository).
#include <catch.hpp>

#include <cstdlib>
#include <string>

#include "driver/Compiler.h"
#include "passes/Passes.h"

using namespace tally;
using tally::test::sourceDir;

namespace {

/// One example file, compiled with diagnostics collected instead of printed.
struct Example {
  Compilation c;
  std::string out;
  llvm::raw_string_ostream os{out};

  explicit Example(const std::string &file) {
    c.diags.setOutput(&os);
    c.diags.setShowColors(false);
    INFO("examples/" << file);
    REQUIRE(c.addFile(sourceDir() + "/examples/" + file));
  }
  std::optional<Analysis> analyze(llvm::StringRef plan = "") {
    const PlanDecl *p = c.pickPlan(plan);
    REQUIRE(p);
    return c.analyzePlan(*p);
  }
  /// Errors other than broken budgets (the Llama example's budgets are part of the example).
  unsigned nonBudgetErrors() const {
    unsigned n = 0;
    for (const Diagnostic &d : c.diags.diagnostics())
      n += d.severity == Severity::Error && !codeOf(d.kind).startswith("budget-");
    return n;
  }
};

} // namespace

TEST_CASE("every example parses and lowers without errors", "[examples]") {
  for (const char *file : {"lecture.tally", "gpt2.tally", "llama2_7b.tally", "targets.tally",
                           "tour.tally", "mixtral_8x7b.tally"}) {
    INFO(file);
    Example e(file);
    REQUIRE_FALSE(e.c.program.planOrder.empty());
    for (const PlanDecl *p : e.c.program.planOrder) {
      INFO("plan " << p->name);
      CHECK(e.c.analyzePlan(*p));
    }
    INFO(e.out);
    CHECK(e.nonBudgetErrors() == 0);
  }
}

TEST_CASE("GPT-2 small has exactly 124,439,808 parameters", "[examples]") {
  Example e("gpt2.tally");
  auto a = e.analyze("gpt2_124M");
  REQUIRE(a);
  CHECK(a->params.total == 124439808.0);
  CHECK(a->params.trainable == 124439808.0);
  // 12 blocks of 7,087,872, the embeddings and the final norm; the tied head adds nothing.
  double blocks = 0;
  for (const Analysis::BlockCount &b : a->params.byBlock)
    if (a->graph->instancePath(b.instance) == "h")
      blocks = b.count;
  CHECK(blocks == 12 * 7087872.0);
  CHECK(e.c.graph->paramPath(0) == "wte.weight");
  CHECK(e.c.plan->parallel.devices == 8);
  CHECK(e.c.plan->parallel.zero == 1);
  CHECK(e.c.plan->tokens == 10e9);
}

TEST_CASE("Llama-2-7B has exactly 6,738,415,616 parameters", "[examples]") {
  Example e("llama2_7b.tally");
  auto a = e.analyze("llama2_7b");
  REQUIRE(a);
  CHECK(a->params.total == 6738415616.0);
  CHECK(e.c.plan->budgets.size() == 4);
  CHECK(e.c.plan->tokens == 2e12);
  CHECK(e.c.plan->parallel.zero == 3);
}

TEST_CASE("the lecture's forward matmul FLOPs are exactly 2·B·D·K summed", "[examples]") {
  Example e("lecture.tally");
  auto a = e.analyze("lecture");
  REQUIRE(a);
  const double B = 1024, D = 1024, K = 64;
  CHECK(a->flops.forwardMatmul == 2 * B * (D * D + D * K));
  CHECK(a->flops.forwardMatmul == 2281701376.0);
  CHECK(a->params.total == D * D + D * K);
  CHECK(e.c.plan->optimizer.name == "SGD");
  CHECK(e.c.plan->optimizer.states == 0);
}

TEST_CASE("fp32 AdamW on 8 x H100 holds 16 bytes per parameter", "[examples]") {
  Compilation c;
  std::string out;
  llvm::raw_string_ostream os(out);
  c.diags.setOutput(&os);
  REQUIRE(c.addSource("adamw.tally", R"(
model Deep(d = 1024, layers = 4) {
  h = repeat(layers) Linear(d, d)
  forward(x: f32[batch, d]) { return mean(h(x)) }
}
train fp32_adamw {
  model     = Deep()
  batch     = 64
  optimizer = AdamW(lr = 1e-3)
  precision = fp32
  target    = 8 x H100_SXM { data = 8 }
}
)"));
  const PlanDecl *p = c.pickPlan("");
  REQUIRE(p);
  auto a = c.analyzePlan(*p);
  REQUIRE(a);
  const double n = 4 * (1024.0 * 1024 + 1024);
  CHECK(a->params.total == n);
  CHECK(a->memory.params == 4 * n);
  CHECK(a->memory.grads == 4 * n);
  CHECK(a->memory.master == 0);
  CHECK(a->memory.optimizer == 8 * n);
  CHECK(a->memory.bytesPerParam == 16);
  CHECK(c.plan->optimizer.states == 2);
}

TEST_CASE("the inference plan of language.md §1.4 resolves", "[examples]") {
  Example e("gpt2.tally");
  const PlanDecl *p = e.c.pickPlan("gpt2_decode");
  REQUIRE(p);
  CHECK_FALSE(p->isTrain);
  REQUIRE(e.c.lower(*p));
  const Plan &plan = *e.c.plan;
  CHECK_FALSE(plan.isTrain);
  CHECK(plan.batch == 1);
  CHECK(plan.prompt == 512);
  CHECK(plan.generate == 256);
  CHECK(plan.precision.preset == "bf16");
  CHECK(plan.precision.params == Dtype::BF16);
  CHECK(plan.target.name == "H100_SXM");
  CHECK(plan.parallel.devices == 1);
  // The model is the same GPT-2: same parameters.
  CHECK(e.c.graph->params.size() == 2 + 12 * 12 + 2);
  CHECK(e.nonBudgetErrors() == 0);
}

TEST_CASE("target MyGPU of language.md §1.4 parses and resolves", "[examples]") {
  Example e("targets.tally");
  REQUIRE(e.c.program.targets.count("MyGPU"));
  const PlanDecl *p = e.c.pickPlan("on_my_gpu");
  REQUIRE(p);
  REQUIRE(e.c.lower(*p));
  const Target &t = e.c.plan->target;
  CHECK(t.name == "MyGPU");
  CHECK(t.memoryBytes == 96.0 * 1024 * 1024 * 1024);
  CHECK(t.bandwidth == 4e12);
  CHECK(t.peakBF16 == 900e12);
  CHECK(t.peakF16 == 900e12);
  CHECK(t.peakTF32 == 450e12);
  CHECK(t.peakF32 == 60e12);
  CHECK(t.hostLink == 64e9);
  CHECK(t.interconnect == 450e9);
  CHECK(e.c.plan->parallel.devices == 4);
  // The precision record, with the optimizer state on the host.
  const PrecisionPolicy &pp = e.c.plan->precision;
  CHECK(pp.preset == "custom");
  CHECK(pp.params == Dtype::BF16);
  CHECK(pp.master == Dtype::F32);
  CHECK(pp.optimizer == Dtype::F32);
  CHECK(pp.optimizerOnHost);
  CHECK_FALSE(pp.paramsOnHost);
  CHECK(e.nonBudgetErrors() == 0);
}
