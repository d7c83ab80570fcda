// Activation memory: the forward-then-backward schedule, the checkpoint policy, the liveness
// walk over saved tensors, transients and gradients, and the memory plan (buffers placed in one
// arena). docs/memory.md explains every rule with a worked GPT-2 example.
//
// 1. Facts about the graph, computed once: each tensor's storage (a view counts as the tensor
//    it views), which ops have a backward (some input needs a gradient), who reads and who
//    saves each stored tensor, which tensors tensor parallelism splits (Megatron: a weight
//    matmul on a full input is column-parallel and splits its output, one on a split input is
//    row-parallel and all-reduces; elementwise ops, views and attention keep their input's
//    split; reductions and embeddings give full tensors), and the repeat-block copies (the
//    instances whose parent is a `repeat` list; an op belongs to the outermost copy above it).
// 2. A policy recomputes segments of consecutive copies (each keeps only its input): none is
//    no segment; full is every copy alone; every(k) is all L copies in segments of k; sqrt is
//    all copies in segments of the length k in 1..L whose walk (steps 3-5) needs the least
//    memory (Chen et al.'s minimum, measured rather than ⌈√L⌉); keep [paths] re-runs each copy
//    less the listed blocks or ops; selective re-runs single cheap ops. auto takes the least
//    recompute time (roofline seconds of the re-run ops) whose activations and workspace per
//    device fit the target's memory (or a smaller memory budget) minus the model states,
//    among the first m copies (graph order), the m copies that save the most bytes per second
//    of recompute (m found by bisection in each), selective, and nested recomputation: the
//    chain program of CheckpointChain.h (Rotor) over the ops before the copies, the copies and
//    the ops after them, whose schedule may re-run a copy several times; then sqrt and
//    recompute_all when nothing fits.
// 3. The schedule: the forward of every op in order, then the backward of every op that has
//    one in reverse order; just before the first backward step of a checkpointed segment, the
//    forward of all its ops runs again (Recompute steps). recompute_all and nested plans write
//    their schedules out whole (an op may then be re-run several times).
// 4. Liveness, over any schedule (liveness()): every run of an op makes a new instance of each
//    activation it writes and of its extra saved buffers (masks, statistics); each later step
//    reading the tensor uses its newest instance — a forward or recompute as an input, the
//    op's backward what it keeps. An instance lives from the step that makes it to its last
//    use, Saved when a backward uses it, else Transient. So an activation made in a recomputed
//    segment lives in the forward only to its last forward reader, and again from its re-run
//    to its backward. An activation's gradient lives from the backward of its last reader
//    (which starts it) to the backward of its producer (which consumes it). Each buffer is
//    Saved or workspace (Transient, Gradient).
// 5. The peak: sweep the buffers over the steps; the step with the most bytes live is the peak;
//    memory.activations is the Saved bytes live there, memory.workspace the rest. Pipeline
//    parallelism (1F1B) holds 1/pp of the layers but min(pp, micro-batches) micro-batches in
//    flight on its first stage, so the Saved bytes are scaled by that over pp.
// 6. The buffers are placed in the arena by passes/MemoryPlan.cpp (integer, aligned offsets).
// 7. Totals: recompute FLOPs per step (model FLOPs of the re-run forward; executed FLOPs add the
//    executed count to flops.executed), and memory.peak = model states + activations +
//    workspace.
//
// Infer plans have no backward: the walk covers the forward only, nothing is saved, and the
// transients at the peak are the workspace.
//
// The pass's files (their shared declarations: passes/ActivationsInternal.h): step 1 in
// passes/ActivationFacts.cpp, step 2 in passes/CheckpointPolicies.cpp and, for nested
// recomputation, passes/CheckpointNested.cpp, steps 3-5 in passes/ActivationLiveness.cpp (and,
// for the walks that compare policies over many like copies, passes/ActivationPeriodic.cpp),
// what the reports read (per-copy activations and plan, the trade-off curve, the checkpoint
// note) in passes/ActivationReport.cpp; this file applies the requested policy
// (planActivations) and fills steps 5-7's totals.
#include "passes/ActivationsInternal.h"

#include <cmath>

