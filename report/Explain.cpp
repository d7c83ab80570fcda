// `tally explain`: one op's derivation, or one block's ops, as text or JSON. See Explain.h.
//
// Everything printed is either a number a pass stored (OpAnalysis: FLOPs, bytes, intensity,
// bound, times, gradient split, saved tensors; Analysis::params.byBlock: per-step block totals),
// a formula from the op's rule with its sizes substituted (ir/OpRules.h: the same code as the
// count the passes use, run on terms), or a target datasheet number (peak, bandwidth,
// efficiency) shown as the input of a formula whose result comes from a pass. The only
// arithmetic here is the block subtotal: the sum of the per-op values listed above it,
// labelled as such.
#include "report/Explain.h"
#include "report/Copies.h"

#include "support/Suggest.h"
#include "ir/OpRules.h"
#include "ir/Units.h"
#include "report/Report.h"
#include "report/Sections.h"
#include "passes/Passes.h" // kernelTimeTerms: the terms of the times the pass computed

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <cctype>
#include <cstdio>
#include <set>

namespace tally {

namespace {

// ---- selection ------------------------------------------------------------------------------

/// True when instance `i` is `root` or lies below it.
bool under(const Graph &g, uint32_t i, uint32_t root) {
  for (uint32_t steps = 0; i < g.instances.size() && steps <= g.instances.size(); ++steps) {
    if (i == root)
      return true;
    i = g.instances[i].parent;
  }
  return false;
}

// ---- small formatting helpers ---------------------------------------------------------------

std::string exact(double v) { return formatFormulaNumber(v); }

/// printf formatting of one double ("%.2f", "%.3e", "%g").
std::string printf1(const char *spec, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, spec, v);
  return buf;
}

std::string where(const Op &op, const DiagnosticEngine &diags) {
  std::string file;
  unsigned line = 0, column = 0;
  diags.position(op.range.Start, file, line, column);
  if (file.empty())
    return "an unknown location";
  return file + ":" + std::to_string(line) + ":" + std::to_string(column);
}

/// "in0", "out1", or "" when `t` is neither an input nor an output of `op`.
std::string labelOf(const Op &op, TensorId t) {
  for (unsigned i = 0; i < op.inputs.size(); ++i)
    if (op.inputs[i] == t)
      return "in" + std::to_string(i);
  for (unsigned i = 0; i < op.outputs.size(); ++i)
    if (op.outputs[i] == t)
      return "out" + std::to_string(i);
  return "";
}

std::string tensorName(const Graph &g, TensorId t) {
  const std::string &name = g.tensorName(t);
  return name.empty() ? "%" + std::to_string(t) : name;
}

/// "bf16[batch, seq, 768] = [16, 1024, 768]", the sizes only when some dimension has a name.
std::string typeOf(const Graph &g, TensorId t) {
  const Tensor &x = g.tensors[t];
  std::string named = g.formatShape(x.shape), sizes = Graph::formatSizes(x.shape);
  return nameOf(x.dtype).str() + named + (named == sizes ? "" : " = " + sizes);
}

/// Where an input comes from and whether it needs a gradient.
std::string origin(const Graph &g, TensorId t) {
  const Tensor &x = g.tensors[t];
  std::string from;
  if (x.role == TensorRole::Param)
    from = "a parameter";
  else if (x.role == TensorRole::Input)
    from = "plan input data";
  else if (x.producer != kNone)
    from = "from " + g.opPath(x.producer);
  if (x.viewOf != kNone)
    from += " (a view of " + tensorName(g, x.viewOf) + ")";
  return from;
}

std::string gradRole(const Graph &g, TensorId t) {
  const Tensor &x = g.tensors[t];
  if (!x.requiresGrad)
    return x.role == TensorRole::Input ? "data: needs no gradient"
           : !isFloat(x.dtype)         ? "integers: no gradient"
           : x.role == TensorRole::Param ? "frozen: no gradient"
                                         : "depends on no trainable parameter: no gradient";
  return g.isParamStorage(t) ? "weight gradient" : "input gradient";
}

/// The op's attributes that change its counts, as the user wrote them.
std::string attributes(const Graph &g, const Op &op) {
  const OpAttrs &at = op.attrs;
  if (auto describe = ruleFor(op.kind).describeAttrs) // the kind's own (ir/ops/)
    return describe(g, op);
  if (at.hasScalar)
    return "constant " + printf1("%g", at.scalar) + (at.scalarOnLeft ? " on the left" : " on the right");
  return "";
}

double efficiencyOf(const Target &t, OpKind k) {
  OpClass c = opClass(k);
  return c == OpClass::Matmul ? t.efficiency.matmul
         : c == OpClass::Attention ? t.efficiency.attention
                                   : t.efficiency.elementwise;
}

const char *efficiencyName(OpKind k) {
  OpClass c = opClass(k);
  return c == OpClass::Matmul ? "matmul" : c == OpClass::Attention ? "attention" : "elementwise";
}

// ---- text -----------------------------------------------------------------------------------

bool hasLetter(llvm::StringRef s) {
  return llvm::any_of(s, [](char c) { return std::isalpha(static_cast<unsigned char>(c)); });
}

void printQuantity(llvm::raw_ostream &os, const FormulaQuantity &q) {
  std::string value = exact(q.value);
  os << q.name;
  // A symbolic form made only of numbers says nothing the substituted form does not.
  bool numeric = !hasLetter(q.symbolic) && !q.substituted.empty();
  if (!q.symbolic.empty() && !numeric && q.symbolic != q.name && q.symbolic != value)
    os << " = " << q.symbolic;
  if (!q.substituted.empty() && q.substituted != q.symbolic && q.substituted != value)
    os << " = " << q.substituted;
  os << " = " << value;
}

/// "<title> = symbolic = substituted = value (human)", then the quantities it names and its
/// note on indented lines.
void printFormula(llvm::raw_ostream &os, llvm::StringRef title, const Formula &f,
                  const std::string &human, std::set<std::string> *shown = nullptr) {
  os << "  " << title << " = " << f.symbolic;
  if (f.substituted != f.symbolic && f.substituted != exact(f.value))
    os << " = " << f.substituted;
  if (f.symbolic != exact(f.value))
    os << " = " << exact(f.value);
  if (!human.empty())
    os << " (" << human << ")";
  os << "\n";
  bool first = true;
  for (const FormulaQuantity &q : f.where) {
    std::string text;
    llvm::raw_string_ostream qs(text);
    printQuantity(qs, q);
    qs.flush();
    if (shown && !shown->insert(text).second)
      continue;
    os << (first ? "      where " : ", ") << text;
    first = false;
  }
  if (!first)
    os << "\n";
  if (!f.note.empty())
    os << "      " << f.note << "\n";
}

void printTensors(const Graph &g, const Op &op, llvm::raw_ostream &os) {
  os << "tensors\n";
  for (unsigned i = 0; i < op.inputs.size(); ++i) {
    TensorId t = op.inputs[i];
    os << llvm::formatv("  in{0,-3} {1,-24} {2}", std::to_string(i), tensorName(g, t), typeOf(g, t));
    std::string from = origin(g, t);
    os << (from.empty() ? "" : ", " + from) << "\n";
  }
  for (unsigned i = 0; i < op.outputs.size(); ++i) {
    TensorId t = op.outputs[i];
    os << llvm::formatv("  out{0,-2} {1,-24} {2}", std::to_string(i), tensorName(g, t), typeOf(g, t));
    if (g.tensors[t].viewOf != kNone)
      os << ", a view of " << tensorName(g, g.tensors[t].viewOf);
    os << "\n";
  }
}

void printRoofline(const Analysis &a, const Op &op, const OpAnalysis &oa, llvm::raw_ostream &os) {
  const Target &t = a.plan->target;
  double bytes = oa.forward.bytesRead + oa.forward.bytesWritten;
  os << "roofline\n";
  if (bytes <= 0) {
    os << "  moves no bytes: no intensity, no bound, no time\n";
    return;
  }
  os << "  intensity = FLOPs / (read + written) = " << exact(oa.forward.flops) << " / ("
     << exact(oa.forward.bytesRead) << " + " << exact(oa.forward.bytesWritten) << ") = "
     << printf1("%.2f", oa.intensity()) << " FLOP/byte\n";
  std::string dt = nameOf(oa.computeDtype).str();
  os << "  ridge     = peak(" << dt << ") / bandwidth = "
     << formatRate(t.peakFor(oa.computeDtype), UnitDim::FlopRate) << " / "
     << formatRate(t.bandwidth, UnitDim::ByteRate) << " = "
     << printf1("%.2f", t.ridge(oa.computeDtype)) << " FLOP/byte on " << t.name << "\n";
  os << "  bound     = " << (oa.computeBound ? "compute (intensity >= ridge)" : "memory (intensity < ridge)")
     << "\n";
}

/// One kernel time as passes/StepTime.cpp made it (kernelTimeTerms): the formula with the terms
/// this target has, the numbers put in, each term's value, the total. `flops` and `bytes` are
/// the op's own (before the tensor split and the fused kernels' savings, shown beside them);
/// `tiles`, the factor on a calibrated host's causal attention for the scores its tiles compute
/// (StepTime.cpp, asRun; 1 elsewhere).
void printKernelTime(llvm::raw_ostream &os, llvm::StringRef label, llvm::StringRef what,
                     const Target &t, OpKind kind, Dtype dt, const KernelWork &w, double flops,
                     double bytes, double fusedBytes, double split, double recorded, double tiles = 1) {
  KernelTimeTerms k = kernelTimeTerms(t, opClass(kind), dt, w);
  bool exps = k.transcendental > 0, calls = k.calls > 0, launch = k.launch > 0,
       outside = k.outside > 0;
  // With a launch floor the roofline's max gains a term: max(A, B, launch), or
  // max(max(A, B) + calls, launch) on a target with both.
  // A kernel priced as a multiple of another's time (KernelWork::slowdown) wraps the roofline's
  // max in the factor: max(s × max(A, B) + calls, launch).
  // So does the host's share of calls on one thread (KernelTimeTerms::serial).
  bool slow = k.slowdown * k.serial != 1;
  std::string factor = printf1("%.3g", k.slowdown * k.serial);
  // The launch floor joins the roofline's max unless calls or a factor stand between them.
  auto prefix = [&](const std::string &f) {
    return std::string(launch && (calls || slow) ? "max(" : "") + (slow ? f + " × " : "") + "max(";
  };
  std::string open = prefix("kernel factor");
  std::string close = launch && !calls && !slow ? "" : ")";
  std::string by = split > 1 ? " / " + exact(split) : "";
  std::string pad(label.size(), ' ');
  // The native attention kernel overlaps its exps with its matmuls: the larger of the two.
  bool overlap = exps && k.nativeAttention;
  llvm::StringRef plus = overlap ? ", " : " + ";
  // A unary kind the target measured (Target::unaryTimes): its arithmetic is that measurement.
  bool measured = k.measuredArithmetic;
  // A row kernel's (layer and RMS norm, softmax, the loss): per row and per element.
  bool rows = measured && rowKernelName(kind) != nullptr;
  os << "  " << label << " = " << open << (overlap ? "max(" : "")
     << (rows       ? "(rows × measured time per row + elements × measured time per element)" + by
         : measured ? "elements" + by + " × measured time per element"
                  : "executed " + what.str() + "FLOPs" + (tiles != 1 ? " × tile factor" : "") + by +
                        " / peak / efficiency" + (k.shareFactor != 1 ? " × unthreaded share" : ""))
     << (exps ? plus.str() + "exps × exp time" : "") << (overlap ? ")" : "")
     << (outside ? " + bytes outside the loop / bandwidth" : "") << ", " << what << "bytes"
     << by << " / bandwidth / " << (k.fromCurve ? "elementwise efficiency" : "efficiency") << close
     << (calls ? " + calls × call time" : "")
     << (launch ? ", calls × launch time)" : "") << "\n";
  std::string moved = fusedBytes > 0 ? "(" + exact(bytes) + " − " + exact(fusedBytes) + " fused)"
                                     : exact(bytes);
  std::string eff = printf1("%.3g", k.efficiency); // 0.6, 0.0549: as many digits as it has
  std::string openNumbers = prefix(factor);
  os << "  " << pad << " = " << openNumbers << (overlap ? "max(" : "");
  if (measured)
    os << formatDuration(w.measuredArithmetic);
  else
    os << exact(flops) << (tiles != 1 ? " × " + printf1("%.4g", tiles) : std::string()) << by << " / "
       << formatRate(k.peak, UnitDim::FlopRate) << " / " << eff
       << (k.shareFactor != 1 ? " × " + printf1("%.3g", k.shareFactor) : std::string());
  if (exps)
    os << plus << exact(w.transcendentals) << " / " << printf1("%.4g", 1 / t.transcendentalTime)
       << " exps/s" << (overlap ? ")" : "");
  if (outside)
    os << " + " << exact(w.outsideBytes) << " / " << formatRate(k.bandwidth, UnitDim::ByteRate);
  os << ", " << moved << by << " / " << formatRate(k.bandwidth, UnitDim::ByteRate) << " / "
     << printf1("%.3g", k.byteEfficiency) << close;
  if (calls) {
    if (w.calls > k.threadedCalls)
      os << " + " << exact(w.calls - k.threadedCalls) << " × " << formatDuration(t.kernelOverhead);
    if (k.threadedCalls > 0)
      os << " + " << exact(k.threadedCalls) << " × " << formatDuration(t.forkOverhead) << " threaded";
  }
  if (launch)
    os << ", " << exact(w.calls) << " × " << formatDuration(t.kernelLaunch) << ")";
  os << "\n";
  os << "  " << pad << " = " << openNumbers << (overlap ? "max(" : "") << formatDuration(k.compute);
  if (exps)
    os << plus << formatDuration(k.transcendental) << (overlap ? ")" : "");
  if (outside)
    os << " + " << formatDuration(k.outside);
  os << ", " << formatDuration(k.memory) << close;
  if (calls)
    os << " + " << formatDuration(k.calls);
  if (launch)
    os << ", " << formatDuration(k.launch) << ")";
  os << " = " << formatDuration(recorded) << "\n";
  os << "  " << pad << "   (efficiency " << eff << ": ";
  if (k.nativeAttention)
    os << "the GPU's own fused attention, which the stack (or tally's CUDA step, through cuDNN) runs "
          "(FlashAttention-3 class), its exps overlapping its matmuls: the larger of the two counts";
  else if (k.measuredKernel && kind == OpKind::Attention)
    os << "tally's CUDA attention kernel as measured, scalar fp32 on the CUDA cores";
  else if (k.measuredKernel)
    os << "tally's CUDA step's cuBLASLt matmul with rows not on 16 bytes, as measured "
          "(passes/MatmulAlignment.cpp)";
  else if (measured)
    os << efficiencyName(kind) << " for its bytes; its arithmetic as `tally calibrate` measured the runtime's "
       << opName(kind) << " kernel (" << (rows ? "row_time and elementwise_time" : "elementwise_time") << ")";
  else
    os << efficiencyName(kind);
  if (k.fromCurve)
    os << ", the target's measured curve at " << printf1("%.3g", w.flops) << " FLOPs per call";
  if (k.shareFactor != 1)
    os << "; unthreaded share " << printf1("%.3g", k.shareFactor) << ": of its " << exact(w.calls)
       << " calls, " << exact(w.calls - std::min(w.calls, w.forks))
       << " below the runtime's threading bound run on one thread, as the curve was measured, at the "
          "whole machine's rate; the rest at this rank's share "
       << printf1("%.3g", t.share);
  if (tiles != 1)
    os << "; tile factor " << printf1("%.4g", tiles) << ": the runtime's kernel computes whole tiles of "
       << t.attentionTile << " queries and keys up to the diagonal (attention_tile)";
  if (k.slowdown != 1)
    os << "; kernel factor " << printf1("%.3g", k.slowdown)
       << ": the FlashAttention-1-era Triton kernel (attention_kernel = flash1_triton) takes "
          "FlashAttention-2's time × 1.4 forward, × 2 backward (Dao 2023, §4.1)";
  if (k.serial != 1)
    os << "; kernel factor " << printf1("%.3g", k.serial) << ": " << exact(w.calls - k.threadedCalls)
       << " of its " << exact(w.calls) << " calls, below the runtime's threading bound, start no team of threads "
       << "and run on one of " << exact(t.teamThreads());
  os << (exps ? "; exps at the target's special-function rate" : "");
  if (outside)
    os << "; " << (what.empty() ? "Q in, the output and logsumexp out" : "K and V in, dK and dV out")
       << " once per tile, outside the loop";
  if (launch && k.launch >= k.total())
    os << "; launch-bound: its work takes less than the CPU's " << formatDuration(t.kernelLaunch)
       << " to launch " << (w.calls == 1 ? "it" : "each call");
  if (w.inGraph && t.kernelLaunch > 0)
    os << "; no launch floor: replayed from the CUDA step's graph (passes/CudaGraph.h)";
  os << ")\n";
}

void printTime(const Analysis &a, OpId id, const OpAnalysis &oa, llvm::raw_ostream &os) {
  const Target &t = a.plan->target;
  const Op &op = a.graph->ops[id];
  const FusedSavings &fused = a.fusedOf(id);
  os << "time per micro-batch on one device (passes/StepTime.cpp)\n";
  // An fp8 GEMM's times hold its casts (printFp8): the GEMM's own kernel is shown here.
  bool fp8 = isFp8Gemm(a, id);
  OpClass c = opClass(op.kind);
  double forward = fp8 ? kernelTime(t, c, oa.computeDtype, forwardWork(a, id, oa)) : oa.forwardTime;
  const double tiles = hostAttentionTiles(a, id); // a calibrated host's causal attention (asRun)
  printKernelTime(os, "forward ", "", t, op.kind, oa.computeDtype, forwardWork(a, id, oa),
                  oa.forward.executedFlops,
                  fp8 ? fp8GemmOf(a, id).forward : oa.forward.bytesRead + oa.forward.bytesWritten,
                  fused.forwardBytes, oa.tensorSplit, forward, tiles);
  if (fp8)
    os << "           + the casts below = " << formatDuration(oa.forwardTime) << "\n";
  if (!a.plan->isTrain)
    return;
  if (!hasBackward(*a.graph, *a.plan, op)) {
    os << "  backward = 0 (no input of the op needs a gradient)\n";
    return;
  }
  double backward = fp8 ? kernelTime(t, c, oa.computeDtype, backwardWork(a, id, oa)) : oa.backwardTime;
  printKernelTime(os, "backward", "backward ", t, op.kind, oa.computeDtype,
                  backwardWork(a, id, oa), oa.executedBackwardFlops,
                  fp8 ? fp8GemmOf(a, id).backward : oa.backwardBytes, fused.backwardBytes,
                  oa.tensorSplit, backward, tiles);
  if (fp8)
    os << "           + the casts below = " << formatDuration(oa.backwardTime) << "\n";
  os << "           (backward bytes: what the op's backward ops read and write, and the old "
        "value of each gradient they add into: passes/Autodiff.cpp)\n";
}

/// An fp8 GEMM (passes/Fp8.cpp): its bytes in fp8 (ir/ops/Matmul.cpp, fp8GemmBytes) and its
/// cast kernels, each time as the step time made it.
void printFp8(const Analysis &a, OpId id, const OpAnalysis &oa, llvm::raw_ostream &os) {
  const Plan &p = *a.plan;
  const Fp8Recipe &r = p.precision.fp8;
  const Target &t = p.target;
  Fp8GemmBytes b = fp8GemmOf(a, id);
  const Fp8Storage &s = a.fp8.storage;
  os << "fp8 (Transformer Engine recipe, passes/Fp8.cpp)\n";
  os << "  the GEMMs run at peak(fp8_e4m3): forward X·W in e4m3, the gradients in "
     << nameOf(r.gradDtype()) << "; FLOPs as above\n";
  os << "  fp8 element = " << exact(s.bytes) << " byte"
     << (r.scaling == Fp8Recipe::Scaling::Block ? "s (1 + an E8M0 scale per 32)" : "")
     << "; copies of an operand read both ways = " << exact(s.copies)
     << (s.copies > 1 ? " (the data and its transpose)" : "") << "\n";
  os << "  X " << exact(b.activation) << ", W " << exact(b.weight) << ", Y " << exact(b.output)
     << " elements\n";
  os << "  forward GEMM bytes  = (X + W) × fp8 + Y × b(Y) = " << exact(b.forward) << " ("
     << formatBytes(b.forward) << ")\n";
  if (p.isTrain)
    os << "  backward GEMM bytes = dgrad (dY + W) × fp8 + X × b(X), wgrad (X + dY) × fp8 + W × b(W) = "
       << exact(b.backward) << " (" << formatBytes(b.backward) << ")\n";
  if (b.savedInput > 0)
    os << "  the backward keeps X in fp8 for the weight gradient: " << exact(b.savedInput)
       << " bytes (TE's copy; the list below counts X at its dtype)\n";
  os << "  casts (memory-bound; one multiply per element at the fp32 rate):\n";
  KernelWork in = splitWork(fp8CastWork(a, id, false), oa.tensorSplit);
  os << "  input cast: " << (a.fp8.castsInput[id] ? "X read in its dtype, written as its fp8 copies = "
                                                   + exact(b.inputCast) + " bytes"
                                                 : std::string("X was cast by an earlier GEMM that reads it"))
     << (r.scaling == Fp8Recipe::Scaling::Delayed ? ", plus the amax histories of X, W, Y read and written"
         : r.scaling == Fp8Recipe::Scaling::Current && a.fp8.castsInput[id] ? ", plus X read once more for its amax"
                                                                              : "")
     << "\n";
  printKernelTime(os, "cast fwd", "", t, OpKind::Add, Dtype::F32, in, in.flops, in.bytes, 0, 1,
                  kernelTime(t, OpClass::Elementwise, Dtype::F32, in));
  if (p.isTrain && hasBackward(*a.graph, p, a.graph->ops[id])) {
    KernelWork grad = splitWork(fp8CastWork(a, id, true), oa.tensorSplit);
    os << "  gradient cast: dY read in its dtype, written as its fp8 copies = " << exact(b.gradCast)
       << " bytes"
       << (r.scaling == Fp8Recipe::Scaling::Delayed   ? ", plus the amax histories of dY, dX"
           : r.scaling == Fp8Recipe::Scaling::Current ? ", plus dY read once more for its amax"
                                                      : "")
       << "\n";
    printKernelTime(os, "cast bwd", "", t, OpKind::Add, Dtype::F32, grad, grad.flops, grad.bytes, 0, 1,
                    kernelTime(t, OpClass::Elementwise, Dtype::F32, grad));
    KernelWork w = splitWork(fp8WeightCastWork(a, id), oa.tensorSplit);
    os << "  weight cast, once per step: W read in its dtype, written as its fp8 copies = "
       << exact(b.weightCast) << " bytes"
       << (r.scaling == Fp8Recipe::Scaling::Current ? ", plus W read once more for its amax" : "") << "\n";
    printKernelTime(os, "cast W  ", "", t, OpKind::Add, Dtype::F32, w, w.flops, w.bytes, 0, 1,
                    kernelTime(t, OpClass::Elementwise, Dtype::F32, w));
  }
  os << "  the same GEMM in " << nameOf(p.precision.activations) << ": forward "
     << formatDuration(kernelTime(t, OpClass::Matmul, p.precision.activations, forwardWork(a, id, oa, false)));
  if (p.isTrain && hasBackward(*a.graph, p, a.graph->ops[id]))
    os << ", backward "
       << formatDuration(kernelTime(t, OpClass::Matmul, p.precision.activations, backwardWork(a, id, oa, false)));
  os << " (the times above include the casts)\n";
}

void printBackward(const Analysis &a, OpId id, const OpAnalysis &oa, llvm::raw_ostream &os) {
  const Op &op = a.graph->ops[id];
  const Graph &g = *a.graph;
  std::set<std::string> shown;
  os << "backward per micro-batch\n";
  if (!a.plan->isTrain) {
    os << "  none: an infer plan runs no backward\n";
    return;
  }
  for (unsigned i = 0; i < op.inputs.size(); ++i) {
    TensorId t = op.inputs[i];
    std::string role = gradRole(g, t);
    std::string title = "grad in" + std::to_string(i) + " (" + role + ")";
    if (!g.tensors[t].requiresGrad) {
      os << "  " << title << ": none\n";
      continue;
    }
    printFormula(os, title, describeGrad(g, op, i), "", &shown);
  }
  os << "  input-grad FLOPs  = " << exact(oa.inputGradFlops) << "\n";
  os << "  weight-grad FLOPs = " << exact(oa.weightGradFlops) << "\n";
  os << "  executed          = " << exact(oa.executedBackwardFlops);
  if (op.kind == OpKind::Attention && op.attrs->fused)
    os << " (flash attention recomputes its scores in the backward"
       << (op.attrs->attnWindow > 0 ? "; the kernel computes only the window's band)"
           : op.attrs->causal          ? "; the causal kernel skips the upper triangle)"
                                       : ")");
  os << "\n";
  if (a.savedOf(id).empty()) {
    os << "  saves nothing for the backward\n";
    return;
  }
  os << "  saves for the backward:\n";
  for (const SavedTensor &s : a.savedOf(id)) {
    std::string who = s.tensor == kNone ? "an extra buffer"
                                        : labelOf(op, s.tensor) + " " + tensorName(g, s.tensor);
    os << llvm::formatv("    {0,-26} {1,-28} {2} bytes ({3})", s.what.c_str(), who, exact(s.bytes),
                        formatBytes(s.bytes));
    if (s.tensor != kNone && g.isParamStorage(s.tensor))
      os << ", a parameter: already resident, not activation memory";
    os << "\n";
  }
}

// ---- JSON -----------------------------------------------------------------------------------

llvm::json::Value formulaJson(const Formula &f) {
  llvm::json::Array where;
  for (const FormulaQuantity &q : f.where)
    where.push_back(llvm::json::Object{{"name", q.name},
                                       {"symbolic", q.symbolic},
                                       {"substituted", q.substituted},
                                       {"value", q.value}});
  return llvm::json::Object{{"formula", f.symbolic},
                            {"substituted", f.substituted},
                            {"value", f.value},
                            {"where", std::move(where)},
                            {"note", f.note}};
}

llvm::json::Value tensorJson(const Graph &g, const Op &op, TensorId t) {
  llvm::json::Array sizes;
  for (const Dim &d : g.tensors[t].shape)
    sizes.push_back(d.size);
  return llvm::json::Object{{"label", labelOf(op, t)},
                            {"name", tensorName(g, t)},
                            {"shape", g.formatShape(g.tensors[t].shape)},
                            {"sizes", std::move(sizes)},
                            {"dtype", nameOf(g.tensors[t].dtype).str()},
                            {"origin", labelOf(op, t).rfind("in", 0) == 0 ? origin(g, t) : ""},
                            {"bytes", g.bytes(t)}};
}

} // namespace

