// test_oprules.cpp — unit tests for the per-op table (ir/OpRules.h): shape inference and its
// error messages, forward FLOPs and bytes, gradient FLOPs, executed (causal, recompute) FLOPs
// and saved tensors, checked against the formulas in docs/counting.md. Graphs are built by hand
// the way lowering builds them: infer the outputs, then add them and the op.
#include <catch.hpp>

#include "ir/OpRules.h"

#include <set>

using namespace tally;

namespace {

/// A graph under construction, with helpers that mirror what lowering does.
struct Builder {
  Graph g;

  explicit Builder(Dtype act = Dtype::F32) {
    g.activationDtype = act;
    g.instances.push_back(Instance());
  }

  /// A shape from sizes and optional names: shape({{2, "batch"}, {768, ""}}).
  Shape shape(std::initializer_list<std::pair<int64_t, const char *>> dims) {
    Shape s;
    for (auto &d : dims)
      s.push_back(Dim{d.first, g.symbol(d.second)});
    return s;
  }
  static Shape sizes(std::initializer_list<int64_t> dims) {
    Shape s;
    for (int64_t d : dims)
      s.push_back(Dim{d, 0});
    return s;
  }

  TensorId input(Shape s, Dtype dt = Dtype::F32) {
    Tensor t;
    t.shape = std::move(s);
    t.dtype = dt;
    t.role = TensorRole::Input;
    TensorId id = g.addTensor(t);
    g.inputs.push_back(id);
    g.inputNames.push_back("x");
    return id;
  }
  /// An activation with no producer here (a previous block's output): it needs a gradient.
  TensorId activation(Shape s, Dtype dt) {
    Tensor t;
    t.shape = std::move(s);
    t.dtype = dt;
    t.requiresGrad = true;
    return g.addTensor(t);
  }
  TensorId param(Shape s, Dtype dt = Dtype::F32) {
    Tensor t;
    t.shape = std::move(s);
    t.dtype = dt;
    t.role = TensorRole::Param;
    t.requiresGrad = true;
    t.param = static_cast<uint32_t>(g.params.size());
    TensorId id = g.addTensor(t);
    ParamInfo p;
    p.name = &pooledName("p" + std::to_string(id));
    p.tensor = id;
    g.params.push_back(p);
    return id;
  }

  /// Runs the shape rule; on success adds the outputs and the op and returns its id.
  bool tryOp(OpKind k, std::vector<TensorId> ins, OpAttrs attrs, OpId &id, ShapeError &err) {
    Op op;
    op.kind = k;
    op.inputs.assign(ins.begin(), ins.end());
    op.attrs = std::move(attrs);
    llvm::SmallVector<TensorType, 3> outs;
    if (!ruleFor(k).infer(g, op, outs, err))
      return false;
    bool grad = false;
    for (TensorId t : ins)
      grad |= g.tensors[t].requiresGrad;
    for (const TensorType &tt : outs) {
      Tensor t;
      t.shape = tt.shape;
      t.dtype = tt.dtype;
      t.requiresGrad = grad && isFloat(tt.dtype);
      if (opClass(k) == OpClass::View)
        t.viewOf = g.tensors[ins[0]].viewOf != kNone ? g.tensors[ins[0]].viewOf : ins[0];
      op.outputs.push_back(g.addTensor(t));
    }
    id = g.addOp(std::move(op));
    return true;
  }
  OpId op(OpKind k, std::vector<TensorId> ins, OpAttrs attrs = OpAttrs()) {
    OpId id = kNone;
    ShapeError err;
    bool ok = tryOp(k, std::move(ins), std::move(attrs), id, err);
    INFO(err.message);
    REQUIRE(ok);
    return id;
  }
  ShapeError error(OpKind k, std::vector<TensorId> ins, OpAttrs attrs = OpAttrs()) {
    OpId id;
    ShapeError err;
    bool ok = tryOp(k, std::move(ins), std::move(attrs), id, err);
    REQUIRE_FALSE(ok);
    return err;
  }
  TensorId out(OpId o, unsigned i = 0) const { return g.ops[o].outputs[i]; }
  const Shape &shapeOf(TensorId t) const { return g.tensors[t].shape; }

  ForwardCost fwd(OpId o) const { return ruleFor(g.ops[o].kind).forward(g, g.ops[o]); }
  double grad(OpId o, unsigned i) const { return ruleFor(g.ops[o].kind).gradFlops(g, g.ops[o], i); }
  std::vector<bool> needs(OpId o) const {
    std::vector<bool> n;
    for (TensorId t : g.ops[o].inputs)
      n.push_back(g.tensors[t].requiresGrad);
    return n;
  }
  double executedBackward(OpId o, std::vector<bool> need) const {
    llvm::SmallVector<bool, 4> v(need.begin(), need.end());
    return ruleFor(g.ops[o].kind).executedBackwardFlops(g, g.ops[o], v);
  }
  double executedBackward(OpId o) const { return executedBackward(o, needs(o)); }
  std::vector<SavedTensor> saved(OpId o, std::vector<bool> need) const {
    llvm::SmallVector<bool, 4> v(need.begin(), need.end());
    std::vector<SavedTensor> s;
    ruleFor(g.ops[o].kind).saved(g, g.ops[o], v, s);
    return s;
  }
  std::vector<SavedTensor> saved(OpId o) const { return saved(o, needs(o)); }
};

OpAttrs withDim(int64_t d) {
  OpAttrs a;
  a.dim = d;
  return a;
}

} // namespace

TEST_CASE("oprules: every op kind has a complete rule", "[oprules]") {
  for (unsigned k = 0; k < kOpKinds; ++k) {
    const OpRule &r = ruleFor(static_cast<OpKind>(k));
    INFO(opName(static_cast<OpKind>(k)).str());
    CHECK(r.infer);
    CHECK(r.forward);
    CHECK(r.gradFlops);
    CHECK(r.executedBackwardFlops);
    CHECK(r.saved);
  }
}