namespace tally {

using namespace activations;

void prepareWalks(Analysis &a) { structureOf(a); }

void planActivations(Analysis &a, std::function<void()> *curveLater) {
  const Plan &plan = *a.plan;
  Facts f = gatherFacts(a);
  StepScale scale = stepScale(plan);
  a.checkpoint.requested = plan.checkpoint;
  a.checkpoint.blocks = static_cast<int64_t>(f.copies.size());
  // auto ranks the copies by what they keep; the facts decide it (the walk memo's variant).
  if (f.walked && f.walked->blocksBuilt) {
    a.blockActivations = f.walked->blocks;
  } else {
    blockActivations(f, a);
    if (f.walked) {
      f.walked->blocks = a.blockActivations;
      f.walked->blocksBuilt = true;
    }
  }
  Policy p = requestedPolicy(f, a, scale, plan.checkpoint);
  // A candidate priced alone (Analysis::priceOnly) needs the peak and, for its step time, the
  // schedule's Recompute steps, not the buffers: its walk may come from the memo, which keeps
  // no schedule, but does keep those steps once a candidate applied the policy.
  // The applied policy's buffers, for the memory plan (Analysis::listsPlan): listed, or only
  // summed when nothing reads the list — then the plan fits 64-bit byte offsets when the
  // sum with the local gradients' bound does (planMemory), and else the buffers are listed
  // after all, for the memory plan to say what does not fit.
  bool list = !a.priceOnly && a.listsPlan();
  bool perCopy = plan.isTrain && !f.copies.empty() && !a.priceOnly && a.wanted(Result::BlockPlan);
  std::optional<int64_t> aligned = 0;
  // A candidate priced alone is walked as a comparison: the same recompute and peak (the walk
  // memo already serves one for the other), from the periodic walk where the copies are
  // provably alike; its step time reads the schedule's Recompute steps, listed below from
  // the policy when the memo has none (Analysis::scheduleUnread: nobody reads them).
  bool unread = a.priceOnly && a.scheduleUnread;
  Walk w = a.priceOnly ? compareWalk(f, a, p)
                       : walk(f, a, p, list, list ? nullptr : &aligned, perCopy);
  if (!a.priceOnly && !list) {
    const std::optional<int64_t> &local = a.localGradientBytes; // analyze took it from the step
    if (!aligned || !local || !checkedAdd(*aligned, *local)) {
      w = walk(f, a, p, true, nullptr, perCopy);
      list = true;
      if (!a.step || a.step->skipped.count > 0) { // released, or compact: the listed plan reads it whole
        a.step = std::make_shared<const Graph>(buildTrainingStep(*a.graph, plan, nullptr, a.gradientShares.get()));
        a.stepReleased = false;
      }
    }
  }
  a.planListed = list;
  std::shared_ptr<const std::vector<ScheduleStep>> recomputeSteps;
  if (unread) {
    recomputeSteps = std::make_shared<std::vector<ScheduleStep>>(); // none is read
  } else if (a.priceOnly && w.memo && w.memo->recomputeSteps) {
    recomputeSteps = w.memo->recomputeSteps; // the schedule is not built again
  } else {
    if (w.schedule.empty())
      buildSchedule(f, p, w);
    if (a.priceOnly) {
      auto steps = std::make_shared<std::vector<ScheduleStep>>();
      for (const ScheduleStep &st : w.schedule)
        if (st.kind == ScheduleStep::Recompute)
          steps->push_back(st);
      recomputeSteps = steps;
      if (w.memo)
        w.memo->recomputeSteps = recomputeSteps;
    }
  }

  a.checkpoint.policy = p.name;
  a.checkpoint.checkpointed = static_cast<int64_t>(p.checkpointed());
  a.checkpoint.segment = static_cast<int64_t>(p.segment());
  // The note and the kept paths are for reports; a candidate priced alone is read for its
  // numbers (they were 6% of a 10,000-layer layout search).
  if (!a.priceOnly) {
    checkpointNote(f, p, a);
    if (p.opSegments.empty())
      a.checkpoint.saved = keptPaths(f, p); // keep lists wrote theirs
  }
  a.checkpoint.recomputeFlops = w.recomputeFlops * scale.flops;
  a.flops.recompute = a.checkpoint.recomputeFlops;
  a.flops.executed += w.recomputeExecuted * scale.flops;

  a.memory.activations = deviceActivations(w, plan);
  a.memory.workspace = w.peakOther / contextShare(plan);
  a.memory.peak = staticBytes(a) + a.memory.activations + a.memory.workspace;

  // The curve is for reports: the layout search and the budget-fix trials re-analyse plans
  // thousands of times and read only the peak and the times (a curve there made `tally
  // solve layout` 4× slower).
  bool curve = plan.isTrain && !f.copies.empty() && !a.priceOnly &&
               (a.wanted(Result::Curve) ||
                (a.wanted(Result::Budgets) && plan.checkpoint == "auto"));
  if (perCopy)
    perBlock(f, w, a);

  a.livePeakBytes = w.peakSaved + w.peakOther;
  a.peakStep = w.peakStep;
  // The plan's own analysis (not a solver's candidate) walks no more after the curve (only a
  // budget fix search would, which makes them again): the walks' working lists go back then,
  // before the memory plan makes its own. The walks done and the graph's facts stay in the
  // memo: a fix search reads the facts again, and built anew there, beside the memory plan's
  // lists, they were more at a 100,000-layer report's peak (1,189 MB, 1,050 MB kept) than
  // they save before it (none measurably, issue 41: check and report, fitting or not).
  auto release = [&a](Facts &facts) {
    if (a.priceOnly || !facts.memo)
      return;
    facts.memo->scratch = WalkScratch();
  };
  if (curve) {
    TradeOffPoint own = curvePoint(a, p.name, static_cast<int64_t>(p.checkpointed()), w, scale);
    if (curveLater && f.g.ops.size() >= kThreadedOps) {
      // Left to the caller, with what the walks read that later passes write: the records.
      struct Later {
        Facts facts;
        OpTable ops;
      };
      auto later = std::make_shared<Later>(Later{std::move(f), a.ops});
      later->facts.ops = &later->ops;
      *curveLater = [later, own, scale, release, &a] {
        tradeOffCurve(later->facts, a, own, scale);
        release(later->facts);
      };
    } else {
      tradeOffCurve(f, a, own, scale);
      release(f);
    }
  } else {
    release(f);
  }
  // A candidate priced alone keeps only the Recompute steps, in order: its step time reads
  // no other (Analysis::schedule).
  a.schedule = a.priceOnly ? *recomputeSteps : std::move(w.schedule);
  a.buffers = std::move(w.buffers);
}

} // namespace tally
