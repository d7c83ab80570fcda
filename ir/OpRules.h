// Per-op knowledge, one table entry per op kind: output shapes, forward FLOPs and bytes, the
// FLOPs of each input's gradient, and the tensors the backward keeps. Every pass asks this
// table, so adding an op touches ir/Ops.def and its family's file in ir/ops/ (its rules and
// one RULE line), and all passes agree. The counting convention is written down in
// docs/counting.md. The counts are written once, as templates over a number type
// (ir/Formula.h): the passes run them on doubles, and `tally explain` runs the same code on
// terms to print the formula behind each number.
//
// All FLOP and byte counts are doubles: whole-run totals reach 1e25, past int64 and exact
// double integers; per-op counts stay exact below 2^53.
#pragma once

#include "ir/Formula.h"
#include "ir/Graph.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/SmallVector.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace tally {

enum class ShapeErrorKind : uint8_t { None, Matmul, Broadcast, Mismatch, Overflow, Invalid };

struct ShapeError {
  ShapeErrorKind kind = ShapeErrorKind::None;
  std::string message; ///< user-facing, names both shapes, e.g. "matmul inner dimensions differ: [batch, seq, 768] @ [512, 2304]"
};

struct TensorType {
  Shape shape;
  Dtype dtype = Dtype::Invalid;
};

/// Forward cost of one op, at the dtypes of its tensors.
struct ForwardCost {
  double flops = 0;         ///< model FLOPs: attention counted dense (s²), as Narayanan et al.
  double executedFlops = 0; ///< what kernels run: causal attention computes only the lower triangle
  double matmulFlops = 0;   ///< the part of `flops` done as matrix products (tensor-core rate)
  double bytesRead = 0;     ///< from device memory, at the inputs' dtypes (views: 0)
  double bytesWritten = 0;  ///< to device memory, at the outputs' dtypes (views: 0)
  /// exp/erf/tanh/sin/cos evaluations the runtime's kernel makes (not FLOPs: a CPU computes
  /// them far slower than a multiply-add; the host time model prices them, kernelTime).
  double transcendentals = 0;
  /// Kernels the runtime launches for the op: 1 for most; an eager rms_norm's decomposition
  /// launches one per PyTorch op (ir/ops/Norm.cpp).
  double kernels = 1;
};

/// Bytes op's backward holds only while it runs, beyond what the activation walk already holds
/// then (what the op keeps for it, its inputs' gradients): the eager loss's fp32 gradients
/// (ir/ops/Loss.cpp); 0 for every other op. passes/ActivationLiveness.cpp counts them at the
/// op's backward step.
double backwardScratch(const Graph &g, const Op &op);

/// Something the backward pass of an op keeps from its forward pass.
struct SavedTensor { // 16 bytes: a deep model's step saves millions
  TensorId tensor = kNone;  ///< an input or output of the op (extras such as statistics and masks are outputs)
  Label what;               ///< "input", "output", "dropout mask", "row statistics", "logsumexp", "scores"
  double bytes = 0;         ///< bytes of that tensor, or of the extra buffer (mask, statistics)
};

struct OpRule {
  /// Output types from the input types and attributes; false with `err` set on bad shapes.
  bool (*infer)(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                ShapeError &err);
  ForwardCost (*forward)(const Graph &g, const Op &op);
  /// FLOPs to compute the gradient with respect to input `i` (given the output gradients).
  double (*gradFlops)(const Graph &g, const Op &op, unsigned i);
  /// Backward FLOPs the kernels execute, given which inputs need a gradient: the per-input
  /// gradients (causal attention only computes the lower triangle) plus what the backward
  /// recomputes (flash attention recomputes its scores and softmax).
  double (*executedBackwardFlops)(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad);
  /// What the backward needs kept from the forward, given which inputs need a gradient.
  void (*saved)(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
                std::vector<SavedTensor> &out);
  /// The same count as `forward`'s flops, bytesRead or bytesWritten, or `gradFlops(i)`,
  /// derived as a formula for `tally explain`: the same rule, run with terms instead of
  /// doubles (ir/Formula.h), so its value is the pass's.
  Formula (*explain)(const Graph &g, const Op &op, Counted what, unsigned input);
  /// The attributes that change the op's counts, as `--emit=ir` prints them after its operands
  /// (" {heads = 12, ...}"); nullptr when it has none to print.
  void (*printAttrs)(const Graph &g, const Op &op, llvm::raw_ostream &os) = nullptr;
  /// The same attributes as `tally explain` words them ("heads = 12, causal, ..."); nullptr
  /// when the kind has none of its own (explain then names a constant operand, if any).
  std::string (*describeAttrs)(const Graph &g, const Op &op) = nullptr;
};

const OpRule &ruleFor(OpKind k);

