// Sarif.cpp — renders recorded diagnostics as a SARIF 2.1.0 log (see Sarif.h).
//
// 1. Each diagnostic's region: the underlined range that contains its caret (else its first
//    range, else the caret alone as a one-character region). Start and end are converted to
//    1-based line and code-point column; SARIF's endColumn is exclusive, like tally's ranges.
// 2. The result: ruleId (the code), ruleIndex (its position in tool.driver.rules, which follow
//    DiagnosticKinds.def), level, message, the location, notes as relatedLocations, and all
//    fix-its of the diagnostic as one fix (they are meant to be applied together).
// 3. The log: one run whose driver lists every kind as a rule.
#include "report/Sarif.h"

#include "llvm/Support/FormatVariadic.h"

#include <cctype>
#include <optional>
#include <string>

namespace tally {

namespace {

constexpr const char *kSchema = "https://json.schemastore.org/sarif-2.1.0.json";

/// A position in a buffer: 1-based line and code-point column, and the buffer's name.
struct Position {
  std::string file;
  unsigned line = 0, column = 0;
};

/// Resolves `loc` (0 lines when it is in no buffer). Columns count code points, not bytes.
Position resolve(const llvm::SourceMgr &sm, llvm::SMLoc loc) {
  Position p;
  if (!loc.isValid())
    return p;
  unsigned buffer = sm.FindBufferContainingLoc(loc);
  if (buffer == 0)
    return p;
  auto [line, byteColumn] = sm.getLineAndColumn(loc, buffer);
  const char *lineStart = loc.getPointer() - (byteColumn - 1);
  unsigned column = 1;
  for (const char *c = lineStart; c < loc.getPointer(); ++c)
    if ((static_cast<unsigned char>(*c) & 0xC0) != 0x80)
      ++column;
  llvm::StringRef id = sm.getMemoryBuffer(buffer)->getBufferIdentifier();
  p.file = id == "-" ? std::string("<stdin>") : id.str(); // raw: sarifUri percent-encodes it
  p.line = line;
  p.column = column;
  return p;
}

/// A SARIF region from two resolved positions (end exclusive).
llvm::json::Object region(const Position &start, const Position &end) {
  return llvm::json::Object{{"startLine", static_cast<int64_t>(start.line)},
                            {"startColumn", static_cast<int64_t>(start.column)},
                            {"endLine", static_cast<int64_t>(end.line)},
                            {"endColumn", static_cast<int64_t>(end.column)}};
}

/// The region of a half-open range; nullopt when either end is outside the buffers or the
/// ends are in different files.
std::optional<llvm::json::Object> rangeRegion(const llvm::SourceMgr &sm, llvm::SMRange r,
                                              std::string &file) {
  Position s = resolve(sm, r.Start), e = resolve(sm, r.End);
  if (s.line == 0 || e.line == 0 || s.file != e.file)
    return std::nullopt;
  file = s.file;
  return region(s, e);
}

/// The region of a diagnostic (step 1): a range containing the caret, else (no caret) the
/// first range, else the caret alone.
std::optional<llvm::json::Object> diagRegion(const llvm::SourceMgr &sm, llvm::SMLoc loc,
                                             const std::vector<llvm::SMRange> &ranges,
                                             std::string &file) {
  const char *at = loc.getPointer();
  for (const llvm::SMRange &r : ranges)
    if (loc.isValid() && r.Start.getPointer() <= at &&
        (at < r.End.getPointer() || at == r.Start.getPointer()))
      if (std::optional<llvm::json::Object> reg = rangeRegion(sm, r, file))
        return reg;
  if (!loc.isValid()) {
    if (ranges.empty())
      return std::nullopt;
    return rangeRegion(sm, ranges.front(), file);
  }
  Position p = resolve(sm, loc);
  if (p.line == 0)
    return std::nullopt;
  file = p.file;
  Position end = p;
  end.column = p.column + 1;
  return region(p, end);
}

llvm::json::Object message(const std::string &text) { return llvm::json::Object{{"text", text}}; }

/// A physicalLocation at `file` and `reg`.
llvm::json::Object location(const std::string &file, llvm::json::Object reg) {
  return llvm::json::Object{
      {"physicalLocation",
       llvm::json::Object{{"artifactLocation", llvm::json::Object{{"uri", sarifUri(file)}}},
                          {"region", std::move(reg)}}}};
}

const char *level(Severity s) {
  switch (s) {
  case Severity::Error:
    return "error";
  case Severity::Warning:
    return "warning";
  case Severity::Note:
    return "note";
  }
  return "error";
}

/// The fix-its of a diagnostic as one SARIF fix, grouped by file; nullopt when none resolve.
std::optional<llvm::json::Object> fixOf(const llvm::SourceMgr &sm, const Diagnostic &d) {
  llvm::json::Array changes;
  std::string currentFile;
  llvm::json::Array replacements;
  auto flush = [&] {
    if (replacements.empty())
      return;
    changes.push_back(llvm::json::Object{
        {"artifactLocation", llvm::json::Object{{"uri", sarifUri(currentFile)}}},
        {"replacements", std::move(replacements)}});
    replacements = llvm::json::Array();
  };
  std::string description;
  for (const llvm::SMFixIt &f : d.fixits) {
    std::string file;
    std::optional<llvm::json::Object> reg = rangeRegion(sm, f.getRange(), file);
    if (!reg)
      continue;
    if (file != currentFile)
      flush();
    currentFile = file;
    replacements.push_back(
        llvm::json::Object{{"deletedRegion", std::move(*reg)},
                           {"insertedContent", llvm::json::Object{{"text", f.getText().str()}}}});
    if (!description.empty())
      description += "; ";
    description += "replace with '" + f.getText().str() + "'";
  }
  flush();
  if (changes.empty())
    return std::nullopt;
  description[0] = 'R';
  return llvm::json::Object{{"description", message(description)},
                            {"artifactChanges", std::move(changes)}};
}

/// One rule per diagnostic kind, in DiagnosticKinds.def order (ruleIndex is the kind).
llvm::json::Array rules() {
  llvm::json::Array out;
  for (unsigned k = 0; k < NumDiagKinds; ++k) {
    DiagKind kind = static_cast<DiagKind>(k);
    std::string code = codeOf(kind).str();
    const SarifRuleText *text = sarifRuleText(kind);
    llvm::json::Object rule{{"id", code}, {"name", code}};
    if (text) {
      rule["shortDescription"] = message(text->shortDescription);
      rule["fullDescription"] = message(text->fullDescription);
      rule["help"] = message(text->help);
    }
    rule["defaultConfiguration"] = llvm::json::Object{{"level", level(defaultSeverity(kind))}};
    out.push_back(std::move(rule));
  }
  return out;
}

} // namespace

std::string sarifUri(llvm::StringRef path) {
  std::string out;
  if (path.startswith("/"))
    out = "file://";
  for (char ch : path) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~' || c == '/')
      out += ch;
    else
      out += llvm::formatv("%{0:X-2}", static_cast<unsigned>(c)).str();
  }
  return out;
}

