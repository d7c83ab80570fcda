// Support.h — what the unit tests share: compiling a tally source text or file through
// tally::Compilation exactly as the CLI does and analyzing one plan (Compiled), finding an op's
// analysis by its path, picking diagnostics of one kind, locating the repository's examples
// through $TALLY_SOURCE_DIR (ctest sets it), the lecture's DeepLinear model that several
// tests compile, and the generated step's files by path (emitStep). Header-only; every failure
// is a Catch2 REQUIRE or FAIL in the calling test.
#pragma once

#include <catch.hpp>

#include "codegen/Emit.h"
#include "driver/Compiler.h"

#include <cstdlib>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

// The sanitizer build (docs/reliability.md) runs everything 10-30x slower: tests that walk
// many compiles walk fewer there, and timings are not checked there. The tests' own code is
// compiled without the sanitizers there (CMakeLists.txt), which says so by
// TALLY_TESTS_UNDER_SANITIZERS; a test program built with them says it by GCC's
// __SANITIZE_ADDRESS__ or clang's __has_feature(address_sanitizer).
#if defined(TALLY_TESTS_UNDER_SANITIZERS) || defined(__SANITIZE_ADDRESS__)
#define TALLY_UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TALLY_UNDER_ASAN 1
#endif
#endif

namespace tally::test {

/// The options `tally check` analyses with (tools/tally/main.cpp): diagnostics only, no
/// arena offsets.
inline Results checkOptions() { return Results::check(/*memoryPlan=*/false, /*ir=*/false); }

/// How many times `needle` occurs in `hay` (not overlapping).
inline size_t countOf(const std::string &hay, const std::string &needle) {
  size_t n = 0;
  for (size_t pos = hay.find(needle); pos != std::string::npos && !needle.empty();
       pos = hay.find(needle, pos + needle.size()))
    ++n;
  return n;
}

/// The training step tally build writes for an analysed plan (codegen/Emit.h): the emitter's
/// error ("" when none) and every file's text by its path in the folder ("step.cpp" or
/// "step.cu", "CMakeLists.txt", "runtime/...").
struct StepFiles {
  std::string error;
  std::map<std::string, std::string> byPath;
};
inline StepFiles emitStep(const Analysis &a, bool cuda, const codegen::EmitOptions &o = {}) {
  std::vector<codegen::File> files;
  StepFiles out;
  out.error = cuda ? codegen::emitCudaStep(a, o, files) : codegen::emitCpuStep(a, o, files);
  for (codegen::File &f : files)
    out.byPath[f.path] = std::move(f.text);
  return out;
}

/// The repository root, from $TALLY_SOURCE_DIR; fails the test when it is not set, so a test
/// that reads examples never passes by reading nothing.
inline std::string sourceDir() {
  const char *dir = std::getenv("TALLY_SOURCE_DIR");
  INFO("TALLY_SOURCE_DIR must name the repository (ctest sets it)");
  REQUIRE(dir);
  return dir;
}

/// The path of `name` in the repository's examples/ folder.
inline std::string example(const std::string &name) { return sourceDir() + "/examples/" + name; }

/// The whole text of the file at `path` ("" when it cannot be read).
inline std::string readText(const std::string &path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

/// Tag for the Compiled constructor that reads a file instead of source text.
struct FromFile {};
/// The FromFile tag value: `Compiled t(fromFile, example("gpt2.tally"), "gpt2_124M")`.
inline constexpr FromFile fromFile{};

/// A small GPT (GPT-2's blocks, tied head, no position embedding) without a plan:
/// `TinyGPT(vocab = 1024, d = 256, heads = 4, layers = 4)`.
inline constexpr const char *kTinyGPTModel = R"(
block MLP(d, hidden) {
  fc   = Linear(d, hidden)
  proj = Linear(hidden, d)
  forward(x) { return proj(gelu(fc(x))) }
}
block Attn(d, heads) {
  qkv  = Linear(d, 3 * d)
  proj = Linear(d, d)
  forward(x) {
    q, k, v = split(qkv(x), 3, dim = -1)
    return proj(attention(q, k, v, heads = heads, causal = true))
  }
}
block Block(d, heads) {
  ln1 = LayerNorm(d)
  attn = Attn(d, heads)
  ln2 = LayerNorm(d)
  mlp = MLP(d, 4 * d)
  forward(x) {
    x = x + attn(ln1(x))
    return x + mlp(ln2(x))
  }
}
model TinyGPT(vocab = 1024, d = 256, heads = 4, layers = 4) {
  wte = Embedding(vocab, d)
  h   = repeat(layers) Block(d, heads)
  lnf = LayerNorm(d)
  forward(tokens: i32[batch, seq]) {
    logits = lnf(h(wte(tokens))) @ transpose(wte.weight)
    return cross_entropy(logits, next_tokens(tokens))
  }
}
)";

/// The lecture's DeepLinear model (as in examples/lecture.tally) without a plan: two matmuls,
/// x @ w1 of [batch, 1024] × [1024, 1024] and h1 @ w2 of [batch, 1024] × [1024, 64]. The text
/// starts with a newline, so `h1 = x @ w1` is line 6 of a source that begins with it.
inline constexpr const char *kDeepLinear = R"(
model DeepLinear(D = 1024, K = 64) {
  param w1: [D, D]
  param w2: [D, K]
  forward(x: f32[batch, D]) {
    h1 = x @ w1
    h2 = h1 @ w2
    return mean(h2 * h2)
  }
}
)";

