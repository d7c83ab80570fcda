// Precision lints: the numeric hazards of a plan's dtypes, found before anything runs.
//
//   precision-underflow            a literal that rounds to 0 or to a subnormal in the dtype it
//                                  is used in (optimizer eps, learning rate, normalisation eps,
//                                  a constant operand)
//   precision-overflow             a literal past the largest finite value of that dtype
//   fp16-no-loss-scaling           fp16 (or fp8) gradients without loss scaling
//   low-precision-optimizer-state  optimizer moments stored below fp32
//
// All four are warnings; -Wno-NAME silences one and -Werror turns them into errors. Values are
// converted with ir/Dtype's exact rounding model (roundTo, limitsOf), so "1e-8 in f16 is 0" and
// "1e-8 in bf16 is 1.0012e-08" come from the same code that every other pass trusts.
//
// 1. Policy (train plans): gradients in f16 or fp8 without loss scaling; optimizer state below
//    fp32 when the optimizer keeps state, with the reasons that apply to this optimizer and
//    dtype (a decay rate that rounds to 1, squared gradients that underflow, and the bytes per
//    parameter fp32 state would cost).
// 2. Optimizer literals (train plans): eps in the optimizer state's dtype (it is added to √v
//    there); the learning rate and weight decay in the dtype the update is applied to (the
//    master copy if there is one, else the parameters).
// 3. Graph literals: each layer_norm / rms_norm eps and each constant operand (x * c, c - x)
//    in the dtype of the op's float output. One diagnostic per distinct literal and source
//    location, naming the ops that use it (a LayerNorm in a repeated block is one literal).
#include "support/Diagnostics.h"
#include "support/Format.h"
#include "passes/InstanceNotes.h"
#include "passes/Passes.h"

#include <cmath>
#include <cstdio>
#include <map>
#include <tuple>