void appendSarifResults(const DiagnosticEngine &diags, const llvm::SourceMgr &sm,
                        llvm::json::Array &results) {
  for (const Diagnostic &d : diags.diagnostics()) {
    llvm::json::Object result{{"ruleId", codeOf(d.kind).str()},
                              {"ruleIndex", static_cast<int64_t>(static_cast<unsigned>(d.kind))},
                              {"level", level(d.severity)},
                              {"message", message(d.message)}};
    llvm::json::Array locations;
    std::string file;
    if (std::optional<llvm::json::Object> reg = diagRegion(sm, d.loc, d.ranges, file))
      locations.push_back(location(file, std::move(*reg)));
    result["locations"] = std::move(locations);
    llvm::json::Array related;
    for (const DiagNote &n : d.notes) {
      llvm::json::Object rel{{"id", static_cast<int64_t>(related.size())},
                             {"message", message(n.message)}};
      std::string noteFile;
      if (std::optional<llvm::json::Object> reg = diagRegion(sm, n.loc, n.ranges, noteFile))
        rel["physicalLocation"] = std::move(
            *location(noteFile, std::move(*reg)).getObject("physicalLocation"));
      related.push_back(std::move(rel));
    }
    if (!related.empty())
      result["relatedLocations"] = std::move(related);
    if (std::optional<llvm::json::Object> fix = fixOf(sm, d))
      result["fixes"] = llvm::json::Array{std::move(*fix)};
    results.push_back(std::move(result));
  }
}

/// A SARIF region as the JSON format's {start: {line, column}, end: {line, column}}.
llvm::json::Object plainRange(const llvm::json::Object &region) {
  auto num = [&](llvm::StringRef k) { return region.getInteger(k).getValueOr(0); };
  return llvm::json::Object{
      {"start", llvm::json::Object{{"line", num("startLine")}, {"column", num("startColumn")}}},
      {"end", llvm::json::Object{{"line", num("endLine")}, {"column", num("endColumn")}}}};
}

void appendDiagnosticsJson(const DiagnosticEngine &diags, const llvm::SourceMgr &sm,
                           llvm::json::Array &out) {
  for (const Diagnostic &d : diags.diagnostics()) {
    llvm::json::Object o{{"severity", severityName(d.severity).str()},
                         {"code", codeOf(d.kind).str()},
                         {"message", d.message}};
    std::string file;
    if (std::optional<llvm::json::Object> reg = diagRegion(sm, d.loc, d.ranges, file)) {
      o["file"] = printableUtf8(file);
      o["range"] = plainRange(*reg);
    }
    llvm::json::Array fixits;
    for (const llvm::SMFixIt &f : d.fixits) {
      std::string fixFile;
      if (std::optional<llvm::json::Object> reg = rangeRegion(sm, f.getRange(), fixFile))
        fixits.push_back(llvm::json::Object{
            {"file", printableUtf8(fixFile)}, {"range", plainRange(*reg)}, {"text", f.getText().str()}});
    }
    o["fixits"] = std::move(fixits);
    llvm::json::Array notes;
    for (const DiagNote &n : d.notes) {
      llvm::json::Object note{{"message", n.message}};
      std::string noteFile;
      if (std::optional<llvm::json::Object> reg = diagRegion(sm, n.loc, n.ranges, noteFile)) {
        note["file"] = printableUtf8(noteFile);
        note["range"] = plainRange(*reg);
      }
      notes.push_back(std::move(note));
    }
    o["notes"] = std::move(notes);
    out.push_back(std::move(o));
  }
}

llvm::json::Value sarifLog(llvm::json::Array results) {
  llvm::json::Object driver{{"name", "tally"},
                            {"version", "0.1"},
                            {"rules", rules()}};
  llvm::json::Object run{{"tool", llvm::json::Object{{"driver", std::move(driver)}}},
                         {"columnKind", "unicodeCodePoints"},
                         {"results", std::move(results)}};
  return llvm::json::Object{{"$schema", kSchema},
                            {"version", "2.1.0"},
                            {"runs", llvm::json::Array{std::move(run)}}};
}

void renderSarif(llvm::json::Array results, llvm::raw_ostream &os) {
  os << llvm::formatv("{0:2}", sarifLog(std::move(results))) << "\n";
}

} // namespace tally
