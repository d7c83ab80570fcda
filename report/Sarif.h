// Sarif.h — tally's diagnostics as a SARIF 2.1.0 log, for CI code scanning.
//
// `tally check --format sarif` writes one log with one run: tool.driver lists one rule per
// diagnostic kind of support/DiagnosticKinds.def (its code, a short and a full description,
// help, the default level), and every recorded diagnostic becomes one result with its level,
// message, a physical location (1-based lines and columns counted in Unicode code points,
// columnKind "unicodeCodePoints"; the region spans the diagnostic's underlined range), its
// notes as related locations and its fix-its as a SARIF fix. Built with llvm::json.
#pragma once

#include "support/Diagnostics.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

namespace tally {

/// The human text of one rule: what a diagnostic kind means and what to do about it.
struct SarifRuleText {
  const char *code;             ///< the kind's code name, e.g. "matmul-shape"
  const char *shortDescription; ///< one sentence
  const char *fullDescription;  ///< what triggers it
  const char *help;             ///< how to fix it
};

/// The rule text of a diagnostic kind, or nullptr when report/SarifRules.cpp has none
/// (tests/sarif/validate_sarif.py fails then, so every kind in DiagnosticKinds.def has one).
const SarifRuleText *sarifRuleText(DiagKind kind);

/// Appends one SARIF result per diagnostic the engine recorded to `results`. `sm` is the
/// SourceMgr holding the buffers the diagnostics point into.
void appendSarifResults(const DiagnosticEngine &diags, const llvm::SourceMgr &sm,
                        llvm::json::Array &results);

/// The whole SARIF 2.1.0 log: $schema, version and one run of tally with every rule and the
/// given results.
llvm::json::Value sarifLog(llvm::json::Array results);

/// Writes sarifLog(results) pretty-printed, followed by a newline.
void renderSarif(llvm::json::Array results, llvm::raw_ostream &os);

/// Appends one object per recorded diagnostic for `tally check --format json` (editors and
/// scripts): severity, code, message, file, and a range {start, end} of 1-based line and
/// code-point column (end exclusive; absent without a location), its fix-its (range and
/// text) and notes (message, and file and range when located). Same regions as SARIF.
void appendDiagnosticsJson(const DiagnosticEngine &diags, const llvm::SourceMgr &sm,
                           llvm::json::Array &out);

/// A file path as a SARIF artifact URI: an absolute path becomes file:///..., a relative one
/// stays a relative reference; characters outside RFC 3986's unreserved set and '/' are
/// percent-encoded ("<stdin>" → "%3Cstdin%3E").
std::string sarifUri(llvm::StringRef path);

} // namespace tally
