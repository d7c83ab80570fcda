// How far `tally run`'s measured step times can be trusted beside the estimate (issue 42): the
// spread of the timed steps (max / min) and the machine's 1-minute load average against its
// cores, both read by the generated step (codegen/program/driver_host.h, timingJson). A sentence
// per reason the comparison is unreliable; `tally run` prints them on stderr and in its JSON.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tally {

/// The timed steps spread too far when the slowest took more than this many times the fastest.
constexpr double kRunSpreadLimit = 1.5;

/// One sentence per reason the measured times are unreliable: the steps spread beyond
/// kRunSpreadLimit (minS, maxS in seconds), or the load average `load` (NaN or negative:
/// unknown, no verdict) exceeded `cores`. Empty when neither.
std::vector<std::string> runTimingWarnings(double minS, double maxS, double load, int64_t cores);

} // namespace tally
