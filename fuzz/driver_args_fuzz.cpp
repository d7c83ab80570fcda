// libFuzzer target: the generated step's command line (codegen/program/driver_args.h), which
// driver_cpu.cpp and driver_cuda.cu parse before anything else. Each input is an argument
// vector: its bytes split at NUL into argv[1..] (argv[0] is "tally_step"). parseArgs must either
// refuse it with an ArgsError or accept it with every promise its comment makes — --steps at
// least 1, 0 <= --warmup < --steps, 0 <= --threads <= kMaxThreads, no output naming an input or
// another output. A crash, a sanitizer report, another exception or a broken promise (abort)
// is a finding. Paths are only stat(2)ed. scripts/fuzz.sh builds and runs it (issue 43, item 6).
#include "driver_args.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace {

/// Aborts with `what` when `ok` is false: a promise of the parser broken by an accepted line.
void promise(bool ok, const char *what) {
  if (ok)
    return;
  std::fprintf(stderr, "driver_args_fuzz: the parser accepted a command line that breaks: %s\n", what);
  std::abort();
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  std::vector<std::string> words{"tally_step"};
  std::string word;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      words.push_back(word);
      word.clear();
    } else {
      word += static_cast<char>(data[i]);
    }
  }
  if (!word.empty())
    words.push_back(word);
  std::vector<const char *> argv;
  for (const std::string &w : words)
    argv.push_back(w.c_str());
  argv.push_back(nullptr);
  try {
    using namespace tally_step;
    Args a = parseArgs(static_cast<int>(words.size()), argv.data());
    promise(a.steps >= 1, "--steps below 1");
    promise(a.warmup >= 0 && a.warmup < a.steps, "--warmup outside [0, --steps)");
    promise(a.threads >= 0 && a.threads <= kMaxThreads, "--threads outside [0, kMaxThreads]");
    for (const std::string *out : {&a.save, &a.dumpGrads, &a.trace}) {
      promise(!sameFile(*out, a.init) && !sameFile(*out, a.data), "an output naming an input");
      for (const std::string *other : {&a.save, &a.dumpGrads, &a.trace})
        promise(out == other || !sameFile(*out, *other), "two outputs naming one file");
    }
  } catch (const tally_step::ArgsError &) {
    // refused with a message: what the parser is for
  }
  return 0;
}
