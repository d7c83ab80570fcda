// Renderers of an Analysis. They format numbers the passes computed; none computes one.
#pragma once

#include "support/Diagnostics.h"
#include "passes/Analysis.h"

#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace tally {

/// Replaces every inf or nan number under `v` by null (JSON has neither: llvm::json would
/// write `inf`) and appends the dotted path of each to `replaced`.
void nullNonFinite(llvm::json::Value &v, const std::string &path, std::vector<std::string> &replaced);
/// The one way a renderer prints a JSON document: non-finite numbers as null, two-space
/// indentation, a final newline. (The report streams its large arrays itself, renderJson.)
void printJson(llvm::raw_ostream &os, llvm::json::Value v);
/// A double as llvm::json writes one ("%.17g", which std::to_chars with 17 significant
/// digits is, and faster than printf), or null when it is not finite.
void writeJsonNumber(llvm::json::OStream &j, double v);

/// A terminal report that reads like a budget statement.
void renderText(const Analysis &a, llvm::raw_ostream &os);
/// One JSON object with the keys of language.md §4 (and more).
void renderJson(const Analysis &a, const DiagnosticEngine &diags, llvm::raw_ostream &os);
/// The text report's content as Markdown tables, for people and pull requests.
void renderMarkdown(const Analysis &a, llvm::raw_ostream &os);
/// `--emit=ir --format json`: tensors with layouts, ops with phases, FLOPs and bytes.
void renderIrJson(const Graph &g, llvm::raw_ostream &os);
/// `--emit=memory-plan`: the schedule, the arena's buffers and the flat regions, as text or
/// JSON (docs/ir.md).
void renderMemoryPlan(const Analysis &a, llvm::raw_ostream &os, bool json);

} // namespace tally
