// One kernel's time on a target (kernelTimeTerms, kernelTime; passes/Passes.h): the roofline
// of its FLOPs and bytes at the op class's efficiency, its exps at the special-function rate, the
// bytes a flash kernel moves outside its loop, a measured kernel's factor, and the host's per-call
// terms. The training step (passes/StepTime.cpp) and inference (passes/Inference.cpp) price every
// op through it, so both price ops the same way.
#include "passes/Passes.h"

#include <algorithm>

namespace tally {

namespace {

/// The seconds of `n` transcendental evaluations (exp, erf, ...). A CPU computes them on the
/// same cores as the arithmetic, and a GPU kernel issues them beside its matmul instructions
/// (FlashAttention-2's softmax waits for them), so the time adds to the compute side of the
/// roofline; 0 on targets without a rate.
double transcendentalSeconds(const Target &t, double n) { return n * t.transcendentalTime; }

/// Host term: of a kernel's calls, those priced as starting a team of threads: KernelWork::forks
/// (at most its calls) on a target with forkOverhead, none on another (a GPU, or a host file
/// from before it was measured: there every call pays kernelOverhead on all threads).
double threadedCalls(const Target &t, const KernelWork &w) {
  return t.forkOverhead > 0 ? std::min(w.forks, w.calls) : 0;
}

/// Host term: the fixed cost of `calls` kernel calls, `forks` of them starting a team of
/// threads (OpenMP's fork and join, in place of a call on the calling thread), paid whatever
/// the size; 0 on targets without a measured overhead.
double hostCallTime(const Target &t, double calls, double forks) {
  return (calls - forks) * t.kernelOverhead + forks * t.forkOverhead;
}

/// Host term: the bandwidth a call moving `bytesPerCall` sees: the cache's when they fit in it
/// (a small tensor stays there between the kernel that writes it and the next that reads it),
/// memory's otherwise. Only the calibrated host states a cache.
double hostBandwidth(const Target &t, double bytesPerCall) {
  return t.cacheBandwidth > 0 && bytesPerCall <= t.cacheBytes ? t.cacheBandwidth : t.bandwidth;
}

/// Host term: how much longer a kernel's work takes because of its calls that start no team of
/// threads (`calls` − `forks`, threadedCalls) and so run on the calling thread alone, at 1/team
/// of the rates the target states for all its threads (each core has its own L2, where such
/// small calls' data is): 1 + (calls − forks)/calls × (team − 1), the work spread evenly over
/// the calls. 1 on targets without forkOverhead (GPUs, a calibration of protocol 5).
double serialFactor(const Target &t, double calls, double forks) {
  const double team = t.teamThreads();
  if (t.forkOverhead <= 0 || team <= 1 || calls <= 0)
    return 1;
  return 1 + (calls - forks) / calls * (team - 1);
}

} // namespace

double KernelTimeTerms::total() const {
  // The native attention kernel (FlashAttention-3) runs its exps while its matmuls run.
  double arithmetic = nativeAttention ? std::max(compute, transcendental) : compute + transcendental;
  return std::max(std::max(arithmetic + outside, memory) * slowdown * serial + calls, launch);
}

KernelTimeTerms kernelTimeTerms(const Target &t, OpClass c, Dtype computeDtype,
                                const KernelWork &w) {
  KernelTimeTerms k;
  k.peak = t.peakFor(w.rate != Dtype::Invalid ? w.rate : computeDtype);
  k.bandwidth = hostBandwidth(t, w.bytes / std::max(1.0, w.calls));
  if (w.flops <= 0 && w.bytes <= 0 && w.transcendentals <= 0 && w.measuredArithmetic <= 0)
    return k;
  // A calibrated target (`host`) carries measured matmul efficiency by FLOPs per call.
  k.efficiency = c == OpClass::Matmul      ? t.matmulEfficiency(computeDtype, w.flops)
                 : c == OpClass::Attention ? t.attentionEfficiency(w.flops)
                                           : t.efficiency.elementwise;
  k.fromCurve = (c == OpClass::Matmul && t.matmulCurve(computeDtype) != nullptr) ||
                (c == OpClass::Attention && !t.attentionCurve.empty());
  if (w.efficiency > 0) { // a kernel measured as itself
    k.efficiency = w.efficiency;
    k.fromCurve = false;
    k.measuredKernel = !w.nativeAttention;
    k.nativeAttention = w.nativeAttention;
  }
  k.compute = k.peak > 0 ? w.flops / k.peak / k.efficiency : 0;
  // A rank of a shared host (Target::shareHost: its peaks are `share` of the machine's). A
  // curve was measured as the runtime runs each call on the whole machine: a call that starts
  // the team of threads runs at the rank's share, but one below the runtime's threading bound
  // (forkingCalls) ran on one thread in the calibration and runs so on the rank, at the
  // curve's own rate (tp2's matmuls were priced 1.7x their measurement).
  if (k.fromCurve && t.share < 1 && t.share > 0 && t.forkOverhead > 0 && w.calls > 0) {
    double forked = std::min(1.0, w.forks / w.calls);
    k.shareFactor = forked + (1 - forked) * t.share;
    k.compute *= k.shareFactor;
  }
  k.transcendental = transcendentalSeconds(t, w.transcendentals);
  if (w.measuredArithmetic > 0) {
    k.measuredArithmetic = true;
    k.compute = w.measuredArithmetic;
    k.transcendental = 0;
  }
  k.outside = k.bandwidth > 0 ? w.outsideBytes / k.bandwidth : 0;
  // A curve's efficiency is a measured rate of FLOPs (the call's whole time on the calibration's
  // shapes, tools/calibrate): it says nothing of how fast bytes move, so a curve-priced call's
  // bytes move at the elementwise efficiency, not at the curve's (a tiny attention call's 0.03
  // made its 17 KB take 26 us, 36x what they take).
  k.byteEfficiency = k.fromCurve ? t.efficiency.elementwise : k.efficiency;
  k.memory = k.bandwidth > 0 ? w.bytes / k.bandwidth / k.byteEfficiency : 0;
  k.threadedCalls = threadedCalls(t, w);
  k.calls = hostCallTime(t, w.calls, k.threadedCalls);
  k.launch = w.inGraph ? 0 : w.calls * t.kernelLaunch; // a graph's kernels are launched by the GPU
  k.slowdown = w.slowdown;
  // A curve was measured on the kernel as it runs, its own threading included (a matmul's tiles
  // decide its threads, not its size).
  k.serial = k.fromCurve ? 1 : serialFactor(t, w.calls, k.threadedCalls);
  return k;
}

double forkingCalls(const Target &t, const Graph &g, const Op &op, double split, double calls,
                    double tokens) {
  if (t.forkOverhead <= 0)
    return 0;
  auto elements = [&](TensorId x) {
    const Tensor &tensor = g.tensors[x];
    const double n = numel(tensor.shape);
    return tensor.role == TensorRole::Param ? n : n / tokens;
  };
  const double share = std::max(1.0, split);
  // A matmul's (and each of its backward matmuls') multiply-adds: the output's elements × K.
  if (op.kind == OpKind::Matmul && op.inputs.size() == 2 && !op.outputs.empty() &&
      !g.tensors[op.inputs[0]].shape.empty()) {
    const double k = static_cast<double>(g.tensors[op.inputs[0]].shape.back().size);
    return elements(op.outputs[0]) * k / share > kForkMatmulWork ? calls : 0;
  }
  // Fused attention: B·H·S·S_kv·hd = q's elements × the keys' sequence length.
  if (op.kind == OpKind::Attention && op.inputs.size() >= 2 && g.tensors[op.inputs[1]].shape.size() >= 2) {
    const double keys = static_cast<double>(g.tensors[op.inputs[1]].shape[1].size);
    return elements(op.inputs[0]) * keys / share > kForkAttentionWork ? calls : 0;
  }
  double largest = 0;
  for (TensorId x : op.inputs)
    largest = std::max(largest, elements(x));
  for (TensorId x : op.outputs)
    largest = std::max(largest, elements(x));
  return largest / share > kForkElements ? calls : 0;
}

/// The runtime's row kernel that runs `op`, or null: the norms, softmax and the loss as tally's
/// own fused kernels (an eager norm or a framework's loss is another program).
const char *rowKernel(const Op &op) {
  if ((op.kind == OpKind::RmsNorm && op.attrs->norm != NormKernel::Fused) ||
      (op.kind == OpKind::CrossEntropy && op.attrs->loss != CrossEntropyKernel::Fused))
    return nullptr;
  return rowKernelName(op.kind);
}

double unaryArithmetic(const Target &t, const Graph &g, const Op &op, bool backward) {
  if (t.unaryTimes.empty() || op.outputs.empty())
    return 0;
  // A row kernel: a cost per row (its reductions) and per element, over its input's rows.
  if (const char *row = rowKernel(op)) {
    const Shape &x = g.tensors[op.inputs[0]].shape;
    const double n = numel(x), width = x.empty() ? 1 : static_cast<double>(x.back().size);
    return t.rowTime(row, backward) * (width > 0 ? n / width : 0) + t.unaryTime(row, backward) * n;
  }
  // Dropout's forward draws its random numbers (a Philox block per 4 elements) and writes its
  // mask; its backward reads the mask: bytes only.
  bool dropout = op.kind == OpKind::Dropout && !backward;
  if (!unaryDef(op.kind) && !dropout)
    return 0;
  return t.unaryTime(opName(op.kind), backward) * numel(g.tensors[op.outputs[0]].shape);
}

const char *rowKernelName(OpKind kind) {
  // The row kernels are named as their ops are in the language (ir/Ops.def).
  for (const std::string &name : Target::rowKernelNames())
    if (name == opName(kind))
      return name.c_str();
  return nullptr;
}

double kernelTime(const Target &t, OpClass c, Dtype computeDtype, const KernelWork &w) {
  return kernelTimeTerms(t, c, computeDtype, w).total();
}

} // namespace tally
