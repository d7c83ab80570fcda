// tally calibrate's robust statistics (issue 46, item 5), a pure function of the call times so
// that tests need no noisy machine (tests/unit/test_calibrate_overwrite.cpp):
// - Scheduler slices: on a loaded machine a call that is descheduled waits for another task's
//   slice and takes about a whole slice longer (milliseconds); a 64³ matmul of 3 µs was once
//   timed at 8 ms. A call above sliceThreshold (fastest + max(fastest, slice / 2)) is rejected
//   before the median.
// - Spread: each measurement is taken in rounds seconds apart (Measure.cpp, class Rounds); the
//   medians of its rounds (all their calls: a median is not moved by a few slices, a round
//   mostly descheduled is) must agree within kSpreadBound. Not of the kept calls only: above
//   twice the fastest call they are rejected, so their rounds could never disagree by 2x. tally-measure times a
//   measurement that fails once more with twice the rounds; if it still fails, tally calibrate
//   refuses the calibration as noisy (tools/tally/Calibrate.cpp, [calibrate-noisy]).
#include "tools/calibrate/Calibrate.h"

#include "support/Format.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>

namespace tally {
namespace calibrate {

namespace {

double medianOf(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  return t.size() % 2 ? t[t.size() / 2] : 0.5 * (t[t.size() / 2 - 1] + t[t.size() / 2]);
}

} // namespace

double defaultSchedulerSlice(int cores) {
  int cpus = std::min(std::max(cores, 1), 8), log2 = 0;
  while ((2 << log2) <= cpus)
    ++log2;
  return 0.75e-3 * double(1 + log2);
}

double schedulerSlice(int cores, std::string &source) {
  for (const char *path : {"/sys/kernel/debug/sched/base_slice_ns", "/sys/kernel/debug/sched/min_granularity_ns",
                           "/proc/sys/kernel/sched_min_granularity_ns"}) {
    std::ifstream in(path);
    double ns = 0;
    if (in >> ns && std::isfinite(ns) && ns > 0) {
      source = path;
      return ns * 1e-9;
    }
  }
  source = "the kernel's default for " + std::to_string(cores) + " CPUs (its tunables are not readable)";
  return defaultSchedulerSlice(cores);
}

Timing summarize(const std::string &name, const std::vector<std::vector<double>> &rounds, double slice) {
  Timing t;
  t.name = name;
  t.rounds = int(rounds.size());
  double fastest = 0;
  bool any = false;
  for (const std::vector<double> &round : rounds)
    for (double x : round) {
      fastest = any ? std::min(fastest, x) : x;
      any = true;
    }
  if (!any)
    return t;
  const double limit = sliceThreshold(fastest, slice);
  std::vector<double> kept, perRound;
  for (const std::vector<double> &round : rounds) {
    std::vector<double> k;
    for (double x : round)
      (x > limit ? t.rejected : t.calls) += 1;
    std::copy_if(round.begin(), round.end(), std::back_inserter(k), [&](double x) { return x <= limit; });
    if (!round.empty())
      perRound.push_back(medianOf(round));
    kept.insert(kept.end(), k.begin(), k.end());
  }
  t.calls += t.rejected;
  t.median = medianOf(kept); // the fastest call is always kept
  auto [lo, hi] = std::minmax_element(perRound.begin(), perRound.end());
  t.spread = *lo > 0 ? *hi / *lo : (*hi > 0 ? INFINITY : 1.0);
  return t;
}

std::string noisyReason(const Timing &t) {
  if (!(t.spread <= kSpreadBound))
    return "its " + std::to_string(t.rounds) + " rounds' medians disagree " + significant(t.spread, 3) +
           "x (at most " + significant(kSpreadBound, 3) + "x)";
  if (t.waitShare > kWaitBound)
    return "its threads waited for a CPU " + significant(100 * t.waitShare, 3) + "% of its time (at most " +
           significant(100 * kWaitBound, 3) + "%)";
  if (2 * t.rejected > t.calls)
    return std::to_string(t.rejected) + " of its " + std::to_string(t.calls) +
           " calls were descheduled (rejected as scheduler slices)";
  return "";
}

std::string noisySummary(const Result &r) {
  // The first three in measuring order, then a count: a loaded machine fails most of the ~30.
  constexpr int Named = 3;
  std::string out;
  int noisy = 0;
  for (const Timing &t : r.timings)
    if (std::string why = noisyReason(t); !why.empty() && ++noisy <= Named)
      out += (out.empty() ? "" : "; ") + t.name + ": " + why;
  if (noisy > Named)
    out += "; and " + std::to_string(noisy - Named) + " more of the " + std::to_string(r.timings.size()) +
           " measurements";
  return out;
}

} // namespace calibrate
} // namespace tally
