// The cache of built generated steps (`tally run`, tools/tally/Build.cpp): an entry is keyed by
// a content hash of the generated files AND the toolchain that builds them (each compiler's
// resolved path, the bytes of its executable and its `--version`, and the environment's
// compiler flags), and records the hash of the executable it built, so a cached executable
// that does not match its record (planted, truncated, half-written) is rebuilt, never run
// (issue 43, item 3). docs/runtime.md, "The step cache".
#pragma once

#include "codegen/Emit.h"

#include <string>
#include <vector>

namespace tally::stepcache {

/// Hex SHA-256 of `files` (paths and texts) and of the toolchain CMake will pick for the
/// backend (`cuda`: nvcc and its host compiler; else the C++ compiler): CXX / CUDACXX /
/// CUDAHOSTCXX or the default on PATH, and CXXFLAGS, CUDAFLAGS, LDFLAGS.
std::string key(const std::vector<codegen::File> &files, bool cuda);

/// The file in an entry's folder recording its key and its executable's hash.
inline const char *kRecord = "tally-cache.txt";

/// Whether the executable `binary` of the entry in `dir` may run: "" when the record in `dir`
/// names `key` and the SHA-256 of `binary`'s bytes; else why not.
std::string verify(const std::string &dir, const std::string &key, const std::string &binary);

/// Writes the record of a fresh build in `dir` (before it is renamed into place): `key` and
/// the hash of `binary`. "" or why it could not.
std::string record(const std::string &dir, const std::string &key, const std::string &binary);

} // namespace tally::stepcache
