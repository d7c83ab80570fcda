// Unit tests for passes/Solvers and passes/Budgets: the lecture's two what-if answers, state
// bytes per optimizer and precision, command-line quantities, the plan searches and the
// budget diagnostics with their computed fixes.
#include "passes/Passes.h"
#include "passes/Solvers.h"
#include "tests/unit/Support.h"

#include <catch.hpp>

#include <cmath>
#include <set>

using namespace tally;
using namespace tally::test;

namespace {

/// A 4096×4096 fp32 matrix trained with AdamW: 16 bytes per parameter, 256 MiB of states.
std::string wideModel(const std::string &target, const std::string &budget = "") {
  return "model Wide(D = 4096) {\n"
         "  param w: [D, D]\n"
         "  forward(x: f32[batch, D]) { return mean(x @ w) }\n"
         "}\n"
         "train wide {\n"
         "  model = Wide()\n  batch = 64\n  micro_batch = 1\n  tokens = 1B\n"
         "  optimizer = AdamW(lr = 1e-3)\n  precision = fp32\n"
         "  target = " + target + "\n" + budget + "}\n";
}

/// Two analyses of one candidate price it alike, exactly: its memory, FLOPs, time (each part)
/// and checkpoint plan (the layout search's candidates against whole analyses, or against
/// candidates priced without the search's kept entries).
void samePriced(const Analysis &x, const Analysis &y) {
  CHECK(x.memory.peak == y.memory.peak);
  CHECK(x.memory.activations == y.memory.activations);
  CHECK(x.memory.workspace == y.memory.workspace);
  CHECK(x.memory.allocatorReserve == y.memory.allocatorReserve);
  CHECK(x.flops.recompute == y.flops.recompute);
  CHECK(x.flops.executed == y.flops.executed);
  CHECK(x.time.step == y.time.step);
  CHECK(x.time.forward == y.time.forward);
  CHECK(x.time.backward == y.time.backward);
  CHECK(x.time.recompute == y.time.recompute);
  CHECK(x.time.bubble == y.time.bubble);
  CHECK(x.time.communication == y.time.communication);
  CHECK(x.time.microBatchCompute == y.time.microBatchCompute);
  CHECK(x.time.mfu == y.time.mfu);
  CHECK(x.dequant.forward == y.dequant.forward);
  CHECK(x.checkpoint.policy == y.checkpoint.policy);
  CHECK(x.checkpoint.segment == y.checkpoint.segment);
  CHECK(x.checkpoint.checkpointed == y.checkpoint.checkpointed);
}

bool contains(const std::vector<std::string> &lines, const std::string &needle) {
  for (const std::string &l : lines)
    if (l.find(needle) != std::string::npos)
      return true;
  return false;
}

} // namespace

// ---- closed forms ----------------------------------------------------------------------------

TEST_CASE("solvers: run time of the lecture's 70B model on 15T tokens", "[solvers]") {
  const Target *h100 = findTarget("H100_SXM");
  REQUIRE(h100);
  SolverAnswer r = solveRunTime(70e9, 15e12, 1024, *h100, 0.5);
  REQUIRE(r.ok());
  CHECK(r.question == "run-time");
  CHECK(r.unit == "days");
  // 6·70e9·15e12 / (1024 · 989.5e12 · 0.5) s = 143.93 days.
  CHECK(r.answer == Approx(6 * 70e9 * 15e12 / (1024 * 989.5e12 * 0.5) / 86400).epsilon(1e-12));
  CHECK(std::round(r.answer * 100) / 100 == 143.93);
  CHECK(contains(r.derivation, "6 × 7e10 × 1.5e13 = 6.3e24"));
  CHECK(contains(r.derivation, "143.93 days"));
  // fp32 runs at the CUDA-core rate: 989.5 / 66.9 times longer.
  SolverAnswer f = solveRunTime(70e9, 15e12, 1024, *h100, 0.5, Dtype::F32);
  CHECK(f.answer == Approx(r.answer * 989.5 / 66.9));
}

TEST_CASE("solvers: run time refuses impossible inputs", "[solvers]") {
  const Target *h100 = findTarget("H100_SXM");
  CHECK_FALSE(solveRunTime(0, 1e12, 8, *h100, 0.5).ok());
  CHECK_FALSE(solveRunTime(1e9, 1e12, 0, *h100, 0.5).ok());
  CHECK_FALSE(solveRunTime(1e9, 1e12, 8, *h100, 1.5).ok());
  CHECK_FALSE(solveRunTime(1e9, 1e12, 8, *h100, 0.5, Dtype::I32).ok());
}

TEST_CASE("solvers: bytes per parameter by precision and optimizer", "[solvers]") {
  auto bytes = [](const char *precision, const char *optimizer) {
    auto p = precisionPreset(precision);
    auto o = optimizerPreset(optimizer);
    REQUIRE(p);
    REQUIRE(o);
    return stateBytesPerParam(*p, o->states).total();
  };
  CHECK(bytes("fp32", "AdamW") == 16);      // 4 + 4 + 0 + 2·4
  CHECK(bytes("bf16", "AdamW") == 12);      // 2 + 2 + 0 + 2·4
  CHECK(bytes("mixed_bf16", "AdamW") == 16); // 2 + 2 + 4 + 2·4
  CHECK(bytes("mixed_fp16", "Adam") == 16);
  CHECK(bytes("fp32", "SGD") == 8);          // no state
  CHECK(bytes("fp32", "SGDM") == 12);        // momentum
  CHECK(bytes("fp32", "AdaGrad") == 12);     // one accumulator
  CHECK(bytes("fp32", "RMSprop") == 12);
  CHECK(bytes("fp32", "Adam") == 16);        // two moments
  CHECK(bytes("fp32", "Lion") == 12);
  CHECK(optimizerPreset("adamw")->name == "AdamW");
  CHECK(optimizerPreset("ADAGRAD")->name == "AdaGrad");
  CHECK_FALSE(optimizerPreset("adamx"));
  CHECK_FALSE(precisionPreset("fp64"));
}

TEST_CASE("solvers: presets and optimizers agree with Sema", "[solvers]") {
  for (const char *preset : {"fp32", "tf32", "bf16", "fp16", "mixed_bf16", "mixed_fp16"}) {
    for (const char *opt : {"SGD", "AdaGrad", "RMSprop", "Adam", "AdamW", "Lion"}) {
      INFO(preset << " " << opt);
      Compiled m("model M() {\n  param w: [4, 4]\n"
                 "  forward(x: f32[batch, 4]) { return mean(x @ w) }\n}\n"
                 "train t {\n  model = M()\n  batch = 2\n  optimizer = " +
                 std::string(opt) + "(lr = 0.1)\n  precision = " + preset +
                 "\n  target = H100_SXM\n}\n");
      auto p = precisionPreset(preset);
      auto o = optimizerPreset(opt);
      REQUIRE(p);
      REQUIRE(o);
      const PrecisionPolicy &s = m.c.plan->precision;
      CHECK(p->params == s.params);
      CHECK(p->grads == s.grads);
      CHECK(p->activations == s.activations);
      CHECK(p->master == s.master);
      CHECK(p->optimizer == s.optimizer);
      CHECK(p->lossScaling == s.lossScaling);
      CHECK(o->states == m.c.plan->optimizer.states);
    }
  }
}

TEST_CASE("solvers: the lecture's largest model on 8 H100s", "[solvers]") {
  const Target *h100 = findTarget("H100_SXM");
  auto adamw = optimizerPreset("adamw");
  SolverAnswer bf16 = solveMaxParams(8, *h100, *adamw, *precisionPreset("bf16"));
  REQUIRE(bf16.ok());
  CHECK(bf16.unit == "parameters");
  CHECK(bf16.answer == std::floor(8 * 80e9 / 12)); // 53.3e9 at 12 bytes each
  CHECK(contains(bf16.derivation, "6.67B parameters")); // one unsharded device: 80e9 / 12
  CHECK(contains(bf16.derivation, "caveat: activations"));
  SolverAnswer fp32 = solveMaxParams(8, *h100, *adamw, *precisionPreset("fp32"));
  CHECK(fp32.answer == 40e9);
  CHECK(contains(fp32.derivation, "= 16 bytes"));
  // ZeRO-1 keeps params and grads whole (4 + 4) and shards 8 bytes of state over 8 devices.
  CHECK(contains(fp32.derivation, "ZeRO-1 over 8 devices: 8e10 B / 9 B"));
}

