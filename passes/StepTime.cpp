// Step time: how long one optimizer step takes on one device, and from it MFU, HFU and the
// run's length. docs/time.md states every formula below with worked GPT-2 numbers.
//
// Notation: t, p, d are the tensor, pipeline and data-parallel degrees; m = batch /
// (micro_batch × d) is the number of micro-batches each pipeline runs per optimizer step (the
// gradient accumulation steps); "bw(x)" is a link's bandwidth times its efficiency.
//
// 1. Tensor parallelism (Megatron): a matmul of an activation by a weight is column-parallel
//    when its activation input is whole (it splits its output over the t devices) and
//    row-parallel when that input is split (it all-reduces its output); elementwise ops,
//    views, attention and losses on a split tensor work on their share; reductions, losses and
//    embeddings return whole tensors. This is the rule of passes/Activations.cpp. Every op
//    whose work is split (a weight matmul, or an op reading a split tensor) has its FLOPs and
//    bytes divided by t (OpAnalysis::tensorSplit). In a transformer block that splits qkv,
//    attention, proj, fc, the activation and the MLP proj; a tied or separate output head is
//    split over the vocabulary (Megatron's vocab-parallel head and cross entropy). With
//    sequence_parallel every op is split (the rest works on 1/t of the tokens), but for the
//    embedding section (the lookups and their sum), which Megatron runs whole and scatters.
// 2. Per op and micro-batch: forward time = kernelTime(executed forward FLOPs / split, forward
//    bytes / split); backward time, for ops with a backward (an input needs a gradient), the
//    same with the executed backward FLOPs and backward bytes. kernelTime = max(FLOPs /
//    peak(computeDtype), bytes / bandwidth) / efficiency of the op's class (matmul, attention,
//    elementwise for the rest). Executed FLOPs, not model FLOPs: time is what kernels run.
//    A target with a measured matmul curve (the calibrated `host`) takes a matmul's efficiency
//    from the curve of its compute dtype at its FLOPs per call (Target::matmulEfficiency).
//    Each transcendental evaluation (exp, erf, tanh, sin, cos: ForwardCost::transcendentals,
//    forward and backward ops) adds transcendentalTime to the compute side: measured on the
//    host, a catalogue GPU's special-function rate (ir/Target.cpp), so flash attention, whose
//    scores never reach memory, pays one exp per score beside its 4·dh matmul FLOPs per score
//    (a head size of 64 runs at a lower fraction of peak than 128). Two more terms are
//    measured on the host only (0 elsewhere): each kernel call (1 forward, one per non-view
//    backward op) adds kernelOverhead outside the max: time = max(FLOPs / peak / efficiency +
//    n_trans × transcendentalTime, bytes / bandwidth / efficiency) + calls × kernelOverhead;
//    a call moving at most cacheBytes reads at cacheBandwidth instead.
//    On a GPU no call takes less than the CPU's cost of launching it (Target::kernelLaunch,
//    3.8 us on catalogue GPUs; 0 on the host, which pays kernelOverhead instead): time =
//    max(the above, calls × kernelLaunch). Large kernels never meet this floor; a small
//    matmul or elementwise op does, so a model of small layers is priced launch-bound, as it
//    runs. The floor is per call: a small kernel queued behind a long one, whose launch the
//    long one hid, is charged the floor all the same (at most calls × kernelLaunch too much).
//    tally's CUDA step replays its forward and backward from a CUDA graph (passes/CudaGraph.h,
//    unless a dropout keeps it from capturing them): those kernels have no floor, and the step
//    pays one kernelLaunch for the graph's launch (in the forward); the optimizer's calls keep it.
//    With fused kernels (Plan::fuseKernels, passes/Fusion.cpp) an op in a fused run moves
//    fewer bytes (the values it reads from registers) and, after the run's first op, makes
//    no call of its own.
//    An fp8 GEMM moves its fp8 bytes at the fp8 rate, plus its casts (2c, passes/Fp8.cpp).
// 3. Per micro-batch totals F (forward), B (backward), R (recompute): R is the forward time of
//    every Recompute step of the schedule (passes/Activations.cpp); without a schedule,
//    F × flops.recompute / flops.forward.
// 4. Compute per step on one device, at the pace of the busiest pipeline device: the repeat
//    copies split over the p·v chunks in balanced whole counts, the embedding with the first,
//    the final norm, head and loss with the last (passes/PipelineStages.cpp); device s's load
//    per micro-batch W_s = F_s + B_s + R_s over its chunks; forward = m·F_slow, backward =
//    m·B_slow, recompute = m·R_slow; the bubble (1F1B) is the others' work filling and
//    draining the pipeline, (Σ_s W_s − max_s W_s)/v, v = interleave — exact for 1F1B when the
//    last device is the busiest. Balanced stages give m·F/p, ... and (p − 1)·(F + B + R)/(v·p),
//    which is also what a model without enough repeat copies to split gets.
// 5. Optimizer update, memory-bound: the device updates the trainable parameters it owns,
//    T/(t·p), divided by d under ZeRO ≥ 1. It reads and writes each owned element's
//    param, grad, master copy and optimizer states once: 2 × owned × (b_param + b_grad +
//    b_master + states × b_state) bytes; its FLOPs are flops.optimizer × owned / T at the fp32
//    rate; time = kernelTime of those, at the elementwise efficiency, with one call per
//    trainable parameter tensor, one for zero_grad and one for the fp16 overflow check. On a
//    host calibrated with `optimizer_bandwidth` (the step's own AdamW loop and zero_grad as
//    `tally calibrate` timed them) the bytes move at that rate instead. With the optimizer state
//    on the host the update runs on the host CPU (ZeRO-Offload): the device time is 0, the
//    transfers are counted in step 8, and the CPU update is taken to overlap the next step
//    (ZeRO-Offload's one-step delayed parameter update).
// 6. Data-parallel communication over the data group (step 10; passes/DataParallelTime.cpp),
//    with G = T/(t·p)·b_grad the device's gradient bytes, P_T its trainable and P all its
//    parameter bytes:
//      ZeRO 0: all-reduce G once per step
//      ZeRO 1: reduce-scatter G, all-gather the updated P_T
//      ZeRO 2: reduce-scatter G every micro-batch (the gradients are sharded, so they cannot
//              be accumulated whole), all-gather P_T once
//      ZeRO 3: reduce-scatter G every micro-batch, all-gather each layer's P/L before its
//              forward and its backward, every micro-batch
//    Gradients go in messages the framework stack sets (passes/Stack.cpp, stackFacts:
//    DDP's 25 MiB, Megatron's max(40M, 1M·d) elements, DeepSpeed's 5e8 elements, FSDP's one per
//    block). With the stack's overlap they hide behind the backward
//    of the last micro-batch (ZeRO 0/1), of every micro-batch (ZeRO 2), or behind all compute
//    (ZeRO 3, gathers prefetched): exposed = max(last bucket or one layer's gather, total −
//    window). The all-gather of P_T after the update (ZeRO 1/2) is always exposed. What is
//    hidden is not free: NCCL's blocks hold channels / multiprocessors of the GPU while it
//    runs, so the compute beside it slows by that fraction of the hidden time
//    (overlapInterference, Collectives.h).
// 7. Tensor-parallel communication per micro-batch: each row-parallel matmul all-reduces its
//    output in the forward (and again when it is recomputed); each whole tensor read by
//    column-parallel matmuls has its gradient all-reduced in the backward (once per tensor:
//    q, k and v share their input). A transformer layer has two of each, of [b, s, d] bytes,
//    each its own collective over the tensor group, times m/p per step. With tensor_overlap
//    (Megatron's asynchronous backward) an input gradient's all-reduce runs while the matmuls
//    that read the input compute their weight gradients: only max(0, all-reduce − their
//    weight-gradient time) is exposed (their backward time × wgrad / (dgrad + wgrad) FLOPs).
//    With sequence_parallel (Megatron-LM megatron/core/tensor_parallel/layers.py, mappings.py)
//    each all-reduce is a reduce-scatter along the sequence (the forward's of a row output, the
//    backward's of a column input's gradient), and all-gathers are added: of each column input
//    before its matmuls and again in the backward for their weight gradient (layers.py
//    LinearWithGradAccumulationAndAsyncCommunication: forward L623-629, backward L667-676), of
//    each row output's gradient (mappings.py _ReduceScatterToSequenceParallelRegion.backward,
//    L372-377) and of the scattered embeddings (L295-297); once per step the gradients of the
//    parameters only sequence-split ops read (norms, a row-parallel bias) are all-reduced,
//    coalesced into one message (distributed/finalize_model_grads.py
//    _allreduce_non_tensor_model_parallel_grads, L451-474).
//    Pipeline parallelism
//    sends the activation at a stage boundary forward and its gradient backward every
//    micro-batch, v times with interleaving: 1/t of it (Megatron's scatter/gather) over the
//    link, or the network when neighbouring stages sit in different nodes, then an all-gather
//    over the tensor group (none under sequence parallelism: the boundary is already split).
// 8. Host transfers over bw(host link), both directions added: every micro-batch the input
//    batch (the graph's inputs) goes host → device; a tensor class placed on the host crosses
//    as often as the step needs it: params on the host go up for each micro-batch's forward
//    and backward (2·m) and, when the device updates, down once; grads on the host go down
//    every micro-batch and, when the device updates, up once; a master copy on the host goes
//    up and down once when the device updates (an infer plan's forward: params on the host go up
//    once); optimizer state on the host moves the update
//    to the host, so the owned grads go down and the updated params come up once per step
//    (classes already on the host do not move, a master copy left on the device goes down and
//    up).
// 9. Only the data-parallel reduction (step 6) and, with tensor_overlap, the backward tensor
//    all-reduces (step 7) overlap compute: step = forward + backward +
//    recompute + bubble + optimizer + communication + host transfers. MFU = model FLOPs
//    (flops.forward + flops.backward, attention dense, as Narayanan et al. and PaLM count them)
//    / (step × peak × devices), with peak the rate matrix products run at (Analysis::peakFlops);
//    HFU = executed FLOPs without the optimizer (flops.executed − flops.optimizer: causal
//    skipping, flash recompute, checkpoint recompute) / the same. Run: steps = tokens / (batch ×
//    seq) (not rounded), run = steps × step, days = run / 86400.
// 10. Topology: ranks are numbered with the first letter of `order` innermost (tensor, then
//    context, pipeline, data by default); a node holds gpusPerNode consecutive ranks. Each
//    collective is priced as NCCL's tuner prices it, the fastest of its algorithms and
//    protocols (passes/Collectives.cpp, docs/time.md "Collectives as NCCL runs them").
// 11. Context parallelism (context = c): every op works on s/c tokens (its split is × c), the
//    tensor all-reduces and stage sends carry 1/c; attention passes its local K/V round the
//    ring of c ranks, c − 1 sends forward and 2(c − 1) backward, each hidden behind the
//    attention computed meanwhile; gradients are all-reduced over the context group as well.
// 12. Expert parallelism (expert = e, carved out of the data ranks: the innermost e of them
//    form an expert group): a moe op is split over the tensor group like an MLP (step 7: y
//    all-reduced forward, x's gradient backward); its routed rows go to the ranks holding their
//    experts and back, an all-to-all each way over the expert group, forward, backward and on
//    recompute. Expert weights are split over e (steps 5, 6, 8): their gradients reduce over
//    the data/e ranks holding the same experts, the rest over all d.
// Infer plans get the forward of the prompt here (the prefill): per-op times, the forward
// all-reduces of row-parallel matmuls (2·(t−1)/t × bytes), p − 1 pipeline boundary sends and the
// input's upload; passes/Inference.cpp does the rest.
#include "support/Diagnostics.h"
#include "passes/Collectives.h"
#include "passes/Stack.h"
#include "passes/Passes.h"
#include "passes/CudaGraph.h"
#include "passes/CudnnAttention.h"
#include "passes/TensorParallel.h"
#include "passes/PricingMemo.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace tally {

