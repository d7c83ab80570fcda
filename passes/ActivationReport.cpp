// What the reports read of the activation-memory pass (passes/Activations.cpp): what each
// repeat copy keeps with no checkpointing (Analysis::blockActivations), the applied plan per
// copy (re-runs, ops re-run alone, bytes kept past the forward), the paths whose inputs a
// policy keeps, the trade-off curve of peak memory against recompute time, and the note that
// says what a selective or nested plan re-runs.
#include "passes/ActivationsInternal.h"

#include <map>

namespace tally {
namespace activations {

/// What each copy keeps with no checkpointing, for the per-block report and the checks.
void blockActivations(const Facts &f, Analysis &a) {
  const Graph &g = f.g;
  a.blockActivations.assign(f.copies.size(), {});
  std::vector<bool> counted(g.tensors.size(), false);
  for (size_t c = 0; c < f.copies.size(); ++c)
    a.blockActivations[c].path = f.copies[c].path;
  for (OpId o = 0; o < g.ops.size(); ++o) {
    uint32_t c = f.copyOfOp[o];
    if (c != kNone)
      a.blockActivations[c].forwardFlops += a.ops[o].forward.flops;
    for (const SavedTensor &s : a.savedOf(o)) {
      double bytes = 0;
      if (s.tensor == kNone) {
        bytes = s.bytes / (f.opSplit(g.ops[o]) ? f.tensorDegree : 1);
      } else {
        TensorId t = g.storageOf(s.tensor);
        if (!f.isActivation(t) || counted[t])
          continue;
        counted[t] = true;
        bytes = f.bytes(t);
      }
      if (c != kNone)
        a.blockActivations[c].savedBytes += bytes;
    }
  }
  // A copy's input: stored tensors its ops read that were produced before it.
  std::vector<uint32_t> seenIn(g.tensors.size(), kNone); // the copy that last counted it
  for (size_t c = 0; c < f.copies.size(); ++c) {
    for (OpId o : f.copies[c].ops)
      for (TensorId t : g.ops[o].inputs) {
        TensorId b = g.storageOf(t);
        OpId p = g.tensors[b].producer;
        if (!f.isActivation(b) || seenIn[b] == c || (p != kNone && f.copyOfOp[p] == c))
          continue;
        seenIn[b] = static_cast<uint32_t>(c);
        a.blockActivations[c].inputBytes += f.bytes(b);
      }
  }
}

/// The paths whose inputs a policy keeps: the first copy of each recomputed segment.
std::vector<std::string> keptPaths(const Facts &f, const Policy &p) {
  std::vector<std::string> out;
  for (const auto &sg : p.segments)
    if (sg.first < f.copies.size())
      out.push_back(f.copies[sg.first].path);
  return out;
}

/// The applied plan per copy (Analysis::checkpoint.perBlock): the times all its ops re-run
/// (the copy's forward again), how many of its ops re-run more often (alone: selective), and
/// the bytes its ops' first runs keep past the forward (activations and extra
/// buffers made in the forward and still live when the backward starts: saved for a backward
/// or kept as the input of a recomputed segment; Walk::keptPerCopy).
void perBlock(const Facts &f, const Walk &w, Analysis &a) {
  size_t L = f.copies.size();
  std::vector<int64_t> runs(f.g.ops.size(), 0);
  for (const ScheduleStep &st : w.schedule)
    if (st.kind == ScheduleStep::Recompute)
      ++runs[st.op];
  a.checkpoint.perBlock.assign(L, {});
  for (size_t c = 0; c < L; ++c) {
    auto &b = a.checkpoint.perBlock[c];
    b.path = f.copies[c].path;
    b.reruns = runs[f.copies[c].ops.front()];
    for (OpId o : f.copies[c].ops)
      b.reruns = std::min(b.reruns, runs[o]);
    for (OpId o : f.copies[c].ops)
      b.reselected += runs[o] > b.reruns;
  }
  for (size_t c = 0; c < L && c < w.keptPerCopy.size(); ++c)
    a.checkpoint.perBlock[c].keptBytes = w.keptPerCopy[c];
}

namespace {

/// The peak per device as the report gives it for activations and workspace of `bytes`: the
/// allocator reserve (StaticMemory.cpp) on everything but the context and the communication
/// buffers. Reads the model states' bytes (staticMemory), which no later pass writes.
double curvePeak(const Analysis &a, double bytes) {
  return reservedPeak(a, staticBytes(a) - unallocatedBytes(a) + bytes);
}

} // namespace

/// A policy's point on the trade-off curve, from its walk.
TradeOffPoint curvePoint(const Analysis &a, const std::string &name, int64_t checkpointed,
                         const Walk &w, StepScale scale) {
  return {name, checkpointed, curvePeak(a, deviceBytes(w, *a.plan)), w.recomputeFlops * scale.flops,
          w.recomputeTime * scale.seconds};
}

/// The trade-off curve (Analysis::checkpoint.curve): the Pareto front of (peak per device,
/// recompute seconds) over auto's candidates and nested plans for 3/4, 1/2 and 1/4 of its
/// limit, or, for another policy, over none, up to 4 evenly spaced partial counts, full and
/// the plan itself (`own`, its point). A point stays when no other needs no more memory for
/// less recompute.
void tradeOffCurve(const Facts &f, Analysis &a, const TradeOffPoint &own, StepScale scale) {
  const Plan &plan = *a.plan;
  size_t L = f.copies.size();
  decltype(a.checkpoint.curve) points;
  auto add = [&](const std::string &name, int64_t checkpointed, const Walk &x) {
    points.push_back(curvePoint(a, name, checkpointed, x, scale));
  };
  for (const auto &o : a.checkpoint.options)
    points.push_back({o.policy, o.checkpointed, curvePeak(a, o.bytes), o.recomputeFlops,
                      o.recomputeSeconds});
  if (plan.checkpoint == "auto") {
    for (double part : {0.75, 0.5, 0.25})
      if (std::optional<Policy> n = nestedPolicy(f, a, a.checkpoint.limitBytes * part, false))
        add(n->name, static_cast<int64_t>(n->checkpointed()), compareWalk(f, a, *n));
  } else {
    size_t stride = std::max<size_t>(1, (L + 3) / 4);
    for (size_t m = 0; m < L; m += stride) {
      Policy p = partialPolicy(m, L);
      add(p.name, static_cast<int64_t>(m), compareWalk(f, a, p));
    }
    Policy full = partialPolicy(L, L);
    add(full.name, static_cast<int64_t>(L), compareWalk(f, a, full));
  }
  points.push_back(own);
  std::stable_sort(points.begin(), points.end(), [](const auto &x, const auto &y) {
    return x.recomputeSeconds != y.recomputeSeconds ? x.recomputeSeconds < y.recomputeSeconds
                                                    : x.peakBytes < y.peakBytes;
  });
  a.checkpoint.curve.clear();
  for (const auto &pt : points)
    if (a.checkpoint.curve.empty() || pt.peakBytes < a.checkpoint.curve.back().peakBytes)
      a.checkpoint.curve.push_back(pt);
}

/// The checkpoint note (Analysis::checkpoint.note) for the applied policy: which ops selective
/// re-runs, by kind; the cheap ops a nested plan re-runs alone; or that selective found
/// nothing to re-run. Other notes (a keep list's, recompute_all's) are written as the policy
/// is chosen.
void checkpointNote(const Facts &f, const Policy &p, Analysis &a) {
  if (!p.selectiveOps.empty()) {
    // Which ops selective re-runs, by kind: "selective re-runs 8 ops: 4 gelu, 4 layer_norm".
    // Counted by kind first: a name per op was 5% of a 10,000-layer layout search.
    std::vector<int64_t> byKind(kOpKinds, 0);
    for (OpId o : p.selectiveOps)
      ++byKind[static_cast<size_t>(f.g.ops[o].kind)];
    std::map<std::string, int64_t> kinds;
    for (unsigned k = 0; k < kOpKinds; ++k)
      if (byKind[k] > 0)
        kinds[opName(static_cast<OpKind>(k)).str()] += byKind[k];
    std::string list;
    for (const auto &kv : kinds)
      list += (list.empty() ? "" : ", ") + std::to_string(kv.second) + " " + kv.first;
    a.checkpoint.note = (p.name.find("selective_wide") != std::string::npos ? "selective_wide"
                                                                             : "selective") +
                        std::string(" re-runs ") + std::to_string(p.selectiveOps.size()) +
                        " ops alone before the backward that needs their outputs: " + list;
  } else if (p.reselected > 0) {
    a.checkpoint.note = "the nested plan also re-runs " + std::to_string(p.reselected) +
                        " cheap ops (norms, GELU/SiLU, unfused attention) alone before the "
                        "backward of the blocks it keeps";
  } else if (p.name == "selective") {
    a.checkpoint.note = "selective found no attention core to re-run (it re-runs unfused "
                        "attention, Megatron's selective recompute; flash attention keeps no "
                        "scores; selective_wide also re-runs norms and GELU/SiLU)";
  } else if (p.name == "selective_wide") {
    a.checkpoint.note = "selective_wide found no op to re-run (no GELU, SiLU, norm or unfused "
                        "attention whose output another op keeps)";
  }
}

} // namespace activations
} // namespace tally