// ---- command-line quantities and budget flags ---------------------------------------------

TEST_CASE("solvers: quantities as written on the command line", "[solvers]") {
  std::string err;
  CHECK(*parseQuantity("70B", UnitDim::None, err) == 70e9);
  CHECK(*parseQuantity("7e10", UnitDim::None, err) == 70e9);
  CHECK(*parseQuantity("15T", UnitDim::None, err) == 15e12);
  CHECK(*parseQuantity("1024", UnitDim::None, err) == 1024);
  CHECK(*parseQuantity("80GiB", UnitDim::Bytes, err) == 80.0 * (1ull << 30));
  CHECK(*parseQuantity("80 GB", UnitDim::Bytes, err) == 80e9);
  CHECK(*parseQuantity("100B", UnitDim::Bytes, err) == 100); // B is a byte where bytes are meant
  CHECK(*parseQuantity("60s", UnitDim::Time, err) == 60);
  CHECK(*parseQuantity("90days", UnitDim::Time, err) == 90 * 86400.0);
  CHECK(*parseQuantity("500 ms", UnitDim::Time, err) == Approx(0.5));
  CHECK(*parseQuantity("40%", UnitDim::Ratio, err) == Approx(0.4));
  CHECK(*parseQuantity("0.5", UnitDim::Ratio, err) == 0.5);
  CHECK_FALSE(parseQuantity("50", UnitDim::Ratio, err));
  CHECK_FALSE(parseQuantity("80GiB", UnitDim::Time, err));
  CHECK(err.find("bytes") != std::string::npos);
  CHECK_FALSE(parseQuantity("abc", UnitDim::None, err));
  CHECK_FALSE(parseQuantity("-5", UnitDim::None, err));
  CHECK_FALSE(parseQuantity("10 gib", UnitDim::Bytes, err));
  CHECK(err.find("did you mean 'GiB'") != std::string::npos);
}

TEST_CASE("solvers: command-line budgets replace the file's of the same metric", "[solvers]") {
  Plan plan;
  plan.budgets.push_back({BudgetMetric::MemoryPerDevice, true, 80e9, {}});
  plan.budgets.push_back({BudgetMetric::StepTime, true, 60, {}});
  overrideBudgets(plan, {{BudgetMetric::MemoryPerDevice, true, 40e9, {}},
                         {BudgetMetric::Mfu, false, 0.4, {}}});
  REQUIRE(plan.budgets.size() == 3);
  int memory = 0;
  for (const BudgetSpec &b : plan.budgets)
    if (b.metric == BudgetMetric::MemoryPerDevice) {
      ++memory;
      CHECK(b.value == 40e9);
    }
  CHECK(memory == 1);
}

// ---- searches over a plan ----------------------------------------------------------------

TEST_CASE("solvers: micro-batch candidates", "[solvers]") {
  Plan p;
  p.batch = 1024;
  p.parallel.data = 8;
  CHECK(microBatchCandidates(p) == std::vector<int64_t>{1, 2, 4, 8, 16, 32, 64, 128});
  p.batch = 96;
  p.parallel.data = 8;
  CHECK(microBatchCandidates(p) == std::vector<int64_t>{1, 2, 3, 4, 6, 12});
  p.batch = 100;
  CHECK(microBatchCandidates(p) == std::vector<int64_t>{1, 2, 4, 8}); // 100/8 is not whole
  p.batch = 1024, p.microBatch = 4;
  CHECK(accumulationSteps(p) == 32);
}

TEST_CASE("solvers: largest micro-batch is the largest candidate that fits", "[solvers]") {
  Compiled wide(wideModel("8 x H100_SXM { data = 8 }"));
  Relower relower = wide.relower();
  const Analysis &a = *wide.a;
  // Everything fits in 80 GB: the whole per-device batch (64 / 8).
  SolverAnswer all = solveMicroBatch(a, relower, 80e9);
  REQUIRE(all.ok());
  CHECK(all.answer == 8);
  CHECK(contains(all.derivation, "accumulation steps = batch / (micro_batch × data) = 64 / (8 × 8) = 1"));
  // Below the model states nothing fits: an error, not a number.
  SolverAnswer none = solveMicroBatch(a, relower, 100e6);
  CHECK_FALSE(none.ok());
  CHECK(none.error.find("even micro_batch = 1") != std::string::npos);
  // For a limit between micro-batches 1 and 8, the answer fits and the next candidate does not.
  std::optional<Trial> one = tryPlan(a, [&] { Plan p = *wide.c.plan; p.microBatch = 1; return p; }(), relower);
  std::optional<Trial> eight = tryPlan(a, [&] { Plan p = *wide.c.plan; p.microBatch = 8; return p; }(), relower);
  REQUIRE(one);
  REQUIRE(eight);
  CHECK(one->peak <= eight->peak);
  if (eight->peak > one->peak) {
    double limit = (one->peak + eight->peak) / 2;
    SolverAnswer mid = solveMicroBatch(a, relower, limit);
    REQUIRE(mid.ok());
    CHECK(mid.answer < 8);
    Plan p = *wide.c.plan;
    p.microBatch = static_cast<int64_t>(mid.answer);
    CHECK(tryPlan(a, p, relower)->peak <= limit);
    p.microBatch *= 2;
    CHECK(tryPlan(a, p, relower)->peak > limit);
  }
}

TEST_CASE("solvers: fewest devices with ZeRO sharding", "[solvers]") {
  // zero = 0: every device holds all 256 MiB of states; more devices never fit. The limit is
  // 100 MiB of states, activations and workspace moved by an H100's framework memory
  // (docs/memory.md §9): 100 × 1.05 + 512 (context) + 64 (one communicator) = 681 MiB.
  const double limit = 681.0 * (1 << 20);
  Compiled t0(wideModel("8 x H100_SXM { data = 8, zero = 0 }"));
  Relower r0 = t0.relower();
  const Analysis &a0 = *t0.a;
  SolverAnswer no = solveDevices(a0, r0, limit);
  CHECK_FALSE(no.ok());
  CHECK(no.error.find("with zero = 3, 4 devices fit") != std::string::npos);
  // zero = 3: 256 MiB / data from data = 4 on (64 MiB plus the workspace: 64.02 × 1.05 + 576
  // = 643.2 MiB; 2 devices 710.4, one device 256.02 × 1.05 + 512 = 780.8, no communicator).
  Compiled t3(wideModel("8 x H100_SXM { data = 8, zero = 3 }"));
  Relower r3 = t3.relower();
  const Analysis &a3 = *t3.a;
  SolverAnswer yes = solveDevices(a3, r3, limit);
  REQUIRE(yes.ok());
  CHECK(yes.answer == 4);
  CHECK(contains(yes.derivation, "fewest: 4 devices (data = 4, zero = 3)"));
}

// ---- budgets -------------------------------------------------------------------------------

TEST_CASE("budgets: a broken memory budget is an error with computed fixes", "[solvers][budgets]") {
  // The budget is 100 MiB moved by the framework memory (100 × 1.05 + 576 = 681 MiB): the
  // peak is 256.02 × 1.05 + 576 = 844.8 MiB; ZeRO-2 88.02 → 668.4; 4 devices at ZeRO-3 643.2.
  Compiled wide(wideModel("8 x H100_SXM { data = 8, zero = 0 }",
                          "  budget {\n    memory per device <= 681 MiB\n  }\n"));
  std::vector<const Diagnostic *> memory = wide.of(DiagKind::BudgetMemory);
  const Diagnostic *d = memory.empty() ? nullptr : memory.back();
  REQUIRE(d);
  CHECK(d->severity == Severity::Error);
  CHECK(d->line == 14);
  CHECK(d->message.find("peak memory per device 844.8") == 0);
  CHECK(d->message.find("MiB exceeds the budget of 681 MiB") != std::string::npos);
  std::vector<std::string> notes;
  for (const DiagNote &n : d->notes)
    notes.push_back(n.message);
  // ZeRO-2 leaves 4 bytes of params whole and shards 12 over 8: 5.5 B × 16.8M = 88 MiB.
  CHECK(contains(notes, "zero = 2 fits in 668.4"));
  CHECK(contains(notes, "4 × H100_SXM (data = 4, zero = 3) fits in 643.2"));
}

