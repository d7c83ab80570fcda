// test_diagnostics.cpp — unit tests for the diagnostic engine (support/Diagnostics.h):
// clang-format printing with carets, ranges, fix-its and notes; the " [code]" suffix; the -W
// options; counts; the error limit; and the kind table (codeOf/kindFromCode).
#include <catch.hpp>

#include <memory>
#include <set>
#include <string>

#include <llvm/Support/MemoryBuffer.h>

#include "support/Diagnostics.h"
#include "support/Suggest.h"

using namespace tally;
using tally::test::countOf;

namespace {

/// A SourceMgr holding one buffer, and an engine that prints into a string.
struct Fixture {
  llvm::SourceMgr sm;
  std::string out;
  llvm::raw_string_ostream os{out};
  DiagnosticEngine diags{sm};
  const char *start = nullptr;

  explicit Fixture(llvm::StringRef text, llvm::StringRef name = "gpt2.tally") {
    sm.AddNewSourceBuffer(llvm::MemoryBuffer::getMemBufferCopy(text, name), llvm::SMLoc());
    start = sm.getMemoryBuffer(sm.getMainFileID())->getBufferStart();
    diags.setOutput(&os);
    diags.setShowColors(false);
  }

  /// The location `offset` bytes into the buffer.
  llvm::SMLoc at(size_t offset) const { return llvm::SMLoc::getFromPointer(start + offset); }

  /// The half-open range [from, to) in byte offsets.
  llvm::SMRange span(size_t from, size_t to) const { return llvm::SMRange(at(from), at(to)); }

  /// Everything printed so far.
  std::string printed() {
    os.flush();
    return out;
  }
};

const char *kSource = "w = param [512, 2304]\n"
                      "y = x @ w\n";
// Offsets into kSource: line 2 starts at 22; 'x' is 26, '@' is 28, 'w' is 30.

} // namespace

TEST_CASE("error prints file:line:col, the source line, caret and range, and [code]",
          "[diagnostics]") {
  Fixture f(kSource);
  f.diags.report(DiagKind::MatmulShape, f.at(28),
                 "matmul inner dimensions differ: [batch, seq, 768] @ [512, 2304]")
      .range(f.span(26, 31));
  CHECK(f.printed() ==
        "gpt2.tally:2:7: error: matmul inner dimensions differ: [batch, seq, 768] @ "
        "[512, 2304] [matmul-shape]\n"
        "y = x @ w\n"
        "    ~~^~~\n");
}

TEST_CASE("notes follow the diagnostic, with their own location and no code", "[diagnostics]") {
  Fixture f(kSource);
  f.diags.report(DiagKind::MatmulShape, f.at(28), "matmul inner dimensions differ")
      .range(f.span(26, 31))
      .note(f.at(0), "w declared here", f.span(0, 1))
      .note(llvm::SMLoc(), "shapes are [batch, seq, 768] and [512, 2304]");
  CHECK(f.printed() == "gpt2.tally:2:7: error: matmul inner dimensions differ [matmul-shape]\n"
                       "y = x @ w\n"
                       "    ~~^~~\n"
                       "gpt2.tally:1:1: note: w declared here\n"
                       "w = param [512, 2304]\n"
                       "^\n"
                       "tally: note: shapes are [batch, seq, 768] and [512, 2304]\n");
  REQUIRE(f.diags.diagnostics().size() == 1);
  const Diagnostic &d = f.diags.diagnostics()[0];
  REQUIRE(d.notes.size() == 2);
  CHECK(d.notes[0].message == "w declared here");
  CHECK(d.notes[0].ranges.size() == 1);
  CHECK(d.notes[1].ranges.empty());
}

TEST_CASE("fix-its print a replacement line under the caret", "[diagnostics]") {
  Fixture f(kSource);
  f.diags.report(DiagKind::MatmulShape, f.at(30), "did you mean to transpose w?")
      .fixit(f.span(30, 31), "w.T");
  CHECK(f.printed() == "gpt2.tally:2:9: error: did you mean to transpose w? [matmul-shape]\n"
                       "y = x @ w\n"
                       "        ^\n"
                       "        w.T\n");
  REQUIRE(f.diags.diagnostics().size() == 1);
  REQUIRE(f.diags.diagnostics()[0].fixits.size() == 1);
  CHECK(f.diags.diagnostics()[0].fixits[0].getText() == "w.T");
}