namespace tally {

namespace {

/// Five significant digits, as the messages print limits: "6.1035e-05", "1e-08", "65504".
std::string g5(double v) { return significant(v, 5); }

/// What happens to a literal converted to a dtype.
enum class Fit { Exact, Zero, Subnormal, Overflow };

struct Conversion {
  Fit fit = Fit::Exact;
  double stored = 0; ///< roundTo(d, v)
};

Conversion convert(Dtype d, double v) {
  Conversion c;
  c.stored = v;
  if (!isFloat(d) || v == 0 || !std::isfinite(v))
    return c;
  FloatLimits lim = limitsOf(d);
  c.stored = roundTo(d, v);
  if (std::fabs(v) > lim.max || !std::isfinite(c.stored))
    c.fit = Fit::Overflow;
  else if (c.stored == 0)
    c.fit = Fit::Zero;
  else if (std::fabs(c.stored) < lim.minNormal)
    c.fit = Fit::Subnormal;
  return c;
}

/// "eps = 1e-08 underflows to 0 in f16 (smallest normal 6.1035e-05, smallest subnormal
/// 5.9605e-08)" and its overflow and subnormal variants. `what` names the literal: a name
/// ("eps" gives "eps = 1e-08") or "constant" ("the constant 1e+05").
std::string conversionMessage(const std::string &what, double v, Dtype d, const Conversion &c) {
  FloatLimits lim = limitsOf(d);
  std::string limits = " (smallest normal " + g5(lim.minNormal) + ", smallest subnormal " +
                       g5(lim.minSubnormal) + ")";
  std::string lit = what == "constant" ? "the constant " + g5(v) : what + " = " + g5(v);
  switch (c.fit) {
  case Fit::Zero:
    return lit + " underflows to 0 in " + nameOf(d).str() + limits;
  case Fit::Subnormal:
    return lit + " is subnormal in " + nameOf(d).str() + " and is stored as " + g5(c.stored) +
           limits;
  case Fit::Overflow:
    return lit + " is past the largest finite " + nameOf(d).str() + " value, " + g5(lim.max) +
           (std::isfinite(c.stored) ? ", and is stored as " + g5(c.stored)
                                    : ", and becomes " + std::string(std::isnan(c.stored) ? "NaN" : "inf"));
  case Fit::Exact:
    break;
  }
  return lit;
}

DiagKind kindOf(Fit f) {
  return f == Fit::Overflow ? DiagKind::PrecisionOverflow : DiagKind::PrecisionUnderflow;
}

/// Where the precision policy was written: its value in the plan; invalid when it came from
/// --precision or was not given (the default, fp32).
llvm::SMRange precisionRange(const Plan &p) { return p.precision.range; }

/// How the policy was chosen, for notes: "precision = fp16", "the precision record",
/// "--precision fp16" or "the default precision, fp32".
std::string presetText(const Plan &p) {
  if (!p.precision.range.isValid())
    return p.settingRanges.count("precision") ? "--precision " + p.precision.preset
                                              : "the default precision, fp32";
  return p.precision.preset == "custom" ? "the precision record" : "precision = " + p.precision.preset;
}

// ---- step 1: the policy ---------------------------------------------------------------------

bool isFp8(Dtype d) { return d == Dtype::FP8E4M3 || d == Dtype::FP8E5M2; }

void lossScaling(const Plan &p, DiagnosticEngine &diags) {
  Dtype g = p.precision.grads;
  if ((g != Dtype::F16 && !isFp8(g)) || p.precision.lossScaling)
    return;
  FloatLimits lim = limitsOf(g);
  llvm::SMRange r = precisionRange(p);
  auto b = diags.report(DiagKind::Fp16NoLossScaling, r.Start,
                        nameOf(g).str() + " gradients without loss scaling: gradients under " +
                            g5(lim.minSubnormal / 2) + " round to 0 and those under " +
                            g5(lim.minNormal) + " are subnormal");
  b.range(r);
  if (!r.isValid())
    b.note(llvm::SMLoc(), "the precision is " + presetText(p));
  b.note(llvm::SMLoc(), "scale the loss: precision = mixed_fp16 (fp32 master weights, loss scaling), or "
                  "loss_scaling = true in a precision record; bf16 has fp32's range and needs no "
                  "scaling");
  if (r.isValid() && (p.precision.preset == "fp16" || p.precision.preset == "f16"))
    b.fixit(r, "mixed_fp16");
}

/// The optimizer's decay rates that live in its state, with their names.
std::vector<std::pair<const char *, double>> decayRates(const OptimizerSpec &o) {
  if (o.name == "Adam" || o.name == "AdamW" || o.name == "Lion")
    return {{"beta1", o.beta1}, {"beta2", o.beta2}};
  if (o.momentum > 0)
    return {{"momentum", o.momentum}};
  return {};
}

bool keepsSquares(const OptimizerSpec &o) {
  return o.name == "Adam" || o.name == "AdamW" || o.name == "AdaGrad" || o.name == "RMSprop";
}

void optimizerState(const Plan &p, DiagnosticEngine &diags) {
  const OptimizerSpec &o = p.optimizer;
  Dtype d = p.precision.optimizer;
  if (o.states == 0 || !isFloat(d) || limitsOf(d).mantissaBits >= limitsOf(Dtype::F32).mantissaBits)
    return;
  FloatLimits lim = limitsOf(d), f32 = limitsOf(Dtype::F32);
  llvm::SMRange r = precisionRange(p);
  auto b = diags.report(DiagKind::LowPrecisionOptimizerState, r.Start,
                        o.name + " keeps its optimizer state in " + nameOf(d).str() +
                            ", below fp32: " + std::to_string(lim.mantissaBits + 1) +
                            " significant bits against fp32's " +
                            std::to_string(f32.mantissaBits + 1));
  b.range(r);
  if (!r.isValid())
    b.note(llvm::SMLoc(), "the precision is " + presetText(p));
  for (const auto &[name, beta] : decayRates(o)) {
    double stored = roundTo(d, beta);
    if (beta > 0 && beta < 1 && stored >= 1)
      b.note(llvm::SMLoc(), std::string(name) + " = " + g5(beta) + " rounds to " + g5(stored) + " in " +
                          nameOf(d).str() + ": the moving average never decays");
    else if (beta > 0 && beta < 1 && (1 - beta) < lim.epsilon / 2)
      b.note(llvm::SMLoc(), "each step moves the moment by (1 - " + std::string(name) + ") = " +
                          g5(1 - beta) + " of the difference, under half of " +
                          nameOf(d).str() + "'s epsilon " + g5(lim.epsilon) +
                          ": small updates are rounded away");
  }
  if (keepsSquares(o) && lim.exponentBits < f32.exponentBits)
    b.note(llvm::SMLoc(), "the second moment holds squared gradients: a gradient under " +
                        g5(std::sqrt(lim.minSubnormal / 2)) + " squares to 0 in " +
                        nameOf(d).str() + " (smallest subnormal " + g5(lim.minSubnormal) + ")");
  unsigned more = bytesOf(Dtype::F32) > bytesOf(d) ? bytesOf(Dtype::F32) - bytesOf(d) : 0;
  if (more == 0)
    b.note(llvm::SMLoc(), "optimizer = fp32 in the precision record costs no more memory");
  else
    b.note(llvm::SMLoc(), "optimizer = fp32 in the precision record keeps the state in fp32 for " +
                              std::to_string(more * o.states) + " more bytes per parameter (" +
                              std::to_string(o.states) + " state" + (o.states == 1 ? "" : "s") +
                              " × " + std::to_string(more) + " bytes)");
}

// ---- step 2: optimizer literals -------------------------------------------------------------

void optimizerLiteral(const Plan &p, DiagnosticEngine &diags, const char *what, double v,
                      Dtype d, llvm::SMRange at, const std::string &role) {
  Conversion c = convert(d, v);
  if (c.fit == Fit::Exact)
    return;
  llvm::SMRange pr = precisionRange(p);
  diags.report(kindOf(c.fit), at.Start, conversionMessage(what, v, d, c))
      .range(at)
      .note(pr.Start, role + " is " + nameOf(d).str() + " under " + presetText(p), pr);
}

void optimizerLiterals(const Plan &p, DiagnosticEngine &diags) {
  const OptimizerSpec &o = p.optimizer;
  const PrecisionPolicy &pp = p.precision;
  if (o.eps != 0 && o.states > 0) {
    llvm::SMRange at = o.epsRange.isValid() ? o.epsRange : o.range;
    optimizerLiteral(p, diags, "eps", o.eps, pp.optimizer, at,
                     o.name + " adds " + (o.epsRange.isValid() ? "" : "its default ") +
                         "eps to the root of its second moment, and its state");
  }
  bool master = pp.master != Dtype::Invalid;
  Dtype update = master ? pp.master : pp.params;
  std::string role = std::string("the update is applied to the ") +
                     (master ? "master weights, whose dtype" : "parameters (there is no master copy), whose dtype");
  optimizerLiteral(p, diags, "lr", o.lr, update, o.range, role);
  optimizerLiteral(p, diags, "weight_decay", o.weightDecay, update, o.range, role);
}

// ---- step 3: literals in the graph ----------------------------------------------------------

/// One literal at one source location, and the ops that use it.
struct GraphLiteral {
  const char *what;
  double value;
  Dtype dtype;
  llvm::SMRange range;
  std::vector<OpId> ops;
};

void graphLiterals(const Analysis &a, DiagnosticEngine &diags) {
  const Graph &g = *a.graph;
  std::vector<GraphLiteral> found;
  std::map<std::tuple<const char *, double, Dtype, const char *>, size_t> index;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    if (op.outputs.empty())
      continue;
    Dtype d = g.tensors[op.outputs[0]].dtype;
    const char *what = nullptr;
    double v = 0;
    if (op.kind == OpKind::LayerNorm || op.kind == OpKind::RmsNorm)
      what = "eps", v = op.attrs->eps;
    else if (op.attrs->hasScalar)
      what = "constant", v = op.attrs->scalar;
    if (!what || !isFloat(d) || convert(d, v).fit == Fit::Exact)
      continue;
    auto key = std::make_tuple(what, v, d, op.range.Start.getPointer());
    auto [it, fresh] = index.try_emplace(key, found.size());
    if (fresh)
      found.push_back({what, v, d, op.range, {}});
    found[it->second].ops.push_back(i);
  }
  llvm::SMRange pr = precisionRange(*a.plan);
  for (const GraphLiteral &l : found) {
    Conversion c = convert(l.dtype, l.value);
    const Op &first = g.ops[l.ops.front()];
    std::string users = g.opPath(first);
    if (l.ops.size() > 1)
      users += " and " + std::to_string(l.ops.size() - 1) + " more (last " +
               g.opPath(l.ops.back()) + ")";
    auto b = diags.report(kindOf(c.fit), l.range.Start, conversionMessage(l.what, l.value, l.dtype, c));
    b.range(l.range);
    noteInstances(b, diags, l.range.Start, g, first.instance);
    b.note(pr.Start, "activations are " + nameOf(l.dtype).str() + " under " + presetText(*a.plan) +
                         "; used by " + users, pr);
    if (first.kind == OpKind::LayerNorm || first.kind == OpKind::RmsNorm)
      b.note(llvm::SMLoc(), "this holds where the normalisation runs in " + nameOf(l.dtype).str() +
                                "; kernels that compute the statistics in fp32 keep eps exact");
  }
}

} // namespace

void precisionLints(Analysis &a, DiagnosticEngine &diags) {
  const Plan &p = *a.plan;
  if (p.isTrain) {
    lossScaling(p, diags);
    optimizerState(p, diags);
    optimizerLiterals(p, diags);
  }
  graphLiterals(a, diags);
}

} // namespace tally