TEST_CASE("oprules: broadcastShapes and normalizeAxis", "[oprules]") {
  Shape out;
  REQUIRE(broadcastShapes(Builder::sizes({2, 1, 5}), Builder::sizes({3, 1}), out));
  CHECK(Graph::formatSizes(out) == "[2, 3, 5]");
  REQUIRE(broadcastShapes(Builder::sizes({}), Builder::sizes({4}), out));
  CHECK(Graph::formatSizes(out) == "[4]");
  CHECK_FALSE(broadcastShapes(Builder::sizes({3, 4}), Builder::sizes({5}), out));

  size_t a = 99;
  CHECK(normalizeAxis(-1, 3, a));
  CHECK(a == 2);
  CHECK(normalizeAxis(0, 3, a));
  CHECK(a == 0);
  CHECK_FALSE(normalizeAxis(3, 3, a));
  CHECK_FALSE(normalizeAxis(-4, 3, a));
  CHECK_FALSE(normalizeAxis(0, 0, a));
}

TEST_CASE("oprules: matmul FLOPs, bytes, gradients and saved operands", "[oprules]") {
  Builder b;
  TensorId x = b.input(Builder::sizes({1024, 1024}));
  TensorId w = b.param(Builder::sizes({1024, 64}));
  OpId mm = b.op(OpKind::Matmul, {x, w});
  CHECK(Graph::formatSizes(b.shapeOf(b.out(mm))) == "[1024, 64]");
  CHECK(b.g.tensors[b.out(mm)].dtype == Dtype::F32);

  ForwardCost c = b.fwd(mm);
  double f = 2.0 * 1024 * 1024 * 64;
  CHECK(c.flops == f);
  CHECK(c.matmulFlops == f);
  CHECK(c.executedFlops == f);
  CHECK(c.bytesRead == (1024.0 * 1024 + 1024 * 64) * 4);
  CHECK(c.bytesWritten == 1024.0 * 64 * 4);
  CHECK(b.grad(mm, 0) == f);
  CHECK(b.grad(mm, 1) == f);

  // x is data: only the weight gradient runs, and it needs x.
  CHECK(b.executedBackward(mm) == f);
  auto s = b.saved(mm);
  REQUIRE(s.size() == 1);
  CHECK(s[0].tensor == x);
  CHECK(s[0].bytes == 1024.0 * 1024 * 4);
  // Both need gradients: both operands are kept and both products run.
  CHECK(b.executedBackward(mm, {true, true}) == 2 * f);
  CHECK(b.saved(mm, {true, true}).size() == 2);
  CHECK(b.saved(mm, {false, false}).empty());
}

TEST_CASE("oprules: batched and 1-D matmul", "[oprules]") {
  Builder b;
  TensorId a = b.input(b.shape({{2, "batch"}, {1, ""}, {8, "seq"}, {16, ""}}));
  TensorId w = b.input(b.shape({{3, "heads"}, {16, ""}, {4, ""}}));
  OpId mm = b.op(OpKind::Matmul, {a, w});
  CHECK(b.g.formatShape(b.shapeOf(b.out(mm))) == "[batch, heads, seq, 4]");
  CHECK(b.fwd(mm).flops == 2.0 * (2 * 3) * 8 * 4 * 16);
  CHECK(b.grad(mm, 0) == 2.0 * 6 * 8 * 4 * 16);

  TensorId v = b.input(Builder::sizes({16}));
  TensorId m = b.input(Builder::sizes({16, 5}));
  OpId vm = b.op(OpKind::Matmul, {v, m});
  CHECK(Graph::formatSizes(b.shapeOf(b.out(vm))) == "[5]");
  CHECK(b.fwd(vm).flops == 2.0 * 5 * 16);
  TensorId x = b.input(Builder::sizes({2, 8, 16}));
  OpId mv = b.op(OpKind::Matmul, {x, v});
  CHECK(Graph::formatSizes(b.shapeOf(b.out(mv))) == "[2, 8]");
  CHECK(b.fwd(mv).flops == 2.0 * 2 * 8 * 16);

  ShapeError e = b.error(OpKind::Matmul, {b.input(Builder::sizes({2, 8, 16})),
                                          b.input(Builder::sizes({3, 16, 4}))});
  CHECK(e.kind == ShapeErrorKind::Matmul);
  CHECK(e.message == "matmul batch dimensions cannot be broadcast: [2, 8, 16] @ [3, 16, 4]");
}

TEST_CASE("oprules: matmul inner dimension error names both shapes", "[oprules]") {
  Builder b;
  TensorId x = b.input(b.shape({{4, "batch"}, {128, "seq"}, {768, ""}}));
  TensorId w = b.param(Builder::sizes({512, 2304}));
  ShapeError e = b.error(OpKind::Matmul, {x, w});
  CHECK(e.kind == ShapeErrorKind::Matmul);
  CHECK(e.message == "matmul inner dimensions differ: [batch, seq, 768] @ [512, 2304]");
}

