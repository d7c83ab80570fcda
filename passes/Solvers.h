// What-if solvers: the questions `tally solve` answers and the fixes that budget diagnostics
// propose. Each solver returns its answer with a unit, the inputs it used and the derivation
// as lines of text with the values substituted, so a user can check the arithmetic by hand.
//
// Two kinds of solver live here:
//  - closed forms on a handful of numbers (run time from 6·N·D, the largest parameter count
//    whose training states fit): pure functions of their arguments;
//  - searches over a plan (the largest micro-batch that fits, the fewest devices): each
//    candidate plan is lowered again when its graph changes (the Relower callback) and the
//    whole analysis is run on it, so the answer uses exactly the numbers `tally report` would
//    show for that plan.
#pragma once

#include "ir/Dtype.h"
#include "ir/Plan.h"
#include "ir/Target.h"
#include "ir/Units.h"
#include "passes/Analysis.h"
#include "passes/AnalysisManager.h"
#include "passes/Passes.h"

#include "llvm/ADT/StringRef.h"

#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace tally {

/// One input of a solver as the user gave it (or as the plan says): a number, or a word such
/// as a target name or a precision preset.
struct SolverInput {
  std::string name;
  double number = 0;
  std::string text;            ///< non-empty: the input is this word and `number` is unused
};

inline SolverInput numberInput(std::string name, double v) { return {std::move(name), v, ""}; }
inline SolverInput wordInput(std::string name, std::string text) {
  return {std::move(name), 0, std::move(text)};
}

/// A number for a derivation line: integers below 1e6 as they are, others with four
/// significant digits in C's %g with the exponent written "e24" rather than "e+24".
std::string derivationNumber(double v);

/// The answer to one what-if question.
struct SolverAnswer {
  std::string question;        ///< "run-time", "max-params", "micro-batch", "devices"
  double answer = 0;           ///< in `unit`
  std::string unit;            ///< "days", "parameters", "sequences", "devices"
  std::vector<SolverInput> inputs;
  std::vector<std::string> derivation; ///< lines with the values substituted
  std::string error;           ///< non-empty: there is no answer, and this says why
  /// `layout`: the layouts found, best first, as JSON-ready rows (name → number or word).
  std::vector<std::vector<SolverInput>> rows;
  bool ok() const { return error.empty(); }
};

// ---- closed forms ----------------------------------------------------------------------------

/// Training time of N parameters on D tokens: FLOPs = 6·N·D (forward 2ND + backward 4ND), run
/// at `mfu` of the dense peak of `devices` × `target` in `dtype`. Answer in days. The lecture's
/// example: 70e9 params, 15e12 tokens, 1024 H100_SXM at bf16 and MFU 0.5 → 143.93 days.
SolverAnswer solveRunTime(double params, double tokens, int64_t devices, const Target &target,
                          double mfu, Dtype dtype = Dtype::BF16);

// precisionPreset and optimizerPreset (ir/Plan.h) give the presets and optimizers by name.

/// Bytes one parameter takes in training states: params + grads + master + optimizer state,
/// from the precision policy and the optimizer's state count (activations not included).
struct StateBytes {
  double params = 0, grads = 0, master = 0, optimizer = 0;
  double total() const { return params + grads + master + optimizer; }
};
StateBytes stateBytesPerParam(const PrecisionPolicy &precision, unsigned optimizerStates);

/// The largest parameter count whose params, grads, master weights and optimizer state fit in
/// the memory of `devices` × `target`. The answer is the lecture's: the devices' total memory
/// divided by the bytes per parameter, which is what ZeRO-3 (every state sharded over all
/// devices) achieves; the derivation also gives the answer for one unsharded device and for
/// ZeRO stages 1 and 2. Activations are not counted (a caveat line says so). The lecture:
/// 8 × H100_SXM, AdamW, bf16 (2+2+8 = 12 bytes) → 53.3e9; fp32 (4+4+8 = 16 bytes) → 40e9.
SolverAnswer solveMaxParams(int64_t devices, const Target &target, const OptimizerSpec &optimizer,
                            const PrecisionPolicy &precision);

