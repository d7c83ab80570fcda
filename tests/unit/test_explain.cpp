// test_explain.cpp — unit tests for the derivations `tally explain` prints: the formulas of
// ir/OpRules.cpp run on terms (ir/Formula.h). For every op kind of ir/Ops.def the substituted
// text, read back by the small evaluator below, gives the printed value, and that value is the
// rule's forward FLOPs, bytes read and written, and each input's gradient FLOPs as the passes
// compute them; a few formulas are pinned with their derivation. Then the renderer of
// report/Explain.cpp (an op's derivation, a block's subtotal, unknown paths).
#include <catch.hpp>

#include "ir/OpRules.h"
#include "ir/Units.h"
#include "report/Explain.h"
#include "tests/unit/Support.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cctype>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>

using namespace tally;
using namespace tally::test;

namespace {

/// Evaluates a substituted formula: numbers, `·` (U+00B7), `+`, `-`, `/` and parentheses. Throws
/// on anything else, so a formula that prints something unevaluable fails the test.
class Evaluator {
public:
  explicit Evaluator(const std::string &text) : s(text) {}
  double run() {
    double v = sum();
    skip();
    if (pos != s.size())
      throw std::runtime_error("unexpected text at " + std::to_string(pos) + " in '" + s + "'");
    return v;
  }

private:
  void skip() {
    while (pos < s.size() && s[pos] == ' ')
      ++pos;
  }
  bool eat(const char *tok) {
    skip();
    size_t n = std::char_traits<char>::length(tok);
    if (s.compare(pos, n, tok) != 0)
      return false;
    pos += n;
    return true;
  }
  double sum() {
    double v = product();
    for (;;) {
      if (eat("+"))
        v += product();
      else if (eat("-"))
        v -= product();
      else
        return v;
    }
  }
  double product() {
    double v = factor();
    for (;;) {
      if (eat("\xc2\xb7"))
        v *= factor();
      else if (eat("/"))
        v /= factor();
      else
        return v;
    }
  }
  double factor() {
    if (eat("(")) {
      double v = sum();
      if (!eat(")"))
        throw std::runtime_error("missing ) in '" + s + "'");
      return v;
    }
    skip();
    size_t start = pos;
    while (pos < s.size() && (std::isdigit(static_cast<unsigned char>(s[pos])) || s[pos] == '.' ||
                              s[pos] == 'e' ||
                              ((s[pos] == '+' || s[pos] == '-') && pos > start && s[pos - 1] == 'e')))
      ++pos;
    if (start == pos)
      throw std::runtime_error("expected a number at " + std::to_string(pos) + " in '" + s + "'");
    return std::stod(s.substr(start, pos - start));
  }