/// Step 7: bytes sent across a pipeline stage boundary: the activations the first repeat-block
/// copy reads from outside itself (0 without repeat blocks: nothing to cut between).
double sequenceGradientElements(const Analysis &a, const std::vector<TensorId> &params) {
  const Plan &plan = *a.plan;
  const bool pieces = plan.generatedStep && plan.parallel.data > 1 && plan.parallel.zero >= 2;
  const double d = static_cast<double>(plan.parallel.data);
  double elements = 0;
  for (TensorId w : params)
    elements += pieces ? std::ceil(numel(a.graph->tensors[w].shape) / d) : numel(a.graph->tensors[w].shape);
  return elements;
}

double stageBoundaryBytes(const Graph &g, const RepeatCopies &rc) {
  if (rc.copies.empty())
    return 0;
  std::vector<bool> seen(g.tensors.size(), false);
  double bytes = 0;
  for (OpId i : rc.copies.front().ops)
    for (TensorId x : g.ops[i].inputs) {
      TensorId s = g.storageOf(x);
      const Tensor &st = g.tensors[s];
      if (st.role != TensorRole::Activation || !isFloat(st.dtype) || st.producer == kNone ||
          rc.ofOp[st.producer] == 0 || seen[s])
        continue;
      seen[s] = true;
      bytes += g.bytes(s);
    }
  return bytes;
}

