// test_reliability.cpp — unit tests for issue 12's fixes below the CLI: a diagnostic said again
// at the same place is said once (support/Diagnostics.h); huge and tiny numbers keep their
// value in the text formats (ir/Units.h); the output writer renames into place and refuses its
// inputs (report/Output.h); the memory plan's int64 sizes are checked at the edges, and a plan
// past them is not representable (passes/MemoryPlan.cpp, docs/memory.md §6); the vectors that
// grow with the model are advised huge pages (support/Memory.h). Issue 43: the generated step's
// command line (codegen/program/driver_args.h) refuses every bad flag with a reason.
#include <catch.hpp>

#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <sys/mman.h>
#include <unistd.h>

#include <llvm/Support/FileSystem.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/Path.h>
#include <llvm/Support/Program.h>

#include "Support.h"
#include "codegen/program/driver_args.h"
#include "codegen/Emit.h"
#include "support/Memory.h"
#include "support/Diagnostics.h"
#include "ir/Units.h"
#include "report/Output.h"
#include "report/Report.h"

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

TEST_CASE("checked int64 arithmetic at the edges", "[checked][reliability]") {
  const int64_t two31 = int64_t(1) << 31, two32 = int64_t(1) << 32;
  CHECK(checkedAdd(INT64_MAX - 1, 1) == INT64_MAX);
  CHECK(!checkedAdd(INT64_MAX, 1));
  CHECK(checkedAdd(INT64_MIN, 0) == INT64_MIN);
  CHECK(!checkedAdd(INT64_MIN, -1));
  CHECK(checkedMul(two31, two31) == int64_t(1) << 62);
  CHECK(!checkedMul(two32, two31));             // 2^63 = INT64_MAX + 1
  CHECK(checkedMul(-two32, two31) == INT64_MIN); // -2^63 fits
  CHECK(checkedMul(INT64_MAX, 1) == INT64_MAX);
  CHECK(!checkedMul(INT64_MAX, 2));
  CHECK(!checkedMul(INT64_MIN, -1));
  // 9e18 elements fit int64, their f32 bytes (3.6e19) do not.
  CHECK(checkedMul(3000000000, 3000000000) == 9000000000000000000);
  CHECK(!checkedMul(9000000000000000000, 4));
  // The largest multiple of 256 in int64 is 2^63 - 256 = INT64_MAX - 255; one byte more rounds
  // up to 2^63.
  CHECK(checkedAlignUp(0) == 0);
  CHECK(checkedAlignUp(1) == 256);
  CHECK(checkedAlignUp(256) == 256);
  CHECK(checkedAlignUp(257) == 512);
  CHECK(checkedAlignUp(INT64_MAX - 255) == INT64_MAX - 255);
  CHECK(!checkedAlignUp(INT64_MAX - 254));
  CHECK(!checkedAlignUp(INT64_MAX));
  CHECK(!checkedAlignUp(-1));
  Shape s{{3000000000, 0}, {3000000000, 0}};
  CHECK(checkedNumel(s) == 9000000000000000000);
  s.push_back({2, 0});
  CHECK(!checkedNumel(s)); // 1.8e19
}

namespace {
/// An infer plan of one bf16 weight [2^31, cols] (and a second one of the same shape when
/// `two`): 2^31 · cols · 2 bytes each.
std::string bf16Model(int64_t cols, bool two) {
  return "model M(a = 2147483648, b = " + std::to_string(cols) + ") {\n"
         "  param w: [a, b]\n" + (two ? "  param v: [a, b]\n" : "") +
         "  forward(x: bf16[batch, a]) { return " + (two ? "x @ w + x @ v" : "x @ w") + " }\n}\n"
         "infer i { model = M() batch = 1 prompt = 1 generate = 1 precision = bf16 target = H100_SXM }\n";
}
} // namespace

