// PipelineTimeline.cpp — the pipeline schedule of a train plan as timed slots, for the report's
// timeline chart.
//
// Each of the p stages runs its own list of work in a fixed order, and a slot starts when its
// device is free and its inputs exist:
//  - plain 1F1B (interleave = 1): stage s runs min(p − s − 1, m) warm-up forwards, then
//    alternates one forward and one backward, then drains the remaining backwards;
//  - interleaved 1F1B (interleave = v > 1, Megatron-LM's schedule): each device holds v model
//    chunks (virtual stage c·p + s); forwards go in rounds of p micro-batches through chunk 0,
//    then chunk 1, ..., backwards through the chunks in reverse; the warm-up is
//    2·(p − s − 1) + (v − 1)·p forwards.
// pipelineOrder is that order; the generated CPU step runs each rank's units in it
// (passes/PipelineStep.cpp, codegen/EmitPipeline.cpp), so the schedule simulated is the one run.
// A forward of virtual stage k needs the forward of stage k − 1 of the same micro-batch; a
// backward needs the backward of stage k + 1 (the last stage: its own forward). A slot lasts
// what its virtual stage computes for one micro-batch (StepTime.cpp step 4, stageTimes: the
// last stage holds the output layer and the loss, the first the embedding), or, where
// StepTime took the stages as balanced, F/(p·v) forward and (B + R)/(p·v) backward, with F, B,
// R one micro-batch's forward, backward and recompute time on one device; point-to-point
// sends are left out (StepTime prices them apart).
//
// The chart needs the schedule's shape, not every round of a long step: the slots hold at most
// max(p, 8) micro-batches (a multiple of p when interleaved), and `bubble` is the busiest
// device's idle time in that shortened schedule. For the plain 1F1B schedule it equals
// StepTime's (Σ_s W_s − max_s W_s) exactly, a check tests/unit/test_steptime.cpp makes.
#include "passes/Passes.h"

#include <algorithm>
#include <cmath>

