// The periodic walk (issue 41, item 1 in part): a comparison walk (steps 3-5 for the peak and
// the recompute only: the trade-off curve, auto's and sqrt's candidates, the budget fixes) of a
// policy that checkpoints copies in segments, priced from a smaller model instead of the whole.
//
// When the copies of a repeated block are the same in everything a walk reads (PeriodicCopies:
// compared exactly, once per walk-memo variant) and the policy treats a run of them alike (R
// periods of g copies: R segments of g copies each, or R copies in no segment, g = 1), the live
// bytes at a step of period j of that run are A(q) + j·E, q the step's place in its period: the
// periods before it keep E bytes each for their backward (the forward adds E per period, the
// backward takes it off), and what else is live (the period's own buffers, its neighbours'
// inputs and gradients, the other blocks' kept bytes) is the same in every period two or more
// periods from the run's ends. So the walk leaves out P whole periods from the middle of each
// run (two like periods kept on each side, whose copies are compared too): a kept step after
// the left-out forward and before the left-out backward has P·E bytes more in the whole model,
// any other kept step the same bytes, and no left-out step is the first with the most bytes
// (its period's neighbour on the later side has E·(1 period) more, or as many earlier). E is
// measured in the smaller model's walk across each cut (the same at three places of the
// period, and the forward's and backward's summing to zero, or the whole walk is made), and
// every byte count is a whole number below 2^52, so the peak, its step (counted in the whole
// schedule) and its Saved and other bytes are exactly the whole walk's. The re-run FLOPs and
// seconds are summed over the whole schedule's Recompute steps in its order, as walk() does.
// A policy or model this does not cover (selective ops, keep lists, nested or recompute_all
// schedules, copies not alike, runs too short) gets the whole walk.
#include "passes/ActivationsInternal.h"

#include <cmath>

