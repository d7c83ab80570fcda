// The cache of built generated steps (`tally run`, tools/tally/Build.cpp): an entry is keyed by
// a content hash of the generated files AND the toolchain that builds them (each compiler's
// resolved path, the bytes of its executable and its `--version`, and the environment's
// compiler flags), and records the hash of the executable it built, so a cached executable
// that does not match its record (planted, truncated, half-written) is rebuilt, never run
// (issue 43, item 3). docs/runtime.md, "The step cache".
#pragma once

#include "codegen/Emit.h"

#include "llvm/ADT/SmallVector.h"
#include "llvm/ADT/StringRef.h"

#include <memory>
#include <string>
#include <vector>

namespace tally::stepcache {

/// Hex SHA-256 of `files` (paths and texts) and of the toolchain CMake will pick for the
/// backend (`cuda`: nvcc and its host compiler; else the C++ compiler): CXX / CUDACXX /
/// CUDAHOSTCXX or the default on PATH, and CXXFLAGS, CUDAFLAGS, LDFLAGS.
std::string key(const std::vector<codegen::File> &files, bool cuda);

/// `path` = dir/relative, refusing a symbolic link at any component of `relative` under `dir`:
/// tally creates none there, so one was planted, and writing through it would write outside
/// the folder. "" or why not.
std::string pathUnder(llvm::StringRef dir, llvm::StringRef relative, llvm::SmallVectorImpl<char> &path);

/// The cache's folder: $TALLY_CACHE_DIR, else $XDG_CACHE_HOME/tally, else ~/.cache/tally; ""
/// when there is no home folder either.
std::string folder();

/// The file in an entry's folder recording its key and its executable's hash.
inline const char *kRecord = "tally-cache.txt";

/// Whether the executable `binary` of the entry in `dir` may run: "" when the record in `dir`
/// names `key` and the SHA-256 of `binary`'s bytes; else why not.
std::string verify(const std::string &dir, const std::string &key, const std::string &binary);

/// Writes the record of a fresh build in `dir` (before it is renamed into place): `key` and
/// the hash of `binary`. "" or why it could not.
std::string record(const std::string &dir, const std::string &key, const std::string &binary);

/// A reusable build folder ("bench") for steps whose CMakeLists.txt and toolchain are the same:
/// `tally run` writes a new step's files into it (only those whose text changed), configures it
/// once and lets the build tool recompile what changed, instead of configuring and compiling a
/// fresh folder for every step (docs/codegen.md, "`tally run`"). A bench is held by one run at a
/// time (flock on its lock file, released by the destructor); a run that finds every bench
/// held builds in a fresh folder as before.
class Bench {
public:
  /// A free bench of `cache` for `files` (slots 0 and 1 of its CMakeLists.txt's hash), or none.
  static std::unique_ptr<Bench> acquire(const std::string &cache, const std::vector<codegen::File> &files, bool cuda);
  ~Bench();
  Bench(const Bench &) = delete;
  Bench &operator=(const Bench &) = delete;
  const std::string &dir() const { return dir_; }
  /// Writes the files whose text differs from what the bench holds; "" or the first error.
  std::string update(const std::vector<codegen::File> &files) const;
  /// Whether the bench's build folder was configured (CMakeCache.txt exists).
  bool configured() const;
  /// Empties the bench's build folder (after a failed build: the next one configures afresh).
  void reset() const;

private:
  Bench(std::string dir, int fd) : dir_(std::move(dir)), fd_(fd) {}
  std::string dir_;
  int fd_;
};

} // namespace tally::stepcache