namespace {

/// tally's own CUDA attention (codegen/runtime/cuda/attention.cuh; the tensor-core forward is off) does its arithmetic as scalar fp32 FMAs from shared
/// memory on the CUDA cores, so it runs at the fp32 rate, not the tensor rate, and at the
/// fraction of it cuda_check measured on an H200 (docs/validation.md, 2026-12-01: B16 S1024
/// H12 hd64 causal bf16, forward 7.19 ms, backward 38.1 ms, against the 26.30 and 65.39
/// GFLOP that ir/ops/Attention.cpp counts as executed, less their exps at the special-function
/// rate): 3.67 and 1.72 TFLOP/s of 66.9.
constexpr double kCudaRuntimeAttentionForward = 0.0549;
constexpr double kCudaRuntimeAttentionBackward = 0.0257;

/// The generated CUDA step's cuBLASLt matmul whose rows do not start on 16 bytes
/// (passes/MatmulAlignment.cpp), as cuda_check measured it on an H200 (docs/validation.md,
/// 2026-12-01): GPT-2's head, 16384 × 50257 × 768 in bf16, 1.2648e12 FLOPs in 10.13 ms, 124.9
/// TFLOP/s of 989.5; its aligned neighbour 16384 × 3072 × 768 reached 0.68. Taken for the
/// backward's two products too (the same rows), which were not measured.
constexpr double kCudaRuntimeUnalignedMatmul = 0.1262;

/// `w` as op `i`'s kernels run it, forward or `backward`: a fused attention as the plan's
/// attention kernel runs it (passes/Stack.h, attentionKernel): the target's native kernel at its
/// efficiency, or the FlashAttention-1-era Triton kernel at a multiple of FlashAttention-2's time;
/// under Plan::cudaStep an attention is cuDNN's (passes/CudnnAttention.h) or tally's own CUDA
/// kernel at the fp32 rate and the measured efficiency (the forward's or the backward's,
/// kCudaRuntimeAttention), and an unaligned matmul runs at the fraction measured for one.
KernelWork asRun(const Analysis &a, OpId i, KernelWork w, bool backward) {
  const Op &op = a.graph->ops[i];
  const Target &t = a.plan->target;
  // The padded head (passes/HeadPadding.h): the step's head matmul and cross_entropy run over
  // V' columns, so their forward work grows by V'/V (each product is linear in the vocabulary;
  // the logits and the weight are nearly all their bytes) and the matmul's rows are aligned.
  // The backward's is the step's backward ops', counted on the padded step (Autodiff.cpp).
  if (const HeadPadding &hp = a.headPad; !backward && hp.applies() && (i == hp.matmul || i == hp.loss)) {
    const double grow = static_cast<double>(hp.padded) / static_cast<double>(hp.vocab);
    w.flops *= grow;
    w.bytes *= grow;
  }
  w.inGraph = cudaGraphCaptured(*a.graph, *a.plan);
  w.flops *= hostAttentionTiles(a, i);
  if (!a.plan->cudaStep) {
    if (op.kind == OpKind::Attention && op.attrs->fused && t.attentionCurve.empty()) {
      if (runsNativeAttention(*a.plan)) {
        w.efficiency = t.nativeAttention;
        w.nativeAttention = true;
      }
      w.slowdown = attentionSlowdown(*a.plan, backward);
    }
    return w;
  }
  if (op.kind == OpKind::Attention && cudnnAttentionRefusal(*a.graph, op).empty()) {
    w.nativeAttention = t.attentionCurve.empty() && t.nativeAttention > 0;
    w.efficiency = w.nativeAttention ? t.nativeAttention : w.efficiency;
  } else if (op.kind == OpKind::Attention) {
    w.rate = Dtype::F32;
    w.efficiency = backward ? kCudaRuntimeAttentionBackward : kCudaRuntimeAttentionForward;
    w.outsideBytes = 0; // the measured time holds the whole kernel
  } else if (unalignedMatmul(a, i)) {
    w.efficiency = kCudaRuntimeUnalignedMatmul;
  }
  return w;
}

} // namespace

KernelWork splitWork(KernelWork w, double split) {
  w.flops /= split;
  w.bytes /= split;
  w.transcendentals /= split;
  w.outsideBytes /= split;
  w.measuredArithmetic /= split;
  return w;
}

bool hasBackward(const Graph &g, const Plan &plan, const Op &op) {
  if (!plan.isTrain)
    return false;
  for (TensorId x : op.inputs)
    if (g.tensors[x].requiresGrad)
      return true;
  return false;
}

double flashOutsideBytes(const Analysis &a, OpId i, bool backward) {
  const Graph &g = *a.graph;
  const Op &op = g.ops[i];
  if (op.kind != OpKind::Attention || !op.attrs->fused || op.inputs.size() < 3 ||
      !a.plan->target.attentionCurve.empty())
    return 0;
  if (backward) // K and V in, dK and dV out, once per key tile
    return 2 * (g.bytes(op.inputs[1]) + g.bytes(op.inputs[2]));
  double bytes = g.bytes(op.inputs[0]); // Q in, once per query tile
  for (TensorId out : op.outputs)       // the output and the logsumexp out
    bytes += g.bytes(out);
  return bytes;
}

void addRecomputeMessages(const Graph &g, const TensorParallel &tp, OpId o, bool sequence, std::vector<double> &rows,
                          std::vector<double> &gathers) {
  if (tp.rowParallel[o])
    for (TensorId x : g.ops[o].outputs)
      rows.push_back(g.bytes(x));
  if (tp.columnParallel[o] && sequence)
    gathers.push_back(g.bytes(g.storageOf(weightMatmulOperands(g, g.ops[o]).first)));
}

double hostAttentionTiles(const Analysis &a, OpId i) {
  // The calibrated runtime's attention runs its GEMMs on whole tiles up to the diagonal
  // (ir/Target.h, tiledCausalScores): its curve's FLOPs are those tiles', and so are a call's.
  const Target &t = a.plan->target;
  const Op &op = a.graph->ops[i];
  if (op.kind != OpKind::Attention || t.attentionTile <= 0 || t.attentionCurve.empty())
    return 1;
  return tiledScoreRatio(*a.graph, op, static_cast<double>(t.attentionTile));
}

KernelWork forwardWork(const Analysis &a, OpId i, const OpAnalysis &o, bool asFp8) {
  const FusedSavings &fused = a.fusedOf(i);
  KernelWork w;
  w.flops = o.forward.executedFlops;
  w.bytes = o.forward.bytesRead + o.forward.bytesWritten - fused.forwardBytes;
  w.bytes = asFp8 && isFp8Gemm(a, i) ? fp8GemmOf(a, i).forward : w.bytes; // passes/Fp8.cpp
  w.transcendentals = o.forward.transcendentals;
  w.calls = o.forward.kernels - fused.forwardCalls;
  w.forks = forkingCalls(a.plan->target, *a.graph, a.graph->ops[i], o.tensorSplit, w.calls);
  w.outsideBytes = flashOutsideBytes(a, i, false);
  w.measuredArithmetic = unaryArithmetic(a.plan->target, *a.graph, a.graph->ops[i], false);
  return asRun(a, i, splitWork(w, o.tensorSplit), false);
}

KernelWork backwardWork(const Analysis &a, OpId i, const OpAnalysis &o, bool asFp8) {
  const FusedSavings &fused = a.fusedOf(i);
  KernelWork w;
  w.flops = o.executedBackwardFlops;
  w.bytes = o.backwardBytes - fused.backwardBytes;
  w.bytes = asFp8 && isFp8Gemm(a, i) ? fp8GemmOf(a, i).backward : w.bytes;
  w.transcendentals = o.backwardTranscendentals;
  w.calls = o.backwardCalls - fused.backwardCalls;
  w.forks = forkingCalls(a.plan->target, *a.graph, a.graph->ops[i], o.tensorSplit, w.calls);
  w.outsideBytes = flashOutsideBytes(a, i, true);
  if (o.backwardCalls > 0) // its unary_backward kernel
    w.measuredArithmetic = unaryArithmetic(a.plan->target, *a.graph, a.graph->ops[i], true);
  return asRun(a, i, splitWork(w, o.tensorSplit), true);
}