TEST_CASE("memory plan: check skips the placement only where it cannot overflow",
          "[memoryplan][reliability]") {
  // Two activations of 2^62 bytes live at once (x and gelu(x)): each fits, the arena does not.
  test::Compiled big("model M(d = 1073741824) {\n"
                     "  forward(x: bf16[batch, d, d]) { return mean(gelu(gelu(x))) }\n}\n"
                     "infer i { model = M() batch = 2 prompt = 1 generate = 1 precision = bf16 "
                     "target = H100_SXM }\n");
  REQUIRE(big.a->planOverflow == "the activation arena passes 2^63 - 1 bytes");
  llvm::SourceMgr sm;
  DiagnosticEngine quiet(sm);
  quiet.setOutput(nullptr);
  // As `tally check` analyses (Results::check): the sizes' sum overflows, so it places, and
  // finds the same overflow.
  Analysis checked = analyze(*big.a->graph, *big.a->plan, quiet, {}, test::checkOptions());
  CHECK(checked.planOverflow == big.a->planOverflow);
  CHECK(checked.planListed); // the sum did not prove it fits: listed, so placed
  // A plan that fits: no placement (no arena, no offsets), the same diagnostics and numbers.
  test::Compiled gpt(test::fromFile, test::example("gpt2.tally"));
  REQUIRE(gpt.a->arenaBytes > 0);
  DiagnosticEngine diags(sm);
  diags.setOutput(nullptr);
  Analysis c = analyze(*gpt.a->graph, *gpt.a->plan, diags, {}, test::checkOptions());
  CHECK(c.planOverflow.empty());
  CHECK(c.arenaBytes == 0);
  // Nor listed (Analysis::listsPlan): no buffers, schedule or region entries, the same sizes.
  CHECK(gpt.a->planListed);
  CHECK(!c.planListed);
  CHECK(c.buffers.empty());
  CHECK(c.stepSchedule.empty());
  CHECK(!gpt.a->buffers.empty());
  CHECK(c.regions.params.tensors.empty());
  CHECK(c.regions.optimizer.tensors.empty());
  CHECK(c.regions.params.bytes == gpt.a->regions.params.bytes);
  CHECK(c.regions.grads.bytes == gpt.a->regions.grads.bytes);
  CHECK(c.regions.master.bytes == gpt.a->regions.master.bytes);
  CHECK(c.regions.optimizer.bytes == gpt.a->regions.optimizer.bytes);
  CHECK(c.regions.params.bytes > 0);
  CHECK(c.memory.peak == gpt.a->memory.peak);
  CHECK(c.livePeakBytes == gpt.a->livePeakBytes);
  // Nor is the training step kept once verified and priced (Result::Step not asked for), unless
  // check prints it (--emit=ir); the backward's numbers are the same either way.
  CHECK(!c.step);
  CHECK(c.stepReleased);
  CHECK(gpt.a->step);
  CHECK(c.flops.backward == gpt.a->flops.backward);
  CHECK(c.localGradientBytes.has_value());
  Analysis ir = analyze(*gpt.a->graph, *gpt.a->plan, quiet, {}, Results::check(false, true));
  CHECK(ir.step);
  CHECK(!ir.stepReleased);
  CHECK(ir.step->ops.size() == gpt.a->step->ops.size());
  CHECK(c.time.step == gpt.a->time.step);
  CHECK(diags.diagnostics().size() == gpt.c.diags.diagnostics().size());
  // Kernel fusion reads the offsets (aliasing), so a fused plan is placed even for check.
  Plan fused = *gpt.a->plan;
  fused.fuseKernels = true;
  Analysis f = analyze(*gpt.a->graph, fused, quiet, {}, test::checkOptions());
  Analysis full = analyze(*gpt.a->graph, fused, quiet);
  CHECK(f.planListed);
  CHECK(f.arenaBytes == full.arenaBytes);
  CHECK(f.arenaBytes > 0);
  CHECK(f.time.step == full.time.step);
}

TEST_CASE("memory plan: a params region of 2^62 bytes fits, 2^63 does not",
          "[memoryplan][reliability]") {
  // [2^31, 2^30] bf16: 2^61 elements, 2^62 bytes (a multiple of 256): the region is exactly that.
  test::Compiled fits(bf16Model(int64_t(1) << 30, false));
  CHECK(fits.a->planOverflow.empty());
  CHECK(fits.a->regions.params.bytes == int64_t(1) << 62);
  CHECK(fits.count(DiagKind::Overflow) == 0);
  // [2^31, 2^31] bf16: 2^63 bytes, one past INT64_MAX.
  test::Compiled one(bf16Model(int64_t(1) << 31, false));
  CHECK(one.a->planOverflow == "the params region passes 2^63 - 1 bytes");
  CHECK(one.a->regions.params.bytes == 0);
  CHECK(one.a->regions.params.tensors.empty());
  CHECK(one.a->arenaBytes == 0);
  REQUIRE(one.count(DiagKind::Overflow) == 1);
  CHECK(one.of(DiagKind::Overflow)[0]->message ==
        "the memory plan does not fit in 64-bit byte offsets: the params region passes 2^63 - 1 bytes");
  // Unlisted, as `tally check` analyses, the region's size alone says the same.
  llvm::SourceMgr sm;
  DiagnosticEngine quiet(sm);
  quiet.setOutput(nullptr);
  Analysis checked = analyze(*one.a->graph, *one.a->plan, quiet, {}, test::checkOptions());
  CHECK(!checked.planListed);
  CHECK(checked.planOverflow == one.a->planOverflow);
  Analysis fitsChecked = analyze(*fits.a->graph, *fits.a->plan, quiet, {}, test::checkOptions());
  CHECK(fitsChecked.planOverflow.empty());
  CHECK(fitsChecked.regions.params.bytes == int64_t(1) << 62);
  // Two [2^31, 2^30] bf16 weights: each 2^62 bytes fits, their sum 2^63 does not.
  test::Compiled sum(bf16Model(int64_t(1) << 30, true));
  CHECK(sum.a->planOverflow == "the params region passes 2^63 - 1 bytes");
  // The analytic numbers are doubles and stay: 2^62 parameters.
  CHECK(sum.a->params.total == std::ldexp(1.0, 62));
}

