// Compiles every function of the CUDA runtime (codegen/runtime/cuda/tally_rt.cuh) for the
// storage types cuda_check.cu does not run (fp16, and copies between every pair of types) by
// explicit instantiation, so that the test suite catches a kernel that does not build with nvcc
// on a machine without a GPU. Linked into tests/step/cuda_check; defines no entry point. The
// list of functions is tests/step/cuda_rt_instances.h's, which the prebuilt runtime
// (cuda_rt_lib.cu) instantiates too.
#include "codegen/runtime/cuda/tally_rt.cuh"
#include "tests/step/cuda_rt_instances.h"

TALLY_RT_INSTANCES(template, rt::f16)
TALLY_RT_HALF_INSTANCES(template, rt::f16)
TALLY_RT_COPIES(template, float)
TALLY_RT_COPIES(template, rt::bf16)
TALLY_RT_COPIES(template, rt::f16)
