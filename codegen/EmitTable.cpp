// The table of how each op kind is printed (OpEmit, codegen/EmitInternal.h): one entry per kind
// of ir/Ops.def, indexed here by kind, and the two dispatches that read it, emitOp (one call in
// micro_step) and the rt::UnOp / rt::BinOp names. Each entry is defined beside its kind's code:
// the elementwise and data-movement kinds in EmitOps.cpp (the unary and binary kinds by one line
// over the rows of ir/ops/Unary.def and Binary.def), matmul, rope, attention, the norms and the
// losses in EmitLayers.cpp, the optimizer phase's kinds in EmitUpdate.cpp; the kinds the runtime
// has no kernel for are refused at the end of this file, each with its reason.
#include "codegen/EmitInternal.h"

namespace tally::codegen::emit {

namespace {

// One entry per kind, in ir/Ops.def's order. A kind without an entry is an undefined emit<ID>.
const OpEmit *const kEmit[] = {
#define OP(ID, NAME, CLASS) &emit##ID,
#include "ir/Ops.def"
};
static_assert(sizeof kEmit / sizeof kEmit[0] == kOpKinds);

} // namespace

const OpEmit &emitFor(OpKind k) { return *kEmit[static_cast<unsigned>(k)]; }

const char *binOp(OpKind k) { return binaryRuntime(k) ? emitFor(k).runtime : nullptr; }

const char *unOp(OpKind k) { return unaryDef(k) ? emitFor(k).runtime : nullptr; }

bool Emitter::emitOp() {
  const OpEmit &e = emitFor(op->kind);
  if (e.call)
    return (this->*e.call)();
  if (e.optimizerPhase)
    return fail("internal error: an optimizer-phase op in the micro-batch");
  // No kernel in the runtime (the entry says why): refused, naming the op
  // (tests/lit/moe-build-refused.tally, lang-cnn.tally).
  return fail("no " + title() + " code for op kind " + opName(op->kind).str());
}

// ---- the kinds the runtime has no kernel for ---------------------------------------------------

// Mixture of experts (ir/ops/Moe.cpp, docs/counting.md "MoE"): counted and planned, not built.
NO_EMIT(TopK, "no top-k routing kernel in the runtime")
NO_EMIT(Gather, "no routed gather kernel in the runtime")
NO_EMIT(ScatterAdd, "no routed scatter-add kernel in the runtime")
NO_EMIT(Moe, "no routed-experts kernel in the runtime")
NO_EMIT(MoeBackward, "no routed-experts backward kernel in the runtime")

// Convolution and pooling (ir/ops/Conv.cpp): counted and planned, not built.
NO_EMIT(Conv2d, "no convolution kernel in the runtime")
NO_EMIT(Conv2dBackward, "no convolution backward kernel in the runtime")
NO_EMIT(MaxPool2d, "no pooling kernel in the runtime")
NO_EMIT(AvgPool2d, "no pooling kernel in the runtime")
NO_EMIT(PoolBackward, "no pooling backward kernel in the runtime")

} // namespace tally::codegen::emit