double trainableTensors(const Graph &g, double above) {
  // Over the graph's parameter list, not every tensor: the step time and the layout search's
  // candidates call it (a deep model has several times more tensors than parameters).
  double n = 0;
  for (const ParamInfo &p : g.params)
    if (g.tensors[p.tensor].requiresGrad && numel(g.tensors[p.tensor].shape) > above)
      n += 1;
  return n;
}

namespace {

/// The number of repeat-block copies (a transformer's layers); 1 without repeat blocks.
double repeatCopies(const RepeatCopies &rc) {
  return std::max<double>(1, static_cast<double>(rc.copies.size()));
}

/// Step 2b: the dequantization kernel before a matmul whose weight (its right operand) is a
/// frozen parameter stored quantized (int8, int4, nf4), as bitsandbytes runs it: one
/// memory-bound kernel that reads the packed weight and its block scales and writes the
/// weight in the activation dtype for the matmul; one multiply per element (code × absmax)
/// and, with double quantization, one per block to restore its scale; FLOPs at the fp32 rate
/// of the CUDA cores. Empty work for any other op.
KernelWork dequantWork(const Graph &g, const Plan &plan, const Op &op) {
  KernelWork w;
  w.calls = 0;
  if (op.kind != OpKind::Matmul || op.inputs.size() != 2)
    return w;
  const Tensor &x = g.tensors[g.storageOf(op.inputs[1])];
  if (x.role != TensorRole::Param || x.requiresGrad || !isQuantized(x.dtype))
    return w;
  QuantSpec q = quantSpecFor(plan.precision, x.dtype);
  double n = numel(x.shape);
  w.bytes = n * quantBitsPerElement(q) / 8 + n * bytesOf(g.activationDtype);
  w.flops = n + (q.doubleBlock > 0 ? n / static_cast<double>(q.block) : 0);
  w.calls = 1;
  w.rate = Dtype::F32;
  return w;
}

/// Step 2: per-op forward and backward times per micro-batch; a matmul reading a quantized
/// weight adds its dequantization (step 2b) to its forward and, when its data gradient is
/// computed (the weight is read again), to its backward; an fp8 GEMM its casts (step 2c).
void computeOpTimes(Analysis &a, const TensorParallel &tp) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  a.dequant = {};
  a.dequant.spec = plan.precision.frozen;
  resetFp8Times(a);
  for (OpId i = 0; i < g.ops.size(); ++i) {
    OpAnalysis o = a.ops[i];
    OpClass c = opClass(g.ops[i].kind);
    o.tensorSplit = tp.split[i];
    KernelTimeTerms forward = kernelTimeTerms(plan.target, c, o.computeDtype, forwardWork(a, i, o));
    o.forwardTime = forward.total();
    o.launchBound = forward.launch > 0 && forward.launch >= o.forwardTime;
    o.backwardTime = hasBackward(g, plan, g.ops[i])
                         ? kernelTime(plan.target, c, o.computeDtype, backwardWork(a, i, o))
                         : 0;
    KernelWork dq = dequantWork(g, plan, g.ops[i]);
    if (dq.calls > 0) {
      dq = splitWork(dq, o.tensorSplit);
      double t = kernelTime(plan.target, OpClass::Elementwise, Dtype::F32, dq);
      bool again = plan.isTrain && g.tensors[g.ops[i].inputs[0]].requiresGrad;
      o.forwardTime += t;
      o.backwardTime += again ? t : 0;
      a.dequant.matmuls += 1;
      a.dequant.bytes += dq.bytes * (again ? 2 : 1);
      a.dequant.flops += dq.flops * (again ? 2 : 1);
      a.dequant.forward += t;
      a.dequant.backward += again ? t : 0;
      if (a.dequant.spec.dtype == Dtype::Invalid)
        a.dequant.spec = quantSpecFor(plan.precision, g.tensors[g.storageOf(g.ops[i].inputs[1])].dtype);
    }
    fp8Times(a, i, o); // step 2c
    a.ops.set(i, o);
  }
}

} // namespace

std::shared_ptr<OpTimesMemo> newOpTimesMemo(size_t keep) { return std::make_shared<OpTimesMemo>(keep); }