// ---- searches over a plan ----------------------------------------------------------------

/// A candidate plan that meets a goal, with its numbers.
struct Candidate {
  Plan plan;
  Trial trial;
};

/// Accumulation steps = batch / (micro_batch × data-parallel degree) (may be fractional: the
/// caller says so).
double accumulationSteps(const Plan &plan);

/// Micro-batches to try for a plan: the divisors of batch / data, or the powers of two up to
/// it when data does not divide batch; ascending.
std::vector<int64_t> microBatchCandidates(const Plan &plan);

/// The largest micro-batch (among microBatchCandidates, at most `atMost` when positive) whose
/// peak memory per device is at most `memoryLimit`; nullopt when none fits or none can be
/// lowered. `tried` (optional) receives each candidate's peak, largest first. `bisect`: assume
/// the peak grows with the micro-batch (the activations do) and bisect — the smallest
/// candidate first, then about log2 of the rest, each a re-lowered graph — with `tried` in
/// the order tried; where the peak is not monotone the answer fits but may not be the largest.
std::optional<Candidate> largestMicroBatch(AnalysisManager &trials, double memoryLimit, int64_t atMost = 0,
                                           std::vector<std::pair<int64_t, double>> *tried = nullptr,
                                           bool bisect = false);

/// The fewest data-parallel devices (tensor and pipeline degrees kept; ZeRO stage `zero`)
/// whose analysis meets `goal`. Candidates are data degrees dividing batch / micro_batch (a
/// given micro-batch is kept; one derived from the batch is re-derived as batch / data).
/// Nullopt when no candidate meets the goal. `tried` (optional) receives every candidate
/// analysed, in order. `bisect`: assume the goal, once met, stays met with more devices (true
/// of fitting in memory: ZeRO shards and a derived micro-batch shrink with data) and find
/// the first by bisection — about log2 of the candidates analysed instead of all of them;
/// where the goal is not monotone the answer meets it but may not be the fewest.
/// `memoryLimit`: the goal includes a peak within it, so a candidate whose model states alone
/// exceed it (modelStatesFloor) fails the goal without being analysed (nor put in `tried`).
std::optional<Candidate> fewestDevices(AnalysisManager &trials, int zero,
                                       const std::function<bool(const Trial &)> &goal,
                                       std::vector<Candidate> *tried = nullptr,
                                       bool bisect = false, double memoryLimit = HUGE_VAL);

/// `tally solve micro-batch`: the largest micro-batch whose peak memory per device fits in
/// `memoryLimit` (bytes), and the accumulation steps it implies.
SolverAnswer solveMicroBatch(const Analysis &a, const Relower &relower, double memoryLimit);

/// `tally solve devices`: the fewest devices (data parallel, the plan's tensor and pipeline
/// degrees and ZeRO stage) whose peak memory per device fits in `memoryLimit`; the derivation
/// also says what ZeRO-3 would need.
SolverAnswer solveDevices(const Analysis &a, const Relower &relower, double memoryLimit);

/// One parallel layout of a plan, priced by the whole analysis.
struct ParallelLayout {
  int64_t tensor = 1, pipeline = 1, interleave = 1, data = 1, microBatch = 1;
  int zero = 0;
  std::string checkpoint = "none";
  Trial trial;
  int64_t expert = 1; ///< the expert degree (a mixture of experts; 1 otherwise)
};

