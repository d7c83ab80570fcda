// `tally build FILE --backend cpu|cuda -o DIR`: writes the generated training step of a train
// plan (codegen/EmitStep.cpp; C++ for the CPU, CUDA for a GPU) with its runtime, driver and
// CMakeLists.txt into DIR.
// `tally run FILE --backend cpu|cuda [--steps N] [--format json]`: builds that folder once (cached
// by a hash of every generated file and the compiler, under $TALLY_CACHE_DIR or ~/.cache/tally;
// tools/tally/StepCache.h), runs it after checking the executable against its record, and
// prints the estimates beside what the run measured: step time, time per op class, the top
// kernels, arena and peak memory, MFU and the loss of every step. --trace FILE writes the last
// step's kernel calls and the estimated step as a Chrome/Perfetto trace (report/ChromeTrace.h).
//
// Exit codes: 0 success; 1 an error in the file, a plan the backend cannot generate, a failed
// build or a failed run; 2 bad usage.
#include "codegen/Emit.h"
#include "driver/Compiler.h"
#include "ir/Units.h"
#include "report/ChromeTrace.h"
#include "report/Output.h"
#include "report/RunTiming.h"
#include "tools/tally/Commands.h"
#include "tools/tally/PlanFlags.h"
#include "tools/tally/StepCache.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/DynamicLibrary.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <csignal>
#include <map>
#include <thread>

#include <unistd.h>

using namespace llvm;

