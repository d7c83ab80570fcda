// tally-mpi-bench: the host's data-parallel interconnect as the generated step uses it, for
// `tally calibrate` (tools/tally/CalibrateLink.cpp starts it as `mpirun -np 2 tally-mpi-bench`).
// Times MPI_Allreduce in place over fp32 (MPI_SUM on MPI_COMM_WORLD, what
// codegen/program/tally_comm.h calls for every gradient bucket) at 8 bytes (latency) and at one
// 25 MiB bucket (bandwidth; PyTorch DDP's bucket, the generated step's): one warm-up call, then
// calls until both a minimum count and a minimum time are reached, the median counting (as in
// the rest of the calibration: the estimate is compared with the median step). Rank 0 prints
// one line per size: "allreduce BYTES SECONDS".
// Built only where CMake finds MPI (tools/calibrate/CMakeLists.txt).
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  bool quick = argc > 1 && std::string_view(argv[1]) == "--quick";
  for (long bytes : {8L, 25L * 1024 * 1024}) {
    std::vector<float> v(static_cast<size_t>(bytes / 4), 1.0f);
    int count = static_cast<int>(v.size());
    MPI_Allreduce(MPI_IN_PLACE, v.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    std::vector<double> times;
    double total = 0;
    int calls = 0, minCalls = bytes < 1024 ? 200 : 3;
    double minSeconds = quick ? 0.01 : 0.2;
    // Every rank must make the same number of calls: rank 0 decides when to stop.
    for (int more = 1; more;) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t0 = MPI_Wtime();
      MPI_Allreduce(MPI_IN_PLACE, v.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      double t = MPI_Wtime() - t0;
      times.push_back(t);
      total += t;
      ++calls;
      more = (calls < minCalls || total < minSeconds) && calls < 10000;
      MPI_Bcast(&more, 1, MPI_INT, 0, MPI_COMM_WORLD);
    }
    std::sort(times.begin(), times.end());
    if (rank == 0)
      std::printf("allreduce %ld %.9g\n", bytes, times[times.size() / 2]);
  }
  MPI_Finalize();
  return 0;
}
