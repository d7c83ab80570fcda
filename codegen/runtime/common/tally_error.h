// tally runtime, common: rt::Error, what the CPU runtime's kernels and the host-side helpers
// (tally_safetensors.h) throw on bad input. Host code only (not TALLY_HD); the CUDA runtime's
// kernels throw rt::cu::Error, and a CUDA driver sees both.
#pragma once

#include <stdexcept>

namespace rt {

/// Bad input: a kernel rejected its arguments (a negative size, an index out of range, …) or a
/// host helper rejected a file. The message names the kernel or file and the bad value.
struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace rt