namespace tally {
namespace buildopts {

cl::SubCommand Build("build", "Write the generated training step of a train plan (C++ for the CPU, CUDA for a GPU) into a folder");
cl::SubCommand Run("run", "Build and run the generated training step; print estimates beside measurements");
cl::OptionCategory Cat("tally build/run options");

cl::opt<std::string> File(cl::Positional, cl::desc("<file>"), cl::Required, cl::sub(Build), cl::sub(Run),
                          cl::cat(Cat));
cl::opt<std::string> PlanName("plan", cl::desc("The train plan (default: the first)"), cl::value_desc("name"),
                              cl::sub(Build), cl::sub(Run), cl::cat(Cat));
cl::opt<std::string> Backend("backend", cl::desc("Where the step runs: cpu, or cuda (an NVIDIA GPU; nvcc builds it)"),
                             cl::value_desc("cpu|cuda"), cl::init("cpu"), cl::sub(Build), cl::sub(Run), cl::cat(Cat));
cl::opt<std::string> Output("o", cl::desc("build: the folder to write"), cl::value_desc("dir"), cl::sub(Build),
                            cl::cat(Cat));
cl::opt<bool> Force("force", cl::desc("build: write into a non-empty folder that tally build did not create"),
                    cl::sub(Build), cl::cat(Cat));
cl::opt<int64_t> Steps("steps", cl::desc("run: training steps in all, the first --warmup of them untimed (default 10)"),
                       cl::init(10), cl::sub(Run), cl::cat(Cat));
cl::opt<int64_t> Warmup("warmup", cl::desc("run: how many of the --steps are untimed (default 2, at most --steps - 1)"),
                        cl::init(2), cl::sub(Run), cl::cat(Cat));
cl::opt<int64_t> Threads("threads", cl::desc("run: OpenMP threads (default: all; cpu backend only)"), cl::init(0), cl::sub(Run),
                         cl::cat(Cat));
cl::opt<int64_t> Seed("seed", cl::desc("run: seed of the initialisation, the random data and dropout"), cl::init(1),
                      cl::sub(Run), cl::cat(Cat));
cl::opt<std::string> Init("init", cl::desc("run: initial weights (safetensors, names like h.0.attn.qkv.weight)"),
                          cl::value_desc("file"), cl::sub(Run), cl::cat(Cat));
cl::opt<std::string> Data("data", cl::desc("run: the batch (safetensors: one tensor per model input, [batch, ...])"),
                          cl::value_desc("file"), cl::sub(Run), cl::cat(Cat));
cl::opt<std::string> Save("save", cl::desc("run: write the weights after the last step (safetensors, F32)"),
                          cl::value_desc("file"), cl::sub(Run), cl::cat(Cat));
cl::opt<std::string> DumpGrads("dump-grads", cl::desc("run: write the last step's gradients (safetensors, F32)"),
                               cl::value_desc("file"), cl::sub(Run), cl::cat(Cat));
cl::opt<std::string> TraceFile("trace",
                               cl::desc("run: write the last step's kernel calls and the estimated step as a "
                                        "Chrome trace (JSON; open it in ui.perfetto.dev or chrome://tracing)"),
                               cl::value_desc("file"), cl::sub(Run), cl::cat(Cat));
cl::opt<bool> AllowNonfinite("allow-nonfinite",
                              cl::desc("run: train on through a NaN or infinite loss and write non-finite weights "
                                       "(default: such a run stops with an error and writes nothing)"),
                              cl::sub(Run), cl::cat(Cat));
enum class Format { Text, Json };
cl::opt<Format> OutFormat("format", cl::desc("run: output format"),
                          cl::values(clEnumValN(Format::Text, "text", "a table (default)"),
                                     clEnumValN(Format::Json, "json", "one JSON object")),
                          cl::init(Format::Text), cl::sub(Run), cl::cat(Cat));
PlanFlags Overrides(Cat, Build, Run);
cl::opt<bool> NoColor("no-color", cl::desc("Do not color diagnostics"), cl::sub(Build), cl::sub(Run), cl::cat(Cat));

} // namespace buildopts

namespace buildcmd {

using namespace buildopts;

namespace {

int usageError(const std::string &msg) {
  errs() << "tally: error: " << msg << "\n";
  return 2;
}
int failure(const std::string &msg) {
  errs() << "tally: error: " << msg << "\n";
  return 1;
}

/// `tally run` estimates for this machine: the `host` target (calibrated by `tally calibrate`,
/// run on first use) unless --target names another. A plan whose own target is already the
/// host keeps it with its layout (`target = 2 x host { data = 2 }` runs on 2 processes); any
/// other target becomes one `host` device.
PlanOverrides overrides(Compilation &c, const PlanDecl &decl) {
  PlanOverrides o = Overrides.overrides(Backend == "cuda");
  o.tensorStep = true; // tensor parallelism as the generated step runs it, CPU or CUDA (Plan::tensorStep)
  o.generatedStep = true; // priced as tally's step holds its memory (ZeRO's transients)
  if (Run && Threads > 0)
    o.hostThreads = Threads; // each rank's part of the host (Target::shareHost)
  // The CUDA step is estimated on the plan's own GPU (or --target's); the CPU step on the host.
  if (!o.target.empty() || !Run || Backend == "cuda")
    return o;
  DiagnosticEngine quiet(c.sm);
  quiet.setOutput(nullptr);
  Sema sema(quiet);
  std::optional<Plan> own = sema.resolvePlan(c.program, decl, o);
  if (!own || own->target.name != "host")
    o.target = "host";
  return o;
}

/// Writes the files under dir (created as needed) through the one writer (report/Output.h: a
/// temporary file, fsynced and renamed into place); "" or the first I/O error. A symbolic link
/// under dir, where a file or a folder of the step would go, is refused: tally never creates
/// one, so it was planted, and following it would write outside the folder.
std::string writeFiles(StringRef dir, const std::vector<codegen::File> &files) {
  for (const codegen::File &f : files) {
    SmallString<256> path;
    if (std::string err = stepcache::pathUnder(dir, f.path, path); !err.empty())
      return err;
    if (std::error_code ec = sys::fs::create_directories(sys::path::parent_path(path)))
      return "cannot create " + sys::path::parent_path(path).str() + ": " + ec.message();
    std::string err;
    std::unique_ptr<OutputFile> out = OutputFile::open(path.str().str(), {File}, err);
    if (!out)
      return err;
    out->os() << f.text;
    if (!out->commit(err))
      return err;
  }
  return "";
}

/// Runs a child with SIGPIPE at its default action: tally ignores SIGPIPE (its own writes report
/// errors instead), and an ignored signal would otherwise be inherited by cmake, the compiler
/// and the step.
int spawn(StringRef program, ArrayRef<StringRef> args, ArrayRef<Optional<StringRef>> redirects,
          std::string *err) {
  void (*previous)(int) = std::signal(SIGPIPE, SIG_DFL);
  int rc = sys::ExecuteAndWait(program, args, None, redirects, 0, 0, err);
  std::signal(SIGPIPE, previous);
  return rc;
}

/// spawn, with a progress line on stderr while the program runs ("tally: building the generated
/// step: compiling (12 s)"), rewritten every quarter second and cleared at the end; only when
/// stderr is a terminal (else exactly spawn), so logs and tests stay clean.
int spawnShowing(StringRef program, ArrayRef<StringRef> args, ArrayRef<Optional<StringRef>> redirects,
                 std::string *err, StringRef what) {
  if (!sys::Process::StandardErrIsDisplayed())
    return spawn(program, args, redirects, err);
  void (*previous)(int) = std::signal(SIGPIPE, SIG_DFL);
  bool failed = false;
  sys::ProcessInfo pi = sys::ExecuteNoWait(program, args, None, redirects, 0, err, &failed);
  int rc = -1;
  if (!failed) {
    auto start = std::chrono::steady_clock::now();
    for (;;) {
      sys::ProcessInfo done = sys::Wait(pi, 0, false, err); // non-blocking
      if (done.Pid != 0) {
        rc = done.ReturnCode;
        break;
      }
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      errs() << formatv("\r\033[Ktally: {0} ({1:f0} s)", what, s);
      errs().flush();
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
    errs() << "\r\033[K";
    errs().flush();
  }
  std::signal(SIGPIPE, previous);
  return rc;
}

/// Runs a program; its stdout and stderr go to `log` (appended). True when it exits 0. `what`
/// names it in the progress line (spawnShowing).
bool execute(StringRef program, ArrayRef<StringRef> args, StringRef log, std::string &why, StringRef what) {
  Optional<StringRef> redirects[] = {StringRef(""), log, log};
  std::string err;
  int rc = spawnShowing(program, args, redirects, &err, what);
  if (rc != 0) {
    why = err.empty() ? program.str() + " exited with " + std::to_string(rc) : err;
    return false;
  }
  return true;
}

std::string tail(StringRef path, size_t lines) {
  auto buf = MemoryBuffer::getFile(path);
  if (!buf)
    return "";
  SmallVector<StringRef, 64> all;
  (*buf)->getBuffer().split(all, '\n');
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i)
    out += all[i].str() + "\n";
  return out;
}

/// The folder the step is built in: the cache entry for these files and this toolchain
/// (StepCache.h), built when missing or when its executable does not match its record.
/// Returns "" and sets `binary`, or why the build failed.
std::string buildCached(const std::vector<codegen::File> &files, std::string &binary) {
  const std::string key = stepcache::key(files, Backend == "cuda");
  std::string hash = key.substr(0, 20);
  const std::string cache = stepcache::folder();
  if (cache.empty())
    return "no cache folder: set TALLY_CACHE_DIR";
  SmallString<256> dir(cache);
  sys::path::append(dir, "step-" + hash);
  SmallString<256> bin(dir);
  sys::path::append(bin, "build", "tally_step");
  binary = bin.str().str();
  if (sys::fs::exists(dir)) {
    std::string why = stepcache::verify(dir.str().str(), key, binary);
    if (why.empty())
      return "";
    errs() << "tally: note: not running the cached step in " << dir << ": " << why << "; rebuilding it\n";
    if (std::error_code ec = sys::fs::remove_directories(dir))
      return "cannot remove the cached step " + dir.str().str() + ": " + ec.message();
  }
  // Build in a private folder and rename it into place, so concurrent runs never see half a build.
  SmallString<256> tmp(dir);
  tmp += ".tmp-" + std::to_string(sys::Process::getProcessId());
  sys::fs::remove_directories(tmp);
  if (std::string err = writeFiles(tmp, files); !err.empty())
    return err;
  auto cmake = sys::findProgramByName("cmake");
  if (!cmake)
    return "cmake is not on PATH; it builds the generated step (scripts/setup.sh installs it)";
  std::string why;
  std::string jobs = std::to_string(std::max(1u, std::thread::hardware_concurrency()));
  errs() << "tally: building the generated step in " << dir << "\n";
  // Configures (unless `configured`) and builds the step in `src`; false with `why` and `log` set.
  auto compile = [&](StringRef src, bool configured, SmallString<256> &log, SmallString<256> &built) {
    SmallString<256> buildDir(src);
    log = src;
    sys::path::append(log, "build.log");
    sys::path::append(buildDir, "build");
    built = buildDir;
    sys::path::append(built, "tally_step");
    sys::fs::remove(log);
    return (configured || execute(*cmake, {*cmake, "-S", src, "-B", buildDir, "-DCMAKE_BUILD_TYPE=Release"}, log,
                                  why, "building the generated step: configuring")) &&
           execute(*cmake, {*cmake, "--build", buildDir, "-j", jobs}, log, why, "building the generated step: compiling");
  };
  SmallString<256> log, built;
  // A free bench (StepCache.h) recompiles only what differs from the step built there last; its
  // executable and log are copied into the entry. A failed bench build is retried afresh.
  bool done = false;
  if (auto bench = stepcache::Bench::acquire(cache, files, Backend == "cuda")) {
    SmallString<256> into(tmp);
    sys::path::append(into, "build");
    done = bench->update(files).empty() && compile(bench->dir(), bench->configured(), log, built) &&
           !sys::fs::create_directories(into) && !sys::fs::copy_file(log, Twine(tmp) + "/build.log");
    sys::path::append(into, "tally_step");
    done = done && !sys::fs::copy_file(built, into) &&
           !sys::fs::setPermissions(into, sys::fs::all_read | sys::fs::all_exe | sys::fs::owner_write);
    if (!done)
      bench->reset();
    built = into;
  }
  if (!done && !compile(tmp, false, log, built))
    return "building the generated step failed (" + why + "); the end of " + log.str().str() + ":\n" +
           tail(log, 30);
  if (std::string err = stepcache::record(tmp.str().str(), key, built.str().str()); !err.empty())
    return err;
  if (std::error_code ec = sys::fs::rename(tmp, dir)) {
    sys::fs::remove_directories(tmp); // another run finished the same build first
    if (!stepcache::verify(dir.str().str(), key, binary).empty())
      return "cannot move the build into " + dir.str().str() + ": " + ec.message();
  }
  return "";
}

/// Compiles and analyzes the plan; null after printing diagnostics.
std::optional<Analysis> analyzeFile(Compilation &c) {
  if (NoColor)
    c.diags.setShowColors(false);
  if (!c.addFile(File))
    return std::nullopt;
  const PlanDecl *decl = c.pickPlan(PlanName);
  if (!decl)
    return std::nullopt;
  std::optional<Analysis> a = c.analyzePlan(*decl, overrides(c, *decl));
  if (!a || c.diags.hasErrors())
    return std::nullopt;
  return a;
}

/// $TALLY_RUNTIME_DIR (a checkout's codegen/ folder): the runtime and driver sources are read
/// from there instead of the copies embedded in tally, for working on the runtime without
/// rebuilding tally; each goes where the embedded copy goes (the driver's sources, program/,
/// to runtime/driver/). "" or why a file could not be read.
std::string runtimeFromDisk(std::vector<codegen::File> &files) {
  Optional<std::string> dir = sys::Process::GetEnv("TALLY_RUNTIME_DIR");
  if (!dir || dir->empty())
    return "";
  files.erase(std::remove_if(files.begin(), files.end(),
                             [](const codegen::File &f) { return StringRef(f.path).startswith("runtime/"); }),
              files.end());
  bool cuda = Backend == "cuda";
  struct Folder {
    const char *source, *step; ///< under codegen/, and under the step's runtime/
  };
  for (Folder sub : {Folder{"runtime/common", "common"}, cuda ? Folder{"runtime/cuda", "cuda"} : Folder{"runtime/cpu", "cpu"},
                     Folder{"program", "driver"}}) {
    SmallString<256> folder(*dir);
    sys::path::append(folder, sub.source);
    std::error_code ec;
    for (sys::fs::directory_iterator it(folder, ec), end; it != end && !ec; it.increment(ec)) {
      StringRef name = sys::path::filename(it->path());
      if (cuda ? (name == "driver_cpu.cpp" || name == "tally_comm.h") : (name == "driver_cuda.cu" || name == "tally_step_cuda.h"))
        continue; // the other backend's driver
      auto text = MemoryBuffer::getFile(it->path());
      if (!text)
        return "TALLY_RUNTIME_DIR: cannot read " + it->path();
      files.push_back({"runtime/" + std::string(sub.step) + "/" + sys::path::filename(it->path()).str(),
                       (*text)->getBuffer().str()});
    }
    if (ec)
      return "TALLY_RUNTIME_DIR: cannot list " + folder.str().str() + ": " + ec.message();
  }
  return "";
}

/// The emitter's lines for `tally build`'s output (codegen::EmitOptions::notes).
std::vector<std::string> BuildNotes;

std::string generate(Compilation &c, const Analysis &a, std::vector<codegen::File> &files) {
  codegen::EmitOptions o;
  o.notes = &BuildNotes;
  o.source = sys::path::filename(File).str();
  o.where = [&c](SMLoc loc) -> std::string {
    if (!loc.isValid())
      return "";
    unsigned id = c.sm.FindBufferContainingLoc(loc);
    if (!id)
      return "";
    return sys::path::filename(c.sm.getMemoryBuffer(id)->getBufferIdentifier()).str() + ":" +
           std::to_string(c.sm.getLineAndColumn(loc, id).first);
  };
  std::string err = Backend == "cuda" ? codegen::emitCudaStep(a, o, files) : codegen::emitCpuStep(a, o, files);
  if (!err.empty())
    return err;
  return runtimeFromDisk(files);
}

/// Compiles and analyzes the plan and generates its step; 0, or the exit code after saying why.
int compileStep(Compilation &c, std::optional<Analysis> &a, std::vector<codegen::File> &files) {
  a = analyzeFile(c);
  if (!a)
    return 1;
  if (std::string err = generate(c, *a, files); !err.empty())
    return failure("cannot generate plan " + a->plan->name + " for the " + Backend + " backend: " + err);
  return 0;
}

/// "" when --backend names a backend, else the usage error.
std::string badBackend() {
  if (Backend == "cpu" || Backend == "cuda")
    return "";
  return "--backend " + Backend + ": the backends are cpu and cuda";
}

/// "" when a CUDA device can run the step, else why not. Asks the CUDA driver library itself
/// (libcuda.so.1, loaded at run time: tally does not link CUDA): cuInit and cuDeviceGetCount,
/// which answer at once, so a machine without a GPU is told so before minutes of nvcc.
std::string cudaDeviceMissing() {
  std::string err;
  sys::DynamicLibrary lib = sys::DynamicLibrary::getPermanentLibrary("libcuda.so.1", &err);
  if (!lib.isValid())
    return "no CUDA driver on this machine (libcuda.so.1: " + err + ")";
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int *);
  auto init = reinterpret_cast<InitFn>(lib.getAddressOfSymbol("cuInit"));
  auto count = reinterpret_cast<CountFn>(lib.getAddressOfSymbol("cuDeviceGetCount"));
  if (!init || !count)
    return "libcuda.so.1 has no cuInit/cuDeviceGetCount";
  int rc = init(0), n = 0;
  if (rc == 100) // CUDA_ERROR_NO_DEVICE
    return "the CUDA driver sees no device (cuInit: CUDA_ERROR_NO_DEVICE)";
  if (rc != 0)
    return "the CUDA driver failed to start (cuInit returned " + std::to_string(rc) + ")";
  if ((rc = count(&n)) != 0)
    return "cuDeviceGetCount returned " + std::to_string(rc);
  if (n == 0)
    return "the CUDA driver sees 0 devices";
  return "";
}

int build() {
  if (std::string bad = badBackend(); !bad.empty())
    return usageError(bad);
  if (Output.empty())
    return usageError("tally build needs -o DIR, the folder to write");
  Compilation c;
  std::optional<Analysis> a;
  std::vector<codegen::File> files;
  if (int rc = compileStep(c, a, files))
    return rc;
  // A folder with files in it is only overwritten when an earlier `tally build` made it.
  SmallString<256> marker(Output);
  sys::path::append(marker, ".tally-build");
  std::error_code ec;
  sys::fs::directory_iterator it(Output, ec);
  bool nonEmpty = !ec && it != sys::fs::directory_iterator();
  if (nonEmpty && !sys::fs::exists(marker) && !Force)
    return usageError(Output + " is not empty and was not written by tally build; pick another folder or "
                      "pass --force");
  files.push_back({".tally-build", "written by tally build from " + File + "\n"});
  if (std::string err = writeFiles(Output, files); !err.empty())
    return failure(err);
  outs() << "wrote " << files.size() << " files to " << Output << " (build: cmake -S " << Output << " -B "
         << Output << "/build && cmake --build " << Output << "/build)\n";
  for (const std::string &n : BuildNotes)
    outs() << n << "\n";
  return 0;
}

double num(const json::Object *o, StringRef key) {
  if (!o)
    return 0;
  if (auto v = o->getNumber(key))
    return *v;
  if (auto v = o->getInteger(key))
    return static_cast<double>(*v);
  return 0;
}

/// The estimate's seconds per optimizer step by op class: forward + backward of every op (a
/// backward op's kernels under its forward op's class) and its recomputes; under pipeline
/// parallelism those of rank 0's stage only (its chunks), as the step measures rank 0.
std::map<std::string, double> estimatedByClass(const Analysis &a) {
  std::map<std::string, double> out;
  double steps = static_cast<double>(a.time.accumulationSteps);
  const auto &ps = a.pipelineStep;
  auto add = [&](OpId i, double seconds) {
    OpClass c = opClass(a.graph->ops[i].kind);
    bool mine = ps.chunks.empty() || (i < ps.chunkOfOp.size() && ps.chunkOfOp[i] % ps.stages == 0);
    if (c != OpClass::View && mine)
      out[opClassName(c).str()] += seconds * steps;
  };
  for (OpId i = 0; i < a.ops.size() && i < a.graph->ops.size(); ++i)
    add(i, a.ops[i].forwardTime + a.ops[i].backwardTime);
  // Recomputed forwards (a checkpoint plan) run again in the op's class, as StepTime counts them.
  for (const ScheduleStep &s : a.schedule)
    if (s.kind == ScheduleStep::Recompute && s.op < a.ops.size() && s.op < a.graph->ops.size())
      add(s.op, a.ops[s.op].forwardTime);
  out["optimizer"] += a.time.optimizer;
  double comm = a.time.dataParallelComm + a.time.tensorParallelComm + (a.plan->parallel.pipeline > 1 ? a.time.pipelineComm : 0);
  if (comm > 0)
    out["communication"] += comm;
  if (a.plan->parallel.pipeline > 1) // the busiest device's idle time; the step times its receives as "bubble"
    out["bubble"] += a.time.bubble;
  return out;
}

/// The command that runs the step: the binary itself, or for data = N > 1 `mpirun -np N` over
/// it (OpenMPI's flags: --oversubscribe when N exceeds the cores, --bind-to none so each rank's
/// OpenMP threads may use the cores it was given, --allow-run-as-root under root, as in CI's
/// containers). "" or why it cannot be run.
/// The processes the step runs on: data × tensor × pipeline.
int64_t worldOf(const Analysis &a) {
  const Parallelism &par = a.plan->parallel;
  return par.data * par.tensor * std::max<int64_t>(1, par.pipeline);
}

std::string launcher(const Analysis &a, const std::string &binary, std::vector<std::string> &argv) {
  int64_t ranks = worldOf(a);
  if (ranks <= 1) {
    argv = {binary};
    return "";
  }
  auto mpirun = sys::findProgramByName("mpirun");
  if (!mpirun)
    return "plan " + a.plan->name + " runs on " + std::to_string(ranks) + " processes under MPI (data = " +
           std::to_string(a.plan->parallel.data) + ", tensor = " + std::to_string(a.plan->parallel.tensor) + ", pipeline = " + std::to_string(a.plan->parallel.pipeline) + "), but mpirun is not on PATH (Debian: openmpi-bin and libopenmpi-dev; "
           "scripts/setup.sh installs them)";
  argv = {*mpirun, "-np", std::to_string(ranks), "--bind-to", "none"};
  if (ranks > static_cast<int64_t>(std::max(1u, std::thread::hardware_concurrency())))
    argv.push_back("--oversubscribe");
  if (geteuid() == 0)
    argv.push_back("--allow-run-as-root");
  argv.push_back(binary);
  return "";
}

/// The untimed steps: --warmup as given, else 2 or, for fewer --steps, all but the last one.
int64_t warmupSteps() { return Warmup.getNumOccurrences() ? Warmup : std::min<int64_t>(Warmup, Steps - 1); }

/// Where the step writes its trace (--trace): a temporary file (rank r of several: its path
/// followed by ".rank<r>"), which `tally run` reads back and completes into TraceFile.
std::string traceTemp;

/// The step's command line: the launcher (launcher()), then --steps, --warmup, --threads (under
/// data parallelism the cores shared between the ranks unless --threads says otherwise), --seed
/// and the file flags given. "" or why it cannot be run.
std::string stepArguments(const Analysis &a, const std::string &binary, std::vector<std::string> &args) {
  if (std::string why = launcher(a, binary, args); !why.empty())
    return why;
  // Data parallel: the cores shared between the ranks unless --threads says otherwise.
  int64_t ranks = worldOf(a), threads = Threads;
  if (ranks > 1 && threads == 0)
    threads = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()) / ranks);
  for (std::string f : std::vector<std::string>{"--steps", std::to_string(Steps), "--warmup", std::to_string(warmupSteps()),
                                                 "--threads", std::to_string(threads), "--seed", std::to_string(Seed)})
    args.push_back(f);
  auto flag = [&](const char *name, const std::string &v) {
    if (!v.empty()) {
      args.push_back(name);
      args.push_back(v);
    }
  };
  flag("--init", Init);
  flag("--data", Data);
  flag("--save", Save);
  flag("--dump-grads", DumpGrads);
  flag("--trace", traceTemp);
  if (AllowNonfinite)
    args.push_back("--allow-nonfinite");
  return "";
}

