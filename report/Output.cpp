// The one output writer (report/Output.h): temporary file + fsync + rename, inputs refused, every I/O
// error a message instead of LLVM's fatal stream error; and the end-of-run check of stdout.
#include "report/Output.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"
#include "llvm/Support/Signals.h"

#include <cerrno>
#include <csignal>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

namespace tally {

namespace fs = llvm::sys::fs;

namespace {

std::string cannotWrite(const std::string &path, const std::string &why) {
  return "cannot write '" + path + "': " + why;
}

/// The stream's error as a message, clearing it (a raw_fd_ostream destroyed with an error set
/// calls report_fatal_error).
std::string takeError(llvm::raw_fd_ostream &os) {
  std::string m = os.error().message();
  os.clear_error();
  return m;
}

/// Bytes written per system call. LLVM buffers a file or pipe by its block size (4 KiB): a
/// 100,000-layer JSON report (780 MB) took 190,000 writes.
constexpr size_t kOutputBuffer = 1 << 20;

} // namespace

std::unique_ptr<OutputFile> OutputFile::open(const std::string &path,
                                             const std::vector<std::string> &inputs,
                                             std::string &error) {
  std::unique_ptr<OutputFile> out(new OutputFile());
  out->target = path;
  if (path == "-") {
    out->stream = &llvm::outs();
    if (!llvm::outs().is_displayed()) // a terminal stays unbuffered, as LLVM makes it
      llvm::outs().SetBufferSize(kOutputBuffer);
    return out;
  }
  if (path.empty()) {
    error = "the output file name is empty";
    return nullptr;
  }
  fs::file_status st;
  bool exists = !fs::status(path, st) && fs::exists(st);
  if (exists && fs::is_directory(st)) {
    error = cannotWrite(path, "Is a directory");
    return nullptr;
  }
  if (exists)
    for (const std::string &in : inputs) {
      bool same = false;
      if (in != "-" && !fs::equivalent(path, in, same) && same) {
        error = "refusing to write over '" + path + "': it is an input of this run";
        return nullptr;
      }
    }

  std::error_code ec;
  if (exists && !fs::is_regular_file(st)) {
    // /dev/null, /dev/full, a FIFO: cannot be replaced by a rename, so written in place.
    out->own = std::make_unique<llvm::raw_fd_ostream>(path, ec, fs::OF_Text);
    if (ec) {
      error = cannotWrite(path, ec.message());
      return nullptr;
    }
    out->own->SetBufferSize(kOutputBuffer);
    out->stream = out->own.get();
    return out;
  }

  // A regular or new file: a temporary file beside it, renamed over it at commit(). A symbolic
  // link is written through (its target is replaced, the link stays).
  // A file the user may not write stays unwritten, although its folder would allow a rename.
  if (exists)
    if (std::error_code denied = fs::access(path, fs::AccessMode::Write)) {
      error = cannotWrite(path, denied.message());
      return nullptr;
    }
  llvm::SmallString<256> real;
  if (exists && !fs::real_path(path, real))
    out->renameTo = std::string(real.str());
  else
    out->renameTo = path;
  llvm::StringRef parent = llvm::sys::path::parent_path(out->renameTo);
  llvm::SmallString<256> model(parent.empty() ? llvm::StringRef(".") : parent);
  llvm::sys::path::append(model,
                          "." + llvm::sys::path::filename(out->renameTo).str() + ".tmp-%%%%%%%%");
  int fd = -1;
  llvm::SmallString<256> temp;
  if ((ec = fs::createUniqueFile(model, fd, temp, fs::OF_Text))) {
    error = cannotWrite(path, ec.message());
    return nullptr;
  }
  out->temp = std::string(temp.str());
  llvm::sys::RemoveFileOnSignal(out->temp);
  if (exists) // keep the permissions of the file being replaced
    fs::setPermissions(out->temp, st.permissions());
  out->own = std::make_unique<llvm::raw_fd_ostream>(fd, /*shouldClose=*/true);
  out->own->SetBufferSize(kOutputBuffer);
  out->stream = out->own.get();
  return out;
}

OutputFile::~OutputFile() {
  if (own && own->has_error())
    own->clear_error();
  own.reset();
  if (!done && !temp.empty()) {
    fs::remove(temp);
    llvm::sys::DontRemoveFileOnSignal(temp);
  }
}

bool OutputFile::commit(std::string &error) {
  if (!own) { // standard output
    llvm::outs().flush();
    if (llvm::outs().has_error()) {
      error = "cannot write to standard output: " + takeError(llvm::outs());
      return false;
    }
    done = true;
    return true;
  }
  own->close();
  if (own->has_error()) {
    error = cannotWrite(target, takeError(*own));
    return false; // the destructor removes the temporary file
  }
  if (!temp.empty()) {
    // On disk before the rename, so a crash never leaves an empty or partial file in place.
    int fd = ::open(temp.c_str(), O_RDONLY | O_CLOEXEC);
    bool synced = fd >= 0 && ::fsync(fd) == 0;
    std::string why = synced ? "" : std::strerror(errno);
    if (fd >= 0)
      ::close(fd);
    if (!synced) {
      error = cannotWrite(target, "fsync: " + why);
      return false;
    }
    if (std::error_code ec = fs::rename(temp, renameTo)) {
      error = cannotWrite(target, ec.message());
      return false;
    }
    llvm::sys::DontRemoveFileOnSignal(temp);
  }
  done = true;
  return true;
}

void ignoreBrokenPipes() {
  // InitLLVM makes SIGPIPE exit with code 74 (EX_IOERR); ignored, a write to a closed pipe
  // fails with EPIPE and is reported by finishStandardStreams().
  llvm::sys::SetOneShotPipeSignalFunction(nullptr);
  std::signal(SIGPIPE, SIG_IGN);
}

int finishStandardStreams(int status) {
  llvm::outs().flush();
  if (llvm::outs().has_error()) {
    std::string why = takeError(llvm::outs());
    llvm::errs() << "tally: error: cannot write to standard output: " << why << " [io-error]\n";
    status = kOutputErrorExit;
  }
  if (llvm::errs().has_error()) { // nowhere left to say so; the exit code does
    llvm::errs().clear_error();
    status = kOutputErrorExit;
  }
  return status;
}

} // namespace tally
