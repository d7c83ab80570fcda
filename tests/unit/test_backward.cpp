// test_backward.cpp — the training step that autodiff and step assembly build
// (passes/Backward.cpp): the verifier on every example and test model, the per-op FLOP oracle
// (the backward ops' FLOPs equal the per-input gradient formulas of ir/OpRules.cpp exactly),
// the FLOP-sum identity of the report, the shape of a few derivatives written by hand, and the
// compact step (step 5) against the whole one on every input; and the analysis's threads on a
// deep model (the step built beside the op pricing, the trade-off curve beside later passes)
// against one thread.
#include "Support.h"

#include "passes/Passes.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <thread>

using namespace tally;
using namespace tally::test;

namespace {

/// Every example plan and the models of the unit tests with a train plan.
std::vector<std::pair<std::string, std::string>> examplePlans() {
  return {{"lecture.tally", "lecture"},    {"gpt2.tally", "gpt2_124M"},
          {"gpt2.tally", "gpt2_decode"},   {"llama2_7b.tally", ""},
          {"targets.tally", ""},         {"mixtral_8x7b.tally", ""}};
}

/// The oracle: Σ over needed inputs of rule.gradFlops, per forward op.
double oracleFlops(const Graph &g, const Op &op) {
  double f = 0;
  for (unsigned i = 0; i < op.inputs.size(); ++i) {
    const Tensor &t = g.tensors[op.inputs[i]];
    if (t.requiresGrad && isFloat(t.dtype))
      f += ruleFor(op.kind).gradFlops(g, op, i);
  }
  return f;
}

void checkStep(const Analysis &a) {
  const Graph &s = *a.step;
  CHECK(verifyGraph(s) == "");
  CHECK(verifyOpTypes(s) == "");
  if (!a.plan->isTrain)
    return;
  const Graph &g = *a.graph;
  // Forward ops keep their ids.
  REQUIRE(s.ops.size() >= g.ops.size());
  for (OpId i = 0; i < g.ops.size(); ++i)
    CHECK(s.opPath(i) == g.opPath(i));
  // The oracle, per forward op.
  std::vector<double> fromOps(g.ops.size(), 0);
  double optimizer = 0;
  for (OpId i = static_cast<OpId>(g.ops.size()); i < s.ops.size(); ++i) {
    const Op &op = s.ops[i];
    double f = ruleFor(op.kind).forward(s, op).flops;
    if (op.phase == Phase::Optimizer)
      optimizer += f;
    else if (op.forwardOp != kNone)
      fromOps[op.forwardOp] += f;
  }
  double micro = static_cast<double>(a.plan->batch) / static_cast<double>(a.plan->microBatch);
  double forward = 0, backward = 0;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    INFO(g.opPath(i));
    bool runs = a.ops[i].inputGradFlops + a.ops[i].weightGradFlops > 0 || fromOps[i] > 0;
    if (runs)
      CHECK(fromOps[i] == oracleFlops(g, g.ops[i]));
    forward += ruleFor(g.ops[i].kind).forward(g, g.ops[i]).flops;
    backward += fromOps[i];
  }
  // The report's totals are the per-op FLOPs of one micro-batch × micro-steps (forward,
  // backward) and the optimizer ops once per step.
  CHECK(forward * micro == a.flops.forward);
  CHECK(backward * micro == a.flops.backward);
  CHECK(optimizer == a.flops.optimizer);
  // The regions: aligned offsets, in order, no overlap.
  for (const Region *r : {&a.regions.params, &a.regions.grads, &a.regions.master,
                          &a.regions.optimizer}) {
    int64_t end = 0;
    for (const Region::Entry &e : r->tensors) {
      CHECK(e.offset % kAlignment == 0);
      CHECK(e.offset >= end);
      end = e.offset + e.bytes;
    }
    CHECK(r->bytes >= end);
  }
}

} // namespace

TEST_CASE("backward: every example's training step verifies and matches the FLOP oracle",
          "[backward]") {
  for (const auto &[file, plan] : examplePlans()) {
    INFO(file << " " << plan);
    Compiled t(fromFile, example(file), plan);
    checkStep(*t.a);
  }
}

TEST_CASE("backward: checkpointed and dropout models verify too", "[backward]") {
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
    return mean(y * y - 2 / (y + 3))
  }
}
train t { model = M() batch = 4 seq = 8 micro_batch = 2 optimizer = AdamW(lr = 1e-3)
          precision = mixed_fp16 checkpoint = full target = H100_SXM }
)");
  checkStep(*t.a);
  const Graph &s = *t.a->step;
  // Loss scaling: the loss gradient is the scale over 2 micro-steps; the overflow check runs.
  bool fill = false, check = false;
  for (const Op &op : s.ops) {
    if (op.kind == OpKind::Fill && op.forwardOp == kNone)
      fill = op.attrs->scalar == kLossScale / 2;
    check = check || op.kind == OpKind::SumSquares;
  }
  CHECK(fill);
  CHECK(check);
  // Random streams: each dropout has its own.
  std::set<uint32_t> streams;
  for (const Op &op : t.g().ops)
    if (op.kind == OpKind::Dropout)
      CHECK(streams.insert(op.attrs->stream).second);
  CHECK(streams.size() == 3);
  // Shared attributes (SharedAttrs): a repeat copy that lowering copies from the one before
  // (cloneCall: h[2] from h[1]; h[0] reads the data, which needs no gradient, so h[1] is
  // evaluated) points at that copy's OpAttrs, except dropout, whose copies draw their own
  // streams; the step's copies of the forward ops share theirs.
  const Graph &g = t.g();
  std::map<std::string, std::vector<const Op *>> byLocal; // "fc.matmul" -> h[0]'s, h[1]'s...
  for (const Op &op : g.ops) {
    std::string opPath = g.opPath(op);
    llvm::StringRef path(opPath);
    if (path.consume_front("h["))
      byLocal[path.split("].").second.str()].push_back(&op);
  }
  size_t shared = 0;
  for (const auto &[local, ops] : byLocal) {
    INFO(local);
    REQUIRE(ops.size() == 3);
    bool dropout = ops[0]->kind == OpKind::Dropout;
    CHECK((&*ops[2]->attrs == &*ops[1]->attrs) == !dropout);
    shared += !dropout;
  }
  CHECK(shared >= 5); // layer_norm, matmul, add (bias), gelu, transpose, matmul, add
  for (OpId o = 0; o < g.ops.size(); ++o)
    CHECK(&*s.ops[o].attrs == &*g.ops[o].attrs);
}

