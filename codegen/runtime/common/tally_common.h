// tally runtime, common arithmetic: the umbrella header.
// Everything the CPU runtime (cpu/) and the CUDA runtime (cuda/) compute per element or per row
// is written once in these headers as `TALLY_HD inline` functions, so both runtimes give the
// same numbers. Header-only; no dependency beyond <cstdint>/<cmath>/<cstring>.
#pragma once

#include "tally_hd.h"
#include "tally_types.h"
#include "tally_philox.h"
#include "tally_math.h"
#include "tally_rows.h"
#include "tally_optim.h"
#include "tally_attn.h"
