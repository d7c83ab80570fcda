// How far `tally run`'s measured step times can be trusted beside the estimate (issue 42): the
// spread of the timed steps (max / min) and the machine's 1-minute load average against its
// cores, both read by the generated step (codegen/program/driver_host.h, timingJson). A sentence
// per reason the comparison is unreliable; `tally run` prints them on stderr and in its JSON.
#pragma once

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <string>
#include <vector>

namespace tally {

struct Analysis;

/// The timed steps spread too far when the slowest took more than this many times the fastest.
constexpr double kRunSpreadLimit = 1.5;

/// One sentence per reason the measured times are unreliable: the steps spread beyond
/// kRunSpreadLimit (minS, maxS in seconds), or the load average `load` (NaN or negative:
/// unknown, no verdict) exceeded `cores`. Empty when neither.
std::vector<std::string> runTimingWarnings(double minS, double maxS, double load, int64_t cores);

/// `tally run` of a step on several processes: one row per rank (issue 39 item 6), the
/// estimate beside what that rank measured (the step's "per_rank" rows, driver_cpu.cpp): its
/// step, communication, pipeline bubble (estimated: PipelineTimeline's idle time of that
/// device; measured: the time its receives waited), the memory it allocates (arena and
/// regions: under pipeline parallelism its stage's, Analysis::pipelineStep) and its peak, and
/// the bytes it sent in the last step (estimated: the priced collectives and pipeline sends).
struct RankRow {
  int64_t rank = 0;
  double estStep = 0, estComm = 0, estBubble = 0, estArena = 0, estRegions = 0, estSent = 0;
  double estSentData = 0, estSentTensor = 0, estSentPipeline = 0; ///< estSent by group
  double step = 0, comm = 0, idle = 0, arena = 0, regions = 0, peak = 0, sent = 0;
};
/// The rows of a plan on data × tensor × pipeline ranks from the step's "per_rank" (null: the
/// estimate alone); empty for one rank.
std::vector<RankRow> rankRows(const Analysis &an, const llvm::json::Array *measured);
/// The rows as `tally run --format json`'s estimated.per_rank (est) or measured.per_rank.
llvm::json::Array rankRowsJson(const std::vector<RankRow> &rows, bool estimated);
/// The text table of the rows.
void printRankRows(llvm::raw_ostream &os, const std::vector<RankRow> &rows);

} // namespace tally
