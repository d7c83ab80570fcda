// tally calibrate's measurements in a child process: tally-measure (tools/calibrate/
// measure_main.cpp) links OpenBLAS and OpenMP, which tally itself would otherwise load at every
// start (about 2 ms of each `tally --version`; docs/performance.md). It is started with an
// argument vector (no shell), its stdout goes to a temporary file, its stderr is tally's, and
// what it printed is read with calibrate::resultFromJSON (tools/calibrate/Protocol.cpp).
// TALLY_MEASURE=PROGRAM runs PROGRAM instead (the tests' broken children).
#include "tools/tally/CalibrateMeasure.h"

#include "llvm/ADT/SmallString.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Program.h"

using namespace llvm;

namespace tally {

namespace {

/// The measurement program: $TALLY_MEASURE, else tally-measure beside this executable.
std::string measureProgram() {
  if (Optional<std::string> x = sys::Process::GetEnv("TALLY_MEASURE"); x && !x->empty())
    return *x;
  SmallString<256> p(sys::fs::getMainExecutable(nullptr, reinterpret_cast<void *>(&measureHost)));
  sys::path::remove_filename(p);
  sys::path::append(p, "tally-measure");
  return std::string(p);
}

} // namespace

bool measureHost(bool quick, calibrate::Result &r, std::string &error) {
  std::string program = measureProgram();
  if (!sys::fs::exists(program) || sys::fs::is_directory(program) || !sys::fs::can_execute(program)) {
    error = "the measurement program '" + program + "' is missing or not executable (tally-measure is " +
            "built beside the tally binary; rebuild tally, or unset TALLY_MEASURE)";
    return false;
  }
  SmallString<128> out;
  if (std::error_code ec = sys::fs::createTemporaryFile("tally-measure", "json", out)) {
    error = "no temporary file for the measurements' output: " + ec.message();
    return false;
  }
  std::vector<StringRef> argv = {program};
  if (quick)
    argv.push_back("--quick");
  Optional<StringRef> redirects[] = {StringRef(""), StringRef(out), None};
  std::string err;
  bool failed = false;
  // No time limit: a full calibration takes seconds to a minute and a busy machine more.
  int rc = sys::ExecuteAndWait(program, argv, None, redirects, 0, 0, &err, &failed);
  ErrorOr<std::unique_ptr<MemoryBuffer>> text = MemoryBuffer::getFile(out);
  sys::fs::remove(out);
  if (failed || rc != 0) {
    error = "the measurement program '" + program + "' " +
            (failed ? "could not be started (" + err + ")"
             : rc < 0 ? "did not finish (" + (err.empty() ? std::string("killed") : err) + ")"
                      : "exited with status " + std::to_string(rc) + " (its messages are above)");
    return false;
  }
  if (!text) {
    error = "cannot read the measurements' output: " + text.getError().message();
    return false;
  }
  std::string why;
  if (!calibrate::resultFromJSON((*text)->getBuffer().str(), r, why)) {
    error = "the measurement program '" + program + "' printed something that is not its protocol's output: " + why;
    return false;
  }
  return true;
}

} // namespace tally
