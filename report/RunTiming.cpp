// The verdict on `tally run`'s timing (report/RunTiming.h).
#include "report/RunTiming.h"

#include "ir/Units.h"
#include "support/Format.h"

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

} // namespace tally
