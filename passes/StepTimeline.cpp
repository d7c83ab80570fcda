// StepTimeline.cpp — the estimated training step laid out on a time axis (StepTimeline.h), for
// `tally run --trace`: every duration is one StepTime.cpp computed (an op's forwardTime or
// backwardTime, the optimizer's, the exposed communication's) or PipelineTimeline.cpp's slots;
// this pass only places them one after another, in the order the step runs them.
#include "passes/StepTimeline.h"

#include <algorithm>
#include <cmath>

namespace tally {

namespace {

const char *const kPhase[] = {"forward", "backward", "recompute"};

/// Appends a slice of `seconds` at `t` (when positive) and advances `t`.
void put(std::vector<TimelineSlice> &out, double &t, const std::string &track, const std::string &name,
         const std::string &phase, double seconds, OpId op = kNone, int64_t microBatch = -1) {
  if (!(seconds > 0))
    return;
  out.push_back({track, name, phase, op, microBatch, t, seconds});
  t += seconds;
}

/// One micro-batch's ops on the compute track, scaled by `share` (1, or the last partial
/// micro-batch's fraction): the schedule's forward, backward and recompute steps, or without a
/// schedule the ops forward and then backward in reverse.
void microBatch(const Analysis &a, int64_t mb, double share, double estimatedRecompute, double &t,
                std::vector<TimelineSlice> &out) {
  const Graph &g = *a.graph;
  size_t n = std::min(a.ops.size(), g.ops.size());
  auto op = [&](ScheduleStep::Kind k, OpId i) {
    if (i >= n)
      return;
    double s = k == ScheduleStep::Backward ? a.ops[i].backwardTime : a.ops[i].forwardTime;
    put(out, t, "compute", g.opPath(i) + " (" + kPhase[k] + ")", kPhase[k], s * share, i, mb);
  };
  if (a.schedule.empty()) {
    for (OpId i = 0; i < n; ++i)
      op(ScheduleStep::Forward, i);
    for (OpId i = static_cast<OpId>(n); i-- > 0;)
      op(ScheduleStep::Backward, i);
  }
  for (const ScheduleStep &s : a.schedule)
    op(s.kind, s.op);
  // StepTime prices recompute from FLOPs where the schedule lists no recompute step.
  put(out, t, "compute", "recompute (priced from its FLOPs)", "recompute", estimatedRecompute * share, kNone, mb);
}

} // namespace

std::vector<TimelineSlice> estimatedTimeline(const Analysis &a) {
  std::vector<TimelineSlice> out;
  const Plan &plan = *a.plan;
  double t = 0;
  bool recomputeSteps = std::any_of(a.schedule.begin(), a.schedule.end(),
                                    [](const ScheduleStep &s) { return s.kind == ScheduleStep::Recompute; });
  if (!a.pipeline.slots.empty()) {
    for (const Analysis::PipelineSlot &s : a.pipeline.slots) {
      std::string name = std::string(s.backward ? "backward" : "forward") + " micro-batch " + std::to_string(s.microBatch) +
                         (a.pipeline.interleave > 1 ? " chunk " + std::to_string(s.chunk) : "");
      out.push_back({"stage " + std::to_string(s.stage), name, s.backward ? "backward" : "forward", kNone, s.microBatch,
                     s.start, s.end - s.start});
    }
    t = a.pipeline.makespan;
  } else {
    // StepTime step 4 without stages: m micro-batches per device, m = batch / (micro_batch × d).
    double d = std::max<double>(1, static_cast<double>(plan.parallel.data));
    double m = plan.microBatch > 0 ? static_cast<double>(plan.batch) / (static_cast<double>(plan.microBatch) * d) : 1;
    double perMicroBatchRecompute = !recomputeSteps && m > 0 ? a.time.recompute / m : 0;
    put(out, t, "compute", "fp8 weight casts", "forward", a.fp8.weightCast);
    for (int64_t k = 0; static_cast<double>(k) < m - 1e-9; ++k)
      microBatch(a, k, std::min(1.0, m - static_cast<double>(k)), perMicroBatchRecompute, t, out);
  }
  const std::pair<const char *, double> comm[] = {
      {"data-parallel communication (exposed)", a.time.dataParallelComm},
      {"tensor-parallel all-reduces", a.time.tensorParallelComm},
      {"pipeline sends", a.time.pipelineComm},
      {"context-parallel ring (exposed)", a.time.contextParallelComm},
      {"expert-parallel all-to-alls", a.time.expertParallelComm}};
  for (const auto &[name, seconds] : comm)
    put(out, t, "communication", name, "communication", seconds);
  put(out, t, "compute", "optimizer update", "optimizer", a.time.optimizer);
  put(out, t, "host", "host transfers", "host transfer", a.time.hostTransfer);
  return out;
}

} // namespace tally
