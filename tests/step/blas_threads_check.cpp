// ctest step-blas-threads: a program linking the CPU runtime that calls
// rt::restart_with_single_threaded_blas first (as the generated driver and tally-measure do)
// has no OpenBLAS worker threads: one thread in /proc/self/task until OpenMP starts its own.
// Without the restart, the pthread build of OpenBLAS starts cores - 1 workers when it loads
// (checked: 2 threads on the 2-core CI machine), which time-share the cores with the step's
// OpenMP threads and made the first calls of a process up to 400x slower.
// Exit 0 when the restart happened and one thread runs; 1 otherwise, saying what it saw.
#include "tally_rt.h"

#include <dirent.h>

#include <cstdio>
#include <cstdlib>

static int threads() {
  int n = 0;
  if (DIR *d = opendir("/proc/self/task")) {
    while (dirent *e = readdir(d))
      n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

int main(int argc, char **argv) {
  (void)argc;
  bool inherited = argc > 1 && std::getenv("OPENBLAS_NUM_THREADS") != nullptr;
  rt::restart_with_single_threaded_blas(argv);
  const char *v = std::getenv("OPENBLAS_NUM_THREADS");
  int n = threads();
  // One small matmul after counting, so that the program links OpenBLAS (and loads it at start).
  float a = 2, b = 3, c = 0;
  rt::Ctx ctx;
  ctx.threads = 1;
  rt::matmul<float>(ctx, false, false, 1, 1, 1, 1.0f, &a, 1, 0, &b, 1, 0, 0.0f, &c, 1, 0, 1);
  std::printf("OPENBLAS_NUM_THREADS=%s, %d thread(s) at main, 2 x 3 = %g%s\n", v ? v : "(unset)", n, c,
              inherited ? " (set by the caller)" : "");
  return v != nullptr && n == 1 && c == 6 ? 0 : 1;
}