  std::string s;
  size_t pos = 0;
};

/// The formula's printed text evaluates to its value, its named quantities too, and the value
/// equals what the rule computes.
void checkFormula(const Formula &f, double fromRule, const std::string &what) {
  INFO(what << ": " << f.symbolic << " = " << f.substituted << " = " << f.value);
  CHECK_FALSE(f.symbolic.empty());
  CHECK_FALSE(f.substituted.empty());
  double evaluated = Evaluator(f.substituted).run();
  CHECK(evaluated == Approx(f.value).epsilon(1e-12));
  CHECK(f.value == Approx(fromRule).epsilon(1e-12).margin(0));
  if (fromRule == 0)
    CHECK(f.value == 0);
  for (const FormulaQuantity &q : f.where) {
    INFO("quantity " << q.name << " = " << q.substituted << " = " << q.value);
    CHECK_FALSE(q.name.empty());
    if (!q.substituted.empty())
      CHECK(Evaluator(q.substituted).run() == Approx(q.value).epsilon(1e-12));
  }
}

/// The lecture's DeepLinear trained on 1024 rows in fp32 on one H100.
std::string lectureSource() {
  return std::string(kDeepLinear) +
         "train lecture { model = DeepLinear() batch = 1024 precision = fp32 target = H100_SXM }\n";
}

/// Every primitive, in the variants whose rules differ: scalar operands on either side,
/// broadcasting on either side, 1-D matmul operands, fused and unfused attention with and
/// without dropout, grouped-query attention, sliding windows and soft caps, reductions over
/// everything and one axis.
const char *kAllOps = R"(
model AllOps(d = 64, heads = 4, vocab = 100) {
  param w3: [d, 3 * d]
  param wkv: [d, d / 2]
  param lw: [d]
  param lb: [d]
  param emb: [vocab, d]
  param v1: [d]
  forward(tokens: i32[batch, seq]) {
    x = embedding(tokens, emb) + embedding(positions(seq), emb)
    a = layer_norm(x, lw, lb)
    r = rms_norm(a, lw, eps = 1e-5)
    q, k, v = split(r @ w3, 3, dim = -1)
    y1 = attention(rope(q), rope(k), v, heads = heads, causal = true)
    y2 = attention(q, k, v, heads = heads, causal = true, fused = false, dropout = 0.1)
    y3 = attention(q, k, v, heads = heads, fused = false)
    kv = r @ wkv
    y4 = attention(q, kv, kv, heads = heads, kv_heads = 2, dropout = 0.1)
    y5 = attention(q, k, v, heads = heads, causal = true, window = 3, softcap = 20.0)
    y6 = attention(q, k, v, heads = heads, causal = true, fused = false, window = 5, softcap = 2.0)
    z = concat(y1, y2, dim = -1)
    t = transpose(reshape(z, [batch, seq, 2, d]), 1, 2)
    e1 = gelu(y3) - silu(y4) * tanh(y1) / sigmoid(y2) + gelu_tanh(y5) * y6
    e2 = relu(exp(-e1)) + dropout(e1, 0.1)
    e3 = softmax(e2 * 2 + 1, dim = -1) - 3
    e4 = 2 - e3 / 4
    e5 = 1 / e4 + e4 * v1 - v1 / e4
    s1 = sum(e5 @ v1)
    s2 = mean(t, dim = 1)
    s3 = mean(s2) + sum(e5, dim = -1, keepdim = true)
    logits = e5 @ transpose(emb)
    return cross_entropy(logits, next_tokens(tokens)) + s1 + mean(s3)
  }
}
train all_ops {
  model = AllOps()
  batch = 2
  seq = 8
  precision = fp32
  target = H100_SXM
}
)";

/// Mixture of experts: topk, gather and moe, with and without a capacity.
const char *kRouted = R"(
model Routed(d = 32, hidden = 48, experts = 4) {
  param router: [d, experts]
  param wg: [experts, d, hidden]
  param wu: [experts, d, hidden]
  param wd: [experts, hidden, d]
  forward(x: f32[batch, seq, d]) {
    v, i = topk(x @ router, 2)
    y = moe(x, softmax(v), i, wg, wu, wd) + moe(x, v, i, wg, wu, wd, capacity_factor = 0.75)
    return mean(y) + mean(gather(x, i, dim = -1))
  }
}
train routed { model = Routed() batch = 2 seq = 5 precision = fp32 target = H100_SXM }
)";

/// Convolution with a bias, both pools, broadcast_to and a slice, a partial rope, ALiBi with a
/// padding mask; mixed fp16, so the step has loss scaling's sum of squares.
const char *kExtras = R"(
model Extras(d = 16, heads = 2) {
  param conv: [4, 3, 3, 3]
  param cb: [4]
  param cls: [1, 1, d]
  param w: [d, d]
  forward(images: f32[batch, 3, 8, 8], x: f32[batch, seq, d], m: i32[batch, seq]) {
    y = max_pool2d(relu(conv2d(images, conv, bias = cb, padding = 1)), 3, stride = 2, padding = 1)
    z = avg_pool2d(y, 2)
    t = concat(broadcast_to(cls, (batch, 1, d)), x, dim = 1)
    a = attention(rope(x @ w, fraction = 0.5), x, x, heads = heads, alibi = true, mask = m)
    return mean(z) + mean(t[:, 0]) + mean(a)
  }
}
train extras { model = Extras() batch = 2 seq = 4 precision = mixed_fp16 target = H100_SXM }
)";