TEST_CASE("backward: a layer norm without a weight has dx alone, 11 FLOPs per element", "[backward]") {
  // OLMo 1's norm: LayerNorm(d, affine = false) between two Linears. No parameter; its
  // backward reads (x, mean, rstd, dy) and writes dx; the step verifies and matches the oracle.
  Compiled t(R"(
model M(d = 16) {
  fc  = Linear(d, d)
  ln  = LayerNorm(d, affine = false)
  out = Linear(d, 4, bias = false)
  forward(x: f32[batch, seq, d]) { return mean(out(ln(fc(x)))) }
}
train t { model = M() batch = 4 seq = 8 micro_batch = 2 optimizer = AdamW(lr = 1e-3)
          precision = fp32 checkpoint = none target = H100_SXM }
)");
  checkStep(*t.a);
  CHECK(t.block("ln").count == 0);
  CHECK(t.a->params.total == 16 * 16 + 16 + 16 * 4);
  const double n = 2 * 8 * 16; // one micro-batch
  OpId ln = t.op("ln.layer_norm");
  CHECK(t.g().ops[ln].inputs.size() == 1);
  CHECK(t.at("ln.layer_norm").forward.flops == 6 * n);
  CHECK(t.at("ln.layer_norm").inputGradFlops == 11 * n);
  CHECK(t.at("ln.layer_norm").weightGradFlops == 0);
  unsigned found = 0;
  for (const Op &op : t.a->step->ops)
    if (op.kind == OpKind::LayerNormBackward) {
      ++found;
      CHECK(op.forwardOp == ln);
      REQUIRE(op.inputs.size() == 4); // x, mean, rstd, dy
      CHECK(op.inputs[0] == t.g().ops[ln].inputs[0]);
      CHECK(op.inputs[1] == t.g().ops[ln].outputs[1]);
      CHECK(op.inputs[2] == t.g().ops[ln].outputs[2]);
      CHECK(op.attrs->gradMask == 1u);
      CHECK(op.outputs.size() == 1);
    }
  CHECK(found == 1);
}

TEST_CASE("backward: the tied head writes one gradient into the embedding's", "[backward]") {
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  const Graph &s = *t.a->step;
  TensorId wte = kNone;
  for (const ParamInfo &p : s.params)
    if (s.paramPath(p) == "wte.weight")
      wte = p.tensor;
  REQUIRE(wte != kNone);
  TensorId grad = s.gradient[wte];
  REQUIRE(grad != kNone);
  // Two writers: the head's matmul through a transposed view, and the embedding's scatter;
  // both add (parameter gradients accumulate over micro-batches).
  unsigned writers = 0;
  for (const Op &op : s.ops)
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      TensorId o = op.outputs[i];
      if (op.phase == Phase::Backward && (o == grad || s.tensors[o].viewOf == grad)) {
        ++writers;
        CHECK(((op.accumulate >> i) & 1) == 1);
      }
    }
  CHECK(writers == 2);
}

TEST_CASE("backward: split parts write their own slices of one gradient", "[backward]") {
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  const Graph &s = *t.a->step;
  OpId attnBwd = kNone;
  for (OpId i = 0; i < s.ops.size(); ++i)
    if (s.ops[i].kind == OpKind::AttentionBackward && attnBwd == kNone)
      attnBwd = i;
  REQUIRE(attnBwd != kNone);
  const Op &op = s.ops[attnBwd];
  REQUIRE(op.outputs.size() == 3);
  CHECK(op.accumulate == 0); // q, k and v each overwrite their third of d(qkv)
  TensorId base = s.tensors[op.outputs[0]].viewOf;
  REQUIRE(base != kNone);
  // d = 768: the parts start at element offsets 0, 768 and 1536 of rows of 2304.
  for (unsigned i = 0; i < 3; ++i) {
    const Tensor &part = s.tensors[op.outputs[i]];
    CHECK(part.viewOf == base);
    CHECK(part.layout.offset() == 768 * i);
    CHECK(part.layout.strides()[1] == 2304);
    CHECK(part.layout.strides()[2] == 1);
  }
}

TEST_CASE("backward: an add passes its output gradient on to both operands without a copy",
          "[backward]") {
  // GPT-2: every add's backward was a copy of dy per operand (issue 46 item 2). Now each
  // same-shape operand's gradient is dy's buffer (a `contiguous` that `shares`), and the memory
  // plan gives both the same bytes.
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  const Graph &s = *t.a->step;
  unsigned shared = 0, copies = 0;
  for (const Op &op : s.ops)
    if (op.kind == OpKind::Contiguous && op.phase == Phase::Backward) {
      (op.attrs->shares ? shared : copies) += 1;
      if (op.attrs->shares)
        CHECK(op.accumulate == 0);
    }
  CHECK(copies == 0);
  // The residual adds' both operands, each linear's bias add's matmul output, and the token
  // embedding beside the broadcast positions in wte + wpe.
  CHECK(shared == 12 * 2 * 2 + 12 * 4 + 1);
  // y = a + relu(a): a's gradient may be dy's buffer; relu(a)'s may not: relu's backward reads
  // it while writing a's, which would then be the same bytes.
  Compiled r(R"(
model M(d = 16) {
  param w: [d, d]
  forward(x: f32[batch, d]) {
    a = x @ w
    y = a + relu(a)
    return mean(y * y)
  }
}
train t { model = M() batch = 4 optimizer = SGD(lr = 0.01) precision = fp32 target = H100_SXM }
)");
  checkStep(*r.a);
  unsigned rs = 0, rc = 0;
  for (const Op &op : r.a->step->ops)
    if (op.kind == OpKind::Contiguous && op.phase == Phase::Backward)
      (op.attrs->shares ? rs : rc) += 1;
  CHECK(rs == 1);
  CHECK(rc == 1);
}

