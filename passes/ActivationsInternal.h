// ActivationsInternal.h — the activation-memory pass's internal declarations, shared by its
// files; not a public header (passes/Passes.h declares planActivations). The steps are those
// of passes/Activations.cpp's overview; each file holds one concern:
//   passes/Activations.cpp         the pass: planActivations applies the requested policy and
//                                  fills the memory, FLOP and checkpoint fields
//   passes/ActivationFacts.cpp     step 1: facts about the graph, and the walk memo's variants
//   passes/ActivationLiveness.cpp  steps 3-5: a policy's schedule, its liveness walk (what is
//                                  live at each step) and the peak
//   passes/ActivationPeriodic.cpp  steps 3-5 for a comparison walk of copies in segments, from
//                                  a smaller model with the middle of each run of like copies
//                                  left out (the periodic walk)
//   passes/CheckpointPolicies.cpp  step 2: the checkpoint policies (none, full, every(k),
//                                  sqrt, keep lists, selective, recompute_all, auto) and how
//                                  each decides what is kept and what re-run
//   passes/CheckpointNested.cpp    step 2: nested recomputation, auto's chain over the copies
//                                  (CheckpointChain.h solves it)
//   passes/ActivationReport.cpp    what the reports read: each copy's activations, the applied
//                                  plan per copy, the trade-off curve, the checkpoint note
#pragma once

#include "passes/GradientShares.h"

#include "passes/CheckpointChain.h"
#include "passes/Passes.h"
#include "passes/KeptEntries.h"

#include <algorithm>
#include <array>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace tally {

struct ChainParts; // passes/CheckpointNested.cpp

/// The facts of step 1 that the graph alone decides (with its ops' saved lists, which
/// autodiff's rules derive from the graph) and whether the plan trains: built once per graph
/// and kept in its walk memo, since the budget fixes and the layout search gather facts for
/// every candidate and only the layout's part (splits, op times, buffer sizes) changes.
struct FactsStructure {
  /// Per stored tensor, ops in op order, each once (TensorLists: a list per tensor was a
  /// third of the facts' cost).
  using PerTensor = TensorLists;
  /// per op: the stored activations it reads, those its backward keeps, those it writes
  /// (each once), and the indexes in a.savedOf(o) of its extra buffers (no tensor); flat
  /// lists with per-op offsets (the layout search builds these facts thousands of times).
  struct PerOp {
    std::vector<uint32_t> start{0}, items;
    llvm::ArrayRef<uint32_t> of(OpId o) const {
      return llvm::ArrayRef<uint32_t>(items).slice(start[o], start[o + 1] - start[o]);
    }
    void addOnce(uint32_t x) { // to the op being built
      if (std::find(items.begin() + start.back(), items.end(), x) == items.end())
        items.push_back(x);
    }
    void close() { start.push_back(static_cast<uint32_t>(items.size())); }
  };
  const Graph *graph = nullptr;
  bool train = false;
  std::vector<uint8_t> hasBackward; ///< per op (bytes, not bits: the walks read it per step)
  PerTensor readers;             ///< per stored tensor: ops reading it (or a view)
  PerTensor savers;              ///< per stored tensor: ops whose backward keeps it
  PerOp reads, keeps, writes, extras;
  /// For the walk's gradients, per tensor: the op that makes it when the step differentiates
  /// it (training, it needs a gradient, an op makes it), else kNone; and its reader with a
  /// backward that is last in op order, whose backward starts the gradient when backward
  /// steps run in reverse op order (else kNone). Compact, so that a walk does not read every
  /// Tensor of the graph again.
  std::vector<OpId> gradProducer, gradReader;
  /// Gradients that are another's buffer (passes/GradientShares.h, training only): a member
  /// has no buffer of its own; its root's lives on to the last member's producer's backward.
  /// The graph's, made once (Analysis::gradientShares, kept alive by `sharesOnce`), or none.
  const GradientShares *shares = nullptr;
  std::shared_ptr<GradientSharesOnce> sharesOnce;
  std::vector<TensorId> sources; ///< stored activations no op makes (live from step 0)
  /// The stored activations (storageOf(t) == t, role Activation) in id order, and per op its
  /// class: what each candidate's facts read of the graph's records (gatherFacts), compactly
  /// (reading every Tensor and Op record again was most of a deep model's facts, issue 41).
  std::vector<TensorId> stored;
  std::vector<OpClass> opClasses;
  /// The moe ops, whose saved expert buffers tensor parallelism splits (markSplit: reading
  /// every Op record for them was a fifth of a deep model's facts).
  std::vector<OpId> moeOps;
  /// The ops selective and selective_wide re-run (selectivePolicy), found once per structure:
  /// they read only the graph and these facts (scanning every op per candidate was 8% of a
  /// 10,000-layer layout search).
  mutable std::mutex selectiveLock;
  mutable std::optional<std::vector<OpId>> selectiveOps[2];
  size_t backwardOps = 0;        ///< ops with a backward
  std::vector<double> tensorBytes; ///< per tensor: Graph::bytes (numel × bytes per element)
};

