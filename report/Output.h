// The one writer for every file tally writes (`report -o`, `import-hf -o`, `calibrate -o`) and
// the final check of standard output. A file is written to a temporary file in the target's
// folder, flushed to disk (fsync) and renamed over the target only when every byte was
// written, so a reader never sees an empty or partial file and concurrent writers never
// interleave; a target that is one of the run's inputs is refused; every I/O error
// (unwritable folder, full disk, closed stdout, broken pipe) becomes a message the caller
// prints as an `[io-error]` with exit code 2 (docs/language.md, "Exit codes"), never
// LLVM's fatal "IO failure on output stream".
#pragma once

#include "llvm/Support/raw_ostream.h"

#include <memory>
#include <string>
#include <vector>

namespace tally {

/// Exit code of a run whose output could not be written (the same as bad usage).
constexpr int kOutputErrorExit = 2;

/// One output: "-" is standard output; a regular (or not yet existing) file is written through
/// a temporary file and renamed at commit(); a character device or FIFO (`/dev/null`,
/// `/dev/full`, a named pipe) is written in place, since it cannot be replaced by a rename.
class OutputFile {
public:
  /// Opens `path`; null with `error` set when it cannot be written: its folder is missing or
  /// unwritable, it is a directory, or it is the same file as one of `inputs` (compared by
  /// device and inode, so `./m.tally` and a hard link to it count as the same file).
  static std::unique_ptr<OutputFile> open(const std::string &path,
                                          const std::vector<std::string> &inputs,
                                          std::string &error);
  /// Removes the temporary file when commit() was not reached or failed.
  ~OutputFile();

  /// The stream to write to.
  llvm::raw_ostream &os() { return *stream; }

  /// Flushes and closes the stream, checks it for write errors, and renames the temporary file
  /// over the target. False with `error` set (naming the target) on any failure; the target
  /// is then left as it was.
  bool commit(std::string &error);

private:
  OutputFile() = default;
  std::string target;                       ///< the path the user named
  std::string renameTo;                     ///< the file replaced: the target, links resolved
  std::string temp;                         ///< the temporary file; empty when written in place
  std::unique_ptr<llvm::raw_fd_ostream> own; ///< the stream of a file (null for stdout)
  llvm::raw_ostream *stream = nullptr;      ///< own.get() or llvm::outs()
  bool done = false;
};

/// Makes a write to a closed pipe an error (EPIPE) rather than a signal, so that it can be
/// reported like any other write error. Call once at start-up.
void ignoreBrokenPipes();

/// Flushes standard output and standard error and clears their error flags (so that LLVM's
/// stream destructors do not abort). Returns `status`, or kOutputErrorExit after printing
/// "tally: error: cannot write to standard output: REASON [io-error]" when stdout failed.
int finishStandardStreams(int status);

} // namespace tally
