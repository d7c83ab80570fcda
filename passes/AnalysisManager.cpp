// The analysis manager (passes/AnalysisManager.h): graph parts cached by lowering key,
// precision and optimizer; layout trials cached by everything else a search changes.
#include "passes/AnalysisManager.h"
#include "passes/TensorParallel.h"
#include "passes/PricingMemo.h"

#include "support/Diagnostics.h"

#include "llvm/Support/SourceMgr.h"

#include <algorithm>

namespace tally {

bool sameGraph(const Plan &a, const Plan &b) { return loweringKey(a) == loweringKey(b); }

Trial trialOf(const Analysis &t) {
  Trial out;
  out.peak = t.memory.peak;
  out.activations = t.memory.activations;
  out.stepFlops = t.flops.step;
  out.executedFlops = t.flops.executed;
  out.stepTime = t.time.step;
  out.runTime = t.time.run;
  out.mfu = t.time.mfu;
  return out;
}

std::optional<Trial> tryPlan(const Analysis &base, const Plan &candidate, const Relower &relower) {
  std::optional<Graph> lowered;
  const Graph *graph = base.graph;
  if (!sameGraph(*base.plan, candidate)) {
    if (!relower)
      return std::nullopt;
    lowered = relower(candidate);
    if (!lowered)
      return std::nullopt;
    graph = &*lowered;
  }
  llvm::SourceMgr sm;
  DiagnosticEngine quiet(sm);
  quiet.setOutput(nullptr);
  return trialOf(analyze(*graph, candidate, quiet, {}, Results::whatIf()));
}

namespace {

/// Do two candidates of one base plan price the same? They differ from the base only in the
/// fields a search changes; these are compared (and the graph's).
bool samePricing(const Plan &a, const Plan &b) {
  const Parallelism &x = a.parallel, &y = b.parallel;
  return sameGraph(a, b) && a.batch == b.batch && a.prompt == b.prompt &&
         a.generate == b.generate && a.maxContext == b.maxContext && a.kvBlock == b.kvBlock &&
         a.kvDtype == b.kvDtype && a.microBatchGiven == b.microBatchGiven &&
         a.checkpoint == b.checkpoint && a.target.name == b.target.name &&
         a.tokens == b.tokens && x.devices == y.devices && x.data == y.data &&
         x.tensor == y.tensor && x.pipeline == y.pipeline && x.context == y.context &&
         x.expert == y.expert && x.expertTensor == y.expertTensor && x.zero == y.zero && x.interleave == y.interleave &&
         x.sequenceParallel == y.sequenceParallel && x.overlap == y.overlap && x.overlapGiven == y.overlapGiven &&
         x.reshardAfterForward == y.reshardAfterForward && x.prefetch == y.prefetch &&
         x.reduceEveryMicroBatch == y.reduceEveryMicroBatch && x.reduceEveryGiven == y.reduceEveryGiven &&
         x.tensorOverlap == y.tensorOverlap && x.expertOverlap == y.expertOverlap && x.stack == y.stack &&
         x.attentionKernel == y.attentionKernel &&
         x.bucketBytes == y.bucketBytes && x.compiled == y.compiled && x.order == y.order;
}

} // namespace

/// One lowered graph and its graph-only passes, shared by the candidates that lower to it.
struct AnalysisManager::GraphPart {
  Plan plan;                  ///< the first candidate with this graph (analyzeGraph's plan)
  std::optional<Graph> owned; ///< a re-lowered graph (the base's graph is not copied)
  std::optional<Analysis> part; ///< nullopt when the graph could not be lowered
};

AnalysisManager::AnalysisManager(const Analysis &base, Relower relower, size_t keepGraphs)
    : base_(base), relower_(std::move(relower)), keepGraphs_(std::max<size_t>(1, keepGraphs)) {}

AnalysisManager::~AnalysisManager() = default;

const Analysis *AnalysisManager::graphPart(const Plan &candidate, bool checkpointOnly) {
  for (const auto &g : graphs_)
    if (sameGraph(g->plan, candidate) &&
        g->plan.precision.preset == candidate.precision.preset &&
        g->plan.optimizer.name == candidate.optimizer.name)
      return g->part ? &*g->part : nullptr;
  bool relowered = !sameGraph(*base_.plan, candidate);
  if (relowered) {
    // Room for this one: the oldest re-lowered graphs go first.
    size_t owned = std::count_if(graphs_.begin(), graphs_.end(),
                                 [](const auto &g) { return g->owned.has_value(); });
    for (auto it = graphs_.begin(); owned >= keepGraphs_ && it != graphs_.end();)
      if ((*it)->owned) {
        it = graphs_.erase(it);
        --owned;
      } else {
        ++it;
      }
  }
  graphs_.push_back(std::make_unique<GraphPart>());
  ++graphsAnalysed_;
  GraphPart *gp = graphs_.back().get();
  gp->plan = candidate;
  const Graph *graph = base_.graph;
  if (relowered) {
    if (relower_)
      gp->owned = relower_(candidate);
    graphsLowered_ += gp->owned.has_value();
    graph = gp->owned ? &*gp->owned : nullptr;
  }
  if (!graph)
    return nullptr;
  // The base's graph shares the base analysis's step when the plans' steps are equal
  // (sameStep), and its walks (WalkMemo keeps apart those whose facts differ, another
  // precision's costs say).
  bool baseGraph = graph == base_.graph;
  std::shared_ptr<const Graph> step;
  if (baseGraph && sameStep(gp->plan, *base_.plan))
    step = base_.step;
  // The layout passes read the step's costs (differentiate's records), never the step: it
  // may be compact (a repeated block's backward built once, its copies' records copied, as
  // `check`'s own analysis does) and goes back once priced. A 100,000-layer base whose step
  // `check` released was rebuilt whole here for the fix notes: a fifth of the time (issue 41).
  // The base's graph also takes the base's gradient shares and, when the stack fuses alike,
  // its saved lists (analyzeGraph's `sameGraph`): made again, they were a tenth of a
  // 100,000-layer check's fix notes and 70 MB more at its peak.
  // A candidate that is the base's plan but for the checkpoint policy has the base's graph
  // part as made (Analysis::graphOnly; the graph-only passes never read the policy).
  if (baseGraph && checkpointOnly && base_.graphOnly)
    gp->part = *base_.graphOnly;
  else
    gp->part = analyzeGraph(*graph, gp->plan, std::move(step), /*compactStep=*/true,
                            /*prepare=*/false, baseGraph ? &base_ : nullptr);
  gp->part->step.reset();
  gp->part->stepReleased = true;
  // No trial reads the per-block counts (blockTotals and the reports do, on a plan's own
  // analysis), and every trial copied them: 55 MB at 100,000 layers.
  std::vector<Analysis::BlockCount>().swap(gp->part->params.byBlock);
  gp->part->tensorParallelMemo = std::make_shared<TensorParallelMemo>();
  gp->part->savedMemo = std::make_shared<Analysis::SavedListsMemo>();
  gp->part->layoutFacts = layoutFacts_;
  gp->part->opTimesMemo = opTimes_;
  if (baseGraph && base_.walks)
    gp->part->walks = base_.walks;
  gp->part->plan = nullptr; // analyzeLayout sets each candidate's plan
  return &*gp->part;
}

void AnalysisManager::keepLayoutFacts(size_t keep) {
  layoutFacts_ = keep > 0 ? newLayoutFactsMemo(keep) : nullptr;
  opTimes_ = keep > 0 ? newOpTimesMemo(keep) : nullptr;
}

size_t AnalysisManager::opTimesMade() const { return opTimes_ ? opTimes_->entries.made() : 0; }

size_t AnalysisManager::opTimesReused() const { return opTimes_ ? opTimes_->entries.reused() : 0; }

size_t AnalysisManager::rooflineReused() const { return opTimes_ ? opTimes_->roofline.reused() : 0; }

size_t AnalysisManager::layoutFactsMade() const {
  return layoutFacts_ ? layoutFactsCounts(*layoutFacts_).first : 0;
}

size_t AnalysisManager::layoutFactsReused() const {
  return layoutFacts_ ? layoutFactsCounts(*layoutFacts_).second : 0;
}

std::optional<Analysis> AnalysisManager::layout(const Plan &candidate, bool timed) {
  return layout(candidate, timed, /*final=*/false);
}

std::optional<Analysis> AnalysisManager::layout(const Plan &candidate, bool timed, bool final,
                                                bool checkpointOnly) {
  const Analysis *part = graphPart(candidate, checkpointOnly);
  if (!part)
    return std::nullopt;
  llvm::SourceMgr sm;
  DiagnosticEngine quiet(sm);
  quiet.setOutput(nullptr);
  ++layouts_;
  return analyzeLayout(*part, candidate, quiet, timed, final);
}

void AnalysisManager::priceTime(Analysis &candidate) {
  if (!candidate.timePending)
    return;
  llvm::SourceMgr sm;
  DiagnosticEngine quiet(sm);
  quiet.setOutput(nullptr);
  priceLayoutTime(candidate, quiet);
}

std::optional<Trial> AnalysisManager::trial(const Plan &candidate, bool checkpointOnly) {
  // A trial priced without its time answers only a memory-only request.
  for (const auto &[plan, trial] : done_)
    if (samePricing(plan, candidate) && (!trial || trial->timed || memoryOnly_))
      return trial;
  std::optional<Trial> out;
  // An untimed trial is read here and dropped: its time is never priced (a timed request
  // analyses the candidate again), so it makes no schedule.
  if (std::optional<Analysis> a = layout(candidate, !memoryOnly_, /*final=*/memoryOnly_, checkpointOnly)) {
    out = trialOf(*a);
    out->timed = !a->timePending;
  }
  // A timed trial replaces the untimed one of the same candidate.
  done_.erase(std::remove_if(done_.begin(), done_.end(),
                             [&](const auto &d) { return samePricing(d.first, candidate); }),
              done_.end());
  done_.push_back({candidate, out});
  return out;
}

} // namespace tally