/// One made instance of a stored key in a walk (liveness): a tensor or an extra buffer, made
/// at step `first` (again when `recomputed`), last used at `last`, kept for a backward when
/// `saved`.
struct LiveInstance {
  uint32_t key, first, last;
  bool saved, recomputed;
};

/// The working lists of a walk. A walk of a deep model fills lists of megabytes; made anew
/// in every walk, their pages were zeroed by the kernel every time (a third of a
/// 10,000-layer `auto` search with an impossible budget). Walks run one at a time, so the
/// walks of one graph share these (WalkMemo::scratch), each starting them afresh.
struct WalkScratch {
  /// Every instance in the order made (ListedInstances), or per key its newest
  /// (OpenInstances): one list, so that the walks of a report, which do both, fill one.
  std::vector<LiveInstance> inst;
  std::vector<uint32_t> current, bwd;
  std::vector<std::pair<TensorId, uint32_t>> shareEnds; ///< per shared gradient buffer: its last step
  std::vector<double> saved, other; ///< LiveDeltas
  /// The schedule of the last walk whose caller read none (compareWalk), for the next walk
  /// to fill.
  std::vector<ScheduleStep> schedule;
};

/// What a walk that only finds the live bytes per step reads of a model (steps 3-5): the
/// graph's facts (FactsStructure) and the buffers' bytes, or those of a smaller model made of
/// some of its copies (passes/ActivationPeriodic.cpp: the periodic walk). Keys as in liveness:
/// a stored tensor's key is its id, op o's k-th extra buffer is tensors + extraStart[o] + k.
struct WalkModel {
  size_t ops = 0, tensors = 0, backwardOps = 0;
  const std::vector<uint8_t> *hasBackward = nullptr;
  const FactsStructure::PerOp *reads = nullptr, *keeps = nullptr, *writes = nullptr;
  const std::vector<uint32_t> *extraStart = nullptr; ///< per op and one past the last
  const std::vector<TensorId> *sources = nullptr;
  const std::vector<OpId> *gradProducer = nullptr, *gradReader = nullptr;
  const GradientShares *shares = nullptr;
  /// Per stored tensor, its readers (a walk whose backward is not in reverse op order reads
  /// them); null in a smaller model, whose walk then gives way to the whole one.
  const FactsStructure::PerTensor *readers = nullptr;
  const std::vector<double> *tensorBuffer = nullptr, *extraBuffer = nullptr;
  const std::vector<std::pair<OpId, double>> *backwardScratch = nullptr; ///< Facts::backwardScratch, in this model's op ids
  const std::vector<RepeatCopies::Copy> *copies = nullptr;
  uint32_t extraCount(OpId o) const { return (*extraStart)[o + 1] - (*extraStart)[o]; }
  double keyBuffer(uint32_t key) const {
    return key < tensors ? (*tensorBuffer)[key] : (*extraBuffer)[key - tensors];
  }
};

/// Which copies of the repeated blocks are the same as the copy before them in everything a
/// walk reads (passes/ActivationPeriodic.cpp, periodicCopies): the same number of ops, their
/// op ids, keys and extra buffers one copy's count further on, the same backward flags, the same
/// read, kept and written lists (a key of the copy or of the copy before it one copy further
/// on, any other key the same), gradient producers, readers and shared buffers, and the same
/// bytes. Compared exactly, once per walk memo variant (the bytes are the variant's).
struct PeriodicCopies {
  bool built = false;
  /// Per copy: the same as the copy before it, with the strides below (false for copy 0).
  std::vector<uint8_t> same;
  uint32_t opStride = 0, tensorStride = 0, extraStride = 0;
  /// The maximal runs [first, last] of copies each the same as the one before it.
  std::vector<std::pair<uint32_t, uint32_t>> runs;
};