TEST_CASE("backward: the verifier finds a broken step", "[backward]") {
  // Each mutation of a valid step is a bug the verifier must name (a verifier that accepts
  // anything passes every other test here).
  Compiled t(fromFile, example("lecture.tally"), "lecture");
  const Graph &valid = *t.a->step;
  REQUIRE(verifyGraph(valid) == "");
  REQUIRE(verifyOpTypes(valid) == "");
  OpId firstBackward = static_cast<OpId>(t.g().ops.size());
  REQUIRE(firstBackward < valid.ops.size());
  auto problem = [&](auto mutate) {
    Graph s = valid;
    mutate(s);
    std::string p = verifyGraph(s);
    return p.empty() ? verifyOpTypes(s, firstBackward) : p;
  };
  // A tensor that owns its storage with non-dense strides (its rows swapped).
  CHECK_THAT(problem([&](Graph &s) {
               for (Tensor &x : s.tensors)
                 if (x.viewOf == kNone && x.shape.size() == 2 && x.shape[0].size > 1 && x.shape[1].size > 1) {
                   x.layout = Layout({1, x.shape[1].size}, x.layout.offset()); // row-major [b, 1], swapped
                   return;
                 }
             }),
             Catch::Contains("owns its storage but is not dense"));
  // A parameter listed twice.
  CHECK_THAT(problem([](Graph &s) { s.params.push_back(s.params.front()); }),
             Catch::Contains("is listed twice"));
  // An op reading a tensor that a later op writes.
  CHECK_THAT(problem([&](Graph &s) { s.ops[0].inputs[0] = s.ops[1].outputs[0]; }),
             Catch::Contains("before it is written"));
  // A backward op whose output has other elements than its rule gives.
  CHECK_THAT(problem([&](Graph &s) {
               for (OpId o = firstBackward; o < s.ops.size(); ++o) {
                 const Op &op = s.ops[o];
                 if (op.kind == OpKind::Matmul && !op.outputs.empty()) {
                   Tensor &x = s.tensors[op.outputs[0]];
                   Shape wider = x.shape;
                   wider.back().size += 1;
                   x.shape = wider;
                   x.layout = Layout(denseStrides(x.shape), x.layout.offset());
                   return;
                 }
               }
             }),
             Catch::Contains("its rule gives"));
  // The pipeline trusts the forward prefix lowering verified (verifyGraph's verified counts)
  // and still finds what the step's own ops and tensors break.
  size_t ops = t.g().ops.size(), tensors = t.g().tensors.size();
  CHECK(verifyGraph(valid, ops, tensors) == "");
  auto stepProblem = [&](auto mutate) {
    Graph s = valid;
    mutate(s);
    return verifyGraph(s, ops, tensors);
  };
  CHECK_THAT(stepProblem([&](Graph &s) { // an activation's gradient read before its first write
               for (OpId o = firstBackward + 1; o < s.ops.size(); ++o) {
                 TensorId out = s.ops[o].outputs.empty() ? kNone : s.ops[o].outputs[0];
                 if (out == kNone || s.tensors[out].viewOf != kNone || s.ops[o].accumulate ||
                     s.tensors[out].gradOf == kNone || s.tensors[s.tensors[out].gradOf].role != TensorRole::Activation)
                   continue;
                 for (OpId r = firstBackward; r < o; ++r)
                   if (!s.ops[r].inputs.empty()) {
                     s.ops[r].inputs[0] = out;
                     return;
                   }
               }
             }),
             Catch::Contains("before it is written"));
  CHECK_THAT(stepProblem([&](Graph &s) { s.ops[firstBackward + 2].phase = Phase::Forward; }),
             Catch::Contains("is forward after a backward op"));
  CHECK_THAT(stepProblem([&](Graph &s) { s.params.push_back(s.params.front()); }),
             Catch::Contains("is listed twice"));
  CHECK_THAT(stepProblem([&](Graph &s) { s.tensors[tensors].dtype = Dtype::Invalid; }),
             Catch::Contains("has no dtype"));
  // What a forward op does is replayed, not checked again: a backward op may read its outputs.
  CHECK(stepProblem([&](Graph &s) { s.tensors[0].dtype = Dtype::Invalid; }) == "");
}

TEST_CASE("graph: isDense is row-major up to size-1 dimensions", "[backward]") {
  Shape s{Dim{2, 0}, Dim{3, 0}, Dim{4, 0}};
  Layout l;
  l = Layout({12, 4, 1}, 0);
  CHECK(isDense(s, l));
  l = Layout({12, 1, 3}, 0); // the last two dimensions transposed
  CHECK_FALSE(isDense(s, l));
  l = Layout({24, 4, 1}, 0); // every other row of a larger tensor
  CHECK_FALSE(isDense(s, l));
  Shape one{Dim{2, 0}, Dim{1, 0}, Dim{4, 0}};
  l = Layout({4, 99, 1}, 0); // a size-1 dimension may have any stride
  CHECK(isDense(one, l));
  l = Layout({8, 99, 1}, 0); // but the others follow the product of the sizes after them
  CHECK_FALSE(isDense(one, l));
  CHECK(isDense(Shape(), Layout()));
}

