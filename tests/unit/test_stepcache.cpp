// The step cache's bench (tools/tally/StepCache.h): one run holds a bench at a time, a bench
// rewrites only the files whose text changed, and no file is written through a symbolic link.
#include "tools/tally/StepCache.h"

#include "tests/unit/Support.h"

#include "llvm/Support/FileSystem.h"
#include "llvm/Support/Path.h"


using namespace tally;


TEST_CASE("stepcache: benches are held one run at a time, two slots", "[stepcache]") {
  llvm::SmallString<128> cache;
  REQUIRE(!llvm::sys::fs::createUniqueDirectory("tally-bench", cache));
  std::vector<codegen::File> files = {{"CMakeLists.txt", "project(x)\n"}, {"step.cpp", "int a;\n"}};
  auto first = stepcache::Bench::acquire(cache.str().str(), files, false);
  auto second = stepcache::Bench::acquire(cache.str().str(), files, false);
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->dir() != second->dir());
  CHECK(llvm::StringRef(first->dir()).endswith("-0"));
  CHECK(llvm::StringRef(second->dir()).endswith("-1"));
  CHECK_FALSE(stepcache::Bench::acquire(cache.str().str(), files, false)); // both held
  second.reset();
  auto again = stepcache::Bench::acquire(cache.str().str(), files, false); // slot 1 is free again
  REQUIRE(again);
  CHECK(llvm::StringRef(again->dir()).endswith("-1"));
  // Another CMakeLists.txt is another bench.
  std::vector<codegen::File> other = {{"CMakeLists.txt", "project(y)\n"}};
  auto otherBench = stepcache::Bench::acquire(cache.str().str(), other, false);
  REQUIRE(otherBench);
  CHECK(llvm::StringRef(otherBench->dir()).endswith("-0"));
  CHECK(otherBench->dir() != first->dir());
  first.reset(), again.reset(), otherBench.reset();
  llvm::sys::fs::remove_directories(cache);
}

TEST_CASE("stepcache: a bench rewrites only changed files and never through a link", "[stepcache]") {
  llvm::SmallString<128> cache;
  REQUIRE(!llvm::sys::fs::createUniqueDirectory("tally-bench", cache));
  std::vector<codegen::File> files = {{"CMakeLists.txt", "project(x)\n"}, {"step.cpp", "int a;\n"},
                                      {"runtime/r.h", "#pragma once\n"}};
  auto bench = stepcache::Bench::acquire(cache.str().str(), files, false);
  REQUIRE(bench);
  REQUIRE(bench->update(files).empty());
  const std::string step = bench->dir() + "/step.cpp", header = bench->dir() + "/runtime/r.h";
  CHECK(test::readText(step) == "int a;\n");
  CHECK(test::readText(header) == "#pragma once\n");
  CHECK_FALSE(bench->configured());
  // Unchanged files keep their modification time (the build tool then rebuilds nothing of them).
  llvm::sys::fs::file_status before, after;
  REQUIRE(!llvm::sys::fs::status(header, before));
  {
    int fd = -1;
    REQUIRE(!llvm::sys::fs::openFileForWrite(header, fd, llvm::sys::fs::CD_OpenExisting, llvm::sys::fs::OF_Append));
    llvm::sys::fs::setLastAccessAndModificationTime(fd, llvm::sys::TimePoint<>()); // the epoch
    llvm::sys::fs::closeFile(fd);
  }
  REQUIRE(!llvm::sys::fs::status(header, before));
  files[1].text = "int b;\n";
  REQUIRE(bench->update(files).empty());
  REQUIRE(!llvm::sys::fs::status(header, after));
  CHECK(after.getLastModificationTime() == before.getLastModificationTime());
  CHECK(test::readText(step) == "int b;\n");
  // A symbolic link planted where a file goes is refused, and nothing is written through it.
  const std::string target = cache.str().str() + "/planted";
  REQUIRE(!llvm::sys::fs::remove(step));
  REQUIRE(!llvm::sys::fs::create_link(target, step));
  files[1].text = "int c;\n";
  std::string err = bench->update(files);
  CHECK(err.find("refusing to write through the symbolic link") != std::string::npos);
  CHECK_FALSE(llvm::sys::fs::exists(target));
  bench.reset();
  llvm::sys::fs::remove_directories(cache);
}
