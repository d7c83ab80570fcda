// The padded LM head of tally's generated step (issue 38, item 4). A vocabulary that is not a
// multiple of 64 (GPT-2's 50,257) gives the head matmul, the model's largest, rows that do not
// start on 16 bytes, and cuBLASLt runs it at a fraction of the peak (passes/MatmulAlignment.cpp:
// measured 0.126 of an H200's bf16 peak). nanoGPT pads the vocabulary to 50,304; tally's step
// pads only the head, in place, where no number the user sees changes:
//
//   - the weight [V, d] is held as [V', d] (V' = V rounded up to 64) in the step's params,
//     grads, master and optimizer regions; its first V·d elements are the real weight (the
//     vocabulary is the outer axis, so the real rows are a prefix), rows V..V'-1 start at zero
//     (the regions are zero-filled) and are never updated (kUpdate covers the first V·d); the
//     logits and their gradient are planned at [.., V'];
//   - cross_entropy forward and backward read rows of V' (the row stride) and only the first V
//     columns (the valid width); the backward writes zero into the padded columns, so the padded
//     rows' gradient is zero too (dW = dlogitsᵀ·x);
//   - parameter counts, kParams (--init, --save, --dump-grads, the default init) and the
//     token range checks read the forward graph, which is not padded: the real shape [V, d].
//
// One rule (headPadding) decides, read by the step (passes/Backward.cpp: buildTrainingStep
// builds the step from the padded copy of the forward graph, so the memory plan and arena hold
// the padded buffers), by the estimate (StepTime.cpp prices the head over V' columns at the
// aligned rate, StaticMemory.cpp counts the padded rows of the model states,
// MatmulAlignment.cpp warns only about an unpadded head) and by the emitter
// (codegen/EmitLayers.cpp, EmitUpdate.cpp, and `tally build`'s `lm head:` line).
//
// The head is padded when the plan asks (Plan::padHead: `tally build/run --backend cuda`, or
// `--pad-head` for any backend), the plan trains, and the model's loss is a cross_entropy of
// logits = x @ transpose(W) for a parameter W [V, d] with V not a multiple of 64 (the tied
// output head of GPT-2: W is the token embedding's table), the logits read by nothing else.
// It is refused, with the reason in `tally build`'s line, when:
//   - the head's weight is [d, V] (an untied Linear's layout, logits = x @ W): the vocabulary is
//     the inner axis, so padding would restride every row of the weight, not append rows;
//   - W is read by anything but the head's transpose and embedding lookups;
//   - the plan cuts each parameter into pieces (ZeRO 2 and 3, tensor parallelism) by its real
//     element count. ZeRO-1 pads: it shards the flat regions, and its update rows stop at the
//     real rows too.
#pragma once

#include "ir/Graph.h"
#include "ir/Plan.h"

#include <string>

namespace tally {

/// The padded head of a plan's step, or why there is none.
struct HeadPadding {
  OpId matmul = kNone;    ///< the head matmul (forward graph); kNone: not padded
  OpId loss = kNone;      ///< the cross_entropy reading its logits
  OpId head = kNone;      ///< the head matmul of a vocabulary to pad, padded or refused
  TensorId weight = kNone, view = kNone, logits = kNone;
  int64_t vocab = 0;      ///< V: the real rows of the weight and columns of the logits
  int64_t padded = 0;     ///< V': V rounded up to a multiple of kHeadPadMultiple
  int64_t width = 0;      ///< d: the weight's row length
  /// Why a head that would need padding is not padded ("" when it is, or needs none).
  std::string refused;
  bool applies() const { return matmul != kNone; }
  /// Elements the padding adds to the weight (and to each of its gradient, master and states).
  int64_t extraElements() const { return applies() ? (padded - vocab) * width : 0; }
};

/// The multiple the vocabulary is padded to (nanoGPT's: 50,257 → 50,304).
constexpr int64_t kHeadPadMultiple = 64;

/// The rule: whether the step of `plan` over forward graph `g` pads its head, and how.
HeadPadding headPadding(const Graph &g, const Plan &plan);

/// A copy of forward graph `g` with the head padded as `hp` says (the weight, its transposed
/// view and the logits one axis longer); `g` itself when `hp` does not apply.
Graph paddedForward(const Graph &g, const HeadPadding &hp);

/// `tally build`'s line: "lm head: wte.weight padded 50257 → 50304 rows ..." or why not; ""
/// when the plan's head needs no padding.
std::string headPaddingNote(const Graph &g, const HeadPadding &hp);

} // namespace tally
