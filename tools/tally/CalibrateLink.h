// `tally calibrate`'s interconnect measurement: the MPI all-reduce of 2 processes on this
// machine (tools/calibrate/mpi_bench.cpp under mpirun), the host target's `interconnect` and
// `link_latency` for data-parallel steps (docs/targets.md, "The host target").
#pragma once

#include "tools/calibrate/Calibrate.h"

namespace tally {

/// Runs `mpirun -np 2 tally-mpi-bench` (the bench beside the tally binary) and fills
/// r.linkBandwidth, r.linkLatency and r.linkNote; without mpirun or the bench, or when the run
/// fails, leaves them 0 and says why in r.linkNote. `quick`: short timings.
void measureLink(calibrate::Result &r, bool quick);

} // namespace tally