/// Analysis::walks: the walks (steps 3-5) done on one graph that listed no buffers, so a policy
/// tried again (the budget fixes try sqrt, full and auto's candidates under each ZeRO stage and
/// device count; the layout search thousands of layouts) is not walked again. A walk reads the
/// graph and, from the analysis, the facts of step 1 that depend on the plan: the
/// tensor-parallel degree, sequence parallelism, training, and per op its forward FLOPs, its
/// roofline time and its saved list. A variant holds the walks done under one such set of
/// facts, compared exactly (not hashed), so a memo shared by analyses that differ there keeps
/// their walks apart.
struct WalkMemo {
  struct Summary {
    double recomputeFlops = 0, recomputeExecuted = 0, recomputeTime = 0;
    double peakSaved = 0, peakOther = 0;
    uint32_t peakStep = 0;
    /// The schedule's Recompute steps in order, once a candidate priced alone applied this
    /// policy (planActivations): what its step time reads of the schedule.
    std::shared_ptr<const std::vector<ScheduleStep>> recomputeSteps;
  };
  /// The facts a walk reads, compactly: the plan's three, the saved lists (shared with the
  /// analysis) and per op an index into the (roofline time, FLOPs, executed FLOPs) triples
  /// (a copy of every op's numbers was 144 MB of a 100,000-layer check).
  struct FactsKey {
    double tensorDegree = 1, train = 0, sequenceParallel = 0;
    std::shared_ptr<const Analysis::SavedLists> saved;
    /// Analysis::fp8.savedBytes: the stored tensors' bytes under an fp8 recipe (null: g.bytes)
    std::shared_ptr<const std::vector<double>> fp8Bytes;
    /// The padded head's logits and their growth V'/V (Facts::padLogits; kNone and 1: none).
    TensorId padLogits = kNone;
    double padGrow = 1;
    std::vector<uint32_t> opFacts;               ///< per op
    std::vector<std::array<double, 3>> triples;  ///< as few as the ops' records allow
  };
  struct Variant {
    FactsKey facts;
    std::unordered_map<std::string, Summary> walks; ///< by the policy's schedule (policyKey)
    /// Auto's chain under these facts (buildChain): its stages' sizes in bytes, which the
    /// facts alone decide (null until first built, or when there is no chain), and the last
    /// program solved with its unit: a later limit with the same unit and a budget the
    /// solution covers reads it (the budget fixes try auto under many device counts).
    std::shared_ptr<const ChainParts> chainParts;
    bool chainPartsBuilt = false;
    double chainUnit = 0;
    std::shared_ptr<const ChainSolution> chainSolution;
    size_t chainSolves = 0;
    /// Per copy, what it keeps and reads (Analysis::blockActivations), which the facts decide;
    /// empty until first computed.
    std::vector<Analysis::BlockActivations> blocks;
    bool blocksBuilt = false;
    /// Which copies are the same under these facts (the periodic walk), once built.
    PeriodicCopies periodic;
    size_t periodicWalks = 0; ///< walks answered by the periodic walk
  };
  std::vector<std::unique_ptr<Variant>> variants;
  size_t reused = 0;
  WalkScratch scratch; ///< the working lists its walks share, one walk at a time
  /// The graph's facts (FactsStructure), built on first use; how many times one was built.
  std::shared_ptr<const FactsStructure> structure;
  size_t structures = 0;
};

struct TensorParallel;

/// The part of the walks' facts (activations::Facts) that a layout decides, made by
/// gatherFacts: which stored tensors tensor parallelism splits, each op's roofline time, each
/// buffer's bytes on one device, the ops whose backward holds scratch bytes, and the walk
/// memo's variant for these facts.
struct LayoutFacts {
  std::vector<bool> split;
  std::vector<double> opTime;
  std::vector<double> tensorBuffer, extraBuffer;
  std::vector<std::pair<OpId, double>> backwardScratch;
  WalkMemo::Variant *walked = nullptr;
};

