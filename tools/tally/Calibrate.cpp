// `tally calibrate [-o FILE] [--quick]`: measures this machine (tools/calibrate, run as the child
// process tally-measure: tools/tally/CalibrateMeasure.cpp) and writes it as a
// `target host { ... }` declaration; without -o, into the per-machine cache
// ($XDG_CACHE_HOME/tally, else ~/.cache/tally, file host-<hostname>-<CPU hash>.tally).
// Also the loader of external targets (ir/Target.h) that Sema calls: `host` reads the cached
// calibration, running it first when there is none (with a note on stderr); a name ending in
// `.tally` reads that file, which must declare exactly one target.
//
// Exit codes: 0 written, 1 the measurements failed ([calibrate-failed]: tally-measure missing,
// failing or printing something else), were noisy (a measurement's rounds disagreed beyond
// calibrate::kSpreadBound even when re-measured, or most of its calls were scheduler slices:
// [calibrate-noisy], the existing file kept or none written; --force writes it, and a --quick
// one is written with a warning) or were made under load (a load average above the cores)
// while the existing calibration was made at a lower load ([calibrate-busy]; --force replaces it), 2 the file could not be written ([io-error]).
// The implicit calibration of `target = host` caches no noisy calibration either.
#include "driver/Compiler.h"
#include "report/Output.h"
#include "tools/calibrate/Calibrate.h"
#include "tools/tally/CalibrateLink.h"
#include "tools/tally/CalibrateMeasure.h"
#include "tools/tally/Commands.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <ctime>
#include <map>

#include <unistd.h>

using namespace llvm;

