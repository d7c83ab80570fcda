// Building generated steps into tally's cache (BuildCache.h).
#include "tools/tally/BuildCache.h"

#include "report/Output.h"
#include "tools/tally/StepCache.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <csignal>
#include <thread>

using namespace llvm;

namespace tally::buildcmd {

/// Writes the files under dir (created as needed) through the one writer (report/Output.h: a
/// temporary file, fsynced and renamed into place); "" or the first I/O error. A symbolic link
/// under dir, where a file or a folder of the step would go, is refused: tally never creates
/// one, so it was planted, and following it would write outside the folder.
std::string writeFiles(StringRef dir, const std::vector<codegen::File> &files) {
  for (const codegen::File &f : files) {
    SmallString<256> path(dir);
    for (auto part = sys::path::begin(f.path), end = sys::path::end(f.path); part != end; ++part) {
      sys::path::append(path, *part);
      sys::fs::file_status st;
      if (!sys::fs::status(path, st, /*follow=*/false) && sys::fs::is_symlink_file(st))
        return "refusing to write through the symbolic link " + path.str().str() +
               ": tally build did not create it (remove it, or pick another folder)";
    }
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
namespace {

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

/// The cache folder: TALLY_CACHE_DIR, else $XDG_CACHE_HOME/tally, else ~/.cache/tally.
std::string cacheRoot(std::string &why) {
  SmallString<256> cache;
  if (Optional<std::string> env = sys::Process::GetEnv("TALLY_CACHE_DIR")) {
    cache = *env;
  } else if (Optional<std::string> xdg = sys::Process::GetEnv("XDG_CACHE_HOME")) {
    cache = *xdg;
    sys::path::append(cache, "tally");
  } else if (!sys::path::home_directory(cache)) {
    why = "no cache folder: set TALLY_CACHE_DIR";
    return "";
  } else {
    sys::path::append(cache, ".cache", "tally");
  }
  return cache.str().str();
}

/// One cache entry: the folder `kind`-<key's first 20 hex digits> under `root`, whose build
/// folder holds `product`; built when missing or when its product does not match its record
/// (CMake configured with `defines`). "" and sets `built` (the product in place), or why not.
std::string buildEntry(const std::string &root, const std::string &kind, const std::vector<codegen::File> &files,
                       const std::string &key, const std::vector<std::string> &defines, StringRef product,
                       StringRef what, std::string &built) {
  SmallString<256> dir(root);
  sys::path::append(dir, kind + "-" + key.substr(0, 20));
  SmallString<256> bin(dir);
  sys::path::append(bin, "build", product);
  built = bin.str().str();
  if (sys::fs::exists(dir)) {
    std::string why = stepcache::verify(dir.str().str(), key, built);
    if (why.empty())
      return "";
    errs() << "tally: note: not " << (kind == "step" ? "running" : "linking") << " the cached " << kind << " in "
           << dir << ": " << why << "; rebuilding it\n";
    if (std::error_code ec = sys::fs::remove_directories(dir))
      return "cannot remove the cached " + kind + " " + dir.str().str() + ": " + ec.message();
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
  SmallString<256> log(tmp), buildDir(tmp);
  sys::path::append(log, "build.log");
  sys::path::append(buildDir, "build");
  std::string why;
  std::string jobs = std::to_string(std::max(1u, std::thread::hardware_concurrency()));
  errs() << "tally: " << what << " in " << dir << "\n";
  std::vector<StringRef> configure = {*cmake, "-S", tmp, "-B", buildDir, "-DCMAKE_BUILD_TYPE=Release"};
  for (const std::string &d : defines)
    configure.push_back(d);
  if (!execute(*cmake, configure, log, why, what.str() + ": configuring") ||
      !execute(*cmake, {*cmake, "--build", buildDir, "-j", jobs}, log, why, what.str() + ": compiling"))
    return what.str() + " failed (" + why + "); the end of " + log.str().str() + ":\n" + tail(log, 30);
  SmallString<256> made(buildDir);
  sys::path::append(made, product);
  if (std::string err = stepcache::record(tmp.str().str(), key, made.str().str()); !err.empty())
    return err;
  if (std::error_code ec = sys::fs::rename(tmp, dir)) {
    sys::fs::remove_directories(tmp); // another run finished the same build first
    if (!stepcache::verify(dir.str().str(), key, built).empty())
      return "cannot move the build into " + dir.str().str() + ": " + ec.message();
  }
  return "";
}

} // namespace

std::string buildCached(const std::vector<codegen::File> &files, bool cuda, std::string &binary) {
  std::string why;
  const std::string root = cacheRoot(why);
  if (root.empty())
    return why;
  std::vector<std::string> defines;
  if (!cuda) {
    // The CPU driver (codegen/program/driver_cpu.cpp) is the same for every step of one runtime,
    // compiler and MPI setting, and took 6 of a step's 13 s of compiling (the 2-vCPU VM): its
    // entry is the runtime's files and the step's CMakeLists.txt, built with TALLY_DRIVER_ONLY;
    // the step links it (TALLY_DRIVER_LIB). When it cannot be built, the step compiles it.
    std::vector<codegen::File> driver;
    for (const codegen::File &f : files)
      if (StringRef(f.path).startswith("runtime/") || f.path == "CMakeLists.txt")
        driver.push_back(f);
    std::string lib;
    std::string err = buildEntry(root, "driver", driver, stepcache::key(driver, false), {"-DTALLY_DRIVER_ONLY=ON"},
                                 "libtally_step.a", "building the step's driver", lib);
    if (err.empty())
      defines.push_back("-DTALLY_DRIVER_LIB=" + lib);
    else
      errs() << "tally: note: " << err << "\ntally: note: compiling the driver into the step instead\n";
  }
  return buildEntry(root, "step", files, stepcache::key(files, cuda), defines, "tally_step",
                    "building the generated step", binary);
}

} // namespace tally::buildcmd
