// The pass pipeline: every pass in order on one lowered plan. The first three passes depend
// only on the graph, the precision and the optimizer; the rest also on the layout (parallel
// degrees, ZeRO, checkpoint, target), so the layout search runs them alone on a copy
// (analyzeLayout).
#include "passes/Passes.h"

#include "support/Diagnostics.h"
#include "ir/OpRules.h"
#include "passes/Fusion.h"
#include "passes/GradientShares.h"
#include "passes/Stack.h"

#include <system_error>
#include <thread>

namespace tally {

namespace {
/// `work` started on a thread of its own; a thread that is not joinable (and `work` not run)
/// where the system gives none.
std::thread tryThread(std::function<void()> work) {
  try {
    return std::thread(std::move(work));
  } catch (const std::system_error &) {
    return std::thread();
  }
}
} // namespace

Analysis analyzeGraph(const Graph &g, const Plan &plan, std::shared_ptr<const Graph> step,
                      bool compactStep, bool prepare, const Analysis *sameGraph) {
  Analysis a;
  a.graph = &g;
  a.plan = &plan;
  a.step = std::move(step);
  // What depends on the graph alone (the gradient shares) or on the graph and the stack's
  // fused gates (the saved lists) is another analysis's of the same graph, when there is one.
  if (sameGraph && sameGraph->graph == &g) {
    a.gradientShares = sameGraph->gradientShares;
    if (sameGraph->saved && sameGraph->saved->fusedGates == fusedGates(plan))
      a.saved = sameGraph->saved;
  }
  if (!a.gradientShares && plan.isTrain)
    a.gradientShares = std::make_shared<GradientSharesOnce>(g);
  a.copies = std::make_shared<const RepeatCopies>(findRepeatCopies(g));
  a.walks = newWalkMemo();
  a.headPad = headPadding(g, plan);
  // Autodiff's first step, building the training step, reads only the graph, the plan and
  // the copies; counting parameters, pricing the forward ops, the saved lists and the walks'
  // graph facts read the graph and write only their own parts of `a`. On a deep graph they
  // run at once, on two threads (a 100,000-layer report: 0.3 s of each; the shared pools
  // they all use, shapes, layouts, names and labels, are locked: ir/Graph.cpp). A small
  // graph is not worth a thread; where the system gives none, the passes run in turn.
  auto price = [&a, &g, &plan] {
    countParams(a);
    costOps(a);
    if (plan.isTrain)
      a.time.mfuFacts = mfuGraphFacts(g);
  };
  std::thread pricing;
  if (!a.step && g.ops.size() >= kThreadedOps)
    pricing = tryThread([&a, &g, &plan, prepare, price] {
      price();
      if (prepare && plan.isTrain) {
        if (!a.saved)
          a.saved = savedLists(g, fusedGates(plan));
        prepareWalks(a);
      }
    });
  if (pricing.joinable()) {
    a.step = std::make_shared<const Graph>(
        buildTrainingStep(g, plan, compactStep ? a.copies.get() : nullptr, a.gradientShares.get()));
    pricing.join();
  } else {
    price();
  }
  differentiate(a, compactStep); // [autodiff]
  selectFp8Gemms(a);             // reads the saved lists
  return a;
}

namespace {

/// The transforms' output is checked before any analysis reads it: lowering verifies the
/// forward graph (frontend/), and here the training step that autodiff and step assembly built
/// (ids, order, strides, views: verifyGraph; every op's output types against its rule:
/// verifyOpTypes). A failure is tally's bug, said as one instead of a crash or a wrong number
/// further on. The forward ops' output types are their rules' inference by construction
/// (lowering makes each op's outputs from it, and the step's forward ops are the forward
/// graph's own records), so only the ops the step added are inferred again here: re-inferring every op was 7%
/// of a 1,000-layer report. The unit tests check every op of every example's step
/// (test_backward, test_moe).
void checkStep(const Analysis &a, DiagnosticEngine &diags) {
  if (!a.step)
    return;
  // The step begins with the forward graph's own records (Graph::extend), which lowering
  // verified: their checks are not made again.
  std::string problem = verifyGraph(*a.step, a.graph->ops.size(), a.graph->tensors.size());
  if (problem.empty())
    problem = verifyOpTypes(*a.step, static_cast<OpId>(a.graph->ops.size()));
  if (problem.empty())
    return;
  diags.report(DiagKind::InvalidValue, a.plan->range.Start,
               "internal error: the training step is invalid: " + problem)
      .range(a.plan->range);
}

/// A plan whose sizes or offsets do not fit int64 bytes cannot be allocated or generated: an
/// [overflow] error at the plan's `model` setting (else the plan), once per plan.
void checkMemoryPlan(const Analysis &a, DiagnosticEngine &diags) {
  if (a.planOverflow.empty())
    return;
  const Plan &plan = *a.plan;
  auto where = plan.settingRanges.find("model");
  llvm::SMRange range = where != plan.settingRanges.end() && where->second.isValid() ? where->second : plan.range;
  diags.report(DiagKind::Overflow, range.Start,
               "the memory plan does not fit in 64-bit byte offsets: " + a.planOverflow)
      .range(range)
      .note(llvm::SMLoc(), "tally build and run cannot allocate this plan; the analytic numbers "
                           "(doubles) are reported as computed");
}

/// The layout-dependent passes that price a plan: memory and time (`curveLater`:
/// planActivations').
void priceLayout(Analysis &a, std::function<void()> *curveLater = nullptr) {
  const Plan &plan = *a.plan;
  a.ridge = plan.target.ridge(plan.precision.activations);
  a.checkpoint.policy = plan.checkpoint;
  const bool gates = fusedGates(plan);
  if (a.saved && a.saved->fusedGates != gates) { // a layout whose stack fuses otherwise
    if (a.savedMemo) {
      std::lock_guard<std::mutex> hold(a.savedMemo->lock);
      std::shared_ptr<const Analysis::SavedLists> &made = a.savedMemo->byGates[gates];
      if (!made)
        made = savedLists(*a.graph, gates);
      a.saved = made;
    } else {
      a.saved = savedLists(*a.graph, gates);
    }
  }
  staticMemory(a);
  planActivations(a, curveLater); // [activations]
}

} // namespace

Analysis analyzeLayout(const Analysis &graphPart, const Plan &plan, DiagnosticEngine &diags,
                       bool timed, bool final) {
  Analysis a = graphPart;
  a.plan = &plan;
  a.scheduleUnread = final && !timed && plan.isTrain;
  a.headPad = headPadding(*a.graph, plan); // the layout decides (ZeRO, tensor parallelism)
  a.wants = Results::whatIf();
  a.priceOnly = true;
  priceLayout(a);
  if (!timed && plan.isTrain) {
    // The peak's last term; roofline, the step time and their checks write no memory or
    // FLOPs, and inference and the serving capacity do nothing for a train plan.
    allocatorReserve(a);
    a.timePending = true;
    return a;
  }
  priceLayoutTime(a, diags);
  return a;
}

void priceLayoutTime(Analysis &a, DiagnosticEngine &diags) {
  if (a.timePending) {
    // Priced untimed (analyzeLayout's `timed` false), a train plan: the allocator's reserve
    // is in the peak already, and inference and the serving capacity do nothing for it.
    a.timePending = false;
    roofline(a); // [roofline]
    stepTime(a); // [steptime]
    checkAccumulation(a, diags); // [steptime]
    checkExperts(a, diags);
    return;
  }
  roofline(a); // [roofline]
  stepTime(a); // [steptime]
  checkAccumulation(a, diags); // [steptime]
  checkExperts(a, diags);
  inference(a); // [inference]
  allocatorReserve(a);
  servingCapacity(a);
}

Analysis analyzeStep(const Graph &g, const Plan &plan, DiagnosticEngine &diags, bool compactStep,
                     bool prepare) {
  Analysis a = analyzeGraph(g, plan, nullptr, compactStep, prepare);
  checkStep(a, diags);
  return a;
}

Analysis analyze(const Graph &g, const Plan &plan, DiagnosticEngine &diags,
                 const Relower &relower, Results wants) {
  Analysis request;
  request.plan = &plan;
  request.wants = wants;
  bool keepStep = wants.has(Result::Step);
  // A step nothing reads after it is priced and checked may be compact (buildTrainingStep).
  bool compact = !request.listsPlan() && !keepStep;
  Analysis a = analyzeStep(g, plan, diags, /*compactStep=*/compact, /*prepare=*/true);
  if (compact && plan.isTrain && wants.has(Result::Budgets)) {
    // The graph part as made (Analysis::graphOnly): what a fix search's graph part for the
    // same plan under another checkpoint policy is (only checkBudgets searches). Its step goes
    // (the graph part releases it) and so do the per-block counts (no trial reads them).
    std::vector<Analysis::BlockCount> counts;
    counts.swap(a.params.byBlock);
    auto part = std::make_shared<Analysis>(a);
    a.params.byBlock.swap(counts);
    part->step.reset();
    a.graphOnly = std::move(part);
  }
  a.wants = wants;
  // Unlisted, the memory plan needs of the step only a bound on its local gradients; when no
  // caller reads the step either, it goes back now, before the walks make their lists (a
  // compact step always: nothing else may read it).
  if (!a.listsPlan() && a.step) {
    a.localGradientBytes = localGradientBound(*a.step, g.tensors.size());
    if (!keepStep && (a.step.use_count() == 1 || a.step->skipped.count > 0)) {
      a.step.reset();
      a.stepReleased = true;
    }
  }
  // A deep model's trade-off curve is walked on another thread while the passes up to the
  // budgets run (none of them reads the curve, writes what its walks read or walks itself);
  // the budgets (their notes for auto) are the first to read it.
  std::function<void()> curve;
  priceLayout(a, &curve);
  std::thread curveWalks;
  if (curve) {
    curveWalks = tryThread(curve);
    if (!curveWalks.joinable())
      curve();
  }
  // The generated CPU step's tensor parallelism (Plan::tensorStep): the memory plan is one
  // rank's, over the step of the forward graph's shard (TensorShard.cpp).
  if (plan.tensorStep && plan.isTrain && plan.parallel.tensor > 1 && a.step && a.planListed) {
    Graph shard;
    a.tensorStepError = shardForTensorParallel(g, plan, shard, a.tensorShards, a.tensorStepOp);
    if (a.tensorStepError.empty()) {
      Graph step = buildTrainingStep(shard, plan);
      if (plan.parallel.sequenceParallel)
        a.tensorStepError = shardSequence(g, plan, step, a.sequenceDim);
      if (a.tensorStepError.empty())
        a.step = std::make_shared<const Graph>(std::move(step));
    }
  }
  planMemory(a);
  planPipelineStep(a); // the generated CPU step's pipeline stages (Plan::generatedStep)
  checkMemoryPlan(a, diags);
  fuseKernels(a);
  roofline(a); // [roofline]
  stepTime(a); // [steptime]
  pipelineTimeline(a);
  checkAccumulation(a, diags); // [steptime]
  checkExperts(a, diags);
  inference(a); // [inference]
  allocatorReserve(a);
  servingCapacity(a);
  checkServing(a, diags);
  precisionLints(a, diags); // [lints]
  matmulAlignment(a, diags);
  unusedParams(a, diags);
  unusedLocals(a, diags);
  blockTotals(a); // reads the op times, writes the per-block totals, which the budgets do not read
  if (curveWalks.joinable())
    curveWalks.join();
  checkBudgets(a, diags, relower); // [budgets]
  a.graphOnly.reset(); // only the budgets' fix search reads it
  return a;
}

} // namespace tally
