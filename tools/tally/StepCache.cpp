// The step cache's key and record (StepCache.h; issue 43, item 3).
#include "tools/tally/StepCache.h"

#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SHA256.h"
#include "llvm/Support/raw_ostream.h"

#include <csignal>

#include <sys/file.h>

namespace tally::stepcache {

using namespace llvm;

namespace {

/// Hex SHA-256 of the file at `path`'s bytes, or "" when it cannot be read.
std::string fileHash(StringRef path) {
  ErrorOr<std::unique_ptr<MemoryBuffer>> buf = MemoryBuffer::getFile(path, /*IsText=*/false,
                                                                     /*RequiresNullTerminator=*/false);
  if (!buf)
    return "";
  return toHex(SHA256::hash(arrayRefFromStringRef((*buf)->getBuffer())));
}

/// What `program --version` prints (stdout and stderr), "" when it cannot run; 10 s at most.
std::string versionText(StringRef program) {
  SmallString<128> out;
  if (sys::fs::createTemporaryFile("tally-compiler-version", "txt", out))
    return "";
  Optional<StringRef> redirects[] = {StringRef(""), StringRef(out), StringRef(out)};
  void (*previous)(int) = std::signal(SIGPIPE, SIG_DFL); // tally ignores it; the child must not
  sys::ExecuteAndWait(program, {program, "--version"}, None, redirects, /*SecondsToWait=*/10);
  std::signal(SIGPIPE, previous);
  ErrorOr<std::unique_ptr<MemoryBuffer>> text = MemoryBuffer::getFile(out);
  sys::fs::remove(out);
  return text ? (*text)->getBuffer().str() : "";
}

/// A compiler as CMake finds it: `env`'s first word (a path or a name on PATH) when set, else
/// the first of `defaults` that exists. Its identity: the name, the resolved real path, the
/// hash of its bytes and its --version text; "none" when there is none (CMake then fails).
std::string compilerIdentity(const char *env, std::initializer_list<const char *> defaults) {
  std::string name;
  if (Optional<std::string> v = sys::Process::GetEnv(env); v && !v->empty())
    name = StringRef(*v).trim().split(' ').first.str();
  std::string path;
  for (const char *d : defaults) {
    if (!name.empty())
      break;
    if (sys::path::is_absolute(d) ? sys::fs::can_execute(d) : bool(sys::findProgramByName(d)))
      name = d;
  }
  if (name.empty())
    return std::string(env) + ": none";
  if (sys::path::has_parent_path(name))
    path = name;
  else if (ErrorOr<std::string> found = sys::findProgramByName(name))
    path = *found;
  SmallString<256> real;
  if (path.empty() || sys::fs::real_path(path, real))
    return std::string(env) + ": " + name + " (not found)";
  return std::string(env) + ": " + name + " = " + real.str().str() + "\nbytes " + fileHash(real) + "\n" +
         versionText(path);
}

/// An environment variable's value, for the key ("NAME=" when unset).
std::string envLine(const char *name) {
  Optional<std::string> v = sys::Process::GetEnv(name);
  return std::string(name) + "=" + (v ? *v : "") + "\n";
}

} // namespace

std::string key(const std::vector<codegen::File> &files, bool cuda) {
  SHA256 sha;
  for (const codegen::File &f : files) {
    sha.update(f.path);
    sha.update(StringRef("\0", 1));
    sha.update(f.text);
    sha.update(StringRef("\0", 1));
  }
  std::string tools;
  if (cuda) // codegen/templates/cuda.cmake.in: CUDACXX, else /usr/local/cuda's nvcc, else PATH's
    tools = compilerIdentity("CUDACXX", {"/usr/local/cuda/bin/nvcc", "nvcc"}) + "\n" +
            compilerIdentity("CUDAHOSTCXX", {"c++", "g++", "clang++"}) + "\n" + envLine("CUDAFLAGS");
  // The C++ compiler builds the driver and runtime sources of both backends (CMake's search order).
  tools += compilerIdentity("CXX", {"c++", "g++", "clang++"}) + "\n" + envLine("CXXFLAGS") + envLine("CPPFLAGS") +
           envLine("LDFLAGS");
  sha.update(tools);
  return toHex(sha.final());
}

std::string verify(const std::string &dir, const std::string &key, const std::string &binary) {
  SmallString<256> path(dir);
  sys::path::append(path, kRecord);
  ErrorOr<std::unique_ptr<MemoryBuffer>> rec = MemoryBuffer::getFile(path);
  if (!rec)
    return "it has no record of what it built (" + std::string(kRecord) + ")";
  std::string want = "key " + key + "\nexecutable " + fileHash(binary) + "\n";
  if (!(*rec)->getBuffer().startswith("key " + key + "\n"))
    return "its record names another key";
  if ((*rec)->getBuffer() != want)
    return "its executable is not the one it built (another SHA-256)";
  return "";
}

std::string record(const std::string &dir, const std::string &key, const std::string &binary) {
  std::string hash = fileHash(binary);
  if (hash.empty())
    return "cannot read the built step " + binary;
  SmallString<256> path(dir);
  sys::path::append(path, kRecord);
  std::error_code ec;
  raw_fd_ostream os(path, ec, sys::fs::OF_None);
  if (ec)
    return "cannot write " + path.str().str() + ": " + ec.message();
  os << "key " << key << "\nexecutable " << hash << "\n";
  os.close();
  if (os.has_error())
    return "cannot write " + path.str().str() + ": " + os.error().message();
  return "";
}

std::string pathUnder(StringRef dir, StringRef relative, SmallVectorImpl<char> &path) {
  path.assign(dir.begin(), dir.end());
  for (auto part = sys::path::begin(relative), end = sys::path::end(relative); part != end; ++part) {
    sys::path::append(path, *part);
    sys::fs::file_status st;
    if (!sys::fs::status(path, st, /*follow=*/false) && sys::fs::is_symlink_file(st))
      return "refusing to write through the symbolic link " + std::string(path.begin(), path.end()) +
             ": tally build did not create it (remove it, or pick another folder)";
  }
  return "";
}

std::string folder() {
  SmallString<256> cache;
  if (Optional<std::string> env = sys::Process::GetEnv("TALLY_CACHE_DIR"); env && !env->empty())
    return *env;
  if (Optional<std::string> xdg = sys::Process::GetEnv("XDG_CACHE_HOME")) {
    cache = *xdg;
    sys::path::append(cache, "tally");
  } else if (!sys::path::home_directory(cache)) {
    return "";
  } else {
    sys::path::append(cache, ".cache", "tally");
  }
  return cache.str().str();
}

std::unique_ptr<Bench> Bench::acquire(const std::string &cache, const std::vector<codegen::File> &files, bool cuda) {
  std::vector<codegen::File> build;
  for (const codegen::File &f : files)
    if (f.path == "CMakeLists.txt")
      build.push_back(f);
  if (build.empty())
    return nullptr;
  const std::string hash = key(build, cuda).substr(0, 20);
  for (int slot = 0; slot < 2; ++slot) {
    SmallString<256> dir(cache);
    sys::path::append(dir, "bench-" + hash + "-" + std::to_string(slot));
    SmallString<256> lock(dir);
    lock += ".lock";
    if (sys::fs::create_directories(cache))
      return nullptr;
    int fd = -1;
    if (sys::fs::openFileForReadWrite(lock, fd, sys::fs::CD_OpenAlways, sys::fs::OF_None))
      continue;
    // flock: held by this open file (fcntl's record locks, LLVM's tryLockFile, are the process's,
    // so a second acquire in one process would get the same bench).
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      sys::Process::SafelyCloseFileDescriptor(fd);
      continue; // another run builds there
    }
    return std::unique_ptr<Bench>(new Bench(dir.str().str(), fd));
  }
  return nullptr;
}

