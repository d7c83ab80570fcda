// Building generated steps into tally's cache (tools/tally/Build.cpp's `tally run`, StepCache.h
// for the key and the record): the children (cmake, the compiler) run with SIGPIPE at its
// default and a progress line on a terminal; an entry is built in a private folder and renamed
// into place. A CPU step links its driver from an entry of its own, built once per runtime,
// compiler and MPI setting (codegen/templates/cpu.cmake.in, TALLY_DRIVER_ONLY / TALLY_DRIVER_LIB).
#pragma once

#include "codegen/Emit.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/ADT/Optional.h"
#include "llvm/ADT/StringRef.h"

#include <string>
#include <vector>

namespace tally::buildcmd {

/// Writes the files under dir (created as needed) through the one writer (report/Output.h);
/// "" or the first I/O error; refuses a symbolic link where a file or folder of the step goes.
std::string writeFiles(llvm::StringRef dir, const std::vector<codegen::File> &files);

/// Runs a child with SIGPIPE at its default action; its exit code (-1 when it could not run).
int spawn(llvm::StringRef program, llvm::ArrayRef<llvm::StringRef> args,
          llvm::ArrayRef<llvm::Optional<llvm::StringRef>> redirects, std::string *err);

/// Builds the step for `files` in the cache (TALLY_CACHE_DIR, else $XDG_CACHE_HOME/tally, else
/// ~/.cache/tally), or finds it built: "" and sets `binary`, or why the build failed. `cuda`:
/// the files are the CUDA backend's.
std::string buildCached(const std::vector<codegen::File> &files, bool cuda, std::string &binary);

} // namespace tally::buildcmd
