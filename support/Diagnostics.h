// Diagnostics.h — tally's one diagnostic engine.
//
// Every error, warning and note the compiler produces goes through a DiagnosticEngine, which
// sits on the llvm::SourceMgr that owns the input buffers. A diagnostic has a kind (listed once
// in DiagnosticKinds.def with its code name and default severity), a location, a message written
// where it is emitted, source ranges, fix-its and notes. The engine applies the -W options,
// records each emitted diagnostic with its resolved file/line/column (for the JSON and SARIF
// reports), counts errors and warnings, and prints in clang's format:
//
//   gpt2.tally:14:9: error: matmul inner dimensions differ [matmul-shape]
//       y = x @ w
//           ~~^~~
//   gpt2.tally:3:5: note: w declared here
//
// Every error and warning ends with " [code]"; notes have none. A diagnostic without a
// location prints as "tally: error: message [code]". Ranges are half-open: [Start, End).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <llvm/ADT/StringRef.h>
#include <llvm/Support/SMLoc.h>
#include <llvm/Support/SourceMgr.h>
#include <llvm/Support/raw_ostream.h>

namespace tally {

/// `text` as valid UTF-8 (what JSON, SARIF and LSP must carry): every byte that is not part of
/// a valid sequence written as the four characters `\xNN` (a file named with a Latin-1 "é",
/// byte 0xE9, reads "caf\xE9.tally"). Valid text is returned as it is.
std::string printableUtf8(llvm::StringRef text);


/// How serious a diagnostic is. Notes only ever appear attached to an error or a warning.
enum class Severity : uint8_t { Note, Warning, Error };

/// Every diagnostic kind, one enumerator per DIAG entry in DiagnosticKinds.def.
enum class DiagKind : unsigned {
#define DIAG(ID, NAME, SEV) ID,
#include "support/DiagnosticKinds.def"
};

/// The number of diagnostic kinds; DiagKind values are 0 .. NumDiagKinds-1.
constexpr unsigned NumDiagKinds = 0
#define DIAG(ID, NAME, SEV) +1
#include "support/DiagnosticKinds.def"
    ;

/// The stable code name of a kind, e.g. "matmul-shape"; printed as "[matmul-shape]".
llvm::StringRef codeOf(DiagKind kind);

/// The severity a kind has before any -W option is applied (Error or Warning).
Severity defaultSeverity(DiagKind kind);

/// The kind whose code name is `code`, or nullopt when no kind has that name.
std::optional<DiagKind> kindFromCode(llvm::StringRef code);

/// "error", "warning" or "note": the label used in printed output and reports.
llvm::StringRef severityName(Severity severity);

/// A note attached to a diagnostic: extra context at another (or the same) location.
struct DiagNote {
  llvm::SMLoc loc;                   ///< invalid: the note prints as "tally: note: ..."
  std::string message;
  std::vector<llvm::SMRange> ranges; ///< half-open ranges underlined with '~'
};

/// One emitted diagnostic, as recorded by the engine.
struct Diagnostic {
  DiagKind kind = DiagKind::SyntaxError;
  Severity severity = Severity::Error; ///< effective severity, after -W options
  llvm::SMLoc loc;                     ///< where the caret goes; may be invalid
  std::string message;                 ///< without the " [code]" suffix
  std::vector<llvm::SMRange> ranges;   ///< half-open ranges underlined with '~'
  std::vector<llvm::SMFixIt> fixits;   ///< suggested replacements, printed under the caret
  std::vector<DiagNote> notes;

  /// Resolved position of `loc`, filled when the diagnostic is emitted: buffer identifier and
  /// 1-based line and column; "" and 0 when `loc` is invalid.
  std::string file;
  unsigned line = 0, column = 0;
};

class DiagnosticEngine;

/// Builder returned by DiagnosticEngine::report(); adds ranges, notes and fix-its. The
/// diagnostic is emitted (filtered by -W options, recorded, printed) when the builder is
/// destroyed, normally at the end of the full expression that called report().
class DiagBuilder {
public:
  DiagBuilder(DiagBuilder &&other) noexcept;
  DiagBuilder(const DiagBuilder &) = delete;
  DiagBuilder &operator=(const DiagBuilder &) = delete;
  DiagBuilder &operator=(DiagBuilder &&) = delete;
  ~DiagBuilder();

  /// Underlines a half-open source range; an invalid or reversed range is ignored.
  DiagBuilder &range(llvm::SMRange r);
  /// Attaches a note at `loc` (which may be invalid), optionally underlining `r`.
  DiagBuilder &note(llvm::SMLoc loc, std::string msg, llvm::SMRange r = {});
  /// Suggests replacing the half-open range `r` by `replacement` (an empty range inserts).
  /// An invalid or reversed range is ignored.
  DiagBuilder &fixit(llvm::SMRange r, std::string replacement);

private:
  friend class DiagnosticEngine;
  DiagBuilder(DiagnosticEngine *engine, Diagnostic diag);