TEST_CASE("memory plan: a step that does not fit int64 is not generated", "[memoryplan][reliability]") {
  // A [3e9, 3e9] f32 weight: 9e18 elements, 3.6e19 bytes.
  test::Compiled t("model M(d = 3000000000) { param w: [d, d] forward(x: f32[batch, d]) { return mean(x @ w) } }\n"
                   "train t { model = M() batch = 8 target = H100_SXM }\n");
  REQUIRE(!t.a->planOverflow.empty());
  REQUIRE(t.count(DiagKind::Overflow) == 1);
  CHECK(t.of(DiagKind::Overflow)[0]->line == 2); // at the plan's `model` setting
  // `tally check` lists no plan unless sums cannot prove it fits; here they cannot, and the
  // listed plan names the same buffer.
  llvm::SourceMgr sm;
  DiagnosticEngine quiet(sm);
  quiet.setOutput(nullptr);
  Analysis checked = analyze(*t.a->graph, *t.a->plan, quiet, {}, test::checkOptions());
  CHECK(checked.planListed);
  CHECK(checked.planOverflow == t.a->planOverflow);
  // The step went back once verified and was built again for the listed plan: the same one.
  REQUIRE(checked.step);
  CHECK(!checked.stepReleased);
  CHECK(checked.step->ops.size() == t.a->step->ops.size());
  CHECK(checked.step->tensors.size() == t.a->step->tensors.size());
  for (bool cuda : {false, true}) {
    codegen::EmitOptions o;
    std::vector<codegen::File> files;
    std::string err = cuda ? codegen::emitCudaStep(*t.a, o, files) : codegen::emitCpuStep(*t.a, o, files);
    CHECK(err == "the memory plan does not fit in 64-bit byte offsets: " + t.a->planOverflow);
    CHECK(files.empty());
  }
}

TEST_CASE("every JSON a renderer prints has finite numbers only", "[output][reliability]") {
  // llvm::json writes inf and nan as `inf` and `nan`, which no JSON reader accepts; printJson
  // (report/Report.h), the one printer of --emit=ir, --emit=memory-plan and explain's JSON,
  // writes them as null.
  llvm::json::Object o{{"flops", INFINITY},
                       {"ratio", NAN},
                       {"ok", 2.5},
                       {"rows", llvm::json::Array{1.0, -INFINITY, llvm::json::Object{{"x", NAN}}}}};
  std::string text;
  llvm::raw_string_ostream os(text);
  printJson(os, std::move(o));
  os.flush();
  CHECK(text.find("inf") == std::string::npos);
  CHECK(text.find("nan") == std::string::npos);
  llvm::Expected<llvm::json::Value> back = llvm::json::parse(text);
  REQUIRE(bool(back));
  const llvm::json::Object *r = back->getAsObject();
  REQUIRE(r);
  CHECK(r->getNumber("ok") == 2.5);
  CHECK(r->get("flops")->kind() == llvm::json::Value::Null);
  CHECK(r->get("ratio")->kind() == llvm::json::Value::Null);
  const llvm::json::Array *rows = r->getArray("rows");
  REQUIRE(rows);
  CHECK((*rows)[1].kind() == llvm::json::Value::Null);
  CHECK((*rows)[2].getAsObject()->get("x")->kind() == llvm::json::Value::Null);
  CHECK(text.back() == '\n');
}