/// Analysis::layoutFacts: the layout facts last made, by what gatherFacts computes them from
/// besides the target (which the candidates of one AnalysisManager share): the walk memo and
/// the tensor-parallel split (both per graph part: its graph and op costs; the split's key
/// is the tensor degree, context, sequence parallelism, tensorStep and training), the saved
/// lists, the fp8 bytes, the head's padding and a shared host's share. The layout search's
/// candidates that differ only in pipeline, interleave, data, ZeRO or checkpoint policy read
/// one entry instead of each computing the facts (O(ops) each: a third of a 10,000-layer
/// search). The key holds what it names alive, so no address is reused.
struct LayoutFactsMemo {
  struct Key {
    std::shared_ptr<WalkMemo> walks;
    std::shared_ptr<const TensorParallel> tensorParallel;
    std::shared_ptr<const Analysis::SavedLists> saved;
    std::shared_ptr<const std::vector<double>> fp8Bytes;
    TensorId padLogits = kNone;
    double padGrow = 1;
    double share = 1; ///< Target::share: a rank's part of a shared host scales the op times
    bool operator==(const Key &o) const {
      return walks == o.walks && tensorParallel == o.tensorParallel && saved == o.saved &&
             fp8Bytes == o.fp8Bytes && padLogits == o.padLogits && padGrow == o.padGrow &&
             share == o.share;
    }
  };
  explicit LayoutFactsMemo(size_t keep) : entries(keep) {}
  KeptEntries<Key, std::shared_ptr<const LayoutFacts>> entries;
};

namespace activations {

/// A copy of a repeated block ("h[3]") and the ops written in it or below it (ir/Graph.h).
using Copy = RepeatCopies::Copy;

struct Facts {
  const Graph &g;
  bool train;
  double tensorDegree;
  /// The graph's part of the facts (FactsStructure, shared per graph) and its members.
  std::shared_ptr<const FactsStructure> structure;
  const std::vector<uint8_t> &hasBackward;
  const FactsStructure::PerTensor &readers, &savers;
  const FactsStructure::PerOp &reads, &keeps, &writes, &extras;
  uint32_t extraCount(OpId o) const { return extras.start[o + 1] - extras.start[o]; }
  /// The nested-recomputation chain, solved on first use (nestedPolicy).
  mutable std::shared_ptr<std::optional<struct Chain>> chain;
  /// The layout's part (LayoutFacts), shared with the analyses that read the same; its
  /// members follow.
  std::shared_ptr<const LayoutFacts> layout;
  /// Analysis::walks (or null) and its walks done under these facts.
  WalkMemo *memo = nullptr;
  WalkMemo::Variant *walked = nullptr;
  const std::vector<bool> &split;             ///< per stored tensor: split by tensor parallelism
  /// The repeat copies (Analysis::copies): in the order of their first op, and per op the
  /// index of its copy or kNone.
  const std::vector<Copy> &copies;
  const std::vector<uint32_t> &copyOfOp;
  /// per op: roofline seconds of its forward on the target (executed FLOPs and bytes at the
  /// op's compute dtype, before any parallel split): what recomputing it costs.
  const std::vector<double> &opTime;
  /// The per-op records the walks read the re-run FLOPs from: the analysis's, or a copy of
  /// them kept by walks that run while later passes write the analysis's (planActivations).
  const OpTable *ops;
  /// The bytes a buffer takes on one device, rounded up to whole bytes: per stored tensor
  /// (bytes(t)), and per extra buffer in the order of extras.items (a walk makes millions of
  /// buffers; these are computed once).
  const std::vector<double> &tensorBuffer, &extraBuffer;
  /// (op, whole bytes on one device) of each op whose backward holds bytes only while it runs
  /// (ForwardCost::backwardScratch: the eager loss), in op order; few or none.
  const std::vector<std::pair<OpId, double>> &backwardScratch;
  /// The whole bytes of a walk's key (liveness): a stored tensor's (keys below the tensor
  /// count), else an extra buffer's.
  double keyBuffer(uint32_t key) const {
    return key < tensorBuffer.size() ? tensorBuffer[key] : extraBuffer[key - tensorBuffer.size()];
  }

