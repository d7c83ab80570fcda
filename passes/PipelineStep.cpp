// PipelineStep.cpp — how tally's generated CPU step runs pipeline parallelism (Plan::generatedStep,
// pipeline = p > 1; Analysis::pipelineStep; the step: codegen/EmitPipeline.cpp; docs/codegen.md).
//
// 1. Stages: the forward ops go to the p·v chunks as the estimate puts them (chunkOfOps, the rule
//    of stageTimes: whole repeat copies in balanced counts, the embedding with the first, the
//    head and loss with the last), chunk k on rank k mod p; each backward op to its forward op's
//    chunk, the loss gradient's fill to the last; a Recompute entry (a checkpointed segment's
//    forward, re-run) to its op's chunk, run in the backward unit before the segment's backward
//    ops as the schedule orders them. The order each rank runs its forwards and backwards is
//    pipelineOrder's, the order PipelineTimeline simulates. Fused kernels (Fusion.cpp, after this
//    pass) are formed inside one chunk, against its slot's offsets.
// 2. What crosses: an activation made on chunk k and read on chunk k + 1 is sent forward after
//    chunk k's forward of a micro-batch, its gradient back after chunk k + 1's backward. Each
//    boundary must carry exactly what the estimate prices (stageBoundaryBytes, both ways); a
//    tensor read two chunks on, or a gradient another chunk makes, is refused.
// 3. Memory: the buffers one chunk's entries use, placed again on their own (placeArena), are
//    one slot; a chunk has as many slots as micro-batches it holds at once (forwards run and
//    backwards not yet, in pipelineOrder), micro-batch j in slot j mod slots (in flight they are
//    consecutive). A rank's arena is its chunks' slots one after another; its regions the
//    parameters its chunks read, unsharded. A parameter two ranks read (a tied head's weight)
//    is held by both, its gradient summed between them once per step (Megatron's embedding
//    all-reduce), which the estimate prices for the generated step (StepTime.cpp).
// 4. Data x pipeline (data = d > 1, without ZeRO or with ZeRO-1): every data rank runs the same
//    stages on its batch / d rows (m micro-batches of its own); each stage's data group averages
//    that stage's grads region after the last backward (under ZeRO-1 reduce-scatters it, each
//    rank updating its ⌈E/d⌉ elements, Rank::shard, with their optimizer states and fp32 master
//    copies, and gathers the parameters back), priced per stage (StepTime.cpp,
//    CollectiveUse::stage).
// 5. Tensor x pipeline (tensor = t > 1, Plan::tensorStep; 1F1B): the step graph is one tensor
//    rank's shard (TensorShard.cpp), so the stages, slots and regions above are one tensor rank's
//    of each stage. A boundary moves as the estimate prices it (boundarySend) and Megatron's
//    scatter/gather does: each tensor rank sends its 1/t piece, the receiver all-gathers the
//    pieces over its tensor group; tensorPipelineComm records each stage's tensor-group
//    collectives under that stage. With data = d > 1 too (data x tensor x pipeline) the two
//    compose: every data rank runs those stages on its m micro-batches, and each (stage, tensor
//    rank)'s data group reduces that stage's cut region as step 4 says (under ZeRO-1 its shard).
// 6. ZeRO 2 and 3 with data x pipeline (and data x tensor x pipeline): each stage's regions hold
//    its data rank's piece of each tensor (layStageRegions with d pieces: grads, master and
//    optimizer, at ZeRO 3 params too); a micro-batch's parameter gradients (and ZeRO 3's gathered
//    parameters) are arena buffers (ZeroShards.cpp) in the slots of each chunk that uses them; and
//    the moves are ZeroShards.cpp's split by chunk (zeroMovesOf over chunkOfOp, kept in
//    PipelineStep::zero): a tied parameter's gradient is reduce-scattered by each chunk that
//    writes it, the root unit gathered by each chunk for the parameters of it that the chunk
//    reads. No region-wide reduction follows the pipeline; the estimate prices the moves per
//    stage (DataParallelTime.cpp, pipelinePieceTime).
#include "passes/Fusion.h"
#include "passes/Passes.h"
#include "passes/TensorParallel.h"