/// How Transformer Engine stores one fp8 operand: bytes per element of one copy (1, or 1 + 1/32
/// with MXFP8's E8M0 scale per block of 32) and how many copies an operand read by GEMMs of
/// both layouts needs (2 on Hopper, whose fp8 GEMMs take only the TN layout: the data and its
/// transpose; 1 on Blackwell under per-tensor scaling; 2 under MXFP8, whose one-dimensional
/// blocks run along rows in one copy and columns in the other).
struct Fp8Storage {
  double bytes = 1;
  double copies = 2;
};

/// A matmul by a weight (Y = X·W) run in fp8 as Transformer Engine runs it, the one place its
/// bytes are counted (ir/ops/Matmul.cpp; passes/Fp8.cpp prices them). Elements of X, W, Y;
/// the GEMMs' bytes (forward: X and W read in fp8, Y written in its dtype; backward: the data
/// gradient reads dY and W in fp8 and writes dX, the weight gradient reads X and dY in fp8 and
/// writes dW, each when needed); the cast kernels' bytes (each reads its tensor in its dtype and
/// writes the fp8 copies its GEMMs read); and what the backward keeps of X in fp8 (one copy,
/// for the weight gradient). FLOPs are the op rule's: an fp8 GEMM does the same products.
struct Fp8GemmBytes {
  double activation = 0, weight = 0, output = 0;
  double forward = 0, backward = 0;
  double inputCast = 0, gradCast = 0, weightCast = 0;
  double weightCopies = 0;   ///< bytes of W's cached fp8 copies (data and transpose)
  double savedInput = 0;     ///< bytes of X kept in fp8 for the weight gradient (0: not kept)
};
/// Empty when `op` is not a matmul of one activation by one parameter. `dgrad`/`wgrad`: the
/// backward computes X's / W's gradient (neither: a forward only).
Fp8GemmBytes fp8GemmBytes(const Graph &g, const Op &op, const Fp8Storage &s, bool dgrad, bool wgrad);

/// What a unary elementwise op's gradient reads besides the output gradient.
enum class GradReads { Nothing, Input, Output };

/// A pure unary elementwise kind: one row of ir/ops/Unary.def, which every layer reads instead
/// of listing the kinds (the rules, the autodiff, fusion, the emitter, the lowering).
struct UnaryDef {
  OpKind kind;
  double fwdFlops, gradFlops; ///< per element
  GradReads reads;
  double fwdExps, gradExps; ///< transcendental evaluations per element
  const char *runtime;      ///< the rt::UnOp enumerator the generated step calls, e.g. "Gelu"
};
/// The row of a pure unary kind; nullptr for any other (dropout and rope are one tensor in and
/// one out but have rules of their own).
const UnaryDef *unaryDef(OpKind k);
/// Every row of ir/ops/Unary.def, in its order.
llvm::ArrayRef<UnaryDef> unaryDefs();
/// The rt::BinOp enumerator of a binary elementwise kind (ir/ops/Binary.def), e.g. "Add";
/// nullptr for any other kind.
const char *binaryRuntime(OpKind k);

/// How many times the scores its executed FLOPs count (the causal triangle, computedFraction)
/// a fused causal attention computes when its kernel takes queries and keys in tiles of `tile`
/// (the CPU runtime's: kHostAttentionTile): tiledCausalScores over s(s+1)/2, >= 1; 1 for any
/// other op or attention (materialised, not causal, a window, s != s_kv).
double tiledScoreRatio(const Graph &g, const Op &op, double tile);

/// `tally explain`'s derivations of one op's counts (ruleFor(op.kind).explain).
/// Forward model FLOPs (ForwardCost::flops).
Formula describeForward(const Graph &g, const Op &op);
/// Bytes the forward kernel reads (ForwardCost::bytesRead).
Formula describeBytesRead(const Graph &g, const Op &op);
/// Bytes the forward kernel writes (ForwardCost::bytesWritten).
Formula describeBytesWritten(const Graph &g, const Op &op);
/// FLOPs of the gradient with respect to input `i` (OpRule::gradFlops).
Formula describeGrad(const Graph &g, const Op &op, unsigned i);

/// Helpers used by the rules and the passes.
/// Numpy broadcasting of two shapes; false when a pair of trailing dims differ and neither is 1.
bool broadcastShapes(const Shape &a, const Shape &b, Shape &out);
/// Whether the kernel of `op` can read input `i` in its present layout (strides, offset):
/// matmuls read transposed operands, attention reads row-strided q, k, v; every other kernel
/// reads dense tensors. Lowering gives any other input a `contiguous` copy.
bool acceptsLayout(const Graph &g, const Op &op, unsigned i);
/// Checks the outputs of ops [from, end) against their rules' `infer` (element counts, and
/// forward dtypes); the other half of the verifier (verifyGraph checks ids, order, layouts).
/// "" when valid.
std::string verifyOpTypes(const Graph &g, OpId from = 0);
/// Normalises a possibly negative axis; false when out of range.
bool normalizeAxis(int64_t axis, size_t rank, size_t &out);

} // namespace tally