TEST_CASE("budgets: kept budgets say nothing; run time needs tokens", "[solvers][budgets]") {
  Compiled kept(wideModel("8 x H100_SXM { data = 8, zero = 3 }",
                          "  budget {\n    memory per device <= 80 GiB\n  }\n"));
  CHECK(kept.c.diags.errorCount() == 0);

  std::string src = wideModel("H100_SXM", "  budget {\n    run time <= 1 day\n  }\n");
  src.replace(src.find("  tokens = 1B\n"), 13, "");
  Compiled tokenless(src);
  REQUIRE(tokenless.c.diags.errorCount() == 1);
  CHECK(tokenless.c.diags.diagnostics()[0].kind == DiagKind::BudgetRunTime);
  CHECK(tokenless.c.diags.diagnostics()[0].message.find("does not say its training tokens") !=
        std::string::npos);
}

namespace {

/// Eight Linear–GELU–Linear blocks on 2048-token sequences: activations dominate memory.
std::string stackModel(const std::string &extra, const std::string &budget) {
  return "block Layer(d) {\n"
         "  fc   = Linear(d, 4 * d)\n  proj = Linear(4 * d, d)\n"
         "  forward(x) { return x + proj(gelu(fc(x))) }\n}\n"
         "model Stack(d = 1024, layers = 8) {\n  h = repeat(layers) Layer(d)\n"
         "  forward(x: bf16[batch, seq, d]) { return mean(h(x)) }\n}\n"
         "train stack {\n  model = Stack()\n  batch = 256\n  seq = 2048\n  micro_batch = 8\n"
         "  tokens = 10B\n  optimizer = AdamW(lr = 1e-3)\n  precision = mixed_bf16\n" +
         extra + "  target = 2 x H100_SXM { data = 2 }\n  budget {\n    " + budget + "\n  }\n}\n";
}

/// The stack model with checkpoint = auto under a memory budget, its graph part (a fresh walk
/// memo) and its plan without budgets, with a silent engine: for analyzeLayout's candidates.
struct LayoutRig {
  Compiled stack;
  Analysis graphPart;
  llvm::SourceMgr sm;
  DiagnosticEngine quiet{sm};
  Plan plan;
  explicit LayoutRig(const std::string &budget)
      : stack(stackModel("  checkpoint = auto\n", budget)),
        graphPart(analyzeGraph(*stack.a->graph, *stack.a->plan)), plan(*stack.a->plan) {
    quiet.setOutput(nullptr);
    plan.budgets.clear();
  }
};

/// The messages of the notes on every diagnostic of `kind`.
std::vector<std::string> notesOf(const Compiled &compiled, DiagKind kind) {
  std::vector<std::string> out;
  for (const Diagnostic *d : compiled.of(kind))
    for (const DiagNote &n : d->notes)
      out.push_back(n.message);
  return out;
}

} // namespace

TEST_CASE("budgets: memory fixes are true of the plans they name", "[solvers][budgets]") {
  Compiled stack(stackModel("  checkpoint = none\n", "memory per device <= 3 GiB"));
  Relower relower = stack.relower();
  const Analysis &a = *stack.a;
  REQUIRE(a.memory.peak > 3.0 * (1ull << 30));
  std::vector<std::string> notes = notesOf(stack, DiagKind::BudgetMemory);
  REQUIRE_FALSE(notes.empty());
  const double limit = 3.0 * (1ull << 30);
  bool sawCheckpoint = false, sawMicro = false;
  for (const std::string &n : notes) {
    INFO(n);
    Plan p = *stack.c.plan;
    auto at = n.find("checkpoint = ");
    if (at != std::string::npos && n.find(" fits in ") != std::string::npos) {
      p.checkpoint = n.substr(at + 13, n.find(' ', at + 13) - (at + 13));
      sawCheckpoint = true;
    } else if (n.rfind("micro_batch = ", 0) == 0) {
      p.microBatch = std::stoll(n.substr(14));
      sawMicro = true;
      CHECK(p.microBatch < 8);
    } else if (n.rfind("zero = ", 0) == 0) {
      p.parallel.zero = std::stoi(n.substr(7));
    } else {
      continue;
    }
    std::optional<Trial> t = tryPlan(a, p, relower);
    REQUIRE(t);
    CHECK(t->peak <= limit);
  }
  CHECK(sawCheckpoint);
  CHECK(sawMicro);
}

TEST_CASE("budgets: step time and run time propose more devices", "[solvers][budgets]") {
  Compiled stack(stackModel("", "step time <= 200 ms\n    run time <= 1 h"));
  Relower relower = stack.relower();
  const Analysis &a = *stack.a;
  REQUIRE(a.time.step > 0.2);
  std::vector<std::string> step = notesOf(stack, DiagKind::BudgetStepTime);
  std::vector<std::string> run = notesOf(stack, DiagKind::BudgetRunTime);
  REQUIRE(step.size() == 1);
  REQUIRE(run.size() == 1);
  // The fewest devices that meet the budget: the named layout meets it, the next smaller
  // data degree (2, today's) does not.
  CHECK(step[0].rfind("4 × H100_SXM (data = 4, zero = 0) gives a step time of", 0) == 0);
  CHECK(run[0].rfind("4 × H100_SXM (data = 4, zero = 0) gives a run time of", 0) == 0);
  Plan p = *stack.c.plan;
  p.parallel.data = p.parallel.devices = 4;
  std::optional<Trial> t = tryPlan(a, p, relower);
  REQUIRE(t);
  CHECK(t->stepTime <= 0.2);
  CHECK(t->runTime <= 3600);
}

TEST_CASE("budgets: MFU lost to recompute is found again without it", "[solvers][budgets]") {
  Compiled stack(stackModel("  checkpoint = full\n", "mfu >= 35%"));
  Relower relower = stack.relower();
  const Analysis &a = *stack.a;
  REQUIRE(a.time.mfu < 0.35);
  CHECK(contains(notesOf(stack, DiagKind::BudgetMfu), "checkpoint = none (no recompute) reaches MFU"));
}

TEST_CASE("layout: analyzeLayout prices a layout exactly as analyze does", "[solvers][layout]") {
  // The search prices candidates by running only the layout-dependent passes on a copy of the
  // graph-only passes; every number it ranks on must equal the full pipeline's.
  Compiled stack(stackModel("  checkpoint = none\n", "memory per device <= 80 GiB"));
  const Analysis &a = *stack.a;
  Analysis graphPart = analyzeGraph(*a.graph, *a.plan);
  // Every case copies the one graph part, so they share its walks (Analysis::walks): a walk
  // answered for the wrong tensor degree or sequence split would show here.
  struct Case { int64_t t, p, v, d; int zero; const char *ckpt; bool sp = false; };
  for (Case c : {Case{1, 1, 1, 2, 0, "none"}, Case{2, 1, 1, 1, 0, "full"},
                 Case{1, 2, 2, 1, 0, "selective"}, Case{1, 1, 1, 2, 3, "none"},
                 Case{2, 2, 4, 2, 1, "full"}, Case{1, 1, 1, 2, 0, "sqrt"},
                 Case{2, 1, 1, 1, 0, "sqrt"}, Case{2, 1, 1, 1, 0, "sqrt", true},
                 Case{1, 1, 1, 2, 0, "auto"}, Case{2, 1, 1, 1, 0, "auto"},
                 Case{2, 1, 1, 1, 0, "auto", true}, Case{1, 1, 1, 2, 3, "auto"}}) {
    Plan p = *a.plan;
    p.parallel.tensor = c.t, p.parallel.pipeline = c.p, p.parallel.interleave = c.v;
    p.parallel.data = c.d, p.parallel.zero = c.zero, p.parallel.sequenceParallel = c.sp;
    p.parallel.devices = c.t * c.p * c.d;
    p.checkpoint = c.ckpt;
    p.budgets.clear();
    INFO("t " << c.t << " p " << c.p << " v " << c.v << " d " << c.d << " zero " << c.zero
              << " " << c.ckpt << (c.sp ? " sequence parallel" : ""));
    llvm::SourceMgr sm;
    DiagnosticEngine quiet(sm);
    quiet.setOutput(nullptr);
    Analysis full = analyze(*a.graph, p, quiet);
    Analysis part = analyzeLayout(graphPart, p, quiet);
    samePriced(part, full);
  }
  // Tensor degrees 1 and 2, the latter with and without sequence parallelism: three sets of
  // facts, and the repeated policies were answered from the memo.
  WalkMemoStats memo = walkMemoStats(*graphPart.walks);
  CHECK(memo.variants == 3);
  CHECK(memo.reused > 0);
}