#include "ir/Units.h"

#include <algorithm>
#include <cmath>
#include <set>

namespace tally {

namespace {

/// Step 2: each chunk's inputs from the chunk before it, and the checks on what crosses.
bool crossings(Analysis &a, const BufferIndex &bi, std::vector<std::set<uint32_t>> &used) {
  const Graph &g = *a.graph, &s = *a.step;
  auto &ps = a.pipelineStep;
  const std::vector<uint32_t> &chunk = ps.chunkOfOp;
  auto fail = [&](const std::string &why, OpId at) {
    ps.error = why;
    ps.errorOp = at;
    return false;
  };
  auto stage = [&](uint32_t k) { return "stage " + std::to_string(k); };
  // ZeRO 2 and 3 over the data group (0 without data parallelism: nothing is pieced).
  const int64_t zero = a.plan->parallel.data > 1 ? a.plan->parallel.zero : 0;
  // Which chunks write each gradient storage (bit per chunk; at most 64 chunks).
  std::vector<uint64_t> writers(s.tensors.size(), 0);
  for (const StepEntry &se : a.stepSchedule)
    if (se.kind == StepEntry::Backward)
      for (TensorId o : s.ops[se.op].outputs)
        writers[s.storageOf(o)] |= uint64_t(1) << chunk[se.op];
  std::vector<std::set<TensorId>> inputs(ps.chunks.size());
  for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
    const StepEntry &se = a.stepSchedule[e];
    if (se.kind == StepEntry::Optimizer)
      continue;
    const Op &op = s.ops[se.op];
    uint32_t k = chunk[se.op];
    uint32_t step = bi.stepOf(e);
    // A parameter lives in its region, its gradient in the grads region: no buffer, except
    // under ZeRO 2 and 3 (step 4), where a micro-batch's gradient and ZeRO 3's gathered
    // parameters are arena buffers (ZeroShards.cpp) in the slots of each chunk that uses them.
    auto note = [&](TensorId t) {
      TensorId b = s.storageOf(t), key = b;
      const Tensor &x = s.tensors[b];
      if (x.role == TensorRole::Input || (x.role == TensorRole::Param && zero < 3))
        return true;
      if (x.role == TensorRole::Gradient && x.gradOf != kNone && s.tensors[x.gradOf].role == TensorRole::Param) {
        if (zero < 2)
          return true;
        key = s.gradient[x.gradOf];
      }
      if (const Buffer *live = bi.liveAt(key, step))
        used[k].insert(static_cast<uint32_t>(live - a.buffers.data()));
      return true;
    };
    for (TensorId t : op.outputs)
      note(t);
    for (TensorId t : op.inputs) {
      note(t);
      TensorId b = s.storageOf(t);
      const Tensor &x = s.tensors[b];
      if (x.role == TensorRole::Activation && x.producer != kNone && x.producer < g.ops.size()) {
        uint32_t from = chunk[x.producer];
        if (from == k)
          continue;
        if (se.kind != StepEntry::Forward && !inputs[k].count(b))
          return fail("tensor " + s.tensorName(b) + " of " + stage(from) + " is read by the backward on " + stage(k) +
                          " but not by its forward: the generated pipeline step sends activations forward only",
                      se.op);
        if (from + 1 != k)
          return fail("tensor " + s.tensorName(b) + " is made on " + stage(from) + " and read on " + stage(k) +
                          ": the generated pipeline step sends activations to the next stage only",
                      se.op);
        inputs[k].insert(b);
      } else if (x.role == TensorRole::Gradient && (writers[b] & ~(uint64_t(1) << k)) != 0) {
        uint64_t other = writers[b] & ~(uint64_t(1) << k), next = k + 1 < 64 ? uint64_t(1) << (k + 1) : 0;
        bool fromNext = other == next && x.gradOf != kNone &&
                        s.tensors[x.gradOf].producer != kNone && s.tensors[x.gradOf].producer < g.ops.size() &&
                        chunk[s.tensors[x.gradOf].producer] == k;
        if (!fromNext)
          return fail("gradient " + s.tensorName(b) + " is read on " + stage(k) + " and written on another stage: "
                      "the generated pipeline step sends each boundary's gradient one stage back only",
                      se.op);
      }
    }
  }
  for (size_t k = 0; k < ps.chunks.size(); ++k) {
    ps.chunks[k].inputs.assign(inputs[k].begin(), inputs[k].end());
    if (k > 0)
      ps.chunks[k - 1].outputs = ps.chunks[k].inputs;
    double fwd = 0, bwd = 0;
    const int64_t t = a.plan->parallel.tensor;
    // Sequence parallel: the boundary is already each tensor rank's 1/t of the tokens (the step
    // graph's shard), sent as it is; otherwise each rank sends 1/t of the whole tensor.
    const bool sequence = t > 1 && a.plan->parallel.sequenceParallel;
    for (TensorId x : inputs[k]) {
      fwd += s.bytes(x) * (sequence ? static_cast<double>(t) : 1.0);
      // Tensor x pipeline: each tensor rank sends its 1/t of the boundary (Megatron's scatter/gather).
      if (t > 1 && !sequence && std::fmod(numel(s.tensors[x].shape), static_cast<double>(t)) != 0)
        return fail("the boundary tensor " + s.tensorName(x) + " before " + stage(static_cast<uint32_t>(k)) +
                        " does not split into tensor = " + std::to_string(t) +
                        " equal parts: the generated step sends each tensor rank's 1/t of it, as the estimate prices",
                    kNone);
      TensorId gx = x < s.gradient.size() ? s.gradient[x] : kNone;
      if (gx == kNone || !(writers[s.storageOf(gx)] & (uint64_t(1) << k)))
        return fail("the gradient of " + s.tensorName(x) + ", which " + stage(static_cast<uint32_t>(k)) +
                        " receives, is not made there: nothing to send back",
                    kNone);
      bwd += s.bytes(s.storageOf(gx)) * (sequence ? static_cast<double>(t) : 1.0);
    }
    if (k > 0 && (fwd != ps.boundaryBytes || bwd != ps.boundaryBytes))
      return fail("the boundary before " + stage(static_cast<uint32_t>(k)) + " carries " + formatBytes(fwd) +
                      " forward and " + formatBytes(bwd) + " backward per micro-batch; the estimate prices " +
                      formatBytes(ps.boundaryBytes) + " (the activations the first repeat copy reads)",
                  kNone);
  }
  return true;
}

/// Step 3: the parameters each rank holds and the tied ones it sums with another rank.
bool holdings(Analysis &a, const std::vector<uint32_t> &forwardChunk) {
  const Graph &g = *a.graph, &s = *a.step;
  auto &ps = a.pipelineStep;
  const int64_t p = ps.stages;
  for (auto &r : ps.ranks)
    r.holds.assign(g.params.size(), false);
  for (const StepEntry &se : a.stepSchedule) {
    if (se.kind == StepEntry::Optimizer)
      continue;
    auto &r = ps.ranks[ps.chunkOfOp[se.op] % static_cast<uint32_t>(p)];
    for (const auto *list : {&s.ops[se.op].inputs, &s.ops[se.op].outputs})
      for (TensorId t : *list) {
        const Tensor &x = s.tensors[s.storageOf(t)];
        TensorId w = x.role == TensorRole::Param ? s.storageOf(t)
                     : x.role == TensorRole::Gradient && x.gradOf != kNone && s.tensors[x.gradOf].role == TensorRole::Param
                         ? x.gradOf
                         : kNone;
        if (w != kNone && s.tensors[w].param < g.params.size())
          r.holds[s.tensors[w].param] = true;
      }
  }
  for (TensorId w : sharedStageParams(g, forwardChunk, p)) {
    std::vector<int64_t> on;
    for (int64_t r = 0; r < p; ++r)
      if (ps.ranks[static_cast<size_t>(r)].holds[g.tensors[w].param])
        on.push_back(r);
    if (on.size() != 2) {
      ps.error = "parameter " + g.tensorName(w) + " is read on " + std::to_string(on.size()) +
                 " pipeline stages: the generated step sums a shared parameter's gradient between two";
      return false;
    }
    for (int k = 0; k < 2; ++k) {
      ps.ranks[static_cast<size_t>(on[k])].shared.push_back(w);
      ps.ranks[static_cast<size_t>(on[k])].peers.push_back(on[1 - k]);
    }
  }
  const Plan &plan = *a.plan;
  const int64_t d = plan.parallel.data, bg = static_cast<int64_t>(bytesOf(plan.precision.grads));
  // ZeRO 2 and 3: each tensor of the stage's regions cut into d pieces, as the memory plan
  // cuts a whole model's (MemoryPlan.cpp).
  const int64_t pieces = d > 1 && plan.parallel.zero >= 2 ? d : 1;
  for (auto &r : ps.ranks) {
    if (!layStageRegions(a, r.holds, r.params, r.grads, r.master, r.optimizer, pieces)) {
      ps.error = "a stage's regions pass 2^63 - 1 bytes";
      return false;
    }
    // Data x pipeline under ZeRO-1: the stage's grads region split over its data group as the
    // memory plan splits a whole model's (MemoryPlan.cpp), each optimizer state one run of
    // ⌈E / d⌉ elements, and a separate fp32 master copy the same run (the rank's shard of the
    // stage's master in its grads region's element order).
    if (d > 1 && plan.parallel.zero == 1 && bg > 0) {
      const int64_t elems = r.grads.bytes / bg;
      r.shard = elems / d + (elems % d != 0);
      // `runs` runs of the shard's elements in dtype dt, each padded.
      auto sharded = [&](Region &out, Dtype dt, int64_t runs, const char *what) {
        std::optional<int64_t> one = checkedMul(r.shard, static_cast<int64_t>(bytesOf(dt)));
        std::optional<int64_t> run = one ? checkedAlignUp(*one) : std::nullopt;
        std::optional<int64_t> all = run ? checkedMul(runs, *run) : std::nullopt;
        if (!all) {
          ps.error = std::string("a stage's ") + what + " shard passes 2^63 - 1 bytes";
          return false;
        }
        out = Region();
        out.dtype = dt;
        out.bytes = *all;
        return true;
      };
      if (!sharded(r.optimizer, plan.precision.optimizer, static_cast<int64_t>(optimizerStates(plan.optimizer)),
                   "optimizer") ||
          (plan.precision.master != Dtype::Invalid && !sharded(r.master, plan.precision.master, 1, "master")))
        return false;
    }
  }
  return true;
}

/// Step 3: slots per chunk, each chunk's buffers placed, the ranks' arenas.
bool arenas(Analysis &a, const std::vector<std::set<uint32_t>> &used) {
  auto &ps = a.pipelineStep;
  const int64_t p = ps.stages;
  for (int64_t r = 0; r < p; ++r) {
    std::vector<int64_t> live(static_cast<size_t>(ps.interleave), 0);
    for (const PipelineUnit &u : ps.order[static_cast<size_t>(r)]) {
      int64_t &n = live[static_cast<size_t>(u.chunk)];
      n += u.backward ? -1 : 1;
      auto &c = ps.chunks[static_cast<size_t>(u.chunk * p + r)];
      c.slots = std::max(c.slots, n);
    }
  }
  for (size_t k = 0; k < ps.chunks.size(); ++k) {
    auto &c = ps.chunks[k];
    std::vector<Buffer> mine;
    for (uint32_t b : used[k])
      mine.push_back(a.buffers[b]);
    if (!placeArena(mine, c.slotBytes)) {
      ps.error = "a stage's arena passes 2^63 - 1 bytes";
      return false;
    }
    size_t i = 0;
    for (uint32_t b : used[k])
      c.offset[b] = mine[i++].offset;
  }
  for (int64_t r = 0; r < p; ++r) {
    int64_t top = 0;
    for (int64_t c = 0; c < ps.interleave; ++c) {
      auto &ch = ps.chunks[static_cast<size_t>(c * p + r)];
      ch.base = top;
      std::optional<int64_t> bytes = checkedMul(ch.slots, ch.slotBytes);
      std::optional<int64_t> end = bytes ? checkedAdd(top, *bytes) : std::nullopt;
      if (!end) {
        ps.error = "a stage's arena passes 2^63 - 1 bytes";
        return false;
      }
      top = *end;
    }
    ps.ranks[static_cast<size_t>(r)].arenaBytes = top;
  }
  return true;
}

/// Why this plan's layout is not one the generated pipeline step runs; "" when it is.
std::string unsupported(const Analysis &a, int64_t m, size_t copies) {
  const Plan &plan = *a.plan;
  const Parallelism &par = plan.parallel;
  const int64_t p = par.pipeline, v = std::max<int64_t>(1, par.interleave);
  if (par.context > 1 || par.expert > 1)
    return "the generated step runs pipeline parallelism on its own or with data or tensor parallelism, not with "
           "context or expert parallelism";
  if (par.tensor > 1 && (!plan.tensorStep || !a.tensorStepError.empty()))
    return "the plan's tensor parallelism is not one the generated step runs" +
           (a.tensorStepError.empty() ? std::string() : ": " + a.tensorStepError);
  if (m < 1 || plan.batch % (plan.microBatch * std::max<int64_t>(1, par.data)) != 0)
    return "the batch is not a whole number of micro-batches";
  if (v > 1 && m % p != 0)
    return "interleave = " + std::to_string(v) + " runs Megatron's schedule, which needs the " + std::to_string(m) +
           " micro-batches to be a multiple of pipeline = " + std::to_string(p);
  if (p * v > 64 || 2 * p * v * m > 32765)
    return "the generated pipeline step runs at most 64 stages and 2 x stages x micro-batches of at most 32765 "
           "(its message tags)";
  if (copies < static_cast<size_t>(p * v))
    return "the model has " + std::to_string(copies) + " repeat-block copies, fewer than the " +
           std::to_string(p * v) + " pipeline stages (pipeline x interleave) to assign them to";
  return "";
}

} // namespace

