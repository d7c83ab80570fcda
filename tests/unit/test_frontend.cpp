// test_frontend.cpp — unit tests for the frontend: the parser (units glued and separate,
// device counts, newline-separated settings, locations after non-ASCII comments, syntax
// recovery), Sema's constant evaluation (exact integers, units, overflow), and lowering
// (tied weights counted once, repeat paths, broadcasting, op paths and locations).
#include <catch.hpp>

#include <cstdint>
#include <set>
#include <string>

#include "driver/Compiler.h"
#include "ir/Units.h"
#include "passes/Passes.h"

using namespace tally;

namespace {

/// A compilation whose diagnostics go to a string instead of stderr.
struct Quiet {
  Compilation c;
  std::string out;
  llvm::raw_string_ostream os{out};

  Quiet() {
    c.diags.setOutput(&os);
    c.diags.setShowColors(false);
  }
  /// Parses `text` as the file "t.tally"; true when it has no errors.
  bool add(llvm::StringRef text) { return c.addSource("t.tally", text); }
  std::string printed() {
    os.flush();
    return out;
  }
  /// Codes of every recorded diagnostic, space-separated: "syntax-error unknown-name".
  std::string codes() const {
    std::string s;
    for (const Diagnostic &d : c.diags.diagnostics())
      s += (s.empty() ? "" : " ") + codeOf(d.kind).str();
    return s;
  }
  const Module &module() const { return *c.program.modules.back(); }
  /// Lowers and analyzes the first (or named) plan.
  std::optional<Analysis> analyze(llvm::StringRef plan = "") {
    const PlanDecl *p = c.pickPlan(plan);
    if (!p)
      return std::nullopt;
    return c.analyzePlan(*p);
  }
};

/// Evaluates the constant expression `expr` (written as a target setting so that the parser
/// accepts any constant) in a fresh compilation.
struct Eval {
  Quiet q;
  ConstValue v;
  explicit Eval(const std::string &expr) {
    REQUIRE(q.add("target T {\n  v = " + expr + "\n}\n"));
    ConstEnv env;
    v = q.c.sema.eval(*q.module().targets.at(0)->settings.at(0).value, env);
  }
};

/// A model with the lecture's DeepLinear shape, for lowering tests.
const char *kDeepLinearModule = R"(
model M(d = 8) {
  param w: [d, d]
  forward(x: f32[batch, d]) { return mean(x @ w) }
}
train t { model = M() batch = 4 target = H100_SXM }
)";

} // namespace

// ---- parser -------------------------------------------------------------------------------

TEST_CASE("units glued to the number and written apart mean the same", "[frontend][parser]") {
  struct Case {
    const char *glued, *apart;
    UnitDim dim;
    double value;
  } cases[] = {
      {"80GiB", "80 GiB", UnitDim::Bytes, 80.0 * 1024 * 1024 * 1024},
      {"40GB", "40 GB", UnitDim::Bytes, 40e9},
      {"3.35TB/s", "3.35 TB/s", UnitDim::ByteRate, 3.35e12},
      {"989TFLOP/s", "989 TFLOP/s", UnitDim::FlopRate, 989e12},
      {"500ms", "500 ms", UnitDim::Time, 0.5},
      {"2days", "2 days", UnitDim::Time, 2 * 86400.0},
  };
  for (const Case &k : cases) {
    INFO(k.glued << " / " << k.apart);
    Eval g(k.glued), a(k.apart);
    REQUIRE(g.v.kind == ConstValue::Number);
    REQUIRE(a.v.kind == ConstValue::Number);
    CHECK(g.v.dim == k.dim);
    CHECK(a.v.dim == k.dim);
    CHECK(g.v.number == Approx(k.value).epsilon(1e-15));
    CHECK(a.v.number == g.v.number);
  }
}