TEST_CASE("layout: the search's layouts satisfy the constraints and fit", "[solvers][layout]") {
  Compiled stack(stackModel("  checkpoint = none\n", "memory per device <= 80 GiB"));
  const Analysis &a = *stack.a;
  Relower relower = stack.relower();
  const double limit = 20.0 * (1ull << 30);
  LayoutSearch s = searchLayouts(a, relower, 8, limit);
  REQUIRE(s.error.empty());
  REQUIRE(s.best.size() == 10);
  CHECK(s.layers == 8);
  CHECK(s.heads == 0); // no attention: tensor is bounded by the node only
  for (size_t i = 0; i < s.best.size(); ++i) {
    const ParallelLayout &l = s.best[i];
    INFO("rank " << i + 1);
    CHECK(l.tensor * l.pipeline * l.data == 8);
    CHECK(l.tensor <= a.plan->target.gpusPerNode);
    CHECK(8 % l.pipeline == 0);
    CHECK((8 / l.pipeline) % l.interleave == 0);
    CHECK(a.plan->batch % (l.microBatch * l.data) == 0);
    CHECK(l.trial.peak <= limit);
    if (i > 0)
      CHECK(s.best[i - 1].trial.stepTime <= l.trial.stepTime);
    // The numbers are the full analysis of that plan.
    Plan p = *a.plan;
    p.parallel.tensor = l.tensor, p.parallel.pipeline = l.pipeline;
    p.parallel.interleave = l.interleave, p.parallel.data = l.data, p.parallel.zero = l.zero;
    p.parallel.devices = 8;
    p.microBatch = l.microBatch;
    p.checkpoint = l.checkpoint;
    p.budgets.clear();
    std::optional<Trial> t = tryPlan(a, p, relower);
    REQUIRE(t);
    CHECK(t->peak == Approx(l.trial.peak));
    CHECK(t->stepTime == Approx(l.trial.stepTime));
  }
  // Nothing fits a limit below the model states: an error, no layouts.
  LayoutSearch none = searchLayouts(a, relower, 8, 1e6);
  CHECK(none.best.empty());
  CHECK(none.error.find("no layout of 8") != std::string::npos);
  CHECK(none.analysed == 0);
  // 9 devices: tensor 1 or 3 (9 is past the node of 8), pipeline 1 (3 and 9 do not divide 8
  // layers), so data = 9 or 3, and neither divides the batch of 256.
  LayoutSearch nine = searchLayouts(a, relower, 9, limit);
  CHECK(nine.best.empty());
  CHECK(nine.error.find("do not factor") != std::string::npos);
}

// ---- shared trials -----------------------------------------------------------------------

namespace {

/// A trial's memory and FLOPs, what a memory-only trial has: exactly y's.
void sameMemory(const Trial &x, const Trial &y) {
  CHECK(x.peak == y.peak);
  CHECK(x.activations == y.activations);
  CHECK(x.stepFlops == y.stepFlops);
  CHECK(x.executedFlops == y.executedFlops);
}

void sameTrial(const std::optional<Trial> &x, const std::optional<Trial> &y) {
  REQUIRE(x.has_value() == y.has_value());
  if (!x)
    return;
  // Exact: the shared trial runs the same passes on the same graph as a whole analysis.
  sameMemory(*x, *y);
  CHECK(x->stepTime == y->stepTime);
  CHECK(x->runTime == y->runTime);
  CHECK(x->mfu == y->mfu);
}

} // namespace

TEST_CASE("budgets: the model-states floor is below the peak of every plan it prunes",
          "[solvers][budgets]") {
  // The layout search and the budget fixes skip plans whose floor exceeds the limit, so the
  // floor must never exceed a real peak: any micro-batch, checkpoint, ZeRO stage and expert
  // split (Mixtral's experts are 90% of its weights: counted whole, as the layout search did
  // before, they made the floor of expert = 8 several times its peak).
  for (const char *file : {"gpt2.tally", "llama2_7b.tally", "mixtral_8x7b.tally"}) {
    INFO(file);
    Compiled t(fromFile, example(file));
    Relower relower = t.relower();
    const Analysis &a = *t.a;
    const Plan &base = *t.c.plan;
    for (int zero = 0; zero <= 3; ++zero)
      for (const char *policy : {"none", "full"})
        for (int64_t mb : {int64_t{1}, base.microBatch}) {
          Plan p = base;
          p.parallel.zero = zero;
          p.checkpoint = policy;
          p.microBatch = mb;
          p.microBatchGiven = true;
          INFO("zero " << zero << " " << policy << " micro_batch " << mb);
          std::optional<Trial> tr = tryPlan(a, p, relower);
          REQUIRE(tr);
          double floor = modelStatesFloor(a, p);
          CHECK(floor > 0);
          CHECK(floor <= tr->peak);
        }
  }
}

TEST_CASE("budgets: no micro-batch is lowered when the model states alone break the budget",
          "[solvers][budgets]") {
  Compiled stack(stackModel("  checkpoint = none\n", "memory per device <= 64 MiB"));
  const Analysis &a = *stack.a;
  REQUIRE(modelStatesFloor(a, *a.plan) > 64.0 * (1 << 20));
  std::vector<std::string> notes = notesOf(stack, DiagKind::BudgetMemory);
  bool said = false;
  for (const std::string &n : notes) {
    INFO(n);
    CHECK(n.rfind("micro_batch = ", 0) != 0);
    CHECK(n.find("even micro_batch") == std::string::npos);
    said = said || n.rfind("no micro_batch fits: the model states and framework memory alone need ", 0) == 0;
  }
  CHECK(said);
}

TEST_CASE("solvers: fewest devices analyses no candidate whose model states break the limit",
          "[solvers]") {
  Compiled stack(stackModel("  checkpoint = none\n", "memory per device <= 80 GiB"));
  Relower relower = stack.relower();
  const Analysis &a = *stack.a;
  for (int zero : {0, 3}) {
    INFO("zero " << zero);
    // A limit under every candidate's model states: nothing is analysed.
    {
      AnalysisManager trials(a, relower);
      double limit = 1 << 20;
      auto fits = [&](const Trial &t) { return t.peak <= limit; };
      CHECK_FALSE(fewestDevices(trials, zero, fits, nullptr, true, limit));
      CHECK(trials.layoutsAnalysed() == 0);
    }
    // Limits some candidates meet: the pruned search answers as the full one does.
    for (double gib : {2.0, 4.0, 8.0, 16.0}) {
      INFO(gib << " GiB");
      double limit = gib * (1 << 30);
      auto fits = [&](const Trial &t) { return t.peak <= limit; };
      AnalysisManager pruned(a, relower), full(a, relower);
      std::optional<Candidate> p = fewestDevices(pruned, zero, fits, nullptr, true, limit);
      std::optional<Candidate> f = fewestDevices(full, zero, fits, nullptr, true);
      REQUIRE(p.has_value() == f.has_value());
      if (p) {
        CHECK(p->plan.parallel.devices == f->plan.parallel.devices);
        CHECK(p->trial.peak == f->trial.peak);
      }
      CHECK(pruned.layoutsAnalysed() <= full.layoutsAnalysed());
    }
  }
}