void planPipelineStep(Analysis &a) {
  auto &ps = a.pipelineStep;
  ps = {};
  const Plan &plan = *a.plan;
  const Parallelism &par = plan.parallel;
  if (!plan.generatedStep || !plan.isTrain || par.pipeline <= 1 || !a.step || !a.planListed ||
      !a.planOverflow.empty())
    return;
  const Graph &g = *a.graph, &s = *a.step;
  const int64_t p = par.pipeline, v = std::max<int64_t>(1, par.interleave);
  const int64_t m = plan.batch / std::max<int64_t>(1, plan.microBatch * std::max<int64_t>(1, par.data));
  ps.stages = p;
  ps.interleave = v;
  ps.microBatches = m;
  ps.error = unsupported(a, m, a.copies->copies.size());
  if (!ps.error.empty())
    return;
  // Step 1.
  std::vector<uint32_t> forwardChunk = chunkOfOps(g, *a.copies, p * v);
  const uint32_t last = static_cast<uint32_t>(p * v - 1);
  ps.chunkOfOp.assign(s.ops.size(), kNone);
  for (OpId i = 0; i < s.ops.size(); ++i) {
    const Op &op = s.ops[i];
    if (i < g.ops.size())
      ps.chunkOfOp[i] = forwardChunk[i];
    else if (op.phase != Phase::Optimizer)
      ps.chunkOfOp[i] = op.forwardOp == kNone ? last : forwardChunk[op.forwardOp];
  }
  for (int64_t r = 0; r < p; ++r)
    ps.order.push_back(pipelineOrder(static_cast<int32_t>(r), static_cast<int32_t>(p), static_cast<int32_t>(m),
                                     static_cast<int32_t>(v)));
  ps.chunks.resize(static_cast<size_t>(p * v));
  ps.ranks.resize(static_cast<size_t>(p));
  ps.boundaryBytes = stageBoundaryBytes(g, *a.copies);
  // Steps 2 and 3.
  BufferIndex bi(a);
  std::vector<std::set<uint32_t>> used(ps.chunks.size());
  if (!crossings(a, bi, used) || !holdings(a, forwardChunk) || !arenas(a, used)) {
    ps.chunks.clear();
    return;
  }
  ps.zero = zeroMovesOf(a, ps.chunkOfOp); // step 4: ZeRO 2 and 3, chunk by chunk
}

