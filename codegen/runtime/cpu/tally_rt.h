// tally CPU runtime: the one header generated training steps include. Every kernel of
// codegen/runtime/API.md, as templates over the storage type (float, rt::bf16, rt::f16; double
// for the tests). Header-only: link OpenBLAS and OpenMP (CMake: include tally_rt_cpu.cmake and
// link the `tally_rt_cpu` interface target). Formulas: docs/runtime.md.
#pragma once

#include "rt_ctx.h"
#include "rt_elementwise.h"
#include "rt_matmul.h"
#include "rt_rows.h"
#include "rt_attention.h"
#include "rt_optim.h"