TEST_CASE("graph: row-major strides are not listed, every other list is kept", "[backward]") {
  Graph g;
  auto add = [&](Shape s, llvm::SmallVector<int64_t, 4> st) {
    Tensor t;
    t.shape = std::move(s);
    t.dtype = Dtype::F32;
    t.layout = Layout(st, t.layout.offset());
    return g.addTensor(std::move(t));
  };
  Shape s{Dim{2, 0}, Dim{3, 0}, Dim{4, 0}};
  TensorId dense = add(s, {12, 4, 1}), none = add(s, {}), wrong = add(s, {1, 2});
  TensorId swapped = add(s, {12, 1, 3});
  Shape one{Dim{2, 0}, Dim{1, 0}, Dim{4, 0}};
  TensorId odd = add(one, {4, 99, 1}); // dense, but not the row-major list: kept as written
  Shape zero{Dim{0, 0}, Dim{3, 0}};
  TensorId empty = add(zero, {3, 1});
  for (TensorId t : {dense, none, wrong, empty}) {
    INFO("%" << t);
    CHECK(g.tensors[t].layout.strides().empty());
    CHECK(stridesOf(g.tensors[t].shape, g.tensors[t].layout) == denseStrides(g.tensors[t].shape));
    CHECK(isDense(g.tensors[t].shape, g.tensors[t].layout));
  }
  CHECK(stridesOf(s, g.tensors[swapped].layout) == llvm::SmallVector<int64_t, 4>{12, 1, 3});
  CHECK_FALSE(isDense(s, g.tensors[swapped].layout));
  CHECK(stridesOf(one, g.tensors[odd].layout) == llvm::SmallVector<int64_t, 4>{4, 99, 1});
  // The swapped tensor owns its storage, so it is the verifier's one complaint.
  CHECK_THAT(verifyGraph(g), Catch::Contains("%" + std::to_string(swapped) + " owns its storage but is not dense"));
  // setLayout keeps the offset and lists strides by the same rule.
  Tensor t = g.tensors[dense];
  setLayout(t, {1, 2, 6}, 5);
  CHECK(t.layout.offset() == 5);
  CHECK(t.layout.strides().size() == 3);
  setLayout(t, {12, 4, 1}, 0);
  CHECK(t.layout.strides().empty());
  // Sizes whose row-major strides overflow int64 are kept as listed, never multiplied past it.
  Shape huge{Dim{INT64_MAX / 2, 0}, Dim{INT64_MAX / 2, 0}, Dim{4, 0}};
  setLayout(t, {0, 4, 1}, 0);
  t.shape = huge;
  setLayout(t, {0, 4, 1}, 0);
  CHECK(t.layout.strides().size() == 3);
}

TEST_CASE("graph: a tensor's name is its parameter's path or its input's name", "[backward]") {
  Compiled c(fromFile, example("gpt2.tally"));
  const Graph &g = c.g();
  REQUIRE_FALSE(g.inputs.empty());
  CHECK(g.inputNames.size() == g.inputs.size());
  CHECK(g.tensorName(g.inputs[0]) == "tokens");
  for (const ParamInfo &p : g.params)
    CHECK(g.tensorName(p.tensor) == g.paramPath(p));
  CHECK(g.tensorName(g.loss).empty());
  CHECK(g.tensorName(g.params.front().tensor) == "wte.weight");
}

TEST_CASE("backward: the copies of a repeated block share their backward ops' attributes",
          "[backward]") {
  // GPT-2 has 12 copies of its block: every attribute set a backward op derives (a gradient
  // mask, the shape a bias gradient is summed to) is made once and shared by the 12, and
  // attributes that differ in one field are never shared.
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  const Graph &s = *t.a->step;
  std::set<const OpAttrs *> distinct;
  size_t backwardOps = 0;
  for (OpId i = static_cast<OpId>(t.g().ops.size()); i < s.ops.size(); ++i) {
    ++backwardOps;
    distinct.insert(&*s.ops[i].attrs);
  }
  for (const auto *a : distinct)
    for (const auto *b : distinct)
      if (a != b)
        CHECK_FALSE(sameAttrs(*a, *b));
  CHECK(backwardOps > 12 * distinct.size());

  OpAttrs base;
  base.newShape = {Dim{4, 0}, Dim{8, 1}};
  base.slices = {SliceDim{0, 2, 1, false}};
  base.optimizer = "AdamW";
  std::vector<std::function<void(OpAttrs &)>> edits = {
      [](OpAttrs &a) { a.dim = 2; },          [](OpAttrs &a) { a.parts = 3; },
      [](OpAttrs &a) { a.k = 2; },            [](OpAttrs &a) { a.capacity = 1.25; },
      [](OpAttrs &a) { a.heads = 12; },       [](OpAttrs &a) { a.kvHeads = 4; },
      [](OpAttrs &a) { a.causal = true; },    [](OpAttrs &a) { a.fused = false; },
      [](OpAttrs &a) { a.keepDim = true; },   [](OpAttrs &a) { a.reduceAll = false; },
      [](OpAttrs &a) { a.p = 0.1; },          [](OpAttrs &a) { a.eps = 1e-5; },
      [](OpAttrs &a) { a.hasScalar = true; }, [](OpAttrs &a) { a.scalar = -0.0; },
      [](OpAttrs &a) { a.scalarOnLeft = true; }, [](OpAttrs &a) { a.transposeA = 0; },
      [](OpAttrs &a) { a.transposeB = 1; },   [](OpAttrs &a) { a.newShape[1].sym = 2; },
      [](OpAttrs &a) { a.newShape[0].size = 5; }, [](OpAttrs &a) { a.newShape.pop_back(); },
      [](OpAttrs &a) { a.scale = 0.125; },    [](OpAttrs &a) { a.headDim = 64; },
      [](OpAttrs &a) { a.theta = 5e5; },      [](OpAttrs &a) { a.fraction = 0.25; },
      [](OpAttrs &a) { a.alibi = true; },     [](OpAttrs &a) { a.hasMask = true; },
      [](OpAttrs &a) { a.window[1] = 3; },    [](OpAttrs &a) { a.strides[0] = 2; },
      [](OpAttrs &a) { a.pads[1] = 1; },      [](OpAttrs &a) { a.slices[0].step = 2; },
      [](OpAttrs &a) { a.slices[0].drop = true; }, [](OpAttrs &a) { a.slices.clear(); },
      [](OpAttrs &a) { a.stream = 0; },       [](OpAttrs &a) { a.of = OpKind::Gelu; },
      [](OpAttrs &a) { a.gradMask = 5; },     [](OpAttrs &a) { a.optimizer = "SGD"; },
      [](OpAttrs &a) { a.shares = true; }};
  AttrsPool pool;
  SharedAttrs first = pool.get(base);
  CHECK(&*pool.get(base) == &*first);
  CHECK(hashAttrs(base) == hashAttrs(*first));
  for (size_t i = 0; i < edits.size(); ++i) {
    INFO("edit " << i);
    OpAttrs changed = base;
    edits[i](changed);
    CHECK_FALSE(sameAttrs(base, changed));
    CHECK(&*pool.get(changed) != &*first);
    CHECK(&*pool.get(changed) == &*pool.get(changed));
  }
}

