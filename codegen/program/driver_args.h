// The generated step's command line (driver_host.h's parse, for driver_cpu.cpp and
// driver_cuda.cu): the flags into Args, every refusal an ArgsError with the reason. It needs
// nothing but the C++ library and stat(2), so the libFuzzer target fuzz/driver_args_fuzz.cpp
// and the unit tests (tests/unit/test_reliability.cpp) link it without a step; the driver turns
// an ArgsError into its usage message and exit 2 (issue 43, item 6).
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>

#include <sys/stat.h>

namespace tally_step {
namespace {

/// --steps N trains N steps in all; the first --warmup of them are untimed (default: 2, or
/// N - 1 when N is smaller), so at least one step is timed and --save holds the weights after
/// exactly N updates.
struct Args {
  int64_t steps = 10, warmup = -1, threads = 0;
  uint64_t seed = 1;
  std::string init, data, save, dumpGrads;
  std::string trace; ///< --trace: the last step's kernel calls as a Chrome trace (traceFile)
  bool allowNonfinite = false;
  /// --no-graph (CUDA step): launch every kernel of every step instead of replaying the step's
  /// CUDA graph after the warm-up (driver_cuda.cu); the CPU step has no graph and ignores it.
  bool graph = true;
};

/// A command line the step refuses; what() says why (the driver prints it above the usage).
struct ArgsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The most OpenMP threads --threads may ask for (libgomp crashes creating 100,000).
constexpr int64_t kMaxThreads = 1024;

/// `v` as a decimal integer of at least `lo` (the whole string, in range), else an ArgsError.
int64_t integer(const char *flag, const char *v, int64_t lo) {
  char *end = nullptr;
  errno = 0;
  long long x = std::strtoll(v, &end, 10);
  if (errno || !end || end == v || *end || x < lo)
    throw ArgsError(std::string(flag) + " takes an integer >= " + std::to_string(lo) + ", not '" + v + "'");
  return x;
}

/// True when a and b name the same file: the same path, or the same device and inode.
bool sameFile(const std::string &a, const std::string &b) {
  if (a.empty() || b.empty())
    return false;
  if (a == b)
    return true;
  struct stat x {}, y {};
  return ::stat(a.c_str(), &x) == 0 && ::stat(b.c_str(), &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

/// argv[1 .. argc) into Args, checked: each flag once known, each value present and in range,
/// --warmup below --steps, --threads at most kMaxThreads, no output naming an input of the run
/// or another output. Throws ArgsError.
Args parseArgs(int argc, const char *const *argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string f = argv[i];
    if (f == "--allow-nonfinite") {
      a.allowNonfinite = true;
      continue;
    }
    if (f == "--no-graph") {
      a.graph = false;
      continue;
    }
    if (i + 1 >= argc)
      throw ArgsError("missing value after " + f);
    const char *v = argv[++i];
    if (f == "--steps")
      a.steps = integer("--steps", v, 1);
    else if (f == "--warmup")
      a.warmup = integer("--warmup", v, 0);
    else if (f == "--threads")
      a.threads = integer("--threads", v, 0);
    else if (f == "--seed")
      a.seed = static_cast<uint64_t>(integer("--seed", v, 0));
    else if (f == "--init")
      a.init = v;
    else if (f == "--data")
      a.data = v;
    else if (f == "--save")
      a.save = v;
    else if (f == "--dump-grads")
      a.dumpGrads = v;
    else if (f == "--trace")
      a.trace = v;
    else
      throw ArgsError("unknown flag " + f);
  }
  if (a.warmup < 0)
    a.warmup = std::min<int64_t>(2, a.steps - 1);
  else if (a.warmup >= a.steps)
    throw ArgsError("--warmup " + std::to_string(a.warmup) + " must be less than --steps " + std::to_string(a.steps) +
                    ": the steps train in all, the first --warmup of them untimed, and at least one is timed");
  if (a.threads > kMaxThreads)
    throw ArgsError("--threads takes at most " + std::to_string(kMaxThreads) + ", not " + std::to_string(a.threads));
  // An output never replaces an input of the same run (nor the other output).
  const std::pair<const char *, const std::string *> ins[] = {{"--init", &a.init}, {"--data", &a.data}};
  for (const std::string *out : {&a.save, &a.dumpGrads, &a.trace})
    for (const auto &in : ins)
      if (sameFile(*out, *in.second))
        throw ArgsError("refusing to write " + *out + ": it is the " + in.first + " file of this run");
  if (sameFile(a.save, a.dumpGrads) || sameFile(a.save, a.trace) || sameFile(a.dumpGrads, a.trace))
    throw ArgsError("--save, --dump-grads and --trace name the same file " +
                    (sameFile(a.save, a.dumpGrads) ? a.save : a.trace));
  return a;
}

} // namespace
} // namespace tally_step