namespace {

/// Step 2 (computeOpTimes), or its results for an earlier candidate with the same inputs
/// (Analysis::opTimesMemo): the layout search times hundreds of candidates that differ only in
/// pipeline, interleave, data, ZeRO or micro-batch count, and step 2 was most of each one's time.
void opTimes(Analysis &a, const std::shared_ptr<const TensorParallel> &tp) {
  OpTimesMemo *memo = a.opTimesMemo && a.tensorParallelMemo && !a.fp8.active ? a.opTimesMemo.get() : nullptr;
  if (!memo) {
    computeOpTimes(a, *tp);
    return;
  }
  const Plan &plan = *a.plan;
  OpTimesReads reads{tp, a.headPad.matmul, a.headPad.loss, a.headPad.padded, a.headPad.vocab,
                     attentionKernel(plan), runsNativeAttention(plan), plan.cudaStep,
                     cudaGraphCaptured(*a.graph, plan), plan.target.share};
  if (const OpTimesResult *done = memo->entries.find(
          [&](const OpTimesKey &k) { return k.reads == reads && k.records.sameLayout(a.ops); })) {
    resetFp8Times(a);
    a.ops = done->ops;
    a.dequant = done->dequant;
    return;
  }
  OpTable records = a.ops;
  computeOpTimes(a, *tp);
  memo->entries.add({std::move(records), std::move(reads)}, {a.ops, a.dequant});
}

/// Parameters one device holds of `all` (of which `experts` are MoE experts' weights), when
/// ZeRO at `stage` or above shards them: (all − experts)/(t·p)/d + experts/(etp·p·e)/edp, the
/// experts split over the MoE layers' tensor degree and the expert group and sharded over the
/// replicas that hold the same ones (expertLayout: etp = t and edp = d/e unless folded); d
/// counts the context ranks too (zeroShardRanks).
double perDevice(const Plan &plan, double all, double experts, int stage) {
  const Parallelism &par = plan.parallel;
  double model = degree(par.tensor) * degree(par.pipeline), d = zeroShardRanks(par.data, par.context);
  const ExpertLayout l = expertLayout(par);
  bool sharded = par.zero >= stage;
  return (all - experts) / model / (sharded ? d : 1) +
         experts / (l.etp * degree(par.pipeline) * l.ep) / (sharded ? l.edp : 1);
}

/// Step 5: the device's optimizer update per step.
double optimizerTime(const Analysis &a) {
  const Plan &plan = *a.plan;
  const PrecisionPolicy &pp = plan.precision;
  if (pp.optimizerOnHost || a.params.trainable <= 0)
    return 0;
  double owned = perDevice(plan, a.params.trainable, a.params.expertTrainable, 1);
  double perElement = bytesOf(pp.params) + bytesOf(pp.grads) +
                      (pp.master == Dtype::Invalid ? 0 : bytesOf(pp.master)) +
                      plan.optimizer.states * bytesOf(pp.optimizer);
  KernelWork w;
  w.flops = a.flops.optimizer * owned / a.params.trainable;
  w.bytes = 2 * owned * perElement;
  // One update call per trainable parameter tensor (the step's kUpdate table), zero_grad's
  // fill, and the overflow check under loss scaling.
  w.calls = trainableTensors(*a.graph) + 1 + (pp.lossScaling ? 1 : 0);
  // The updates of tensors above kForkElements start a team; zero_grad's fill (a team above
  // 65,536 elements, rt::fill) and the overflow check (rt::sum_squares) run over every gradient,
  // in one call each.
  if (plan.target.forkOverhead > 0)
    w.forks = trainableTensors(*a.graph, kForkElements) + (owned > 65536 ? 1 : 0) +
              (pp.lossScaling && owned > kForkElements ? 1 : 0);
  Dtype fp32 = plan.target.peakF32 > 0 ? Dtype::F32 : Dtype::TF32;
  const Target &t = plan.target;
  if (t.optimizerBandwidth <= 0)
    return kernelTime(t, OpClass::Elementwise, fp32, w);
  // The calibrated host: its bytes at the rate `tally calibrate` measured the step's own loop
  // at (fp32 AdamW and zero_grad: seven streams, faster than the triad's three on the 2-core
  // machine, docs/targets.md), its FLOPs and calls as any kernel's.
  KernelWork arithmetic = w;
  arithmetic.bytes = 0;
  KernelTimeTerms k = kernelTimeTerms(t, OpClass::Elementwise, fp32, arithmetic);
  return std::max(k.compute + k.transcendental, w.bytes / t.optimizerBandwidth) + k.calls;
}

/// Step 8: bytes over the host link per step on one device.
double hostBytes(const Analysis &a, double m) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  const PrecisionPolicy &pp = plan.precision;
  double input = 0;
  for (TensorId x : g.inputs)
    input += g.bytes(x);
  double bytes = m * input;
  double params = perDevice(plan, a.params.total, a.params.expert, 3) * bytesOf(pp.params);
  if (!plan.isTrain) // the forward reads parameters kept on the host once
    return bytes + (pp.paramsOnHost ? params : 0);
  double grads = perDevice(plan, a.params.trainable, a.params.expertTrainable, 2) * bytesOf(pp.grads);
  double owned = perDevice(plan, a.params.trainable, a.params.expertTrainable, 1);
  bool deviceUpdates = !pp.optimizerOnHost;
  if (pp.paramsOnHost)
    bytes += 2 * m * params + (deviceUpdates ? owned * bytesOf(pp.params) : 0);
  if (pp.gradsOnHost)
    bytes += m * grads + (deviceUpdates ? owned * bytesOf(pp.grads) : 0);
  if (pp.master != Dtype::Invalid && pp.masterOnHost != pp.optimizerOnHost)
    bytes += 2 * owned * bytesOf(pp.master);
  if (pp.optimizerOnHost) {
    if (!pp.gradsOnHost)
      bytes += owned * bytesOf(pp.grads);
    if (!pp.paramsOnHost)
      bytes += owned * bytesOf(pp.params);
  }
  return bytes;
}

/// Step 7: the tensor group's all-reduces of `messages` (each its own collective; `kind`: the
/// reduce-scatters and all-gathers that replace them under sequence parallelism).
double allReduces(const Plan &plan, const std::vector<double> &messages, Collective kind = Collective::AllReduce) {
  Placement g = place(plan, 't');
  double c = degree(plan.parallel.context); // a context rank holds s/c of every message
  double time = 0;
  // A repeated block sends the same messages in every copy: each size is priced once in a row.
  double lastBytes = -1, lastTime = 0;
  for (double bytes : messages) {
    if (bytes != lastBytes) {
      lastBytes = bytes;
      lastTime = collectiveTime(plan.target, g, kind, bytes / c);
    }
    time += lastTime;
  }
  return time;
}

/// Step 7: the backward all-reduces of the tensor group per micro-batch, as exposed: whole, or
/// with Parallelism::tensorOverlap each beyond the weight-gradient time of the matmuls reading
/// its tensor (their backward time's weight-gradient share by FLOPs).
double backwardAllReduces(const Analysis &a, const TensorParallel &tp) {
  const Plan &plan = *a.plan;
  Collective kind = plan.parallel.sequenceParallel ? Collective::ReduceScatter : Collective::AllReduce;
  if (!plan.parallel.tensorOverlap)
    return allReduces(plan, tp.backwardMessages, kind);
  double exposed = 0;
  double lastBytes = -1, lastTime = 0; // each size priced once in a row (allReduces)
  for (size_t k = 0; k < tp.backwardMessages.size(); ++k) {
    double wgrad = 0;
    for (OpId i : tp.backwardReaders[k]) {
      const OpAnalysis &o = a.ops[i];
      double flops = o.inputGradFlops + o.weightGradFlops;
      wgrad += flops > 0 ? o.backwardTime * o.weightGradFlops / flops : 0;
    }
    if (tp.backwardMessages[k] != lastBytes) {
      lastBytes = tp.backwardMessages[k];
      lastTime = allReduces(plan, {lastBytes}, kind);
    }
    exposed += std::max(0.0, lastTime - wgrad);
  }
  return exposed;
}

/// Step 7: one stage-boundary send of a boundary tensor of `bytes`. With t > 1 a stage sends
/// its 1/t share (Megatron's scatter/gather; under sequence parallelism the tensor is already
/// split) and, without sequence parallelism, the receiver all-gathers it over the tensor
/// group. The send crosses the network when any two neighbouring stages sit in different nodes.
double boundarySend(const Plan &plan, double bytes) {
  const Parallelism &par = plan.parallel;
  double t = degree(par.tensor);
  bytes /= degree(par.context); // a context rank sends its s/c tokens
  Placement stages = place(plan, 'p');
  bool network = stages.r > 1;
  double time = sendTime(plan.target, network, bytes / t);
  if (t > 1 && !par.sequenceParallel)
    time += collectiveTime(plan.target, place(plan, 't'), Collective::AllGather, bytes);
  return time;
}

/// Context parallelism per micro-batch (ring attention): each attention op passes its local
/// K and V, (k + v bytes) / (its split), round the ring of c ranks: c − 1 sends forward, and
/// 2·(c − 1) backward (K and V again, and their gradients). Each send overlaps the block of
/// attention computed meanwhile, so what shows is the sends' time beyond the op's own.
double ringAttention(const Analysis &a, const TensorParallel &tp) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  double c = degree(plan.parallel.context);
  if (c <= 1)
    return 0;
  bool network = place(plan, 'c').r > 1;
  double time = 0;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    if (op.kind != OpKind::Attention || op.inputs.size() < 3)
      continue;
    double kv = (g.bytes(op.inputs[1]) + g.bytes(op.inputs[2])) / tp.split[i];
    double send = sendTime(plan.target, network, kv);
    time += std::max(0.0, (c - 1) * send - a.ops[i].forwardTime);
    if (plan.isTrain && a.ops[i].backwardTime > 0)
      time += std::max(0.0, 2 * (c - 1) * send - a.ops[i].backwardTime);
  }
  return time;
}