TEST_CASE("solvers: shared trials answer as whole analyses do, each graph once", "[solvers]") {
  for (const char *file : {"gpt2.tally", "llama2_7b.tally", "mixtral_8x7b.tally"}) {
    INFO(file);
    Compiled t(fromFile, example(file));
    Relower relower = t.relower();
    const Analysis &a = *t.a;
    const Plan &base = *t.c.plan;
    AnalysisManager trials(a, relower);
    std::vector<Plan> cands;
    for (const char *policy : {"none", "full", "sqrt", "selective", "auto"}) {
      Plan p = base;
      p.checkpoint = policy;
      cands.push_back(p);
    }
    for (int zero = 0; zero <= 3; ++zero) {
      Plan p = base;
      p.parallel.zero = zero;
      cands.push_back(p);
    }
    // Other data-parallel degrees at the same micro-batch: the same graph and the base's step,
    // whose loss seed (1 / micro-batches per rank) is the base's, not theirs.
    for (int64_t data : {int64_t{1}, 2 * base.parallel.data}) {
      Plan p = base;
      p.parallel.devices = base.parallel.devices / base.parallel.data * data;
      p.parallel.data = data;
      p.target.shareHost(p.parallel.devices);
      p.microBatchGiven = true;
      cands.push_back(p);
    }
    std::vector<int64_t> mbs;
    for (int64_t mb : microBatchCandidates(base))
      if (mb <= 2 * base.microBatch && mbs.size() < 3)
        mbs.push_back(mb);
    for (int64_t mb : mbs) {
      Plan p = base;
      p.microBatch = mb;
      p.microBatchGiven = true;
      cands.push_back(p);
      p.checkpoint = "full";
      cands.push_back(p);
    }
    for (const Plan &p : cands)
      sameTrial(trials.trial(p), tryPlan(a, p, relower));
    int layouts = trials.layoutsAnalysed();
    // One graph per lowering key: the base's micro-batch and each other one, and each loss the
    // layouts' stacks run (ir/Plan.h crossEntropyKernel: ZeRO 3's fsdp and ZeRO 1's deepspeed
    // run PyTorch's eager loss, Megatron its own).
    std::set<std::pair<int64_t, int>> keys{{base.microBatch, static_cast<int>(crossEntropyKernel(base))}};
    for (const Plan &p : cands)
      keys.insert({p.microBatch, static_cast<int>(crossEntropyKernel(p))});
    CHECK(trials.graphsAnalysed() == static_cast<int>(keys.size()));
    // Asked again: answered from memory, no new analysis.
    for (const Plan &p : cands)
      sameTrial(trials.trial(p), tryPlan(a, p, relower));
    CHECK(trials.layoutsAnalysed() == layouts);
    CHECK(layouts < static_cast<int>(cands.size())); // the base's own layout repeats in the list
  }
}

TEST_CASE("solvers: memory-only trials and untimed layouts price what timed ones do",
          "[solvers]") {
  // Issue 41: the memory fixes price memory and FLOPs alone; the layout search prices the
  // time of only the candidates that fit. Both must give the timed analysis's numbers.
  for (const char *file : {"gpt2.tally", "llama2_7b.tally", "mixtral_8x7b.tally"}) {
    INFO(file);
    Compiled t(fromFile, example(file));
    Relower relower = t.relower();
    const Analysis &a = *t.a;
    const Plan &base = *t.c.plan;
    AnalysisManager timed(a, relower), untimed(a, relower);
    untimed.setMemoryOnly(true);
    for (const char *policy : {"none", "full", "sqrt", "selective", "auto"})
      for (int zero = 0; zero <= 3; ++zero) {
        INFO(policy << " zero " << zero);
        Plan p = base;
        p.checkpoint = policy;
        p.parallel.zero = zero;
        std::optional<Trial> full = timed.trial(p), memory = untimed.trial(p);
        REQUIRE(full.has_value() == memory.has_value());
        if (!full)
          continue;
        CHECK(full->timed);
        CHECK(memory->timed == !p.isTrain);
        sameMemory(*memory, *full);
        // An untimed trial does not answer a timed request: it is priced again, timed.
        untimed.setMemoryOnly(false);
        sameTrial(untimed.trial(p), full);
        untimed.setMemoryOnly(true);
        // Memory first, then the time: the timed layout's numbers.
        std::optional<Analysis> later = timed.layout(p, /*timed=*/false);
        REQUIRE(later);
        CHECK(later->timePending == p.isTrain);
        timed.priceTime(*later);
        CHECK_FALSE(later->timePending);
        sameTrial(trialOf(*later), full);
        CHECK(later->time.communication == timed.layout(p)->time.communication);
      }
  }
}

/// bench/gen_layers.py's GPT (d 768, 12 heads) with `layers` blocks and its plan.
std::string deepGpt(int layers) {
  return "block MLP(d, hidden) {\n  fc = Linear(d, hidden)\n  proj = Linear(hidden, d)\n"
         "  forward(x) { return proj(gelu(fc(x))) }\n}\n"
         "block Attn(d, heads) {\n  qkv = Linear(d, 3 * d)\n  proj = Linear(d, d)\n"
         "  forward(x) {\n    q, k, v = split(qkv(x), 3, dim = -1)\n"
         "    return proj(attention(q, k, v, heads = heads, causal = true))\n  }\n}\n"
         "block Block(d, heads) {\n  ln1 = LayerNorm(d)\n  attn = Attn(d, heads)\n  ln2 = LayerNorm(d)\n"
         "  mlp = MLP(d, 4 * d)\n  forward(x) {\n    x = x + attn(ln1(x))\n    return x + mlp(ln2(x))\n  }\n}\n"
         "model Gen(vocab = 50257, ctx = 1024, d = 768, heads = 12, layers = " + std::to_string(layers) + ") {\n"
         "  wte = Embedding(vocab, d)\n  wpe = Embedding(ctx, d)\n  h = repeat(layers) Block(d, heads)\n"
         "  lnf = LayerNorm(d)\n  forward(tokens: i32[batch, seq]) {\n"
         "    x = h(wte(tokens) + wpe(positions(seq)))\n"
         "    return cross_entropy(lnf(x) @ transpose(wte.weight), next_tokens(tokens))\n  }\n}\n"
         "train bench {\n  model = Gen()\n  batch = 512\n  seq = 1024\n  micro_batch = 16\n  tokens = 10B\n"
         "  optimizer = AdamW(lr = 6e-4, betas = (0.9, 0.95), eps = 1e-8, weight_decay = 0.1)\n"
         "  precision = mixed_bf16\n  checkpoint = none\n  target = 8 x H100_SXM { data = 8, zero = 1 }\n}\n";
}

TEST_CASE("layout: the compute bound skips only candidates that cannot be among the best",
          "[solvers][layout]") {
  // The bound reads the op-time sums of an earlier candidate of the same graph, tensor degree,
  // head padding, stack and policy: the search with it must answer exactly as without it. The
  // 120-layer GPT on 16 devices meets layouts whose stacks run another attention kernel (a
  // key without the stack skipped three of its ten best).
  size_t skipped = 0;
  struct Case {
    std::unique_ptr<Compiled> t;
    int64_t devices;
    size_t keep;
  };
  std::vector<Case> cases;
  for (const char *file : {"gpt2.tally", "llama2_7b.tally"})
    cases.push_back({std::make_unique<Compiled>(fromFile, example(file)), 64, 3});
#ifndef TALLY_UNDER_ASAN // 16 of the case's 23 s under the sanitizers; the normal build runs it
  cases.push_back({std::make_unique<Compiled>(deepGpt(120)), 16, 10});
#endif
  for (const Case &c : cases) {
    const Analysis &a = *c.t->a;
    Relower relower = c.t->relower();
    const int64_t devices = c.devices;
    const size_t keep = c.keep;
    {
        INFO(a.plan->name << " on " << devices << " devices, keep " << keep);
        const double limit = a.plan->target.memoryBytes;
        LayoutSearch with = searchLayouts(a, relower, devices, limit, keep, /*bound=*/true);
        LayoutSearch without = searchLayouts(a, relower, devices, limit, keep, /*bound=*/false);
        CHECK(without.unpriced == 0);
        CHECK(with.analysed == without.analysed);
        CHECK(with.fitted == without.fitted);
        CHECK(with.error == without.error);
        REQUIRE(with.best.size() == without.best.size());
        for (size_t i = 0; i < with.best.size(); ++i) {
          const ParallelLayout &x = with.best[i], &y = without.best[i];
          CHECK(x.tensor == y.tensor);
          CHECK(x.pipeline == y.pipeline);
          CHECK(x.interleave == y.interleave);
          CHECK(x.data == y.data);
          CHECK(x.microBatch == y.microBatch);
          CHECK(x.zero == y.zero);
          CHECK(x.checkpoint == y.checkpoint);
          CHECK(x.trial.stepTime == y.trial.stepTime);
          CHECK(x.trial.peak == y.trial.peak);
        }
        skipped += static_cast<size_t>(with.unpriced);
      }
  }
  CHECK(skipped > 0); // the bound did skip candidates here
  // The bound under a pipeline: W/p per micro-batch for m micro-batches and the bubble's
  // (p − 1)/v of it, the balanced pipeline's forward + backward + recompute + bubble.
  CHECK(computeBound(8, 8, 4, 2) == Approx(8.0 / 4 * (8 + 3.0 / 2)));
  CHECK(computeBound(8, 8, 1, 1) == Approx(8.0 * 8));
}