  Facts(const Analysis &a, std::shared_ptr<const FactsStructure> st,
        std::shared_ptr<const LayoutFacts> lf)
      : g(*a.graph), train(a.plan->isTrain),
        tensorDegree(static_cast<double>(std::max<int64_t>(1, a.plan->parallel.tensor))),
        structure(std::move(st)), hasBackward(structure->hasBackward),
        readers(structure->readers), savers(structure->savers), reads(structure->reads),
        keeps(structure->keeps), writes(structure->writes), extras(structure->extras),
        layout(std::move(lf)), walked(layout->walked), split(layout->split),
        copies(a.copies->copies), copyOfOp(a.copies->ofOp), opTime(layout->opTime), ops(&a.ops),
        tensorBuffer(layout->tensorBuffer), extraBuffer(layout->extraBuffer),
        backwardScratch(layout->backwardScratch),
        tensorBytes(a.fp8.savedBytes ? *a.fp8.savedBytes : structure->tensorBytes),
        padLogits(a.headPad.applies() ? a.headPad.logits : kNone),
        padGrow(a.headPad.applies() ? static_cast<double>(a.headPad.padded) / static_cast<double>(a.headPad.vocab)
                                    : 1.0) {}

  /// The view of this graph's facts and bytes that the walks read (WalkModel).
  WalkModel model() const {
    WalkModel m;
    m.ops = g.ops.size();
    m.tensors = g.tensors.size();
    m.backwardOps = structure->backwardOps;
    m.hasBackward = &hasBackward;
    m.reads = &reads, m.keeps = &keeps, m.writes = &writes;
    m.extraStart = &extras.start;
    m.sources = &structure->sources;
    m.gradProducer = &structure->gradProducer, m.gradReader = &structure->gradReader;
    m.shares = structure->shares;
    m.readers = &readers;
    m.tensorBuffer = &tensorBuffer, m.extraBuffer = &extraBuffer;
    m.backwardScratch = &backwardScratch;
    m.copies = &copies;
    return m;
  }
  bool isActivation(TensorId t) const { return g.tensors[t].role == TensorRole::Activation; }
  /// Per stored tensor, its bytes on the whole graph: the graph's, or under an fp8 recipe
  /// those of Analysis::fp8.savedBytes (a GEMM input kept in fp8).
  const std::vector<double> &tensorBytes;
  /// The generated step's padded head (passes/HeadPadding.h): its logits are V'/V times the
  /// forward graph's (the step holds [.., V']), and so are their gradient's buffers.
  TensorId padLogits;
  double padGrow;
  /// Bytes of a stored tensor on one device (its tensor-parallel share).
  double bytes(TensorId t) const {
    return tensorBytes[t] / (split[t] ? tensorDegree : 1) * (t == padLogits ? padGrow : 1.0);
  }
  /// Whether an op's extra saved buffers (masks, statistics) are split: when its output is.
  bool opSplit(const Op &op) const { return !op.outputs.empty() && split[g.storageOf(op.outputs[0])]; }
  /// Whether an op's extra buffers and backward scratch are split over the tensor group: as its
  /// first output, or, for an op whose first output is a scalar (cross_entropy's loss), as its
  /// first input (the vocabulary-parallel logits).
  bool buffersSplit(const Op &op) const {
    if (!op.outputs.empty() && g.tensors[op.outputs[0]].shape.empty() && !op.inputs.empty())
      return split[g.storageOf(op.inputs[0])];
    return opSplit(op);
  }
};

/// What one micro-batch's walk is multiplied by for a whole optimizer step: `flops` for its
/// FLOPs (batch / micro_batch micro-batches over all replicas, as OpCosts counts the model's),
/// `seconds` for its op times to give one device's (StepTime.cpp: the device runs m = batch /
/// (micro_batch · data) micro-batches through 1/pipeline of the copies; the op times are
/// already its tensor and context share).
struct StepScale {
  double flops = 1, seconds = 1;
};

/// A policy: which copies are recomputed, grouped in segments of consecutive copies (each
/// segment keeps only its input and is re-run as a whole before its first backward step).
struct Policy {
  std::string name = "none";
  std::vector<std::pair<size_t, size_t>> segments; ///< [first copy, end copy), in order
  /// recompute_all: one segment of all copies, re-run from copy 0 before each copy's backward
  /// (walkFromInput) instead of once.
  bool fromInput = false;
  /// selective: ops re-run alone, just before the first backward step that needs their
  /// outputs (their outputs are dropped after the forward; selectiveOps below).
  std::vector<OpId> selectiveOps;
  /// Megatron's selective: the selected ops (the attention core) keep their outputs from the
  /// forward for the ops that read them (the output projection keeps its input, the context),
  /// and are re-run just before their own backward, for their buffers alone (scores,
  /// probabilities, dropout mask).
  bool selectiveKeepsOutputs = false;
  /// keep lists: sets of ops (the copies' ops outside the kept paths), each re-run as a
  /// segment before its first backward step.
  std::vector<std::vector<OpId>> opSegments;
  /// nested recomputation (auto's dynamic program): the whole schedule, written out.
  std::vector<ScheduleStep> steps;
  size_t recomputedCopies = 0; ///< nested: the copies re-run at least once
  size_t reselected = 0;       ///< nested: selective ops re-run alone before their stage's backward
  /// The copies recomputed.
  size_t checkpointed() const {
    size_t n = recomputedCopies + opSegments.size();
    for (const auto &sg : segments)
      n += sg.second - sg.first;
    return n;
  }
  /// The longest segment (copies), 0 when nothing is checkpointed.
  size_t segment() const {
    size_t k = opSegments.empty() ? 0 : 1;
    for (const auto &sg : segments)
      k = std::max(k, sg.second - sg.first);
    return k;
  }
};

struct Walk {
  std::vector<ScheduleStep> schedule;
  std::vector<Buffer> buffers;
  double recomputeFlops = 0, recomputeExecuted = 0; ///< per micro-batch
  double recomputeTime = 0; ///< roofline seconds of the re-run ops, per micro-batch
  double peakSaved = 0, peakOther = 0;
  uint32_t peakStep = 0;
  WalkMemo::Summary *memo = nullptr; ///< this policy's entry in the walk memo, if any
  /// Per copy (when asked): the bytes its ops' first runs keep past the forward (perBlock).
  std::vector<double> keptPerCopy;
};

using TradeOffPoint = decltype(Analysis::checkpoint)::Point;

// Step 1 (passes/ActivationFacts.cpp): the graph's part of the facts, and all of them.
std::shared_ptr<const FactsStructure> structureOf(const Analysis &a);
StepScale stepScale(const Plan &plan);
Facts gatherFacts(const Analysis &a);

// Steps 3-5 (passes/ActivationLiveness.cpp): a policy's schedule and walk; the bytes per device.
void buildSchedule(const Facts &f, const Policy &p, Walk &w);
Walk walk(const Facts &f, const Analysis &a, const Policy &p, bool keepBuffers,
          std::optional<int64_t> *alignedSum = nullptr, bool perCopy = false,
          bool readsSchedule = true);
Walk compareWalk(const Facts &f, const Analysis &a, const Policy &p);
/// The live bytes per step of a segment policy's schedule over a model (the periodic walk's
/// smaller one): the deltas in scratch.saved and scratch.other (one more than the steps), and
/// per step its op in `stepOps`. False when its backward steps do not run in reverse op order
/// (the smaller model lists no readers).
bool profileWalk(const WalkModel &m, const std::vector<std::pair<size_t, size_t>> &segments,
                 WalkScratch &scratch, std::vector<OpId> &stepOps);

// The periodic walk (passes/ActivationPeriodic.cpp): a compare walk of a segment policy
// priced from a model with the middle of each run of like copies left out.
std::optional<Walk> periodicWalk(const Facts &f, const Policy &p);
double pipelineFactor(const Plan &plan);
double contextShare(const Plan &plan);
double deviceActivations(const Walk &w, const Plan &plan);
double deviceBytes(const Walk &w, const Plan &plan);

// Step 2 (passes/CheckpointPolicies.cpp): the policies.
bool selectable(const Facts &f, OpId o, bool wide);
Policy selectivePolicy(const Facts &f, bool wide);
bool copiesContiguous(const Facts &f);
double staticBytes(const Analysis &a);
Policy partialPolicy(size_t m, size_t copies);
Policy requestedPolicy(const Facts &f, Analysis &a, StepScale scale, std::string req);

// Step 2 (passes/CheckpointNested.cpp): nested recomputation for a limit.
std::optional<Policy> nestedPolicy(const Facts &f, const Analysis &a, double limit,
                                   bool searchUp = true);

// The report (passes/ActivationReport.cpp).
void blockActivations(const Facts &f, Analysis &a);
std::vector<std::string> keptPaths(const Facts &f, const Policy &p);
void perBlock(const Facts &f, const Walk &w, Analysis &a);
TradeOffPoint curvePoint(const Analysis &a, const std::string &name, int64_t checkpointed,
                         const Walk &w, StepScale scale);
void tradeOffCurve(const Facts &f, Analysis &a, const TradeOffPoint &own, StepScale scale);
void checkpointNote(const Facts &f, const Policy &p, Analysis &a);

} // namespace activations
} // namespace tally