/// Checks every formula of every op of `g` against the rule, and records the op kinds seen.
void checkOps(const Graph &g, std::set<OpKind> &seen) {
  for (const Op &op : g.ops) {
    seen.insert(op.kind);
    const OpRule &rule = ruleFor(op.kind);
    ForwardCost cost = rule.forward(g, op);
    std::string where = g.opPath(op) + " (" + opName(op.kind).str() + ")";
    checkFormula(describeForward(g, op), cost.flops, where + " forward FLOPs");
    checkFormula(describeBytesRead(g, op), cost.bytesRead, where + " bytes read");
    checkFormula(describeBytesWritten(g, op), cost.bytesWritten, where + " bytes written");
    for (unsigned i = 0; i < op.inputs.size(); ++i)
      checkFormula(describeGrad(g, op, i), rule.gradFlops(g, op, i),
                   where + " grad of in" + std::to_string(i));
  }
}

} // namespace

TEST_CASE("explain formulas: every op kind's formulas evaluate to its rule's counts",
          "[explain]") {
  std::set<OpKind> seen;
  for (const char *source : {kAllOps, kRouted, kExtras}) {
    Compiled c(source);
    checkOps(c.g(), seen);
    checkOps(*c.a->step, seen); // the backward and optimizer ops of the step
    if (source != kExtras)
      continue;
    // No pass emits `scale` yet (codegen has its kernel): one by hand, over the last gradients.
    Graph g = *c.a->step;
    Op scale;
    scale.kind = OpKind::Scale;
    scale.outputs = g.ops.back().outputs;
    g.ops.push_back(scale);
    std::set<OpKind> one;
    checkOps(g, one);
    seen.insert(one.begin(), one.end());
  }
  // Every kind of ir/Ops.def is exercised, so a new kind's formulas are checked here.
  for (unsigned k = 0; k < kOpKinds; ++k) {
    INFO("op kind " << opName(static_cast<OpKind>(k)).str() << " is not in the test models");
    CHECK(seen.count(static_cast<OpKind>(k)) == 1);
  }
}

TEST_CASE("explain formulas: ALiBi and a partial rope show the terms they add", "[explain]") {
  Compiled c(kExtras);
  const Graph &g = c.g();
  // attention over b = 2, s = s_kv = 4, h = 2 heads of dh = 16 / 2 = 8: S = 2·2·4·4 = 64
  // scores; Q·Kᵀ and P·V 4·S·dh = 2048, then 5 per score for softmax and 2 for ALiBi: 7·64 = 448.
  Formula f = describeForward(g, g.ops[c.op("attention")]);
  CHECK(f.symbolic == "4·S·dh + 7·S");
  CHECK(f.substituted == "4 · 64 · 8 + 7 · 64");
  CHECK(f.value == 2048 + 448);
  CHECK(f.note.find("the ALiBi bias 2") != std::string::npos);
  // rope over [2, 4, 16] with head size 8 (d / heads), fraction 0.5: 4 of each head's 8 dims
  // rotated, r = 4 / 8; 3 FLOPs per rotated element: 3 · 128 · 0.5 = 192.
  Formula r = describeForward(g, g.ops[c.op("rope")]);
  CHECK(r.symbolic == "3·n·r");
  CHECK(r.substituted == "3 · 128 · 0.5");
  CHECK(r.value == 192);
  REQUIRE(r.where.size() == 2);
  CHECK(r.where[1].symbolic == "rotated / hd");
  CHECK(r.where[1].substituted == "4 / 8");
}

TEST_CASE("explain formulas: the lecture's first matmul is 2·M·N·K", "[explain]") {
  Compiled c(lectureSource());
  const Op &mm = c.g().ops[0];
  REQUIRE(c.g().opPath(mm) == "matmul");
  Formula f = describeForward(c.g(), mm);
  CHECK(f.symbolic == "2·M·N·K");
  CHECK(f.substituted == "2 · 1024 · 1024 · 1024");
  CHECK(f.value == 2147483648.0);
  REQUIRE(f.where.size() == 3);
  CHECK(f.where[0].name == "M");
  CHECK(f.where[0].symbolic == "batch");
  Formula r = describeBytesRead(c.g(), mm);
  CHECK(r.symbolic == "bytes(in0) + bytes(in1)");
  CHECK(r.substituted == "1024 · 1024 · 4 + 1024 · 1024 · 4");
}