TEST_CASE("layout: a mixture of experts searches the expert degrees a plan could state",
          "[solvers][layout]") {
  // Mixtral (8 experts) on 64 H100s: every layout the search returns has an expert degree
  // dividing the experts and the data degree (ir/Plan.h expertFit, Sema's rule), and is priced
  // as the whole analysis of that plan; the compute bound changes nothing.
  Compiled t(fromFile, example("mixtral_8x7b.tally"));
  const Analysis &a = *t.a;
  Relower relower = t.relower();
  const double limit = a.plan->target.memoryBytes;
  LayoutSearch s = searchLayouts(a, relower, 64, limit);
  REQUIRE(s.error.empty());
  CHECK(s.experts == 8);
  REQUIRE(s.best.size() == 10);
  std::set<int64_t> degrees;
  for (const ParallelLayout &l : s.best) {
    INFO("t " << l.tensor << " p " << l.pipeline << " v " << l.interleave << " d " << l.data << " e " << l.expert);
    degrees.insert(l.expert);
    CHECK(8 % l.expert == 0);
    Plan p = *a.plan;
    p.parallel.tensor = l.tensor, p.parallel.pipeline = l.pipeline, p.parallel.expert = l.expert;
    p.parallel.interleave = l.interleave, p.parallel.data = l.data, p.parallel.zero = l.zero;
    p.parallel.devices = 64;
    p.microBatch = l.microBatch;
    p.checkpoint = l.checkpoint;
    p.budgets.clear();
    CHECK(expertFit(p.parallel) == ExpertFit::Ok);
    std::optional<Trial> whole = tryPlan(a, p, relower);
    REQUIRE(whole);
    CHECK(whole->peak == Approx(l.trial.peak));
    CHECK(whole->stepTime == Approx(l.trial.stepTime));
  }
  CHECK(degrees.size() > 1); // the plan's expert = 8 is not the only degree among the best
#ifndef TALLY_UNDER_ASAN // a second 13,885-candidate search: 3 s under the sanitizers; the normal build runs it
  LayoutSearch unbounded = searchLayouts(a, relower, 64, limit, 10, /*bound=*/false);
  REQUIRE(unbounded.best.size() == s.best.size());
  for (size_t i = 0; i < s.best.size(); ++i) {
    CHECK(unbounded.best[i].expert == s.best[i].expert);
    CHECK(unbounded.best[i].trial.stepTime == s.best[i].trial.stepTime);
  }
#endif
  // A dense model searches no expert degree.
  Compiled dense(fromFile, example("gpt2.tally"));
  Relower denseRelower = dense.relower();
  LayoutSearch d = searchLayouts(*dense.a, denseRelower, 8, dense.a->plan->target.memoryBytes, 3);
  CHECK(d.experts == 0);
  for (const ParallelLayout &l : d.best)
    CHECK(l.expert == 1);
}

TEST_CASE("layout: a deep model's candidates priced alone equal whole analyses", "[solvers][layout]") {
  // A candidate priced alone is walked as a comparison walk, periodic where 16 or more copies
  // are alike (passes/ActivationPeriodic.cpp), with its Recompute steps listed from the
  // policy; the whole analysis walks every step. Peak, recompute and step time must agree.
  Compiled t(deepGpt(32));
  const Analysis &a = *t.a;
  Analysis graphPart = analyzeGraph(*a.graph, *a.plan);
  for (int64_t tensor : {1, 2})
    for (int64_t pipeline : {1, 4})
      for (int zero : {0, 3})
        for (const char *policy : {"none", "selective", "selective_wide", "full", "sqrt"}) {
          Plan p = *a.plan;
          p.parallel.tensor = tensor, p.parallel.pipeline = pipeline, p.parallel.interleave = pipeline > 1 ? 2 : 1;
          p.parallel.data = 2, p.parallel.zero = zero, p.parallel.devices = tensor * pipeline * 2;
          p.checkpoint = policy; // the micro-batch the graph was lowered for (16)
          INFO("tensor " << tensor << " pipeline " << pipeline << " zero " << zero << " " << policy);
          llvm::SourceMgr sm;
          DiagnosticEngine quiet(sm);
          quiet.setOutput(nullptr);
          Analysis full = analyze(*a.graph, p, quiet);
          Analysis part = analyzeLayout(graphPart, p, quiet, /*timed=*/false);
          CHECK(part.timePending);
          priceLayoutTime(part, quiet);
          samePriced(part, full);
        }
  CHECK(walkMemoStats(*graphPart.walks).reused > 0);
}

TEST_CASE("layout: candidates reading kept layout facts and op times price as those making them",
          "[solvers][layout]") {
  // Issue 41: the layout search keeps the walks' layout facts and the step time's per-op times
  // of its last layouts (AnalysisManager::keepLayoutFacts) for the candidates that differ only
  // in pipeline, interleave, data, ZeRO, micro-batch count or policy. Every number of every
  // candidate must be what a manager keeping nothing prices; three entries kept (the three
  // tensor degrees of one layout), so that entries are dropped and made again as the layouts
  // change.
  for (const char *file : {"gpt2.tally", "llama2_7b.tally", "mixtral_8x7b.tally"}) {
    INFO(file);
    Compiled t(fromFile, example(file));
    Relower relower = t.relower();
    const Analysis &a = *t.a;
    const Plan &base = *a.plan;
    AnalysisManager kept(a, relower, SIZE_MAX), alone(a, relower, SIZE_MAX);
    kept.keepLayoutFacts(3);
    int64_t layers = a.checkpoint.blocks;
    int compared = 0;
    // The tensor degree innermost: candidates in turn then differ in it alone, and an entry
    // read for another degree's split would show.
    for (int64_t pipeline : {1, 2})
      for (int64_t interleave : {1, 2})
        for (int zero = 0; zero <= 3; ++zero)
          for (int64_t micro : {1, 2})
            for (const char *policy : {"none", "selective", "full"})
              for (int64_t tensor : {1, 2, 4}) {
                if ((pipeline == 1 && interleave > 1) || layers % (pipeline * interleave) != 0 ||
                    base.batch % (2 * micro) != 0)
                  continue;
                Plan p = base;
                p.parallel.tensor = tensor, p.parallel.pipeline = pipeline;
                p.parallel.interleave = interleave, p.parallel.data = 2, p.parallel.zero = zero;
                p.parallel.devices = tensor * pipeline * 2 * std::max<int64_t>(1, p.parallel.context);
                p.microBatch = micro, p.microBatchGiven = true;
                p.checkpoint = policy;
                INFO("tensor " << tensor << " pipeline " << pipeline << " interleave " << interleave
                               << " zero " << zero << " micro " << micro << " " << policy);
                std::optional<Analysis> x = kept.layout(p, /*timed=*/false), y = alone.layout(p, false);
                REQUIRE(x.has_value() == y.has_value());
                if (!x)
                  continue;
                kept.priceTime(*x);
                alone.priceTime(*y);
                ++compared;
                samePriced(*x, *y);
                REQUIRE(x->ops.size() == y->ops.size());
                size_t differ = 0;
                for (size_t i = 0; i < x->ops.size(); ++i)
                  differ += !OpTable::same(x->ops[i], y->ops[i]);
                CHECK(differ == 0);
              }
    CHECK(compared > 20);
    CHECK(kept.layoutFactsReused() > 0);
    CHECK(kept.opTimesReused() > 0);
    CHECK(kept.rooflineReused() > 0);
    CHECK(alone.layoutFactsMade() + alone.opTimesMade() == 0);
  }
}

