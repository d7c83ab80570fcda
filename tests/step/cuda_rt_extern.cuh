// Force-included (nvcc -include) into the translation units that link the prebuilt CUDA runtime
// (cuda_rt_lib.cu, built once by cuda_rt_lib.sh): the runtime's header, then an explicit
// instantiation declaration of every function in cuda_rt_instances.h for float, bf16 and fp16,
// so those translation units compile no kernel of the runtime themselves (only the fused ones,
// whose functor is theirs) and link the library's. Found as "cuda/tally_rt.cuh" on the include
// path: in a generated step that is the step's own copy (runtime/cuda/), which its step.cu
// includes too.
#pragma once

#include "cuda/tally_rt.cuh"
#include "cuda_rt_instances.h"

TALLY_RT_INSTANCES(extern template, float)
TALLY_RT_INSTANCES(extern template, rt::bf16)
TALLY_RT_INSTANCES(extern template, rt::f16)
TALLY_RT_HALF_INSTANCES(extern template, rt::bf16)
TALLY_RT_HALF_INSTANCES(extern template, rt::f16)
TALLY_RT_COPIES(extern template, float)
TALLY_RT_COPIES(extern template, rt::bf16)
TALLY_RT_COPIES(extern template, rt::f16)
