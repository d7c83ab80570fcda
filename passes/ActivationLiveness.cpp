// Steps 3-5 of the activation-memory pass (passes/Activations.cpp): one policy's schedule,
// buffers and peak. The schedule (step 3: the forward, re-runs of checkpointed segments before
// their first backward step, the backward), the liveness walk over it (step 4: every run of an
// op makes a new instance of what it writes; each instance lives to its last use, Saved when a
// backward uses it), and the step with the most bytes live (step 5); the walks are memoised per
// policy (WalkMemo). Also the per-device shares of the walk's bytes (pipeline, context).
#include "passes/ActivationsInternal.h"

#include <cmath>

namespace tally {
namespace activations {

namespace {

/// Room for `need` elements in a scratch list (the schedule, the deltas). A list that must
/// grow takes room for twice as many: the walks of one analysis grow longer (a curve's from
/// none to full), and growing the list for each mapped and zeroed new pages each time; room
/// never written is never touched.
template <class T> void reserveScratch(std::vector<T> &v, size_t need) {
  if (v.capacity() < need) {
    v.clear();
    v.reserve(2 * need);
  }
}
/// A scratch list of `need` elements of `value`, in room reserveScratch made.
template <class T> void assignScratch(std::vector<T> &v, size_t need, const T &value) {
  reserveScratch(v, need);
  v.assign(need, value);
}

/// Step 3 for block segments and selective ops: the forward of every op in order, then the
/// backward of every op that has one in reverse order; each segment is re-run (Recompute
/// steps) just before the first backward step (the highest op) among its ops' and, for a
/// selective op, those of the ops that keep its outputs. A segment none of whose ops has a
/// backward saved nothing, so it is never re-run. The steps are made as they are read
/// (forEach): segmentSchedule writes them out, and a walk that only compares policies reads
/// them once without (Steps): writing and reading the list was 40% of such a walk of a
/// 100,000-layer step.
class SegmentSchedule {
public:
  /// `f`: the whole model's facts, for the selective ops' savers (a smaller model, m not f's,
  /// has segments of copies only).
  SegmentSchedule(const WalkModel &m, const Policy &p, const Facts *f) : m_(m) {
    // The segments' ops, flat: segment s is ops_[from_[s], from_[s + 1]), sorted.
    std::vector<bool> forOutputs;
    auto close = [&](bool outputs) {
      if (!std::is_sorted(ops_.begin() + from_.back(), ops_.end())) // copies' ops come sorted
        std::sort(ops_.begin() + from_.back(), ops_.end());
      from_.push_back(static_cast<uint32_t>(ops_.size()));
      forOutputs.push_back(outputs);
    };
    for (const auto &sg : p.segments) {
      for (size_t c = sg.first; c < sg.second && c < m.copies->size(); ++c)
        ops_.insert(ops_.end(), (*m.copies)[c].ops.begin(), (*m.copies)[c].ops.end());
      close(false);
    }
    for (const auto &seg : p.opSegments) {
      ops_.insert(ops_.end(), seg.begin(), seg.end());
      close(false);
    }
    for (OpId o : p.selectiveOps) {
      ops_.push_back(o);
      close(!p.selectiveKeepsOutputs);
    }
    size_t segments = forOutputs.size();
    // Each segment's trigger, then the segments by trigger, highest first (a stable sort:
    // segments with one trigger stay in segment order).
    trigger_.assign(segments, kNone);
    for (size_t seg = 0; seg < segments; ++seg) {
      OpId &t = trigger_[seg];
      auto consider = [&](OpId o) {
        if ((*m.hasBackward)[o] && (t == kNone || o > t))
          t = o;
      };
      for (uint32_t i = from_[seg]; i < from_[seg + 1]; ++i) {
        consider(ops_[i]);
        if (forOutputs[seg])
          for (TensorId out : f->g.ops[ops_[i]].outputs)
            for (OpId saver : f->savers[f->g.storageOf(out)])
              consider(saver);
      }
    }
    steps_ = m.ops + m.backwardOps;
    order_.reserve(segments);
    for (size_t seg = 0; seg < segments; ++seg)
      if (trigger_[seg] != kNone) {
        order_.push_back(static_cast<uint32_t>(seg));
        steps_ += from_[seg + 1] - from_[seg];
      }
    std::stable_sort(order_.begin(), order_.end(),
                     [&](uint32_t x, uint32_t y) { return trigger_[x] > trigger_[y]; });
  }
  /// How many steps: every op's forward, each backward, each re-run segment's ops.
  size_t size() const { return steps_; }
  /// visit(i, step) for every step i, in order.
  template <class Visit> void forEach(Visit &&visit) const {
    size_t n = m_.ops;
    uint32_t i = 0;
    for (OpId o = 0; o < n; ++o)
      visit(i++, ScheduleStep{ScheduleStep::Forward, o});
    size_t k = 0; // order_[k]: the next segment to re-run, by trigger from the highest
    for (OpId o = static_cast<OpId>(n); o-- > 0;) {
      if (!(*m_.hasBackward)[o])
        continue;
      for (; k < order_.size() && trigger_[order_[k]] == o; ++k)
        for (uint32_t j = from_[order_[k]]; j < from_[order_[k] + 1]; ++j)
          visit(i++, ScheduleStep{ScheduleStep::Recompute, ops_[j]});
      visit(i++, ScheduleStep{ScheduleStep::Backward, o});
    }
  }
  /// visit(op) for every Recompute step, in order (forEach's, without the others).
  template <class Visit> void forEachRecompute(Visit &&visit) const {
    for (uint32_t seg : order_)
      for (uint32_t j = from_[seg]; j < from_[seg + 1]; ++j)
        visit(ops_[j]);
  }

private:
  const WalkModel &m_;
  std::vector<OpId> ops_;
  std::vector<uint32_t> from_{0}, order_;
  std::vector<OpId> trigger_;
  size_t steps_ = 0;
};

void segmentSchedule(const Facts &f, const Policy &p, Walk &w) {
  WalkModel m = f.model();
  SegmentSchedule schedule(m, p, &f);
  reserveScratch(w.schedule, schedule.size());
  schedule.forEach([&](uint32_t, ScheduleStep st) { w.schedule.push_back(st); });
}

/// The steps a walk reads: its schedule written out (Walk::schedule), or a segment
/// schedule's, made as they are read.
struct Steps {
  const std::vector<ScheduleStep> *list = nullptr;
  const SegmentSchedule *made = nullptr;
  size_t size() const { return made ? made->size() : list->size(); }
  /// visit(i, step) for every step i, in order.
  template <class Visit> void forEach(Visit &&visit) const {
    if (made) {
      made->forEach(visit);
      return;
    }
    for (uint32_t i = 0; i < list->size(); ++i)
      visit(i, (*list)[i]);
  }
  /// visit(op) for every Recompute step, in order.
  template <class Visit> void forEachRecompute(Visit &&visit) const {
    if (made) {
      made->forEachRecompute(visit);
      return;
    }
    for (const ScheduleStep &st : *list)
      if (st.kind == ScheduleStep::Recompute)
        visit(st.op);
  }
};

/// Step 3 for `recompute_all`: the forward keeps nothing made inside the repeat copies (step
/// 4 sees no later reader of the first run's tensors); just before the first backward step of
/// copy c, the forward of copies 0..c runs again from copy 0's kept input (an episode), and
/// only copy c's re-run is read by a backward. O(1) copies live, L(L+1)/2 copy forwards
/// re-run. Needs copiesContiguous.
void fromInputSchedule(const Facts &f, Walk &w) {
  size_t n = f.g.ops.size(), L = f.copies.size();
  OpId firstCopyOp = f.copies.front().ops.front();
  std::vector<bool> started(L, false);
  for (OpId o = 0; o < n; ++o)
    w.schedule.push_back({ScheduleStep::Forward, o});
  for (OpId o = static_cast<OpId>(n); o-- > 0;) {
    if (!f.hasBackward[o])
      continue;
    uint32_t c = f.copyOfOp[o];
    if (c != kNone && !started[c]) {
      started[c] = true;
      for (OpId r = firstCopyOp; r <= f.copies[c].ops.back(); ++r)
        w.schedule.push_back({ScheduleStep::Recompute, r});
    }
    w.schedule.push_back({ScheduleStep::Backward, o});
  }
}

/// Live bytes per schedule step, as differences: a buffer adds its bytes at its first step
/// and takes them off after its last (Saved ones in `saved`, the rest in `other`).
struct LiveDeltas {
  std::vector<double> &saved, &other;
  /// When set: the buffers' sizes rounded up to kAlignment, summed (nullopt once past
  /// INT64_MAX): what the memory plan needs when it lists no buffers (Analysis::listPlan).
  std::optional<int64_t> *aligned = nullptr;
  /// A buffer of `bytes` live from step `first` to step `last` (at least `first`).
  void add(bool isSaved, uint32_t first, uint32_t last, double bytes) {
    std::vector<double> &d = isSaved ? saved : other;
    d[first] += bytes;
    d[std::max(first, last) + 1] -= bytes;
    if (aligned && *aligned) {
      // As planMemory sizes a buffer: its whole bytes (< 2^63, else it cannot be held), aligned.
      std::optional<int64_t> size =
          bytes < 0x1p63 ? checkedAlignUp(static_cast<int64_t>(bytes)) : std::nullopt;
      *aligned = size ? checkedAdd(**aligned, *size) : std::nullopt;
    }
  }
};

/// One buffer of a walk (`bytes`: whole bytes, Facts::tensorBuffer or extraBuffer): into the
/// deltas that find the peak and, when the walk keeps its buffers (the applied policy's memory
/// plan, the chain's stage sizes), into `w.buffers`; the walks that only compare policies
/// keep none (a 10,000-layer walk made 10^6 of them).
void addBuffer(Walk &w, LiveDeltas &live, bool keep, TensorId t, OpId op, double bytes,
               uint32_t first, uint32_t last, Label what, Buffer::Kind kind) {
  if (!(bytes > 0))
    return;
  last = std::max(first, last);
  live.add(kind == Buffer::Saved, first, last, bytes);
  if (!keep)
    return;
  Buffer b;
  b.tensor = t;
  b.op = op;
  b.size = bytes;
  // A tensor's element count fits int64 (lowering checks it), its bytes need not: 2^62 f32
  // elements are 2^64 bytes. Such a buffer keeps its size for the analysis; planMemory says
  // the plan cannot hold it (converting a double ≥ 2^63 to int64 is undefined).
  b.bytes = bytes < 0x1p63 ? static_cast<int64_t>(bytes) : 0;
  b.first = first;
  b.last = last;
  b.what = what;
  b.kind = kind;
  w.buffers.push_back(b);
}

/// Walk::keptPerCopy: per copy, the bytes of the activations and extra buffers its ops made
/// in the forward (not re-runs) that are still live when the backward starts: saved for a
/// backward or kept as the input of a recomputed segment. From the walk's instances, so that
/// no buffer list is needed (whole bytes: the sums are exact in any order).
void keptByCopy(const Facts &f, Walk &w, const std::vector<LiveInstance> &inst) {
  const Graph &g = f.g;
  size_t T = g.tensors.size();
  uint32_t forwardEnd = 0; // the first step after the forward of every op
  for (uint32_t i = 0; i < w.schedule.size(); ++i)
    if (w.schedule[i].kind == ScheduleStep::Forward)
      forwardEnd = i + 1;
  w.keptPerCopy.assign(f.copies.size(), 0);
  for (const LiveInstance &in : inst) {
    if (!(in.first < forwardEnd && in.last >= forwardEnd))
      continue;
    OpId op = kNone;
    if (in.key < T) {
      op = g.tensors[in.key].producer;
    } else { // extra buffer k of op o: key T + extras.start[o] + k
      uint32_t item = static_cast<uint32_t>(in.key - T);
      auto after = std::upper_bound(f.extras.start.begin(), f.extras.start.end(), item);
      op = static_cast<OpId>(after - f.extras.start.begin()) - 1;
    }
    double bytes = f.keyBuffer(in.key);
    if (bytes > 0 && op != kNone && op < f.copyOfOp.size() && f.copyOfOp[op] != kNone)
      w.keptPerCopy[f.copyOfOp[op]] += bytes;
  }
}

/// An instance's buffer into the deltas, when it has bytes (Facts::keyBuffer).
inline void addInstance(const WalkModel &m, LiveDeltas &live, const LiveInstance &in) {
  double bytes = m.keyBuffer(in.key);
  if (bytes > 0)
    live.add(in.saved, in.first, in.last, bytes);
}

/// A walk's instances, every one listed in the order made (`inst`; `current` is each key's
/// newest): what the memory plan's buffers and keptByCopy read.
struct ListedInstances {
  std::vector<LiveInstance> &inst;
  std::vector<uint32_t> &current;
  ListedInstances(WalkScratch &s, size_t keys) : inst(s.inst), current(s.current) {
    inst.clear();
    // Room for each activation and extra buffer made twice (a re-run makes them again):
    // regrowing copied the list in every walk that re-runs ops; room never used is not touched.
    inst.reserve(2 * keys);
    current.assign(keys, kNone);
  }
  void make(uint32_t key, uint32_t step, bool again) {
    current[key] = static_cast<uint32_t>(inst.size());
    inst.push_back({key, step, step, false, again});
  }
  void use(uint32_t key, uint32_t step, bool saved) {
    if (current[key] == kNone)
      return;
    LiveInstance &in = inst[current[key]];
    in.last = std::max(in.last, step);
    in.saved = in.saved || saved;
  }
  bool made(uint32_t key) const { return current[key] != kNone; }
};

/// A walk's instances when only the live bytes per step are wanted (the walks that compare
/// policies: the trade-off curve, auto's and sqrt's candidates, the budget fixes and the
/// layout search): each key's newest instance only, an older one added to the deltas when a
/// newer is made, the rest by finish(). No list of every instance (one per buffer made:
/// millions in a deep model), and no second pass over one. The deltas are whole bytes, so
/// their sums (exact below 2^53) do not depend on the order buffers are added in.
struct OpenInstances {
  std::vector<LiveInstance> &open;
  LiveDeltas &live;
  const WalkModel &m;
  OpenInstances(WalkScratch &s, size_t keys, LiveDeltas &live, const WalkModel &m)
      : open(s.inst), live(live), m(m) {
    open.assign(keys, {0, kNone, 0, false, false});
  }
  void make(uint32_t key, uint32_t step, bool again) {
    LiveInstance &in = open[key];
    if (in.first != kNone)
      addInstance(m, live, in);
    in = {key, step, step, false, again};
  }
  void use(uint32_t key, uint32_t step, bool saved) {
    LiveInstance &in = open[key];
    if (in.first == kNone)
      return;
    in.last = std::max(in.last, step);
    in.saved = in.saved || saved;
  }
  bool made(uint32_t key) const { return open[key].first != kNone; }
  void finish() {
    for (const LiveInstance &in : open)
      if (in.first != kNone)
        addInstance(m, live, in);
  }
};

/// Step 4's pass over the schedule: every instance made and used (`book`: ListedInstances or
/// OpenInstances), and per op the step of its backward (`bwd`). Whether the backward steps
/// run once per op with a backward, in reverse op order (every schedule tally makes does): a
/// gradient then starts at its last reader's backward.
template <class Book>
bool runInstances(const WalkModel &m, const Steps &steps, Book &book, std::vector<uint32_t> &bwd) {
  uint32_t T = static_cast<uint32_t>(m.tensors);
  bwd.assign(m.ops, kNone);
  const std::vector<uint32_t> &extraStart = *m.extraStart;
  const FactsStructure::PerOp &reads = *m.reads, &keeps = *m.keeps, &writes = *m.writes;
  const std::vector<uint8_t> &hasBackward = *m.hasBackward;
  for (TensorId t : *m.sources)
    book.make(t, 0, false);
  bool reverse = true;
  size_t backwardSteps = 0;
  OpId lastBackward = kNone;
  steps.forEach([&](uint32_t i, ScheduleStep st) __attribute__((always_inline)) {
    OpId o = st.op;
    uint32_t extraKey = T + extraStart[o];
    uint32_t extraCount = extraStart[o + 1] - extraStart[o];
    if (st.kind == ScheduleStep::Backward) {
      bwd[o] = i;
      reverse = reverse && o < lastBackward;
      lastBackward = o;
      ++backwardSteps;
      for (TensorId t : keeps.of(o))
        book.use(t, i, true);
      for (uint32_t k = 0; k < extraCount; ++k)
        book.use(extraKey + k, i, true);
      return;
    }
    for (TensorId t : reads.of(o))
      book.use(t, i, false);
    bool again = st.kind == ScheduleStep::Recompute;
    for (TensorId t : writes.of(o))
      book.make(t, i, again);
    if (hasBackward[o])
      for (uint32_t k = 0; k < extraCount; ++k)
        book.make(extraKey + k, i, again);
  });
  return reverse && backwardSteps == m.backwardOps;
}

/// An activation's gradient: from the backward of its first reader to its producer's; a
/// group sharing one buffer (GradientShares): the root's, to its last member's producer's.
/// Read once step 4's pass has given each op's backward step (`bwd`).
struct Gradients {
  const WalkModel &m;
  const std::vector<uint32_t> &bwd;
  bool ordered;
  std::vector<std::pair<TensorId, uint32_t>> &ends; // (root, last step), by root
  Gradients(const WalkModel &m, const std::vector<uint32_t> &bwd, bool ordered, WalkScratch &scratch)
      : m(m), bwd(bwd), ordered(ordered), ends(scratch.shareEnds) {
    ends.clear();
    for (const auto &[root, member] : m.shares->members) {
      OpId p = (*m.gradProducer)[member];
      if (p == kNone || bwd[p] == kNone)
        continue;
      if (ends.empty() || ends.back().first != root)
        ends.emplace_back(root, bwd[p]);
      else
        ends.back().second = std::max(ends.back().second, bwd[p]);
    }
  }
  /// add(producer, first step, last step) for tensor t's gradient buffer, when it has one.
  template <class Add> void operator()(TensorId t, Add &&add) const {
    const GradientShares &shares = *m.shares;
    if (shares.any() && shares.root[t] != kNone)
      return; // its root's buffer
    OpId p = (*m.gradProducer)[t];
    if (p == kNone || bwd[p] == kNone)
      return;
    uint32_t last = bwd[p];
    if (!ends.empty()) {
      auto e = std::lower_bound(ends.begin(), ends.end(), std::make_pair(t, uint32_t(0)));
      if (e != ends.end() && e->first == t)
        last = std::max(last, e->second);
    }
    uint32_t start = kNone;
    if (ordered) {
      if ((*m.gradReader)[t] != kNone)
        start = bwd[(*m.gradReader)[t]];
    } else {
      for (OpId r : (*m.readers)[t])
        if (bwd[r] != kNone)
          start = std::min(start, bwd[r]);
    }
    if (start != kNone)
      add(p, start, last);
  }
};

/// What an op's backward holds only while it runs (WalkModel::backwardScratch: the eager
/// loss's fp32 gradients), as add(op, its backward step, bytes).
template <class Add>
void addBackwardScratch(const WalkModel &m, const std::vector<uint32_t> &bwd, Add &&add) {
  if (m.backwardScratch)
    for (const auto &[o, bytes] : *m.backwardScratch)
      if (o < bwd.size() && bwd[o] != kNone && bytes > 0)
        add(o, bwd[o], bytes);
}

/// Step 4 for a walk that wants only the live bytes per step (OpenInstances): every instance
/// and gradient into the deltas. Returns whether the backward ran in reverse op order.
bool openLiveness(const WalkModel &m, const Steps &steps, LiveDeltas &live, WalkScratch &scratch) {
  size_t keys = m.tensors + m.extraStart->back();
  OpenInstances open(scratch, keys, live, m);
  bool ordered = runInstances(m, steps, open, scratch.bwd);
  open.finish();
  addBackwardScratch(m, scratch.bwd, [&](OpId, uint32_t step, double bytes) { live.add(false, step, step, bytes); });
  Gradients gradient(m, scratch.bwd, ordered, scratch);
  for (TensorId t = 0; t < m.tensors; ++t)
    if (open.made(t))
      gradient(t, [&](OpId, uint32_t first, uint32_t last) {
        double bytes = (*m.tensorBuffer)[t];
        if (bytes > 0)
          live.add(false, first, std::max(first, last), bytes);
      });
  return ordered;
}

/// Step 4 over any schedule. Every run of an op (its forward or a recompute) makes a new
/// instance of each activation it writes and of each extra buffer it saves; every later step
/// that reads the tensor uses its newest instance: a forward or recompute reading it as an
/// input, the op's backward reading what it keeps. An instance lives from the step that makes
/// it to the last step that uses it, and is Saved when a backward uses it (else Transient).
/// So a tensor made in a recomputed segment lives in the forward only to its last forward
/// reader (the backward reads the re-run's instance), and the schedule alone — one level of
/// segments, recompute_all's episodes or nested recomputation — decides every lifetime.
/// An activation's gradient lives from the backward of its first reader in the backward
/// (which starts it) to the backward of its producer (which consumes it).
void liveness(const Facts &f, const Analysis &a, Walk &w, const Steps &steps, LiveDeltas &live,
              bool keep, bool perCopy, WalkScratch &scratch) {
  const Graph &g = f.g;
  size_t n = g.ops.size(), T = g.tensors.size();
  WalkModel m = f.model();
  if (!keep && !perCopy) {
    // Only the live bytes per step, without listing buffers by tensor.
    openLiveness(m, steps, live, scratch);
    return;
  }
  // Keys: a stored tensor t is key t; op o's k-th extra buffer is key T + extras.start[o] + k.
  size_t keys = T + f.extras.items.size();
  std::vector<uint32_t> &bwd = scratch.bwd;
  std::optional<ListedInstances> listed;
  listed.emplace(scratch, keys);
  bool ordered = runInstances(m, steps, *listed, bwd);
  static const Label gradientLabel("gradient");
  Gradients gradients(m, bwd, ordered, scratch);
  auto gradient = [&](TensorId t) {
    gradients(t, [&](OpId p, uint32_t start, uint32_t last) {
      addBuffer(w, live, keep, t, p, f.tensorBuffer[t], start, last, gradientLabel,
                Buffer::Gradient);
    });
  };
  const std::vector<LiveInstance> &inst = listed->inst;
  if (perCopy)
    keptByCopy(f, w, inst);
  static const Label scratchLabel("backward working set");
  addBackwardScratch(m, bwd, [&](OpId o, uint32_t step, double bytes) {
    addBuffer(w, live, keep, kNone, o, bytes, step, step, scratchLabel, Buffer::Transient);
  });
  if (!keep) {
    // Only the live bytes per step: the buffers in the order they were made, without listing
    // them by tensor.
    for (const LiveInstance &in : inst)
      addInstance(m, live, in);
    for (TensorId t = 0; t < T; ++t)
      if (listed->made(t))
        gradient(t);
    return;
  }
  // Room for every buffer at once: one per instance and at most one gradient per tensor
  // (regrowing the list copied it, and mapped and zeroed each larger list anew).
  w.buffers.reserve(w.buffers.size() + inst.size() + T);
  // Each key's instances in the order they were made: a counting sort by key.
  std::vector<uint32_t> from(keys + 1, 0), order(inst.size());
  for (const LiveInstance &in : inst)
    ++from[in.key + 1];
  for (size_t k = 0; k + 1 < from.size(); ++k)
    from[k + 1] += from[k];
  {
    std::vector<uint32_t> next(from.begin(), from.end() - 1);
    for (uint32_t i = 0; i < inst.size(); ++i)
      order[next[inst[i].key]++] = i;
  }
  for (TensorId t = 0; t < T; ++t) {
    if (from[t] == from[t + 1])
      continue;
    OpId p = g.tensors[t].producer;
    double bytes = f.tensorBuffer[t];
    for (uint32_t j = from[t]; j < from[t + 1]; ++j) {
      const LiveInstance &in = inst[order[j]];
      static const Label recomputedSaved("recomputed, saved"), recomputed("recomputed"),
          saved("saved"), transient("transient");
      addBuffer(w, live, keep, t, p, bytes, in.first, in.last,
                in.recomputed ? (in.saved ? recomputedSaved : recomputed) : (in.saved ? saved : transient),
                in.saved ? Buffer::Saved : Buffer::Transient);
    }
    gradient(t);
  }
  for (OpId o = 0; o < n; ++o) {
    for (uint32_t k = 0; k < f.extraCount(o); ++k) {
      uint32_t key = static_cast<uint32_t>(T) + f.extras.start[o] + k;
      if (from[key] == from[key + 1])
        continue;
      const SavedTensor &st = a.savedOf(o)[f.extras.of(o)[k]];
      double bytes = f.extraBuffer[f.extras.start[o] + k];
      for (uint32_t j = from[key]; j < from[key + 1]; ++j) {
        const LiveInstance &in = inst[order[j]];
        addBuffer(w, live, keep, kNone, o, bytes, in.first, in.last, st.what,
                  in.saved ? Buffer::Saved : Buffer::Transient);
      }
    }
  }
}

/// Step 5: the step with the most bytes live, and the Saved bytes and the rest there.
void findPeak(Walk &w, const LiveDeltas &live) {
  size_t n = live.saved.size(); // the steps and one past the last
  double liveSaved = 0, liveOther = 0, best = -1;
  for (uint32_t i = 0; i + 1 < n; ++i) {
    liveSaved += live.saved[i];
    liveOther += live.other[i];
    if (liveSaved + liveOther > best) {
      best = liveSaved + liveOther;
      w.peakSaved = liveSaved;
      w.peakOther = liveOther;
      w.peakStep = i;
    }
  }
}

/// What decides a policy's schedule (and so its walk), as bytes: the WalkMemo key. The name
/// does not (sqrt of segment length 1 is full); the counts keep the lists apart.
std::string policyKey(const Policy &p) {
  std::string key;
  auto put = [&](uint64_t x) { key.append(reinterpret_cast<const char *>(&x), sizeof x); };
  put(p.fromInput);
  put(p.segments.size());
  for (const auto &sg : p.segments)
    put(sg.first), put(sg.second);
  put(p.selectiveOps.size());
  put(p.selectiveKeepsOutputs);
  for (OpId o : p.selectiveOps)
    put(o);
  put(p.opSegments.size());
  for (const auto &ops : p.opSegments) {
    put(ops.size());
    for (OpId o : ops)
      put(o);
  }
  put(p.steps.size());
  for (const ScheduleStep &st : p.steps)
    put((static_cast<uint64_t>(st.kind) << 32) | st.op);
  return key;
}

} // namespace

/// Step 3 for one policy: its schedule (explicit, recompute_all's or the segments').
void buildSchedule(const Facts &f, const Policy &p, Walk &w) {
  if (!p.steps.empty())
    w.schedule = p.steps;
  else if (p.fromInput)
    fromInputSchedule(f, w);
  else
    segmentSchedule(f, p, w);
}

/// Steps 3-5 for one policy: its schedule, the recompute it costs, every buffer's lifetime
/// and the peak. `keepBuffers`: every buffer in w.buffers, for the memory plan; else only the
/// recompute and the peak, answered from Facts::memo when this policy was walked before under
/// the same facts (w.schedule is then empty). `alignedSum`: the buffers' aligned sizes summed
/// there instead of listed (LiveDeltas::aligned), and `perCopy` Walk::keptPerCopy (the walk
/// is then made, not looked up). `readsSchedule` false: the caller reads no w.schedule
/// (compareWalk), so a segment policy's steps are made as the walk reads them.
Walk walk(const Facts &f, const Analysis &a, const Policy &p, bool keepBuffers,
          std::optional<int64_t> *alignedSum, bool perCopy,
          bool readsSchedule) {
  Walk w;
  std::string key;
  if (f.memo)
    key = policyKey(p);
  if (!keepBuffers && !alignedSum && !perCopy && f.memo) {
    auto it = f.walked->walks.find(key);
    if (it != f.walked->walks.end()) {
      ++f.memo->reused;
      const WalkMemo::Summary &m = it->second;
      w.recomputeFlops = m.recomputeFlops;
      w.recomputeExecuted = m.recomputeExecuted;
      w.recomputeTime = m.recomputeTime;
      w.peakSaved = m.peakSaved;
      w.peakOther = m.peakOther;
      w.peakStep = m.peakStep;
      w.memo = &it->second;
      return w;
    }
  }
  // The walk's recompute and peak, kept under its key for later buffer-less walks.
  auto remember = [&](Walk &done) {
    done.memo = &f.walked->walks
                     .emplace(std::move(key), WalkMemo::Summary{done.recomputeFlops, done.recomputeExecuted,
                                                               done.recomputeTime, done.peakSaved, done.peakOther,
                                                               done.peakStep, nullptr})
                     .first->second;
  };
  // A comparison walk of copies in segments: from a model with the middle of each run of like
  // copies left out, when they are provably alike (passes/ActivationPeriodic.cpp).
  if (!readsSchedule && !keepBuffers && !alignedSum && !perCopy && f.memo) {
    if (std::optional<Walk> periodic = periodicWalk(f, p)) {
      w = std::move(*periodic);
      remember(w);
      return w;
    }
  }
  WalkScratch own; // a walk without a memo has lists of its own
  WalkScratch &scratch = f.memo ? f.memo->scratch : own;
  WalkModel model = f.model();
  std::optional<SegmentSchedule> made;
  if (!readsSchedule && p.steps.empty() && !p.fromInput) {
    made.emplace(model, p, &f);
  } else {
    w.schedule.swap(scratch.schedule); // the list a comparison walk gave back, if any
    w.schedule.clear();
    buildSchedule(f, p, w);
  }
  Steps steps{&w.schedule, made ? &*made : nullptr};
  steps.forEachRecompute([&](OpId o) {
    const OpAnalysis &oa = (*f.ops)[o];
    w.recomputeFlops += oa.forward.flops;
    w.recomputeExecuted += oa.forward.executedFlops;
    w.recomputeTime += f.opTime[o];
  });
  LiveDeltas live{scratch.saved, scratch.other, alignedSum};
  assignScratch(live.saved, steps.size() + 1, 0.0);
  assignScratch(live.other, steps.size() + 1, 0.0);
  liveness(f, a, w, steps, live, keepBuffers, perCopy, scratch);
  findPeak(w, live);
  // A walk that listed its buffers has the same recompute and peak: later buffer-less walks
  // of this policy (the trade-off curve's point for the applied policy) take them.
  if (f.memo)
    remember(w);
  return w;
}

/// A walk whose caller reads only its recompute and peak (the trade-off curve, the
/// candidates of auto and sqrt, the budget fixes): a segment policy's steps are made as they
/// are read, and another's written schedule goes back to the scratch, for the next walk to
/// fill instead of mapping a new list.
Walk compareWalk(const Facts &f, const Analysis &a, const Policy &p) {
  Walk w = walk(f, a, p, false, nullptr, false, /*readsSchedule=*/false);
  if (f.memo && w.schedule.capacity() > 0) // a walk found in the memo took no list
    f.memo->scratch.schedule = std::move(w.schedule);
  return w;
}

bool profileWalk(const WalkModel &m, const std::vector<std::pair<size_t, size_t>> &segments,
                 WalkScratch &scratch, std::vector<OpId> &stepOps) {
  Policy p;
  p.segments = segments;
  SegmentSchedule schedule(m, p, nullptr);
  Steps steps{nullptr, &schedule};
  stepOps.resize(steps.size());
  steps.forEach([&](uint32_t i, ScheduleStep st) { stepOps[i] = st.op; });
  LiveDeltas live{scratch.saved, scratch.other, nullptr};
  assignScratch(live.saved, steps.size() + 1, 0.0);
  assignScratch(live.other, steps.size() + 1, 0.0);
  return openLiveness(m, steps, live, scratch);
}

/// Pipeline parallelism (step 5): the first stage holds 1/pp of the layers for
/// min(pp, micro-batches per step) micro-batches in flight.
double pipelineFactor(const Plan &plan) {
  double pp = static_cast<double>(std::max<int64_t>(1, plan.parallel.pipeline));
  if (pp <= 1)
    return 1;
  double micro = static_cast<double>(plan.batch) /
                 (static_cast<double>(plan.microBatch) *
                  static_cast<double>(std::max<int64_t>(1, plan.parallel.data)));
  double inFlight = std::min(pp, std::max(1.0, std::floor(micro)));
  // Interleaved 1F1B (interleave = v): the first stage warms up with (p − 1)/v more chunks,
  // 1 + (p − 1)/(p·v) times the activations (Korthikanti et al. 2022, §4.2.3).
  double v = static_cast<double>(std::max<int64_t>(1, plan.parallel.interleave));
  if (v > 1)
    inFlight *= 1 + (pp - 1) / (pp * v);
  return inFlight / pp;
}

/// Context parallelism (passes/StepTime.cpp): a rank holds s/c of every activation.
double contextShare(const Plan &plan) {
  return static_cast<double>(std::max<int64_t>(1, plan.parallel.context));
}

/// The Saved bytes at the peak per device, and with the workspace.
double deviceActivations(const Walk &w, const Plan &plan) {
  return w.peakSaved * pipelineFactor(plan) / contextShare(plan);
}
double deviceBytes(const Walk &w, const Plan &plan) {
  return deviceActivations(w, plan) + w.peakOther / contextShare(plan);
}

} // namespace activations
} // namespace tally