TEST_CASE("oprules: broadcasting elementwise ops", "[oprules]") {
  Builder b;
  TensorId x = b.activation(b.shape({{2, "batch"}, {8, "seq"}, {32, "d"}}), Dtype::F32);
  TensorId bias = b.param(Builder::sizes({32}));
  OpId add = b.op(OpKind::Add, {x, bias});
  CHECK(b.g.formatShape(b.shapeOf(b.out(add))) == "[batch, seq, d]");
  double n = 2 * 8 * 32;
  CHECK(b.fwd(add).flops == n);
  CHECK(b.fwd(add).bytesRead == (n + 32) * 4);
  CHECK(b.grad(add, 0) == 0); // same shape as the output: the gradient passes through
  CHECK(b.grad(add, 1) == n); // broadcast: summed over batch and seq
  CHECK(b.executedBackward(add) == n);
  CHECK(b.saved(add).empty());

  ShapeError e = b.error(OpKind::Add, {b.input(Builder::sizes({3, 4})), b.input(Builder::sizes({5}))});
  CHECK(e.kind == ShapeErrorKind::Broadcast);
  CHECK(e.message == "cannot broadcast [3, 4] and [5] for add");

  // Mul keeps the other operand for each gradient; broadcast adds the reduction.
  OpId mul = b.op(OpKind::Mul, {x, bias});
  CHECK(b.grad(mul, 0) == n);
  CHECK(b.grad(mul, 1) == 2 * n);
  auto s = b.saved(mul);
  REQUIRE(s.size() == 2);
  CHECK(s[0].tensor == bias);
  CHECK(s[1].tensor == x);
  auto sq = b.saved(b.op(OpKind::Mul, {x, x}));
  CHECK(sq.size() == 1); // x * x keeps x once

  OpId div = b.op(OpKind::Div, {x, x});
  CHECK(b.grad(div, 0) == n);
  CHECK(b.grad(div, 1) == 3 * n);
  OpId sub = b.op(OpKind::Sub, {x, x});
  CHECK(b.grad(sub, 0) == 0);
  CHECK(b.grad(sub, 1) == n);

  // Scalar forms: one tensor input, the constant costs no bytes.
  OpAttrs sc;
  sc.hasScalar = true;
  sc.scalar = 2;
  OpId addc = b.op(OpKind::Add, {x}, sc);
  CHECK(b.fwd(addc).bytesRead == n * 4);
  CHECK(b.grad(addc, 0) == 0);
  OpId mulc = b.op(OpKind::Mul, {x}, sc);
  CHECK(b.grad(mulc, 0) == n);
  CHECK(b.saved(mulc).empty());
  OpId divc = b.op(OpKind::Div, {x}, sc);
  CHECK(b.grad(divc, 0) == n);
  CHECK(b.saved(divc).empty());
  sc.scalarOnLeft = true;
  CHECK(b.grad(b.op(OpKind::Sub, {x}, sc), 0) == n); // 2 - x: the gradient is negated
  OpId rdiv = b.op(OpKind::Div, {x}, sc);             // 2 / x: -g·y²/2 needs the output
  CHECK(b.grad(rdiv, 0) == 3 * n);
  REQUIRE(b.saved(rdiv).size() == 1);
  CHECK(b.saved(rdiv)[0].tensor == b.out(rdiv));

  // Integer arithmetic keeps its dtype; anything with a float becomes the activation dtype.
  TensorId ids = b.input(Builder::sizes({4}), Dtype::I32);
  CHECK(b.g.tensors[b.out(b.op(OpKind::Add, {ids, ids}))].dtype == Dtype::I32);
}

TEST_CASE("oprules: unary elementwise costs and saved tensors", "[oprules]") {
  Builder b(Dtype::BF16);
  TensorId x = b.activation(Builder::sizes({4, 10}), Dtype::BF16);
  double n = 40;
  struct Row {
    OpKind k;
    double fwd, grad;
    int keeps; // 0 nothing, 1 input, 2 output
  };
  for (Row r : {Row{OpKind::Neg, 1, 1, 0}, Row{OpKind::Relu, 1, 1, 2}, Row{OpKind::Gelu, 8, 12, 1},
                Row{OpKind::GeluTanh, 8, 12, 1}, Row{OpKind::Silu, 4, 6, 1}, Row{OpKind::Tanh, 4, 3, 2},
                Row{OpKind::Sigmoid, 4, 3, 2}, Row{OpKind::Exp, 1, 1, 2},
                Row{OpKind::Rope, 3, 3, 0}}) {
    INFO(opName(r.k).str());
    OpId o = b.op(r.k, {x});
    CHECK(b.g.tensors[b.out(o)].dtype == Dtype::BF16);
    CHECK(b.fwd(o).flops == r.fwd * n);
    CHECK(b.fwd(o).bytesRead == n * 2);
    CHECK(b.fwd(o).bytesWritten == n * 2);
    CHECK(b.grad(o, 0) == r.grad * n);
    auto s = b.saved(o);
    CHECK(s.size() == (r.keeps ? 1u : 0u));
    if (r.keeps)
      CHECK(s[0].tensor == (r.keeps == 1 ? x : b.out(o)));
    CHECK(b.saved(o, {false}).empty());
  }
  ShapeError e = b.error(OpKind::Rope, {b.input(Builder::sizes({4, 7}))});
  CHECK(e.message == "rope needs an even last dimension: [4, 7]");
}

TEST_CASE("oprules: dropout keeps a one-byte mask", "[oprules]") {
  Builder b(Dtype::BF16);
  TensorId x = b.activation(Builder::sizes({2, 8, 32}), Dtype::BF16);
  OpAttrs a;
  a.p = 0.1;
  OpId d = b.op(OpKind::Dropout, {x}, a);
  double n = 2 * 8 * 32;
  CHECK(b.fwd(d).flops == n);
  CHECK(b.fwd(d).bytesWritten == n * 2 + n); // output and mask
  CHECK(b.grad(d, 0) == n);
  auto s = b.saved(d);
  REQUIRE(s.size() == 1);
  // The mask is the op's second output: a u8 tensor of the input's shape.
  REQUIRE(b.g.ops[d].outputs.size() == 2);
  CHECK(s[0].tensor == b.g.ops[d].outputs[1]);
  CHECK(b.g.tensors[s[0].tensor].dtype == Dtype::U8);
  CHECK(s[0].bytes == n);
  CHECK(std::string(s[0].what) == "dropout mask");
}

