// The host side of data parallelism under MPI, shared by the CPU steps' collectives
// (driver/tally_comm.h: MPI moves the gradients) and the CUDA steps' (driver/tally_comm_nccl.h:
// MPI starts the ranks, NCCL moves the gradients): error checks, the rank and group size, and
// the host-side sums the drivers use outside the timed steps (the loss of the whole batch, the
// fp16 overflow check over ZeRO shards, ZeRO master shards gathered for --save), the ranks'
// byte counts gathered and the pieces of --save merged.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace tally_mpi {

/// An MPI call's result: a failure becomes an exception naming the call and MPI's message.
inline void check(int rc, const char *what) {
  if (rc != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, text, &len);
    throw std::runtime_error(std::string(what) + " failed: " + std::string(text, static_cast<size_t>(len)));
  }
}

inline int rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int size() {
  int n = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  return n;
}

/// The sum of x over the ranks.
inline double sum(double x) {
  double out = x;
  check(MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}

/// Elementwise sums of n host floats over the ranks, in place.
inline void sum(float *x, int64_t n) {
  for (int64_t at = 0; at < n; at += INT_MAX / 2) {
    int c = static_cast<int>(std::min<int64_t>(n - at, INT_MAX / 2));
    check(MPI_Allreduce(MPI_IN_PLACE, x + at, c, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }
}

/// Every rank's count (rank order), gathered on the host outside the timed steps.
inline std::vector<int64_t> gather_counts(int64_t mine) {
  std::vector<int64_t> all(static_cast<size_t>(size()), 0);
  check(MPI_Allgather(&mine, 1, MPI_INT64_T, all.data(), 1, MPI_INT64_T, MPI_COMM_WORLD), "MPI_Allgather");
  return all;
}

/// Bitwise or of n host bytes over the ranks, in place: assembles pieces each held by one rank
/// (--save of tensor cuts or pipeline stages, driver_host.h WholeModel::merge).
inline void merge(uint8_t *x, int64_t n) {
  for (int64_t at = 0; at < n; at += INT_MAX / 2) {
    int c = static_cast<int>(std::min<int64_t>(n - at, INT_MAX / 2));
    check(MPI_Allreduce(MPI_IN_PLACE, x + at, c, MPI_BYTE, MPI_BOR, MPI_COMM_WORLD), "MPI_Allreduce");
  }
}

} // namespace tally_mpi
