// FP8 training as NVIDIA's Transformer Engine (TE) runs it: `precision = fp8_hybrid`,
// `fp8_e4m3`, or a precision record's `fp8 = { format, amax_history, scaling,
// keep_first_last_bf16 }` (ir/Plan.h, Fp8Recipe). docs/precision.md, "FP8 training", states
// each rule with its source. The bytes of one fp8 GEMM and its casts are counted in one place,
// ir/ops/Matmul.cpp (fp8GemmBytes); this file decides which GEMMs run in fp8 and turns those
// bytes into memory and kernel work.
//
// 1. The fp8 GEMMs: every matmul of one activation by one parameter inside the repeat-block
//    copies (a transformer's layers, which TE's modules replace), or every such matmul when the
//    model has no copies. The matmuls outside the copies (an output head, a stem) stay in the
//    activation dtype: Megatron-LM's output layer and embedding are not TE modules. With
//    keep_first_last_bf16 the first and last copies' matmuls (without copies: the first and
//    last matmul) stay in bf16 too (Megatron-LM's --first-last-layers-bf16). A matmul reading a
//    quantized weight (nf4, int4, int8) is not one. Attention's own products stay in bf16 (TE's
//    fp8_dpa is off by default). Each runs forward, data gradient and weight gradient at the
//    target's fp8 peak (passes/Roofline.cpp); its FLOPs are the matmul rule's.
// 2. Storage on the target (fp8Storage): 1 byte per element under per-tensor (delayed)
//    scaling, 1 + 1/32 under MXFP8 (an E8M0 scale per 32 elements). Hopper's fp8 GEMMs take
//    only the TN layout, so an operand read both ways (X by the forward and the weight
//    gradient, W by the forward and the data gradient, dY by both backward GEMMs) is cast to
//    two copies, the data and its transpose; Blackwell takes every layout and needs one, except
//    under MXFP8, whose one-dimensional blocks run along rows in one copy and columns in the
//    other. A target that does not state a compute capability is taken as Hopper.
// 3. What the backward keeps (selectFp8Gemms): an fp8 GEMM whose weight needs a gradient keeps
//    its input X in fp8 (TE saves the fp8 copy the weight gradient reads), one copy per input
//    however many GEMMs read it (q, k and v read one normalised x: TE's fused QKV casts and
//    keeps it once). An input that another op keeps as well (attention keeps its output, which
//    the output projection reads) stays in its dtype beside the fp8 copy. The activation pass
//    sizes those tensors' buffers so (Analysis::fp8.savedBytes; passes/ActivationFacts.cpp).
//    The bf16 X the cast reads lives from its producer to the cast, as tally's other
//    transients do; its buffer is sized at the kept bytes (a one-layer approximation).
// 4. Memory (fp8Memory): TE caches each fp8 GEMM's weight in fp8 beside the bf16 weight (and
//    the master copy and optimizer state, which fp8 does not touch), with its transpose where
//    the data gradient needs one (step 2); split over tensor × pipeline devices like the
//    weights and over the data group under ZeRO 3. Delayed scaling keeps, per GEMM, an amax
//    history of `amax_history` fp32 values, a scale and an inverse scale for 3 forward tensors
//    (input, weight, output) and 2 backward ones (output gradient, input gradient): 5 ×
//    (history + 2) × 4 bytes per GEMM, on each device holding it; MXFP8 keeps none (its scales
//    are in the 1/32).
// 5. Time (StepTime.cpp, opTimes): each fp8 GEMM's forward and backward kernels move their
//    fp8 bytes (fp8GemmBytes) at the fp8 peak; beside them, memory-bound at the elementwise
//    efficiency, the cast kernels (fp8CastWork): the input's cast (read in its dtype, written as
//    its fp8 copies) in the forward, made by the first GEMM reading it; the output gradient's in
//    the backward; delayed scaling's amax update, which reads and writes every history once per
//    forward and once per backward (one fused kernel each, TE's multi-tensor update, charged to
//    the first fp8 GEMM); and each weight's cast once per optimizer step (fp8WeightCastWork: TE
//    reuses the cast weight across the micro-batches of a step, Megatron-LM's
//    is_first_microbatch). One multiply per element cast, at the fp32 rate. Under current
//    scaling (`scaling = current`: TE's Float8CurrentScaling, torchao's tensorwise dynamic
//    scaling) each cast first reads its tensor once more for the amax, a kernel of its own, and
//    there is no history to update.
#include "passes/Passes.h"

