// StepTimeline.cpp — the estimated training step laid out on a time axis, for `tally run
// --trace` (report/ChromeTrace.cpp writes it beside the measured step).
#pragma once

#include "passes/Analysis.h"

#include <string>
#include <vector>

namespace tally {

/// One slice of the estimated step on one device: seconds from the step's start.
struct TimelineSlice {
  std::string track;      ///< "compute", "communication", "host", or "stage 0", "stage 1", ... (pipelines)
  std::string name;       ///< "h[0].attn.qkv.matmul (forward)", "optimizer", "data-parallel communication"
  std::string phase;      ///< forward, backward, recompute, optimizer, communication, host transfer
  OpId op = kNone;        ///< the forward graph's op (per-op slices), else kNone
  int64_t microBatch = -1;
  double start = 0, seconds = 0;
};

/// The step as StepTime.cpp prices it, in the order the step runs, from 0. Without pipeline
/// stages: each micro-batch's ops in the schedule's order (Analysis::schedule: forward,
/// backward and recompute, each op's forwardTime or backwardTime, a last partial micro-batch
/// scaled by its share), fp8's weight casts first, then the exposed communication (one slice per
/// kind: data, tensor, context, expert parallel), the optimizer update and the host transfers;
/// the slices of a track follow one another and the last ends at time.step. With pipeline
/// stages: the pipeline's slots (PipelineTimeline.cpp: the first rounds of micro-batches), a
/// track per stage, then the communication, optimizer and host slices after its makespan.
std::vector<TimelineSlice> estimatedTimeline(const Analysis &a);

} // namespace tally