namespace {
/// The VmFlags line of the mapping that holds `addr` in /proc/self/smaps ("" when none does).
std::string mappingFlagsAt(uintptr_t addr) {
  auto smaps = llvm::MemoryBuffer::getFileAsStream("/proc/self/smaps");
  REQUIRE(smaps);
  llvm::SmallVector<llvm::StringRef, 0> lines;
  (*smaps)->getBuffer().split(lines, '\n');
  bool inside = false;
  for (llvm::StringRef line : lines) {
    uint64_t lo = 0, hi = 0;
    llvm::StringRef range = line.split(' ').first;
    if (range.contains('-') && !range.split('-').first.getAsInteger(16, lo) &&
        !range.split('-').second.getAsInteger(16, hi)) {
      inside = lo <= addr && addr < hi;
      continue;
    }
    if (inside && line.startswith("VmFlags:"))
      return line.str();
  }
  return std::string();
}
} // namespace

TEST_CASE("huge pages are advised over a big block's whole 2 MiB extents", "[memory][reliability]") {
  // The kernel marks an advised range "hg" in the VmFlags of /proc/self/smaps. Where it has no
  // transparent huge pages (no sysfs switch) there is nothing to advise.
  if (!llvm::sys::fs::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    WARN("no transparent huge pages on this kernel: nothing to check");
    return;
  }
  const size_t bytes = kHugeBlockBytes + (size_t(3) << 20);
  void *block = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  REQUIRE(block != MAP_FAILED);
  // Start 16 bytes in, as malloc's own mapped blocks do: the advice covers whole extents only.
  char *p = static_cast<char *>(block) + 16;
  adviseHugePages(p, bytes - 16);
  const uintptr_t huge = uintptr_t(2) << 20;
  uintptr_t first = (reinterpret_cast<uintptr_t>(p) + huge - 1) / huge * huge;
  std::string advised = mappingFlagsAt(first);
  INFO(advised);
  CHECK(llvm::StringRef(advised).contains(" hg"));
  // The bytes before the first whole extent are not advised (another VMA, without hg).
  std::string before = mappingFlagsAt(reinterpret_cast<uintptr_t>(block));
  INFO(before);
  CHECK_FALSE(llvm::StringRef(before).contains(" hg"));
  munmap(block, bytes);
}

namespace {
/// Whether `p` lies in malloc's main heap (the "[heap]" mapping of /proc/self/maps).
bool inMainHeap(const void *p) {
  auto maps = llvm::MemoryBuffer::getFileAsStream("/proc/self/maps");
  REQUIRE(maps);
  llvm::SmallVector<llvm::StringRef, 0> lines;
  (*maps)->getBuffer().split(lines, '\n');
  uintptr_t addr = reinterpret_cast<uintptr_t>(p);
  for (llvm::StringRef line : lines) {
    uint64_t lo = 0, hi = 0;
    llvm::StringRef range = line.split(' ').first;
    if (line.endswith("[heap]") && !range.split('-').first.getAsInteger(16, lo) &&
        !range.split('-').second.getAsInteger(16, hi) && lo <= addr && addr < hi)
      return true;
  }
  return false;
}

#ifdef TALLY_UNDER_ASAN // tests/unit/Support.h
constexpr bool kSanitizerMalloc = true;
#else
constexpr bool kSanitizerMalloc = false;
#endif
} // namespace

// Run alone, in a process of its own (the next test starts it): malloc fixes how many arenas
// it may make when a thread first needs one, so tuneAllocator must come before any thread,
// as in tally's main().
TEST_CASE("one malloc heap child: a thread allocates from the main heap", "[.memory-child]") {
  tuneAllocator();
  void *fromThread = nullptr;
  std::thread worker([&] { fromThread = std::malloc(1000); });
  worker.join();
  CHECK(inMainHeap(fromThread));
  std::free(fromThread);
}