TEST_CASE("count suffixes and percentages", "[frontend][parser]") {
  Eval b("10B"), t("2T"), k("512K"), p("40%"), f("1.5T");
  CHECK(b.v.dim == UnitDim::None);
  CHECK(b.v.isInteger);
  CHECK(b.v.intValue == 10'000'000'000);
  CHECK(t.v.intValue == 2'000'000'000'000);
  CHECK(k.v.intValue == 512'000);
  CHECK(f.v.intValue == 1'500'000'000'000);
  CHECK(p.v.dim == UnitDim::Ratio);
  CHECK(p.v.number == Approx(0.4));
}

TEST_CASE("a glued rate needs /s written without spaces", "[frontend][parser]") {
  // `10GB/s` is a byte rate; `10GB / s` divides bytes by the word s, which is an error.
  Eval rate("10GB/s");
  CHECK(rate.v.dim == UnitDim::ByteRate);
  CHECK(rate.v.number == 10e9);
  Eval bytes("10B/s"); // B/s: bytes per second, not a count of 10 billion
  CHECK(bytes.v.dim == UnitDim::ByteRate);
  CHECK(bytes.v.number == 10);
  Eval div("10GB / s");
  CHECK(div.v.kind == ConstValue::Invalid);
  CHECK(div.q.codes() == "type-mismatch");
}

TEST_CASE("N x TARGET { record } is a device spec, with x apart or glued", "[frontend][parser]") {
  for (const char *spec : {"8 x H100_SXM { data = 8, zero = 1 }", "8x H100_SXM { data = 8, zero = 1 }"}) {
    INFO(spec);
    Quiet q;
    REQUIRE(q.add(std::string(kDeepLinearModule) + "train d { model = M() batch = 8 target = " + spec + " }\n"));
    const PlanDecl &p = *q.module().plans.at(1);
    const Expr &e = *p.settings.back().value;
    REQUIRE(e.kind == ExprKind::Device);
    CHECK(e.number == 8);
    CHECK(e.suffix.empty());
    CHECK(e.text == "H100_SXM");
    REQUIRE(e.lhs);
    CHECK(e.lhs->argNames == std::vector<std::string>{"data", "zero"});
    auto plan = q.c.sema.resolvePlan(q.c.program, p, {});
    REQUIRE(plan);
    CHECK(plan->parallel.devices == 8);
    CHECK(plan->parallel.data == 8);
    CHECK(plan->parallel.zero == 1);
    CHECK(plan->target.name == "H100_SXM");
  }
}

TEST_CASE("settings on separate lines need no separator", "[frontend][parser]") {
  Quiet q;
  REQUIRE(q.add(std::string(kDeepLinearModule) + R"(
train s {
  model = M()
  batch = 512
  seq = 1024
  tokens = 10B
  target = H100_SXM
}
)"));
  const PlanDecl &p = *q.module().plans.at(1);
  REQUIRE(p.settings.size() == 5);
  CHECK(p.settings[1].key == "batch");
  CHECK(p.settings[1].value->unit.empty()); // `seq` on the next line is not a unit of 512
  CHECK(p.settings[2].key == "seq");
  CHECK(p.settings[3].value->suffix == "B");
  // On one line too, as long as a setting cannot be read as a unit: `8 seq =` is not 8 seq.
  Quiet one;
  REQUIRE(one.add(std::string(kDeepLinearModule) + "train o { model = M() batch = 8 seq = 16 target = H100_SXM }\n"));
  CHECK(one.module().plans.at(1)->settings.size() == 4);
}

TEST_CASE("non-ASCII comments keep diagnostic locations right", "[frontend][parser]") {
  // Columns count bytes, as clang's do: `·` is two bytes in UTF-8.
  Quiet q;
  CHECK_FALSE(q.add("// Forward FLOPs = 2·B·D·K — für alle\n"
                    "model M() {\n"
                    "  /* 2·B */ y = @\n"
                    "}\n"));
  REQUIRE(q.c.diags.diagnostics().size() == 1);
  const Diagnostic &d = q.c.diags.diagnostics()[0];
  CHECK(d.kind == DiagKind::SyntaxError);
  CHECK(d.line == 3);
  CHECK(d.column == 18);
  CHECK(*d.loc.getPointer() == '@'); // the location is the offending character itself

  // A name after a non-ASCII comment on an earlier line: unknown in Sema, located exactly.
  Quiet n;
  REQUIRE(n.add("// w ∈ ℝ^{d×d}, 2·B·D·K\n"
                "model M(d = 4) { /* é */ param w: [d, d]\n"
                "  forward(x: f32[batch, d]) { return mean(x @ wx) } // ∑\n"
                "}\n"
                "train t { model = M() batch = 2 target = H100_SXM }\n"));
  CHECK_FALSE(n.analyze());
  REQUIRE(n.c.diags.diagnostics().size() == 1);
  const Diagnostic &u = n.c.diags.diagnostics()[0];
  CHECK(u.kind == DiagKind::UnknownName);
  CHECK(u.line == 3);
  CHECK(u.column == 47);
  CHECK(llvm::StringRef(u.loc.getPointer(), 2) == "wx");
}

TEST_CASE("syntax errors are all reported, each once", "[frontend][parser]") {
  Quiet q;
  CHECK_FALSE(q.add("model M(d = 4) {\n"
                    "  param w: [d, d\n"
                    "  forward(x) { y = x @@ w }\n"
                    "}\n"
                    "block B( { }\n"));
  CHECK(q.codes() == "syntax-error syntax-error syntax-error");
  std::set<unsigned> lines;
  for (const Diagnostic &d : q.c.diags.diagnostics())
    lines.insert(d.line);
  CHECK(lines == std::set<unsigned>{3, 5}); // two on line 3 (forward; @@), one on line 5
}

TEST_CASE("bytes that could hurt the parser are refused first", "[frontend][parser]") {
  Quiet nul;
  CHECK_FALSE(nul.add(llvm::StringRef("model M() {}\n\0\n", 15)));
  CHECK(nul.codes() == "nul-byte");
  Quiet utf8;
  CHECK_FALSE(utf8.add("model M() { } // caf\xe9\n"));
  CHECK(utf8.codes() == "invalid-utf8");
  Quiet deep;
  CHECK_FALSE(deep.add("model M(d = " + std::string(20000, '(') + "1" + std::string(20000, ')') +
                       ") { }\n"));
  CHECK(deep.codes() == "nesting-too-deep");
}

TEST_CASE("the AST keeps what was written", "[frontend][parser]") {
  Quiet q;
  REQUIRE(q.add(R"(
model G(d = 8) {
  h = repeat(2) Linear(d, d, bias = false)
  forward(tokens: i32[batch, seq]) {
    q, k = split(h[1](tokens), 2, dim = -1)
    return q
  }
}
)"));
  const BlockDecl &b = *q.module().blocks.at(0);
  CHECK(b.isModel);
  CHECK(b.name == "G");
  REQUIRE(b.items.size() == 2);
  const Expr &rep = *b.items[0]->value;
  REQUIRE(rep.kind == ExprKind::Repeat);
  CHECK(rep.args[0]->number == 2);
  CHECK(rep.lhs->argNames == std::vector<std::string>{"", "", "bias"});
  const ForwardAST &f = *b.items[1]->forward;
  REQUIRE(f.params.size() == 1);
  CHECK(f.params[0].type->dtype == "i32");
  REQUIRE(f.body.size() == 2);
  CHECK(f.body[0]->targets == std::vector<std::string>{"q", "k"});
  const Expr &call = *f.body[0]->value;
  CHECK(call.argNames == std::vector<std::string>{"", "", "dim"});
  CHECK(call.args[0]->lhs->kind == ExprKind::Index); // h[1](tokens)
}

// ---- Sema: constants, units, overflow -----------------------------------------------------

TEST_CASE("integer arithmetic is exact in int64", "[frontend][sema]") {
  Eval big("9007199254740993"); // 2^53 + 1: not a double
  REQUIRE(big.v.isInteger);
  CHECK(big.v.intValue == 9007199254740993LL);
  Eval max("9223372036854775807");
  CHECK(max.v.intValue == INT64_MAX);
  Eval sum("9007199254740993 + 2");
  CHECK(sum.v.intValue == 9007199254740995LL);
  Eval prod("3037000499 * 3037000499"); // just below 2^63
  CHECK(prod.v.intValue == 9223372030926249001LL);
  Eval pow("4096 * 4096 * 4096 * 4096");
  CHECK(pow.v.intValue == (int64_t(1) << 48));
  Eval div("4096 / 32 * 8");
  CHECK(div.v.isInteger);
  CHECK(div.v.intValue == 1024);
  Eval uneven("10 / 4"); // not truncated to 2
  CHECK_FALSE(uneven.v.isInteger);
  CHECK(uneven.v.number == 2.5);
  Eval neg("-(3 - 5)");
  CHECK(neg.v.intValue == 2);
}

TEST_CASE("integer overflow is an error, never a wrapped value", "[frontend][sema]") {
  Eval mul("4000000000 * 4000000000");
  CHECK(mul.v.kind == ConstValue::Invalid);
  CHECK(mul.q.codes() == "overflow");
  Eval add("9223372036854775807 + 1");
  CHECK(add.q.codes() == "overflow");
  Eval lit("9223372036854775808");
  CHECK(lit.q.codes() == "overflow");
  Eval huge("1e400");
  CHECK(huge.q.codes() == "overflow");
  Eval zero("5 / (2 - 2)");
  CHECK(zero.q.codes() == "division-by-zero");
}

TEST_CASE("units combine by dimension", "[frontend][sema]") {
  Eval sum("80 GiB + 1 GB");
  CHECK(sum.v.dim == UnitDim::Bytes);
  CHECK(sum.v.number == 80.0 * (1 << 30) + 1e9);
  Eval scaled("2 * 3.35 TB/s");
  CHECK(scaled.v.dim == UnitDim::ByteRate);
  CHECK(scaled.v.number == Approx(6.7e12));
  Eval ratio("80 GiB / 1 GiB");
  CHECK(ratio.v.dim == UnitDim::None);
  CHECK(ratio.v.number == 80);
  Eval pct("50% * 2 s");
  CHECK(pct.v.dim == UnitDim::Time);
  CHECK(pct.v.number == 1);
  Eval bad("2 GB * 2 GB");
  CHECK(bad.q.codes() == "unit-mismatch");
  Eval mixed("1 s + 1 GB");
  CHECK(mixed.q.codes() == "unit-mismatch");
  Eval unknown("3 GIB");
  CHECK(unknown.q.codes() == "unknown-unit");
  CHECK(unknown.q.printed().find("did you mean 'GiB'?") != std::string::npos);
}

TEST_CASE("a unit in the wrong place is a type error", "[frontend][sema]") {
  Quiet q;
  REQUIRE(q.add(std::string(kDeepLinearModule) +
                "target G { memory = 4 TB/s bandwidth = 4 TB/s peak { bf16 = 1 TFLOP/s } }\n"
                "train g { model = M() batch = 8 target = G }\n"));
  CHECK_FALSE(q.analyze("g"));
  CHECK(q.codes() == "unit-mismatch");
}

TEST_CASE("a did-you-mean fix-it replaces only the misspelt name", "[frontend][sema]") {
  // The fix-it of `8 x H100_SMX` replaces the target name, not the device count; that of
  // `AdamW(weight_decy = ...)` the argument name, not its value.
  Quiet q;
  REQUIRE(q.add(std::string(kDeepLinearModule) +
                "train a { model = M() batch = 8 target = 8 x H100_SMX { dta = 8 } }\n"
                "train b { model = M() batch = 8 optimizer = AdamW(weight_decy = 0.1) "
                "target = 8 x H100_SXM { dta = 8 } }\n"));
  CHECK_FALSE(q.analyze("a"));
  CHECK_FALSE(q.analyze("b"));
  const auto &ds = q.c.diags.diagnostics();
  REQUIRE(ds.size() == 3);
  auto fixed = [](const Diagnostic &d) {
    REQUIRE(d.fixits.size() == 1);
    const llvm::SMFixIt &f = d.fixits[0];
    llvm::SMRange r = f.getRange();
    return std::make_pair(std::string(r.Start.getPointer(), r.End.getPointer()),
                          f.getText().str());
  };
  CHECK(fixed(ds[0]) == std::make_pair(std::string("H100_SMX"), std::string("H100_SXM")));
  CHECK(fixed(ds[1]) == std::make_pair(std::string("weight_decy"), std::string("weight_decay")));
  CHECK(fixed(ds[2]) == std::make_pair(std::string("dta"), std::string("data")));
}

// ---- lowering ---------------------------------------------------------------------------

TEST_CASE("a tied weight is one parameter, counted once", "[frontend][lower]") {
  Quiet q;
  REQUIRE(q.add(R"(
model Tied(vocab = 100, d = 16) {
  wte = Embedding(vocab, d)
  forward(tokens: i32[batch, seq]) {
    x = wte(tokens)
    logits = x @ transpose(wte.weight)
    return cross_entropy(logits, next_tokens(tokens))
  }
}
train t { model = Tied() batch = 2 seq = 8 target = H100_SXM }
)"));
  auto a = q.analyze();
  REQUIRE(a);
  REQUIRE(q.c.graph->params.size() == 1);
  CHECK(q.c.graph->paramPath(0) == "wte.weight");
  CHECK(a->params.total == 100 * 16);
  // The weight is read twice: by the embedding and (through the transpose) by the matmul.
  TensorId w = q.c.graph->params[0].tensor;
  int uses = 0;
  for (const Op &op : q.c.graph->ops)
    for (TensorId t : op.inputs)
      uses += t == w;
  CHECK(uses == 2);
  // The model's own matmul reads the embedding's weight: tied, so the report says it is counted
  // once (passes/ParamCount.cpp, step 5).
  CHECK(a->params.tied == 100 * 16);
}

TEST_CASE("a weight read only inside its own block is not tied", "[frontend][lower]") {
  Quiet q;
  REQUIRE(q.add(R"(
block Head(d, vocab) {
  proj = Linear(d, vocab, bias = false)
  forward(x) { return proj(x) }
}
model Untied(vocab = 100, d = 16) {
  wte = Embedding(vocab, d)
  head = Head(d, vocab)
  forward(tokens: i32[batch, seq]) {
    return cross_entropy(head(wte(tokens)), next_tokens(tokens))
  }
}
train t { model = Untied() batch = 2 seq = 8 target = H100_SXM }
)"));
  auto a = q.analyze();
  REQUIRE(a);
  CHECK(a->params.total == 2 * 100 * 16);
  CHECK(a->params.tied == 0);
}

TEST_CASE("repeat copies get indexed paths", "[frontend][lower]") {
  Quiet q;
  REQUIRE(q.add(R"(
block Layer(d) {
  fc = Linear(d, d)
  forward(x) { return relu(fc(x)) }
}
model R(d = 8) {
  h = repeat(3) Layer(d)
  forward(x: f32[batch, d]) { return mean(h[1].fc(h(x))) }
}
train r { model = R() batch = 4 target = H100_SXM }
)"));
  auto a = q.analyze();
  REQUIRE(a);
  const Graph &g = *q.c.graph;
  std::vector<std::string> params;
  for (const ParamInfo &p : g.params)
    params.push_back(g.paramPath(p));
  CHECK(params == std::vector<std::string>{"h[0].fc.weight", "h[0].fc.b", "h[1].fc.weight",
                                           "h[1].fc.b", "h[2].fc.weight", "h[2].fc.b"});
  std::vector<std::string> paths;
  for (const Op &op : g.ops)
    paths.push_back(g.opPath(op));
  CHECK(paths == std::vector<std::string>{
                     "h[0].fc.matmul", "h[0].fc.add", "h[0].relu", "h[1].fc.matmul",
                     "h[1].fc.add", "h[1].relu", "h[2].fc.matmul", "h[2].fc.add", "h[2].relu",
                     "h[1].fc.matmul#2", "h[1].fc.add#2", "mean"});
  CHECK(a->params.total == 3 * (8 * 8 + 8));
  // Every op carries the source location of the expression that made it.
  for (const Op &op : g.ops)
    CHECK(op.range.isValid());
  // The instance tree has the repeat and each copy.
  bool sawList = false, sawCopy = false;
  for (uint32_t i = 0; i < g.instances.size(); ++i) {
    sawList |= g.instancePath(i) == "h" && *g.instances[i].block == "repeat";
    sawCopy |= g.instancePath(i) == "h[2]" && *g.instances[i].block == "Layer";
    // A path is stored as its part after its parent's.
    if (g.instancePath(i) == "h[2]")
      CHECK(*g.instances[i].part == "[2]");
  }
  CHECK(sawList);
  CHECK(sawCopy);
}

TEST_CASE("elementwise ops broadcast like NumPy", "[frontend][lower]") {
  Quiet q;
  REQUIRE(q.add(R"(
model B(d = 4) {
  param s: [d]
  param c: [1, d]
  forward(x: f32[batch, seq, d]) {
    y = x * s
    z = y + c
    return mean(z - 1)
  }
}
train b { model = B() batch = 2 seq = 3 target = H100_SXM }
)"));
  REQUIRE(q.analyze());
  const Graph &g = *q.c.graph;
  REQUIRE(g.ops.size() == 4);
  for (int i = 0; i < 3; ++i) {
    const Shape &s = g.tensors[g.ops[i].outputs[0]].shape;
    INFO(g.opPath(i));
    CHECK(g.formatShape(s) == "[batch, seq, 4]");
    CHECK(Graph::formatSizes(s) == "[2, 3, 4]");
  }
  CHECK(g.ops[2].attrs->hasScalar);
  CHECK(g.ops[2].attrs->scalar == 1);

  Quiet bad;
  REQUIRE(bad.add(R"(
model B(d = 4) {
  param s: [3]
  forward(x: f32[batch, d]) { return mean(x + s) }
}
train b { model = B() batch = 2 target = H100_SXM }
)"));
  CHECK_FALSE(bad.analyze());
  CHECK(bad.codes() == "broadcast-shape");
  CHECK(bad.printed().find("cannot broadcast [batch, 4] and [3]") != std::string::npos);
}

TEST_CASE("the plan binds batch to the micro-batch and seq to the sequence", "[frontend][lower]") {
  Quiet q;
  REQUIRE(q.add(std::string(kDeepLinearModule) +
                "train big { model = M() batch = 64 micro_batch = 4 target = 8 x H100_SXM }\n"));
  REQUIRE(q.analyze("big"));
  const Graph &g = *q.c.graph;
  REQUIRE(g.inputs.size() == 1);
  const Tensor &x = g.tensors[g.inputs[0]];
  CHECK(g.formatShape(x.shape) == "[batch, 8]");
  CHECK(x.shape[0].size == 4);
}

TEST_CASE("a block argument overrides its default", "[frontend][lower]") {
  Quiet q;
  REQUIRE(q.add(std::string(kDeepLinearModule) + "train wide { model = M(d = 32) batch = 4 target = H100_SXM }\n"));
  auto a = q.analyze("wide");
  REQUIRE(a);
  CHECK(a->params.total == 32 * 32);
}

TEST_CASE("recursion and runaway nesting are reported, not followed", "[frontend][lower]") {
  Quiet q;
  REQUIRE(q.add(R"(
block A(d) { b = B(d) forward(x) { return b(x) } }
block B(d) { a = A(d) forward(x) { return a(x) } }
model M(d = 4) { a = A(d) forward(x: f32[batch, d]) { return mean(a(x)) } }
train t { model = M() batch = 2 target = H100_SXM }
)"));
  CHECK_FALSE(q.analyze());
  CHECK(q.codes() == "recursive-block");
  CHECK(q.printed().find("A → B → A") != std::string::npos);
}
