// The prebuilt CUDA runtime: every function of cuda_rt_instances.h explicitly instantiated for
// one storage type, TALLY_RT_LIB_T (float, rt::bf16 or rt::f16, given with -D), with the copies
// from it to every type. cuda_rt_lib.sh compiles it once per type into libtally_rt_cuda.a, which
// the generated steps of cuda-step-compiles and tests/step/cuda_check link (cuda_rt_extern.cuh).
#include "cuda/tally_rt.cuh"
#include "cuda_rt_instances.h"

#ifndef TALLY_RT_LIB_T
#error "compile with -DTALLY_RT_LIB_T=float (or rt::bf16, rt::f16)"
#endif
TALLY_RT_INSTANCES(template, TALLY_RT_LIB_T)
TALLY_RT_COPIES(template, TALLY_RT_LIB_T)
#ifdef TALLY_RT_LIB_HALF
TALLY_RT_HALF_INSTANCES(template, TALLY_RT_LIB_T)
#endif