TEST_CASE("a diagnostic without a location prints as tally: error", "[diagnostics]") {
  Fixture f(kSource);
  f.diags.report(DiagKind::IoError, llvm::SMLoc(), "cannot open 'missing.tally'");
  CHECK(f.printed() == "tally: error: cannot open 'missing.tally' [io-error]\n");
  REQUIRE(f.diags.diagnostics().size() == 1);
  const Diagnostic &d = f.diags.diagnostics()[0];
  CHECK(d.file.empty());
  CHECK(d.line == 0);
  CHECK(d.column == 0);
}

TEST_CASE("invalid and reversed ranges and fix-its are ignored", "[diagnostics]") {
  Fixture f(kSource);
  f.diags.report(DiagKind::TypeMismatch, f.at(22), "bad")
      .range(llvm::SMRange())
      .range(f.span(26, 22))
      .fixit(llvm::SMRange(), "x")
      .note(f.at(22), "here", f.span(30, 26));
  REQUIRE(f.diags.diagnostics().size() == 1);
  const Diagnostic &d = f.diags.diagnostics()[0];
  CHECK(d.ranges.empty());
  CHECK(d.fixits.empty());
  CHECK(d.notes.at(0).ranges.empty());
}

TEST_CASE("emitted diagnostics record kind, severity, message and position", "[diagnostics]") {
  Fixture f(kSource);
  f.diags.report(DiagKind::UnknownName, f.at(26), "unknown name 'x'");
  REQUIRE(f.diags.diagnostics().size() == 1);
  const Diagnostic &d = f.diags.diagnostics()[0];
  CHECK(d.kind == DiagKind::UnknownName);
  CHECK(d.severity == Severity::Error);
  CHECK(d.message == "unknown name 'x'");
  CHECK(d.file == "gpt2.tally");
  CHECK(d.line == 2);
  CHECK(d.column == 5);
}

TEST_CASE("position resolves locations, including end of buffer and stdin", "[diagnostics]") {
  Fixture f(kSource);
  std::string file;
  unsigned line = 99, column = 99;
  f.diags.position(f.at(0), file, line, column);
  CHECK(file == "gpt2.tally");
  CHECK(line == 1);
  CHECK(column == 1);
  f.diags.position(f.at(32), file, line, column); // one past the last newline
  CHECK(line == 3);
  CHECK(column == 1);
  f.diags.position(llvm::SMLoc(), file, line, column);
  CHECK(file.empty());
  CHECK(line == 0);
  CHECK(column == 0);

  Fixture in("a = 1\n", "-");
  in.diags.position(in.at(4), file, line, column);
  CHECK(file == "<stdin>");
  CHECK(line == 1);
  CHECK(column == 5);
  in.diags.report(DiagKind::UnusedValue, in.at(0), "'a' is never used");
  CHECK(in.printed() == "<stdin>:1:1: warning: 'a' is never used [unused-value]\n"
                        "a = 1\n"
                        "^\n");
}

TEST_CASE("warnings print with [code] and are counted apart from errors", "[diagnostics]") {
  Fixture f(kSource);
  f.diags.report(DiagKind::UnusedValue, f.at(0), "'w' is never used");
  CHECK(f.printed() == "gpt2.tally:1:1: warning: 'w' is never used [unused-value]\n"
                       "w = param [512, 2304]\n"
                       "^\n");
  CHECK(f.diags.warningCount() == 1);
  CHECK(f.diags.errorCount() == 0);
  CHECK_FALSE(f.diags.hasErrors());
  f.diags.report(DiagKind::TypeMismatch, f.at(22), "bad");
  f.diags.report(DiagKind::TypeMismatch, f.at(22), "bad again");
  CHECK(f.diags.warningCount() == 1);
  CHECK(f.diags.errorCount() == 2);
  CHECK(f.diags.hasErrors());
  CHECK(f.diags.diagnostics().size() == 3);
}

