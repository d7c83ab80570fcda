// Diagnostics.cpp — the diagnostic engine: kind table, -W options, recording and printing.
//
// Printing reuses llvm::SourceMgr::GetMessage/PrintMessage, which already produce clang's
// format (file:line:col, source line, caret, '~' ranges, fix-it line); the engine appends
// " [code]" to errors and warnings and prints location-less messages as "tally: ...".
#include "support/Diagnostics.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/WithColor.h"

#include <utility>

namespace tally {

namespace {

/// One row of DiagnosticKinds.def.
struct KindInfo {
  const char *code;
  Severity severity;
};

const KindInfo kKindTable[] = {
#define DIAG(ID, NAME, SEV) {NAME, Severity::SEV},
#include "support/DiagnosticKinds.def"
};

static_assert(sizeof(kKindTable) / sizeof(kKindTable[0]) == NumDiagKinds,
              "kind table and DiagKind disagree");

const KindInfo &infoOf(DiagKind kind) { return kKindTable[static_cast<unsigned>(kind)]; }

/// A range SourceMgr can underline: both ends set and Start not after End.
bool isWellFormed(llvm::SMRange r) {
  return r.isValid() && r.Start.getPointer() <= r.End.getPointer();
}

} // namespace

llvm::StringRef codeOf(DiagKind kind) { return infoOf(kind).code; }

Severity defaultSeverity(DiagKind kind) { return infoOf(kind).severity; }

std::optional<DiagKind> kindFromCode(llvm::StringRef code) {
  for (unsigned i = 0; i < NumDiagKinds; ++i)
    if (code == kKindTable[i].code)
      return static_cast<DiagKind>(i);
  return std::nullopt;
}

llvm::StringRef severityName(Severity severity) {
  switch (severity) {
  case Severity::Note:
    return "note";
  case Severity::Warning:
    return "warning";
  case Severity::Error:
    return "error";
  }
  return "error";
}

// ---- DiagBuilder ----

DiagBuilder::DiagBuilder(DiagnosticEngine *engine, Diagnostic diag)
    : engine_(engine), diag_(std::move(diag)) {}

DiagBuilder::DiagBuilder(DiagBuilder &&other) noexcept
    : engine_(other.engine_), diag_(std::move(other.diag_)) {
  other.engine_ = nullptr;
}

DiagBuilder::~DiagBuilder() {
  if (engine_)
    engine_->emit(std::move(diag_));
}

DiagBuilder &DiagBuilder::range(llvm::SMRange r) {
  if (isWellFormed(r))
    diag_.ranges.push_back(r);
  return *this;
}

DiagBuilder &DiagBuilder::note(llvm::SMLoc loc, std::string msg, llvm::SMRange r) {
  DiagNote n;
  n.loc = loc;
  n.message = printableUtf8(msg);
  if (isWellFormed(r))
    n.ranges.push_back(r);
  diag_.notes.push_back(std::move(n));
  return *this;
}

DiagBuilder &DiagBuilder::fixit(llvm::SMRange r, std::string replacement) {
  if (isWellFormed(r))
    diag_.fixits.emplace_back(r, replacement);
  return *this;
}

std::string printableUtf8(llvm::StringRef text) {
  std::string out;
  size_t bad = 0;
  while (!llvm::json::isUTF8(text, &bad)) {
    static const char hex[] = "0123456789ABCDEF";
    auto byte = static_cast<unsigned char>(text[bad]);
    out += text.substr(0, bad).str();
    out += "\\x";
    out += hex[byte >> 4];
    out += hex[byte & 15];
    text = text.drop_front(bad + 1);
  }
  return out + text.str();
}

// ---- DiagnosticEngine ----

DiagnosticEngine::DiagnosticEngine(llvm::SourceMgr &sm)
    : sm_(sm), out_(&llvm::errs()), disabled_(NumDiagKinds, false),
      errorMapping_(NumDiagKinds, ErrorMapping::Default) {}

DiagBuilder DiagnosticEngine::report(DiagKind kind, llvm::SMLoc loc, std::string message) {
  Diagnostic d;
  d.kind = kind;
  d.severity = defaultSeverity(kind);
  d.loc = loc;
  d.message = printableUtf8(message); // it may quote a file name or a user's text
  return DiagBuilder(this, std::move(d));
}

bool DiagnosticEngine::applyWarningOption(llvm::StringRef opt) {
  if (opt == "-w") {
    ignoreAllWarnings_ = true;
    return true;
  }
  if (opt == "-Werror") {
    allWarningsAsErrors_ = true;
    return true;
  }
  if (opt == "-Wno-error") {
    allWarningsAsErrors_ = false;
    return true;
  }

  // The remaining forms name one warning kind.
  enum { Enable, Disable, AsError, NotError } action;
  llvm::StringRef name = opt;
  if (name.consume_front("-Werror="))
    action = AsError;
  else if (name.consume_front("-Wno-error="))
    action = NotError;
  else if (name.consume_front("-Wno-"))
    action = Disable;
  else if (name.consume_front("-W"))
    action = Enable;
  else
    return false;

  std::optional<DiagKind> kind = kindFromCode(name);
  if (!kind || defaultSeverity(*kind) != Severity::Warning)
    return false;
  unsigned k = static_cast<unsigned>(*kind);
  switch (action) {
  case Enable:
    disabled_[k] = false;
    break;
  case Disable:
    disabled_[k] = true;
    break;
  case AsError:
    disabled_[k] = false;
    errorMapping_[k] = ErrorMapping::AsError;
    break;
  case NotError:
    errorMapping_[k] = ErrorMapping::NotError;
    break;
  }
  return true;
}

void DiagnosticEngine::setOutput(llvm::raw_ostream *os) { out_ = os; }

void DiagnosticEngine::setShowColors(bool show) { showColors_ = show; }

unsigned DiagnosticEngine::errorCount() const { return errors_; }

unsigned DiagnosticEngine::warningCount() const { return warnings_; }

bool DiagnosticEngine::hasErrors() const { return errors_ != 0; }

const std::vector<Diagnostic> &DiagnosticEngine::diagnostics() const { return diags_; }

llvm::SourceMgr &DiagnosticEngine::sourceMgr() { return sm_; }

void DiagnosticEngine::position(llvm::SMLoc loc, std::string &file, unsigned &line,
                                unsigned &column) const {
  file.clear();
  line = 0;
  column = 0;
  if (!loc.isValid())
    return;
  unsigned buffer = sm_.FindBufferContainingLoc(loc);
  if (buffer == 0)
    return;
  std::pair<unsigned, unsigned> lc = sm_.getLineAndColumn(loc, buffer);
  line = lc.first;
  column = lc.second;
  llvm::StringRef id = sm_.getMemoryBuffer(buffer)->getBufferIdentifier();
  file = id == "-" ? std::string("<stdin>") : printableUtf8(id);
}

void DiagnosticEngine::setErrorLimit(unsigned n) { errorLimit_ = n; }

void DiagnosticEngine::setLibraryBuffer(unsigned bufferID) { libraryBuffers_.push_back(bufferID); }

bool DiagnosticEngine::inLibrary(llvm::SMLoc loc) const {
  if (!loc.isValid() || libraryBuffers_.empty())
    return false;
  unsigned buffer = sm_.FindBufferContainingLoc(loc);
  return buffer != 0 && llvm::is_contained(libraryBuffers_, buffer);
}

void DiagnosticEngine::relocateFromLibrary(Diagnostic &diag) const {
  if (!inLibrary(diag.loc))
    return;
  auto user = llvm::find_if(diag.notes, [&](const DiagNote &n) {
    return n.loc.isValid() && sm_.FindBufferContainingLoc(n.loc) != 0 && !inLibrary(n.loc);
  });
  if (user == diag.notes.end())
    return;
  // The library's line becomes a note that says whose code it is: "in 'Linear' called here as
  // proj" (the note moved up) reads "raised in the standard library, in 'Linear' called as
  // proj" at the library's line.
  DiagNote library;
  library.loc = diag.loc;
  library.ranges = std::move(diag.ranges);
  std::string context = user->message;
  if (size_t at = context.find(" here as "); at != std::string::npos)
    context.replace(at, 9, " as ");
  library.message = "raised in the standard library, " + context;
  // Other notes at the library's line (unaligned-matmul's padding) would show it again.
  for (DiagNote &n : diag.notes)
    if (n.loc == library.loc) {
      n.loc = llvm::SMLoc();
      n.ranges.clear();
    }
  diag.loc = user->loc;
  diag.ranges = std::move(user->ranges);
  diag.notes.erase(user);
  diag.notes.insert(diag.notes.begin(), std::move(library));
  llvm::erase_if(diag.fixits, [&](const llvm::SMFixIt &f) { return inLibrary(f.getRange().Start); });
}

std::optional<Severity> DiagnosticEngine::effectiveSeverity(DiagKind kind) const {
  if (defaultSeverity(kind) == Severity::Error)
    return Severity::Error;
  unsigned k = static_cast<unsigned>(kind);
  if (ignoreAllWarnings_ || disabled_[k])
    return std::nullopt;
  switch (errorMapping_[k]) {
  case ErrorMapping::AsError:
    return Severity::Error;
  case ErrorMapping::NotError:
    return Severity::Warning;
  case ErrorMapping::Default:
    break;
  }
  return allWarningsAsErrors_ ? Severity::Error : Severity::Warning;
}

void DiagnosticEngine::emit(Diagnostic diag) {
  std::optional<Severity> severity = effectiveSeverity(diag.kind);
  if (!severity)
    return; // silenced warning: not counted, not recorded
  diag.severity = *severity;
  // The same diagnostic at the same place said again (`check` lowers one model for each plan
  // that uses it) is said once; so is one with no place (a command-line override such as
  // `--batch 0`, checked again for each plan).
  if (!emitted_.insert({static_cast<unsigned>(diag.kind), diag.loc.getPointer(), diag.message})
           .second)
    return;
  relocateFromLibrary(diag);
  position(diag.loc, diag.file, diag.line, diag.column);

  if (diag.severity == Severity::Error)
    ++errors_;
  else
    ++warnings_;

  // Past the error limit: print one note, then nothing more.
  if (!limitReached_ && errorLimit_ != 0 && errors_ > errorLimit_) {
    limitReached_ = true;
    if (out_)
      printOne(llvm::SMLoc(), llvm::SourceMgr::DK_Note,
               "too many errors emitted (limit " + std::to_string(errorLimit_) +
                   "); further diagnostics are counted but not printed",
               {}, {});
  }
  if (out_ && !limitReached_)
    print(diag);

  diags_.push_back(std::move(diag));
}

void DiagnosticEngine::print(const Diagnostic &diag) {
  llvm::SourceMgr::DiagKind kind = diag.severity == Severity::Error
                                       ? llvm::SourceMgr::DK_Error
                                       : llvm::SourceMgr::DK_Warning;
  std::string text = diag.message + " [" + codeOf(diag.kind).str() + "]";
  printOne(diag.loc, kind, text, diag.ranges, diag.fixits);
  for (const DiagNote &n : diag.notes)
    printOne(n.loc, llvm::SourceMgr::DK_Note, n.message, n.ranges, {});
  out_->flush();
}

void DiagnosticEngine::printOne(llvm::SMLoc loc, llvm::SourceMgr::DiagKind kind,
                                const std::string &text,
                                llvm::ArrayRef<llvm::SMRange> ranges,
                                llvm::ArrayRef<llvm::SMFixIt> fixits) {
  if (!loc.isValid() || sm_.FindBufferContainingLoc(loc) == 0) {
    llvm::SMDiagnostic d(llvm::StringRef(), kind, text);
    d.print("tally", *out_, showColors_);
    return;
  }
  llvm::SMDiagnostic d = sm_.GetMessage(loc, kind, text, ranges, fixits);
  llvm::StringRef line = d.getLineContents();
  if (llvm::all_of(line, [](char c) { return static_cast<unsigned char>(c) < 0x80; })) {
    sm_.PrintMessage(*out_, d, showColors_);
    return;
  }
  // LLVM prints no caret under a line with non-ASCII text (its columns are bytes). Print the
  // header through LLVM (no source line), then the line and a caret line whose columns count
  // code points, so `// 2·B·D·K` in a comment does not cost the user the caret.
  std::string where = (d.getFilename() == "-" ? std::string("<stdin>") : d.getFilename().str()) +
                      ":" + std::to_string(d.getLineNo()) + ":" +
                      std::to_string(d.getColumnNo() + 1);
  llvm::SMDiagnostic header(sm_, llvm::SMLoc(), where, -1, -1, kind, d.getMessage(),
                            llvm::StringRef(), {});
  header.print(nullptr, *out_, showColors_);
  std::vector<unsigned> column(line.size() + 1, 0); // byte offset → display column
  unsigned c = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    column[i] = c;
    if ((static_cast<unsigned char>(line[i]) & 0xC0) != 0x80)
      ++c;
  }
  column[line.size()] = c;
  std::string caret(c + 1, ' ');
  for (const auto &r : d.getRanges())
    for (unsigned x = column[std::min<size_t>(r.first, line.size())];
         x < column[std::min<size_t>(r.second, line.size())]; ++x)
      caret[x] = '~';
  caret[column[std::min<size_t>(d.getColumnNo(), line.size())]] = '^';
  caret.erase(caret.find_last_not_of(' ') + 1);
  *out_ << line << "\n";
  llvm::WithColor(*out_, llvm::raw_ostream::GREEN, true, false,
                  showColors_ ? llvm::ColorMode::Auto : llvm::ColorMode::Disable)
      << caret;
  *out_ << "\n";
}

} // namespace tally