/// Runs the built step; its JSON goes to a temporary file, its errors straight to ours. 0 with
/// the report (a JSON object) in `report`, or the exit code after saying why.
int runStep(const Analysis &a, const std::string &binary, Optional<json::Value> &report) {
  SmallString<128> outPath;
  if (std::error_code ec = sys::fs::createTemporaryFile("tally-run", "json", outPath))
    return failure("cannot create a temporary file: " + ec.message());
  std::vector<std::string> args;
  if (std::string why = stepArguments(a, binary, args); !why.empty())
    return failure(why);
  std::vector<StringRef> argv(args.begin(), args.end());
  Optional<StringRef> redirects[] = {StringRef(""), StringRef(outPath), None};
  std::string err;
  int rc = spawn(args[0], argv, redirects, &err);
  auto text = MemoryBuffer::getFile(outPath);
  sys::fs::remove(outPath);
  if (rc != 0)
    return failure("the generated step failed" + (err.empty() ? " (exit " + std::to_string(rc) + ")" : ": " + err));
  if (!text)
    return failure("the generated step wrote no report");
  Expected<json::Value> parsed = json::parse((*text)->getBuffer());
  if (!parsed)
    return failure("the generated step's report is not JSON: " + toString(parsed.takeError()));
  if (!parsed->getAsObject())
    return failure("the generated step's report is not a JSON object");
  report = std::move(*parsed);
  return 0;
}

