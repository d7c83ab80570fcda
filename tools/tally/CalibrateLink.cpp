// The host's data-parallel interconnect, measured as the generated step uses it: an in-place
// fp32 MPI_Allreduce between 2 processes started by mpirun (tools/calibrate/mpi_bench.cpp, built
// beside tally where MPI is installed). The time model prices an all-reduce of B bytes over a
// ring of n = 2 ranks in one node as 2 (n − 1) latency + 2 (n − 1) / n · B / bandwidth
// (passes/StepTime.cpp, collectiveTime), so
//   latency   = t(8 B) / 2
//   bandwidth = 25 MiB / (t(25 MiB) − 2 · latency)
// and the target states efficiency.communication = 1 (the measured rate is the achieved one).
// mpirun is started with an argument vector; its output goes to a temporary file.
#include "tools/tally/CalibrateLink.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Program.h"

#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <unistd.h>

using namespace llvm;

namespace tally {

void measureLink(calibrate::Result &r, bool quick) {
  r.linkBandwidth = r.linkLatency = 0;
  auto mpirun = sys::findProgramByName("mpirun");
  if (!mpirun) {
    r.linkNote = "not measured: mpirun is not installed (Debian: openmpi-bin), so the time model uses host_link";
    return;
  }
  SmallString<256> bench(sys::fs::getMainExecutable(nullptr, reinterpret_cast<void *>(&measureLink)));
  sys::path::remove_filename(bench);
  sys::path::append(bench, "tally-mpi-bench");
  if (!sys::fs::can_execute(bench)) {
    r.linkNote = "not measured: " + bench.str().str() + " was not built (CMake found no MPI)";
    return;
  }
  SmallString<128> out;
  if (sys::fs::createTemporaryFile("tally-mpi-bench", "txt", out)) {
    r.linkNote = "not measured: no temporary file";
    return;
  }
  std::vector<std::string> args = {*mpirun, "-np", "2", "--bind-to", "none"};
  if (std::thread::hardware_concurrency() < 2)
    args.push_back("--oversubscribe");
  if (geteuid() == 0)
    args.push_back("--allow-run-as-root");
  args.push_back(bench.str().str());
  if (quick)
    args.push_back("--quick");
  std::vector<StringRef> argv(args.begin(), args.end());
  Optional<StringRef> redirects[] = {StringRef(""), StringRef(out), StringRef("")};
  std::string err;
  int rc = sys::ExecuteAndWait(*mpirun, argv, None, redirects, 120, 0, &err);
  auto text = MemoryBuffer::getFile(out);
  sys::fs::remove(out);
  std::map<double, double> seconds; // bytes → median call
  if (rc == 0 && text) {
    std::istringstream in((*text)->getBuffer().str());
    std::string word;
    double bytes = 0, t = 0;
    while (in >> word >> bytes >> t)
      if (word == "allreduce" && t > 0)
        seconds[bytes] = t;
  }
  if (seconds.size() < 2) {
    r.linkNote = "not measured: mpirun -np 2 tally-mpi-bench failed (" +
                 (err.empty() ? "exit " + std::to_string(rc) : err) + ")";
    return;
  }
  double small = seconds.begin()->second, bigBytes = seconds.rbegin()->first, big = seconds.rbegin()->second;
  r.linkLatency = small / 2;
  double transfer = big - 2 * r.linkLatency;
  r.linkBandwidth = transfer > 0 ? bigBytes / transfer : 0;
  char note[256];
  std::snprintf(note, sizeof note,
                "MPI_Allreduce of 2 processes (mpirun, fp32 in place), %.3g us for 8 B, %.4g ms for %.0f MiB",
                small * 1e6, big * 1e3, bigBytes / 1048576.0);
  r.linkNote = note;
  if (r.linkBandwidth <= 0)
    r.linkLatency = 0;
}

} // namespace tally