TEST_CASE("-Werror promotes every warning, still printing its code", "[diagnostics]") {
  Fixture f(kSource);
  REQUIRE(f.diags.applyWarningOption("-Werror"));
  f.diags.report(DiagKind::UnusedValue, f.at(0), "'w' is never used");
  CHECK(f.printed() == "gpt2.tally:1:1: error: 'w' is never used [unused-value]\n"
                       "w = param [512, 2304]\n"
                       "^\n");
  CHECK(f.diags.errorCount() == 1);
  CHECK(f.diags.warningCount() == 0);
  CHECK(f.diags.diagnostics().at(0).severity == Severity::Error);

  REQUIRE(f.diags.applyWarningOption("-Wno-error"));
  f.diags.report(DiagKind::UnusedValue, f.at(0), "again");
  CHECK(f.diags.diagnostics().at(1).severity == Severity::Warning);
}

TEST_CASE("-Wno-NAME silences one warning; -WNAME turns it back on", "[diagnostics]") {
  Fixture f(kSource);
  REQUIRE(f.diags.applyWarningOption("-Wno-unused-value"));
  f.diags.report(DiagKind::UnusedValue, f.at(0), "'w' is never used");
  f.diags.report(DiagKind::PrecisionUnderflow, f.at(0), "underflows in fp16");
  CHECK(f.diags.warningCount() == 1);
  REQUIRE(f.diags.diagnostics().size() == 1);
  CHECK(f.diags.diagnostics()[0].kind == DiagKind::PrecisionUnderflow);
  CHECK(f.printed().find("[unused-value]") == std::string::npos);
  CHECK(f.printed().find("[precision-underflow]") != std::string::npos);

  REQUIRE(f.diags.applyWarningOption("-Wunused-value"));
  f.diags.report(DiagKind::UnusedValue, f.at(0), "'w' is never used");
  CHECK(f.diags.warningCount() == 2);
}

TEST_CASE("-Werror=NAME and -Wno-error=NAME map one warning", "[diagnostics]") {
  Fixture f(kSource);
  REQUIRE(f.diags.applyWarningOption("-Werror=precision-underflow"));
  f.diags.report(DiagKind::PrecisionUnderflow, f.at(0), "underflows");
  f.diags.report(DiagKind::UnusedValue, f.at(0), "unused");
  CHECK(f.diags.errorCount() == 1);
  CHECK(f.diags.warningCount() == 1);
  CHECK(f.printed().find("error: underflows [precision-underflow]") != std::string::npos);
  CHECK(f.printed().find("warning: unused [unused-value]") != std::string::npos);

  Fixture g(kSource);
  REQUIRE(g.diags.applyWarningOption("-Werror"));
  REQUIRE(g.diags.applyWarningOption("-Wno-error=unused-value"));
  g.diags.report(DiagKind::UnusedValue, g.at(0), "unused");
  g.diags.report(DiagKind::PrecisionOverflow, g.at(0), "overflows");
  CHECK(g.diags.diagnostics().at(0).severity == Severity::Warning);
  CHECK(g.diags.diagnostics().at(1).severity == Severity::Error);

  // -Werror=NAME re-enables a silenced warning, as in clang.
  Fixture h(kSource);
  REQUIRE(h.diags.applyWarningOption("-Wno-unused-value"));
  REQUIRE(h.diags.applyWarningOption("-Werror=unused-value"));
  h.diags.report(DiagKind::UnusedValue, h.at(0), "unused");
  CHECK(h.diags.errorCount() == 1);
}

