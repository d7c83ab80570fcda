// test_backward_table.cpp — the autodiff's table (passes/BackwardTable.h): every op kind of
// ir/Ops.def has one entry, registered for that kind, with a builder or the reason it has none;
// the elementwise kinds register through their rows of ir/ops/Unary.def and Binary.def; and
// every kind that a model's forward graph holds and that has a gradient (its rule's gradient
// FLOPs or tensors kept for the backward, or a float result of a float input) has a builder, so a new op kind cannot get no
// backward without a test failing (besides the link-time check: a kind without an entry does
// not link).
#include "Support.h"

#include "ir/OpRules.h"
#include "ir/Primitives.h"
#include "passes/BackwardTable.h"

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

using namespace tally;
using namespace tally::test;
using backward::backwardFor;
using backward::BackwardRule;

namespace {

std::string kindName(OpKind k) { return opName(k).str(); }

/// Whether `op` has a gradient: its rule gives a float input gradient FLOPs, or keeps tensors
/// for the backward when every input needs a gradient; or, as the gradients that are copies
/// and broadcasts cost no FLOPs (sum, concat, broadcast_to, contiguous), it is not a view (whose
/// gradient is its base's) and computes a float output from a float input.
bool hasGradient(const Graph &g, const Op &op) {
  const OpRule &r = ruleFor(op.kind);
  llvm::SmallVector<bool, 4> all;
  bool anyFloat = false;
  for (unsigned i = 0; i < op.inputs.size(); ++i) {
    bool f = isFloat(g.tensors[op.inputs[i]].dtype);
    all.push_back(f);
    anyFloat |= f;
    if (f && r.gradFlops(g, op, i) > 0)
      return true;
  }
  if (!anyFloat)
    return false;
  std::vector<SavedTensor> saved;
  r.saved(g, op, all, saved);
  if (!saved.empty())
    return true;
  return opClass(op.kind) != OpClass::View && !op.outputs.empty() &&
         isFloat(g.tensors[op.outputs[0]].dtype);
}

} // namespace

TEST_CASE("backward table: every op kind has one entry, a builder or the reason it has none",
          "[backward][table]") {
  for (unsigned k = 0; k < kOpKinds; ++k) {
    OpKind kind = static_cast<OpKind>(k);
    INFO(kindName(kind));
    const BackwardRule &r = backwardFor(kind);
    CHECK(r.kind == kind);
    CHECK((r.build != nullptr) != (r.none != nullptr));
    if (r.none)
      CHECK(std::strlen(r.none) > 10);
    // A view's gradient is its base's: never a backward op of its own.
    if (opClass(kind) == OpClass::View)
      CHECK_FALSE(r.build);
  }
}

TEST_CASE("backward table: the elementwise kinds register through their rows", "[backward][table]") {
  // Every pure unary kind (ir/ops/Unary.def) has the one builder that reads its row.
  REQUIRE(!unaryDefs().empty());
  backward::BuildFn unary = backwardFor(unaryDefs()[0].kind).build;
  CHECK(unary);
  for (const UnaryDef &u : unaryDefs()) {
    INFO(kindName(u.kind));
    CHECK(backwardFor(u.kind).build == unary);
  }
  // Every binary kind (ir/ops/Binary.def) has a builder, and no other kind shares it.
  for (unsigned k = 0; k < kOpKinds; ++k) {
    OpKind kind = static_cast<OpKind>(k);
    INFO(kindName(kind));
    if (binaryRuntime(kind))
      CHECK(backwardFor(kind).build);
    if (!unaryDef(kind))
      CHECK((!backwardFor(kind).build || backwardFor(kind).build != unary));
  }
}

/// The kinds the examples and lit inputs leave out (the operators sub, div and neg, tanh,
/// sigmoid, exp and gather), in one model.
constexpr const char *kRestModel = R"(
model Rest(d = 8) {
  param w: [d, d]
  forward(x: f32[batch, d]) {
    h = x @ w
    a = tanh(h) - sigmoid(h) / exp(-h)
    v, i = topk(a, 2)
    return mean(gather(a, i) * v)
  }
}
train rest { model = Rest()  batch = 4  optimizer = SGD(lr = 0.01)  precision = fp32  target = H100_SXM }
)";

TEST_CASE("backward table: every forward kind with a gradient has a builder",
          "[backward][table]") {
  std::vector<std::string> files;
  for (const char *dir : {"/examples", "/tests/lit"})
    for (const auto &e : std::filesystem::directory_iterator(sourceDir() + dir))
      if (e.path().extension() == ".tally" && e.path().filename() != "diag-model-bounds.tally")
        files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  files.push_back(""); // kRestModel
  std::set<OpKind> seen, withGradient;
  size_t plans = 0;
  for (const std::string &file : files) {
    Compilation c;
    c.diags.setOutput(nullptr);
    if (!(file.empty() ? c.addSource("rest.tally", kRestModel) : c.addFile(file)))
      continue; // a lit input of syntax errors
    for (const PlanDecl *decl : std::vector<const PlanDecl *>(c.program.planOrder)) {
      if (!c.lower(*decl))
        continue;
      ++plans;
      const Graph &g = *c.graph;
      for (const Op &op : g.ops) {
        seen.insert(op.kind);
        if (withGradient.count(op.kind) || !hasGradient(g, op))
          continue;
        withGradient.insert(op.kind);
        INFO(file << ", plan " << decl->name << ": " << g.opPath(op));
        CHECK(backwardFor(op.kind).build);
      }
    }
  }
  INFO(plans << " plans lowered");
  CHECK(plans >= 100);
  // The inputs hold every kind a model's forward graph can hold (the kinds before those
  // autodiff adds, ir/Ops.def, and every primitive's), so each is checked above.
  for (unsigned k = 0; k < static_cast<unsigned>(kFirstInternalOp); ++k) {
    INFO(kindName(static_cast<OpKind>(k)) << " is in no example or lit input");
    CHECK(seen.count(static_cast<OpKind>(k)));
  }
  for (const Primitive &p : primitives()) {
    INFO(kindName(p.kind) << " is in no example or lit input");
    CHECK(seen.count(p.kind));
  }
  CHECK(withGradient.size() >= 20);
}
