// BackwardTable.h — the autodiff's per-kind table (step 3 of passes/Backward.cpp): for every
// op kind of ir/Ops.def, the builder of its backward ops, or why it has none.
//
// Each entry, backward<ID>, is defined next to its builder by one BACKWARD or NO_BACKWARD line
// in the file of its family (what ir/ops/ groups together):
//   passes/BackwardMatmul.cpp       matmul, moe, conv2d and pooling (ir/ops Matmul, Moe, Conv)
//   passes/BackwardElementwise.cpp  binary and unary elementwise ops (rows of ir/ops/Binary.def
//                                   and Unary.def), dropout, rope (ir/ops/Elementwise.cpp)
//   passes/BackwardNorm.cpp         softmax, layer and RMS norm, attention, cross entropy
//                                   (ir/ops Norm, Attention, Loss)
//   passes/BackwardData.cpp         embedding, index generation, concat, copies, the gathers
//                                   and scatters, reductions, views, the optimizer's ops
//                                   (ir/ops Data, Reduce, View, Update)
// passes/BackwardRules.cpp indexes them by kind. A kind without an entry does not link, an
// entry for a kind ir/Ops.def does not list does not compile, and a kind with two does not link
// (or compile, in one file): no kind gets no backward by default. Views, integer-producing ops
// and the kinds autodiff and step assembly add say why they have none (NO_BACKWARD).
#pragma once

#include "ir/Graph.h"

namespace tally {
namespace backward {

struct Builder;

/// Appends the backward ops of forward op `op`, whose first output's gradient is `dy`.
using BuildFn = void (*)(Builder &b, const Op &op, TensorId dy);

struct BackwardRule {
  OpKind kind;      ///< the kind this entry was registered for
  BuildFn build;    ///< nullptr when the kind has no backward ops
  const char *none; ///< why it has none (a view's gradient is its base's, ...); nullptr with a builder
};

/// The entry of kind `k`.
const BackwardRule &backwardFor(OpKind k);

#define OP(ID, NAME, CLASS) extern const BackwardRule backward##ID;
#include "ir/Ops.def"

#define BACKWARD(ID, BUILD) const BackwardRule backward##ID = {OpKind::ID, BUILD, nullptr};
#define NO_BACKWARD(ID, WHY) const BackwardRule backward##ID = {OpKind::ID, nullptr, WHY};

} // namespace backward
} // namespace tally
