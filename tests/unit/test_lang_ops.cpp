// test_lang_ops.cpp — unit tests for the op-table rules of the ops real configs need
// (ir/OpRules.cpp): conv2d, max/avg pooling, slice views, partial rotary, ALiBi and padding
// masks. Every number is derived in the comment above its check from docs/counting.md.
#include <catch.hpp>

#include "ir/OpRules.h"

using namespace tally;

namespace {

Shape sizes(std::initializer_list<int64_t> dims) {
  Shape s;
  for (int64_t d : dims)
    s.push_back(Dim{d, 0});
  return s;
}

/// A small graph: tensors added by hand, ops inferred and appended the way lowering does.
struct Mini {
  Graph g;
  Mini() {
    g.activationDtype = Dtype::F32;
    g.instances.push_back(Instance());
  }
  TensorId tensor(Shape s, Dtype dt = Dtype::F32, bool grad = true) {
    Tensor t;
    t.shape = std::move(s);
    t.dtype = dt;
    t.requiresGrad = grad;
    return g.addTensor(t);
  }
  /// Infers and appends; returns kNone with `err` set when the rule rejects the op.
  OpId add(OpKind k, std::vector<TensorId> ins, const OpAttrs &a, ShapeError &err) {
    Op op;
    op.kind = k;
    op.inputs.assign(ins.begin(), ins.end());
    op.attrs = a;
    llvm::SmallVector<TensorType, 3> outs;
    if (!ruleFor(k).infer(g, op, outs, err))
      return kNone;
    for (const TensorType &tt : outs) {
      Tensor t;
      t.shape = tt.shape;
      t.dtype = tt.dtype;
      op.outputs.push_back(g.addTensor(t));
    }
    return g.addOp(std::move(op));
  }
  OpId add(OpKind k, std::vector<TensorId> ins, const OpAttrs &a = OpAttrs()) {
    ShapeError err;
    OpId id = add(k, std::move(ins), a, err);
    INFO(err.message);
    REQUIRE(id != kNone);
    return id;
  }
  const Op &op(OpId o) const { return g.ops[o]; }
  ForwardCost fwd(OpId o) const { return ruleFor(op(o).kind).forward(g, op(o)); }
  double grad(OpId o, unsigned i) const { return ruleFor(op(o).kind).gradFlops(g, op(o), i); }
  std::string shape(OpId o, unsigned i = 0) const {
    return Graph::formatSizes(g.tensors[op(o).outputs[i]].shape);
  }
};

} // namespace

TEST_CASE("lang ops: conv2d shapes, FLOPs, gradients and saved tensors", "[oprules][lang]") {
  Mini m;
  // A ResNet stem: 7×7, stride 2, padding 3, 3 → 64 channels on 2 × 3 × 224 × 224:
  // (224 + 6 − 7) / 2 + 1 = 112.
  TensorId x = m.tensor(sizes({2, 3, 224, 224}), Dtype::F32, false);
  TensorId w = m.tensor(sizes({64, 3, 7, 7}));
  TensorId b = m.tensor(sizes({64}));
  OpAttrs a;
  a.strides[0] = a.strides[1] = 2;
  a.pads[0] = a.pads[1] = 3;
  OpId c = m.add(OpKind::Conv2d, {x, w, b}, a);
  CHECK(m.shape(c) == "[2, 64, 112, 112]");
  // n = 2·64·112·112 = 1,605,632 outputs; 2·n·3·7·7 = 472,055,808 matmul FLOPs, + n for the bias.
  ForwardCost f = m.fwd(c);
  CHECK(f.matmulFlops == 472055808.0);
  CHECK(f.flops == 472055808.0 + 1605632.0);
  // Bytes: x 2·3·224·224·4 = 1,204,224, w 64·3·49·4 = 37,632, b 256 read; y n·4 written.
  CHECK(f.bytesRead == 1204224.0 + 37632.0 + 256.0);
  CHECK(f.bytesWritten == 1605632.0 * 4);
  CHECK(m.grad(c, 0) == 472055808.0);
  CHECK(m.grad(c, 1) == 472055808.0);
  CHECK(m.grad(c, 2) == 1605632.0);
  std::vector<SavedTensor> kept;
  ruleFor(OpKind::Conv2d).saved(m.g, m.op(c), {false, true, true}, kept);
  REQUIRE(kept.size() == 1); // x for the weight's gradient; no dx wanted, so not w
  CHECK(kept[0].tensor == x);

  ShapeError err;
  TensorId w4 = m.tensor(sizes({64, 4, 7, 7}));
  CHECK(m.add(OpKind::Conv2d, {x, w4}, a, err) == kNone);
  CHECK(err.message == "conv2d weight has 4 input channels, x has 3: [2, 3, 224, 224] and weight [64, 4, 7, 7]");
  TensorId big = m.tensor(sizes({8, 3, 300, 300}));
  CHECK(m.add(OpKind::Conv2d, {x, big}, OpAttrs(), err) == kNone);
  CHECK(err.kind == ShapeErrorKind::Invalid);
}