/// Expert parallelism per micro-batch: each moe op sends its routed rows to the ranks that hold
/// their experts and brings the outputs back, an all-to-all each way over the expert group of
/// the rows' bytes (R_b·d at the activation dtype, the op's expert_out buffer) over its split
/// (a tensor or context rank sends its share): 2 in the forward, 2 in the backward (the
/// gradients back the same ways), and 2 more for each recompute of the op. The bytes of each
/// call, one entry a call; none when e = 1.
std::vector<double> expertMessages(const Analysis &a, const TensorParallel &tp) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  std::vector<double> out;
  if (degree(plan.parallel.expert) <= 1)
    return out;
  auto bytes = [&](OpId i) { return g.bytes(g.ops[i].outputs[4]) / tp.split[i]; };
  for (OpId i = 0; i < g.ops.size(); ++i) {
    const Op &op = g.ops[i];
    if (op.kind != OpKind::Moe || op.outputs.size() < 5)
      continue;
    out.insert(out.end(), plan.isTrain && a.ops[i].backwardTime > 0 ? 4 : 2, bytes(i));
  }
  for (const ScheduleStep &s : a.schedule)
    if (s.kind == ScheduleStep::Recompute && s.op < g.ops.size() && g.ops[s.op].kind == OpKind::Moe &&
        g.ops[s.op].outputs.size() >= 5)
      out.insert(out.end(), 2, bytes(s.op));
  return out;
}

/// The seconds of one micro-batch's expert all-to-alls on one device (expertMessages).
double expertAllToAll(const Analysis &a, const std::vector<double> &messages) {
  const Placement group = place(*a.plan, 'e');
  double time = 0;
  for (double bytes : messages)
    time += collectiveTime(a.plan->target, group, Collective::AllToAll, bytes);
  return time;
}

/// Step 7, the sequence parallel all-gathers of one micro-batch (0 without sequence_parallel):
/// each column input's before its matmuls (and, training, again in the backward), each row
/// output's gradient and the embeddings' scattered sum's gradient in the backward, each
/// recomputed column-parallel matmul's input again;
/// recorded in Analysis::collectives `times` times per step.
double sequenceGathers(Analysis &a, const TensorParallel &tp, const std::vector<double> &recomputeGathers, double times) {
  const Plan &plan = *a.plan;
  if (!plan.parallel.sequenceParallel || degree(plan.parallel.tensor) <= 1)
    return 0;
  double c = degree(plan.parallel.context);
  recordMessages(a, "sequence parallel all-gather of a column input", 't', Collective::AllGather, tp.gatherMessages, c,
                 times, false);
  double time = allReduces(plan, tp.gatherMessages, Collective::AllGather);
  if (!plan.isTrain)
    return time;
  // Again in the backward for the weight gradient: with tensor_overlap asynchronous beside the
  // readers' input-gradient GEMMs (layers.py L667-680), only what exceeds them exposed.
  recordMessages(a, "sequence parallel all-gather of a column input again (backward)", 't', Collective::AllGather,
                 tp.gatherMessages, c, times, plan.parallel.tensorOverlap);
  for (size_t k = 0; k < tp.gatherMessages.size(); ++k) {
    double dgrad = 0;
    for (OpId i : plan.parallel.tensorOverlap ? tp.gatherReaders[k] : std::vector<OpId>{}) {
      const OpAnalysis &o = a.ops[i];
      double flops = o.inputGradFlops + o.weightGradFlops;
      dgrad += flops > 0 ? o.backwardTime * o.inputGradFlops / flops : 0;
    }
    time += std::max(0.0, allReduces(plan, {tp.gatherMessages[k]}, Collective::AllGather) - dgrad);
  }
  recordMessages(a, "sequence parallel all-gather of a row output's gradient", 't', Collective::AllGather,
                 tp.forwardMessages, c, times, false);
  recordMessages(a, "sequence parallel recompute all-gather", 't', Collective::AllGather, recomputeGathers, c, times,
                 false);
  recordMessages(a, "sequence parallel all-gather of the embeddings' gradient", 't', Collective::AllGather,
                 tp.scatterMessages, c, times, false);
  return time + allReduces(plan, tp.forwardMessages, Collective::AllGather) +
         allReduces(plan, recomputeGathers, Collective::AllGather) +
         allReduces(plan, tp.scatterMessages, Collective::AllGather);
}

/// Infer plans: the forward over the prompt with its tensor-parallel all-reduces, pipeline
/// sends (p − 1 boundaries, passed in turn) and the input batch's upload.
void inferenceForward(Analysis &a, const TensorParallel &tp, double F) {
  const Plan &plan = *a.plan;
  double t = degree(plan.parallel.tensor), p = degree(plan.parallel.pipeline);
  a.time.forward = F;
  Collective rowKind = plan.parallel.sequenceParallel ? Collective::ReduceScatter : Collective::AllReduce;
  a.time.tensorParallelComm = t > 1 ? allReduces(plan, tp.forwardMessages, rowKind) + sequenceGathers(a, tp, {}, 1) : 0;
  recordMessages(a, rowKind == Collective::AllReduce ? "forward all-reduce" : "sequence parallel reduce-scatter of a row output",
                 't', rowKind, tp.forwardMessages, degree(plan.parallel.context), 1, false);
  a.time.pipelineComm = p > 1 ? (p - 1) * boundarySend(plan, stageBoundaryBytes(*a.graph, *a.copies)) : 0;
  a.time.contextParallelComm = ringAttention(a, tp);
  const std::vector<double> experts = expertMessages(a, tp);
  a.time.expertParallelComm = expertAllToAll(a, experts);
  recordMessages(a, "expert all-to-all (dispatch and combine)", 'e', Collective::AllToAll, experts, 1, 1, false);
  a.time.communication = a.time.tensorParallelComm + a.time.pipelineComm +
                         a.time.contextParallelComm + a.time.expertParallelComm;
  a.time.hostTransfer = hostBytes(a, 1) / hostLinkBandwidth(plan.target);
}

} // namespace