/// One compilation with one plan lowered and analyzed by every pass. Diagnostics are collected,
/// not printed (read them with of() or count()); a step that fails fails the test, showing the
/// diagnostics collected so far.
struct Compiled {
  Compilation c;
  std::optional<Analysis> a;
  const PlanDecl *decl = nullptr; ///< the plan analyzed

  /// Compiles `text` as the buffer "t.tally" and analyzes `plan` ("": the first plan).
  explicit Compiled(const std::string &text, const std::string &plan = "",
                    const PlanOverrides &overrides = {}) {
    c.diags.setOutput(nullptr);
    require(c.addSource("t.tally", text), "parsing t.tally");
    analyze(plan, overrides);
  }
  /// Compiles the file at `path` and analyzes `plan` ("": the first plan).
  Compiled(FromFile, const std::string &path, const std::string &plan = "",
           const PlanOverrides &overrides = {}) {
    c.diags.setOutput(nullptr);
    require(c.addFile(path), "reading and parsing " + path);
    analyze(plan, overrides);
  }
  Compiled(const Compiled &) = delete;
  Compiled &operator=(const Compiled &) = delete;

  /// The lowered graph the analysis ran on.
  const Graph &g() const { return *a->graph; }

  /// The op whose path is `path`; fails the test when there is none.
  OpId op(const std::string &path) const {
    for (OpId i = 0; i < g().ops.size(); ++i)
      if (g().opPath(i) == path)
        return i;
    FAIL("no op " << path);
    return kNone;
  }
  /// The analysis of the op whose path is `path`; fails the test when there is none.
  const OpAnalysis &at(const std::string &path) const { return a->ops[op(path)]; }
  /// The totals (params.byBlock) of the block instance whose path is `path` ("h", "h[1]");
  /// fails the test when there is none.
  const Analysis::BlockCount &block(const std::string &path) const {
    for (const Analysis::BlockCount &b : a->params.byBlock)
      if (g().instancePath(b.instance) == path)
        return b;
    FAIL("no block " << path);
    return a->params.byBlock.front();
  }

  /// The diagnostics of `kind`, in emission order.
  std::vector<const Diagnostic *> of(DiagKind kind) const {
    std::vector<const Diagnostic *> out;
    for (const Diagnostic &d : c.diags.diagnostics())
      if (d.kind == kind)
        out.push_back(&d);
    return out;
  }
  /// How many diagnostics of `kind` were emitted.
  size_t count(DiagKind kind) const { return of(kind).size(); }

  /// Re-lowers the analyzed plan's model for another plan, as the budgets and solvers do.
  Relower relower() { return c.relowerer(*decl); }

  /// Every diagnostic so far, one a line: "file:line:column: severity: message [code]", or
  /// "tally: severity: ..." for one without a location, as the engine prints them.
  std::string diagnosticsText() const {
    std::string text;
    for (const Diagnostic &d : c.diags.diagnostics()) {
      text += d.file.empty() ? std::string("tally")
                             : d.file + ":" + std::to_string(d.line) + ":" +
                                   std::to_string(d.column);
      text += ": " + severityName(d.severity).str() + ": " + d.message + " [" +
              codeOf(d.kind).str() + "]\n";
    }
    return text;
  }

private:
  /// Picks, lowers and analyzes the plan.
  void analyze(const std::string &plan, const PlanOverrides &overrides) {
    decl = c.pickPlan(plan);
    require(decl != nullptr, "picking the plan");
    a = c.analyzePlan(*decl, overrides);
    require(a.has_value(), "lowering the plan");
  }
  /// One REQUIRE; on failure it shows `step` and the diagnostics collected.
  void require(bool ok, const std::string &step) const {
    INFO(step << (ok ? std::string() : " failed:\n" + diagnosticsText()));
    REQUIRE(ok);
  }
};

} // namespace tally::test