TEST_CASE("oprules: softmax and normalisations keep row statistics", "[oprules]") {
  Builder b(Dtype::BF16);
  TensorId x = b.activation(b.shape({{2, "batch"}, {8, "seq"}, {32, ""}}), Dtype::BF16);
  TensorId w = b.param(Builder::sizes({32}), Dtype::BF16);
  TensorId bias = b.param(Builder::sizes({32}), Dtype::BF16);
  double n = 2 * 8 * 32, rows = 16;

  OpId sm = b.op(OpKind::Softmax, {x}, withDim(-1));
  CHECK(b.fwd(sm).flops == 5 * n);
  CHECK(b.grad(sm, 0) == 4 * n);
  REQUIRE(b.saved(sm).size() == 1);
  CHECK(b.saved(sm)[0].tensor == b.out(sm));

  OpId ln = b.op(OpKind::LayerNorm, {x, w, bias});
  CHECK(b.g.formatShape(b.shapeOf(b.out(ln))) == "[batch, seq, 32]");
  CHECK(b.fwd(ln).flops == 8 * n);
  CHECK(b.grad(ln, 0) == 12 * n);
  CHECK(b.grad(ln, 1) == n);
  CHECK(b.grad(ln, 2) == n);
  CHECK(b.executedBackward(ln) == 14 * n);
  double statBytes = 0, activationBytes = 0;
  for (const SavedTensor &s : b.saved(ln)) {
    if (std::string(s.what) == "row statistics") { // mean and rstd: fp32 outputs [batch, seq]
      CHECK(b.g.tensors[s.tensor].dtype == Dtype::F32);
      CHECK(std::string(s.what) == "row statistics");
      statBytes += s.bytes;
    } else if (b.g.tensors[s.tensor].role != TensorRole::Param) {
      CHECK(s.tensor == x);
      activationBytes += s.bytes;
    }
  }
  CHECK(statBytes == rows * 8);
  CHECK(activationBytes == n * 2);

  OpId rms = b.op(OpKind::RmsNorm, {x, w});
  CHECK(b.fwd(rms).flops == 5 * n);
  CHECK(b.grad(rms, 0) == 8 * n);
  CHECK(b.grad(rms, 1) == n);
  statBytes = 0;
  for (const SavedTensor &s : b.saved(rms))
    if (std::string(s.what) == "row statistics")
      statBytes += s.bytes;
  CHECK(statBytes == rows * 4);

  ShapeError e = b.error(OpKind::LayerNorm, {x, b.param(Builder::sizes({16}))});
  CHECK(e.kind == ShapeErrorKind::Mismatch);
  CHECK(e.message == "layer_norm weight [16] does not match the last dimension of [batch, seq, 32]");
}

TEST_CASE("oprules: a layer norm without a weight prices the normalisation alone", "[oprules]") {
  // layer_norm(x) (PyTorch's elementwise_affine = False, OLMo 1): mean, variance and normalise,
  // 6 per element (8 with the scale and shift); dx 11 per element (12 with g = w·dy); no
  // parameter read, kept or differentiated.
  Builder b(Dtype::BF16);
  TensorId x = b.activation(b.shape({{2, "batch"}, {8, "seq"}, {32, ""}}), Dtype::BF16);
  double n = 2 * 8 * 32, rows = 16;
  OpId ln = b.op(OpKind::LayerNorm, {x});
  REQUIRE(b.g.ops[ln].outputs.size() == 3);
  CHECK(b.g.formatShape(b.shapeOf(b.out(ln))) == "[batch, seq, 32]");
  CHECK(b.fwd(ln).flops == 6 * n);
  CHECK(b.fwd(ln).bytesRead == n * 2);                  // x alone, no weight
  CHECK(b.fwd(ln).bytesWritten == n * 2 + rows * 8);    // y, mean and rstd
  CHECK(b.grad(ln, 0) == 11 * n);
  CHECK(b.executedBackward(ln) == 11 * n);
  std::vector<SavedTensor> kept = b.saved(ln);
  REQUIRE(kept.size() == 3); // x and the row statistics: no weight
  CHECK(kept[0].tensor == x);
  CHECK(std::string(kept[1].what) == "row statistics");
  CHECK(std::string(kept[2].what) == "row statistics");

  // Its backward, layer_norm_backward(x, mean, rstd, dy): dx alone, the same 11 per element.
  OpAttrs dxOnly;
  dxOnly.gradMask = 1;
  TensorId dy = b.activation(b.shape({{2, "batch"}, {8, "seq"}, {32, ""}}), Dtype::BF16);
  OpId bwd = b.op(OpKind::LayerNormBackward, {x, b.out(ln, 1), b.out(ln, 2), dy}, dxOnly);
  REQUIRE(b.g.ops[bwd].outputs.size() == 1);
  CHECK(b.fwd(bwd).flops == 11 * n);
  CHECK(b.g.formatShape(b.shapeOf(b.out(bwd))) == "[batch, seq, 32]");
  OpAttrs withWeight;
  withWeight.gradMask = 3;
  ShapeError e = b.error(OpKind::LayerNormBackward, {x, b.out(ln, 1), b.out(ln, 2), dy}, withWeight);
  CHECK(e.message == "layer_norm_backward without a weight has no weight or bias gradient");
}