  DiagnosticEngine *engine_; ///< nullptr once moved from: nothing to emit
  Diagnostic diag_;
};

/// Collects, filters, counts and prints diagnostics for the buffers of one SourceMgr.
class DiagnosticEngine {
public:
  /// The engine refers to `sm` for the whole of its life; it does not own it.
  explicit DiagnosticEngine(llvm::SourceMgr &sm);

  /// Starts a diagnostic of `kind` at `loc` (which may be invalid); it is emitted when the
  /// returned builder is destroyed. Write `message` without a trailing period or code.
  DiagBuilder report(DiagKind kind, llvm::SMLoc loc, std::string message);

  /// Applies one warning option, later options overriding earlier ones:
  ///   -Werror          every warning becomes an error
  ///   -Wno-error       undoes -Werror
  ///   -Werror=NAME     NAME becomes an error (and is enabled)
  ///   -Wno-error=NAME  NAME stays a warning even under -Werror
  ///   -WNAME           enables NAME;  -Wno-NAME  silences NAME
  ///   -w               silences every warning (even ones made errors)
  /// NAME must be the code of a warning kind. Returns false, changing nothing, for an unknown
  /// option or NAME, or for the name of an error kind (errors cannot be silenced).
  bool applyWarningOption(llvm::StringRef opt);

  /// Where diagnostics are printed as they are emitted; nullptr collects without printing.
  /// Default: llvm::errs().
  void setOutput(llvm::raw_ostream *os);

  /// Colors the output when true (the default) and the stream is a terminal.
  void setShowColors(bool show);

  /// Errors emitted, including warnings promoted by -Werror and errors past the limit.
  unsigned errorCount() const;
  /// Warnings emitted as warnings (not silenced, not promoted).
  unsigned warningCount() const;
  bool hasErrors() const;

  /// Every emitted diagnostic in emission order; silenced warnings are not included, errors
  /// past the error limit are.
  const std::vector<Diagnostic> &diagnostics() const;

  llvm::SourceMgr &sourceMgr();

  /// 1-based line/column and buffer identifier for a location ("<stdin>" for a buffer named
  /// "-", as printed). An invalid location, or one in no buffer, gives "" and 0, 0.
  void position(llvm::SMLoc loc, std::string &file, unsigned &line, unsigned &column) const;

  /// Marks a buffer as library code (the standard library, std.tally): a diagnostic located
  /// in it that has a note in one of the user's files is reported at the innermost such note
  /// instead (the call or instance declaration that led there), with the library's line as
  /// its first note, so the terminal, SARIF and the editor all point into the user's file.
  /// Fix-its in library text, which the user cannot edit, are dropped.
  void setLibraryBuffer(unsigned bufferID);
  /// Whether `loc` lies in a buffer marked by setLibraryBuffer.
  bool inLibrary(llvm::SMLoc loc) const;

  /// Caps the number of errors printed (default 50; 0 means no cap). When an error goes past
  /// the cap, one "too many errors" note is printed and from then on nothing more is printed;
  /// diagnostics are still counted and recorded. Prevents huge outputs on garbage input.
  void setErrorLimit(unsigned n);

private:
  friend class DiagBuilder;

  /// How a warning kind has been mapped by -Werror=/-Wno-error=.
  enum class ErrorMapping : uint8_t { Default, AsError, NotError };

  /// Filters, records and prints one diagnostic (called by ~DiagBuilder).
  void emit(Diagnostic diag);
  /// The severity `kind` has after the -W options, or nullopt when it is silenced.
  std::optional<Severity> effectiveSeverity(DiagKind kind) const;
  /// Moves a diagnostic raised in library code to the user's innermost note (setLibraryBuffer).
  void relocateFromLibrary(Diagnostic &diag) const;
  /// Prints one diagnostic and its notes to `*out_`.
  void print(const Diagnostic &diag);
  /// Prints one message with SourceMgr's formatting, or "tally: ..." when `loc` is invalid.
  void printOne(llvm::SMLoc loc, llvm::SourceMgr::DiagKind kind, const std::string &text,
                llvm::ArrayRef<llvm::SMRange> ranges, llvm::ArrayRef<llvm::SMFixIt> fixits);

  llvm::SourceMgr &sm_;
  llvm::raw_ostream *out_;
  bool showColors_ = true;
  unsigned errorLimit_ = 50;
  bool limitReached_ = false;
  unsigned errors_ = 0;
  unsigned warnings_ = 0;
  bool allWarningsAsErrors_ = false;
  bool ignoreAllWarnings_ = false;
  std::vector<bool> disabled_;             ///< per kind: silenced by -Wno-NAME
  std::vector<ErrorMapping> errorMapping_; ///< per kind: -Werror=NAME / -Wno-error=NAME
  std::vector<Diagnostic> diags_;
  std::vector<unsigned> libraryBuffers_; ///< setLibraryBuffer
  /// (kind, location, message) of every diagnostic with a location emitted so far: a repeat
  /// is dropped (not printed, counted or recorded).
  std::set<std::tuple<unsigned, const char *, std::string>> emitted_;
};

} // namespace tally
