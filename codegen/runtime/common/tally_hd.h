// tally runtime, common: the TALLY_HD marker and the bit casts every other common header uses.
#pragma once

#include <cstdint>
#include <cstring>
#include <cmath>

/// `__host__ __device__` under nvcc, nothing for a plain C++ compiler: every function in
/// common/ is marked with it so that the CUDA kernels call the same arithmetic as the CPU.
#if defined(__CUDACC__)
#define TALLY_HD __host__ __device__
#else
#define TALLY_HD
#endif

namespace rt {

/// The bits of a float (no aliasing tricks: memcpy on the host, the intrinsic on the device).
TALLY_HD inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
#endif
}

/// The float with the given bits.
TALLY_HD inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

} // namespace rt