#include <algorithm>

namespace tally {

namespace {

bool blackwell(const Target &t) { return t.computeCapability >= 100; }

} // namespace

std::pair<TensorId, TensorId> weightMatmulOperands(const Graph &g, const Op &op) {
  if (op.kind != OpKind::Matmul || op.inputs.size() != 2)
    return {kNone, kNone};
  bool w0 = g.isParamStorage(op.inputs[0]), w1 = g.isParamStorage(op.inputs[1]);
  if (w0 == w1)
    return {kNone, kNone};
  return w0 ? std::make_pair(op.inputs[1], op.inputs[0]) : std::make_pair(op.inputs[0], op.inputs[1]);
}

namespace {

/// Whether op `i`'s backward computes its activation's / its weight's gradient.
std::pair<bool, bool> gradients(const Analysis &a, OpId i) {
  const Graph &g = *a.graph;
  auto [x, w] = weightMatmulOperands(g, g.ops[i]);
  if (!a.plan->isTrain || x == kNone)
    return {false, false};
  return {g.tensors[x].requiresGrad, g.tensors[w].requiresGrad};
}

/// Step 1: the weight matmuls, and which of them the recipe keeps in bf16.
void markGemms(Analysis &a) {
  const Graph &g = *a.graph;
  const Fp8Recipe &r = a.plan->precision.fp8;
  const RepeatCopies *rc = a.copies.get();
  bool copies = rc && !rc->copies.empty();
  std::vector<OpId> weightMatmuls;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    auto [x, w] = weightMatmulOperands(g, g.ops[i]);
    if (x == kNone || isQuantized(g.tensors[g.storageOf(w)].dtype))
      continue;
    if (copies && (i >= rc->ofOp.size() || rc->ofOp[i] == kNone))
      continue;
    weightMatmuls.push_back(i);
  }
  for (OpId i : weightMatmuls) {
    bool kept = false;
    if (r.keepFirstLastBf16 && copies)
      kept = rc->ofOp[i] == 0 || rc->ofOp[i] + 1 == rc->copies.size();
    else if (r.keepFirstLastBf16)
      kept = i == weightMatmuls.front() || i == weightMatmuls.back();
    a.fp8.gemm[i] = kept ? 2 : 1;
    a.fp8.gemms += kept ? 0 : 1;
    a.fp8.keptBf16 += kept ? 1 : 0;
  }
}

} // namespace

Fp8Storage fp8Storage(const Plan &plan) {
  Fp8Storage s;
  bool block = plan.precision.fp8.scaling == Fp8Recipe::Scaling::Block;
  s.bytes = block ? 1 + 1.0 / 32 : 1;
  s.copies = block || !blackwell(plan.target) ? 2 : 1;
  return s;
}

bool isFp8Gemm(const Analysis &a, OpId i) {
  return a.fp8.active && i < a.fp8.gemm.size() && a.fp8.gemm[i] == 1;
}

Fp8GemmBytes fp8GemmOf(const Analysis &a, OpId i) {
  if (!isFp8Gemm(a, i))
    return {};
  auto [dgrad, wgrad] = gradients(a, i);
  return fp8GemmBytes(*a.graph, a.graph->ops[i], fp8Storage(*a.plan), dgrad, wgrad);
}

