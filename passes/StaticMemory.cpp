// Memory per device that does not depend on the schedule: the model's states.
//
// 1. Element counts: all parameters N, trainable ones T (frozen ones have no gradient,
//    master copy or optimizer state).
// 2. Bytes per class: params N·b(params) (quantized frozen weights at their packed bytes and
//    block scales, ParamCount.cpp), grads T·b(grads), master T·b(master) when the policy
//    keeps a separate master copy, optimizer state T·states·b(optimizer).
// 3. Model parallelism splits every class over tensor × pipeline devices; ZeRO shards over the
//    data-parallel group: stage 1 the optimizer state and master weights, stage 2 also the
//    gradients, stage 3 also the parameters. The device counted is the first pipeline stage,
//    whose activations Activations.cpp counts (it holds the most micro-batches in flight): it
//    holds 1/p of the repeat-block copies' parameters and all those read before the copies (the
//    embedding; a tied head's weight is the embedding's), not 1/p of the whole model (ParamCount.cpp).
//    Without repeat blocks, there is nothing to cut between: 1/p of everything.
// 4. A class placed on the host counts toward host memory instead of the device.
// 5. Framework memory (docs/memory.md §9): with `grad_dtype` wider than the gradients, an
//    accumulation buffer of T·b(grad_dtype) (sharded like the gradients) replaces them (the
//    backward adds each weight gradient into it and frees it: Megatron's main_grad), or, under
//    the deepspeed stack, stands beside them (its BF16_Optimizer keeps both); the
//    target's CUDA context; one communication buffer per communicator of more than one rank
//    (tensor, context, pipeline, data, expert). allocatorReserve (after the activations and the KV
//    cache) adds the target's fraction of everything the caching allocator hands out. tally's
//    own CUDA step (Plan::cudaStep) instead has its 64 MiB workspace (cuBLASLt and kernel
//    scratch) and no caching allocator, so no reserve.
// 6. FP8 training (passes/Fp8.cpp, fp8Memory): the fp8 copies of the weights the fp8 GEMMs
//    read and delayed scaling's amax histories and scales.
// 8. ZeRO's transients (zeroTransients, passes/Stack.cpp; docs/memory.md "ZeRO's transients"):
//    under ZeRO 3 the full parameters of the units gathered at once, under ZeRO 2 and 3 the
//    gradients held unsharded before their reduce-scatter, as tally's own step holds them
//    (Plan::generatedStep; not yet for the framework stacks): units of the root (the
//    parameters outside the repeat-block copies; on a pipeline's first stage those read
//    before the copies) and the largest copy, over the tensor-parallel devices.
// 7. Expert parallelism (expert = e): the MoE experts' weights X (a.params.expert) are split
//    over the e ranks of the expert group besides tensor × pipeline, and ZeRO shards them over
//    the data/e replicas that hold the same experts: each class counts (N − X)/(t·p)/shard(d)
//    + X/(t·p·e)/shard(d/e). Under MoE parallel folding (expert_tensor = 1, ir/Plan.h
//    expertLayout) the experts run whole: X/(p·e)/shard(t·d/e), the expert group drawn from
//    the tensor × data ranks (d counting the context ranks).
// 9. tally's step with a padded LM head (passes/HeadPadding.h): the (V' − V)·d padded rows of
//    the head's weight count in params, and when it trains in grads, master and optimizer (the
//    regions hold them), not in the parameter count.
#include "passes/Passes.h"
#include "passes/CudnnAttention.h"
#include "passes/Stack.h"

#include <algorithm>