ExplainSelection selectForExplain(const Graph &g, llvm::StringRef path) {
  ExplainSelection sel;
  for (OpId i = 0; i < g.ops.size(); ++i)
    if (g.opPath(i) == path) {
      sel.kind = ExplainSelection::Op;
      sel.op = i;
      return sel;
    }
  for (uint32_t i = 0; i < g.instances.size(); ++i)
    if (!path.empty() && g.instancePath(i) == path) {
      sel.kind = ExplainSelection::Block;
      sel.instance = i;
      for (OpId o = 0; o < g.ops.size(); ++o)
        if (under(g, g.ops[o].instance, i))
          sel.ops.push_back(o);
      return sel;
    }
  // A pattern, as the reports' rows name the copies of a repeated block: its first copy.
  bool pattern = path.contains("[*]");
  if (pattern) {
    CopyGroups instances = instanceCopies(g), ops = opCopies(g, instances);
    auto byPattern = [&](size_t count, const auto &pathOf, const CopyGroups &groups) {
      for (size_t i = 0; i < count; ++i)
        if (repeatPattern(pathOf(i)) == path) {
          const CopyGroups::Group &gr = groups.groups[groups.of[i]];
          sel = selectForExplain(g, pathOf(gr.first));
          sel.pattern = path.str();
          sel.copies = gr.members;
          return true;
        }
      return false;
    };
    if (byPattern(g.ops.size(), [&](size_t i) { return g.opPath(static_cast<OpId>(i)); }, ops) ||
        byPattern(g.instances.size(),
                  [&](size_t i) { return g.instancePath(static_cast<uint32_t>(i)); }, instances))
      return sel;
  }
  // A copy index past a repeat's last copy: say how many copies there are (the closest name
  // of "h[12]" would be "h[1]", which is not what was meant). The repeat is the instance named by
  // what precedes the first index; its copies are its children named "[k]".
  size_t open = path.find('['), close = path.find(']');
  unsigned long long index = 0;
  if (!pattern && open != llvm::StringRef::npos && open > 0 && close > open &&
      !path.slice(open + 1, close).getAsInteger(10, index)) {
    std::string prefix = path.take_front(open).str();
    for (uint32_t r = 0; r < g.instances.size(); ++r) {
      if (g.instancePath(r) != prefix)
        continue;
      uint64_t copies = 0;
      for (const Instance &child : g.instances)
        copies += child.parent == r && llvm::StringRef(*child.part).startswith("[");
      if (copies > 0 && index >= copies) {
        sel.outOfRange = prefix + " has " + std::to_string(copies) +
                         (copies == 1 ? " copy, " : " copies, ") + prefix + "[0]" +
                         (copies == 1 ? "" : " to " + prefix + "[" + std::to_string(copies - 1) + "]");
        return sel;
      }
      break;
    }
  }
  // The suggestion is a pattern when a pattern was asked for.
  auto name = [&](std::string p) { return pattern ? repeatPattern(p) : p; };
  std::vector<std::string> names;
  for (const Op &op : g.ops)
    names.push_back(name(g.opPath(op)));
  for (uint32_t i = 0; i < g.instances.size(); ++i)
    if (!g.instances[i].part->empty())
      names.push_back(name(g.instancePath(i)));
  sel.suggestion = closestName(path, names);
  return sel;
}

