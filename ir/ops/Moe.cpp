// The mixture-of-experts family's rules: moe (each token's top-k routed SwiGLU experts, with
// an optional capacity factor) and moe_backward. docs/counting.md ("MoE") states the same rules
// as formulas.
#include "ir/ops/OpsCommon.h"

#include <cmath>
#include <cstdint>
#include <optional>

namespace tally::oprules {

namespace {

// ---------------------------------------------------------------------------------------------
// Mixture of experts: moe and moe_backward. The routing ops, topk and gather and their
// backward scatter_add, are in ir/ops/Data.cpp.
//
// moe(x [..., d], gates [..., k], indices [..., k], w_gate [E, d, H], w_up [E, d, H],
// w_down [E, H, d]) runs each token's k chosen experts, bias-free SwiGLU
// down(silu(x·gate) * x·up), and sums their outputs weighted by the gates. T = numel(x) / d
// tokens give T·k routed slots. With a capacity factor cf > 0 each expert takes at most
// C = ⌈cf·T·k / E⌉ tokens and its buffers hold C rows: the kernels run E·C rows (padded),
// the model FLOPs count R = min(T·k, E·C) rows (balanced routing; the rest are dropped).
// Outputs: y [..., d], then what the backward reads, [Rb, H] ×3 and [Rb, d] with Rb the rows
// the buffers hold: the gate and up pre-activations, the hidden silu(g)·u, the expert outputs
// before the gate weight (for the gates' gradient).

/// The sizes the counts use: d, H, and R = min(T·k, E·C) the routed rows the model counts
/// (T·k without a capacity), with T = numel(x) / d tokens and k of the E experts each; Rb the
/// rows the kernels run and the buffers hold (T·k, or E·C with a capacity).
template <class C> struct MoeTerms {
  Num<C> R, d, H;
  double Rb = 0;
};

template <class C> MoeTerms<C> moeTerms(C &c) {
  const Shape &x = in(c.g, c.op, 0).shape, &w = in(c.g, c.op, 3).shape;
  MoeTerms<C> m;
  m.d = c.dim("d", x.back());
  m.H = c.dim("H", w[2]);
  Num<C> T = c.rows(x, "T");
  Num<C> k = c.dim("k", in(c.g, c.op, 1).shape.back());
  Num<C> slots = T * k;
  double cf = c.op.attrs->capacity;
  if (cf <= 0) {
    m.Rb = C::value(slots);
    m.R = c.quantity("R", slots);
    return m;
  }
  double E = static_cast<double>(w[0].size);
  m.Rb = E * std::ceil(cf * C::value(T) * C::value(k) / E);
  double R = std::min(C::value(slots), m.Rb);
  if constexpr (C::kExplains)
    m.R = c.quantity("R", Term{"min(T·k, E·⌈cf·T·k / E⌉) with E = " + formatFormulaNumber(E) +
                                   ", cf = " + formatFormulaNumber(cf),
                               "", R});
  else
    m.R = R;
  return m;
}

using MoeDims = MoeTerms<Count>;
MoeDims moeDims(const Graph &g, const Op &op) {
  Count c(g, op);
  return moeTerms(c);
}

/// Rows of the expert buffers from the tokens, top-k, experts and capacity factor; nullopt when
/// past int64.
std::optional<int64_t> moeBufferRows(int64_t T, int64_t k, int64_t E, double capacity) {
  int64_t slots;
  if (__builtin_mul_overflow(T, k, &slots))
    return std::nullopt;
  if (capacity <= 0)
    return slots;
  double c = std::ceil(capacity * static_cast<double>(slots) / static_cast<double>(E));
  int64_t rows;
  if (!(c < 9.0e18) || __builtin_mul_overflow(static_cast<int64_t>(c), E, &rows))
    return std::nullopt;
  return rows;
}

bool inferMoe(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
              ShapeError &err) {
  if (!expectInputs(op, 6, 6, err))
    return false;
  const Tensor &x = in(g, op, 0), &gates = in(g, op, 1), &idx = in(g, op, 2);
  const Shape &wg = in(g, op, 3).shape, &wu = in(g, op, 4).shape, &wd = in(g, op, 5).shape;
  if (x.shape.empty() || !isFloat(x.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "moe needs float tokens [..., d], got " + g.formatShape(x.shape));
  if (!isInteger(idx.dtype))
    return fail(err, ShapeErrorKind::Invalid,
                "moe indices must be integers (the experts topk chose), got " +
                    nameOf(idx.dtype).str() + g.formatShape(idx.shape));
  bool same = gates.shape.size() == x.shape.size() && idx.shape.size() == x.shape.size();
  for (size_t i = 0; same && i + 1 < x.shape.size(); ++i)
    same = gates.shape[i].size == x.shape[i].size && idx.shape[i].size == x.shape[i].size;
  same = same && gates.shape.back().size == idx.shape.back().size && gates.shape.back().size > 0;
  if (!same)
    return fail(err, ShapeErrorKind::Mismatch,
                "moe gates " + g.formatShape(gates.shape) + " and indices " +
                    g.formatShape(idx.shape) + " must be [..., top_k] over the tokens of " +
                    g.formatShape(x.shape));
  int64_t d = x.shape.back().size;
  bool weights = wg.size() == 3 && wu.size() == 3 && wd.size() == 3 && wg[1].size == d &&
                 wu[0].size == wg[0].size && wu[1].size == d && wu[2].size == wg[2].size &&
                 wd[0].size == wg[0].size && wd[1].size == wg[2].size && wd[2].size == d;
  if (!weights)
    return fail(err, ShapeErrorKind::Mismatch,
                "moe expert weights must be w_gate, w_up [experts, d, hidden] and w_down "
                "[experts, hidden, d] with d = " + std::to_string(d) + ", got " +
                    g.formatShape(wg) + ", " + g.formatShape(wu) + ", " + g.formatShape(wd));
  int64_t E = wg[0].size, k = gates.shape.back().size;
  if (E <= 0 || k > E)
    return fail(err, ShapeErrorKind::Invalid,
                "moe routes each token to top_k = " + std::to_string(k) + " of " +
                    std::to_string(E) + " experts: top_k must be at most the experts");
  if (!(op.attrs->capacity >= 0))
    return fail(err, ShapeErrorKind::Invalid, "moe capacity_factor must be 0 (no cap) or positive");
  std::optional<int64_t> tokens = checkedNumel(x.shape);
  std::optional<int64_t> rows = tokens ? moeBufferRows(*tokens / d, k, E, op.attrs->capacity)
                                       : std::nullopt;
  if (!rows)
    return fail(err, ShapeErrorKind::Overflow,
                "the routed tokens of moe are more than fit in a 64-bit integer");
  Dim R{*rows, 0};
  outs.push_back({x.shape, g.activationDtype});
  for (int i = 0; i < 3; ++i)
    outs.push_back({Shape{R, wg[2]}, g.activationDtype});
  outs.push_back({Shape{R, x.shape.back()}, g.activationDtype});
  return true;
}

/// 3 matmuls of 2·d·H per routed row, silu (4) and the product (1) per hidden element, and the
/// gate weight and the sum into y (2) per output element of each row.
template <class C> Num<C> moeMatmuls(C &c, const MoeTerms<C> &m, const Num<C> &rows) {
  return c.lit(6) * rows * m.d * m.H;
}
template <class C> Num<C> moeForwardFlops(C &c, const MoeTerms<C> &m, const Num<C> &rows) {
  return moeMatmuls(c, m, rows) + c.lit(5) * rows * m.H + c.lit(2) * rows * m.d;
}

/// dx: the gate times dy per row (R·d), dh = d(out)·w_downᵀ (2·R·H·d), the SwiGLU backward
/// (12 per hidden element: silu and its derivative, two products), dx_r = dg·w_gateᵀ +
/// du·w_upᵀ (4·R·d·H) and the sum of each token's k rows (R·d). gates: a dot product of dy
/// with each expert output (2·R·d). Each weight: one matmul of 2·R·d·H.
template <class C>
Num<C> moeGradFlops(C &c, const MoeTerms<C> &m, const Num<C> &rows, unsigned i) {
  switch (i) {
  case 0:
    c.note("gate × dy per row, dh = d(out)·w_downᵀ, the SwiGLU backward (12 per hidden "
           "element), dx = dg·w_gateᵀ + du·w_upᵀ, the sum of each token's k rows");
    return c.lit(6) * rows * m.d * m.H + c.lit(12) * rows * m.H + c.lit(2) * rows * m.d;
  case 1:
    c.note("a dot product of dy with each expert output");
    return c.lit(2) * rows * m.d;
  case 3:
  case 4:
  case 5:
    c.note("the weight's gradient: one matmul per expert, over its routed rows");
    return c.lit(2) * rows * m.d * m.H;
  default:
    c.note("integer expert indices have no gradient");
    return c.lit(0);
  }
}

double moeGrad(const Graph &g, const Op &op, const MoeDims &m, double rows, unsigned i) {
  Count c(g, op);
  return moeGradFlops(c, m, rows, i);
}

struct MoeCounts : BaseCounts {
  template <class C> static Num<C> flops(C &c) {
    MoeTerms<C> m = moeTerms(c);
    c.note("per routed row: gate, up and down matmuls (2·d·H each), silu and the product "
           "(5 per hidden element), the gate weight and the sum into y (2 per output "
           "element); the router is its own matmul");
    return moeForwardFlops(c, m, m.R);
  }
  template <class C> static Num<C> grad(C &c, unsigned i) {
    if (i == 2) {
      c.note("integer expert indices have no gradient");
      return c.lit(0);
    }
    MoeTerms<C> m = moeTerms(c);
    return moeGradFlops(c, m, m.R, i);
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    Count c(g, op);
    MoeDims m = moeTerms(c);
    r.executedFlops = moeForwardFlops(c, m, m.Rb);
    r.matmulFlops = moeMatmuls(c, m, m.R);
  }
};

/// The executed count runs the buffers' rows; without dx the weights' gradients still need
/// d(out) (and dg, du for w_gate and w_up), which dx's count otherwise holds.
double executedBackwardMoe(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad) {
  MoeDims m = moeDims(g, op);
  double f = 0;
  for (unsigned i = 0; i < 6; ++i)
    if (need(needGrad, i))
      f += moeGrad(g, op, m, m.Rb, i);
  if (!need(needGrad, 0) && (need(needGrad, 3) || need(needGrad, 4)))
    f += m.Rb * m.d + 2 * m.Rb * m.d * m.H + 12 * m.Rb * m.H;
  else if (!need(needGrad, 0) && need(needGrad, 5))
    f += m.Rb * m.d;
  return f;
}

void savedMoe(const Graph &g, const Op &op, llvm::ArrayRef<bool> needGrad,
              std::vector<SavedTensor> &out) {
  if (!anyNeed(needGrad))
    return;
  bool chain = need(needGrad, 0) || need(needGrad, 3) || need(needGrad, 4);
  if (need(needGrad, 3) || need(needGrad, 4))
    keep(g, out, op.inputs[0], "input");
  keep(g, out, op.inputs[1], "gates");
  keep(g, out, op.inputs[2], "expert indices");
  if (chain) {
    keep(g, out, op.outputs[1], "expert gate pre-activations");
    keep(g, out, op.outputs[2], "expert up pre-activations");
  }
  if (need(needGrad, 5))
    keep(g, out, op.outputs[3], "expert hidden");
  if (need(needGrad, 1))
    keep(g, out, op.outputs[4], "expert outputs");
}

/// moe_backward(x, gates, indices, w_gate, w_up, w_down, g, u, h, out_e, dy): the gradients
/// of x, gates, w_gate, w_up and w_down that gradMask asks for, in that order.
bool inferMoeBackward(const Graph &g, const Op &op, llvm::SmallVectorImpl<TensorType> &outs,
                      ShapeError &err) {
  if (!expectInputs(op, 11, 11, err))
    return false;
  for (unsigned i : {0u, 1u, 3u, 4u, 5u})
    if (gradWanted(op, i))
      outs.push_back({in(g, op, i).shape, i < 3 ? in(g, op, 10).dtype : in(g, op, i).dtype});
  return true;
}

struct MoeBackwardCounts : BaseCounts {
  /// The gradients gradMask asks for, as the forward op's rule counts them.
  template <class C> static Num<C> flops(C &c) {
    MoeTerms<C> m = moeTerms(c);
    Terms<C> t{c};
    for (unsigned i = 0; i < 6; ++i)
      if (gradWanted(c.op, i))
        t.add(moeGradFlops(c, m, m.R, i));
    c.note("dx, the gates, w_gate, w_up and w_down as asked, each as the moe rule counts it");
    return t.total();
  }
  static void finish(const Graph &g, const Op &op, ForwardCost &r) {
    MoeDims m = moeDims(g, op);
    auto need = maskBits(op, 6);
    r.matmulFlops = 0;
    for (unsigned i = 0; i < 6; ++i)
      if (need[i])
        r.matmulFlops += i == 0 ? 6 * m.R * m.d * m.H : i >= 3 ? 2 * m.R * m.d * m.H : 0;
    r.executedFlops = executedBackwardMoe(g, op, need);
  }
};

// The capacity factor, when the plan caps the tokens per expert.
void printMoe(const Graph &, const Op &op, llvm::raw_ostream &os) {
  if (op.attrs->capacity > 0)
    os << " {capacity_factor = " << significant(op.attrs->capacity) << "}";
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The table entries of this family (ir/OpRules.cpp collects them in ir/Ops.def's order).

RULE_ATTRS(Moe, inferMoe, MoeCounts, executedBackwardMoe, savedMoe, &printMoe, nullptr)
RULE_ATTRS(MoeBackward, inferMoeBackward, MoeBackwardCounts, executedDefault, savesNothing, &printMoe, nullptr)

} // namespace tally::oprules