/// Step 7, the expert all-to-alls a train step exposes, of `all` seconds on one device over its
/// `m` micro-batches, beside `compute` seconds of its forward, backward and recompute. Under
/// Megatron-Core's combined 1F1B (expert_overlap; docs/user-guide/features/moe_a2a_overlap.md)
/// the forward of micro-batch i+1 is paired with the backward of micro-batch i, and each one's
/// dispatch and combine all-to-alls run beside the other's compute; the fill and drain are
/// not paired: the first forward and the last backward, or under interleaved pipeline stages
/// its warm-up, 2(p − 1) + (v − 1)·p + 1 chunk forwards of the m·v (the interleaved
/// schedule's warm-up on the first stage and the one forward the overlap adds). Paired, the
/// all-to-alls are hidden up to the paired compute: exposed = u·all + max(0, (1 − u)·(all −
/// compute)), u the unpaired share. (The contention of the two streams is not priced.)
double exposedExpertComm(const Plan &plan, double all, double m, double compute) {
  const Parallelism &par = plan.parallel;
  if (!par.expertOverlap || !plan.isTrain || all <= 0)
    return all;
  double p = degree(par.pipeline), v = degree(par.interleave);
  double warmup = p > 1 ? 2 * (p - 1) + (v - 1) * p + 1 : 1;
  double unpaired = std::min(1.0, warmup / std::max(1.0, m * v));
  return unpaired * all + std::max(0.0, (1 - unpaired) * (all - compute));
}

/// The peak MFU and HFU are measured against: the datasheet's, at the datasheet clock, also
/// for a part that a plan runs at a lower `clock` (so a power-capped part shows the lower MFU it
/// reaches, as published MFUs count it); the roofline keeps the clocked peak.
double utilizationPeak(const Analysis &a) {
  const Target &t = a.plan->target;
  return t.clock > 0 && t.boostClock > 0 ? a.peakFlops * t.boostClock / t.clock : a.peakFlops;
}

double modelFlopsUtilization(const Analysis &a, double stepSeconds) {
  double capacity = stepSeconds * utilizationPeak(a) * degree(a.plan->parallel.devices);
  return capacity > 0 ? (a.flops.forward + a.flops.backward) / capacity : 0;
}

namespace {

/// Step 4: compute per step on one device and the pipeline bubble. Without pipeline stages,
/// or with fewer repeat copies than p·v chunks to split, the stages are taken as balanced:
/// forward m·F/p, backward m·B/p, recompute m·R/p, bubble (p − 1)·(F + B + R)/(p·v). Else
/// each device's load per micro-batch W_s is what its chunks compute (stageTimes): the
/// pipeline runs at the pace of the slowest device, whose forward, backward and recompute
/// are the step's (m·F_s, ...), and the other devices' work fills and drains it:
/// bubble = (Σ_s W_s − max_s W_s)/v — for balanced stages, (p − 1)·W/(p·v) as above.
void pipelineStages(Analysis &a, double m, double p, double v, double F, double B, double R,
                    const std::vector<OpId> &recomputed) {
  auto &pl = a.pipeline;
  pl.stageForward.clear();
  pl.stageBackward.clear();
  double ratio = recomputed.empty() && a.flops.forward > 0 ? a.flops.recompute / a.flops.forward : 0;
  StageTimes st = p > 1 ? stageTimes(a, static_cast<int64_t>(p * v), recomputed, ratio) : StageTimes{};
  if (st.forward.empty()) {
    a.time.forward = m * F / p;
    a.time.backward = m * B / p;
    a.time.recompute = m * R / p;
    a.time.bubble = (p - 1) * (F + B + R) / (p * v);
    return;
  }
  size_t devices = static_cast<size_t>(p);
  std::vector<double> f(devices, 0), b(devices, 0), r(devices, 0);
  for (size_t k = 0; k < st.forward.size(); ++k) {
    f[k % devices] += st.forward[k];
    b[k % devices] += st.backward[k];
    r[k % devices] += st.recompute[k];
    pl.stageForward.push_back(st.forward[k]);
    pl.stageBackward.push_back(st.backward[k] + st.recompute[k]);
  }
  size_t slow = 0;
  double total = 0;
  for (size_t s = 0; s < devices; ++s) {
    total += f[s] + b[s] + r[s];
    if (f[s] + b[s] + r[s] > f[slow] + b[slow] + r[slow])
      slow = s;
  }
  a.time.forward = m * f[slow];
  a.time.backward = m * b[slow];
  a.time.recompute = m * r[slow];
  a.time.bubble = (total - (f[slow] + b[slow] + r[slow])) / v;
}

} // namespace

