// The per-op counting rules written out as formulas, with the op's own sizes substituted, so
// that `tally explain` can show how every FLOP and byte count was derived ("2·M·N·K =
// 2 · 1024 · 1024 · 1024 = 2147483648"). The conventions are those of docs/counting.md and the
// values are those of ir/OpRules.cpp: tests/unit/test_explain.cpp evaluates every substituted
// formula, for every op kind, and checks it against the rule, so the two cannot drift apart.
#pragma once

#include "ir/Graph.h"

#include <string>
#include <vector>

namespace tally {

/// A named quantity a formula uses: a dimension ("K = 768") or a product of them
/// ("S = b·h·s·s_kv = 16 · 12 · 1024 · 1024 = 201326592").
struct FormulaQuantity {
  std::string name;         ///< "M", "n", "S"
  std::string symbolic;     ///< how it is formed ("b·h·s·s_kv"), or the dimension's name ("seq"); may be ""
  std::string substituted;  ///< the same with numbers ("16 · 12 · 1024 · 1024"); "" for a plain dimension
  double value = 0;
};

/// One counting rule applied to one op: the symbolic formula, the same formula with the values
/// substituted, and its value (computed from exactly the numbers shown).
struct Formula {
  std::string symbolic;     ///< "2·M·N·K", "4·S·dh + 5·S", "bytes(in0) + bytes(in1)"
  std::string substituted;  ///< "2 · 1024 · 1024 · 1024": numbers, `·`, `+`, `/` and parentheses only
  double value = 0;         ///< the value of `substituted`
  std::vector<FormulaQuantity> where; ///< the quantities `symbolic` names, in order of use
  std::string note;         ///< a remark on the convention ("a view: no data moves"); may be ""
};

/// Forward model FLOPs of `op` (ForwardCost::flops).
Formula describeForward(const Graph &g, const Op &op);
/// Bytes the forward kernel reads (ForwardCost::bytesRead).
Formula describeBytesRead(const Graph &g, const Op &op);
/// Bytes the forward kernel writes (ForwardCost::bytesWritten).
Formula describeBytesWritten(const Graph &g, const Op &op);
/// FLOPs of the gradient with respect to input `i` (OpRule::gradFlops).
Formula describeGrad(const Graph &g, const Op &op, unsigned i);

/// A count as the formulas print it: an exact integer ("2147483648") when it is one below 2^53,
/// otherwise six significant digits ("0.000976562", "1.5e+20").
std::string formatFormulaNumber(double v);

} // namespace tally