/// One kernel of the step's report: name, op class, calls and seconds over the timed steps.
struct Kernel {
  std::string name, cls;
  int64_t calls;
  double total;
};

/// What `tally run` prints beside the estimate, read from the step's report `m`.
struct Measured {
  const json::Object *m;
  double stepS, mfu, allocated, comm, wait;
  std::map<std::string, double> byClass;
  std::vector<Kernel> kernels; ///< slowest first
  const json::Array *loss;
  double minS, maxS, load;             ///< the fastest and slowest timed step; the 1-minute load
  int64_t cores, timed;                ///< the cores online; the timed steps
  double kernelSteps = 0;              ///< the steps the kernels' times are of (kernel_steps)
  std::vector<std::string> warnings;   ///< why comparing with the estimate is unreliable
};

Measured measured(const Analysis &an, const json::Object *m) {
  Measured r{m, num(m, "step_s"), 0, 0, 0, 0, {}, {}, nullptr, num(m, "step_min_s"), num(m, "step_max_s"),
             num(m, "load_average"), static_cast<int64_t>(num(m, "cores")), static_cast<int64_t>(num(m, "timed_steps")), {}};
  r.warnings = runTimingWarnings(r.minS, r.maxS, r.load, r.cores);
  r.mfu = modelFlopsUtilization(an, r.stepS); // as the estimate's MFU
  const json::Object *regions = m->getObject("regions");
  r.allocated = num(m, "arena_bytes") + num(regions, "params") + num(regions, "grads") +
                num(regions, "master") + num(regions, "optimizer");
  // The CUDA step replaying its graph times its kernels in the eager steps before it
  // (kernel_steps); otherwise in the timed steps.
  double steps = m->get("kernel_steps") ? num(m, "kernel_steps") : static_cast<double>(r.timed);
  r.kernelSteps = std::max(1.0, steps);
  if (const json::Array *ks = m->getArray("kernels"))
    for (const json::Value &k : *ks)
      if (const json::Object *ko = k.getAsObject()) {
        Kernel x{ko->getString("name").getValueOr("").str(), ko->getString("op_class").getValueOr("").str(),
                 static_cast<int64_t>(num(ko, "calls")), num(ko, "total_s")};
        const std::string &cls = x.cls;
        r.byClass[cls] += x.total / steps;
        r.kernels.push_back(x);
      }
  std::sort(r.kernels.begin(), r.kernels.end(), [](const Kernel &x, const Kernel &y) { return x.total > y.total; });
  r.loss = m->getArray("loss");
  r.comm = r.byClass.count("communication") ? r.byClass["communication"] : 0;
  r.wait = r.byClass.count("wait") ? r.byClass["wait"] : 0;
  return r;
}