Bench::~Bench() {
  ::flock(fd_, LOCK_UN);
  sys::Process::SafelyCloseFileDescriptor(fd_);
}

std::string Bench::update(const std::vector<codegen::File> &files) const {
  for (const codegen::File &f : files) {
    SmallString<256> path;
    if (std::string err = pathUnder(dir_, f.path, path); !err.empty())
      return err;
    ErrorOr<std::unique_ptr<MemoryBuffer>> old = MemoryBuffer::getFile(path, /*IsText=*/false,
                                                                       /*RequiresNullTerminator=*/false);
    if (old && (*old)->getBuffer() == f.text)
      continue; // unchanged: its timestamp stays, so nothing that reads it is rebuilt
    if (std::error_code ec = sys::fs::create_directories(sys::path::parent_path(path)))
      return "cannot create " + sys::path::parent_path(path).str() + ": " + ec.message();
    std::error_code ec;
    raw_fd_ostream out(path, ec);
    if (ec)
      return "cannot write " + path.str().str() + ": " + ec.message();
    out << f.text;
    out.close();
    if (out.has_error())
      return "cannot write " + path.str().str() + ": " + out.error().message();
  }
  return "";
}

bool Bench::configured() const {
  SmallString<256> cache(dir_);
  sys::path::append(cache, "build", "CMakeCache.txt");
  return sys::fs::exists(cache);
}

void Bench::reset() const {
  SmallString<256> build(dir_);
  sys::path::append(build, "build");
  sys::fs::remove_directories(build);
}

} // namespace tally::stepcache
