// `tally calibrate`'s measurements, run as the child process tally-measure (built beside the
// tally binary; tools/calibrate/measure_main.cpp) so that tally never loads OpenBLAS.
#pragma once

#include "tools/calibrate/Calibrate.h"

#include <string>

namespace tally {

/// Runs tally-measure (the one beside the tally binary, or the program named by the
/// environment variable TALLY_MEASURE) and reads its Result; false with `error` set — the
/// program is missing, did not finish, exited non-zero or printed something that is not the
/// protocol's object — and `r` untouched. `quick`: passes --quick.
bool measureHost(bool quick, calibrate::Result &r, std::string &error);

} // namespace tally
