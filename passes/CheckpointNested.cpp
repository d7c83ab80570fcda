// Nested recomputation, one of auto's candidates (step 2 of passes/Activations.cpp): the
// chain of stages over the repeat copies (the ops before them, the copies in groups, the ops
// after them) with each stage's sizes in bytes, the program of CheckpointChain.h solved for a
// memory budget, and its answer written out as a schedule, whose real peak the liveness walk
// (passes/ActivationLiveness.cpp) measures.
#include "passes/ActivationsInternal.h"

#include <cmath>

namespace tally {

namespace activations {

/// Nested recomputation (CheckpointChain.h): the chain's stages are the ops before the repeat
/// copies, the copies (in groups of consecutive copies when there are more than
/// kChainCopies: the program is cubic in the stages), and the ops after them. Per stage, in
/// bytes per device: its input (the activations it reads that the stage before made), what
/// its backward keeps besides its output (activations it makes that a backward keeps, and
/// its ops' extra buffers), its work (its input's gradient and its largest activation's
/// gradient) and its forward's roofline seconds. Activations read by a stage further on than
/// the next (tables made once and read by every copy) are live throughout and come off the
/// budget. The budget is the limit per device in the walk's bytes (pipeline and context
/// shares undone), cut into kChainUnits units, each size rounded up to whole units; the
/// program's schedule is then walked, and the largest budget (of a few, from 1.5× the limit
/// down) whose walk fits is taken: the model is conservative, the walk exact. Needs the
/// copies to run one after another (copiesContiguous).
constexpr size_t kChainCopies = 128;
constexpr double kChainUnits = 100, kChainMaxUnits = 2000;
constexpr double kChainMaxScale = 2.0; ///< the largest budget tried, × the limit

/// The chain, its stages' sizes and the program solved once (docs above), for auto's limit:
/// every budget asked of it later (auto's scale search, the curve's smaller limits) is read
/// off the same solution.
struct Chain {
  std::vector<std::pair<OpId, OpId>> ranges; ///< per stage: its ops [lo, hi)
  std::vector<std::vector<OpId>> selOps;     ///< per stage: its selectable ops
  double unit = 0;                           ///< bytes per unit
  std::shared_ptr<const ChainSolution> solution;
};

namespace {

/// The walk's bytes that a per-device limit allows (pipeline and context shares undone).
double rawBytes(const Analysis &a, double limit) {
  return limit * contextShare(*a.plan) / std::max(1.0, pipelineFactor(*a.plan));
}

} // namespace
} // namespace activations

/// The chain's stages as the facts decide them, in bytes (buildChain's docs above); the unit
/// and the program depend on the limit too.
struct ChainParts {
  std::vector<std::pair<OpId, OpId>> ranges;
  std::vector<std::vector<OpId>> selOps;
  std::vector<double> input, kept, work, seconds, keptSel, selSeconds;
};

namespace activations {
namespace {

std::optional<ChainParts> buildChainParts(const Facts &f, const Analysis &a) {
  const Graph &g = f.g;
  size_t n = g.ops.size(), L = f.copies.size();
  if (L < 2 || !copiesContiguous(f))
    return std::nullopt;
  OpId first = f.copies.front().ops.front(), last = f.copies.back().ops.back();
  std::vector<std::pair<OpId, OpId>> ranges; // [lo, hi)
  if (first > 0)
    ranges.push_back({0, first});
  size_t group = (L + kChainCopies - 1) / kChainCopies;
  for (size_t c = 0; c < L; c += group)
    ranges.push_back({f.copies[c].ops.front(), f.copies[std::min(L, c + group) - 1].ops.back() + 1});
  if (last + 1 < n)
    ranges.push_back({last + 1, static_cast<OpId>(n)});
  size_t S = ranges.size();
  std::vector<uint32_t> stageOf(n, 0);
  std::vector<double> input(S, 0), kept(S, 0), seconds(S, 0);
  for (size_t s = 0; s < S; ++s)
    for (OpId o = ranges[s].first; o < ranges[s].second; ++o) {
      stageOf[o] = static_cast<uint32_t>(s);
      seconds[s] += f.opTime[o];
    }
  for (TensorId t = 0; t < g.tensors.size(); ++t) {
    OpId p = g.tensors[t].producer;
    if (g.storageOf(t) != t || !f.isActivation(t) || p == kNone)
      continue;
    uint32_t sp = stageOf[p];
    bool next = false, keptByBackward = false;
    for (OpId r : f.readers[t])
      next = next || stageOf[r] == sp + 1;
    for (OpId s : f.savers[t])
      keptByBackward = keptByBackward || f.hasBackward[s];
    double bytes = f.bytes(t);
    if (next)
      input[sp + 1] += bytes;
    else if (keptByBackward)
      kept[sp] += bytes;
  }
  for (OpId o = 0; o < n; ++o) {
    if (!f.hasBackward[o])
      continue;
    double divisor = f.opSplit(g.ops[o]) ? f.tensorDegree : 1;
    for (uint32_t k : f.extras.of(o))
      kept[stageOf[o]] += a.savedOf(o)[k].bytes / divisor;
  }
  // The select option: a stage's selectable ops (selective's), what dropping their outputs
  // and extra buffers between the forward and the backward saves, and their re-run's seconds.
  std::vector<std::vector<OpId>> selOps(S);
  std::vector<double> keptSel = kept, selSeconds(S, 0);
  for (OpId o = 0; o < n; ++o) {
    if (!selectable(f, o, /*wide=*/true))
      continue;
    uint32_t st = stageOf[o];
    selOps[st].push_back(o);
    selSeconds[st] += f.opTime[o];
    for (TensorId t : f.writes.of(o)) {
      bool next = false;
      for (OpId r : f.readers[t])
        next = next || stageOf[r] == st + 1;
      if (!next) // kept in the stage (selectable: another op's backward keeps it)
        keptSel[st] -= f.bytes(t);
    }
    double divisor = f.opSplit(g.ops[o]) ? f.tensorDegree : 1;
    for (uint32_t k : f.extras.of(o))
      keptSel[st] -= a.savedOf(o)[k].bytes / divisor;
  }
  // A stage's work, measured: in the walk of `none`, the most bytes live during the stage's
  // steps less what the stages before it keep (their kept bytes and outputs) and its own.
  // This counts the gradients in flight, transients and long-lived tensors as the walk does,
  // so the model's store-all plan needs exactly what the walk finds.
  std::vector<double> work(S, 0);
  {
    Walk none = walk(f, a, Policy(), true);
    std::vector<double> delta(none.schedule.size() + 1, 0);
    for (const Buffer &b : none.buffers) {
      delta[b.first] += b.size;
      delta[b.last + 1] -= b.size;
    }
    std::vector<double> most(S, 0);
    double live = 0;
    for (size_t i = 0; i < none.schedule.size(); ++i) {
      live += delta[i];
      uint32_t st = stageOf[none.schedule[i].op];
      most[st] = std::max(most[st], live);
    }
    double below = 0; // kept bytes and outputs of the stages before
    for (size_t s = 0; s < S; ++s) {
      double output = s + 1 < S ? input[s + 1] : 0;
      work[s] = std::max(0.0, most[s] - below - kept[s] - output);
      below += kept[s] + output;
    }
  }
  return ChainParts{std::move(ranges), std::move(selOps), std::move(input), std::move(kept),
                    std::move(work), std::move(seconds), std::move(keptSel), std::move(selSeconds)};
}

/// The chain for a limit: its parts (from the walk memo's variant when the facts were seen),
/// its unit, and the program solved for budgets up to kChainMaxScale × the limit — or a
/// solution already solved with the same unit for at least that budget (the program's cell
/// for a budget does not depend on the largest budget solved: ChainSolution).
std::optional<Chain> buildChain(const Facts &f, const Analysis &a, double limit) {
  if (limit <= 0)
    return std::nullopt;
  std::shared_ptr<const ChainParts> shared;
  if (f.walked && f.walked->chainPartsBuilt) {
    shared = f.walked->chainParts;
  } else {
    if (std::optional<ChainParts> p = buildChainParts(f, a))
      shared = std::make_shared<const ChainParts>(std::move(*p));
    if (f.walked) {
      f.walked->chainParts = shared;
      f.walked->chainPartsBuilt = true;
    }
  }
  if (!shared)
    return std::nullopt;
  const ChainParts &parts = *shared;
  const std::vector<double> &input = parts.input, &kept = parts.kept, &work = parts.work;
  size_t S = parts.ranges.size();
  double raw = rawBytes(a, limit);
  // The unit: an eighth of the smallest stage input, so that sizes made of whole inputs (the
  // usual case: activations of one [batch, seq, d] shape and its multiples) are exact; coarser
  // when the budget would need more than kChainMaxUnits of them (sizes then round up).
  double smallest = 0;
  for (double x : input)
    if (x > 0 && (smallest == 0 || x < smallest))
      smallest = x;
  double unit0 = smallest > 0 ? smallest / 8 : raw / kChainUnits;
  if (raw / unit0 > kChainMaxUnits)
    unit0 = raw / kChainMaxUnits;
  Chain chain;
  chain.ranges = parts.ranges;
  chain.selOps = parts.selOps;
  chain.unit = unit0;
  if (!(unit0 > 0))
    return chain;
  auto memory = static_cast<int64_t>(std::floor(kChainMaxScale * raw / unit0));
  if (f.walked && f.walked->chainSolution && f.walked->chainUnit == unit0 &&
      f.walked->chainSolution->memory() >= memory) {
    chain.solution = f.walked->chainSolution;
    return chain;
  }
  auto units = [&](double bytes) { return static_cast<int64_t>(std::ceil(bytes / unit0)); };
  std::vector<ChainStage> stages(S);
  for (size_t s = 0; s < S; ++s)
    stages[s] = {units(input[s]), units(kept[s]), units(work[s]), parts.seconds[s],
                 units(std::max(0.0, parts.keptSel[s])), parts.selSeconds[s]};
  chain.solution = std::make_shared<const ChainSolution>(std::move(stages), memory);
  if (f.walked) {
    f.walked->chainUnit = unit0;
    f.walked->chainSolution = chain.solution;
    ++f.walked->chainSolves;
  }
  return chain;
}

} // namespace

std::optional<Policy> nestedPolicy(const Facts &f, const Analysis &a, double limit,
                                   bool searchUp) {
  if (!f.chain)
    f.chain = std::make_shared<std::optional<Chain>>(buildChain(f, a, a.checkpoint.limitBytes));
  if (!*f.chain || !(*f.chain)->solution || limit <= 0)
    return std::nullopt;
  const Chain &chain = **f.chain;
  const Plan &plan = *a.plan;
  size_t n = f.g.ops.size();
  double raw = rawBytes(a, limit);
  // One budget: the program's schedule, if the program finds one, and whether its walk fits.
  struct Attempt {
    bool feasible = false, fits = false;
    Policy policy;
    double time = 0;
  };
  auto attempt = [&](double scale) {
    Attempt at;
    int64_t total = std::min(static_cast<int64_t>(std::floor(raw * scale / chain.unit)),
                             chain.solution->memory());
    if (total < 1)
      return at;
    ChainPlan cp = chain.solution->plan(total);
    if (!(at.feasible = cp.feasible))
      return at;
    Policy &p = at.policy;
    p.name = "nested";
    std::vector<bool> ran(n, false), again(n, false);
    for (const ChainAction &act : cp.actions) {
      auto [lo, hi] = chain.ranges[act.stage];
      if (act.kind == ChainAction::Forward) {
        for (OpId o = lo; o < hi; ++o) {
          p.steps.push_back({ran[o] ? ScheduleStep::Recompute : ScheduleStep::Forward, o});
          again[o] = again[o] || ran[o];
          ran[o] = true;
        }
      } else if (act.kind == ChainAction::Reselect) {
        for (OpId o : chain.selOps[act.stage])
          p.steps.push_back({ScheduleStep::Recompute, o});
        p.reselected += chain.selOps[act.stage].size();
      } else {
        for (OpId o = hi; o-- > lo;)
          if (f.hasBackward[o])
            p.steps.push_back({ScheduleStep::Backward, o});
      }
    }
    for (const Copy &c : f.copies)
      p.recomputedCopies += again[c.ops.front()];
    Walk w = compareWalk(f, a, p);
    at.fits = deviceBytes(w, plan) <= limit;
    at.time = w.recomputeTime;
    return at;
  };
  // The model is conservative, so the budget it is given may exceed the limit: from 1×, up
  // while the walk still fits, else down until it fits (a smaller budget never does better
  // than an infeasible one). The fitting attempt with the least recompute time wins.
  std::optional<Attempt> best;
  auto keep = [&](Attempt at) {
    if (at.fits && (!best || at.time < best->time))
      best = std::move(at);
  };
  Attempt at1 = attempt(1.0);
  bool up = at1.fits, feasible = at1.feasible;
  keep(std::move(at1));
  if (up && searchUp) {
    for (double scale : {1.15, 1.3, 1.5, 1.75, 2.0}) {
      Attempt at = attempt(scale);
      if (!at.fits)
        break;
      keep(std::move(at));
    }
  } else if (feasible) {
    for (double scale : {0.9, 0.8, 0.65, 0.5, 0.4}) {
      Attempt at = attempt(scale);
      if (!at.feasible || at.fits) {
        keep(std::move(at));
        break;
      }
    }
  }
  if (best)
    return best->policy;
  return std::nullopt;
}

} // namespace activations
} // namespace tally