double pipelineSentBytes(const Analysis &a, int64_t rank) {
  const auto &ps = a.pipelineStep;
  if (ps.chunks.empty() || rank < 0 || rank >= ps.stages)
    return 0;
  const int64_t p = ps.stages, chunks = p * ps.interleave;
  double boundaries = 0;
  for (int64_t c = 0; c < ps.interleave; ++c) {
    int64_t k = c * p + rank;
    boundaries += (k + 1 < chunks ? 1 : 0) + (k > 0 ? 1 : 0);
  }
  // Tensor x pipeline: each tensor rank sends its 1/t of a boundary (boundarySend, StepTime.cpp);
  // the receiver's all-gather is its tensor group's (tensorParallelSentBytes).
  double sent = static_cast<double>(ps.microBatches) * boundaries * ps.boundaryBytes /
                static_cast<double>(std::max<int64_t>(1, a.plan->parallel.tensor));
  // A tied parameter's gradient: whole, or under ZeRO 2 and 3 this data rank's piece of it.
  const Parallelism &par = a.plan->parallel;
  const double d = par.data > 1 && par.zero >= 2 ? static_cast<double>(par.data) : 1.0;
  for (TensorId w : ps.ranks[static_cast<size_t>(rank)].shared)
    sent += std::ceil(numel(a.graph->tensors[w].shape) / d) * bytesOf(a.plan->precision.grads);
  return sent;
}