namespace tally {

void staticMemory(Analysis &a) {
  const Plan &plan = *a.plan;
  const PrecisionPolicy &p = plan.precision;
  const Parallelism &par = plan.parallel;
  double modelSplit = static_cast<double>(par.tensor * par.pipeline);
  double dp = zeroShardRanks(par.data, par.context); // ZeRO shards over data x context
  // The experts' weights: split over pipeline × the MoE layers' tensor degree × the expert
  // group, sharded over the ranks that hold the same experts (expertLayout).
  const ExpertLayout experts = expertLayout(par);
  double tensor = static_cast<double>(par.tensor), stages = static_cast<double>(par.pipeline);
  bool staged = stages > 1 && a.copies && !a.copies->copies.empty();
  double n = staged ? (a.params.beforeCopies + a.params.inCopies / stages) / tensor
                    : a.params.total / modelSplit;
  double t = !plan.isTrain ? 0
             : staged      ? (a.params.beforeCopiesTrainable + a.params.inCopiesTrainable / stages) / tensor
                           : a.params.trainable / modelSplit;
  double nx = a.params.expert / modelSplit;
  double tx = plan.isTrain ? a.params.expertTrainable / modelSplit : 0;
  // The generated step's padded head (passes/HeadPadding.h; no model split then, and ZeRO-1 at
  // most): its padded rows are held in every class of the regions, though the parameters count
  // none.
  const double pad = static_cast<double>(a.headPad.extraElements());
  n += pad;
  if (pad > 0 && plan.isTrain && a.graph->params[a.graph->tensors[a.headPad.weight].param].trainable)
    t += pad;
  auto shard = [&](int stage) { return par.zero >= stage ? dp : 1.0; };
  // Element counts per device of all parameters (`all`) and of the experts among them (`x`).
  // x counts the experts at the tensor split (x / t·p of them); a device holds x·t/(etp·ep).
  const double expertShare = static_cast<double>(par.tensor > 1 ? par.tensor : 1) / (experts.etp * experts.ep);
  auto owned = [&](double all, double x, int stage) {
    return (all - x) / shard(stage) + x * expertShare / (par.zero >= stage ? experts.edp : 1.0);
  };

  double params = owned(n, nx, 3) * bytesOf(p.params);
  // Quantized frozen weights (QLoRA's base): the mean bytes of a parameter over the model,
  // each quantized one at its packed bytes and scales, the rest at b(params).
  if (a.params.quantized > 0 && a.params.total > 0)
    params = owned(n, nx, 3) *
             ((a.params.total - a.params.quantized) * bytesOf(p.params) + a.params.quantizedBytes) /
             a.params.total;
  // Gradients sharded under ZeRO 2 and 3, unless they are reduced once per step
  // (reduce_every_micro_batch = false, FSDP's no_sync): then each rank accumulates them whole.
  const int gradStage = reducesEveryMicroBatch(par) ? 2 : 4;
  double grads = owned(t, tx, gradStage) * bytesOf(p.grads);
  bool accumulate = p.gradAccum != Dtype::Invalid && bytesOf(p.gradAccum) > bytesOf(p.grads);
  double gradAccum = accumulate ? owned(t, tx, gradStage) * bytesOf(p.gradAccum) : 0;
  // Megatron adds each weight gradient into its fp32 main_grad and keeps no other; DeepSpeed's
  // BF16_Optimizer lets autograd write the bf16 gradients and copies them into its fp32 buffer,
  // so both stay (deepspeed/runtime/bf16_optimizer.py).
  if (accumulate && stackName(plan) != "deepspeed")
    grads = 0;
  double master = p.master == Dtype::Invalid ? 0 : owned(t, tx, 1) * bytesOf(p.master);
  double optimizer = owned(t, tx, 1) * plan.optimizer.states * bytesOf(p.optimizer);

  auto place = [&](double bytes, bool onHost, double &device) {
    if (onHost)
      a.memory.hostTotal += bytes;
    else
      device = bytes;
  };
  place(params, p.paramsOnHost, a.memory.params);
  place(grads, p.gradsOnHost, a.memory.grads);
  place(master, p.masterOnHost, a.memory.master);
  place(optimizer, p.optimizerOnHost, a.memory.optimizer);
  place(gradAccum, p.gradsOnHost, a.memory.gradAccum);
  double states = params + grads + master + optimizer + gradAccum;
  a.memory.bytesPerParam = n - pad > 0 ? states / (n - pad) : 0;

  const Target &tg = plan.target;
  a.memory.context = tg.contextBytes;
  int communicators = (par.tensor > 1) + (par.context > 1) + (par.pipeline > 1) + (par.data > 1) +
                      (par.expert > 1);
  a.memory.commBuffers = communicators * tg.commBufferBytes;
  a.memory.libraryWorkspace = plan.cudaStep ? static_cast<double>(kCudaStepWorkspaceBytes) : 0;
  fp8Memory(a); // the weights' fp8 copies and the amax histories (passes/Fp8.cpp)
  a.memory.cudnnWorkspace = plan.cudaStep && plan.isTrain ? cudnnAttentionWorkspace(*a.graph) : 0;
  // Step 8.
  ZeroUnits u;
  u.all = n;
  u.trainable = t;
  u.root = std::max(0.0, staged ? a.params.beforeCopies / tensor : (a.params.total - a.params.inCopies) / tensor);
  u.rootTrainable = !plan.isTrain ? 0
                    : std::max(0.0, staged ? a.params.beforeCopiesTrainable / tensor
                                           : (a.params.trainable - a.params.inCopiesTrainable) / tensor);
  // Expert parallelism: a rank gathers only its experts' share of a block's weights (the
  // model's expert fraction of the block, split over the e ranks of the expert group).
  double held = n > 0 && expertShare != 1 ? (n - nx + nx * expertShare) / n : 1;
  u.block = a.params.largestCopy / tensor * held;
  u.blockTrainable = plan.isTrain ? a.params.largestCopyTrainable / tensor * held : 0;
  u.gradientSpan = plan.isTrain ? a.params.gradientSpanPeak / tensor : 0;
  ZeroTransients z = zeroTransients(plan, u);
  a.memory.zeroGathered = p.paramsOnHost ? 0 : z.gathered;
  a.memory.unshardedGrads = p.gradsOnHost ? 0 : z.grads;
  a.memory.peak = a.memory.params + a.memory.grads + a.memory.master + a.memory.optimizer +
                  a.memory.gradAccum + a.memory.fp8Weights + a.memory.fp8Meta + a.memory.zeroGathered +
                  a.memory.unshardedGrads + unallocatedBytes(a);
}

void allocatorReserve(Analysis &a) {
  double allocated = a.memory.peak - unallocatedBytes(a);
  a.memory.allocatorReserve = reserveFraction(*a.plan) * std::max(0.0, allocated);
  a.memory.peak += a.memory.allocatorReserve;
}

double modelStatesFloor(const Analysis &counted, const Plan &plan) {
  Analysis states;
  states.plan = &plan;
  states.params.total = counted.params.total;
  states.params.trainable = counted.params.trainable;
  states.params.expert = counted.params.expert;
  states.params.expertTrainable = counted.params.expertTrainable;
  states.params.beforeCopies = counted.params.beforeCopies;
  states.params.beforeCopiesTrainable = counted.params.beforeCopiesTrainable;
  states.params.inCopies = counted.params.inCopies;
  states.params.inCopiesTrainable = counted.params.inCopiesTrainable;
  states.params.largestCopy = counted.params.largestCopy;
  states.params.largestCopyTrainable = counted.params.largestCopyTrainable;
  states.params.gradientSpanPeak = counted.params.gradientSpanPeak;
  states.params.quantized = counted.params.quantized;
  states.params.quantizedBytes = counted.params.quantizedBytes;
  states.copies = counted.copies; // the first stage's states, as staticMemory counts them
  states.graph = counted.graph;   // the fp8 GEMMs' weight copies (fp8Memory)
  states.fp8 = counted.fp8;
  staticMemory(states);
  return reservedPeak(states, states.memory.peak - unallocatedBytes(states));
}

} // namespace tally
