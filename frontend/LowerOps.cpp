// Lowering: the op a primitive call appends (frontend/LowerPrimitives.cpp binds the call's
// arguments and appends the op). The table here has one entry per kind of ir/Ops.def, each
// written beside the code for its kind in its family's file: LowerElementwise.cpp (the pure
// unary kinds, one entry per row of ir/ops/Unary.def; the binary operators, one per row of
// ir/ops/Binary.def; rope and dropout), LowerLayers.cpp (matmul, moe, attention, norms,
// softmax, cross entropy, convolution and pooling) and LowerData.cpp (reductions, lookups,
// index generation, shapes and views), this file holding the optimizer step's ops. An entry
// names the Lowerer member that reads the kind's arguments into its OpAttrs and inputs and
// calls op1, or says why no primitive call makes the kind (an operator does, or the autodiff,
// or step assembly).
#include "frontend/Lowerer.h"

namespace tally {
namespace lowering {

// The table, indexed by ir/Ops.def's order. Each Lowerer::lowering<ID> is defined by the
// LOWERING or NO_LOWERING line of its family's file.
const Lowerer::Lowering &Lowerer::loweringFor(OpKind k) {
  static const Lowering *const table[] = {
#define OP(ID, NAME, CLASS) &lowering##ID,
#include "ir/Ops.def"
  };
  static_assert(sizeof table / sizeof table[0] == kOpKinds);
  return *table[static_cast<unsigned>(k)];
}

Value Lowerer::primitiveOp(const Bound &b, const Expr &e, Scope &scope) {
  const Lowering &l = loweringFor(b.prim->kind);
  if (!l.lower)
    return noLowering(b, l.none);
  return (this->*l.lower)(b, e, scope);
}

Value Lowerer::noLowering(const Bound &b, const char *why) {
  internalError(b, std::string("the lowering has no case for it (") + why + ")");
  return {};
}

// The optimizer step's ops (ir/ops/Update.cpp), which step assembly appends.
NO_LOWERING(ZeroGrad, "step assembly clears the gradients after the update")
NO_LOWERING(SumSquares, "step assembly's gradient norm, for clipping")
NO_LOWERING(Scale, "an optimizer-phase op (ir/ops/Update.cpp)")
NO_LOWERING(OptimizerUpdate, "step assembly's optimizer update of every parameter")

} // namespace lowering
} // namespace tally