TEST_CASE("solvers: a graph part of an equal plan takes the step it is given", "[solvers]") {
  Compiled t(fromFile, example("gpt2.tally"));
  const Analysis &a = *t.a;
  Plan p = *a.plan;
  CHECK(sameStep(p, *a.plan));
  Analysis part = analyzeGraph(*a.graph, p, a.step);
  CHECK(part.step == a.step); // not built again
  CHECK(part.flops.backward == a.flops.backward);
  CHECK(part.flops.executed == analyzeGraph(*a.graph, p).flops.executed);
  // What the step is made of differs: another optimizer, gradient dtype or loss scaling.
  Plan sgd = p;
  sgd.optimizer = *optimizerPreset("SGD");
  CHECK_FALSE(sameStep(sgd, p));
  Plan grads = p;
  grads.precision.grads = p.precision.grads == Dtype::F32 ? Dtype::BF16 : Dtype::F32;
  CHECK_FALSE(sameStep(grads, p));
  Plan scaled = p;
  scaled.precision.lossScaling = !p.precision.lossScaling;
  CHECK_FALSE(sameStep(scaled, p));
  Plan infer = p;
  infer.isTrain = false;
  CHECK_FALSE(sameStep(infer, p));
}

TEST_CASE("solvers: bisected fewest devices equal the linear search where fitting is monotone",
          "[solvers]") {
  for (const char *file : {"gpt2.tally", "llama2_7b.tally", "mixtral_8x7b.tally"}) {
    INFO(file);
    Compiled t(fromFile, example(file));
    Relower relower = t.relower();
    AnalysisManager trials(*t.a, relower);
    // Limits from the static memory of one device up past the current peak: some fit with few
    // devices, some with many, some never.
    double peak = t.a->memory.peak;
    for (double share : {0.05, 0.2, 0.5, 0.9, 1.0, 1.5}) {
      double limit = peak * share;
      INFO("limit " << limit);
      auto fits = [&](const Trial &x) { return x.peak <= limit; };
      for (int zero : {t.c.plan->parallel.zero, 3}) {
        std::optional<Candidate> linear = fewestDevices(trials, zero, fits);
        std::vector<Candidate> all; // every candidate degree, ascending
        fewestDevices(trials, zero, [](const Trial &) { return false; }, &all);
        // Fitting is monotone here: once a degree fits, every larger one does.
        bool seen = false;
        for (const Candidate &c : all) {
          seen = seen || fits(c.trial);
          CHECK((!seen || fits(c.trial)));
        }
        std::vector<Candidate> bisected;
        std::optional<Candidate> b = fewestDevices(trials, zero, fits, &bisected, true);
        REQUIRE(linear.has_value() == b.has_value());
        if (linear)
          CHECK(b->plan.parallel.data == linear->plan.parallel.data);
        CHECK(bisected.size() <= 1 + static_cast<size_t>(std::ceil(std::log2(all.size()))));
      }
    }
  }
}

TEST_CASE("solvers: one memory limit per plan: the device's memory or a smaller budget",
          "[solvers]") {
  Plan p;
  CHECK(memoryLimit(p) == 0); // nothing known
  p.target.memoryBytes = 80e9;
  CHECK(memoryLimit(p) == 80e9);
  BudgetSpec mem;
  mem.metric = BudgetMetric::MemoryPerDevice;
  mem.value = 40e9;
  p.budgets.push_back(mem);
  CHECK(memoryLimit(p) == 40e9);
  mem.value = 100e9; // a budget above the device's memory does not raise it
  p.budgets.push_back(mem);
  CHECK(memoryLimit(p) == 40e9);
  BudgetSpec atLeast = mem; // a lower bound on memory limits nothing
  atLeast.atMost = false;
  atLeast.value = 1e9;
  p.budgets.push_back(atLeast);
  CHECK(memoryLimit(p) == 40e9);
  p.target.memoryBytes = 0; // no device memory known: the budgets alone
  CHECK(memoryLimit(p) == 40e9);
}

TEST_CASE("budgets: a what-if analysis checks no budget and draws no curve", "[solvers][budgets]") {
  Compiled stack(stackModel("  checkpoint = none\n", "memory per device <= 3 GiB"));
  const Analysis &a = *stack.a;
  REQUIRE(a.wanted(Result::Budgets));
  REQUIRE_FALSE(stack.of(DiagKind::BudgetMemory).empty()); // the plan breaks its budget
  CHECK_FALSE(a.checkpoint.curve.empty());
  // The same plan as a solver's candidate: the same numbers, no budget error (its fixes would
  // search again), no curve.
  llvm::SourceMgr sm;
  DiagnosticEngine quiet(sm);
  quiet.setOutput(nullptr);
  Analysis w = analyze(*a.graph, *a.plan, quiet, stack.relower(), Results::whatIf());
  CHECK_FALSE(w.wanted(Result::Budgets));
  CHECK(w.memory.peak == a.memory.peak);
  CHECK(w.time.step == a.time.step);
  CHECK(quiet.diagnostics().empty());
  CHECK(w.checkpoint.curve.empty());
  // As `tally check` analyses (Results::check): the same numbers and budget error, no curve.
  DiagnosticEngine checked(sm);
  checked.setOutput(nullptr);
  Analysis c = analyze(*a.graph, *a.plan, checked, stack.relower(), test::checkOptions());
  CHECK(c.memory.peak == a.memory.peak);
  CHECK(c.time.step == a.time.step);
  CHECK(checked.diagnostics().size() == stack.c.diags.diagnostics().size());
  CHECK(c.checkpoint.curve.empty());
}

TEST_CASE("budgets: auto's budget note reads the curve, so check draws it for auto",
          "[solvers][budgets]") {
  Compiled stack(stackModel("  checkpoint = auto\n", "memory per device <= 3 GiB"));
  const Analysis &a = *stack.a;
  REQUIRE_FALSE(a.checkpoint.curve.empty());
  llvm::SourceMgr sm;
  DiagnosticEngine checked(sm);
  checked.setOutput(nullptr);
  Analysis c = analyze(*a.graph, *a.plan, checked, stack.relower(), test::checkOptions());
  CHECK(c.checkpoint.curve.size() == a.checkpoint.curve.size());
  CHECK(c.memory.peak == a.memory.peak);
}

TEST_CASE("solvers: plans with one lowering key lower to one graph", "[solvers]") {
  Compiled t(fromFile, example("gpt2.tally"));
  Relower relower = t.relower();
  const Plan &base = *t.c.plan;
  auto text = [](const Graph &g) {
    std::string s;
    llvm::raw_string_ostream os(s);
    printGraph(g, os); // shapes by name ([batch, seq, 768]): the sizes too
    for (const Tensor &x : g.tensors)
      os << Graph::formatSizes(x.shape) << "\n";
    return os.str();
  };
  std::string baseText = text(t.g());
  // What lowering does not read: the batch, the layout, the checkpoint policy, the target.
  Plan same = base;
  same.batch *= 2;
  same.parallel.data *= 2;
  same.parallel.zero = 3;
  same.checkpoint = "full";
  CHECK(loweringKey(same) == loweringKey(base));
  std::optional<Graph> g1 = relower(same);
  REQUIRE(g1);
  CHECK(text(*g1) == baseText);
  // What it reads: the micro-batch (`batch` in the model), `seq`, the dtypes.
  for (int which = 0; which < 3; ++which) {
    Plan other = base;
    if (which == 0)
      other.microBatch *= 2;
    else if (which == 1)
      other.seq /= 2;
    else
      other.precision.activations = Dtype::F32;
    CHECK(loweringKey(other) != loweringKey(base));
    std::optional<Graph> g2 = relower(other);
    REQUIRE(g2);
    CHECK(text(*g2) != baseText);
  }
}