namespace {

const char *kBlocks = R"(
block Inner(d) {
  fc = Linear(d, d)
  forward(x) { return gelu(fc(x)) }
}
block Outer(d) {
  a = Inner(d)
  b = Inner(d)
  forward(x) { return b(a(x)) }
}
model M(d = 32) {
  h = repeat(2) Outer(d)
  forward(x: f32[batch, d]) { return mean(h(x)) }
}
train t { model = M() batch = 8 micro_batch = 2 precision = fp32 target = H100_SXM }
)";

} // namespace

TEST_CASE("explain: paths select an op, a block or nothing", "[explain]") {
  Compiled c(kBlocks);
  const Graph &g = c.g();
  ExplainSelection op = selectForExplain(g, "h[1].a.fc.matmul");
  REQUIRE(op.kind == ExplainSelection::Op);
  CHECK(g.opPath(op.op) == "h[1].a.fc.matmul");

  ExplainSelection block = selectForExplain(g, "h[1]");
  REQUIRE(block.kind == ExplainSelection::Block);
  CHECK(g.instancePath(block.instance) == "h[1]");
  REQUIRE(block.ops.size() == 6); // two Inners: matmul, add, gelu each
  for (OpId i : block.ops)
    CHECK(llvm::StringRef(g.opPath(i)).startswith("h[1]."));

  ExplainSelection all = selectForExplain(g, "h");
  REQUIRE(all.kind == ExplainSelection::Block);
  CHECK(all.ops.size() == 12);

  ExplainSelection typo = selectForExplain(g, "h[1].a.fc.matmal");
  CHECK(typo.kind == ExplainSelection::None);
  CHECK(typo.suggestion == "h[1].a.fc.matmul");
  CHECK(selectForExplain(g, "zzzzzzzz").suggestion.empty());
  CHECK(selectForExplain(g, "").kind == ExplainSelection::None);
  CHECK(op.pattern.empty());
  CHECK(op.copies == 1);
}

TEST_CASE("explain: a pattern selects the first copy and says how many it names", "[explain]") {
  Compiled c(kBlocks);
  const Graph &g = c.g();
  // An op of both copies of h: the first is explained.
  ExplainSelection op = selectForExplain(g, "h[*].b.fc.matmul");
  REQUIRE(op.kind == ExplainSelection::Op);
  CHECK(g.opPath(op.op) == "h[0].b.fc.matmul");
  CHECK(op.pattern == "h[*].b.fc.matmul");
  CHECK(op.copies == 2);
  // A block: its first copy and its ops.
  ExplainSelection block = selectForExplain(g, "h[*].a");
  REQUIRE(block.kind == ExplainSelection::Block);
  CHECK(g.instancePath(block.instance) == "h[0].a");
  CHECK(block.copies == 2);
  CHECK(block.ops.size() == 3);
  // A pattern typo is answered with a pattern.
  ExplainSelection typo = selectForExplain(g, "h[*].b.fc.matmal");
  CHECK(typo.kind == ExplainSelection::None);
  CHECK(typo.suggestion == "h[*].b.fc.matmul");

  // Alike: the second copy's ops have the first's analysis, except where the first reads data
  // (h[0].a.fc's matmul computes no input gradient; h[1].a.fc's does).
  CHECK(copiesAlike(*c.a, op));
  CHECK(copiesAlike(*c.a, selectForExplain(g, "h[*].b")));
  ExplainSelection first = selectForExplain(g, "h[*].a.fc.matmul");
  CHECK_FALSE(copiesAlike(*c.a, first));
  CHECK_FALSE(copiesAlike(*c.a, block));

  std::string text;
  llvm::raw_string_ostream os(text);
  explainOpText(*c.a, op.op, c.c.diags, os, &op);
  os.flush();
  CHECK(llvm::StringRef(text).startswith(
      "h[*].b.fc.matmul: 2 copies, each with the numbers below (a report's h[*].b.fc.matmul "
      "row sums them); explained for the first, h[0].b.fc.matmul\n\nh[0].b.fc.matmul: matmul"));
  std::string json;
  llvm::raw_string_ostream js(json);
  explainOpJson(*c.a, first.op, c.c.diags, js, &first);
  js.flush();
  llvm::Expected<llvm::json::Value> v = llvm::json::parse(json);
  REQUIRE(static_cast<bool>(v));
  const llvm::json::Object &o = *v->getAsObject();
  CHECK(*o.getString("pattern") == "h[*].a.fc.matmul");
  CHECK(*o.getInteger("copies") == 2);
  CHECK(*o.getBoolean("copies_alike") == false);
  CHECK(*o.getString("path") == "h[0].a.fc.matmul");

  // A pattern that names one op (a model calling one copy's block again, #2) says so.
  Compiled again(R"(
block Inner(d) {
  fc = Linear(d, d)
  forward(x) { return relu(fc(x)) }
}
model M(d = 8) {
  h = repeat(2) Inner(d)
  forward(x: f32[batch, d]) { return mean(h[1](h(x))) }
}
train t { model = M() batch = 4 optimizer = SGD(lr = 0.1) target = H100_SXM }
)");
  ExplainSelection one = selectForExplain(again.g(), "h[*].relu#2");
  REQUIRE(one.kind == ExplainSelection::Op);
  CHECK(one.copies == 1);
  std::string line;
  llvm::raw_string_ostream ls(line);
  explainOpText(*again.a, one.op, again.c.diags, ls, &one);
  ls.flush();
  CHECK(llvm::StringRef(line).startswith(
      "h[*].relu#2: one copy only, h[1].relu#2 (the reports name it by its path)\n"));
}

