// test_lowering_table.cpp — the lowering's table (frontend/LowerOps.cpp): one entry per kind
// of ir/Ops.def, each its own kind's, either a function that reads a call of the kind or a
// reason why no call makes it, never both nor neither; every primitive of ir/Primitives.cpp
// has a function; a kind with a function and no primitive is a row of ir/ops/Unary.def (its
// call would take one tensor; neg is the operator `-x`); the binary kinds are operators; only
// split and topk return every output. A kind missing from the table does not link; this test
// catches a table indexed wrong or an entry that says nothing.
#include <catch.hpp>

#include "frontend/Lowerer.h"
#include "ir/OpRules.h"
#include "ir/Primitives.h"

#include <cstring>
#include <set>

using namespace tally;
using tally::lowering::Lowerer;

TEST_CASE("lowering table: one entry per op kind, its own, with a function or a reason",
          "[lowering]") {
  std::set<OpKind> called;
  for (const Primitive &p : primitives())
    called.insert(p.kind);
  for (unsigned i = 0; i < kOpKinds; ++i) {
    OpKind k = static_cast<OpKind>(i);
    INFO("op kind " << opName(k).str());
    const Lowerer::Lowering &l = Lowerer::loweringFor(k);
    CHECK(l.kind == k);
    bool lowers = l.lower != nullptr;
    CHECK(lowers == (l.none == nullptr));
    if (!lowers) {
      REQUIRE(l.none != nullptr);
      CHECK(std::strlen(l.none) > 10);
    }
    if (called.count(k))
      CHECK(lowers);
    else if (lowers)
      CHECK(unaryDef(k) != nullptr); // a unary row without a primitive (neg: `-x`)
    if (binaryRuntime(k))
      CHECK_FALSE(lowers);
    CHECK(l.returnsAll == (k == OpKind::Split || k == OpKind::TopK));
    CHECK((!l.returnsAll || lowers));
  }
  // Every unary row lowers through one and the same entry: a new unary kind needs no code.
  for (const UnaryDef &u : unaryDefs())
    CHECK(Lowerer::loweringFor(u.kind).lower == Lowerer::loweringFor(OpKind::Relu).lower);
}