TEST_CASE("tally's malloc policy: one heap for every thread, advised huge pages as it grows", "[memory][reliability]") {
  if (kSanitizerMalloc) {
    WARN("the sanitizer's allocator replaces malloc's heaps: nothing to check");
    return;
  }
  // A thread's blocks come from the main heap (a process of its own: see the test above).
  std::string self = llvm::sys::fs::getMainExecutable(nullptr, reinterpret_cast<void *>(&inMainHeap));
  REQUIRE_FALSE(self.empty());
  std::string error;
  int rc = llvm::sys::ExecuteAndWait(self, {self, "one malloc heap child: a thread allocates from the main heap"},
                                     llvm::None, {}, 60, 0, &error);
  INFO(error);
  CHECK(rc == 0);

  // What the heap grows by is advised huge pages.
  if (!llvm::sys::fs::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    WARN("no transparent huge pages on this kernel: nothing more to check");
    return;
  }
  tuneAllocator(); // tally's growth steps (64 MiB) and mapping threshold, as in its main()
  adviseHeapGrowth(); // notes where the heap ends now
  const uintptr_t huge = uintptr_t(2) << 20;
  uintptr_t end = reinterpret_cast<uintptr_t>(sbrk(0));
  std::vector<void *> blocks;
  while (reinterpret_cast<uintptr_t>(sbrk(0)) < end + 4 * huge && blocks.size() < 1024) {
    blocks.push_back(std::malloc(huge)); // under the mapping threshold: from the heap
    adviseHeapGrowth();
  }
  REQUIRE(reinterpret_cast<uintptr_t>(sbrk(0)) >= end + 4 * huge);
  uintptr_t firstWhole = (end + huge - 1) / huge * huge;
  std::string flags = mappingFlagsAt(firstWhole);
  INFO(flags);
  CHECK(llvm::StringRef(flags).contains(" hg"));
  for (void *b : blocks)
    std::free(b);
}

namespace {

/// The step's parser over `words` (argv[0] added); "" and `out` set, or the ArgsError's reason.
std::string stepArgs(std::vector<std::string> words, tally_step::Args *out = nullptr) {
  words.insert(words.begin(), "tally_step");
  std::vector<const char *> argv;
  for (const std::string &w : words)
    argv.push_back(w.c_str());
  try {
    tally_step::Args a = tally_step::parseArgs(static_cast<int>(argv.size()), argv.data());
    if (out)
      *out = a;
    return "";
  } catch (const tally_step::ArgsError &e) {
    return e.what();
  }
}

} // namespace

TEST_CASE("the generated step's command line: accepted flags and their defaults", "[reliability][step-args]") {
  tally_step::Args a;
  REQUIRE(stepArgs({}, &a).empty());
  CHECK(a.steps == 10);
  CHECK(a.warmup == 2);
  CHECK(a.threads == 0);
  REQUIRE(stepArgs({"--steps", "1"}, &a).empty());
  CHECK(a.warmup == 0); // at least one timed step
  REQUIRE(stepArgs({"--steps", "5", "--warmup", "4", "--threads", "1024", "--seed", "9", "--init", "w", "--data",
                    "d", "--save", "s", "--dump-grads", "g", "--trace", "t", "--allow-nonfinite"},
                   &a)
              .empty());
  CHECK(a.steps == 5);
  CHECK(a.warmup == 4);
  CHECK(a.threads == 1024);
  CHECK(a.seed == 9);
  CHECK(a.init == "w");
  CHECK(a.dumpGrads == "g");
  CHECK(a.trace == "t");
  CHECK(a.allowNonfinite);
  CHECK(a.graph);
  REQUIRE(stepArgs({"--no-graph"}, &a).empty());
  CHECK(!a.graph);
}

TEST_CASE("the generated step's command line: every refusal says why", "[reliability][step-args]") {
  CHECK(stepArgs({"--steps"}) == "missing value after --steps");
  CHECK(stepArgs({"--bogus", "1"}) == "unknown flag --bogus");
  CHECK(stepArgs({"--steps", "0"}) == "--steps takes an integer >= 1, not '0'");
  CHECK(stepArgs({"--steps", "3x"}) == "--steps takes an integer >= 1, not '3x'");
  CHECK(stepArgs({"--warmup", ""}) == "--warmup takes an integer >= 0, not ''");
  CHECK(stepArgs({"--seed", "99999999999999999999"}) == "--seed takes an integer >= 0, not '99999999999999999999'");
  CHECK(stepArgs({"--threads", "100000"}) == "--threads takes at most 1024, not 100000");
  CHECK(stepArgs({"--steps", "2", "--warmup", "2"}).rfind("--warmup 2 must be less than --steps 2", 0) == 0);
  CHECK(stepArgs({"--data", "d", "--save", "d"}) == "refusing to write d: it is the --data file of this run");
  CHECK(stepArgs({"--init", "w", "--trace", "w"}) == "refusing to write w: it is the --init file of this run");
  CHECK(stepArgs({"--save", "o", "--dump-grads", "o"}) == "--save, --dump-grads and --trace name the same file o");
}