/// The model states the estimate allocates beside the arena: params, grads, master, optimizer.
double modelStates(const Analysis &an) {
  return an.memory.params + an.memory.grads + an.memory.master + an.memory.optimizer;
}

/// --format json: {model, plan, backend, estimated, measured (the step's report and what is
/// derived from it), loss}.
void printRunJson(const Analysis &an, const Measured &r) {
  std::map<std::string, double> estClass = estimatedByClass(an);
  // Pipeline parallel: rank 0's stage, as the step reports rank 0's (every rank's: per_rank).
  const auto &ps = an.pipelineStep;
  bool staged = !ps.chunks.empty() && !ps.ranks.empty();
  const auto &rg = staged ? ps.ranks[0] : Analysis::PipelineStep::Rank{};
  json::Object est{{"step_s", an.time.step},
                   {"arena_bytes", staged ? rg.arenaBytes : an.arenaBytes},
                   {"regions", json::Object{{"params", (staged ? rg.params : an.regions.params).bytes},
                                            {"grads", (staged ? rg.grads : an.regions.grads).bytes},
                                            {"master", (staged ? rg.master : an.regions.master).bytes},
                                            {"optimizer", (staged ? rg.optimizer : an.regions.optimizer).bytes}}},
                   {"master_bytes", an.memory.master},
                   {"optimizer_bytes", an.memory.optimizer},
                   {"ranks", worldOf(an)},
                   {"data_parallel_comm_s", an.time.dataParallelComm},
                   {"tensor_parallel_comm_s", an.time.tensorParallelComm},
                   {"sent_bytes_per_rank", dataParallelSentBytes(an, 0) + tensorParallelSentBytes(an) + pipelineSentBytes(an, 0)},
                   {"pipeline_comm_s", an.time.pipelineComm},
                   {"bubble_s", an.time.bubble},
                   {"peak_bytes", an.memory.peak},
                   {"context_bytes", an.memory.context},
                   {"workspace_bytes", an.memory.libraryWorkspace},
                   {"cudnn_workspace_bytes", an.memory.cudnnWorkspace},
                   {"model_states_bytes", modelStates(an)},
                   {"mfu", an.time.mfu},
                   {"target", an.plan->target.name}};
  json::Object estBy, measBy;
  for (auto &[k, v] : estClass)
    estBy[k] = v;
  for (auto &[k, v] : r.byClass)
    measBy[k] = v;
  est["by_class_s"] = std::move(estBy);
  if (worldOf(an) > 1) {
    est["per_rank"] = rankRowsJson(rankRows(an, r.m->getArray("per_rank")), true);
    // sent_bytes_per_rank by group, as the step counts them (its sent_bytes_by_group): rank 0's.
    est["sent_bytes_by_group_per_rank"] = json::Object{
        {"data", dataParallelSentBytes(an, 0)}, {"tensor", tensorParallelSentBytes(an)}, {"pipeline", pipelineSentBytes(an, 0)}};
  }
  json::Object meas = *r.m;
  meas.erase("loss");
  meas["allocated_bytes"] = r.allocated;
  meas["communication_s"] = r.comm;
  meas["wait_s"] = r.wait;
  meas["mfu"] = r.mfu;
  meas["by_class_s"] = std::move(measBy);
  json::Array warnings;
  for (const std::string &w : r.warnings)
    warnings.push_back(w);
  meas["timing_warnings"] = std::move(warnings);
  json::Object out{{"model", an.graph->model},
                   {"plan", an.plan->name},
                   {"backend", Backend},
                   {"estimated", std::move(est)},
                   {"measured", std::move(meas)},
                   {"loss", r.loss ? json::Value(json::Array(*r.loss)) : json::Value(json::Array())}};
  if (!TraceFile.empty())
    out["trace"] = TraceFile;
  outs() << formatv("{0:2}", json::Value(std::move(out))) << "\n";
}