TEST_CASE("-w silences all warnings but never errors", "[diagnostics]") {
  Fixture f(kSource);
  REQUIRE(f.diags.applyWarningOption("-Werror"));
  REQUIRE(f.diags.applyWarningOption("-w"));
  f.diags.report(DiagKind::UnusedValue, f.at(0), "unused");
  f.diags.report(DiagKind::Fp16NoLossScaling, f.at(0), "no loss scaling");
  CHECK(f.diags.warningCount() == 0);
  CHECK(f.diags.errorCount() == 0);
  CHECK(f.printed().empty());
  f.diags.report(DiagKind::SyntaxError, f.at(0), "expected '='");
  CHECK(f.diags.errorCount() == 1);
  CHECK(f.diags.diagnostics().size() == 1);
}

TEST_CASE("unknown warning options are rejected and change nothing", "[diagnostics]") {
  Fixture f(kSource);
  CHECK_FALSE(f.diags.applyWarningOption("-Wno-such-warning"));
  CHECK_FALSE(f.diags.applyWarningOption("-Wsuch-warning"));
  CHECK_FALSE(f.diags.applyWarningOption("-Werror=no-such"));
  CHECK_FALSE(f.diags.applyWarningOption("-Wno-error=no-such"));
  CHECK_FALSE(f.diags.applyWarningOption("-W"));
  CHECK_FALSE(f.diags.applyWarningOption("-Werror="));
  CHECK_FALSE(f.diags.applyWarningOption("-Werrors"));
  CHECK_FALSE(f.diags.applyWarningOption("-x"));
  CHECK_FALSE(f.diags.applyWarningOption(""));
  // Error kinds are known names but cannot be silenced or remapped.
  CHECK_FALSE(f.diags.applyWarningOption("-Wno-type-mismatch"));
  CHECK_FALSE(f.diags.applyWarningOption("-Wno-error=budget-memory"));

  f.diags.report(DiagKind::UnusedValue, f.at(0), "unused");
  f.diags.report(DiagKind::TypeMismatch, f.at(0), "mismatch");
  CHECK(f.diags.warningCount() == 1);
  CHECK(f.diags.errorCount() == 1);
}

TEST_CASE("the error limit prints one note, then counts without printing", "[diagnostics]") {
  Fixture f(kSource);
  f.diags.setErrorLimit(3);
  // Distinct messages: the same diagnostic at the same place is emitted once.
  for (int i = 0; i < 6; ++i)
    f.diags.report(DiagKind::SyntaxError, f.at(0), "garbage " + std::to_string(i));
  f.diags.report(DiagKind::UnusedValue, f.at(0), "unused");
  std::string out = f.printed();
  CHECK(countOf(out, "[syntax-error]") == 3);
  CHECK(countOf(out, "too many errors") == 1);
  CHECK(countOf(out, "[unused-value]") == 0);
  CHECK(out.find("tally: note: too many errors emitted (limit 3)") != std::string::npos);
  CHECK(f.diags.errorCount() == 6);
  CHECK(f.diags.warningCount() == 1);
  CHECK(f.diags.diagnostics().size() == 7);
}

TEST_CASE("the default error limit is 50; 0 removes it", "[diagnostics]") {
  Fixture f(kSource);
  for (int i = 0; i < 60; ++i)
    f.diags.report(DiagKind::SyntaxError, f.at(0), "garbage " + std::to_string(i));
  CHECK(countOf(f.printed(), "[syntax-error]") == 50);
  CHECK(f.diags.errorCount() == 60);

  Fixture g(kSource);
  g.diags.setErrorLimit(0);
  for (int i = 0; i < 60; ++i)
    g.diags.report(DiagKind::SyntaxError, g.at(0), "garbage " + std::to_string(i));
  CHECK(countOf(g.printed(), "[syntax-error]") == 60);
  CHECK(countOf(g.printed(), "too many errors") == 0);
}

TEST_CASE("setOutput(nullptr) collects without printing", "[diagnostics]") {
  Fixture f(kSource);
  f.diags.setOutput(nullptr);
  f.diags.report(DiagKind::TypeMismatch, f.at(0), "mismatch").note(f.at(0), "here");
  CHECK(f.printed().empty());
  CHECK(f.diags.errorCount() == 1);
  CHECK(f.diags.diagnostics().size() == 1);
}