TEST_CASE("oprules: causal flash attention executes the lower triangle", "[oprules]") {
  Builder b(Dtype::BF16);
  const double B = 2, s = 1024, d = 768, h = 12, dh = 64;
  auto act = [&] { return b.activation(b.shape({{2, "batch"}, {1024, "seq"}, {768, ""}}), Dtype::BF16); };
  TensorId q = act(), k = act(), v = act();
  OpAttrs a;
  a.heads = 12;
  a.causal = true;
  OpId at = b.op(OpKind::Attention, {q, k, v}, a);
  CHECK(b.g.formatShape(b.shapeOf(b.out(at))) == "[batch, seq, 768]");

  double S = B * h * s * s;
  ForwardCost c = b.fwd(at);
  CHECK(c.matmulFlops == 4 * S * dh);
  CHECK(c.flops == 4 * S * dh + 5 * S);
  double frac = (s + 1) / (2 * s);
  CHECK(frac == 1025.0 / 2048.0);
  CHECK(c.executedFlops == Approx(c.flops * frac).epsilon(1e-15));
  CHECK(c.bytesRead == 3 * B * s * d * 2);
  CHECK(c.bytesWritten == B * s * d * 2 + B * h * s * 4);

  double gq = b.grad(at, 0), gk = b.grad(at, 1), gv = b.grad(at, 2);
  CHECK(gq == 4 * S * dh + 4 * S);
  CHECK(gk == 2 * S * dh);
  CHECK(gv == 2 * S * dh);
  // The products of the backward are twice the forward's; the softmax backward adds 4 per score.
  CHECK(gq + gk + gv - 4 * S == 2 * c.matmulFlops);
  // Executed: the needed gradients plus the recomputed scores and softmax, on the triangle.
  CHECK(b.executedBackward(at) == Approx((gq + gk + gv + 2 * S * dh + 5 * S) * frac).epsilon(1e-15));
  CHECK(b.executedBackward(at, {false, false, false}) == 0);

  auto saved = b.saved(at);
  REQUIRE(saved.size() == 5);
  CHECK(saved[3].tensor == b.out(at));
  CHECK(std::string(saved[4].what) == "logsumexp");
  CHECK(saved[4].bytes == B * h * s * 4);

  // Not causal: executed equals model FLOPs. Unfused causal: the dense matrix is computed.
  a.causal = false;
  OpId dense = b.op(OpKind::Attention, {q, k, v}, a);
  CHECK(b.fwd(dense).executedFlops == b.fwd(dense).flops);
  a.causal = true;
  a.fused = false;
  OpId unfused = b.op(OpKind::Attention, {q, k, v}, a);
  CHECK(b.fwd(unfused).executedFlops == b.fwd(unfused).flops);
  CHECK(b.executedBackward(unfused) == gq + gk + gv);
  CHECK(b.fwd(unfused).bytesWritten == B * s * d * 2 + 2 * S * 2);
  CHECK(b.fwd(unfused).bytesRead == 3 * B * s * d * 2 + 2 * S * 2);
}

TEST_CASE("oprules: sliding-window attention counts the window's scores (issue 44)", "[oprules]") {
  Builder b(Dtype::BF16);
  const double B = 2, h = 4, dh = 16;
  auto act = [&](int64_t s) { return b.activation(Builder::sizes({2, s, 64}), Dtype::BF16); };
  TensorId q = act(100), k = act(100), v = act(100);
  OpAttrs a;
  a.heads = 4;
  a.causal = true;
  a.attnWindow = 7;
  OpId at = b.op(OpKind::Attention, {q, k, v}, a);
  // Model FLOPs: each query's 7 keys, counted dense. Executed: the band, query i sees
  // min(i + 1, 7) keys: 1 + 2 + ... + 7 for the first seven, then 93·7.
  double F = B * h * 100 * 7, band = B * h * (28 + 93 * 7);
  ForwardCost c = b.fwd(at);
  CHECK(c.matmulFlops == 4 * F * dh);
  CHECK(c.flops == 4 * F * dh + 5 * F);
  CHECK(c.executedFlops == Approx(c.flops * band / F).epsilon(1e-15));
  CHECK(c.transcendentals == Approx(band).epsilon(1e-15));
  double gq = b.grad(at, 0), gk = b.grad(at, 1), gv = b.grad(at, 2);
  CHECK(gq == 4 * F * dh + 4 * F);
  CHECK(gk == 2 * F * dh);
  CHECK(gv == 2 * F * dh);
  CHECK(b.executedBackward(at) == Approx((gq + gk + gv + 2 * F * dh + 5 * F) * band / F).epsilon(1e-15));
  // The bytes are q, k, v in and the output and logsumexp out, as without a window.
  CHECK(c.bytesRead == 3 * B * 100 * 64 * 2);

  // A window as long as the keys is causal attention, bit for bit.
  OpAttrs full = a;
  full.attnWindow = 0;
  a.attnWindow = 100;
  OpId wide = b.op(OpKind::Attention, {q, k, v}, a), causal = b.op(OpKind::Attention, {q, k, v}, full);
  CHECK(b.fwd(wide).flops == b.fwd(causal).flops);
  CHECK(b.fwd(wide).executedFlops == b.fwd(causal).executedFlops);
  CHECK(b.executedBackward(wide) == b.executedBackward(causal));

  // Fewer queries than keys (a decode chunk after a prefix): query i is at position i + 6 and
  // sees keys i + 6 − 7 < j <= i + 6: 7 keys each, for all 4 queries; model FLOPs 4·7 per head.
  TensorId q4 = act(4), k10 = act(10), v10 = act(10);
  a.attnWindow = 7;
  OpId chunk = b.op(OpKind::Attention, {q4, k10, v10}, a);
  CHECK(b.fwd(chunk).executedFlops == b.fwd(chunk).flops);
  // More queries than keys: query i at position i − 6 sees keys i − 9 < j <= i − 6.
  TensorId q10 = act(10), k4 = act(4), v4 = act(4);
  a.attnWindow = 3;
  OpId late = b.op(OpKind::Attention, {q10, k4, v4}, a);
  // rows 6..9 see 1, 2, 3, 3 keys of min(3, 4) = 3 counted per row: 9 of 30.
  CHECK(b.fwd(late).executedFlops == Approx(b.fwd(late).flops * 9 / 30).epsilon(1e-15));

  // Unfused: the window's model FLOPs, but the dense matrix computed, then masked, and its bytes.
  a.attnWindow = 7;
  a.fused = false;
  OpId unfused = b.op(OpKind::Attention, {q, k, v}, a);
  double S = B * h * 100 * 100;
  CHECK(b.fwd(unfused).flops == c.flops);
  CHECK(b.fwd(unfused).executedFlops == Approx(4 * S * dh + 5 * S).epsilon(1e-15));
  CHECK(b.fwd(unfused).bytesWritten == B * 100 * 64 * 2 + 2 * S * 2);

  // The shape rule refuses a window without the causal mask, a negative one, a negative cap.
  a.fused = true;
  a.causal = false;
  CHECK(b.error(OpKind::Attention, {q, k, v}, a).message ==
        "attention window = 7 must be 0 (none) or a positive number of keys with causal = true");
  a.causal = true;
  a.attnWindow = 0;
  a.softcap = -1;
  CHECK(b.error(OpKind::Attention, {q, k, v}, a).kind == ShapeErrorKind::Invalid);
}