namespace tally {

using Unit = PipelineUnit;

std::vector<Unit> pipelineOrder(int32_t s, int32_t p, int32_t m, int32_t v) {
  int64_t units = static_cast<int64_t>(m) * v;
  auto nth = [&](int64_t k, bool backward) {
    int64_t group = k / (static_cast<int64_t>(p) * v), inGroup = k % (static_cast<int64_t>(p) * v);
    int32_t chunk = static_cast<int32_t>(inGroup / p);
    if (backward)
      chunk = v - 1 - chunk;
    return Unit{static_cast<int32_t>(group * p + inGroup % p), chunk, backward};
  };
  int64_t warmup = v == 1 ? std::min<int64_t>(p - s - 1, m)
                          : std::min<int64_t>(2 * (p - s - 1) + static_cast<int64_t>(v - 1) * p, units);
  std::vector<Unit> order;
  order.reserve(static_cast<size_t>(2 * units));
  int64_t f = 0, b = 0;
  for (; f < warmup; ++f)
    order.push_back(nth(f, false));
  while (f < units) {
    order.push_back(nth(f++, false));
    order.push_back(nth(b++, true));
  }
  while (b < units)
    order.push_back(nth(b++, true));
  return order;
}

void pipelineTimeline(Analysis &a) {
  auto &pl = a.pipeline;
  std::vector<double> stageForward = std::move(pl.stageForward), stageBackward = std::move(pl.stageBackward);
  pl = {};
  pl.stageForward = std::move(stageForward); // StepTime's (step 4), kept whether drawn or not
  pl.stageBackward = std::move(stageBackward);
  const Plan &plan = *a.plan;
  int64_t p = plan.parallel.pipeline, v = std::max<int64_t>(1, plan.parallel.interleave);
  int64_t m = a.time.accumulationSteps;
  if (!plan.isTrain || p <= 1 || m <= 0 || a.time.forward + a.time.backward <= 0)
    return;
  // Megatron runs the interleaved schedule only when the micro-batches come in whole rounds
  // of p; the timeline is drawn only for schedules that can run.
  if (v > 1 && m % p != 0)
    return;
  int64_t shown = std::min<int64_t>(m, std::max<int64_t>(p, 8));
  if (v > 1)
    shown = std::max<int64_t>(p, shown / p * p);
  // Slots are p · shown · v · 2; a pipeline of thousands of stages is drawn for no one.
  if (p > 512 || v > 64)
    return;
  pl.stages = p;
  pl.interleave = v;
  pl.microBatches = m;
  pl.shownMicroBatches = shown;

  // One micro-batch's forward and backward (+ recompute) of each virtual stage: what
  // StepTime counted per chunk, or, where it took the stages as balanced, one device's share
  // split over its chunks.
  double mb = static_cast<double>(plan.batch) /
              (static_cast<double>(plan.microBatch) * std::max<int64_t>(1, plan.parallel.data));
  std::vector<double> fwd = pl.stageForward, bwd = pl.stageBackward;
  if (fwd.size() != static_cast<size_t>(p * v) || bwd.size() != fwd.size()) {
    fwd.assign(static_cast<size_t>(p * v), a.time.forward / mb / static_cast<double>(v));
    bwd.assign(static_cast<size_t>(p * v),
               (a.time.backward + a.time.recompute) / mb / static_cast<double>(v));
  }
  std::vector<double> perDevice(static_cast<size_t>(p), 0); // one micro-batch, all its chunks
  for (size_t k = 0; k < fwd.size(); ++k)
    perDevice[k % static_cast<size_t>(p)] += fwd[k] + bwd[k];

  int32_t P = static_cast<int32_t>(p), V = static_cast<int32_t>(v), M = static_cast<int32_t>(shown);
  int64_t virtualStages = p * v;
  // End times by (virtual stage, micro-batch); negative: not yet run.
  std::vector<double> fwdEnd(static_cast<size_t>(virtualStages * shown), -1),
      bwdEnd(static_cast<size_t>(virtualStages * shown), -1);
  auto at = [&](int64_t vs, int32_t micro) { return static_cast<size_t>(vs * shown + micro); };
  std::vector<std::vector<Unit>> orders;
  for (int32_t s = 0; s < P; ++s)
    orders.push_back(pipelineOrder(s, P, M, V));
  std::vector<size_t> next(static_cast<size_t>(p), 0);
  std::vector<double> free(static_cast<size_t>(p), 0);
  size_t remaining = 0;
  for (const auto &o : orders)
    remaining += o.size();
  pl.slots.reserve(remaining);
  // Sweep the stages, running every slot whose inputs exist, until all have run. Each sweep
  // runs at least one slot of a valid schedule; a sweep that runs none would be a deadlock in
  // the order above, which the schedules built here never have (the chart is then dropped).
  while (remaining > 0) {
    bool progress = false;
    for (int32_t s = 0; s < P; ++s) {
      auto &order = orders[static_cast<size_t>(s)];
      size_t &i = next[static_cast<size_t>(s)];
      while (i < order.size()) {
        const Unit &u = order[i];
        int64_t vs = static_cast<int64_t>(u.chunk) * p + s;
        double ready;
        if (!u.backward)
          ready = vs == 0 ? 0 : fwdEnd[at(vs - 1, u.microBatch)];
        else
          ready = vs == virtualStages - 1 ? fwdEnd[at(vs, u.microBatch)] : bwdEnd[at(vs + 1, u.microBatch)];
        if (ready < 0)
          break;
        double start = std::max(ready, free[static_cast<size_t>(s)]);
        double end = start + (u.backward ? bwd : fwd)[static_cast<size_t>(vs)];
        (u.backward ? bwdEnd : fwdEnd)[at(vs, u.microBatch)] = end;
        free[static_cast<size_t>(s)] = end;
        pl.slots.push_back({s, u.chunk, u.microBatch, u.backward, start, end});
        pl.makespan = std::max(pl.makespan, end);
        ++i;
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      std::vector<double> f = std::move(pl.stageForward), b = std::move(pl.stageBackward);
      pl = {};
      pl.stageForward = std::move(f);
      pl.stageBackward = std::move(b);
      return;
    }
  }
  pl.bubble = pl.makespan - static_cast<double>(shown) *
                               *std::max_element(perDevice.begin(), perDevice.end());
  pl.idle.assign(static_cast<size_t>(p), pl.makespan);
  for (const Analysis::PipelineSlot &slot : pl.slots)
    pl.idle[static_cast<size_t>(slot.stage)] -= slot.end - slot.start;
}

} // namespace tally