TEST_CASE("a moved builder emits exactly once, when the last owner dies", "[diagnostics]") {
  Fixture f(kSource);
  {
    DiagBuilder a = f.diags.report(DiagKind::TypeMismatch, f.at(0), "mismatch");
    a.range(f.span(0, 1));
    DiagBuilder b(std::move(a));
    b.note(f.at(4), "here");
    CHECK(f.diags.diagnostics().empty());
  }
  REQUIRE(f.diags.diagnostics().size() == 1);
  CHECK(f.diags.diagnostics()[0].ranges.size() == 1);
  CHECK(f.diags.diagnostics()[0].notes.size() == 1);
  CHECK(f.diags.errorCount() == 1);
}

TEST_CASE("no color codes reach a stream that is not a terminal", "[diagnostics]") {
  // Colors are used only when showColors is on and the stream is a terminal (LLVM's
  // ColorMode::Auto); a string stream never gets escape codes, even with colors enabled on it.
  Fixture f(kSource);
  f.os.enable_colors(true);
  f.diags.setShowColors(true);
  f.diags.report(DiagKind::TypeMismatch, f.at(0), "mismatch");
  CHECK(f.printed().find('\033') == std::string::npos);
  CHECK(f.printed().find("[type-mismatch]") != std::string::npos);
}

TEST_CASE("codeOf and kindFromCode round-trip every kind; codes are unique", "[diagnostics]") {
  std::set<std::string> codes;
  for (unsigned i = 0; i < NumDiagKinds; ++i) {
    DiagKind kind = static_cast<DiagKind>(i);
    llvm::StringRef code = codeOf(kind);
    INFO("kind " << i << " code " << code.str());
    CHECK_FALSE(code.empty());
    CHECK(codes.insert(code.str()).second);
    std::optional<DiagKind> back = kindFromCode(code);
    REQUIRE(back.has_value());
    CHECK(*back == kind);
    Severity s = defaultSeverity(kind);
    CHECK((s == Severity::Error || s == Severity::Warning));
  }
  CHECK(codes.size() == NumDiagKinds);
  CHECK_FALSE(kindFromCode("no-such-code").has_value());
  CHECK_FALSE(kindFromCode("").has_value());
  CHECK(codeOf(DiagKind::MatmulShape) == "matmul-shape");
  CHECK(codeOf(DiagKind::BudgetMemory) == "budget-memory");
  CHECK(defaultSeverity(DiagKind::SyntaxError) == Severity::Error);
  CHECK(defaultSeverity(DiagKind::PrecisionUnderflow) == Severity::Warning);
  CHECK(defaultSeverity(DiagKind::UnusedValue) == Severity::Warning);
  CHECK(severityName(Severity::Error) == "error");
  CHECK(severityName(Severity::Warning) == "warning");
  CHECK(severityName(Severity::Note) == "note");
}

TEST_CASE("closestName: swaps, reordered words, separators and far typos among few", "[diagnostics]") {
  CHECK(closestName("bf16_mixed", {"fp32", "bf16", "mixed_bf16", "mixed_fp16"}) == "mixed_bf16");
  CHECK(closestName("adam_w", {"SGD", "Adam", "AdamW", "Lion"}) == "AdamW");
  CHECK(closestName("sqtr", {"none", "full", "sqrt"}) == "sqrt");
  CHECK(closestName("baises", {"in", "out", "bias"}) == "bias");
  CHECK(closestName("H100_SMX", {"H100_SXM", "A100_SXM", "H200_SXM"}) == "H100_SXM");
  // Reordered words with a typo in one; a swap preferred to a dropped letter at equal distance.
  CHECK(closestName("bf16_mixde", {"fp32", "bf16", "mixed_bf16", "mixed_fp16"}) == "mixed_bf16");
  CHECK(closestName("fb16", {"f32", "f16", "bf16"}) == "bf16");
  // Nothing close: no suggestion.
  CHECK(closestName("zzzzzz", {"in", "out", "bias"}).empty());
}