namespace tally {
namespace activations {

namespace {

/// The copy a stored tensor belongs to (its producer's), or kNone.
uint32_t ownerOf(const Facts &f, TensorId t) {
  OpId p = f.g.tensors[t].producer;
  return p == kNone || p >= f.copyOfOp.size() ? kNone : f.copyOfOp[p];
}

/// Whether copy c is the same as copy c - 1 (PeriodicCopies), with the strides in `pc` (set
/// by the first copy that is).
bool sameAsBefore(const Facts &f, size_t c, PeriodicCopies &pc) {
  const std::vector<OpId> &a = f.copies[c - 1].ops, &b = f.copies[c].ops;
  size_t K = b.size();
  if (K == 0 || a.size() != K || b.front() != a.front() + K)
    return false;
  for (size_t i = 0; i < K; ++i)
    if (a[i] != a.front() + i || b[i] != b.front() + i)
      return false;
  const FactsStructure &st = *f.structure;
  uint32_t Ek = f.extras.start[b.front()] - f.extras.start[a.front()];
  uint32_t Tk = 0; // found at the first key of copy c - 1 in a list
  auto copyOf = [&](OpId o) { return o == kNone || o >= f.copyOfOp.size() ? kNone : f.copyOfOp[o]; };
  // x in copy c - 1's lists, y in copy c's at the same place.
  auto related = [&](uint32_t x, uint32_t y) {
    uint32_t ox = ownerOf(f, x);
    if (ox == kNone)
      return y == x;
    if (ox != c - 1 && (c < 2 || ox != c - 2))
      return false; // read from further back
    if (Tk == 0) {
      if (y <= x)
        return false;
      Tk = y - x;
    }
    return y == x + Tk && ownerOf(f, y) == ox + 1;
  };
  auto sameList = [&](const FactsStructure::PerOp &l, OpId o, OpId o2) {
    llvm::ArrayRef<uint32_t> x = l.of(o), y = l.of(o2);
    if (x.size() != y.size())
      return false;
    for (size_t i = 0; i < x.size(); ++i)
      if (!related(x[i], y[i]))
        return false;
    return true;
  };
  // A reference from one of copy c - 1's tensors to an op: kNone, or one copy further on.
  auto sameOp = [&](OpId x, OpId y, bool nextToo) {
    if (x == kNone || y == kNone)
      return x == y;
    uint32_t cx = copyOf(x);
    return y == x + K && (cx == c - 1 || (nextToo && cx == c));
  };
  const GradientShares &shares = *st.shares;
  for (size_t i = 0; i < K; ++i) {
    OpId o = a[i], o2 = b[i];
    if (f.hasBackward[o] != f.hasBackward[o2] || f.extraCount(o) != f.extraCount(o2) ||
        f.extras.start[o2] != f.extras.start[o] + Ek)
      return false;
    for (uint32_t k = 0; k < f.extraCount(o); ++k)
      if (f.extraBuffer[f.extras.start[o] + k] != f.extraBuffer[f.extras.start[o2] + k])
        return false;
    if (!sameList(f.reads, o, o2) || !sameList(f.keeps, o, o2) || !sameList(f.writes, o, o2))
      return false;
    llvm::ArrayRef<uint32_t> wx = f.writes.of(o), wy = f.writes.of(o2);
    for (size_t j = 0; j < wx.size(); ++j) {
      TensorId x = wx[j], y = wy[j];
      if (ownerOf(f, x) != c - 1 || f.tensorBuffer[x] != f.tensorBuffer[y] ||
          !sameOp(st.gradProducer[x], st.gradProducer[y], false) ||
          !sameOp(st.gradReader[x], st.gradReader[y], true))
        return false;
      TensorId rx = x < shares.root.size() ? shares.root[x] : kNone;
      TensorId ry = y < shares.root.size() ? shares.root[y] : kNone;
      bool sameRoot = rx == ry || (rx != kNone && ry != kNone && Tk != 0 && ry == rx + Tk &&
                                   (ownerOf(f, rx) == c - 1 || ownerOf(f, rx) == c));
      if (!sameRoot)
        return false;
    }
  }
  if (Tk == 0) // no activation of its own: nothing to shift
    return false;
  if (pc.opStride == 0)
    pc.opStride = static_cast<uint32_t>(K), pc.tensorStride = Tk, pc.extraStride = Ek;
  return pc.opStride == K && pc.tensorStride == Tk && pc.extraStride == Ek;
}

void buildPeriodic(const Facts &f, PeriodicCopies &pc) {
  pc.built = true;
  size_t L = f.copies.size();
  pc.same.assign(L, 0);
  for (size_t c = 1; c < L; ++c)
    pc.same[c] = sameAsBefore(f, c, pc);
  for (size_t c = 1; c < L; ++c) {
    if (!pc.same[c])
      continue;
    if (!pc.runs.empty() && pc.runs.back().second + 1 == c)
      pc.runs.back().second = static_cast<uint32_t>(c);
    else
      pc.runs.emplace_back(static_cast<uint32_t>(c - 1), static_cast<uint32_t>(c));
  }
}

/// One run of copies the policy treats alike: `periods` periods of `g` copies from `first`,
/// each a segment (`segmented`) or in none.
struct PolicyRun {
  size_t first, g, periods;
  bool segmented;
};

/// The left-out copies [r0, r1) of one run (whole periods of g copies).
struct Cut {
  size_t r0, r1, g;
  bool segmented;
};

/// The smaller model: the whole one's ops less the left-out copies', its keys renumbered.
struct Smaller {
  std::vector<uint8_t> hasBackward;
  FactsStructure::PerOp reads, keeps, writes;
  std::vector<uint32_t> extraStart{0};
  std::vector<TensorId> sources;
  std::vector<OpId> gradProducer, gradReader;
  GradientShares shares;
  std::vector<double> tensorBuffer, extraBuffer;
  std::vector<std::pair<OpId, double>> backwardScratch;
  std::vector<RepeatCopies::Copy> copies;
  std::vector<uint32_t> keys; ///< the whole model's tensor of each key, ascending
  size_t ops = 0, backwardOps = 0;
  WalkModel model() const {
    WalkModel m;
    m.ops = ops;
    m.tensors = keys.size();
    m.backwardOps = backwardOps;
    m.hasBackward = &hasBackward;
    m.reads = &reads, m.keeps = &keeps, m.writes = &writes;
    m.extraStart = &extraStart;
    m.sources = &sources;
    m.gradProducer = &gradProducer, m.gradReader = &gradReader;
    m.shares = &shares;
    m.tensorBuffer = &tensorBuffer, m.extraBuffer = &extraBuffer;
    m.backwardScratch = &backwardScratch;
    m.copies = &copies;
    return m;
  }
};

/// The runs of `p`'s segments (all of copies, in order, none overlapping) and of the copies in
/// none; empty when its segments are not so.
std::vector<PolicyRun> policyRuns(const Policy &p, size_t L) {
  std::vector<PolicyRun> runs;
  size_t at = 0;
  auto none = [&](size_t to) {
    if (to > at)
      runs.push_back({at, 1, to - at, false});
  };
  for (const auto &[first, end] : p.segments) {
    if (first < at || end <= first || end > L)
      return {};
    none(first);
    size_t k = end - first;
    if (!runs.empty() && runs.back().segmented && runs.back().g == k &&
        runs.back().first + runs.back().g * runs.back().periods == first)
      ++runs.back().periods;
    else
      runs.push_back({first, k, 1, true});
    at = end;
  }
  none(L);
  return runs;
}

/// The periods of `run` to leave out: the longest whole-period span with two periods of the
/// run kept on each side and every copy from two periods before it to two after it alike.
std::optional<Cut> cutOf(const PolicyRun &run, const PeriodicCopies &pc) {
  std::optional<Cut> best;
  size_t s = run.first, g = run.g;
  for (const auto &[a, b] : pc.runs) { // copies a..b alike
    size_t lo = std::max<size_t>(2, (a + 2 * g > s ? (a + 2 * g - s + g - 1) / g : 0));
    if (b + 1 < 2 * g + s)
      continue;
    size_t hi = std::min(run.periods >= 2 ? run.periods - 2 : 0, (b + 1 - 2 * g - s) / g);
    if (hi < lo + 2)
      continue;
    if (!best || (hi - lo) * g > best->r1 - best->r0)
      best = Cut{s + lo * g, s + hi * g, g, run.segmented};
  }
  return best;
}

/// The smaller model of `f` without the copies of `cuts` (sorted), or nullopt when a kept op
/// or tensor refers to a left-out one other than its neighbour across a cut.
std::optional<Smaller> smallerModel(const Facts &f, const std::vector<Cut> &cuts,
                                    const PeriodicCopies &pc) {
  const FactsStructure &st = *f.structure;
  size_t K = pc.opStride;
  auto opFirst = [&](size_t c) { return static_cast<size_t>(f.copies[c].ops.front()); };
  // The cut a copy is left out by, or -1.
  auto cutOfCopy = [&](uint32_t c) -> int {
    if (c == kNone)
      return -1;
    for (size_t i = 0; i < cuts.size(); ++i)
      if (c >= cuts[i].r0 && c < cuts[i].r1)
        return static_cast<int>(i);
    return -1;
  };
  bool ok = true;
  // A tensor referred to from copy `from` (kNone: outside the copies): itself when kept, its
  // like in the kept copy next to the cut when `from` is that cut's neighbour.
  auto keptTensor = [&](TensorId t, uint32_t from) -> TensorId {
    uint32_t d = ownerOf(f, t);
    int i = cutOfCopy(d);
    if (i < 0)
      return t;
    const Cut &cut = cuts[i];
    uint32_t shift = static_cast<uint32_t>((cut.r1 - cut.r0) * pc.tensorStride);
    if (d == cut.r1 - 1 && from == cut.r1)
      return t - shift;
    if (d == cut.r0 && from != kNone && from + 1 == cut.r0)
      return t + shift;
    ok = false;
    return t;
  };
  auto keptOp = [&](OpId o, uint32_t from) -> OpId {
    if (o == kNone)
      return o;
    uint32_t d = o < f.copyOfOp.size() ? f.copyOfOp[o] : kNone;
    int i = cutOfCopy(d);
    if (i < 0)
      return o;
    const Cut &cut = cuts[i];
    OpId shift = static_cast<OpId>((cut.r1 - cut.r0) * K);
    if (d == cut.r1 - 1 && from == cut.r1)
      return o - shift;
    if (d == cut.r0 && from != kNone && from + 1 == cut.r0)
      return o + shift;
    ok = false;
    return o;
  };
  // A kept op's number in the smaller model.
  auto smallOp = [&](OpId o) -> OpId {
    if (o == kNone)
      return o;
    OpId v = o;
    for (const Cut &cut : cuts)
      if (o >= opFirst(cut.r1))
        v -= static_cast<OpId>((cut.r1 - cut.r0) * K);
    return v;
  };
  Smaller s;
  // The kept ops, in order.
  std::vector<OpId> kept;
  {
    size_t n = f.g.ops.size(), o = 0;
    for (const Cut &cut : cuts) {
      for (; o < opFirst(cut.r0); ++o)
        kept.push_back(static_cast<OpId>(o));
      o = opFirst(cut.r1);
    }
    for (; o < n; ++o)
      kept.push_back(static_cast<OpId>(o));
  }
  // Their keys: every tensor in a kept op's lists, the sources, and the roots of those made.
  std::vector<uint32_t> &keys = s.keys;
  for (OpId o : kept) {
    uint32_t from = f.copyOfOp[o];
    for (const FactsStructure::PerOp *l : {&f.reads, &f.keeps, &f.writes})
      for (TensorId t : l->of(o))
        keys.push_back(keptTensor(t, from));
  }
  for (TensorId t : st.sources)
    keys.push_back(keptTensor(t, kNone));
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  if (!ok)
    return std::nullopt;
  auto key = [&](TensorId t) -> uint32_t {
    auto it = std::lower_bound(keys.begin(), keys.end(), t);
    if (it == keys.end() || *it != t) {
      ok = false;
      return 0;
    }
    return static_cast<uint32_t>(it - keys.begin());
  };
  s.ops = kept.size();
  for (OpId o : kept) {
    uint32_t from = f.copyOfOp[o];
    s.hasBackward.push_back(f.hasBackward[o]);
    s.backwardOps += f.hasBackward[o] ? 1 : 0;
    for (auto [l, small] : {std::make_pair(&f.reads, &s.reads), std::make_pair(&f.keeps, &s.keeps),
                            std::make_pair(&f.writes, &s.writes)}) {
      for (TensorId t : l->of(o))
        small->items.push_back(key(keptTensor(t, from)));
      small->close();
    }
    for (uint32_t k = 0; k < f.extraCount(o); ++k)
      s.extraBuffer.push_back(f.extraBuffer[f.extras.start[o] + k]);
    s.extraStart.push_back(static_cast<uint32_t>(s.extraBuffer.size()));
  }
  for (const auto &[o, bytes] : f.backwardScratch) {
    auto it = std::lower_bound(kept.begin(), kept.end(), o);
    if (it == kept.end() || *it != o)
      return std::nullopt; // an op left out holds bytes in its backward: walk the whole
    s.backwardScratch.emplace_back(static_cast<OpId>(it - kept.begin()), bytes);
  }
  for (TensorId t : st.sources)
    s.sources.push_back(key(t));
  size_t T = keys.size();
  s.tensorBuffer.resize(T);
  s.gradProducer.resize(T);
  s.gradReader.resize(T);
  s.shares.root.assign(T, kNone);
  for (uint32_t v = 0; v < T; ++v) {
    TensorId t = keys[v];
    uint32_t from = ownerOf(f, t);
    s.tensorBuffer[v] = f.tensorBuffer[t];
    s.gradProducer[v] = smallOp(keptOp(st.gradProducer[t], from));
    s.gradReader[v] = smallOp(keptOp(st.gradReader[t], from));
    TensorId root = t < st.shares->root.size() ? st.shares->root[t] : kNone;
    if (root != kNone) {
      s.shares.root[v] = key(keptTensor(root, from));
      s.shares.members.emplace_back(s.shares.root[v], v);
    }
  }
  std::stable_sort(s.shares.members.begin(), s.shares.members.end(),
                   [](const auto &x, const auto &y) { return x.first < y.first; });
  // The kept copies, for the segments.
  for (size_t c = 0, i = 0; c < f.copies.size(); ++c) {
    if (i < cuts.size() && c == cuts[i].r0) {
      c = cuts[i++].r1 - 1;
      continue;
    }
    RepeatCopies::Copy copy;
    for (OpId o : f.copies[c].ops)
      copy.ops.push_back(smallOp(o));
    s.copies.push_back(std::move(copy));
  }
  if (!ok)
    return std::nullopt;
  return s;
}

/// walk()'s re-run FLOPs and seconds for a segment policy: its segments by trigger (the
/// highest op with a backward), highest first, each segment's ops in order. False when a
/// segment's ops are not in order (walk() would sort them; the whole walk is made then).
bool recomputeSums(const Facts &f, const Policy &p, Walk &w) {
  struct Seg {
    size_t first, end;
    OpId trigger;
  };
  std::vector<Seg> segs;
  for (const auto &[first, end] : p.segments) {
    OpId trigger = kNone;
    for (size_t c = std::min(end, f.copies.size()); c-- > first && trigger == kNone;)
      for (size_t i = f.copies[c].ops.size(); i-- > 0;)
        if (f.hasBackward[f.copies[c].ops[i]]) {
          trigger = f.copies[c].ops[i];
          break;
        }
    if (trigger != kNone)
      segs.push_back({first, std::min(end, f.copies.size()), trigger});
  }
  std::stable_sort(segs.begin(), segs.end(),
                   [](const Seg &x, const Seg &y) { return x.trigger > y.trigger; });
  for (const Seg &sg : segs) {
    OpId last = 0;
    bool any = false;
    for (size_t c = sg.first; c < sg.end; ++c)
      for (OpId o : f.copies[c].ops) {
        if (any && o < last)
          return false;
        any = true, last = o;
        const OpAnalysis &oa = (*f.ops)[o];
        w.recomputeFlops += oa.forward.flops;
        w.recomputeExecuted += oa.forward.executedFlops;
        w.recomputeTime += f.opTime[o];
      }
  }
  return true;
}

} // namespace

std::optional<Walk> periodicWalk(const Facts &f, const Policy &p) {
  constexpr size_t kMinCopies = 16;
  size_t L = f.copies.size();
  if (!f.walked || L < kMinCopies || !p.steps.empty() || p.fromInput || !p.selectiveOps.empty() ||
      !p.opSegments.empty())
    return std::nullopt;
  PeriodicCopies &pc = f.walked->periodic;
  if (!pc.built)
    buildPeriodic(f, pc);
  if (pc.runs.empty())
    return std::nullopt;
  std::vector<Cut> cuts;
  for (const PolicyRun &run : policyRuns(p, L))
    if (std::optional<Cut> cut = cutOf(run, pc))
      cuts.push_back(*cut);
  if (cuts.empty())
    return std::nullopt;
  std::optional<Smaller> small = smallerModel(f, cuts, pc);
  if (!small)
    return std::nullopt;
  // The policy's segments over the kept copies.
  auto smallCopy = [&](size_t c) {
    size_t v = c;
    for (const Cut &cut : cuts)
      if (c >= cut.r1)
        v -= cut.r1 - cut.r0;
      else if (c > cut.r0)
        v -= c - cut.r0;
    return v;
  };
  std::vector<std::pair<size_t, size_t>> segments;
  for (const auto &[first, end] : p.segments) {
    size_t a = smallCopy(first), b = smallCopy(end);
    if (b > a)
      segments.emplace_back(a, b);
  }
  Walk w;
  if (!recomputeSums(f, p, w))
    return std::nullopt;
  WalkModel m = small->model();
  WalkScratch &scratch = f.memo->scratch;
  std::vector<OpId> stepOps;
  if (!profileWalk(m, segments, scratch, stepOps))
    return std::nullopt;
  size_t steps = stepOps.size();
  // The live bytes at each step of the smaller walk.
  std::vector<double> saved(steps), other(steps);
  {
    double s = 0, o = 0;
    for (size_t i = 0; i < steps; ++i) {
      s += scratch.saved[i], o += scratch.other[i];
      saved[i] = s, other[i] = o;
    }
  }
  // Per cut, where its forward and backward were left out, what each period there adds, and
  // how many steps were left out: (position, saved, other, steps), sorted by position.
  struct Event {
    size_t at;
    double saved, other;
    size_t left;
  };
  std::vector<Event> events;
  size_t K = pc.opStride;
  for (const Cut &cut : cuts) {
    size_t kb = 0; // ops with a backward in one copy
    for (OpId o : f.copies[cut.r0].ops)
      kb += f.hasBackward[o] ? 1 : 0;
    size_t periods = (cut.r1 - cut.r0) / cut.g;
    size_t fwdPeriod = cut.g * K;
    size_t bwdPeriod = cut.g * kb + (cut.segmented && kb > 0 ? cut.g * K : 0);
    size_t fwdAt = small->copies[smallCopy(cut.r1)].ops.front();
    size_t bwdAt = steps;
    for (size_t i = m.ops; i < steps; ++i) {
      bool after = stepOps[i] < fwdAt;
      if (after && bwdAt == steps)
        bwdAt = i;
      if (!after && bwdAt != steps)
        return std::nullopt; // a later step of the copies after the cut
    }
    // What one period adds across the cut, the same at three places of the period.
    auto across = [&](size_t at, size_t period, double &s, double &o) {
      if (period == 0 || at < period || at + period > steps)
        return false;
      s = saved[at] - saved[at - period], o = other[at] - other[at - period];
      for (size_t q : {period / 2, period - 1})
        if (saved[at + q] - saved[at - period + q] != s || other[at + q] - other[at - period + q] != o)
          return false;
      return true;
    };
    double fs, fo, bs, bo;
    if (!across(fwdAt, fwdPeriod, fs, fo) || !across(bwdAt, bwdPeriod, bs, bo) || fs + bs != 0 ||
        fo + bo != 0 || fs + fo < 0)
      return std::nullopt;
    double P = static_cast<double>(periods);
    events.push_back({fwdAt, P * fs, P * fo, (cut.r1 - cut.r0) * K});
    events.push_back({bwdAt, P * bs, P * bo, periods * bwdPeriod});
  }
  std::stable_sort(events.begin(), events.end(),
                   [](const Event &x, const Event &y) { return x.at < y.at; });
  // Step 5 over the whole walk's kept steps (findPeak).
  double offSaved = 0, offOther = 0, best = -1;
  size_t shift = 0, next = 0;
  for (size_t i = 0; i < steps; ++i) {
    for (; next < events.size() && events[next].at == i; ++next) {
      offSaved += events[next].saved;
      offOther += events[next].other;
      shift += events[next].left;
    }
    double s = saved[i] + offSaved, o = other[i] + offOther;
    if (s + o > best) {
      best = s + o;
      w.peakSaved = s;
      w.peakOther = o;
      w.peakStep = static_cast<uint32_t>(i + shift);
    }
  }
  if (!(best < 0x1p52))
    return std::nullopt;
  ++f.walked->periodicWalks;
  return w;
}

} // namespace activations
} // namespace tally