TEST_CASE("graph: the training step shares its forward graph's records", "[backward]") {
  // The step's forward part is the forward graph itself (ir/Records.h): the same records at
  // the same addresses, not copies; a copy of the step is independent of both.
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  const Graph &f = t.g();
  const Graph &s = *t.a->step;
  REQUIRE(s.ops.size() > f.ops.size());
  CHECK(s.tensors.sharedCount() == f.tensors.size());
  CHECK(s.ops.sharedCount() == f.ops.size());
  CHECK(s.params.sharedCount() == f.params.size());
  CHECK(s.instances.sharedCount() == f.instances.size());
  CHECK(&s.tensors[0] == &f.tensors[0]);
  CHECK(&s.ops[f.ops.size() - 1] == &f.ops[f.ops.size() - 1]);
  CHECK(&s.params.back() == &f.params.back());
  Graph copy = s;
  CHECK(copy.tensors.sharedCount() == 0);
  CHECK(copy.ops.size() == s.ops.size());
  copy.ops[0].ordinal = 7;
  CHECK(f.ops[0].ordinal != 7);
  CHECK(verifyGraph(copy) == "");
}

TEST_CASE("graph: records shared by an extension stay put when their owner grows", "[backward]") {
  Records<int> base;
  base.reserve(3);
  for (int i : {1, 2, 3})
    base.push_back(i);
  Records<int> ext = Records<int>::extend(base);
  ext.push_back(10);
  const int *shared = &ext[0];
  CHECK(shared == &base[0]);
  base.push_back(4); // past its room while shared: the base moves to storage of its own
  base[0] = 7;
  CHECK(&ext[0] == shared);
  CHECK(std::vector<int>(ext.begin(), ext.end()) == std::vector<int>{1, 2, 3, 10});
  CHECK(std::vector<int>(base.begin(), base.end()) == std::vector<int>{7, 2, 3, 4});
  // Random access in both parts, as std algorithms use it.
  CHECK(std::lower_bound(ext.begin(), ext.end(), 3) - ext.begin() == 2);
  CHECK(ext.end() - ext.begin() == 4);
  // An extension of an extension copies rather than chaining; a copy is independent.
  Records<int> again = Records<int>::extend(ext);
  CHECK(again.sharedCount() == 0);
  CHECK(again.size() == 4);
  Records<int> copy = ext;
  copy[0] = 99;
  CHECK(ext[0] == 1);
  Records<int> moved = std::move(copy);
  CHECK(moved.size() == 4);
  CHECK(moved[0] == 99);
}

TEST_CASE("graph: equal shapes are one pooled copy", "[backward]") {
  ShapeRef a = Shape{Dim{8, 1}, Dim{768, 0}};
  ShapeRef b = Shape{Dim{8, 1}, Dim{768, 0}};
  CHECK(&a.get() == &b.get());
  CHECK(a == b);
  CHECK(ShapeRef(Shape{Dim{8, 2}, Dim{768, 0}}) != a); // another name
  CHECK(ShapeRef(Shape{Dim{8, 1}, Dim{769, 0}}) != a); // another size
  CHECK(ShapeRef(Shape{Dim{8, 1}}) != a);              // another rank
  CHECK(ShapeRef().empty());
  CHECK(ShapeRef() == ShapeRef(Shape()));
  CHECK(a.size() == 2);
  CHECK(a.back().size == 768);
  CHECK(numel(a) == 8 * 768);
  // Many shapes share each slot of the per-thread cache in front of the pool: each is found
  // again whole, never as another shape of its slot.
  std::vector<ShapeRef> many;
  for (int64_t i = 1; i <= 2000; ++i)
    many.push_back(ShapeRef(Shape{Dim{i, 0}, Dim{7, 0}}));
  for (int64_t i = 2000; i >= 1; --i) {
    ShapeRef again = Shape{Dim{i, 0}, Dim{7, 0}};
    CHECK(again == many[i - 1]);
    CHECK(again[0].size == i);
    CHECK(Layout({i, 1}, i).offset() == i);
    CHECK(Layout({i, 1}, i).strides()[0] == i);
    CHECK(pooledName("p" + std::to_string(i)) == "p" + std::to_string(i));
  }
  // A model's tensors share a few shapes: GPT-2's step has thousands of tensors and far fewer
  // distinct shapes.
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  std::set<const Shape *> distinct;
  for (const Tensor &x : t.a->step->tensors)
    distinct.insert(&x.shape.get());
  CHECK(t.a->step->tensors.size() > 20 * distinct.size());
}

