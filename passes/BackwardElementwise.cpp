// The backward of the elementwise kinds (ir/ops/Elementwise.cpp) as elementwise ops. The
// binary kinds register through their rows of ir/ops/Binary.def, each with its local gradient
// (BinaryGrad): a row without one does not compile. The pure unary kinds register through
// their rows of ir/ops/Unary.def: one unary_backward reading what the row says its gradient
// reads (the input, the output or nothing), so a new unary kind needs nothing here. Dropout
// (which reads its mask) and rope are their own. The table is passes/BackwardTable.h.
#include "passes/BackwardBuilder.h"

#include "ir/OpRules.h"

namespace tally {
namespace backward {

namespace {

// ------------------------------------------------------------------------------------------
// Binary: add, sub, mul, div. A gradient computed at a broadcast shape is summed back with
// reduce_to (Builder::finish).

/// The local gradient of one binary kind of ir/ops/Binary.def:
///   identity(i): input i's gradient is dy itself (a broadcast operand's is summed straight
///     into its gradient);
///   scalar(b, op, dy, t): with a constant operand (attrs.hasScalar), input 0's, into t;
///   operand(b, op, i, dy, t): tensor operand i's, into t.
template <OpKind K> struct BinaryGrad;

template <> struct BinaryGrad<OpKind::Add> {
  static bool identity(unsigned) { return true; }
  static void scalar(Builder &b, const Op &, TensorId dy, const Builder::Target &t) {
    b.emit(OpKind::Contiguous, {dy}, {t.t}, SharedAttrs(), t.acc);
  }
  static void operand(Builder &b, const Op &, unsigned, TensorId dy, const Builder::Target &t) {
    b.emit(OpKind::Contiguous, {dy}, {t.t}, SharedAttrs(), t.acc);
  }
  /// Whether operand x's gradient is dy's buffer (passes/GradientShares.h): then one
  /// `contiguous` with `shares` records that it is dy, and nothing is copied.
  static bool shared(Builder &b, TensorId x, TensorId dy) {
    if (!b.shares->sharedAt(x, b.current))
      return false;
    OpAttrs a;
    a.shares = true;
    b.written[b.base(x)] = true; // its first write: later writers add into dy's buffer
    b.emit(OpKind::Contiguous, {dy}, {b.gradOf(x)}, a, 0);
    return true;
  }
};

template <> struct BinaryGrad<OpKind::Sub> {
  static bool identity(unsigned i) { return i == 0; }
  static void scalar(Builder &b, const Op &op, TensorId dy, const Builder::Target &t) {
    if (op.attrs->scalarOnLeft) // c - x
      b.emit(OpKind::Neg, {dy}, {t.t}, SharedAttrs(), t.acc);
    else
      b.emit(OpKind::Contiguous, {dy}, {t.t}, SharedAttrs(), t.acc);
  }
  static void operand(Builder &b, const Op &, unsigned i, TensorId dy, const Builder::Target &t) {
    if (i == 0)
      b.emit(OpKind::Contiguous, {dy}, {t.t}, SharedAttrs(), t.acc);
    else
      b.emit(OpKind::Neg, {dy}, {t.t}, SharedAttrs(), t.acc);
  }
};

template <> struct BinaryGrad<OpKind::Mul> {
  static bool identity(unsigned) { return false; }
  static void scalar(Builder &b, const Op &op, TensorId dy, const Builder::Target &t) {
    OpAttrs s;
    s.hasScalar = true;
    s.scalar = op.attrs->scalar;
    b.emit(OpKind::Mul, {dy}, {t.t}, s, t.acc);
  }
  static void operand(Builder &b, const Op &op, unsigned i, TensorId dy, const Builder::Target &t) {
    b.emit(OpKind::Mul, {dy, op.inputs[i == 0 ? 1 : 0]}, {t.t}, SharedAttrs(), t.acc);
  }
};

template <> struct BinaryGrad<OpKind::Div> {
  static bool identity(unsigned) { return false; }
  static void scalar(Builder &b, const Op &op, TensorId dy, const Builder::Target &t) {
    OpAttrs s;
    s.hasScalar = true;
    s.scalar = op.attrs->scalar;
    if (op.attrs->scalarOnLeft) { // d(c/x) = -g·y²/c
      s.scalarOnLeft = true;
      b.emit(OpKind::DivBackward, {op.outputs[0], dy}, {t.t}, s, t.acc);
    } else {
      b.emit(OpKind::Div, {dy}, {t.t}, s, t.acc);
    }
  }
  // da = g / b; db = -g·a/b²
  static void operand(Builder &b, const Op &op, unsigned i, TensorId dy, const Builder::Target &t) {
    if (i == 0)
      b.emit(OpKind::Div, {dy, op.inputs[1]}, {t.t}, SharedAttrs(), t.acc);
    else
      b.emit(OpKind::DivBackward, {op.inputs[0], op.inputs[1], dy}, {t.t}, SharedAttrs(), t.acc);
  }
};

template <OpKind K> void binaryBackward(Builder &b, const Op &op, TensorId dy) {
  using Grad = BinaryGrad<K>;
  if (op.attrs->hasScalar) {
    TensorId x = op.inputs[0];
    if (!b.needs(x))
      return;
    Builder::Target t = b.target(x, b.g.tensors[dy].shape);
    Grad::scalar(b, op, dy, t);
    b.finish(x, t);
    return;
  }
  const Shape ds = b.g.tensors[dy].shape;
  for (unsigned i = 0; i < 2; ++i) {
    TensorId x = op.inputs[i];
    if (!b.needs(x))
      continue;
    if (Grad::identity(i) && numel(ds) != numel(b.g.tensors[x].shape)) {
      b.writeGrad(x, dy); // a broadcast bias: sum dy straight into its gradient
      continue;
    }
    if constexpr (K == OpKind::Add)
      if (Grad::shared(b, x, dy))
        continue;
    Builder::Target t = b.target(x, ds);
    Grad::operand(b, op, i, dy, t);
    b.finish(x, t);
  }
}

// ------------------------------------------------------------------------------------------
// Unary: one unary_backward (attrs.of names the forward kind) reading `reads` (kNone: nothing)
// and dy.

void emitUnaryBackward(Builder &b, const Op &op, TensorId dy, TensorId reads) {
  TensorId x = op.inputs[0];
  if (!b.needs(x))
    return;
  Builder::Target t = b.target(x, b.g.tensors[dy].shape);
  OpAttrs a = op.attrs;
  a.of = op.kind;
  llvm::SmallVector<TensorId, 3> in;
  if (reads != kNone)
    in.push_back(reads);
  in.push_back(dy);
  b.emit(OpKind::UnaryBackward, in, {t.t}, a, t.acc);
  b.finish(x, t);
}

/// A pure unary kind: what its gradient reads is its row's (ir/ops/Unary.def).
void unaryBackward(Builder &b, const Op &op, TensorId dy) {
  GradReads reads = unaryDef(op.kind)->reads;
  emitUnaryBackward(b, op, dy,
                    reads == GradReads::Input    ? op.inputs[0]
                    : reads == GradReads::Output ? op.outputs[0]
                                                 : kNone);
}

/// Dropout's gradient is dy through the mask it kept (its second output).
void dropoutBackward(Builder &b, const Op &op, TensorId dy) {
  emitUnaryBackward(b, op, dy, op.outputs[1]);
}

/// Rope's gradient is dy rotated back: it reads nothing else.
void ropeBackward(Builder &b, const Op &op, TensorId dy) { emitUnaryBackward(b, op, dy, kNone); }

} // namespace

#define BINARY(ID, RUNTIME) BACKWARD(ID, binaryBackward<OpKind::ID>)
#include "ir/ops/Binary.def"

#define UNARY(ID, FWD, GRAD, READS, FWD_EXPS, GRAD_EXPS, RUNTIME) BACKWARD(ID, unaryBackward)
#include "ir/ops/Unary.def"

BACKWARD(Dropout, dropoutBackward)
BACKWARD(Rope, ropeBackward)
NO_BACKWARD(UnaryBackward, "a backward op: autodiff adds it and never differentiates it")
NO_BACKWARD(DivBackward, "a backward op: autodiff adds it and never differentiates it")

} // namespace backward
} // namespace tally
