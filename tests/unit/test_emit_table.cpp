// test_emit_table.cpp — the step emitter's table (OpEmit, codegen/EmitInternal.h): one entry per
// kind of ir/Ops.def, each the kind's own and each either printing the kind or saying why not;
// the unary and binary kinds' runtime names and unary_backward read from their .def rows. A
// kind without an entry does not link (codegen/EmitTable.cpp); this checks what the linker
// cannot: that each entry is its kind's and is complete.
#include <catch.hpp>

#include "codegen/EmitInternal.h"

#include <string>

using namespace tally;
using namespace tally::codegen::emit;

TEST_CASE("every op kind has its own entry in the emitter's table", "[codegen][emit-table]") {
  for (unsigned k = 0; k < kOpKinds; ++k) {
    OpKind kind = static_cast<OpKind>(k);
    INFO(opName(kind).str());
    const OpEmit &e = emitFor(kind);
    CHECK(e.kind == kind);
    // Either the kind prints a call, or the entry says why it does not.
    CHECK((e.call != nullptr) != (e.refused != nullptr));
    if (e.refused)
      CHECK(std::string(e.refused).size() > 0);
    // An optimizer-phase kind is never called in micro_step; only such a kind has update() code.
    if (e.optimizerPhase)
      CHECK(e.call == nullptr);
    if (e.optimizer)
      CHECK(e.optimizerPhase);
    if (opClass(kind) == OpClass::View)
      CHECK(e.call == &Emitter::view);
  }
}

TEST_CASE("the unary and binary kinds print from their .def rows", "[codegen][emit-table]") {
  unsigned unary = 0, binary = 0;
  for (unsigned k = 0; k < kOpKinds; ++k) {
    OpKind kind = static_cast<OpKind>(k);
    INFO(opName(kind).str());
    const OpEmit &e = emitFor(kind);
    if (const UnaryDef *u = unaryDef(kind)) {
      ++unary;
      CHECK(e.call == &Emitter::unary);
      CHECK(e.backward == &Emitter::unaryGradient);
      REQUIRE(unOp(kind) != nullptr);
      CHECK(std::string(unOp(kind)) == std::string("rt::UnOp::") + u->runtime);
      CHECK(binOp(kind) == nullptr);
    } else if (const char *b = binaryRuntime(kind)) {
      ++binary;
      CHECK(e.call == &Emitter::binary);
      CHECK(e.backward == nullptr);
      REQUIRE(binOp(kind) != nullptr);
      CHECK(std::string(binOp(kind)) == std::string("rt::BinOp::") + b);
      CHECK(unOp(kind) == nullptr);
    } else {
      CHECK(e.runtime == nullptr);
      CHECK(unOp(kind) == nullptr);
      CHECK(binOp(kind) == nullptr);
    }
  }
  CHECK(unary == unaryDefs().size());
  CHECK(binary > 0);
}

TEST_CASE("every unary_backward the autodiff makes has a printer", "[codegen][emit-table]") {
  // The autodiff differentiates the pure unary kinds, dropout and rope by a unary_backward op.
  for (const UnaryDef &u : unaryDefs())
    CHECK(emitFor(u.kind).backward != nullptr);
  CHECK(emitFor(OpKind::Dropout).backward == &Emitter::dropoutBackward);
  CHECK(emitFor(OpKind::Rope).backward == &Emitter::ropeBackward);
  // The optimizer phase's ops that passes/Backward.cpp adds each have update() code.
  for (OpKind k : {OpKind::SumSquares, OpKind::OptimizerUpdate, OpKind::ZeroGrad}) {
    INFO(opName(k).str());
    CHECK(emitFor(k).optimizer != nullptr);
  }
}