TEST_CASE("graph: an op's path is its instance's, its kind and its forward op's", "[backward]") {
  // Paths are derived, not stored (Graph::opPath): forward ops from their instance, kind and
  // ordinal; backward ops from their forward op; the rest are their kind.
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  const Graph &s = *t.a->step;
  CHECK(s.opPath(0) == "wte.embedding");
  bool second = false, backward = false, optimizer = false;
  for (OpId o = 0; o < s.ops.size(); ++o) {
    const Op &op = s.ops[o];
    std::string path = s.opPath(o);
    if (op.phase == Phase::Forward) {
      std::string expected = joinPath(s.instancePath(op.instance), opName(op.kind));
      if (op.ordinal > 1) {
        second = true;
        expected += "#" + std::to_string(op.ordinal);
      }
      CHECK(path == expected);
    } else if (op.forwardOp != kNone) {
      backward = true;
      CHECK(path == s.opPath(op.forwardOp) + "." + opName(op.kind).str());
    } else {
      optimizer = optimizer || op.phase == Phase::Optimizer;
      CHECK(path == opName(op.kind).str());
    }
  }
  CHECK(second); // a block with two ops of one kind ("h[0].attn.add#2"...)
  CHECK(backward);
  CHECK(optimizer);
  // A broken graph's ops still have a path, for the verifier to name them.
  Graph broken = s;
  broken.ops[0].instance = 1u << 30;
  CHECK(broken.opPath(0) == "<instance 1073741824>.embedding");
  OpId last = static_cast<OpId>(broken.ops.size() - 1);
  broken.ops[last].phase = Phase::Backward;
  broken.ops[last].forwardOp = last; // itself: not followed
  CHECK(broken.opPath(last) == opName(broken.ops[last].kind).str());
  CHECK_THAT(verifyGraph(broken), Catch::Contains("names no block instance"));
}

TEST_CASE("graph: an op's id list keeps three ids inline and any number on the heap", "[backward]") {
  IdList l{7, 8};
  CHECK(l.size() == 2);
  CHECK(l.back() == 8);
  l.push_back(9);
  const uint32_t *inlineIds = l.data();
  CHECK(l.data() == inlineIds);
  for (uint32_t i = 10; i < 100; ++i) // past three: a heap block, grown as needed
    l.push_back(i);
  CHECK(l.size() == 93);
  CHECK(l.data() != inlineIds);
  for (uint32_t i = 0; i < l.size(); ++i)
    CHECK(l[i] == 7 + i);
  IdList copy = l; // a deep copy
  copy[0] = 1;
  CHECK(l[0] == 7);
  CHECK(copy.size() == 93);
  IdList moved = std::move(copy); // takes the block
  CHECK(moved.size() == 93);
  CHECK(moved[0] == 1);
  CHECK(copy.empty());
  moved.assign({4, 5}); // back inline
  CHECK(moved == IdList{4, 5});
  CHECK(moved != l);
  llvm::ArrayRef<uint32_t> view = l;
  CHECK(view.size() == 93);
  CHECK(view.front() == 7);
  llvm::SmallVector<TensorId, 3> small{1, 2, 3, 4};
  l = small;
  CHECK(l.size() == 4);
  CHECK(l[3] == 4);
  l.append(small.begin(), small.end());
  CHECK(l.size() == 8);
  l.clear();
  CHECK(l.empty());
  l.push_back(3);
  CHECK(l.front() == 3);
  CHECK(sizeof(IdList) == 16);
  // An optimizer update lists every parameter: GPT-2's has 148 inputs.
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  const Op &update = t.a->step->ops[t.a->step->ops.size() - 2];
  CHECK(update.kind == OpKind::OptimizerUpdate);
  CHECK(update.inputs.size() == t.a->graph->params.size());
  CHECK(update.outputs.size() == update.inputs.size());
}

TEST_CASE("graph: equal layouts are one pooled copy", "[backward]") {
  Layout a({8, 1}, 16), b({8, 1}, 16);
  CHECK(a == b);
  CHECK(a != Layout({8, 1}, 0)); // another offset
  CHECK(a != Layout({1, 8}, 16)); // other strides
  CHECK(a.offset() == 16);
  CHECK(a.strides().vec() == std::vector<int64_t>{8, 1});
  CHECK(Layout().strides().empty());
  CHECK(Layout() == Layout({}, 0));
  // The views of GPT-2's step (split parts, transposed weights) share a few layouts.
  Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M");
  std::set<const int64_t *> distinct;
  size_t views = 0;
  for (const Tensor &x : t.a->step->tensors)
    if (x.viewOf != kNone) {
      ++views;
      distinct.insert(x.layout.strides().data());
    }
  CHECK(views > 100);
  CHECK(views > 10 * distinct.size());
}

TEST_CASE("graph: a label is one byte naming a text of a small table", "[backward]") {
  Label a("dropout mask");
  std::string copy = "dropout mask";
  Label b(copy.c_str()); // the same text at another address
  CHECK(std::string(a.c_str()) == "dropout mask");
  CHECK(std::strcmp(a, b) == 0);
  CHECK(a.c_str() == b.c_str()); // one copy of each text
  // The per-thread cache is keyed by address: an address reused for another text is another label.
  char buffer[32];
  std::strcpy(buffer, "row statistics");
  Label c(buffer);
  std::strcpy(buffer, "logsumexp");
  Label d(buffer);
  CHECK(std::string(c.c_str()) == "row statistics");
  CHECK(std::string(d.c_str()) == "logsumexp");
  CHECK(std::string(Label().c_str()).empty());
  CHECK(sizeof(Label) == 1);
}