void selectFp8Gemms(Analysis &a) {
  const Graph &g = *a.graph;
  a.fp8 = {};
  if (!a.plan->precision.fp8.enabled())
    return;
  a.fp8.active = true;
  a.fp8.storage = fp8Storage(*a.plan);
  a.fp8.gemm.assign(g.ops.size(), 0);
  a.fp8.castsInput.assign(g.ops.size(), 0);
  markGemms(a);
  // Step 3: who keeps each stored tensor: an fp8 GEMM in fp8, or another op in its dtype.
  std::vector<uint8_t> castBy(g.tensors.size(), 0), fp8Kept(g.tensors.size(), 0),
      otherKept(g.tensors.size(), 0);
  std::vector<bool> weightSeen(g.tensors.size(), false);
  for (OpId i = 0; i < g.ops.size(); ++i) {
    if (!isFp8Gemm(a, i))
      continue;
    auto [x, w] = weightMatmulOperands(g, g.ops[i]);
    TensorId s = g.storageOf(x), ws = g.storageOf(w);
    a.fp8.firstGemm = std::min(a.fp8.firstGemm, i);
    a.fp8.castsInput[i] = castBy[s] == 0;
    castBy[s] = 1;
    if (!weightSeen[ws]) {
      weightSeen[ws] = true;
      a.fp8.weightElements += numel(g.tensors[ws].shape);
    }
    a.fp8.scaledTensors += 5;
    if (gradients(a, i).second)
      fp8Kept[s] = 1;
  }
  for (OpId o = 0; o < g.ops.size(); ++o)
    for (const SavedTensor &st : a.savedOf(o)) {
      if (st.tensor == kNone)
        continue;
      TensorId s = g.storageOf(st.tensor);
      bool gemmInput = isFp8Gemm(a, o) && s == g.storageOf(weightMatmulOperands(g, g.ops[o]).first);
      if (!gemmInput && g.tensors[s].role == TensorRole::Activation)
        otherKept[s] = 1;
    }
  auto bytes = std::make_shared<std::vector<double>>(g.tensors.size(), 0.0);
  for (TensorId t = 0; t < g.tensors.size(); ++t) {
    double b = g.bytes(t);
    (*bytes)[t] = b;
    if (!fp8Kept[t] || g.storageOf(t) != t)
      continue;
    double fp8 = numel(g.tensors[t].shape) * a.fp8.storage.bytes;
    (*bytes)[t] = otherKept[t] ? b + fp8 : fp8;
    a.fp8.savedBytesBf16 += b;
    a.fp8.savedBytesFp8 += (*bytes)[t];
  }
  a.fp8.savedBytes = std::move(bytes);
}

KernelWork fp8CastWork(const Analysis &a, OpId i, bool backward) {
  KernelWork w;
  w.calls = 0;
  if (!isFp8Gemm(a, i))
    return w;
  Fp8GemmBytes b = fp8GemmOf(a, i);
  const Fp8Recipe &r = a.plan->precision.fp8;
  double elements = backward ? (b.gradCast > 0 ? b.output : 0)
                             : (a.fp8.castsInput[i] ? b.activation : 0);
  w.bytes = backward ? b.gradCast : (a.fp8.castsInput[i] ? b.inputCast : 0);
  w.calls = elements > 0 ? 1 : 0;
  if (r.scaling == Fp8Recipe::Scaling::Current && elements > 0) {
    // The scale comes from this tensor's amax: one more read of it, a reduction kernel, before
    // the cast (TE's Float8CurrentScaling: compute_amax, then the cast; torchao's tensorwise
    // scaling: tensor_to_amax, then the cast).
    // X and dY are both in the activation dtype.
    w.bytes += elements * bytesOf(a.plan->precision.activations);
    w.calls += 1;
  }
  if (r.scaling == Fp8Recipe::Scaling::Delayed && (!backward || b.gradCast > 0)) {
    // The amax update reads and writes each tensor's history, scale and inverse scale.
    double tensors = backward ? 2 : 3;
    w.bytes += 2 * tensors * (static_cast<double>(r.amaxHistory) + 2) * 4;
    w.calls += i == a.fp8.firstGemm ? 1 : 0;
  }
  w.flops = elements;
  w.rate = Dtype::F32;
  return w;
}

KernelWork fp8WeightCastWork(const Analysis &a, OpId i) {
  KernelWork w;
  w.calls = 0;
  if (!isFp8Gemm(a, i))
    return w;
  Fp8GemmBytes b = fp8GemmOf(a, i);
  w.bytes = b.weightCast;
  w.flops = b.weight;
  w.calls = 1;
  if (a.plan->precision.fp8.scaling == Fp8Recipe::Scaling::Current) { // the weight's amax first
    w.bytes += b.weight * bytesOf(a.plan->precision.params);
    w.calls += 1;
  }
  w.rate = Dtype::F32;
  return w;
}

void resetFp8Times(Analysis &a) {
  auto &f = a.fp8;
  f.gemmForward = f.gemmBackward = f.gemmForwardBf16 = f.gemmBackwardBf16 = 0;
  f.castForward = f.castBackward = f.castBytes = f.weightCast = f.weightCastBytes = 0;
  f.otherForward = f.otherBackward = 0;
}

