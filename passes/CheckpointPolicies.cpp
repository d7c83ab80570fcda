// Step 2 of the activation-memory pass (passes/Activations.cpp): the checkpoint policies —
// which repeat copies are recomputed, in which segments, and which single ops re-run alone.
// none keeps everything; full re-runs every copy alone; every(k) all copies in segments of k;
// sqrt the segment length whose walk needs the least memory; keep [paths] each copy less the
// listed blocks or ops; selective and selective_wide single cheap ops (alone or with a block
// policy); recompute_all every copy from the first copy's input; auto the least recompute time
// that fits the memory limit (nested recomputation: passes/CheckpointNested.cpp).
#include "passes/ActivationsInternal.h"

#include <cmath>
#include <cstring>
#include <map>

namespace tally {
namespace activations {

/// An op re-run alone before its backward: `selective` is Megatron's (Korthikanti et al.
/// 2022, "selective activation recomputation"): only the attention core — QKᵀ, softmax,
/// dropout and AV, tally's unfused attention op with its score, softmax and dropout buffers.
/// `selective_wide` (tally's, after llm.c) adds GELU/SiLU (the next matmul keeps their output)
/// and layer/RMS norms (the next matmul keeps theirs). Either only when the op's output is kept
/// by another op's backward and every activation it reads is kept for some backward anyway,
/// so re-running it holds nothing longer.
bool selectable(const Facts &f, OpId o, bool wide) {
  const Op &op = f.g.ops[o];
  bool core = op.kind == OpKind::Attention && !op.attrs->fused;
  bool cheap = op.kind == OpKind::Gelu || op.kind == OpKind::GeluTanh || op.kind == OpKind::Silu ||
               op.kind == OpKind::LayerNorm || op.kind == OpKind::RmsNorm;
  bool kind = core || (wide && cheap);
  if (!kind || !f.hasBackward[o] || op.outputs.empty())
    return false;
  bool keptByOther = false;
  for (TensorId t : op.outputs)
    for (OpId s : f.savers[f.g.storageOf(t)])
      keptByOther = keptByOther || s != o;
  if (!keptByOther)
    return false;
  for (TensorId t : op.inputs) {
    TensorId s = f.g.storageOf(t);
    if (f.isActivation(s) && f.savers[s].empty())
      return false;
  }
  return true;
}

/// `selective` (the attention core, Megatron's) or `selective_wide` (with GELU, SiLU, norms).
Policy selectivePolicy(const Facts &f, bool wide) {
  Policy p;
  p.name = wide ? "selective_wide" : "selective";
  p.selectiveKeepsOutputs = !wide;
  std::lock_guard<std::mutex> hold(f.structure->selectiveLock);
  std::optional<std::vector<OpId>> &ops = f.structure->selectiveOps[wide];
  if (!ops) {
    ops.emplace();
    for (OpId o = 0; o < f.g.ops.size(); ++o)
      if (selectable(f, o, wide))
        ops->push_back(o);
  }
  p.selectiveOps = *ops;
  return p;
}

/// Whether `recompute_all` can schedule this graph: the copies' ops follow one another in op
/// order (copy c's before copy c + 1's) with no other op between the first and the last.
bool copiesContiguous(const Facts &f) {
  if (f.copies.empty())
    return false;
  OpId next = f.copies.front().ops.front();
  for (const Copy &c : f.copies)
    for (OpId o : c.ops)
      if (o != next++)
        return false;
  return true;
}

/// Everything per device that does not depend on the schedule: the model states, the
/// gradient-accumulation buffer, ZeRO's gathered parameters and unsharded gradients, the CUDA context, the communication buffers and the CUDA
/// step's workspace.
double staticBytes(const Analysis &a) {
  return a.memory.params + a.memory.grads + a.memory.master + a.memory.optimizer +
         a.memory.gradAccum + a.memory.fp8Weights + a.memory.fp8Meta + a.memory.zeroGathered +
         a.memory.unshardedGrads + unallocatedBytes(a);
}

namespace {

/// The memory per device that activations and workspace may use: the target's memory, or a
/// smaller `memory per device <=` budget, minus the model states and the framework memory:
/// (capacity − context − comm buffers) / (1 + allocator reserve) − the allocated states.
double activationLimit(const Analysis &a) {
  const Plan &plan = *a.plan;
  double capacity = memoryLimit(plan);
  double fixed = unallocatedBytes(a);
  return (capacity - fixed) / (1 + reserveFraction(plan)) - (staticBytes(a) - fixed);
}

/// Segments of `k` consecutive copies over the first `m` copies (the last may be shorter).
Policy segmentedPolicy(std::string name, size_t m, size_t k) {
  Policy p;
  p.name = std::move(name);
  k = std::max<size_t>(1, k);
  for (size_t c = 0; c < m; c += k)
    p.segments.push_back({c, std::min(m, c + k)});
  return p;
}

} // namespace

/// The first m copies, one per segment: none (m = 0), partial, full (m = L).
Policy partialPolicy(size_t m, size_t copies) {
  return segmentedPolicy(m == 0 ? "none" : m == copies ? "full" : "partial", m, 1);
}

namespace {

/// The given copies (ascending), one per segment.
Policy chosenPolicy(std::string name, const std::vector<size_t> &chosen, size_t copies) {
  Policy p;
  p.name = chosen.empty() ? "none" : chosen.size() == copies ? "full" : std::move(name);
  for (size_t c : chosen)
    p.segments.push_back({c, c + 1});
  return p;
}

/// `every(k)`: all L copies in segments of k (k ≥ L: one segment of all of them).
Policy everyPolicy(const std::string &name, size_t copies, size_t k) {
  return segmentedPolicy(name, copies, std::min(std::max<size_t>(1, k), copies));
}

/// The segment length of "every(k)" (0 when the text is not that form; Sema checked it).
size_t everyLength(const std::string &req) {
  if (req.rfind("every(", 0) != 0 || req.size() < 8 || req.back() != ')')
    return 0;
  std::string digits = req.substr(6, req.size() - 7);
  if (digits.empty() || digits.size() > 19 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return 0;
  return static_cast<size_t>(std::stoull(digits));
}

/// `sqrt`: every copy checkpointed, in segments of the length k in 1..L whose walk needs the
/// least activations + workspace per device (ties: less recompute time, then the shorter
/// segment). Chen et al. (2016) choose k ≈ √(L·x/A) for blocks keeping A bytes on an input of
/// x bytes; measuring the real buffers' walks finds that minimum without trusting the model.
/// Candidates: every k up to kSqrtAllLengths copies; beyond, only the least k of each segment
/// count ⌈L/k⌉ (about 2√L of them: the same inputs kept, the shortest segments).
/// Up to kSqrtWalkAll candidates every one is walked. Beyond, a walk costs O(ops) and walking
/// 2√L of them made sqrt — and the device-memory fixes that try it — grow as L^1.5 (200
/// walks, 20 s, for 10,000 GPT blocks), so: three walks (k = 1, the middle candidate, k = L)
/// fit bytes(k) = c + x·⌈L/k⌉ + A·k, the fit's best candidate is walked with kSqrtWindow
/// neighbours each side, and the window moves toward any better neighbour until the best
/// walked candidate has kSqrtWindow walked neighbours on each side no better than it. The
/// answer is the best of the walked candidates: exact when bytes(k) over the candidates has
/// no local minimum wider than the window apart from the global one (the test compares
/// against every(k) for every k).
constexpr size_t kSqrtAllLengths = 64;
constexpr size_t kSqrtWalkAll = 24;
constexpr size_t kSqrtWindow = 3;

Policy sqrtPolicy(const Facts &f, const Analysis &a) {
  size_t L = f.copies.size();
  std::vector<size_t> ks;
  for (size_t k = 1; k <= L; ++k)
    if (L <= kSqrtAllLengths || k == 1 || (L + k - 2) / (k - 1) != (L + k - 1) / k)
      ks.push_back(k);
  struct Tried {
    bool done = false;
    double bytes = 0, time = 0;
  };
  std::vector<Tried> tried(ks.size());
  auto at = [&](size_t i) -> const Tried & {
    if (!tried[i].done) {
      Walk w = compareWalk(f, a, segmentedPolicy("sqrt", L, ks[i]));
      tried[i] = {true, deviceBytes(w, *a.plan), w.recomputeTime};
    }
    return tried[i];
  };
  // Strictly better; equal candidates keep the shorter segment (the lower index).
  auto better = [&](size_t i, size_t j) {
    const Tried &x = at(i), &y = at(j);
    return x.bytes < y.bytes || (x.bytes == y.bytes && x.time < y.time);
  };
  size_t n = ks.size();
  if (n <= kSqrtWalkAll) {
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
      if (better(i, best))
        best = i;
    return segmentedPolicy("sqrt", L, ks[best]);
  }
  // The fit: three walks, three unknowns (segments = ⌈L/k⌉).
  size_t mid = n / 2;
  auto segs = [&](size_t i) { return static_cast<double>((L + ks[i] - 1) / ks[i]); };
  double s0 = segs(0), s1 = segs(mid), s2 = segs(n - 1);
  double k0 = static_cast<double>(ks[0]), k1 = static_cast<double>(ks[mid]),
         k2 = static_cast<double>(ks[n - 1]);
  double y0 = at(0).bytes, y1 = at(mid).bytes, y2 = at(n - 1).bytes;
  // Subtract the third equation: (s0 − s2)·x + (k0 − k2)·A = y0 − y2, likewise for 1.
  double a11 = s0 - s2, a12 = k0 - k2, b1 = y0 - y2;
  double a21 = s1 - s2, a22 = k1 - k2, b2 = y1 - y2;
  double det = a11 * a22 - a12 * a21;
  size_t guess = mid;
  if (det != 0 && std::isfinite(det)) {
    double x = (b1 * a22 - a12 * b2) / det, A = (a11 * b2 - b1 * a21) / det;
    double bestFit = INFINITY;
    for (size_t i = 0; i < n; ++i) {
      double fit = x * segs(i) + A * static_cast<double>(ks[i]);
      if (fit < bestFit)
        bestFit = fit, guess = i;
    }
  }
  // The window search around the guess.
  size_t lo = guess > kSqrtWindow ? guess - kSqrtWindow : 0;
  size_t hi = std::min(n - 1, guess + kSqrtWindow);
  for (;;) {
    size_t best = lo;
    for (size_t i = lo + 1; i <= hi; ++i)
      if (better(i, best))
        best = i;
    bool moved = false;
    if (best < lo + kSqrtWindow && lo > 0)
      lo = best > kSqrtWindow ? best - kSqrtWindow : 0, moved = true;
    if (best + kSqrtWindow > hi && hi < n - 1)
      hi = std::min(n - 1, best + kSqrtWindow), moved = true;
    if (!moved)
      break;
  }
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (tried[i].done && better(i, best))
      best = i;
  return segmentedPolicy("sqrt", L, ks[best]);
}

/// `auto`: the least recompute time whose activations + workspace per device fit the limit,
/// over two families of single-copy segments: the first m copies (graph order), and the m
/// copies that save the most bytes per second of recompute (ranked: a copy's saved bytes
/// less the input it keeps, over the roofline time of its forward). Each family is searched
/// for its least fitting m by bisection (checkpointing one more copy never adds memory); the
/// fitting candidate with less recompute time wins, against selective (single cheap ops).
/// When none fits, sqrt (all copies, the segment length with the least memory), then
/// recompute_all (up to 256 copies), then the smallest footprint seen. Fills the trade-off
/// curve on the way.
Policy choosePolicy(const Facts &f, Analysis &a, StepScale scale) {
  const Plan &plan = *a.plan;
  size_t L = f.copies.size();
  a.checkpoint.limitBytes = activationLimit(a);
  // The ranking: saved bytes net of the kept input, per second of recompute.
  std::vector<double> gain(L, 0), seconds(L, 0);
  for (size_t c = 0; c < L; ++c) {
    gain[c] = a.blockActivations[c].savedBytes - a.blockActivations[c].inputBytes;
    for (OpId o : f.copies[c].ops)
      seconds[c] += f.opTime[o];
  }
  std::vector<size_t> ranked(L);
  for (size_t c = 0; c < L; ++c)
    ranked[c] = c;
  std::stable_sort(ranked.begin(), ranked.end(), [&](size_t x, size_t y) {
    // gain[x] / seconds[x] > gain[y] / seconds[y], without dividing by a zero time.
    return gain[x] * seconds[y] > gain[y] * seconds[x];
  });
  bool sameOrder = true;
  for (size_t c = 0; c < L; ++c)
    sameOrder = sameOrder && ranked[c] == c;

  struct Measured {
    Policy policy;
    double bytes = 0, time = 0;
  };
  auto record = [&](const Policy &p) {
    Walk w = compareWalk(f, a, p);
    Measured m{p, deviceBytes(w, plan), w.recomputeTime};
    a.checkpoint.options.push_back({p.name, static_cast<int64_t>(p.checkpointed()),
                                    w.recomputeFlops * scale.flops, m.bytes,
                                    w.recomputeTime * scale.seconds});
    return m;
  };
  // Walks are O(ops) each; memoize per family so the curve and the search share work.
  std::map<size_t, Measured> firstAt, rankedAt;
  auto measure = [&](bool byRank, size_t m) -> const Measured & {
    std::map<size_t, Measured> &memo = byRank ? rankedAt : firstAt;
    auto it = memo.find(m);
    if (it != memo.end())
      return it->second;
    Policy p;
    if (byRank) {
      std::vector<size_t> chosen(ranked.begin(), ranked.begin() + static_cast<long>(m));
      std::sort(chosen.begin(), chosen.end());
      p = chosenPolicy("ranked", chosen, L);
    } else {
      p = partialPolicy(m, L);
    }
    return memo.emplace(m, record(p)).first->second;
  };
  // 1. The trade-off curve: store-all, full, and evenly spaced counts in between (at most
  //    kCurvePoints walks, so the curve costs O(ops), not O(L · ops)).
  constexpr size_t kCurvePoints = 16;
  size_t stride = std::max<size_t>(1, (L + kCurvePoints - 1) / kCurvePoints);
  for (size_t m = 0; m < L; m += stride)
    measure(false, m);
  const Measured full = measure(false, L);
  // 2. Per family, the least m that fits, by bisection.
  std::optional<Measured> chosen;
  auto search = [&](bool byRank) {
    if (full.bytes > a.checkpoint.limitBytes)
      return;
    size_t lo = 0, hi = L; // bytes(hi) fits; find the least such m
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (measure(byRank, mid).bytes <= a.checkpoint.limitBytes)
        hi = mid;
      else
        lo = mid + 1;
    }
    const Measured &m = measure(byRank, hi);
    if (!chosen || m.time < chosen->time)
      chosen = m;
  };
  search(false);
  if (!sameOrder)
    search(true);
  Measured smallest = full;
  for (const auto *memo : {&firstAt, &rankedAt})
    for (const auto &kv : *memo)
      if (kv.second.bytes < smallest.bytes)
        smallest = kv.second;
  auto consider = [&](const Policy &p) {
    Measured m = record(p);
    if (m.bytes <= a.checkpoint.limitBytes && (!chosen || m.time < chosen->time))
      chosen = m;
    if (m.bytes < smallest.bytes)
      smallest = m;
  };
  // 3. selective re-runs single cheap ops: when it fits it often costs less than any block.
  //    Megatron's (the attention core) first, then the wide form (norms, GELU/SiLU too).
  for (bool wide : {false, true})
    if (!chosen || chosen->time > 0) {
      Policy sel = selectivePolicy(f, wide);
      if (!sel.selectiveOps.empty())
        consider(sel);
    }
  // 4. sqrt recomputes as much as full (every block once), so it comes after full; then
  //    recompute_all, O(1) blocks for L(L+1)/2 block forwards (up to kAutoRecomputeAll
  //    copies: its schedule grows as L²).
  constexpr size_t kAutoRecomputeAll = 256;
  // 5. nested recomputation (the chain program): fewer re-runs than sqrt or recompute_all
  //    when no single level fits, and the best mix of kept and re-run copies of different
  //    sizes when one does.
  if (!chosen || chosen->time > 0)
    if (std::optional<Policy> nested = nestedPolicy(f, a, a.checkpoint.limitBytes))
      consider(*nested);
  if (L > 0 && !chosen)
    consider(sqrtPolicy(f, a));
  if (L > 0 && !chosen && L <= kAutoRecomputeAll && copiesContiguous(f)) {
    Policy all = segmentedPolicy("recompute_all", L, L);
    all.fromInput = true;
    consider(all);
  }
  std::stable_sort(a.checkpoint.options.begin(), a.checkpoint.options.end(),
                   [](const auto &x, const auto &y) { return x.recomputeFlops < y.recomputeFlops; });
  return chosen ? chosen->policy : smallest.policy;
}

/// A block policy combined with selective (`full + selective`, `full + selective_wide`): the
/// block policy's segments, and selective's ops outside them (inside a recomputed copy nothing
/// is kept, so there is nothing left to re-run alone): the copies left stored and the ops
/// outside the copies.
Policy withSelective(const Facts &f, Policy blocks, bool wide) {
  std::vector<bool> inSegment(f.g.ops.size(), false);
  for (const auto &sg : blocks.segments)
    for (size_t c = sg.first; c < sg.second && c < f.copies.size(); ++c)
      for (OpId o : f.copies[c].ops)
        inSegment[o] = true;
  for (const auto &ops : blocks.opSegments)
    for (OpId o : ops)
      inSegment[o] = true;
  for (OpId o : selectivePolicy(f, wide).selectiveOps)
    if (!inSegment[o])
      blocks.selectiveOps.push_back(o);
  blocks.name += wide ? " + selective_wide" : " + selective";
  blocks.selectiveKeepsOutputs = !wide;
  return blocks;
}

/// `keep [h[0], h[4].mlp]`: the ops under the listed paths keep what their backward needs;
/// the rest of each repeat copy is one segment, re-run before its first backward step (a copy
/// none of whose ops is listed is checkpointed as `full` does). A path that names no op is an
/// error (a.checkpoint.error, reported by checkBudgets at the checkpoint setting).
Policy keepPolicy(const Facts &f, Analysis &a, const std::string &req) {
  llvm::StringRef list = llvm::StringRef(req).drop_front(strlen("keep ["));
  list.consume_back("]");
  llvm::SmallVector<llvm::StringRef, 8> parts;
  list.split(parts, ", ");
  std::vector<bool> kept(f.g.ops.size(), false);
  Policy p;
  p.name = "keep";
  for (llvm::StringRef path : parts) {
    a.checkpoint.saved.push_back(path.str());
    bool found = false;
    for (OpId o = 0; o < f.g.ops.size(); ++o) {
      std::string opPath = f.g.opPath(o);
      llvm::StringRef op = opPath;
      if (op.startswith(path) && (op.size() == path.size() || op[path.size()] == '.' ||
                                  op[path.size()] == '[')) {
        kept[o] = true;
        found = true;
      }
    }
    if (!found && a.checkpoint.error.empty())
      a.checkpoint.error = "checkpoint keep list names '" + path.str() +
                           "', which is no block or op of model " + f.g.model;
  }
  for (const Copy &c : f.copies) {
    std::vector<OpId> rest;
    for (OpId o : c.ops)
      if (!kept[o])
        rest.push_back(o);
    if (!rest.empty())
      p.opSegments.push_back(std::move(rest));
  }
  return p;
}

} // namespace

Policy requestedPolicy(const Facts &f, Analysis &a, StepScale scale, std::string req) {
  for (bool wide : {false, true}) {
    llvm::StringRef with = wide ? " + selective_wide" : " + selective";
    if (llvm::StringRef(req).endswith(with)) {
      req.resize(req.size() - with.size());
      return withSelective(f, requestedPolicy(f, a, scale, req), wide);
    }
  }
  size_t L = f.copies.size();
  if (a.plan->isTrain && req == "auto")
    return choosePolicy(f, a, scale);
  if (!a.plan->isTrain || req == "none")
    return Policy();
  if (req == "selective" || req == "selective_wide")
    return selectivePolicy(f, req == "selective_wide"); // per op: needs no repeat blocks
  if (L == 0) {
    a.checkpoint.note = "checkpoint = " + req +
                        " has nothing to checkpoint: the model has no repeat blocks, so every "
                        "activation is kept";
    return Policy();
  }
  if (size_t k = everyLength(req))
    return everyPolicy(req, L, k);
  if (llvm::StringRef(req).startswith("keep ["))
    return keepPolicy(f, a, req);
  if (req == "recompute_all") {
    if (!copiesContiguous(f)) {
      a.checkpoint.note = "checkpoint = recompute_all needs the repeat copies to run one after "
                          "another with no other op between them; full checkpointing is "
                          "applied instead";
      return partialPolicy(L, L);
    }
    Policy p = segmentedPolicy("recompute_all", L, L);
    p.fromInput = true;
    return p;
  }
  return req == "sqrt" ? sqrtPolicy(f, a) : partialPolicy(L, L);
}

} // namespace activations
} // namespace tally