namespace {

/// kTinyGPTModel with `layers` blocks and a train plan; `leak` adds the output of h[2] to the
/// last block's (each block called by hand), so an op outside the copies reads a middle copy's
/// tensor.
std::string tinyGPT(int layers, const std::string &precision, bool byHand = false, bool leak = false) {
  std::string text = kTinyGPTModel;
  if (byHand) {
    std::string body = "    x0 = wte(tokens)\n";
    for (int i = 0; i < layers; ++i)
      body += "    x" + std::to_string(i + 1) + " = h[" + std::to_string(i) + "](x" + std::to_string(i) + ")\n";
    std::string last = "x" + std::to_string(layers) + (leak ? " + x3" : "");
    body += "    logits = lnf(" + last + ") @ transpose(wte.weight)\n";
    std::string from = "    logits = lnf(h(wte(tokens))) @ transpose(wte.weight)\n";
    text.replace(text.find(from), from.size(), body);
  }
  return text + "train t { model = TinyGPT(vocab = 256, d = 64, layers = " + std::to_string(layers) +
         ")  batch = 4  seq = 32  precision = " + precision +
         "  optimizer = AdamW(lr = 1e-3)  target = H100_SXM }\n";
}

/// How many ops have records in `x` that differ from `y`'s (the two analyse the same graph).
size_t differingRecords(const Analysis &x, const Analysis &y) {
  REQUIRE(x.ops.size() == y.ops.size());
  size_t differ = 0;
  for (OpId o = 0; o < y.ops.size(); ++o)
    differ += !OpTable::same(x.ops[o], y.ops[o]);
  return differ;
}

/// The analyses of one plan with the whole step and with a compact one (analyzeGraph, with and
/// without compactStep), once checked: the compact step checks clean, and every op's record,
/// every FLOP total and the local gradients' bound come out as the whole step's.
std::pair<Analysis, Analysis> compareSteps(const Graph &g, const Plan &plan) {
  Analysis whole = analyzeGraph(g, plan);
  Analysis compact = analyzeGraph(g, plan, nullptr, /*compactStep=*/true);
  REQUIRE(whole.step);
  REQUIRE(compact.step);
  CHECK(whole.step->skipped.count == 0);
  const Graph &s = *compact.step;
  CHECK(verifyGraph(s, g.ops.size(), g.tensors.size()) == "");
  CHECK(verifyOpTypes(s, static_cast<OpId>(g.ops.size())) == "");
  CHECK(localGradientBound(s, g.tensors.size()) == localGradientBound(*whole.step, g.tensors.size()));
  CHECK(differingRecords(compact, whole) == 0);
  CHECK(compact.flops.backwardInputGrad == whole.flops.backwardInputGrad);
  CHECK(compact.flops.backwardWeightGrad == whole.flops.backwardWeightGrad);
  CHECK(compact.flops.optimizer == whole.flops.optimizer);
  CHECK(compact.flops.step == whole.flops.step);
  CHECK(compact.flops.executed == whole.flops.executed);
  return {std::move(whole), std::move(compact)};
}

/// compareSteps on `t`'s plan, whether the compact step skips copies (`skips`) or is whole,
/// and the same numbers through analyze as `tally check` runs it.
void compareCompact(Compiled &t, bool skips) {
  const Graph &g = t.g();
  const Plan &plan = *t.a->plan;
  auto [whole, compact] = compareSteps(g, plan);
  const Graph &s = *compact.step;
  if (skips) {
    CHECK(s.skipped.count > 0);
    CHECK(s.ops.size() < whole.step->ops.size());
    CHECK(s.tensors.size() < whole.step->tensors.size());
  } else {
    CHECK(s.skipped.count == 0);
    CHECK(s.ops.size() == whole.step->ops.size());
  }
  // As `tally check` analyses (no plan listed, the step released): the same numbers.
  DiagnosticEngine quiet(t.c.sm);
  quiet.setOutput(nullptr);
  Analysis checked = analyze(g, plan, quiet, {}, checkOptions());
  CHECK(checked.stepReleased);
  CHECK(checked.localGradientBytes == localGradientBound(*whole.step, g.tensors.size()));
  CHECK(checked.time.step == t.a->time.step);
  CHECK(checked.memory.peak == t.a->memory.peak);
  CHECK(checked.flops.backward == t.a->flops.backward);
}

} // namespace

TEST_CASE("backward: a compact step skips the copies that repeat another's, and prices as the whole step",
          "[backward][compact]") {
  for (const char *name : {"gpt2.tally", "llama2_7b.tally", "mixtral_8x7b.tally"}) {
    INFO(name);
    Compiled t(fromFile, example(name));
    compareCompact(t, true);
  }
  for (const char *lit : {"lang-vit.tally", "checkpoint-nested.tally"}) {
    INFO(lit);
    Compiled t(fromFile, sourceDir() + "/tests/lit/" + lit);
    compareCompact(t, true);
  }
  for (const char *precision : {"mixed_bf16", "mixed_fp16", "fp32"}) {
    INFO(precision);
    Compiled t(tinyGPT(12, precision));
    compareCompact(t, true);
    Compiled byHand(tinyGPT(12, precision, /*byHand=*/true));
    compareCompact(byHand, true);
  }
}