TEST_CASE("lang ops: max and average pooling", "[oprules][lang]") {
  Mini m;
  // The stem's 3×3 max pool, stride 2, padding 1: (112 + 2 − 3) / 2 + 1 = 56.
  TensorId x = m.tensor(sizes({2, 64, 112, 112}));
  OpAttrs a;
  a.window[0] = a.window[1] = 3;
  a.strides[0] = a.strides[1] = 2;
  a.pads[0] = a.pads[1] = 1;
  OpId p = m.add(OpKind::MaxPool2d, {x}, a);
  CHECK(m.shape(p) == "[2, 64, 56, 56]");
  CHECK(m.g.tensors[m.op(p).outputs[1]].dtype == Dtype::I32); // the argmax indices
  // m = 2·64·56·56 = 401,408 outputs; 9 comparisons each; the gradient one add each.
  CHECK(m.fwd(p).flops == 9 * 401408.0);
  CHECK(m.fwd(p).bytesWritten == 401408.0 * 4 * 2); // y and the int32 indices
  CHECK(m.grad(p, 0) == 401408.0);
  std::vector<SavedTensor> kept;
  ruleFor(OpKind::MaxPool2d).saved(m.g, m.op(p), {true}, kept);
  REQUIRE(kept.size() == 1);
  CHECK(kept[0].bytes == 401408.0 * 4);

  OpId avg = m.add(OpKind::AvgPool2d, {x}, a);
  CHECK(m.op(avg).outputs.size() == 1);
  CHECK(m.grad(avg, 0) == 10 * 401408.0); // divide, then 9 adds

  a.pads[0] = 2; // more than half the 3-wide window
  ShapeError err;
  CHECK(m.add(OpKind::AvgPool2d, {x}, a, err) == kNone);
  CHECK(err.kind == ShapeErrorKind::Invalid);
}

TEST_CASE("lang ops: slice views", "[oprules][lang]") {
  Mini m;
  TensorId x = m.tensor(sizes({4, 197, 768}));
  OpAttrs cls; // x[:, 0]
  cls.slices = {SliceDim{0, 4, 1, false}, SliceDim{0, 1, 1, true}};
  OpId s = m.add(OpKind::Slice, {x}, cls);
  CHECK(m.shape(s) == "[4, 768]");
  CHECK(m.fwd(s).flops == 0);
  CHECK(m.fwd(s).bytesRead == 0);
  OpAttrs rest; // x[:, 1::2]: 98 of 196
  rest.slices = {SliceDim{0, 4, 1, false}, SliceDim{1, 98, 2, false}};
  CHECK(m.shape(m.add(OpKind::Slice, {x}, rest)) == "[4, 98, 768]");
  rest.slices[1].count = 99; // 1 + 98·2 = 197 is past the end
  ShapeError err;
  CHECK(m.add(OpKind::Slice, {x}, rest, err) == kNone);
  CHECK(err.message == "subscript 1 selects outside dimension 197 of [4, 197, 768]");
}