/// The text table's memory rows: arena, allocated, peak (and on CUDA the context and workspace).
void printRunMemory(raw_ostream &os, const Analysis &an, const Measured &r, bool cuda, int64_t ranks) {
  const json::Object *m = r.m;
  double states = modelStates(an);
  // Pipeline parallel: rank 0's stage's arena, as the step reports rank 0's (every rank's below).
  const auto &ps = an.pipelineStep;
  int64_t arena = !ps.chunks.empty() && !ps.ranks.empty() ? ps.ranks[0].arenaBytes : an.arenaBytes;
  os << formatv("{0,-24} {1,14} {2,14}\n", "arena", formatBytes(static_cast<double>(arena)),
                formatBytes(num(m, "arena_bytes")));
  os << formatv("{0,-24} {1,14} {2,14}\n", "allocated (arena+states)",
                formatBytes(static_cast<double>(arena) + states), formatBytes(r.allocated));
  os << formatv("{0,-24} {1,14} {2,14}\n", "peak memory", formatBytes(an.memory.peak),
                formatBytes(num(m, "peak_bytes")) + "*");
  if (cuda) {
    os << formatv("{0,-24} {1,14} {2,14}\n", "  CUDA context", formatBytes(an.memory.context),
                  formatBytes(num(m, "context_bytes")) + "*");
    os << formatv("{0,-24} {1,14} {2,14}\n", "  cuBLASLt workspace", formatBytes(an.memory.libraryWorkspace),
                  formatBytes(num(m, "workspace_bytes")));
    if (an.memory.cudnnWorkspace > 0 || num(m, "cudnn_workspace_bytes") > 0)
      os << formatv("{0,-24} {1,14} {2,14}\n", "  cuDNN workspace", formatBytes(an.memory.cudnnWorkspace),
                    formatBytes(num(m, "cudnn_workspace_bytes")));
    os << "  * device memory in use (cudaMemGetInfo: total - free, at its highest), the CUDA context and\n"
          "    other processes on the device included; the workspace is cuBLASLt's and the kernels' scratch\n\n";
  } else {
    os << "  * resident set of the process" << (ranks > 1 ? " of rank 0" : "")
       << ": the regions, the batch, the program and its libraries\n\n";
  }
}