double tensorPipelineComm(Analysis &a, const TensorParallel &tp, double m) {
  const Graph &g = *a.graph, &s = *a.step;
  const auto &ps = a.pipelineStep;
  const Plan &plan = *a.plan;
  const int64_t p = ps.stages, chunks = p * ps.interleave;
  const Placement group = place(plan, 't');
  const bool sequence = plan.parallel.sequenceParallel;
  const Collective row = sequence ? Collective::ReduceScatter : Collective::AllReduce;
  auto on = [&](OpId i, int64_t r) { return i < ps.chunkOfOp.size() && ps.chunkOfOp[i] % p == r; };
  auto seconds = [&](const std::vector<double> &list, Collective c) {
    double time = 0;
    for (double bytes : list)
      time += collectiveTime(plan.target, group, c, bytes);
    return time;
  };
  double slowest = 0;
  for (int64_t r = 0; r < p; ++r) {
    std::vector<double> forward, backward, gathers, columnGathers, embedding, norms, again, againGathers;
    for (OpId i = 0; i < g.ops.size() && i < tp.rowParallel.size(); ++i)
      if (tp.rowParallel[i] && on(i, r))
        for (TensorId o : g.ops[i].outputs)
          forward.push_back(g.bytes(o));
    // The stage's recomputed ops (the schedule's Recompute steps, run in its backward units)
    // reduce their row outputs again and, under sequence parallelism, gather their column
    // inputs again, as the one-stage step's (addRecomputeMessages).
    for (const ScheduleStep &st : a.schedule)
      if (st.kind == ScheduleStep::Recompute && st.op < g.ops.size() && on(st.op, r))
        addRecomputeMessages(g, tp, st.op, sequence, again, againGathers);
    for (size_t k = 0; k < tp.backwardMessages.size(); ++k)
      if (!tp.backwardReaders[k].empty() && on(tp.backwardReaders[k].front(), r))
        backward.push_back(tp.backwardMessages[k]);
    if (sequence) {
      // Sequence parallel (as StepTime.cpp's sequenceGathers, per stage): each column input
      // all-gathered before its matmuls and again in the backward, each row output's gradient
      // gathered in the backward, the embeddings' gradient on the first stage; each stage's
      // sequence-split parameters' gradients all-reduced once per step. A boundary is the
      // sender's share of the tokens: nothing to gather.
      for (size_t k = 0; k < tp.gatherMessages.size(); ++k)
        if (!tp.gatherReaders[k].empty() && on(tp.gatherReaders[k].front(), r))
          columnGathers.push_back(tp.gatherMessages[k]);
      if (r == 0) // the embedding section runs on the first chunk (chunkOfOps)
        embedding = tp.scatterMessages;
      std::vector<TensorId> held;
      for (TensorId w : tp.sequenceParams)
        if (g.tensors[w].param < ps.ranks[static_cast<size_t>(r)].holds.size() &&
            ps.ranks[static_cast<size_t>(r)].holds[g.tensors[w].param])
          held.push_back(w);
      const double elements = sequenceGradientElements(a, held);
      if (elements > 0)
        norms.push_back(elements * bytesOf(plan.precision.grads));
    } else {
      // What this rank receives: its chunks' boundary activations, and their outputs' gradients.
      for (int64_t c = 0; c < ps.interleave; ++c) {
        const int64_t k = c * p + r;
        if (k > 0)
          for (TensorId x : ps.chunks[static_cast<size_t>(k)].inputs)
            gathers.push_back(s.bytes(x));
        if (k + 1 < chunks)
          for (TensorId x : ps.chunks[static_cast<size_t>(k)].outputs)
            gathers.push_back(s.bytes(x));
      }
    }
    recordMessages(a, sequence ? "sequence parallel reduce-scatter of a row output (a pipeline stage's)"
                               : "forward all-reduce (a pipeline stage's)",
                   't', row, forward, 1, m, false, r);
    recordMessages(a, sequence ? "sequence parallel reduce-scatter of an input gradient (a pipeline stage's)"
                               : "backward all-reduce of an input gradient (a pipeline stage's)",
                   't', row, backward, 1, m, false, r);
    recordMessages(a, sequence ? "sequence parallel recompute reduce-scatter (a pipeline stage's)"
                               : "recompute all-reduce (a pipeline stage's)",
                   't', row, again, 1, m, false, r);
    recordMessages(a, "sequence parallel recompute all-gather (a pipeline stage's)", 't', Collective::AllGather,
                   againGathers, 1, m, false, r);
    recordMessages(a, "all-gather of a received pipeline boundary (Megatron's scatter/gather)", 't',
                   Collective::AllGather, gathers, 1, m, false, r);
    recordMessages(a, "sequence parallel all-gather of a column input (a pipeline stage's)", 't', Collective::AllGather,
                   columnGathers, 1, 2 * m, false, r);
    recordMessages(a, "sequence parallel all-gather of a row output's gradient (a pipeline stage's)", 't',
                   Collective::AllGather, sequence ? forward : std::vector<double>{}, 1, m, false, r);
    recordMessages(a, "sequence parallel all-gather of the embeddings' gradient (a pipeline stage's)", 't',
                   Collective::AllGather, embedding, 1, m, false, r);
    recordMessages(a, "sequence parallel all-reduce of the norms' gradients (a pipeline stage's)", 't',
                   Collective::AllReduce, norms, 1, 1, false, r);
    // The boundary all-gathers are priced with the sends (boundarySend).
    double time = m * (seconds(forward, row) + seconds(backward, row) + seconds(again, row) +
                       seconds(againGathers, Collective::AllGather)) +
                  (sequence ? m * (2 * seconds(columnGathers, Collective::AllGather) +
                                   seconds(forward, Collective::AllGather) + seconds(embedding, Collective::AllGather)) +
                                  seconds(norms, Collective::AllReduce)
                            : 0);
    slowest = std::max(slowest, time);
  }
  return slowest;
}

} // namespace tally