bool copiesAlike(const Analysis &a, const ExplainSelection &sel) {
  const Graph &g = *a.graph;
  CopyGroups groups = opCopies(g, instanceCopies(g));
  // The op groups of the selected ops (the first copy's), each with its first member.
  std::vector<OpId> model(groups.groups.size(), kNone);
  if (sel.kind == ExplainSelection::Op)
    model[groups.of[sel.op]] = sel.op;
  for (OpId o : sel.ops)
    model[groups.of[o]] = o;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    OpId m = model[groups.of[i]];
    if (m != kNone && !OpTable::same(a.ops[i], a.ops[m]))
      return false;
  }
  return true;
}

namespace {

/// The first line of an explanation selected by a pattern ("" for a path).
std::string copiesLine(const Analysis &a, const ExplainSelection &sel, const std::string &first) {
  if (sel.pattern.empty())
    return "";
  if (sel.copies == 1)
    return sel.pattern + ": one copy only, " + first + " (the reports name it by its path)\n\n";
  std::string line = sel.pattern + ": " + std::to_string(sel.copies) + " copies";
  if (copiesAlike(a, sel))
    return line + ", each with the numbers below (a report's " + sel.pattern +
           " row sums them); explained for the first, " + first + "\n\n";
  return line + ", not all alike (the JSON report lists them one by one); explained for the " +
         "first, " + first + " (explain another by its own path)\n\n";
}

/// The keys a JSON explanation selected by a pattern adds.
void addCopies(const Analysis &a, const ExplainSelection *sel, llvm::json::Object &root) {
  if (!sel || sel->pattern.empty())
    return;
  root["pattern"] = sel->pattern;
  root["copies"] = static_cast<int64_t>(sel->copies);
  root["copies_alike"] = copiesAlike(a, *sel);
}

} // namespace