/// What `searchLayouts` found and how much work it did.
struct LayoutSearch {
  std::vector<ParallelLayout> best;    ///< at most `keep`, by step time (ties: fewer model-parallel ranks, …)
  int64_t heads = 0, kvHeads = 0, layers = 0; ///< the model's constraints on tensor and pipeline
  /// A mixture of experts: the greatest common divisor of its moe ops' expert counts, whose
  /// divisors are the expert degrees searched; 0 for a model without experts.
  int64_t experts = 0;
  int64_t shapes = 0;          ///< (tensor, pipeline, interleave, data) that satisfy the constraints
  int64_t prunedStatic = 0;    ///< candidates whose model states alone do not fit: never analysed
  int64_t analysed = 0;        ///< full analyses run
  int64_t fitted = 0;          ///< of those, how many fit memory and the budgets
  int64_t lowered = 0;         ///< graphs lowered (one per micro-batch)
  int64_t unpriced = 0;        ///< of the fitted, how many were not timed: their compute bound
                               ///< is slower than the `keep` best already found
  std::string error;           ///< non-empty: no layout (the devices do not factor, or nothing fits)
};

/// Searches tensor t, pipeline p, interleave v, data d, micro-batch m, ZeRO stage and
/// checkpoint policy (none, selective, full) for `devices` devices: t divides the attention
/// heads (and key/value heads) and is at most gpus_per_node, p divides the repeat-block copies,
/// v divides copies / p, t·p·d·context = devices, d divides the batch and m divides batch / d
/// (the plan's batch is kept). For a mixture of experts also the expert degree e: a divisor of
/// every moe op's expert count whose group the plan could state (ir/Plan.h expertFit: e divides
/// d, or t·context·d under the plan's folding). Each candidate is priced by the whole analysis (one graph per
/// micro-batch, lowered once); one whose model states and framework memory alone exceed
/// `memoryLimit` is pruned before any analysis, the micro-batches of a layout are tried
/// smallest first up to the first that fits under no policy, and a policy that recomputes
/// more is tried only when the previous one does not fit. A candidate fits when its peak is at
/// most `memoryLimit` and it meets the plan's step-time, MFU and run-time budgets.
/// A fitting candidate's time is priced only when it could be among the `keep` best: without
/// step-time, MFU or run-time budgets, one whose compute bound (computeBound) is slower than
/// the `keep`-th best time found so far is counted as fitted and not timed (`bound` false:
/// every fitting candidate is timed; the answers are the same).
LayoutSearch searchLayouts(const Analysis &a, const Relower &relower, int64_t devices,
                           double memoryLimit, size_t keep = 10, bool bound = true);

/// A floor under a train plan's step time from W, one micro-batch's forward, backward and
/// recompute op times over all stages (F + B + R, stepTime's step 3; Analysis::time's
/// microBatchCompute): the pipeline's slowest device does at least the mean work, W/p per
/// micro-batch, for m = batch / (micro-batch × data) micro-batches, and the other devices'
/// work fills its bubble, (p − 1)/v of the mean (passes/StepTime.cpp, pipelineStages: m·W_slow
/// + (ΣW − W_slow)/v ≥ (m + (p − 1)/v)·ΣW/p, since W_slow ≥ ΣW/p and m ≥ 1/v). The
/// optimizer, communication and host transfers only add to it.
double computeBound(double W, double m, double p, double v);

/// `tally solve layout`: the search above as an answer (the best step time in seconds), with
/// the top layouts as rows and the search's counts in the derivation.
SolverAnswer solveLayout(const Analysis &a, const Relower &relower, int64_t devices,
                         double memoryLimit);

/// `tally solve serve` (passes/SolveServe.cpp, issue 45): the largest concurrency (an infer
/// plan's batch) whose sequences of max_context tokens fit in the paged KV cache beside the
/// weights and the prefill's workspace, and whose inter-token latency (the decode step with
/// every sequence at max_context) is at most `latencyBudget` seconds (0: no budget). Bisects
/// between 1 and the sequences that fit at concurrency 1, each candidate re-lowered and
/// analysed whole; the candidates tried are the answer's rows, by concurrency.
SolverAnswer solveServe(const Analysis &a, const Relower &relower, double latencyBudget);

} // namespace tally