namespace tally {
namespace calibrateopts {

cl::SubCommand Calibrate("calibrate", "Measure this machine as the `host` target (matmul FLOP/s, "
                                      "bandwidth, elementwise throughput, call and exp costs)");
cl::OptionCategory Cat("tally calibrate options");
cl::opt<std::string> Output("o", cl::desc("Write the target here (default: the per-machine cache)"),
                            cl::value_desc("file"), cl::sub(Calibrate), cl::cat(Cat));
cl::opt<bool> Quick("quick", cl::desc("Small sizes and short timings (under 5 s): for tests"),
                    cl::sub(Calibrate), cl::cat(Cat));
cl::opt<bool> Force("force", cl::desc("Replace the existing calibration even when this one was measured under load "
                                      "(a load average above the cores) and the existing one at a lower load"),
                    cl::sub(Calibrate), cl::cat(Cat));

} // namespace calibrateopts

namespace {

/// The per-machine cache file of the host target.
std::string cachePath() {
  SmallString<256> dir;
  if (Optional<std::string> x = sys::Process::GetEnv("XDG_CACHE_HOME"); x && !x->empty())
    dir = *x;
  else if (Optional<std::string> h = sys::Process::GetEnv("HOME"); h && !h->empty())
    sys::path::append(dir, *h, ".cache");
  else
    sys::path::system_temp_directory(true, dir);
  sys::path::append(dir, "tally", calibrate::cacheFileName());
  return std::string(dir);
}

std::string utcNow() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M UTC", &tm);
  return buf;
}

/// Why the measurement `r` must not replace the calibration at `path` (calibrate::overwriteRefusal
/// on the load that file records); "" when there is none or it may.
std::string keepExisting(const std::string &path, const calibrate::Result &r) {
  if (!sys::fs::exists(path))
    return "";
  ErrorOr<std::unique_ptr<MemoryBuffer>> old = MemoryBuffer::getFile(path);
  if (!old)
    return "";
  std::string why = calibrate::overwriteRefusal(r, calibrate::recordedLoadAverage((*old)->getBuffer().str()));
  return why.empty() ? "" : "not replacing '" + path + "': " + why;
}

/// Why the noisy measurement `r` (calibrate::noisySummary) is not written to `path`, naming
/// what stays there.
std::string noisyRefusal(const std::string &path, const calibrate::Result &r) {
  return "the calibration is noisy (" + calibrate::noisySummary(r) + "); " +
         (sys::fs::exists(path) ? "keeping '" + path + "' as it was" : "nothing written to '" + path + "'");
}

/// Measures and writes the target to `path` (creating its folder); false with `error` set and
/// `measureFailed` telling the measurements' failure from the file's. Unless `force`, a noisy
/// measurement (not a quick one) is not written (`out` still receives it), and a measurement
/// under load does not replace a calibration made at a lower load; `refused` is then the
/// diagnostic's code.
bool calibrateInto(const std::string &path, bool quick, std::string &error, bool &measureFailed,
                   calibrate::Result *out, bool force, std::string &refused) {
  calibrate::Result r;
  measureFailed = !measureHost(quick, r, error);
  if (measureFailed)
    return false;
  if (!force && !r.quick && !calibrate::noisySummary(r).empty()) {
    error = noisyRefusal(path, r);
    refused = "calibrate-noisy";
    if (out) // the caller may still use it for one run (loadTarget)
      *out = std::move(r);
    return false;
  }
  if (!force)
    if (std::string why = keepExisting(path, r); !why.empty()) {
      error = why;
      refused = "calibrate-busy";
      return false;
    }
  measureLink(r, quick);
  StringRef parent = sys::path::parent_path(path);
  if (!parent.empty())
    if (std::error_code ec = sys::fs::create_directories(parent)) {
      error = "cannot create '" + parent.str() + "': " + ec.message();
      return false;
    }
  // report/Output.h: written beside and renamed, so a concurrent run never reads half a file.
  std::unique_ptr<OutputFile> file = OutputFile::open(path, {}, error);
  if (!file)
    return false;
  file->os() << calibrate::renderTarget(r, utcNow());
  if (!file->commit(error))
    return false;
  if (out)
    *out = std::move(r);
  return true;
}

/// Why the calibration could not be written into the folder of `path` ("" when it can): the
/// folder is created and a file made and removed in it, so that `target = host` without a
/// cache refuses at once instead of measuring for seconds and then failing to write (issue 43).
std::string unwritableFolder(const std::string &path) {
  StringRef parent = sys::path::parent_path(path);
  if (parent.empty())
    parent = ".";
  if (std::error_code ec = sys::fs::create_directories(parent))
    return "cannot create '" + parent.str() + "': " + ec.message();
  SmallString<256> model(parent);
  sys::path::append(model, ".tally-write-test-%%%%%%%%");
  int fd = -1;
  SmallString<256> probe;
  if (std::error_code ec = sys::fs::createUniqueFile(model, fd, probe))
    return "cannot write in '" + parent.str() + "': " + ec.message();
  ::close(fd);
  sys::fs::remove(probe);
  return "";
}

/// The one target the .tally text `text` (named `path` in diagnostics) declares. Its
/// diagnostics print with their locations.
std::optional<Target> readTarget(const std::string &path, const std::string *text, std::string &error) {
  Compilation c;
  if (!(text ? c.addSource(path, *text) : c.addFile(path)) || c.diags.hasErrors()) {
    error = "'" + path + "' has errors (above) or cannot be read";
    return std::nullopt;
  }
  if (c.program.targets.size() != 1) {
    error = "'" + path + "' declares " + std::to_string(c.program.targets.size()) +
            " targets; a target file declares exactly one";
    return std::nullopt;
  }
  const TargetDecl *d = c.program.targets.begin()->second;
  std::optional<Target> t = c.sema.resolveTarget(c.program, d->name, d->nameRange);
  if (!t) {
    error = "the target in '" + path + "' is not valid (see above)";
    return std::nullopt;
  }
  t->source = "measured by `tally calibrate`: " + path;
  return t;
}

/// `target = host` without a cached calibration, measured now but too noisy to cache: the
/// measurement serves this process only (nothing is written, so the next run measures again),
/// with a warning, rather than failing a run or check that only needs an estimate.
std::optional<Target> uncachedTarget(const std::string &path, calibrate::Result &r, std::string &error) {
  measureLink(r, false);
  std::string text = calibrate::renderTarget(r, utcNow());
  std::optional<Target> t = readTarget(path + " (not written)", &text, error);
  if (t) {
    errs() << "tally: warning: measuring this machine was noisy (" << calibrate::noisySummary(r)
           << "): its estimates use that measurement for this run only and cache nothing; run `tally "
              "calibrate` when the machine is quiet (or `tally calibrate --force` to keep this one)\n";
    t->source = "measured now, noisy, not cached";
  }
  return t;
}

/// The loader Sema calls for `host` and for target files; each is read once per process
/// (solvers and budgets lower a plan many times).
std::optional<Target> loadTarget(StringRef name, std::string &error) {
  static std::map<std::string, std::optional<Target>> loaded;
  static std::map<std::string, std::string> errors;
  std::string key = name.str();
  if (auto it = loaded.find(key); it != loaded.end()) {
    error = errors[key];
    return it->second;
  }
  std::string path = key;
  if (name == "host") {
    path = cachePath();
    if (!sys::fs::exists(path)) {
      bool measureFailed = false, ok = false;
      if (std::string why = unwritableFolder(path); !why.empty()) {
        error = "this machine has no calibration yet, and it could not be cached (" + why +
                "): set XDG_CACHE_HOME to a writable folder, or run `tally calibrate -o FILE` and "
                "use `--target FILE`";
      } else {
        errs() << "tally: note: this machine has no calibration yet (" << path
               << "); running `tally calibrate` (a few seconds)\n";
        std::string refused;
        calibrate::Result r;
        ok = calibrateInto(path, false, error, measureFailed, &r, false, refused);
        if (refused == "calibrate-noisy") {
          error.clear();
          std::optional<Target> t = uncachedTarget(path, r, error);
          loaded[key] = t;
          errors[key] = error;
          return t;
        }
      }
      if (!ok) {
        loaded[key] = std::nullopt;
        errors[key] = error;
        return std::nullopt;
      }
    }
  }
  std::optional<Target> t = readTarget(path, nullptr, error);
  if (!t && name == "host") // the cache is tally's own file: measuring again replaces it
    error += "; run `tally calibrate` again to measure this machine anew";
  loaded[key] = t;
  errors[key] = error;
  return t;
}

int calibrateCommand() {
  std::string path = calibrateopts::Output.empty() ? cachePath() : calibrateopts::Output.getValue();
  std::string error;
  calibrate::Result r;
  bool measureFailed = false;
  std::string refused;
  if (!calibrateInto(path, calibrateopts::Quick, error, measureFailed, &r, calibrateopts::Force, refused)) {
    if (!refused.empty()) {
      errs() << "tally: error: " << error << " [" << refused << "]\n";
      if (refused == "calibrate-noisy")
        errs() << "tally: note: other processes took the cores while measuring; run `tally calibrate` again when "
                  "the machine is quiet, or with --force to write this one anyway\n";
      return 1;
    }
    if (measureFailed) {
      errs() << "tally: error: " << error << " [calibrate-failed]\n";
      return 1;
    }
    errs() << "tally: error: " << error << " [io-error]\n";
    return kOutputErrorExit;
  }
  if (std::string noisy = calibrate::noisySummary(r); !noisy.empty())
    errs() << "tally: warning: the calibration is noisy (" << noisy << "); written "
           << (calibrateopts::Force ? "because of --force" : "because it is a quick one (for tests, not estimates)")
           << "\n";
  if (calibrate::blasHeldToAvx2(r))
    errs() << "tally: note: OPENBLAS_CORETYPE=" << r.blasCoreEnv << " in the environment runs OpenBLAS's AVX2 ("
           << r.blasCore << ") kernels on this CPU, which has AVX-512; without it OpenBLAS picks its own (the "
           << "calibration and the steps take the same environment's)\n";
  if (r.busy())
    errs() << "tally: warning: the load average was " << format("%.2f", r.loadAverage) << " on "
           << r.cores << " cores: other processes shared them, so the numbers are low; "
           << "calibrate again when the machine is idle\n";
  outs() << "host: " << r.cpuModel << ", " << r.cores << " cores, " << r.threads
         << " OpenMP threads\n";
  outs() << format("  STREAM triad       %10.2f GB/s\n", r.triadBandwidth / 1e9);
  outs() << format("  elementwise        %10.2f GB/s\n", r.elementwiseBandwidth / 1e9);
  if (r.linkBandwidth > 0)
    outs() << format("  MPI all-reduce     %10.2f GB/s, %.2f us latency (2 processes)\n", r.linkBandwidth / 1e9,
                     r.linkLatency * 1e6);
  outs() << format("  kernel call        %10.2f us fixed cost\n", r.kernelOverhead * 1e6);
  outs() << format("  transcendental     %10.2f ns per exp\n", r.transcendentalTime * 1e9);
  for (const char *d : {"fp32", "bf16"})
    outs() << format("  matmul %-4s peak   %10.2f GFLOP/s\n", d, calibrate::peakOf(r, d) / 1e9);
  outs() << format("measured in %.2f s; written to %s\n", r.seconds, path.c_str());
  return 0;
}

} // namespace

void installTargetLoader() { setExternalTargetLoader(loadTarget); }

int runCalibrate() {
  if (!calibrateopts::Calibrate)
    return -1;
  return calibrateCommand();
}

} // namespace tally