void explainOpText(const Analysis &a, OpId id, const DiagnosticEngine &diags, llvm::raw_ostream &os,
                   const ExplainSelection *sel) {
  const Graph &g = *a.graph;
  const Plan &p = *a.plan;
  const Op &op = g.ops[id];
  const OpAnalysis &oa = a.ops[id];
  const Instance &inst = g.instances[op.instance];
  std::string instPath = g.instancePath(op.instance);
  if (sel)
    os << copiesLine(a, *sel, g.opPath(op));
  os << g.opPath(op) << ": " << opName(op.kind);
  if (opClassName(opClass(op.kind)) != opName(op.kind))
    os << " (" << opClassName(opClass(op.kind)) << ")";
  os << "\n";
  os << "  written at " << where(op, diags) << ", in "
     << (instPath.empty() ? "the model " + g.model : "block " + instPath + " (" + *inst.block + ")")
     << "\n";
  std::string attrs = attributes(g, op);
  if (!attrs.empty())
    os << "  " << attrs << "\n";
  os << "  " << (p.isTrain ? "train" : "infer") << " plan " << p.name << " on " << p.target.name;
  if (p.isTrain)
    os << "; counts are per micro-batch (" << p.microBatch
       << (p.microBatch == 1 ? " sequence" : " sequences") << ") unless marked per step\n\n";
  else
    os << "; counts are for the prefill, one forward over the " << p.prompt << "-token prompt\n\n";

  printTensors(g, op, os);
  os << "\nFLOPs\n";
  printFormula(os, "forward", describeForward(g, op), formatFlops(oa.forward.flops));
  os << "  matmul part " << exact(oa.forward.matmulFlops) << "; executed "
     << exact(oa.forward.executedFlops) << " (what the kernel runs)\n";

  os << "\nbytes (forward, at the tensors' dtypes)\n";
  std::set<std::string> shown;
  printFormula(os, "read", describeBytesRead(g, op), formatBytes(oa.forward.bytesRead), &shown);
  printFormula(os, "written", describeBytesWritten(g, op), formatBytes(oa.forward.bytesWritten), &shown);

  os << "\n";
  printRoofline(a, op, oa, os);
  os << "\n";
  printTime(a, id, oa, os);
  os << "\n";
  if (isFp8Gemm(a, id)) {
    printFp8(a, id, oa, os);
    os << "\n";
  }
  printBackward(a, id, oa, os);
}

