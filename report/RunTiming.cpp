// The verdict on `tally run`'s timing (report/RunTiming.h).
#include "report/RunTiming.h"

#include "ir/Units.h"
#include "passes/Collectives.h"
#include "passes/Passes.h"
#include "support/Format.h"

#include "llvm/Support/FormatVariadic.h"

#include <cmath>

namespace tally {

std::vector<std::string> runTimingWarnings(double minS, double maxS, double load, int64_t cores) {
  std::vector<std::string> out;
  if (std::isfinite(minS) && std::isfinite(maxS) && minS > 0 && maxS > kRunSpreadLimit * minS)
    out.push_back("the timed steps took from " + formatDuration(minS) + " to " + formatDuration(maxS) +
                  " (the slowest " + significant(maxS / minS, 3) + " times the fastest, more than " +
                  significant(kRunSpreadLimit, 3) +
                  "): something else used the machine or the step is noisy, so comparing the median with "
                  "the estimate is unreliable (run more --steps, or on a quieter machine)");
  if (std::isfinite(load) && load >= 0 && cores > 0 && load > static_cast<double>(cores))
    out.push_back("the load average was " + significant(load, 3) + " on " + std::to_string(cores) + " core" +
                  (cores == 1 ? "" : "s") +
                  ": other processes competed for the cores, so comparing the measured times with the "
                  "estimate is unreliable (run on a quieter machine)");
  return out;
}

std::vector<RankRow> rankRows(const Analysis &an, const llvm::json::Array *measured) {
  const Parallelism &par = an.plan->parallel;
  const int64_t p = std::max<int64_t>(1, par.pipeline);
  const int64_t world = par.data * par.tensor * p;
  std::vector<RankRow> rows;
  if (world <= 1)
    return rows;
  const auto &ps = an.pipelineStep;
  for (int64_t r = 0; r < world; ++r) {
    RankRow x;
    x.rank = r;
    int64_t stage = rankCoordinate(*an.plan, r, 'p'); // by the plan's rank order, as the step splits its groups
    x.estStep = an.time.step;
    x.estComm = an.time.dataParallelComm + an.time.tensorParallelComm + an.time.pipelineComm;
    x.estBubble = static_cast<size_t>(stage) < an.pipeline.idle.size() ? an.pipeline.idle[static_cast<size_t>(stage)]
                  : p > 1                                            ? an.time.bubble
                                                                     : 0;
    bool staged = static_cast<size_t>(stage) < ps.ranks.size() && !ps.chunks.empty();
    const auto &rank = staged ? ps.ranks[static_cast<size_t>(stage)] : Analysis::PipelineStep::Rank{};
    x.estArena = staged ? static_cast<double>(rank.arenaBytes) : static_cast<double>(an.arenaBytes);
    x.estRegions = staged ? static_cast<double>(rank.params.bytes + rank.grads.bytes + rank.master.bytes +
                                                rank.optimizer.bytes)
                          : static_cast<double>(an.regions.params.bytes + an.regions.grads.bytes +
                                                an.regions.master.bytes + an.regions.optimizer.bytes);
    x.estSentData = dataParallelSentBytes(an, stage);
    x.estSentTensor = tensorParallelSentBytes(an, stage);
    x.estSentPipeline = pipelineSentBytes(an, stage);
    x.estSent = x.estSentData + x.estSentTensor + x.estSentPipeline;
    const llvm::json::Object *m =
        measured && static_cast<size_t>(r) < measured->size() ? (*measured)[static_cast<size_t>(r)].getAsObject() : nullptr;
    auto get = [&](const char *k) { return m ? m->getNumber(k).getValueOr(NAN) : NAN; };
    x.step = get("step_s"), x.comm = get("communication_s"), x.idle = get("idle_s"), x.arena = get("arena_bytes");
    x.regions = get("regions_bytes"), x.peak = get("peak_bytes"), x.sent = get("sent_bytes");
    rows.push_back(x);
  }
  return rows;
}

llvm::json::Array rankRowsJson(const std::vector<RankRow> &rows, bool estimated) {
  llvm::json::Array out;
  for (const RankRow &x : rows) {
    if (estimated)
      out.push_back(llvm::json::Object{{"rank", x.rank},
                                       {"step_s", x.estStep},
                                       {"communication_s", x.estComm},
                                       {"bubble_s", x.estBubble},
                                       {"arena_bytes", x.estArena},
                                       {"regions_bytes", x.estRegions},
                                       {"sent_bytes", x.estSent},
                                       {"sent_bytes_by_group", llvm::json::Object{{"data", x.estSentData},
                                                                                  {"tensor", x.estSentTensor},
                                                                                  {"pipeline", x.estSentPipeline}}}});
    else
      out.push_back(llvm::json::Object{{"rank", x.rank},
                                       {"step_s", x.step},
                                       {"communication_s", x.comm},
                                       {"idle_s", x.idle},
                                       {"arena_bytes", x.arena},
                                       {"regions_bytes", x.regions},
                                       {"peak_bytes", x.peak},
                                       {"sent_bytes", x.sent}});
  }
  return out;
}

void printRankRows(llvm::raw_ostream &os, const std::vector<RankRow> &rows) {
  if (rows.empty())
    return;
  auto pair = [](const std::string &est, const std::string &got) { return est + " / " + got; };
  auto dur = [](double s) { return std::isfinite(s) ? formatDuration(s) : std::string("-"); };
  auto bytes = [](double b) { return std::isfinite(b) ? formatBytes(b) : std::string("-"); };
  os << "per rank (estimated / measured):\n";
  os << llvm::formatv("  {0,-4} {1,-22} {2,-22} {3,-22} {4,-24} {5,-10} {6}\n", "rank", "step", "communication",
                      "bubble / idle", "arena + regions", "peak", "bytes sent");
  for (const RankRow &x : rows)
    os << llvm::formatv("  {0,-4} {1,-22} {2,-22} {3,-22} {4,-24} {5,-10} {6}\n", x.rank,
                        pair(dur(x.estStep), dur(x.step)), pair(dur(x.estComm), dur(x.comm)),
                        pair(dur(x.estBubble), dur(x.idle)),
                        pair(bytes(x.estArena + x.estRegions), bytes(x.arena + x.regions)), bytes(x.peak),
                        pair(llvm::formatv("{0:f0}", x.estSent).str(),
                             std::isfinite(x.sent) ? llvm::formatv("{0:f0}", x.sent).str() : std::string("-")));
  os << "  bubble: the time the estimated schedule leaves the device idle (PipelineTimeline); idle: the\n"
        "  time the rank waited in its receives; peak: its resident set\n\n";
}

} // namespace tally