TEST_CASE("oprules: attention logit soft-capping (issue 44)", "[oprules]") {
  Builder b;
  TensorId q = b.activation(Builder::sizes({2, 16, 64}), Dtype::F32);
  OpAttrs a;
  a.heads = 4;
  a.causal = true;
  OpId plain = b.op(OpKind::Attention, {q, q, q}, a);
  a.softcap = 50;
  OpId capped = b.op(OpKind::Attention, {q, q, q}, a);
  double S = 2.0 * 4 * 16 * 16, frac = 17.0 / 32;
  // c·tanh(s / c): 6 FLOPs and a tanh per score; its gradient 3 per score, in dq's count.
  CHECK(b.fwd(capped).flops == b.fwd(plain).flops + 6 * S);
  CHECK(b.fwd(capped).executedFlops == Approx((b.fwd(plain).flops + 6 * S) * frac).epsilon(1e-15));
  CHECK(b.fwd(capped).transcendentals == Approx(2 * S * frac).epsilon(1e-15));
  CHECK(b.grad(capped, 0) == b.grad(plain, 0) + 3 * S);
  CHECK(b.grad(capped, 1) == b.grad(plain, 1));
  // The flash backward recomputes the cap with the scores.
  CHECK(b.executedBackward(capped) == Approx(b.executedBackward(plain) + 9 * S * frac).epsilon(1e-15));
  // Materialised: P does not give the cap's derivative, so the backward recomputes the scores.
  a.fused = false;
  OpId unfused = b.op(OpKind::Attention, {q, q, q}, a);
  double g = b.grad(unfused, 0) + b.grad(unfused, 1) + b.grad(unfused, 2);
  CHECK(b.executedBackward(unfused) == g + 2 * S * 16 + 6 * S);
}

TEST_CASE("oprules: value heads unlike q/k's and a latent cache (MLA, issue 44)", "[oprules]") {
  Builder b;
  // 4 heads: q and k of 24 dims (nope 16 + rope 8), v of 16 (DeepSeek's 192 and 128, scaled).
  TensorId qk = b.activation(Builder::sizes({2, 16, 96}), Dtype::F32);
  TensorId v = b.activation(Builder::sizes({2, 16, 64}), Dtype::F32);
  OpAttrs a;
  a.heads = 4;
  a.causal = true;
  a.latent = 32;
  a.latentRope = 8;
  OpId at = b.op(OpKind::Attention, {qk, qk, v}, a);
  CHECK(b.g.formatShape(b.shapeOf(b.g.ops[at].outputs[0])) == "[2, 16, 64]");
  double S = 2.0 * 4 * 16 * 16;
  // QKᵀ over dh = 24, P·V over dv = 16; the latent changes no FLOPs of the graph.
  CHECK(b.fwd(at).flops == 2 * S * 24 + 2 * S * 16 + 5 * S);
  CHECK(b.grad(at, 0) == 2 * S * 16 + 2 * S * 24 + 4 * S); // dP = dO·Vᵀ over dv, dS·K over dh
  CHECK(b.grad(at, 1) == 2 * S * 24);
  CHECK(b.grad(at, 2) == 2 * S * 16);
  a.latentRope = 24; // the RoPE key is part of each 24-dim head
  CHECK(b.error(OpKind::Attention, {qk, qk, v}, a).message ==
        "attention latent_rope = 24 is the RoPE part of each q/k head, so it must be below the "
        "head size 24 (qk_nope_head_dim + qk_rope_head_dim)");
  a.latentRope = 8;
  TensorId v5 = b.activation(Builder::sizes({2, 16, 66}), Dtype::F32);
  CHECK(b.error(OpKind::Attention, {qk, qk, v5}, a).message ==
        "attention value width 66 of [2, 16, 66] is not divisible by kv_heads = 4");
}

TEST_CASE("oprules: grouped-query attention", "[oprules]") {
  Builder b;
  TensorId q = b.input(Builder::sizes({2, 16, 64}));
  TensorId kv = b.input(Builder::sizes({2, 16, 16}));
  OpAttrs a;
  a.heads = 8;
  a.kvHeads = 2; // dh = 8, d_kv = 2·8
  OpId at = b.op(OpKind::Attention, {q, kv, kv}, a);
  double S = 2.0 * 8 * 16 * 16;
  CHECK(b.fwd(at).flops == 4 * S * 8 + 5 * S);
  CHECK(b.fwd(at).bytesRead == (2 * 16 * 64 + 2 * 2 * 16 * 16) * 4);
  CHECK(b.grad(at, 1) == 2 * S * 8);

  a.kvHeads = 4; // d_kv should be 32
  ShapeError e = b.error(OpKind::Attention, {q, kv, kv}, a);
  CHECK(e.kind == ShapeErrorKind::Mismatch);
  CHECK(e.message == "attention key/value width 16 of [2, 16, 16] should be kv_heads × head size = 4 × 8 = 32");
  a.kvHeads = 3;
  CHECK(b.error(OpKind::Attention, {q, kv, kv}, a).message ==
        "attention heads = 8 is not a multiple of kv_heads = 3");
  a.heads = 7;
  a.kvHeads = 0;
  CHECK(b.error(OpKind::Attention, {q, kv, kv}, a).message ==
        "attention width 64 of [2, 16, 64] is not divisible by heads = 7");
}