/// The terms of one kernel time (kernelTimeTerms), as the text's printKernelTime shows them.
llvm::json::Object timeTermsJson(const KernelTimeTerms &k) {
  return llvm::json::Object{{"compute_s", k.compute},       {"transcendental_s", k.transcendental},
                            {"memory_s", k.memory},         {"calls_s", k.calls},
                            {"launch_s", k.launch},         {"outside_s", k.outside},
                            {"efficiency", k.efficiency},   {"peak_flops", k.peak},
                            {"bandwidth", k.bandwidth},     {"total_s", k.total()}};
}

void explainOpJson(const Analysis &a, OpId id, const DiagnosticEngine &diags, llvm::raw_ostream &os,
                   const ExplainSelection *sel) {
  const Graph &g = *a.graph;
  const Plan &p = *a.plan;
  const Op &op = g.ops[id];
  const OpAnalysis &oa = a.ops[id];
  const Target &t = p.target;
  using llvm::json::Array;
  using llvm::json::Object;
  std::string file;
  unsigned line = 0, column = 0;
  diags.position(op.range.Start, file, line, column);

  Array inputs, outputs, grads, saved;
  for (TensorId x : op.inputs)
    inputs.push_back(tensorJson(g, op, x));
  for (TensorId x : op.outputs)
    outputs.push_back(tensorJson(g, op, x));
  if (p.isTrain)
    for (unsigned i = 0; i < op.inputs.size(); ++i) {
      bool needs = g.tensors[op.inputs[i]].requiresGrad;
      grads.push_back(Object{{"input", "in" + std::to_string(i)},
                             {"role", gradRole(g, op.inputs[i])},
                             {"needs_grad", needs},
                             {"flops", needs ? formulaJson(describeGrad(g, op, i))
                                             : llvm::json::Value(nullptr)}});
    }
  for (const SavedTensor &s : a.savedOf(id))
    saved.push_back(Object{{"what", s.what.c_str()},
                           {"tensor", s.tensor == kNone ? llvm::json::Value(nullptr)
                                                        : llvm::json::Value(labelOf(op, s.tensor))},
                           {"bytes", s.bytes}});
  double bytes = oa.forward.bytesRead + oa.forward.bytesWritten;
  OpClass c = opClass(op.kind);
  KernelTimeTerms forward = kernelTimeTerms(t, c, oa.computeDtype, forwardWork(a, id, oa));
  Object root{
      {"path", g.opPath(op)},
      {"kind", opName(op.kind).str()},
      {"class", opClassName(opClass(op.kind)).str()},
      {"block", g.instancePath(op.instance)},
      {"location", Object{{"file", file},
                          {"line", static_cast<int64_t>(line)},
                          {"column", static_cast<int64_t>(column)}}},
      {"attributes", attributes(g, op)},
      {"plan", p.name},
      {"micro_batch", p.microBatch},
      {"inputs", std::move(inputs)},
      {"outputs", std::move(outputs)},
      {"forward", Object{{"flops", formulaJson(describeForward(g, op))},
                         {"model_flops", oa.forward.flops},
                         {"matmul_flops", oa.forward.matmulFlops},
                         {"executed_flops", oa.forward.executedFlops}}},
      {"bytes", Object{{"read", formulaJson(describeBytesRead(g, op))},
                       {"written", formulaJson(describeBytesWritten(g, op))},
                       {"total", bytes}}},
      {"intensity", oa.intensity()},
      {"compute_dtype", nameOf(oa.computeDtype).str()},
      {"peak_flops", t.peakFor(oa.computeDtype)},
      {"bandwidth", t.bandwidth},
      {"ridge", t.ridge(oa.computeDtype)},
      {"bound", bytes <= 0 ? llvm::json::Value(nullptr)
                           : llvm::json::Value(oa.computeBound ? "compute" : "memory")},
      // The fraction of the roof the forward time used (a calibrated curve's or a measured
      // kernel's where one applies), and the target's constant for the op's class.
      {"efficiency", forward.efficiency},
      {"target_efficiency", efficiencyOf(t, op.kind)},
      {"tensor_split", oa.tensorSplit},
      {"time", Object{{"forward_s", oa.forwardTime},
                      {"backward_s", oa.backwardTime},
                      {"forward", timeTermsJson(forward)},
                      {"backward", hasBackward(g, p, op)
                                       ? llvm::json::Value(timeTermsJson(kernelTimeTerms(
                                             t, c, oa.computeDtype, backwardWork(a, id, oa))))
                                       : llvm::json::Value(nullptr)}}},
      {"backward", p.isTrain ? llvm::json::Value(Object{{"input_grad_flops", oa.inputGradFlops},
                                                        {"weight_grad_flops", oa.weightGradFlops},
                                                        {"executed_flops", oa.executedBackwardFlops},
                                                        {"bytes", oa.backwardBytes},
                                                        {"grads", std::move(grads)},
                                                        {"saved", std::move(saved)}})
                             : llvm::json::Value(nullptr)},
  };
  addCopies(a, sel, root);
  printJson(os, std::move(root));
}