/// StepTime.cpp, step 2c: fp8 GEMM `i` (passes/Fp8.cpp) adds its cast kernels to its forward and backward
/// times; Analysis::fp8 records the GEMMs' times, the same GEMMs' at the activation dtype's
/// rate and bytes, the casts and (per step, on one device) the weights' casts.
void fp8Times(Analysis &a, OpId i, OpAnalysis &o) {
  const Plan &plan = *a.plan;
  auto &f = a.fp8;
  if (!f.active)
    return;
  bool backward = hasBackward(*a.graph, plan, a.graph->ops[i]);
  if (!isFp8Gemm(a, i)) {
    f.otherForward += o.forwardTime;
    f.otherBackward += o.backwardTime;
    return;
  }
  const Target &t = plan.target;
  Dtype bf = plan.precision.activations;
  f.gemmForward += o.forwardTime;
  f.gemmBackward += o.backwardTime;
  f.gemmForwardBf16 += kernelTime(t, OpClass::Matmul, bf, forwardWork(a, i, o, false));
  f.gemmBackwardBf16 += backward ? kernelTime(t, OpClass::Matmul, bf, backwardWork(a, i, o, false)) : 0;
  KernelWork in = splitWork(fp8CastWork(a, i, false), o.tensorSplit);
  KernelWork grad = splitWork(fp8CastWork(a, i, true), o.tensorSplit);
  KernelWork weight = splitWork(fp8WeightCastWork(a, i), o.tensorSplit);
  double tin = kernelTime(t, OpClass::Elementwise, Dtype::F32, in);
  double tgrad = backward ? kernelTime(t, OpClass::Elementwise, Dtype::F32, grad) : 0;
  o.forwardTime += tin;
  o.backwardTime += tgrad;
  f.castForward += tin;
  f.castBackward += tgrad;
  f.castBytes += in.bytes + (backward ? grad.bytes : 0);
  if (plan.isTrain) { // once per step on the device holding the layer: 1/p of them
    double p = degree(plan.parallel.pipeline);
    f.weightCast += kernelTime(t, OpClass::Elementwise, Dtype::F32, weight) / p;
    f.weightCastBytes += weight.bytes / p;
  }
}

void fp8Memory(Analysis &a) {
  a.memory.fp8Weights = a.memory.fp8Meta = 0;
  if (!a.fp8.active)
    return;
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  const Parallelism &par = plan.parallel;
  std::vector<bool> seen(g.tensors.size(), false);
  double copies = 0;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    if (!isFp8Gemm(a, i))
      continue;
    TensorId w = g.storageOf(weightMatmulOperands(g, g.ops[i]).second);
    if (seen[w])
      continue;
    seen[w] = true;
    copies += fp8GemmOf(a, i).weightCopies;
  }
  a.fp8.weightCopyBytes = copies;
  const Fp8Recipe &r = plan.precision.fp8;
  a.fp8.metaBytes = r.scaling == Fp8Recipe::Scaling::Delayed
                        ? a.fp8.scaledTensors * (static_cast<double>(r.amaxHistory) + 2) * 4
                        : 0;
  double model = degree(par.tensor) * degree(par.pipeline);
  double shard = par.zero >= 3 ? zeroShardRanks(par.data, par.context) : 1;
  a.memory.fp8Weights = copies / model / shard;
  // param_gather (Megatron's --fp8-param-gather: "keep the compute param in fp8 (do not use any
  // other intermediate dtype)"): the fp8 data, and on Hopper its transpose, is the weight; its
  // 16-bit copy is not kept, so the params line loses those weights' bytes.
  if (r.paramGather && !plan.precision.paramsOnHost) {
    double held = a.memory.params + a.memory.grads + a.memory.master + a.memory.optimizer + a.memory.gradAccum;
    double dropped = std::min(a.memory.params, a.fp8.weightElements * bytesOf(plan.precision.params) / model / shard);
    a.memory.params -= dropped;
    if (held > 0)
      a.memory.bytesPerParam *= (held - dropped) / held;
  }
  a.memory.fp8Meta = a.fp8.metaBytes / degree(par.pipeline);
}

} // namespace tally
