// tally generated steps, CUDA only: what a generated step.cu gives its driver (driver_cuda.cu)
// beyond driver/tally_step.h. The kernels' CUDA-event times come back with the op path that
// was in ctx.where when they launched; kOpSites gives each path's op class, so the driver files
// kernel times by op class as the CPU driver does (the CPU step sets the op_class global).
#pragma once

namespace tally_step {

/// One op path that ctx.where takes in the step, and its op class ("matmul", "attention", …).
struct OpSite {
  const char *path;
  const char *op_class;
};
extern const OpSite kOpSites[];
extern const int kNumOpSites;

/// 256 bytes of device memory the driver allocates beside the regions, for scalars the host reads
/// back: the fp16 overflow check's sum of squares (rt::sum_squares writes its result there).
extern float *device_scalars;

} // namespace tally_step