namespace {

/// The block subtotal: sums of per-op values the passes computed (per micro-batch).
struct Subtotal {
  double forward = 0, backward = 0, bytes = 0, forwardTime = 0, backwardTime = 0;
};

Subtotal subtotal(const Analysis &a, const std::vector<OpId> &ops) {
  Subtotal s;
  for (OpId i : ops) {
    const OpAnalysis &o = a.ops[i];
    s.forward += o.forward.flops;
    s.backward += o.inputGradFlops + o.weightGradFlops;
    s.bytes += o.forward.bytesRead + o.forward.bytesWritten;
    s.forwardTime += o.forwardTime;
    s.backwardTime += o.backwardTime;
  }
  return s;
}

std::string padRight(const std::string &s, size_t width) {
  return s.size() >= width ? s : s + std::string(width - s.size(), ' ');
}

std::string boundOf(const OpAnalysis &o) {
  return o.forward.bytesRead + o.forward.bytesWritten <= 0 ? "-" : o.computeBound ? "compute" : "memory";
}

} // namespace

void explainBlockText(const Analysis &a, const ExplainSelection &sel, llvm::raw_ostream &os) {
  const Graph &g = *a.graph;
  const Instance &inst = g.instances[sel.instance];
  const Analysis::BlockCount &bc = a.params.byBlock[sel.instance];
  os << copiesLine(a, sel, g.instancePath(sel.instance));
  os << g.instancePath(sel.instance) << ": " << *inst.block << ", " << sel.ops.size()
     << " ops written in it and in the blocks below it, " << groupDigits(bc.count)
     << " parameters\n";
  os << "  per micro-batch (" << a.plan->microBatch
     << (a.plan->microBatch == 1 ? " sequence" : " sequences") << "); `tally explain --op PATH` "
     << "derives any line\n\n";
  size_t width = 4;
  for (OpId i : sel.ops)
    width = std::max(width, g.opPath(i).size());
  os << llvm::formatv("  {0} {1,-13} {2,12} {3,12} {4,12} {5,9} {6,-7} {7,10} {8,10}\n",
                      padRight("op", width), "kind", "fwd FLOPs", "bwd FLOPs", "bytes",
                      "intensity", "bound", "fwd time", "bwd time");
  for (OpId i : sel.ops) {
    const Op &op = g.ops[i];
    const OpAnalysis &o = a.ops[i];
    os << llvm::formatv("  {0} {1,-13} {2,12} {3,12} {4,12} {5,9} {6,-7} {7,10} {8,10}\n",
                        padRight(g.opPath(op), width), opName(op.kind), printf1("%.3e", o.forward.flops),
                        printf1("%.3e", o.inputGradFlops + o.weightGradFlops),
                        printf1("%.3e", o.forward.bytesRead + o.forward.bytesWritten),
                        printf1("%.1f", o.intensity()), boundOf(o), formatDuration(o.forwardTime),
                        formatDuration(o.backwardTime));
  }
  Subtotal s = subtotal(a, sel.ops);
  os << "\n  sum of the ops above, per micro-batch: forward " << exact(s.forward)
     << " FLOPs, backward " << exact(s.backward) << " FLOPs, " << exact(s.bytes)
     << " bytes (" << formatBytes(s.bytes) << "), forward " << formatDuration(s.forwardTime)
     << ", backward " << formatDuration(s.backwardTime) << "\n";
  os << (a.plan->isTrain ? "  per optimizer step" : "  per prefill")
     << " on one device (passes/BlockTotals.cpp): forward "
     << exact(bc.forwardFlops) << " FLOPs, backward " << exact(bc.backwardFlops) << " FLOPs, time "
     << formatDuration(bc.time) << "\n";
}

