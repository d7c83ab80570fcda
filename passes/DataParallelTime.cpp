// Step 6 of the step time (passes/StepTime.cpp, docs/time.md): the data-parallel gradient and
// parameter traffic of one device per step, in the messages its stack sends them in, and what of
// it the backward does not hide. Its own file: the rules for ZeRO 0-3, FSDP's flat parameters,
// expert and context groups and the generated step's regions are a third of the step time.
#include "passes/Collectives.h"
#include "passes/Passes.h"
#include "passes/Stack.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

namespace tally {

namespace {

/// Step 6: `bytes` of one collective kind over group `g`, in messages of `bucket` bytes (0: one
/// per layer, `layers` of them: FSDP's flat parameter per wrapped block), `times` per step: the
/// sum of the messages' collectives and the time of the last message alone. Each message's
/// cost is recorded in Analysis::collectives under `what`.
std::pair<double, double> bucketed(Analysis &a, const char *what, char group, const Placement &g,
                                   Collective c, double bytes, double bucket, double layers,
                                   double times, bool overlapped) {
  if (bytes <= 0 || g.n <= 1)
    return {0, 0};
  double messages = bucket > 0 ? std::ceil(bytes / bucket) : std::max(1.0, layers);
  CollectiveCost one = collectiveCost(a.plan->target, g, c, bytes / messages);
  a.collectives.push_back({what, group, one, messages * times, overlapped});
  return {messages * one.time, one.time};
}

/// The generated CPU step's own kernels around its data-parallel collectives (codegen/
/// EmitUpdate.cpp, codegen/program/tally_comm.h), on the rank's cores at its memory bandwidth,
/// not hidden: the gradients divided by d before they are summed (rt::scale over G, read and
/// written, per bucket); the sums of a counted ring's reduce-scatter (ZeRO-1, and the
/// all-reduce of data x tensor: each of the d - 1 received pieces added into the rank's, two
/// read and one written, (d - 1)/d of G in all; MPI_Allreduce, which data parallelism alone
/// runs without ZeRO, sums inside the link rate the calibration measured it at); and ZeRO-1's
/// copies (the rank's updated shard of the parameters into G, then every trainable parameter
/// out of G into P after the gather). G: the device's gradient bytes (the step gathers the
/// parameters through G, in its dtype). Measured for GPT d = 256 on 2 ranks under ZeRO-1: the
/// scale 0.9 ms, the sums ~2.8 ms, the copies 3.9 ms a step (docs/performance.md). ZeRO 2 and
/// 3's per-tensor pieces (EmitZero.cpp) are not priced here.
double generatedStepLocalTime(const Analysis &a, double G, double d) {
  const Plan &plan = *a.plan;
  const int64_t zero = plan.parallel.zero;
  if (!plan.generatedStep || plan.cudaStep || G <= 0 || zero >= 2)
    return 0;
  const Dtype dt = plan.precision.grads;
  KernelWork scale;
  scale.bytes = 2 * G;
  scale.calls = a.stack.gradientBucket > 0 ? std::ceil(G / a.stack.gradientBucket) : 1;
  scale.forks = G / bytesOf(dt) / scale.calls > kForkElements ? scale.calls : 0;
  double t = kernelTime(plan.target, OpClass::Elementwise, dt, scale);
  const bool ring = zero == 1 || (plan.tensorStep && plan.parallel.tensor > 1);
  if (ring) {
    KernelWork sums;
    sums.bytes = 3 * G * (d - 1) / d;
    sums.calls = 0; // inside the collective's call
    t += kernelTime(plan.target, OpClass::Elementwise, dt, sums);
  }
  if (zero == 1) {
    double tensors = trainableTensors(*a.graph);
    KernelWork copies;
    copies.bytes = 2 * G / d + 2 * G; // the shard into G; every parameter out of G
    copies.calls = tensors / d + tensors;
    // rt::copy of a dense tensor starts a team from 1 MiB (below it one thread's memmove).
    if (plan.target.forkOverhead > 0)
      copies.forks = (1 + 1 / d) * trainableTensors(*a.graph, double(1 << 20) / bytesOf(dt));
    t += kernelTime(plan.target, OpClass::Elementwise, dt, copies);
  }
  return t;
}

/// ZeRO 3's gathers of a block per micro-batch, and what they are called: before its forward
/// and again before its backward, or with reshard_after_forward = false (FSDP's
/// reshard_after_forward=False) before its forward only, the parameters kept until the
/// backward (the memory that holds: zeroTransients, passes/Stack.cpp).
std::pair<double, const char *> zeroThreeGathers(const Parallelism &par) {
  if (par.reshardAfterForward)
    return {2, "parameter all-gather (forward and backward, every micro-batch)"};
  return {1, "parameter all-gather (forward only, every micro-batch: reshard_after_forward = false)"};
}

/// The gradient reduction's name: an all-reduce (ZeRO 0) or a reduce-scatter, every
/// micro-batch or once per step (reducesEveryMicroBatch); a setting that departs from the ZeRO
/// stage's rule is named.
const char *gradientReduction(const Parallelism &par) {
  const bool every = reducesEveryMicroBatch(par);
  if (par.zero == 0)
    return every ? "gradient all-reduce (every micro-batch: reduce_every_micro_batch = true)"
                 : "gradient all-reduce";
  if (par.zero == 1 && every)
    return "gradient reduce-scatter (every micro-batch: reduce_every_micro_batch = true)";
  if (par.zero >= 2 && !every)
    return "gradient reduce-scatter (once per step: reduce_every_micro_batch = false)";
  return every ? "gradient reduce-scatter (every micro-batch)" : "gradient reduce-scatter";
}

/// The generated CPU step's data x pipeline under ZeRO 2 and 3 (PipelineStep.cpp, step 4): in
/// each chunk's backward of a micro-batch every gradient the chunk completes is reduce-scattered
/// over its data group into the rank's pieces (a tied parameter's by each of its two chunks),
/// under ZeRO 3 each unit's parameters gathered before each chunk's forward and backward that
/// read them, under ZeRO 2 the stage's updated pieces gathered once after the update: counted
/// rings moving d pieces of ⌈n/d⌉ of each tensor, each blocking its rank (exposed). Each is
/// recorded under its stage; the stages' groups run at once, so the step waits for the largest.
double pipelinePieceTime(Analysis &a, double bg, double bp) {
  const auto &ps = a.pipelineStep;
  const Plan &plan = *a.plan;
  const Graph &s = *a.step;
  const int64_t p = ps.stages;
  const double d = static_cast<double>(plan.parallel.data), m = static_cast<double>(ps.microBatches);
  auto ring = [&](TensorId t, double bytes) { return d * std::ceil(numel(s.tensors[t].shape) / d) * bytes; };
  auto rankOf = [&](uint32_t entry) { return ps.chunkOfOp[a.stepSchedule[entry].op] % static_cast<uint32_t>(p); };
  std::vector<std::vector<double>> reduces(static_cast<size_t>(p)), gathers(static_cast<size_t>(p)),
      after(static_cast<size_t>(p));
  for (const Analysis::ZeroMoves::Reduce &r : ps.zero.reduces)
    reduces[rankOf(r.first)].push_back(ring(r.param, bg));
  for (const Analysis::ZeroMoves::Gather &g : ps.zero.gathers)
    for (TensorId t : g.params)
      gathers[rankOf(g.entry)].push_back(ring(t, bp));
  if (plan.parallel.zero == 2)
    for (const ParamInfo &pi : s.params)
      for (int64_t r = 0; r < p; ++r)
        if (pi.trainable && ps.ranks[static_cast<size_t>(r)].holds[s.tensors[pi.tensor].param])
          after[static_cast<size_t>(r)].push_back(ring(pi.tensor, bp));
  const Placement group = place(plan, 'd');
  double slowest = 0;
  for (int64_t r = 0; r < p; ++r) {
    const size_t k = static_cast<size_t>(r);
    recordMessages(a, "gradient reduce-scatter of a pipeline chunk (every micro-batch)", 'd', Collective::ReduceScatter,
                   reduces[k], 1, m, false, r);
    recordMessages(a, "parameter all-gather of a pipeline chunk's unit (forward and backward, every micro-batch)", 'd',
                   Collective::AllGather, gathers[k], 1, m, false, r);
    recordMessages(a, "parameter all-gather of a pipeline stage's pieces after the update", 'd', Collective::AllGather,
                   after[k], 1, 1, false, r);
    double t = 0;
    for (const auto &[list, c, times] : {std::tuple{&reduces[k], Collective::ReduceScatter, m},
                                         std::tuple{&gathers[k], Collective::AllGather, m},
                                         std::tuple{&after[k], Collective::AllGather, 1.0}})
      for (double bytes : *list)
        t += times * collectiveTime(plan.target, group, c, bytes);
    slowest = std::max(slowest, t);
  }
  a.time.overlapInterference = 0; // nothing runs beside it
  return slowest;
}

} // namespace

/// Step 6: data-parallel gradient and parameter traffic per step on one device, its exposed
/// time after overlap. `window` is the compute the gradient reduction may hide behind: the
/// backward of each micro-batch after which it runs (the last one's at ZeRO 0/1, every one's at
/// ZeRO 2: reducesEveryMicroBatch), every forward and backward (ZeRO 3); `layers` the
/// repeat-block copies of a stage, FSDP's units.
/// The stack (Analysis::stack) sets the message sizes and whether the reduction overlaps.
double dataParallelTime(Analysis &a, double m, double backwardOne, double computeOne,
                        double layers, double matmulShare) {
  const Plan &plan = *a.plan;
  const Parallelism &par = plan.parallel;
  double d = degree(par.data), c = degree(par.context);
  if ((d <= 1 && c <= 1) || !plan.isTrain)
    return 0;
  double model = degree(par.tensor) * degree(par.pipeline);
  double bg = bytesOf(plan.precision.grads), bp = bytesOf(plan.precision.params);
  const StackFacts &stack = a.stack;
  bool overlap = stack.overlap;
  // A gather of parameters goes in messages of as many elements as a gradient bucket.
  double gradBucket = stack.gradientBucket;
  double paramBucket = gradBucket > 0 ? gradBucket / bg * bp : 0;
  // Expert parallelism: the experts' weights (X trainable, XA in all, per model-parallel rank)
  // are split over the e ranks of the expert group and reduced over the data/e ranks that hold
  // the same experts ('x'); the other parameters over the whole data group ('d'). Under MoE
  // parallel folding a device holds X·t/(etp·e) of them, reduced over the t·d/e ranks holding
  // the same (expertLayout).
  const ExpertLayout experts = expertLayout(par);
  bool expertGroup = experts.ep > 1 || experts.folded;
  double T = a.params.trainable / model, N = a.params.total / model;
  double X = expertGroup ? a.params.expertTrainable / model : 0, XA = expertGroup ? a.params.expert / model : 0;
  double held = degree(par.tensor) / (experts.etp * experts.ep); // of X: the device's experts
  struct Group {
    char name;
    double G, PT, P; ///< gradient, trainable-parameter and parameter bytes of the device
  };
  Group groups[2] = {{'d', (T - X) * bg, (T - X) * bp, (N - XA) * bp},
                     {'x', X * held * bg, X * held * bp, XA * held * bp}};
  // fp8 param_gather (Megatron's --fp8-param-gather: "perform the param all-gather in fp8"):
  // the fp8 GEMMs' weights are gathered at the fp8 element's bytes, not at b(params).
  if (a.fp8.active && plan.precision.fp8.paramGather) {
    double fewer = a.fp8.weightElements / model * std::max(0.0, bp - a.fp8.storage.bytes);
    groups[0].PT = std::max(0.0, groups[0].PT - fewer);
    groups[0].P = std::max(0.0, groups[0].P - fewer);
  }
  // The generated CPU step's tensor parallelism (Plan::tensorStep) holds the embeddings, norms
  // and head whole on every tensor rank and cuts the rest (TensorShard.cpp), so T / t is not
  // its gradient: it all-reduces its grads region over the data group, padding and all, in
  // buckets of that region (codegen/EmitUpdate.cpp); price that. Under ZeRO-1 it reduce-scatters
  // that region and gathers the updated parameters back through it (G's dtype), so the gather
  // moves the region's bytes too.
  // Under ZeRO 2 and 3 the regions hold the rank's piece of each tensor of its cut (⌈n/d⌉ of
  // the cut's n elements, MemoryPlan.cpp) and a ring over the data group moves d such pieces of
  // each tensor: price d times the pieces the memory plan laid out, unpadded (Region::Entry's
  // bytes), for the gradients' reduce-scatters, the gather after the update and ZeRO 3's gathers.
  if (plan.tensorStep && par.tensor > 1 && a.tensorStepError.empty() && a.regions.grads.bytes > 0) {
    auto pieces = [&](const Region &r) {
      double elements = 0;
      for (const Region::Entry &x : r.tensors)
        elements += static_cast<double>(x.bytes) / bytesOf(r.dtype);
      return d * elements;
    };
    if (a.regions.tensorShards >= 2) {
      groups[0].G = pieces(a.regions.grads) * bg;
      groups[0].PT = pieces(a.regions.grads) * bp;
      if (a.regions.tensorShards >= 3)
        groups[0].P = pieces(a.regions.params) * bp;
    } else {
      groups[0].G = static_cast<double>(a.regions.grads.bytes);
      if (par.zero == 1)
        groups[0].PT = groups[0].G;
    }
  }
  std::pair<double, double> grads{0, 0}; // (all messages, last message)
  // The generated CPU step's data x pipeline (PipelineStep.cpp): each stage's data group
  // averages that stage's grads region (its parameters, padding and all, a tied weight on both
  // stages that read it) after the pipeline's last backward, in buckets of that region, as
  // counted rings, exposed (codegen/EmitUpdate.cpp). Each stage's all-reduce is recorded under
  // its stage; the stages' groups run at once, so the step waits for the largest. Under ZeRO-1
  // each stage's region is reduce-scattered instead and its updated parameters gathered back
  // through it (G's dtype), the region's bytes each way.
  if (const auto &ps = a.pipelineStep; !ps.chunks.empty() && d > 1 && par.zero >= 2)
    return pipelinePieceTime(a, bg, bp);
  if (const auto &ps = a.pipelineStep; !ps.chunks.empty() && d > 1 && par.zero <= 1) {
    double slowest = 0;
    for (size_t r = 0; r < ps.ranks.size(); ++r) {
      size_t before = a.collectives.size();
      double region = static_cast<double>(ps.ranks[r].grads.bytes);
      double t = par.zero == 0 ? bucketed(a, "gradient all-reduce of a pipeline stage's region", 'd', place(plan, 'd'),
                                          Collective::AllReduce, region, gradBucket, 1, 1, false)
                                     .first
                               : bucketed(a, "gradient reduce-scatter of a pipeline stage's region", 'd',
                                          place(plan, 'd'), Collective::ReduceScatter, region, gradBucket, 1, 1, false)
                                         .first +
                                     bucketed(a, "parameter all-gather of a pipeline stage's region", 'd',
                                              place(plan, 'd'), Collective::AllGather, region, gradBucket, 1, 1, false)
                                         .first;
      for (size_t k = before; k < a.collectives.size(); ++k)
        a.collectives[k].stage = static_cast<int64_t>(r);
      slowest = std::max(slowest, t);
    }
    a.time.overlapInterference = 0; // nothing runs beside it
    return slowest;
  }
  double gather = 0, G = 0;
  // Reductions per step: every micro-batch's or the last's (reducesEveryMicroBatch); they hide
  // behind the backwards they follow, ZeRO 3's behind every forward and backward (its gathers).
  const double r = reducesEveryMicroBatch(par) ? m : 1;
  const char *reduction = gradientReduction(par);
  double window = par.zero >= 3 ? m * computeOne : r * backwardOne;
  double n = std::max(1.0, layers);
  for (const Group &gr : groups) {
    Placement g = place(plan, gr.name);
    G += gr.G;
    std::pair<double, double> one;
    auto afterUpdate = [&]() { // ZeRO 1 and 2: the updated parameters, gathered once, exposed
      return bucketed(a, "parameter all-gather after the update", gr.name, g,
                      Collective::AllGather, gr.PT, paramBucket, n, 1, false)
          .first;
    };
    one = bucketed(a, reduction, gr.name, g, par.zero == 0 ? Collective::AllReduce : Collective::ReduceScatter,
                   gr.G, gradBucket, n, r, overlap);
    one.first *= r;
    if (par.zero == 1 || par.zero == 2)
      gather += afterUpdate();
    if (par.zero >= 3) {
      // Each layer's parameters gathered every micro-batch (zeroThreeGathers), each prefetched
      // under the previous layer's compute.
      double perLayerBucket = stack.gatherBucket > 0 ? std::min(stack.gatherBucket, gr.P / n) : 0;
      // Not prefetched (prefetch = false), each gather waits: exposed.
      auto [perMicro, what] = zeroThreeGathers(par);
      auto gathers = bucketed(a, what, gr.name, g, Collective::AllGather, gr.P / n, perLayerBucket, 1,
                              perMicro * m * n, overlap && par.prefetch);
      if (par.prefetch)
        one = {one.first + perMicro * m * n * gathers.first, std::max(one.second, gathers.second)};
      else
        gather += perMicro * m * n * gathers.first;
    }
    grads = {grads.first + one.first, std::max(grads.second, one.second)};
  }
  // Context ranks hold the same parameters: their gradients are all-reduced over the context
  // group too (before the data-parallel step, in the same buckets and window).
  if (c > 1) {
    auto ctx = bucketed(a, "gradient all-reduce over the context group", 'c', place(plan, 'c'),
                        Collective::AllReduce, G, gradBucket, n, r, overlap);
    grads = {grads.first + r * ctx.first, std::max(grads.second, ctx.second)};
  }
  double exposed = overlap ? std::max(grads.second, grads.first - window) : grads.first;
  exposed += generatedStepLocalTime(a, G, d); // tally's CPU step's own kernels (not a pipeline's)
  // What is hidden still runs on NCCL's blocks: the compute beside it has fewer
  // multiprocessors for that long, and persistent matmuls a second wave (overlapInterference).
  double hidden = std::max(0.0, grads.first - exposed);
  a.time.overlapInterference = hidden * overlapInterference(plan.target, matmulShare);
  return exposed + a.time.overlapInterference + gather;
}

} // namespace tally