/// The text report: estimates beside measurements, time by class, the top kernels, the loss.
void printRunTable(const Analysis &an, const Measured &r, bool cuda) {
  const json::Object *m = r.m;
  int64_t ranks = worldOf(an);
  std::map<std::string, double> estClass = estimatedByClass(an), measClass = r.byClass;
  double steps = r.kernelSteps; // the top kernels' calls and time per step
  raw_ostream &os = outs();
  std::string where = cuda ? "on " + m->getString("device").getValueOr("a CUDA device").str()
                      : ranks > 1 ? formatv("on the CPU ({0} MPI processes of {1} thread{2}{3})", ranks,
                                            static_cast<int64_t>(num(m, "threads")), num(m, "threads") == 1 ? "" : "s",
                                            an.plan->parallel.zero >= 1
                                                ? ", ZeRO-" + std::to_string(an.plan->parallel.zero)
                                                : std::string())
                                        .str()
                                  : formatv("on the CPU ({0} thread{1})", static_cast<int64_t>(num(m, "threads")),
                                            num(m, "threads") == 1 ? "" : "s")
                                        .str();
  os << formatv("tally run: {0}, plan {1}, {2}: {3} step{4}, {5} timed after {6} warm-up\n", an.graph->model,
                an.plan->name, where, Steps, Steps == 1 ? "" : "s", r.timed, warmupSteps());
  os << formatv("estimates are for the target {0}{1}\n\n", an.plan->target.name,
                Overrides.target.empty() ? " (this machine, as `tally calibrate` measured it; --target to change)" : "");
  os << formatv("{0,-24} {1,14} {2,14}\n", "", "estimated", "measured");
  os << formatv("{0,-24} {1,14} {2,14}\n", "step time (median)", formatDuration(an.time.step), formatDuration(r.stepS));
  os << formatv("{0,-24} {1,14} {2,14}\n", "  min - max", "",
                formatDuration(r.minS) + " - " + formatDuration(r.maxS));
  // The CPU step times each kernel in every other timed step only (driver_host.h, profiledStep).
  if (!cuda && m->get("kernel_steps") && r.kernelSteps < static_cast<double>(r.timed))
    os << "  of the " << r.timed - static_cast<int64_t>(r.kernelSteps)
       << " timed steps that did not time each kernel call (the time by class below is of the other "
       << static_cast<int64_t>(r.kernelSteps) << ")\n";
  os << formatv("{0,-24} {1,14} {2,14}\n", "MFU", formatPercent(an.time.mfu), formatPercent(r.mfu));
  os << "  load average " << (std::isfinite(r.load) ? formatv("{0:f2}", r.load).str() : std::string("unknown"))
     << " (1 minute, after the last step) on " << r.cores << " core" << (r.cores == 1 ? "" : "s")
     << (r.warnings.empty() ? "" : "; see the warnings: the comparison is unreliable") << "\n";
  printRunMemory(os, an, r, cuda, ranks);
  if (ranks > 1) {
    bool staged = an.plan->parallel.pipeline > 1;
    os << formatv("{0,-24} {1,14} {2,14}\n",
                  staged && an.plan->parallel.data > 1                           ? "data x pipeline comm"
                  : staged && an.plan->parallel.tensor > 1                       ? "tensor x pipeline comm"
                  : staged                                                       ? "pipeline comm"
                  : an.plan->parallel.tensor > 1 && an.plan->parallel.data > 1 ? "data x tensor comm"
                  : an.plan->parallel.tensor > 1                               ? "tensor-parallel comm"
                                                                                 : "data-parallel comm",
                  formatDuration(an.time.dataParallelComm + an.time.tensorParallelComm +
                                 (staged ? an.time.pipelineComm : 0)),
                  formatDuration(r.comm));
    os << formatv("{0,-24} {1,14} {2,14}\n", "  waiting for ranks", "", formatDuration(r.wait));
    if (const json::Array *sent = m->getArray("sent_bytes")) { // ZeRO 2 and 3: counted per rank
      std::string each;
      for (const json::Value &v : *sent)
        each += (each.empty() ? "" : ", ") + formatv("{0:f0}", v.getAsNumber().getValueOr(NAN)).str();
      os << formatv("{0,-24} {1,14} {2,14}\n", "  bytes sent per rank",
                    formatv("{0:f0}", dataParallelSentBytes(an, 0) + tensorParallelSentBytes(an) + pipelineSentBytes(an, 0)).str(),
                    each);
    }
    if (staged)
      os << "  each stage's forward sends its boundary activations to the next stage's rank, its backward\n"
         << "  their gradients back (point to point, 1F1B" << (an.plan->parallel.interleave > 1 ? ", interleaved" : "")
         << "); a tied parameter's gradient is summed between its\n"
         << "  two stages; bytes: rank 0's, counted by the sends (estimated: the priced boundary sends);\n"
         << "  waiting for a peer (receives, sends not yet taken) is the rank's idle time, class \"bubble\";\n"
         << (an.plan->parallel.data > 1 && an.plan->parallel.zero >= 2
                 ? "  each backward unit reduce-scatters the gradients its chunk completes over the stage's data\n"
                   "  group into the rank's pieces (ZeRO " + std::to_string(an.plan->parallel.zero) + ": counted rings, every micro-batch, not\n" +
                       (an.plan->parallel.zero >= 3
                            ? std::string("  overlapped); each chunk gathers its blocks' parameters before its forward and backward;\n")
                            : std::string("  overlapped); the updated pieces are gathered back after the update;\n"))
             : an.plan->parallel.data > 1 && an.plan->parallel.zero == 1
                 ? "  then each stage's data group reduce-scatters that stage's gradients and gathers the updated\n"
                   "  parameters back (ZeRO-1: counted rings, after the last backward, not overlapped);\n"
             : an.plan->parallel.data > 1 ? "  then each stage's data group all-reduces that stage's gradients (a counted ring,\n"
                                            "  after the last backward, not overlapped);\n"
             : an.plan->parallel.tensor > 1
                 ? "  under tensor parallelism each tensor rank sends its 1/t of a boundary and the receiver\n"
                   "  all-gathers it over its tensor group (Megatron's scatter/gather); the stage's all-reduces\n"
                   "  run on its tensor group; bytes of both groups in the count;\n"
                 : "");
    else if (an.plan->parallel.tensor > 1)
      os << "  Megatron's split: each row-parallel matmul's output all-reduced in the forward, each\n"
         << "  column-parallel input's gradient in the backward; the embeddings, norms and the head run\n"
         << "  whole on every rank; bytes: counted by the ring all-reduces (estimated: the priced ones);\n"
         << (an.plan->parallel.data > 1 ? "  the tensor groups' all-reduces beside each data group's gradient all-reduce of its ranks' cuts;\n"
                                         : "");
    else if (an.plan->parallel.zero >= 2)
      os << "  each micro-batch's gradients are reduce-scattered into the ranks' pieces as the backward\n"
         << "  completes them"
         << (an.plan->parallel.zero >= 3 ? ", each block's parameters all-gathered before its forward and its backward"
                                         : ", the updated parameters all-gathered after the update")
         << ";\n  bytes: what each rank sent in the last step, counted by the collectives (estimated: the\n"
         << "  priced collectives as a ring sends them);\n";
    else
      os << "  the step averages the gradients after the backward (not overlapped), in buckets of 25 MiB"
         << (an.plan->parallel.zero >= 1 ? " (reduce-scatter, then all-gather of the parameters)" : " (all-reduce)")
         << ";\n  waiting is the barrier before it, for the slowest rank's backward (load imbalance);\n";
    os << "  the estimate is for the target's interconnect"
       << (an.plan->parallel.overlap && an.plan->parallel.data > 1 && !staged
               ? ", with the reduction hidden behind the backward (overlap = true)"
               : "")
       << "\n\n";
    printRankRows(os, rankRows(an, m->getArray("per_rank")));
  }
  os << formatv("{0,-24} {1,14} {2,14}\n", "time per step by class", "estimated", "measured");
  std::map<std::string, bool> classes;
  for (auto &[k, v] : estClass)
    classes[k] = true;
  for (auto &[k, v] : measClass)
    classes[k] = true;
  for (auto &[k, v] : classes)
    os << formatv("  {0,-22} {1,14} {2,14}\n", k, formatDuration(estClass[k]), formatDuration(measClass[k]));
  os << "\ntop kernels (measured)        calls/step   time/step\n";
  const std::vector<Kernel> &kernels = r.kernels;
  for (size_t i = 0; i < kernels.size() && i < 8; ++i)
    os << formatv("  {0,-28} {1,10} {2,11}\n", kernels[i].cls + " " + kernels[i].name,
                  formatv("{0:f0}", static_cast<double>(kernels[i].calls) / steps).str(),
                  formatDuration(kernels[i].total / steps));
  os << "\nloss per step" << (ranks > 1 ? " (the whole batch: the mean of the ranks')" : "") << ":";
  if (r.loss)
    for (const json::Value &v : *r.loss)
      os << formatv(" {0:f4}", v.getAsNumber().getValueOr(NAN));
  os << "\n";
  if (!TraceFile.empty())
    os << "\ntrace of the last step, measured and estimated: " << TraceFile
       << " (open it at https://ui.perfetto.dev or in chrome://tracing)\n";
}

/// The most OpenMP threads --threads may ask for (the step's own bound: libgomp crashed creating
/// 100,000).
constexpr int64_t kMaxThreads = 1024;