TEST_CASE("oprules: split, reshape, transpose and concat", "[oprules]") {
  Builder b(Dtype::BF16);
  TensorId x = b.activation(b.shape({{2, "batch"}, {8, "seq"}, {48, ""}}), Dtype::BF16);
  OpAttrs sp;
  sp.parts = 3;
  sp.dim = -1;
  OpId split = b.op(OpKind::Split, {x}, sp);
  REQUIRE(b.g.ops[split].outputs.size() == 3);
  for (TensorId t : b.g.ops[split].outputs) {
    CHECK(b.g.formatShape(b.shapeOf(t)) == "[batch, seq, 16]");
    CHECK(b.g.tensors[t].viewOf == x);
  }
  ForwardCost c = b.fwd(split);
  CHECK(c.flops == 0);
  CHECK(c.bytesRead == 0);
  CHECK(c.bytesWritten == 0);
  CHECK(b.grad(split, 0) == 0);
  CHECK(b.saved(split).empty());
  sp.parts = 5;
  ShapeError e = b.error(OpKind::Split, {x}, sp);
  CHECK(e.kind == ShapeErrorKind::Mismatch);
  CHECK(e.message == "cannot split dimension 48 of [batch, seq, 48] into 5 equal parts");

  OpAttrs rs;
  rs.newShape = Builder::sizes({16, -1});
  OpId r = b.op(OpKind::Reshape, {x}, rs);
  CHECK(Graph::formatSizes(b.shapeOf(b.out(r))) == "[16, 48]");
  CHECK(b.fwd(r).bytesRead == 0);
  rs.newShape = Builder::sizes({5, -1});
  CHECK(b.error(OpKind::Reshape, {x}, rs).kind == ShapeErrorKind::Mismatch);
  rs.newShape = Builder::sizes({16, 47});
  CHECK(b.error(OpKind::Reshape, {x}, rs).message ==
        "cannot reshape [batch, seq, 48] to [16, 47]: 768 elements, not 752");
  rs.newShape = Builder::sizes({-1, -1});
  CHECK(b.error(OpKind::Reshape, {x}, rs).kind == ShapeErrorKind::Invalid);

  OpAttrs tr;
  tr.transposeA = -2;
  tr.transposeB = -1;
  OpId t = b.op(OpKind::Transpose, {x}, tr);
  CHECK(b.g.formatShape(b.shapeOf(b.out(t))) == "[batch, 48, seq]");
  CHECK(b.g.tensors[b.out(t)].dtype == Dtype::BF16);
  tr.transposeA = 3;
  CHECK(b.error(OpKind::Transpose, {x}, tr).kind == ShapeErrorKind::Invalid);

  OpId cat = b.op(OpKind::Concat, {x, x}, withDim(1));
  CHECK(b.g.formatShape(b.shapeOf(b.out(cat))) == "[batch, 16, 48]");
  CHECK(b.fwd(cat).flops == 0);
  CHECK(b.fwd(cat).bytesRead == 2 * 768 * 2);
  CHECK(b.fwd(cat).bytesWritten == 2 * 768 * 2);
  CHECK(b.grad(cat, 0) == 0);
  CHECK(b.error(OpKind::Concat, {x, b.activation(Builder::sizes({2, 7, 47}), Dtype::BF16)}, withDim(1))
            .kind == ShapeErrorKind::Mismatch);
}

TEST_CASE("oprules: embedding, positions, next tokens, cross entropy, reductions", "[oprules]") {
  Builder b(Dtype::BF16);
  TensorId tokens = b.input(b.shape({{4, "batch"}, {16, "seq"}}), Dtype::I32);
  TensorId wte = b.param(Builder::sizes({100, 32}), Dtype::BF16);
  OpId emb = b.op(OpKind::Embedding, {tokens, wte});
  CHECK(b.g.formatShape(b.shapeOf(b.out(emb))) == "[batch, seq, 32]");
  double n = 4 * 16 * 32;
  CHECK(b.fwd(emb).flops == 0);
  CHECK(b.fwd(emb).bytesRead == 4 * 16 * 4 + n * 2);
  CHECK(b.fwd(emb).bytesWritten == n * 2);
  CHECK(b.grad(emb, 0) == 0);
  CHECK(b.grad(emb, 1) == n);
  REQUIRE(b.saved(emb).size() == 1);
  CHECK(b.saved(emb)[0].tensor == tokens);
  CHECK(b.error(OpKind::Embedding, {wte, wte}).kind == ShapeErrorKind::Invalid);

  OpAttrs pos;
  pos.newShape = b.shape({{16, "seq"}});
  OpId p = b.op(OpKind::Positions, {}, pos);
  CHECK(b.g.tensors[b.out(p)].dtype == Dtype::I32);
  CHECK(b.fwd(p).bytesRead == 0);
  CHECK(b.fwd(p).bytesWritten == 16 * 4);

  OpId next = b.op(OpKind::NextTokens, {tokens});
  CHECK(b.g.formatShape(b.shapeOf(b.out(next))) == "[batch, seq]");
  CHECK(b.g.tensors[b.out(next)].dtype == Dtype::I32);

  TensorId logits = b.activation(b.shape({{4, "batch"}, {16, "seq"}, {100, "vocab"}}), Dtype::BF16);
  OpId ce = b.op(OpKind::CrossEntropy, {logits, b.out(next)});
  CHECK(b.shapeOf(b.out(ce)).empty());
  CHECK(b.g.tensors[b.out(ce)].dtype == Dtype::F32);
  double N = 64, V = 100;
  CHECK(b.fwd(ce).flops == 5 * N * V + N);
  CHECK(b.grad(ce, 0) == 3 * N * V);
  CHECK(b.grad(ce, 1) == 0);
  CHECK(b.executedBackward(ce) == 3 * N * V);
  auto s = b.saved(ce);
  REQUIRE(s.size() == 3);
  CHECK(s[0].tensor == logits);
  CHECK(s[1].tensor == b.out(next)); // the labels: the backward reads them
  CHECK(s[2].bytes == N * 4);
  ShapeError e = b.error(OpKind::CrossEntropy, {logits, b.input(Builder::sizes({4, 15}), Dtype::I32)});
  CHECK(e.kind == ShapeErrorKind::Mismatch);

  OpId mean = b.op(OpKind::Mean, {logits});
  CHECK(b.shapeOf(b.out(mean)).empty());
  CHECK(b.fwd(mean).flops == N * V + 1);
  CHECK(b.grad(mean, 0) == N * V);
  OpAttrs ax;
  ax.reduceAll = false;
  ax.dim = -1;
  ax.keepDim = true;
  OpId sum = b.op(OpKind::Sum, {logits}, ax);
  CHECK(b.g.formatShape(b.shapeOf(b.out(sum))) == "[batch, seq, 1]");
  CHECK(b.fwd(sum).flops == N * V);
  CHECK(b.grad(sum, 0) == 0);
  ax.keepDim = false;
  ax.dim = 0;
  CHECK(b.g.formatShape(b.shapeOf(b.out(b.op(OpKind::Sum, {logits}, ax)))) == "[seq, vocab]");
}

