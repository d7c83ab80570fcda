// The renderer behind `tally explain --op PATH`: how one op's shape, FLOPs, bytes, bound and
// time were derived, or the ops of one block with their subtotals. Like every report it only
// formats: the numbers come from the passes (OpAnalysis, Analysis::params.byBlock) and the
// formulas from the op's rule (ir/OpRules.h describeForward and the rest: the counting rule the
// passes run, run again on terms, ir/Formula.h).
#pragma once

#include "support/Diagnostics.h"
#include "passes/Analysis.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <string>
#include <vector>

namespace tally {

/// What an explain path names: an op (exact path, "h[3].attn.qkv.matmul"), a block instance
/// ("h[3]", "h[3].attn", "h"), the copies of one in a repeated block by the pattern the
/// reports' rows give them ("h[*].attn.qkv.matmul", "h[*].attn": the first copy is selected),
/// or nothing, with the closest path as a suggestion.
struct ExplainSelection {
  enum Kind { None, Op, Block } kind = None;
  OpId op = kNone;           ///< Op: the op
  uint32_t instance = kNone; ///< Block: index into Graph::instances and Analysis::params.byBlock
  std::vector<OpId> ops;     ///< Block: the ops written in it and in the blocks below it, in order
  std::string suggestion;    ///< None: the closest op or block path, "" when none is close
  /// None, for a path whose copy index is past a repeat's last copy ("h[12]" of 12 copies):
  /// how many copies there are ("h has 12 copies, h[0] to h[11]"), in place of a suggestion.
  std::string outOfRange;
  /// Selected by a pattern: the pattern and how many ops (blocks) it names; "" and 1 for a path.
  std::string pattern;
  uint32_t copies = 1;
};

/// Looks `path` up among the graph's op paths, then its block instance paths, then (a path
/// with `[*]`) the patterns of both (report/Copies.h).
ExplainSelection selectForExplain(const Graph &g, llvm::StringRef path);

/// For a selection by a pattern: whether every op the pattern names (for a block, every op of
/// every copy) has its first copy's analysis, bit for bit. Then the first copy's explanation
/// is each copy's, and the JSON report's row of the pattern sums equal copies.
bool copiesAlike(const Analysis &a, const ExplainSelection &sel);

/// One op's derivation as text: where it was written, its tensors, the forward FLOP formula
/// with values substituted, bytes read and written, intensity against the target's ridge, the
/// bound, forward and backward time, the backward split into input and weight gradients with
/// each input's formula, and what the backward keeps. `diags` resolves source locations.
/// `sel`, when it selected the op by a pattern, adds a first line (JSON: `pattern`, `copies`,
/// `copies_alike`) saying how many copies the pattern names and whether they are alike.
void explainOpText(const Analysis &a, OpId op, const DiagnosticEngine &diags, llvm::raw_ostream &os,
                   const ExplainSelection *sel = nullptr);
/// The same as one JSON object.
void explainOpJson(const Analysis &a, OpId op, const DiagnosticEngine &diags, llvm::raw_ostream &os,
                   const ExplainSelection *sel = nullptr);

/// A block's ops, one line each (FLOPs, bytes, intensity, bound, time per micro-batch), the sum
/// of those per-op values (a subtotal the renderer adds up from numbers the passes computed,
/// nothing else), and the block's per-step totals from passes/BlockTotals.cpp.
void explainBlockText(const Analysis &a, const ExplainSelection &sel, llvm::raw_ostream &os);
/// The same as one JSON object.
void explainBlockJson(const Analysis &a, const ExplainSelection &sel, llvm::raw_ostream &os);

/// ExplainCollectives.cpp (`tally explain --collectives`): the step's framework stack and every
/// kind of collective it runs, each with its group, algorithm, protocol, steps, latency,
/// bandwidths, time and count per step (Analysis::stack, Analysis::collectives).
void explainCollectivesText(const Analysis &a, llvm::raw_ostream &os);
/// The same as one JSON object.
void explainCollectivesJson(const Analysis &a, llvm::raw_ostream &os);
/// The JSON report's `collectives` array and `stack` object (also explain's).
llvm::json::Value collectivesJson(const Analysis &a);
llvm::json::Value stackJson(const Analysis &a);

} // namespace tally