void stepTime(Analysis &a) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  const Parallelism &par = plan.parallel;
  const Target &target = plan.target;
  std::shared_ptr<const TensorParallel> split = tensorParallelOf(a);
  const TensorParallel &tp = *split;
  opTimes(a, split);
  a.collectives.clear();
  a.stack = stackFacts(plan, bytesOf(plan.precision.grads), bytesOf(plan.precision.params));

  // Step 3: per micro-batch totals.
  double F = 0, B = 0, R = 0, matmul = 0;
  std::vector<double> recomputeMessages, recomputeGathers;
  for (OpId i = 0; i < g.ops.size(); ++i) {
    F += a.ops[i].forwardTime;
    B += a.ops[i].backwardTime;
    if (opClass(g.ops[i].kind) == OpClass::Matmul)
      matmul += a.ops[i].forwardTime + a.ops[i].backwardTime;
  }
  if (!plan.isTrain) {
    inferenceForward(a, tp, F);
    return;
  }
  bool recomputeSteps = false;
  std::vector<OpId> recomputed;
  for (const ScheduleStep &s : a.schedule) {
    if (s.kind != ScheduleStep::Recompute || s.op >= g.ops.size())
      continue;
    recomputeSteps = true;
    recomputed.push_back(s.op);
    R += a.ops[s.op].forwardTime;
    addRecomputeMessages(g, tp, s.op, par.sequenceParallel, recomputeMessages, recomputeGathers); // step 7
  }
  if (!recomputeSteps && a.flops.recompute > 0 && a.flops.forward > 0)
    R = F * a.flops.recompute / a.flops.forward;
  a.time.microBatchCompute = F + B + R;

  // Step 4: accumulation and compute per step on one device.
  double d = degree(par.data), t = degree(par.tensor), p = degree(par.pipeline);
  double m = static_cast<double>(plan.batch) / (static_cast<double>(plan.microBatch) * d);
  a.time.accumulationSteps = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(m - 1e-9)));
  double v = degree(par.interleave);
  pipelineStages(a, m, p, v, F, B, R, recomputed);

  a.time.forward += a.fp8.weightCast; // step 2c: fp8 weights cast once per step
  // Step 2d: the CUDA step replays its forward and backward as one CUDA graph (passes/CudaGraph.h):
  // its kernels have no launch floor (asRun), and the step launches the graph once.
  if (cudaGraphCaptured(g, plan))
    a.time.forward += target.kernelLaunch;

  // Steps 5-8 and 10.
  a.time.optimizer = optimizerTime(a);
  a.time.dataParallelComm =
      dataParallelTime(a, m, (B + R) / p, (F + B + R) / p, repeatCopies(*a.copies) / p,
                       F + B > 0 ? matmul / (F + B) : 0);
  if (t > 1 && !a.pipelineStep.chunks.empty()) {
    // The generated tensor x pipeline step: each stage's collectives (PipelineStep.cpp).
    a.time.tensorParallelComm = tensorPipelineComm(a, tp, m);
  } else if (t > 1) {
    // Sequence parallelism: reduce-scatters for the all-reduces, the all-gathers beside them and,
    // once per step, the sequence-split parameters' gradients all-reduced (step 7).
    bool sp = par.sequenceParallel;
    Collective kind = sp ? Collective::ReduceScatter : Collective::AllReduce;
    double perMicroBatch = allReduces(plan, tp.forwardMessages, kind) + backwardAllReduces(a, tp) +
                           allReduces(plan, recomputeMessages, kind) + sequenceGathers(a, tp, recomputeGathers, m / p);
    std::vector<double> sequenceGrads;
    if (sp && tp.sequenceGradElements > 0)
      sequenceGrads.push_back(sequenceGradientElements(a, tp.sequenceParams) / p * bytesOf(plan.precision.grads));
    double normGrads = sequenceGrads.empty() ? 0 : collectiveTime(target, place(plan, 't'), Collective::AllReduce, sequenceGrads[0]);
    a.time.tensorParallelComm = m / p * perMicroBatch + normGrads;
    double c = degree(par.context);
    recordMessages(a, sp ? "sequence parallel reduce-scatter of a row output" : "forward all-reduce", 't', kind,
                   tp.forwardMessages, c, m / p, false);
    recordMessages(a, sp ? "sequence parallel reduce-scatter of an input gradient" : "backward all-reduce of an input gradient",
                   't', kind, tp.backwardMessages, c, m / p, par.tensorOverlap);
    recordMessages(a, sp ? "sequence parallel recompute reduce-scatter" : "recompute all-reduce", 't', kind,
                   recomputeMessages, c, m / p, false);
    recordMessages(a, "sequence parallel all-reduce of the norms' gradients", 't', Collective::AllReduce, sequenceGrads,
                   1, 1, false);
  } else {
    a.time.tensorParallelComm = 0;
  }
  a.time.pipelineComm = p > 1 ? m * 2 * v * boundarySend(plan, stageBoundaryBytes(g, *a.copies)) : 0;
  // tally's own pipeline step (Plan::generatedStep) sums the gradients of a parameter two
  // stages read (a tied head's weight) once per step, Megatron's embedding all-reduce: both
  // send their whole gradient to the other at once.
  if (p > 1 && plan.generatedStep)
    for (TensorId w : sharedStageParams(g, chunkOfOps(g, *a.copies, static_cast<int64_t>(p * v)),
                                        static_cast<int64_t>(p)))
      a.time.pipelineComm += sendTime(target, place(plan, 'p').r > 1,
                                      numel(g.tensors[w].shape) * bytesOf(plan.precision.grads));
  a.time.contextParallelComm = m / p * ringAttention(a, tp);
  const std::vector<double> experts = expertMessages(a, tp);
  a.time.expertParallelComm = exposedExpertComm(plan, m / p * expertAllToAll(a, experts), m,
                                                a.time.forward + a.time.backward + a.time.recompute);
  recordMessages(a, "expert all-to-all (dispatch and combine)", 'e', Collective::AllToAll, experts, 1, m / p,
                 par.expertOverlap);
  a.time.communication = a.time.dataParallelComm + a.time.tensorParallelComm +
                         a.time.pipelineComm + a.time.contextParallelComm +
                         a.time.expertParallelComm;
  a.time.hostTransfer = hostBytes(a, m) / hostLinkBandwidth(target);

  // Step 9.
  a.time.step = a.time.forward + a.time.backward + a.time.recompute + a.time.bubble +
                a.time.optimizer + a.time.communication + a.time.hostTransfer;
  double capacity = a.time.step * utilizationPeak(a) * degree(par.devices);
  a.time.mfu = modelFlopsUtilization(a, a.time.step);
  a.time.hfu = capacity > 0 ? (a.flops.executed - a.flops.optimizer) / capacity : 0;
  a.time.steps = plan.tokens > 0 && a.flops.tokensPerStep > 0 ? plan.tokens / a.flops.tokensPerStep : 0;
  a.time.run = a.time.steps * a.time.step;
  a.time.runDays = a.time.run / 86400;
  mfuConventions(a); // passes/MfuConventions.cpp
}

void checkAccumulation(Analysis &a, DiagnosticEngine &diags) {
  const Plan &plan = *a.plan;
  if (!plan.isTrain)
    return;
  int64_t perStep = plan.microBatch * std::max<int64_t>(1, plan.parallel.data);
  if (perStep <= 0 || plan.batch % perStep == 0)
    return;
  auto rangeOf = [&](const char *key) -> llvm::SMRange {
    auto it = plan.settingRanges.find(key);
    return it == plan.settingRanges.end() ? llvm::SMRange() : it->second;
  };
  llvm::SMRange at = rangeOf("batch");
  if (!at.isValid())
    at = rangeOf("micro_batch");
  if (!at.isValid())
    at = plan.range;
  double steps = static_cast<double>(plan.batch) / static_cast<double>(perStep);
  // The nearest multiple of perStep, in integers: llround of the double ratio overflowed near
  // 2^63 and suggested a negative batch (issue 43). Rounds down where rounding up would overflow.
  int64_t q = plan.batch / perStep, r = plan.batch % perStep;
  int64_t k = r >= perStep - r && q < INT64_MAX / perStep ? q + 1 : q;
  int64_t nearest = std::max<int64_t>(1, k) * perStep;
  std::string msg = llvm::formatv("batch {0} is not a multiple of micro_batch × data-parallel "
                                  "devices = {1} × {2} = {3}: {4:f2} gradient accumulation steps",
                                  plan.batch, plan.microBatch, plan.parallel.data, perStep, steps)
                        .str();
  auto diag = diags.report(DiagKind::AccumulationNotInteger, at.Start, msg);
  diag.range(at);
  llvm::SMRange mb = rangeOf("micro_batch");
  if (mb.isValid() && mb.Start != at.Start)
    diag.note(mb.Start, "micro_batch is set here", mb);
  else if (!plan.microBatchGiven)
    diag.note(llvm::SMLoc(), llvm::formatv("micro_batch defaults to batch / data = {0}",
                                           plan.microBatch)
                                 .str());
  int64_t fixed = nearest / perStep;
  diag.note(at.Start, llvm::formatv("batch = {0} gives {1} accumulation step{2}", nearest, fixed,
                                    fixed == 1 ? "" : "s")
                          .str());
}

void checkExperts(Analysis &a, DiagnosticEngine &diags) {
  const Graph &g = *a.graph;
  int64_t e = a.plan->parallel.expert;
  if (e <= 1)
    return;
  for (const Op &op : g.ops) {
    if (op.kind != OpKind::Moe || op.inputs.size() < 4)
      continue;
    int64_t experts = g.tensors[op.inputs[3]].shape[0].size;
    if (experts % e == 0)
      continue;
    auto it = a.plan->settingRanges.find("target");
    llvm::SMRange at = it == a.plan->settingRanges.end() ? a.plan->range : it->second;
    diags.report(DiagKind::InvalidValue, at.Start,
                 llvm::formatv("expert = {0} does not divide the {1} experts of {2}: each rank of "
                               "the expert group holds experts / expert of them",
                               e, experts, g.opPath(op))
                     .str())
        .range(at);
    return;
  }
}

} // namespace tally