TEST_CASE("backward: a deep graph's step is built while another thread prices its ops, with the numbers of one thread",
          "[backward][threads]") {
  Compiled t(tinyGPT(300, "mixed_bf16"));
  const Graph &g = t.g();
  const Plan &plan = *t.a->plan;
  REQUIRE(g.ops.size() >= kThreadedOps); // analyzeGraph's two threads
  for (bool compact : {false, true}) {
    INFO("compact step: " << compact);
    Analysis both = analyzeGraph(g, plan, nullptr, compact);
    // Given the step, analyzeGraph prices the ops before autodiff reads them, on one thread.
    auto step = std::make_shared<const Graph>(buildTrainingStep(g, plan, compact ? both.copies.get() : nullptr));
    Analysis one = analyzeGraph(g, plan, step, compact);
    REQUIRE(both.step);
    CHECK(both.step->ops.size() == one.step->ops.size());
    CHECK(both.step->tensors.size() == one.step->tensors.size());
    CHECK(both.step->skipped.count == one.step->skipped.count);
    CHECK((both.step->skipped.count > 0) == compact);
    CHECK(both.params.total == one.params.total);
    CHECK(both.params.trainable == one.params.trainable);
    REQUIRE(both.params.byBlock.size() == one.params.byBlock.size());
    for (size_t i = 0; i < one.params.byBlock.size(); ++i)
      CHECK(both.params.byBlock[i].count == one.params.byBlock[i].count);
    CHECK(differingRecords(both, one) == 0);
    CHECK(both.flops.forward == one.flops.forward);
    CHECK(both.flops.forwardMatmul == one.flops.forwardMatmul);
    CHECK(both.flops.step == one.flops.step);
    CHECK(both.flops.executed == one.flops.executed);
    CHECK(both.params.total > 300 * 12 * 64 * 64); // counted at all: 12 d² per layer and more

    // A plan's own analysis also makes the saved lists and the walks' graph facts on the
    // second thread: the lists differentiate makes, facts the walks take as they are.
    Analysis prepared = analyzeGraph(g, plan, nullptr, compact, /*prepare=*/true);
    REQUIRE(prepared.saved);
    REQUIRE(one.saved);
    CHECK(prepared.saved != one.saved);
    CHECK(prepared.saved->from == one.saved->from);
    REQUIRE(prepared.saved->items.size() == one.saved->items.size());
    for (size_t i = 0; i < one.saved->items.size(); ++i) {
      const SavedTensor &x = prepared.saved->items[i], &y = one.saved->items[i];
      CHECK((x.tensor == y.tensor && x.bytes == y.bytes && std::strcmp(x.what.c_str(), y.what.c_str()) == 0));
    }
    CHECK(walkMemoStats(*prepared.walks).structures == 1);
    CHECK(walkMemoStats(*one.walks).structures == 0);
    for (Analysis *x : {&prepared, &one}) {
      x->ridge = plan.target.ridge(plan.precision.activations);
      staticMemory(*x);
      planActivations(*x);
    }
    CHECK(walkMemoStats(*prepared.walks).structures == 1); // the prepared facts, not built again
    CHECK(prepared.memory.activations == one.memory.activations);
    CHECK(prepared.memory.peak == one.memory.peak);
    CHECK(prepared.checkpoint.curve.size() == one.checkpoint.curve.size());
  }
}

TEST_CASE("activations: a deep model's trade-off curve walked on another thread while later passes write the records",
          "[activations][threads]") {
  for (const char *checkpoint : {"none", "auto"}) {
    INFO("checkpoint = " << checkpoint);
    PlanOverrides o;
    o.checkpoint = checkpoint;
    Compiled t(tinyGPT(300, "mixed_bf16"), "", o);
    const Graph &g = t.g();
    const Plan &plan = *t.a->plan;
    REQUIRE(g.ops.size() >= kThreadedOps);
    Analysis later = analyzeGraph(g, plan);
    later.ridge = plan.target.ridge(plan.precision.activations);
    staticMemory(later);
    Analysis now = later;
    now.walks = newWalkMemo(); // walks of its own, not the other's memo
    std::function<void()> curve;
    planActivations(later, &curve);
    REQUIRE(curve);
    CHECK(later.checkpoint.curve.empty());
    // What analyze runs beside the walks: passes that write the per-op records.
    std::thread walks(curve);
    roofline(later);
    stepTime(later);
    walks.join();
    planActivations(now); // the curve walked here, before anything else
    REQUIRE(now.checkpoint.curve.size() >= 2);
    REQUIRE(later.checkpoint.curve.size() == now.checkpoint.curve.size());
    for (size_t i = 0; i < now.checkpoint.curve.size(); ++i) {
      const auto &x = later.checkpoint.curve[i], &y = now.checkpoint.curve[i];
      INFO("point " << i << ": " << y.policy);
      CHECK(x.policy == y.policy);
      CHECK(x.checkpointed == y.checkpointed);
      CHECK(x.peakBytes == y.peakBytes);
      CHECK(x.recomputeFlops == y.recomputeFlops);
      CHECK(x.recomputeSeconds == y.recomputeSeconds);
    }
    CHECK(later.memory.peak == now.memory.peak);
  }
}

TEST_CASE("backward: a step stays whole where copies cannot be proven to repeat", "[backward][compact]") {
  // Too few copies: the model, the copy after it and the run's first are built, nothing left.
  Compiled four(tinyGPT(4, "mixed_bf16"));
  compareCompact(four, false);
  // An op outside the copies reads h[2]'s output: h[2]'s gradient gets a second writer, so
  // its backward differs from the model's (it accumulates), and h[2] is no longer sealed.
  Compiled leak(tinyGPT(12, "mixed_bf16", /*byHand=*/true, /*leak=*/true));
  compareCompact(leak, false);
}

TEST_CASE("backward: on every example and lit input, the compact step prices as the whole step",
          "[backward][compact]") {
  std::vector<std::string> files;
  for (const char *dir : {"/examples", "/tests/lit"})
    for (const auto &e : std::filesystem::directory_iterator(sourceDir() + dir))
      if (e.path().extension() == ".tally" && e.path().filename() != "diag-model-bounds.tally")
        files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  size_t plans = 0, compacted = 0;
  for (const std::string &file : files) {
    Compilation c;
    c.diags.setOutput(nullptr);
    if (!c.addFile(file))
      continue; // a lit input of syntax errors
    for (const PlanDecl *decl : std::vector<const PlanDecl *>(c.program.planOrder)) {
      if (!c.lower(*decl) || !c.plan->isTrain)
        continue;
      INFO(file << ", plan " << decl->name);
      auto [whole, compact] = compareSteps(*c.graph, *c.plan);
      ++plans;
      compacted += compact.step->skipped.count > 0;
    }
  }
  INFO(plans << " train plans, " << compacted << " compact");
  CHECK(plans >= 90); // 96 when written
  CHECK(compacted >= 12); // 15 when written
}
