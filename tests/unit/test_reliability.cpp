// test_reliability.cpp — unit tests for issue 12's fixes below the CLI: a diagnostic said again
// at the same place is said once (frontend/Diagnostics.h); huge and tiny numbers keep their
// value in the text formats (ir/Units.h); the output writer renames into place and refuses its
// inputs (report/Output.h).
#include <catch.hpp>

#include <string>

#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>

#include "frontend/Diagnostics.h"
#include "ir/Units.h"
#include "report/Output.h"

using namespace tally;

TEST_CASE("the same diagnostic at the same place is emitted once", "[diagnostics][reliability]") {
  llvm::SourceMgr sm;
  sm.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy("y = x @ w\n", "m.tally"),
                        llvm::SMLoc());
  const char *start = sm.getMemoryBuffer(sm.getMainFileID())->getBufferStart();
  DiagnosticEngine diags(sm);
  diags.setOutput(nullptr);
  llvm::SMLoc at = llvm::SMLoc::getFromPointer(start + 6);
  diags.report(DiagKind::MatmulShape, at, "inner dimensions differ");
  diags.report(DiagKind::MatmulShape, at, "inner dimensions differ"); // plan 2: the same
  CHECK(diags.errorCount() == 1);
  CHECK(diags.diagnostics().size() == 1);
  // Another message or another place: each is its own diagnostic.
  diags.report(DiagKind::MatmulShape, at, "another message");
  diags.report(DiagKind::MatmulShape, llvm::SMLoc::getFromPointer(start), "inner dimensions differ");
  CHECK(diags.errorCount() == 3);
  // No place at all (a command-line override, checked again for each plan): once as well.
  diags.report(DiagKind::InvalidValue, llvm::SMLoc(), "'batch' must be positive, but it is 0");
  diags.report(DiagKind::InvalidValue, llvm::SMLoc(), "'batch' must be positive, but it is 0");
  diags.report(DiagKind::IoError, llvm::SMLoc(), "cannot read 'x'");
  CHECK(diags.errorCount() == 5);
}

TEST_CASE("huge numbers print in scientific form, not cut to a buffer", "[units][reliability]") {
  // 1e300 days: a fixed-point number of 301 digits before; now its three significant digits.
  CHECK(formatDuration(1e300 * 86400.0) == "1e300 days");
  CHECK(formatDuration(6.1216e62 * 86400.0) == "6.12e62 days");
  // Below 1e15 days the fixed form stays: 123456.78 days.
  CHECK(formatDuration(123456.78 * 86400.0) == "123456.78 days");
  // 2^100 bytes = 2^50 PiB = 1.1259e15 PiB.
  CHECK(formatBytes(std::ldexp(1.0, 100)) == "1.13e15 PiB");
  CHECK(formatBytes(std::ldexp(1.0, 60)) == "1024.00 PiB");
}

TEST_CASE("a tiny ratio is not shown as 0%", "[units][reliability]") {
  CHECK(formatPercent(9.9357e-6) == "0.00099%");
  CHECK(formatPercent(0) == "0%");
  CHECK(formatPercent(0.5) == "50%");
  CHECK(formatPercent(0.00005) == "0.01%"); // 0.005% rounds to two decimals as before
}

TEST_CASE("the output writer renames into place and refuses its inputs", "[output][reliability]") {
  llvm::SmallString<128> dir;
  REQUIRE(!llvm::sys::fs::createUniqueDirectory("tally-output", dir));
  std::string target = (dir + "/r.txt").str();
  std::string error;
  {
    std::unique_ptr<OutputFile> out = OutputFile::open(target, {}, error);
    REQUIRE(out);
    out->os() << "first";
    // Until commit() the target does not exist: a reader never sees a partial file.
    CHECK(!llvm::sys::fs::exists(target));
    REQUIRE(out->commit(error));
  }
  auto text = llvm::MemoryBuffer::getFile(target);
  REQUIRE(text);
  CHECK((*text)->getBuffer() == "first");
  {
    // Dropped without commit(): the old file stays and the temporary file is removed.
    std::unique_ptr<OutputFile> out = OutputFile::open(target, {}, error);
    REQUIRE(out);
    out->os() << "second";
  }
  text = llvm::MemoryBuffer::getFile(target);
  REQUIRE(text);
  CHECK((*text)->getBuffer() == "first");
  std::error_code ec;
  unsigned entries = 0;
  for (llvm::sys::fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec))
    ++entries;
  CHECK(entries == 1);
  // The target as an input, named differently: refused.
  std::string other = (dir + "/./r.txt").str();
  CHECK(!OutputFile::open(target, {other}, error));
  CHECK(error.find("it is an input of this run") != std::string::npos);
  llvm::sys::fs::remove(target);
  llvm::sys::fs::remove(dir);
}