TEST_CASE("explain: an op's text shows its formula, bytes, bound, time and backward",
          "[explain]") {
  Compiled c(lectureSource());
  std::string text;
  llvm::raw_string_ostream os(text);
  explainOpText(*c.a, 0, c.c.diags, os);
  os.flush();
  INFO(text);
  CHECK(text.find("forward = 2·M·N·K = 2 · 1024 · 1024 · 1024 = 2147483648") != std::string::npos);
  CHECK(text.find("written at t.tally:6:10") != std::string::npos);
  CHECK(text.find("bound     = compute") != std::string::npos);
  CHECK(text.find("grad in0 (data: needs no gradient): none") != std::string::npos);
  CHECK(text.find("weight-grad FLOPs = 2147483648") != std::string::npos);
  CHECK(text.find("input-grad FLOPs  = 0") != std::string::npos);
  // The time printed is the pass's, formatted.
  CHECK(c.a->ops[0].forwardTime > 0);
  CHECK(text.find("= " + formatDuration(c.a->ops[0].forwardTime)) != std::string::npos);
}

TEST_CASE("explain: a block's subtotal is the sum of its ops and matches BlockTotals",
          "[explain]") {
  Compiled c(kBlocks);
  const Analysis &a = *c.a;
  ExplainSelection sel = selectForExplain(c.g(), "h[0]");
  REQUIRE(sel.kind == ExplainSelection::Block);
  double fwd = 0;
  for (OpId i : sel.ops)
    fwd += a.ops[i].forward.flops;
  // batch 8 / micro-batch 2: four micro-batches per step.
  CHECK(a.params.byBlock[sel.instance].forwardFlops == Approx(4 * fwd));
  std::string text;
  llvm::raw_string_ostream os(text);
  explainBlockText(a, sel, os);
  os.flush();
  INFO(text);
  CHECK(text.find("sum of the ops above, per micro-batch: forward " + formatFormulaNumber(fwd) +
                  " FLOPs") != std::string::npos);
  CHECK(text.find("forward " + formatFormulaNumber(4 * fwd) + " FLOPs") != std::string::npos);
}