TEST_CASE("oprules: shapes past int64 are rejected as overflow", "[oprules]") {
  Builder b;
  TensorId x = b.input(Builder::sizes({int64_t(1) << 40, 8}));
  TensorId w = b.input(Builder::sizes({8, int64_t(1) << 40}));
  ShapeError e = b.error(OpKind::Matmul, {x, w});
  CHECK(e.kind == ShapeErrorKind::Overflow);
  OpAttrs rs;
  rs.newShape = Builder::sizes({int64_t(1) << 40, int64_t(1) << 40});
  CHECK(b.error(OpKind::Reshape, {x}, rs).kind == ShapeErrorKind::Overflow);
}

// Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
// section 4.1: a transformer layer with dropout and unfused attention keeps s·b·h·(34 + 5·a·s/h)
// bytes of activations in 16-bit precision. tally keeps the same, plus the layer norms' fp32 row
// statistics (8 bytes per row, two layer norms).
TEST_CASE("oprules: a GPT-3 block saves s*b*h*(34 + 5as/h) bytes", "[oprules]") {
  const int64_t s = 8, bsz = 2, h = 16, a = 4;
  Builder b(Dtype::BF16);
  auto vec = [&](int64_t n) { return b.param(Builder::sizes({n}), Dtype::BF16); };
  auto mat = [&](int64_t r, int64_t c) { return b.param(Builder::sizes({r, c}), Dtype::BF16); };
  OpAttrs drop;
  drop.p = 0.1;
  OpAttrs split;
  split.parts = 3;
  split.dim = -1;
  OpAttrs attn;
  attn.heads = a;
  attn.causal = true;
  attn.fused = false;
  attn.p = 0.1;

  // The block's input comes from a token embedding, so it is an activation that needs a gradient
  // (the embedding keeps only the token ids, which are input data).
  TensorId tokens = b.input(b.shape({{bsz, "batch"}, {s, "seq"}}), Dtype::I32);
  TensorId x = b.out(b.op(OpKind::Embedding, {tokens, mat(50, h)}));
  TensorId ln1 = b.out(b.op(OpKind::LayerNorm, {x, vec(h), vec(h)}));
  TensorId qkv = b.out(b.op(OpKind::Matmul, {ln1, mat(h, 3 * h)}));
  qkv = b.out(b.op(OpKind::Add, {qkv, vec(3 * h)}));
  OpId sp = b.op(OpKind::Split, {qkv}, split);
  TensorId y = b.out(b.op(OpKind::Attention, {b.out(sp, 0), b.out(sp, 1), b.out(sp, 2)}, attn));
  y = b.out(b.op(OpKind::Matmul, {y, mat(h, h)}));
  y = b.out(b.op(OpKind::Add, {y, vec(h)}));
  y = b.out(b.op(OpKind::Dropout, {y}, drop));
  TensorId x2 = b.out(b.op(OpKind::Add, {x, y}));
  TensorId ln2 = b.out(b.op(OpKind::LayerNorm, {x2, vec(h), vec(h)}));
  TensorId f = b.out(b.op(OpKind::Matmul, {ln2, mat(h, 4 * h)}));
  f = b.out(b.op(OpKind::Add, {f, vec(4 * h)}));
  f = b.out(b.op(OpKind::Gelu, {f}));
  f = b.out(b.op(OpKind::Matmul, {f, mat(4 * h, h)}));
  f = b.out(b.op(OpKind::Add, {f, vec(h)}));
  f = b.out(b.op(OpKind::Dropout, {f}, drop));
  b.op(OpKind::Add, {x2, f});
  REQUIRE(verifyGraph(b.g) == "");

  double bytes = 0, stats = 0;
  std::set<TensorId> counted;
  for (OpId o = 0; o < b.g.ops.size(); ++o)
    for (const SavedTensor &st : b.saved(o)) {
      if (std::string(st.what) == "row statistics")
        stats += st.bytes;
      TensorId base = b.g.tensors[st.tensor].viewOf != kNone ? b.g.tensors[st.tensor].viewOf : st.tensor;
      TensorRole role = b.g.tensors[base].role;
      if (role == TensorRole::Param || role == TensorRole::Input || !counted.insert(base).second)
        continue;
      bytes += b.g.bytes(base);
    }
  double sbh = double(s) * bsz * h;
  CHECK(stats == 2 * 8 * s * bsz);
  CHECK(bytes == sbh * (34 + 5.0 * a * s / h) + stats);
  CHECK(bytes == 11520);
}