TEST_CASE("solvers: bisected largest micro-batch equals the linear search", "[solvers]") {
  for (const char *file : {"gpt2.tally", "llama2_7b.tally"}) {
    INFO(file);
    Compiled t(fromFile, example(file));
    Relower relower = t.relower();
    AnalysisManager trials(*t.a, relower);
    const int64_t below = t.c.plan->microBatch; // the fix notes' bound: smaller than today's
    double peak = t.a->memory.peak;
    for (double share : {0.1, 0.3, 0.5, 0.7, 0.9, 1.2}) {
      double limit = peak * share;
      INFO("limit " << limit);
      std::vector<std::pair<int64_t, double>> all;
      std::optional<Candidate> linear = largestMicroBatch(trials, limit, below, &all);
      // The peak grows with the micro-batch here (all: largest first).
      for (size_t i = 1; i < all.size(); ++i)
        CHECK(all[i].second <= all[i - 1].second);
      std::vector<std::pair<int64_t, double>> bis;
      std::optional<Candidate> b = largestMicroBatch(trials, limit, below, &bis, true);
      REQUIRE(linear.has_value() == b.has_value());
      if (linear)
        CHECK(b->plan.microBatch == linear->plan.microBatch);
      else
        CHECK(bis.back().first == all.back().first); // the smallest, for "even ... needs"
    }
  }
}

TEST_CASE("layout: auto's chain is solved once per graph, facts and unit", "[solvers][layout]") {
  // At 3 GiB no single level fits, so auto tries the chain program (nestedPolicy). The budget
  // fixes then try auto again under other ZeRO stages (other limits): the chain's parts come
  // from the walk memo's variant, and while the unit (an eighth of the smallest stage input)
  // stays, the program solved for the largest budget so far serves each smaller one.
  LayoutRig rig("memory per device <= 3 GiB");
  const Analysis &a = *rig.stack.a;
  Analysis &graphPart = rig.graphPart;
  DiagnosticEngine &quiet = rig.quiet;
  Plan p = rig.plan;
  p.target.memoryBytes = 3.0 * (1ull << 30);
  std::vector<Analysis> shared;
  for (int zero : {3, 2, 1, 0}) { // largest limit first: one solve serves the rest
    p.parallel.zero = zero;
    shared.push_back(analyzeLayout(graphPart, p, quiet));
  }
  WalkMemoStats stats = walkMemoStats(*graphPart.walks);
  REQUIRE(stats.chainSolves >= 1); // auto reached the chain program
  CHECK(stats.chainSolves == 1);
  // Each answer is the one a fresh analysis (its own memo, its own solve) gives.
  for (int zero : {3, 2, 1, 0}) {
    INFO("zero " << zero);
    p.parallel.zero = zero;
    const Analysis &s = shared[static_cast<size_t>(3 - zero)];
    Analysis fresh = analyze(*a.graph, p, quiet);
    CHECK(s.checkpoint.policy == fresh.checkpoint.policy);
    CHECK(s.memory.peak == fresh.memory.peak);
    CHECK(s.flops.recompute == fresh.flops.recompute);
    CHECK(s.time.step == fresh.time.step);
  }
}

TEST_CASE("layout: a policy is walked once per graph and facts", "[solvers][layout]") {
  LayoutRig rig("memory per device <= 24 GiB");
  Compiled &stack = rig.stack;
  const Analysis &a = *stack.a;
  Analysis &graphPart = rig.graphPart;
  DiagnosticEngine &quiet = rig.quiet;
  Plan p = rig.plan;
  Analysis first = analyzeLayout(graphPart, p, quiet);
  WalkMemoStats once = walkMemoStats(*graphPart.walks);
  CHECK(once.variants == 1);
  // auto's curve walks the first m = 0..8 of the 8 copies (9 policies); its bisections ask for
  // some of them again, which the memo answers.
  CHECK(once.walks >= 9);
  CHECK(once.reused > 0);
  // Another ZeRO stage changes the limit, not what a walk reads: every walk is reused.
  p.parallel.zero = 3;
  Analysis second = analyzeLayout(graphPart, p, quiet);
  WalkMemoStats again = walkMemoStats(*graphPart.walks);
  CHECK(again.variants == 1);
  CHECK(again.reused >= once.walks / 2);
  // ... and the answers are a whole analysis's.
  Analysis full = analyze(*a.graph, p, quiet);
  CHECK(second.memory.peak == full.memory.peak);
  CHECK(second.checkpoint.policy == full.checkpoint.policy);
  CHECK(second.flops.executed == full.flops.executed);
  CHECK(second.time.step == full.time.step);
  // The facts' graph part (readers, savers, saved lists) was built once for both layouts; a
  // tensor-parallel layout reads it too (its own variant: other splits) and still gets a
  // whole analysis's answers.
  CHECK(walkMemoStats(*graphPart.walks).structures == 1);
  Plan tp = rig.plan;
  tp.parallel.tensor = 2;
  tp.parallel.devices = 4;
  Analysis split = analyzeLayout(graphPart, tp, quiet);
  CHECK(walkMemoStats(*graphPart.walks).structures == 1);
  CHECK(walkMemoStats(*graphPart.walks).variants == 2);
  Analysis splitFull = analyze(*a.graph, tp, quiet);
  CHECK(split.memory.peak == splitFull.memory.peak);
  CHECK(split.checkpoint.policy == splitFull.checkpoint.policy);
  CHECK(split.time.step == splitFull.time.step);
  // Another GPU changes every op's roofline time, which a walk reads (the recompute seconds):
  // a third variant, again with a whole analysis's answers.
  Plan other = rig.plan;
  const Target *a100 = findTarget("A100_80GB");
  REQUIRE(a100);
  other.target = *a100;
  Analysis onA100 = analyzeLayout(graphPart, other, quiet);
  CHECK(walkMemoStats(*graphPart.walks).variants == 3);
  Analysis a100Full = analyze(*a.graph, other, quiet);
  CHECK(onA100.memory.peak == a100Full.memory.peak);
  CHECK(onA100.checkpoint.policy == a100Full.checkpoint.policy);
  CHECK(onA100.flops.recompute == a100Full.flops.recompute);
  CHECK(onA100.time.step == a100Full.time.step);
  // The same plan again finds its variant: no fourth.
  analyzeLayout(graphPart, other, quiet);
  CHECK(walkMemoStats(*graphPart.walks).variants == 3);
  // The base analysis's walks serve the fix trials of its own graph.
  CHECK(walkMemoStats(*a.walks).walks > 0);
  AnalysisManager trials(a, stack.relower());
  Plan q = *a.plan;
  q.parallel.zero = 3;
  size_t before = walkMemoStats(*a.walks).reused;
  sameTrial(trials.trial(q), tryPlan(a, q, stack.relower()));
  CHECK(walkMemoStats(*a.walks).reused > before);
}

TEST_CASE("budgets: a checkpoint candidate takes the base's graph part as made",
          "[solvers][budgets]") {
  // Issue 41: `check` keeps its graph part as made (Analysis::graphOnly: compact step, before
  // any layout pass), and a fix search's candidate that differs from the plan only in its
  // checkpoint policy takes it instead of analysing the graph again. Its trials, timed and
  // memory-only (which make no schedule: Analysis::scheduleUnread), are a whole analysis's.
  for (const char *file : {"gpt2.tally", "llama2_7b.tally"}) {
    INFO(file);
    Compiled t(fromFile, example(file));
    Relower relower = t.relower();
    const Plan &base = *t.c.plan;
    Analysis a = *t.a;
    auto part = std::make_shared<Analysis>(
        analyzeGraph(*a.graph, base, nullptr, /*compactStep=*/true, /*prepare=*/true));
    part->step.reset();
    part->params.byBlock.clear();
    a.graphOnly = part;
    for (bool memoryOnly : {false, true}) {
      AnalysisManager trials(a, relower);
      trials.setMemoryOnly(memoryOnly);
      for (const char *policy : {"none", "full", "sqrt", "selective", "auto"}) {
        INFO(policy << (memoryOnly ? " memory only" : " timed"));
        Plan p = base;
        p.checkpoint = policy;
        std::optional<Trial> shared = trials.trial(p, /*checkpointOnly=*/true);
        std::optional<Trial> whole = tryPlan(*t.a, p, relower);
        REQUIRE(shared.has_value() == whole.has_value());
        if (!shared)
          continue;
        if (memoryOnly)
          sameMemory(*shared, *whole);
        else
          sameTrial(shared, whole);
      }
      CHECK(trials.graphsAnalysed() == 1);
    }
  }
}