/// "" unless --save, --dump-grads or --trace names an input of this run (the .tally file or a
/// file it imports, --init, --data; compared by device and inode) or two name the same file.
std::string outputOverInput(const Compilation &c) {
  std::vector<std::pair<std::string, std::string>> inputs{{"--init", Init}, {"--data", Data}};
  for (unsigned i = 1; i <= c.sm.getNumBuffers(); ++i)
    inputs.push_back({"source", c.sm.getMemoryBuffer(i)->getBufferIdentifier().str()});
  auto same = [](const std::string &x, const std::string &y) {
    bool eq = false;
    return !x.empty() && !y.empty() && (x == y || (!sys::fs::equivalent(x, y, eq) && eq));
  };
  const std::pair<const char *, std::string> outs[] = {std::make_pair("--save", Save.getValue()),
                                                       std::make_pair("--dump-grads", DumpGrads.getValue()),
                                                       std::make_pair("--trace", TraceFile.getValue())};
  for (const std::pair<const char *, std::string> &out : outs)
    for (const auto &in : inputs)
      if (same(out.second, in.second))
        return std::string("refusing to write ") + out.first + " " + out.second + ": it is " +
               (in.first == "source" ? "a source file" : "the " + in.first + " file") + " of this run";
  for (size_t i = 0; i < 3; ++i)
    for (size_t j = i + 1; j < 3; ++j)
      if (same(outs[i].second, outs[j].second))
        return std::string(outs[i].first) + " and " + outs[j].first + " name the same file " + outs[i].second;
  return "";
}

/// --trace: reads the trace each rank of the step wrote (traceTemp), completes it with the
/// estimate (report/ChromeTrace.h) and writes TraceFile; removes the step's files. 0, or the
/// exit code after saying why.
int writeTrace(const Compilation &c, const Analysis &a, const Measured &r) {
  int64_t ranks = std::max<int64_t>(1, a.plan->parallel.data);
  if (ranks > 1)
    sys::fs::remove(traceTemp); // the empty temporary file: the ranks wrote theirs beside it
  std::vector<json::Value> traces;
  std::string why;
  for (int64_t k = 0; k < ranks; ++k) {
    std::string path = ranks > 1 ? traceTemp + ".rank" + std::to_string(k) : traceTemp;
    auto text = MemoryBuffer::getFile(path);
    sys::fs::remove(path);
    if (!text) {
      why = why.empty() ? "the generated step wrote no trace " + path : why;
      continue;
    }
    Expected<json::Value> v = json::parse((*text)->getBuffer());
    if (!v) {
      why = why.empty() ? "the generated step's trace is not JSON: " + toString(v.takeError()) : why;
      continue;
    }
    traces.push_back(std::move(*v));
  }
  json::Object out;
  if (why.empty() && !runTrace(a, traces, r.stepS, out, why))
    why = "--trace: " + why;
  if (!why.empty())
    return failure(why);
  std::vector<std::string> inputs{Init, Data};
  for (unsigned i = 1; i <= c.sm.getNumBuffers(); ++i)
    inputs.push_back(c.sm.getMemoryBuffer(i)->getBufferIdentifier().str());
  std::unique_ptr<OutputFile> f = OutputFile::open(TraceFile, inputs, why);
  if (f) {
    f->os() << formatv("{0:1}", json::Value(std::move(out))) << "\n";
    if (f->commit(why))
      return 0;
  }
  errs() << "tally: error: " << why << " [io-error]\n";
  return kOutputErrorExit;
}

int run() {
  if (std::string bad = badBackend(); !bad.empty())
    return usageError(bad);
  bool cuda = Backend == "cuda";
  if (Steps < 1 || Warmup < 0 || Threads < 0)
    return usageError("--steps must be at least 1, --warmup and --threads at least 0");
  if (Warmup.getNumOccurrences() && Warmup >= Steps)
    return usageError("--warmup " + std::to_string(Warmup) + " must be less than --steps " + std::to_string(Steps) +
                      ": --steps trains that many steps in all, the first --warmup of them untimed, and at "
                      "least one is timed");
  if (Threads > kMaxThreads)
    return usageError("--threads takes at most " + std::to_string(kMaxThreads) + ", not " + std::to_string(Threads));
  if (cuda && !TraceFile.empty())
    return usageError("--trace: the CUDA step does not trace its kernels yet; --backend cpu traces the same "
                      "step on this machine");
  if (!TraceFile.empty()) { // before minutes of building: the folder the trace goes in exists
    StringRef folder = sys::path::parent_path(TraceFile);
    if (!folder.empty() && !sys::fs::is_directory(folder))
      return usageError("--trace " + TraceFile + ": the folder " + folder.str() + " does not exist");
  }
  Compilation c;
  std::optional<Analysis> a;
  std::vector<codegen::File> files;
  if (int rc = compileStep(c, a, files))
    return rc;
  if (std::string why = outputOverInput(c); !why.empty())
    return usageError(why);
  if (!TraceFile.empty() && a->plan->parallel.pipeline > 1)
    return usageError("--trace: the pipeline step's ranks do not merge their traces yet; run the plan "
                      "without --trace (tally run prints every rank's idle time beside its bubble)");
  if (cuda)
    if (std::string why = cudaDeviceMissing(); !why.empty())
      return failure("--backend cuda: no CUDA device found: " + why + "; run on a machine with an NVIDIA GPU "
                     "(`tally build --backend cuda` writes the step without one), or use --backend cpu");
  std::string binary;
  if (std::string err = buildCached(files, binary); !err.empty())
    return failure(err);
  Optional<json::Value> report;
  SmallString<128> tracePath;
  if (!TraceFile.empty()) {
    if (std::error_code ec = sys::fs::createTemporaryFile("tally-trace", "json", tracePath))
      return failure("cannot create a temporary file: " + ec.message());
    traceTemp = tracePath.str().str();
  }
  int rc = runStep(*a, binary, report);
  if (rc != 0 && !traceTemp.empty()) { // what a failed step left
    sys::fs::remove(traceTemp);
    for (int64_t k = 0; k < a->plan->parallel.data; ++k)
      sys::fs::remove(traceTemp + ".rank" + std::to_string(k));
  }
  if (rc != 0)
    return rc;
  Measured r = measured(*a, report->getAsObject());
  if (!traceTemp.empty())
    if (int rc = writeTrace(c, *a, r))
      return rc;
  for (const std::string &w : r.warnings)
    errs() << "tally: warning: " << w << "\n";
  if (OutFormat == Format::Json)
    printRunJson(*a, r);
  else
    printRunTable(*a, r, cuda);
  return 0;
}

} // namespace
} // namespace buildcmd

int runBuild() {
  using namespace buildcmd;
  if (Build)
    return build();
  if (Run)
    return run();
  return -1;
}

} // namespace tally