TEST_CASE("explain: the time's terms are the pass's, on GPUs, split, fused and on a measured "
          "host",
          "[explain]") {
  // Every op's forward and backward time as explain breaks it down (compute + exps against
  // memory, plus calls) adds up to the time passes/StepTime.cpp gave it, and the text prints
  // that time; between them the inputs exercise every term.
  PlanOverrides fuse;
  fuse.fuseKernels = true;
  Compiled gpt2(fromFile, example("gpt2.tally"), "gpt2_124M", fuse);
  Compiled split(std::string(kTinyGPTModel) + R"(
train p { model = TinyGPT() batch = 16 seq = 128 micro_batch = 4 optimizer = AdamW(lr = 1e-3)
          precision = mixed_bf16 target = 4 x H100_SXM { data = 2, tensor = 2 } }
)");
  Compiled host(std::string(kTinyGPTModel) + R"(
target Cpu {
  memory = 16 GiB
  bandwidth = 10 GB/s
  peak { fp32 = 100 GFLOP/s }
  kernel_overhead = 2 us
  transcendental = 4 ns
  cache = 1 MiB
  cache_bandwidth = 40 GB/s
  matmul_curve { fp32 = [(1e6, 0.2), (1e9, 0.6)] }
}
train p { model = TinyGPT(layers = 2) batch = 4 seq = 32 micro_batch = 2 optimizer = SGD(lr = 0.1)
          precision = fp32 target = Cpu }
)");
  PlanOverrides cuda; // tally's own CUDA step in fp32: its attention is a measured kernel
  cuda.cudaStep = true;
  cuda.precision = "fp32";
  cuda.fuseKernels = true;
  Compiled own(fromFile, example("gpt2.tally"), "gpt2_124M", cuda);
  bool sawExps = false, sawCalls = false, sawSplit = false, sawFused = false, sawCurve = false,
       sawCache = false, sawMeasured = false, sawReplaced = false;
  for (Compiled *c : {&gpt2, &split, &host, &own}) {
    const Analysis &a = *c->a;
    for (OpId i = 0; i < c->g().ops.size(); ++i) {
      const OpAnalysis &oa = a.ops[i];
      std::string json, text;
      llvm::raw_string_ostream js(json), ts(text);
      explainOpJson(a, i, c->c.diags, js);
      explainOpText(a, i, c->c.diags, ts);
      js.flush();
      ts.flush();
      llvm::Expected<llvm::json::Value> v = llvm::json::parse(json);
      REQUIRE(bool(v));
      const llvm::json::Object *time = v->getAsObject()->getObject("time");
      REQUIRE(time);
      INFO(c->g().opPath(c->g().ops[i]));
      const llvm::json::Object *fwd = time->getObject("forward");
      REQUIRE(fwd);
      CHECK(*fwd->getNumber("total_s") == Approx(oa.forwardTime).epsilon(1e-12));
      CHECK(*fwd->getNumber("compute_s") >= 0);
      CHECK(text.find("= " + formatDuration(oa.forwardTime) + "\n") != std::string::npos);
      if (oa.backwardTime > 0) { // (a backward of views only prices at 0 and shows too)
        const llvm::json::Object *bwd = time->getObject("backward");
        REQUIRE(bwd);
        CHECK(*bwd->getNumber("total_s") == Approx(oa.backwardTime).epsilon(1e-12));
        CHECK(text.find("= " + formatDuration(oa.backwardTime) + "\n") != std::string::npos);
      }
      sawExps = sawExps || *fwd->getNumber("transcendental_s") > 0;
      sawCalls = sawCalls || *fwd->getNumber("calls_s") > 0;
      sawSplit = sawSplit || (oa.tensorSplit > 1 && text.find(" / 2 / ") != std::string::npos);
      sawFused = sawFused || text.find(" fused) / ") != std::string::npos;
      sawCurve = sawCurve || text.find("measured curve") != std::string::npos;
      sawCache = sawCache || *fwd->getNumber("bandwidth") == Approx(40e9);
      sawMeasured = sawMeasured || text.find("tally's CUDA attention kernel") != std::string::npos;
      // The top-level efficiency is the one the forward time used; the target's constant for
      // the class is beside it, and differs where a curve or a measured kernel replaced it.
      CHECK(*v->getAsObject()->getNumber("efficiency") == *fwd->getNumber("efficiency"));
      sawReplaced = sawReplaced || *v->getAsObject()->getNumber("efficiency") !=
                                       *v->getAsObject()->getNumber("target_efficiency");
    }
  }
  CHECK(sawReplaced);
  CHECK(sawExps);
  CHECK(sawCalls);
  CHECK(sawSplit);
  CHECK(sawFused);
  CHECK(sawCurve);
  CHECK(sawCache);
  CHECK(sawMeasured);
}