TEST_CASE("lang ops: partial rotary, ALiBi and padding masks", "[oprules][lang]") {
  Mini m;
  TensorId q = m.tensor(sizes({2, 8, 64}));
  OpAttrs r;
  r.fraction = 0.25;
  r.headDim = 16; // 4 heads of 16: 4 of each head's dims rotated, a quarter of the elements
  OpId rope = m.add(OpKind::Rope, {q}, r);
  CHECK(m.fwd(rope).flops == 3 * 1024 * 0.25);
  CHECK(m.grad(rope, 0) == 3 * 1024 * 0.25);
  CHECK(m.fwd(rope).bytesRead == 1024 * 4); // the whole tensor is still read and written
  r.fraction = 0.3; // floor(16·0.3) = 4: still even
  CHECK(m.fwd(m.add(OpKind::Rope, {q}, r)).flops == 3 * 1024 * 0.25);
  r.fraction = 0.2; // floor(3.2) = 3: odd
  ShapeError err;
  CHECK(m.add(OpKind::Rope, {q}, r, err) == kNone);

  // 4 heads of 16, batch 2, seq 8: S = 512 scores.
  TensorId k = m.tensor(sizes({2, 8, 64})), v = m.tensor(sizes({2, 8, 64}));
  OpAttrs at;
  at.heads = at.kvHeads = 4;
  OpId plain = m.add(OpKind::Attention, {q, k, v}, at);
  at.alibi = true;
  OpId alibi = m.add(OpKind::Attention, {q, k, v}, at);
  CHECK(m.fwd(alibi).flops - m.fwd(plain).flops == 2 * 512); // slope·distance, then the add
  CHECK(m.grad(alibi, 0) == m.grad(plain, 0));
  at.alibi = false;
  at.hasMask = true;
  TensorId keep = m.tensor(sizes({2, 8}), Dtype::I32, false);
  OpId masked = m.add(OpKind::Attention, {q, k, v, keep}, at);
  CHECK(m.fwd(masked).flops == m.fwd(plain).flops);
  CHECK(m.fwd(masked).bytesRead == m.fwd(plain).bytesRead + 2 * 8 * 4);
  CHECK(m.grad(masked, 3) == 0);
  TensorId wrong = m.tensor(sizes({2, 7}), Dtype::I32, false);
  CHECK(m.add(OpKind::Attention, {q, k, v, wrong}, at, err) == kNone);
  CHECK(err.message == "attention mask must be integers or booleans of shape [batch, seq_kv] = "
                       "[2, 8], got i32[2, 7]");
}

TEST_CASE("lang ops: broadcast_to copies, and its gradient sums back", "[oprules][lang]") {
  Mini m;
  TensorId cls = m.tensor(sizes({1, 1, 768}));
  OpAttrs a;
  a.newShape = sizes({8, 1, 768});
  OpId b = m.add(OpKind::BroadcastTo, {cls}, a);
  CHECK(m.shape(b) == "[8, 1, 768]");
  CHECK(m.fwd(b).flops == 0);
  CHECK(m.fwd(b).bytesRead == 768 * 4);
  CHECK(m.fwd(b).bytesWritten == 8 * 768 * 4);
  CHECK(m.grad(b, 0) == 8 * 768); // one add per output element into the [1, 1, 768] gradient
  a.newShape = sizes({8, 2, 768}); // a leading dim may be added too; 768 must stay 768
  CHECK(m.shape(m.add(OpKind::BroadcastTo, {cls}, a)) == "[8, 2, 768]");
  a.newShape = sizes({8, 1, 767});
  ShapeError err;
  CHECK(m.add(OpKind::BroadcastTo, {cls}, a, err) == kNone);
  CHECK(err.message == "cannot broadcast [1, 1, 768] to [8, 1, 767]");
}