void explainBlockJson(const Analysis &a, const ExplainSelection &sel, llvm::raw_ostream &os) {
  const Graph &g = *a.graph;
  const Instance &inst = g.instances[sel.instance];
  const Analysis::BlockCount &bc = a.params.byBlock[sel.instance];
  using llvm::json::Array;
  using llvm::json::Object;
  Array ops;
  for (OpId i : sel.ops) {
    const OpAnalysis &o = a.ops[i];
    ops.push_back(Object{{"path", g.opPath(i)},
                         {"kind", opName(g.ops[i].kind).str()},
                         {"flops", o.forward.flops},
                         {"backward_flops", o.inputGradFlops + o.weightGradFlops},
                         {"bytes", o.forward.bytesRead + o.forward.bytesWritten},
                         {"intensity", o.intensity()},
                         {"bound", o.forward.bytesRead + o.forward.bytesWritten <= 0
                                       ? llvm::json::Value(nullptr)
                                       : llvm::json::Value(boundOf(o))},
                         {"forward_s", o.forwardTime},
                         {"backward_s", o.backwardTime}});
  }
  Subtotal s = subtotal(a, sel.ops);
  Object root{{"path", g.instancePath(sel.instance)},
              {"block", *inst.block},
              {"params", bc.count},
              {"micro_batch", a.plan->microBatch},
              {"ops", std::move(ops)},
              {"sum_per_micro_batch", Object{{"flops", s.forward},
                                             {"backward_flops", s.backward},
                                             {"bytes", s.bytes},
                                             {"forward_s", s.forwardTime},
                                             {"backward_s", s.backwardTime}}},
              {"per_step", Object{{"forward_flops", bc.forwardFlops},
                                  {"backward_flops", bc.backwardFlops},
                                  {"time_s", bc.time}}}};
  addCopies(a, &sel, root);
  printJson(os, std::move(root));
}

} // namespace tally
