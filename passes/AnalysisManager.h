// The analysis manager: the analyses of one base plan's what-if candidates (another checkpoint
// policy, micro-batch, ZeRO stage, layout, device count, target), computed on demand and
// cached by what they depend on, as LLVM's new pass manager caches analyses by IR unit:
//  - the lowered graph and its graph-only passes (parameters, op costs, the backward:
//    analyzeGraph) by the candidate's lowering key, precision and optimizer;
//  - the layout passes (static memory, activations, roofline, step time: analyzeLayout) by
//    everything else a candidate changes, answered from memory when a search asks again.
// The budget fixes, the micro-batch and device searches and the layout search all ask it, so
// none of them keeps its own tables of graphs (docs/design.md, "Analyses on demand").
#pragma once

#include "ir/Plan.h"
#include "passes/Analysis.h"
#include "passes/Passes.h"

#include <cstddef>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

namespace tally {

/// The numbers of one candidate plan, from a full analysis of it.
struct Trial {
  double peak = 0;             ///< memory per device at peak, bytes
  double activations = 0;      ///< activation bytes at the peak
  double stepFlops = 0;        ///< model FLOPs per step
  double executedFlops = 0;    ///< executed FLOPs per step (recompute included)
  double stepTime = 0, runTime = 0, mfu = 0; ///< seconds, seconds, fraction
  /// Whether the time was priced: false for a train candidate priced while the manager is
  /// memoryOnly (its stepTime, runTime and mfu are then 0).
  bool timed = true;
};

/// The numbers a search compares, from a candidate's analysis.
Trial trialOf(const Analysis &t);

/// Do `a` and `b` lower to the same graph? Lowering reads only their LoweringKey.
bool sameGraph(const Plan &a, const Plan &b);

/// Analyzes `candidate`, a changed copy of `base`'s plan: re-lowers the model when the graph
/// depends on what changed (micro-batch, sequence length) and reuses `base`'s graph otherwise.
/// Diagnostics of the attempt are not shown and its budgets are not checked. Nullopt when the
/// graph must be re-lowered and `relower` is empty or fails. One whole what-if analysis per
/// call: the searches use an AnalysisManager; this is the reference the tests compare it with.
std::optional<Trial> tryPlan(const Analysis &base, const Plan &candidate, const Relower &relower);

/// The analyses of candidate plans, each a changed copy of one base analysis's plan, sharing
/// work between them: the graph-only passes run once per distinct lowered graph (the base's
/// graph, step and liveness walks are reused where the candidate's equal them) and only the
/// passes that price a layout run per candidate (analyzeLayout: the same memory and time as
/// analyze); a candidate asked for before is answered from memory. A budget's fixes on a
/// 10,000-layer model tried about 20 plans, each a whole analysis with the backward rebuilt
/// (issue 12). Same answers as tryPlan.
class AnalysisManager {
public:
  /// `keepGraphs`: how many re-lowered graphs stay cached besides the base's. A search that
  /// moves from one micro-batch to the next and does not come back needs one (a 10,000-layer
  /// graph with its backward is about 0.9 GB); the layout search, which tries every
  /// micro-batch under each layout, keeps them all.
  AnalysisManager(const Analysis &base, Relower relower, size_t keepGraphs = 1);
  ~AnalysisManager();
  AnalysisManager(const AnalysisManager &) = delete;
  AnalysisManager &operator=(const AnalysisManager &) = delete;

  const Analysis &base() const { return base_; }
  /// The graph part (analyzeGraph) of `candidate`'s graph: the base's graph when they lower
  /// alike, else the model re-lowered for it; null when it must be re-lowered and cannot be.
  /// Its `plan` is null: each analysis copied from it sets its own.
  const Analysis *graphPart(const Plan &candidate) { return graphPart(candidate, false); }
  /// The layout passes for `candidate` on its graph part (analyzeLayout), diagnostics muted;
  /// nullopt when its graph cannot be lowered. Not cached: the caller keeps what it reads.
  /// `timed` false: a train candidate's memory and FLOPs alone (Analysis::timePending), whose
  /// time priceTime adds when the caller needs it.
  std::optional<Analysis> layout(const Plan &candidate, bool timed = true);
  /// The time of a candidate `layout` priced untimed (analyzeLayout, then priceLayoutTime:
  /// the same numbers as a timed layout), diagnostics muted; nothing when it is timed.
  void priceTime(Analysis &candidate);
  /// tryPlan(base, candidate, relower), from the cache when an equal candidate was asked for.
  /// While memoryOnly() is set, a train candidate's time is not priced (Trial::timed false):
  /// its peak, activations and FLOPs are the same (analyzeLayout's `timed`).
  /// `checkpointOnly`: the candidate is the base's plan with another checkpoint policy and
  /// nothing else changed (the caller made it so); its graph part, when none is made yet, is
  /// then the base's as made (Analysis::graphOnly), where there is one.
  std::optional<Trial> trial(const Plan &candidate, bool checkpointOnly = false);
  /// The trials asked for from now on read only memory and FLOPs (the memory fixes: their
  /// checkpoint, micro-batch, ZeRO and device-count candidates), until set back.
  void setMemoryOnly(bool on) { memoryOnly_ = on; }
  bool memoryOnly() const { return memoryOnly_; }
  /// Graphs lowered and differentiated so far (the base's counts as one), graphs re-lowered
  /// (relower called and succeeded) and layouts priced: what the searches cost (tests bound
  /// them).
  int graphsAnalysed() const { return graphsAnalysed_; }
  int graphsLowered() const { return graphsLowered_; }
  int layoutsAnalysed() const { return layouts_; }
  /// Keep the walks' layout facts and the step time's per-op times of the `keep` newest
  /// distinct layouts for the graph parts made from now on (Analysis::layoutFacts,
  /// opTimesMemo): candidates that differ only where those do not (pipeline, interleave,
  /// data, ZeRO, the checkpoint policy) share them. The layout search visits its candidates
  /// so (searchLayouts); 0 keeps none. Each entry is O(ops).
  void keepLayoutFacts(size_t keep);
  /// Layout facts and op times made and read again (tests).
  size_t layoutFactsMade() const;
  size_t layoutFactsReused() const;
  size_t opTimesMade() const;
  size_t opTimesReused() const;
  size_t rooflineReused() const;

private:
  struct GraphPart;
  /// layout, with analyzeLayout's `final`: trial's untimed candidates, never priced again.
  std::optional<Analysis> layout(const Plan &candidate, bool timed, bool final,
                                 bool checkpointOnly = false);
  const Analysis *graphPart(const Plan &candidate, bool checkpointOnly);
  const Analysis &base_;
  Relower relower_;
  size_t keepGraphs_;
  std::vector<std::unique_ptr<GraphPart>> graphs_; ///< the base's and the newest re-lowered
  int graphsAnalysed_ = 0;
  int graphsLowered_ = 0;
  std::vector<std::pair<Plan, std::optional<Trial>>> done_;
  int layouts_ = 0;
  bool memoryOnly_ = false;
  std::shared_ptr<LayoutFactsMemo> layoutFacts_;
  std::shared_ptr<OpTimesMemo> opTimes_;
};

} // namespace tally
