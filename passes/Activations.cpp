// Activation memory: the forward-then-backward schedule, the checkpoint policy, the liveness
// walk over saved tensors, transients and gradients, and the memory plan (buffers placed in one
// arena). docs/memory.md explains every rule with a worked GPT-2 example.
//
// 1. Facts about the graph, computed once: each tensor's storage (a view counts as the tensor
//    it views), which ops have a backward (some input needs a gradient), who reads and who
//    saves each stored tensor, which tensors tensor parallelism splits (Megatron: a weight
//    matmul on a full input is column-parallel and splits its output, one on a split input is
//    row-parallel and all-reduces; elementwise ops, views and attention keep their input's
//    split; reductions and embeddings give full tensors), and the repeat-block copies (the
//    instances whose parent is a `repeat` list; an op belongs to the outermost copy above it).
// 2. A policy recomputes segments of consecutive copies (each keeps only its input): none is
//    no segment; full is every copy alone; every(k) is all L copies in segments of k; sqrt is
//    all copies in segments of the length k in 1..L whose walk (steps 3-5) needs the least
//    memory (Chen et al.'s minimum, measured rather than ⌈√L⌉); keep [paths] re-runs each copy
//    less the listed blocks or ops; selective re-runs single cheap ops. auto takes the least
//    recompute time (roofline seconds of the re-run ops) whose activations and workspace per
//    device fit the target's memory (or a smaller memory budget) minus the model states,
//    among the first m copies (graph order), the m copies that save the most bytes per second
//    of recompute (m found by bisection in each), selective, and nested recomputation: the
//    chain program of CheckpointChain.h (Rotor) over the ops before the copies, the copies and
//    the ops after them, whose schedule may re-run a copy several times; then sqrt and
//    recompute_all when nothing fits.
// 3. The schedule: the forward of every op in order, then the backward of every op that has
//    one in reverse order; just before the first backward step of a checkpointed segment, the
//    forward of all its ops runs again (Recompute steps). recompute_all and nested plans write
//    their schedules out whole (an op may then be re-run several times).
// 4. Liveness, over any schedule (liveness()): every run of an op makes a new instance of each
//    activation it writes and of its extra saved buffers (masks, statistics); each later step
//    reading the tensor uses its newest instance — a forward or recompute as an input, the
//    op's backward what it keeps. An instance lives from the step that makes it to its last
//    use, Saved when a backward uses it, else Transient. So an activation made in a recomputed
//    segment lives in the forward only to its last forward reader, and again from its re-run
//    to its backward. An activation's gradient lives from the backward of its last reader
//    (which starts it) to the backward of its producer (which consumes it). Each buffer is
//    Saved or workspace (Transient, Gradient).
// 5. The peak: sweep the buffers over the steps; the step with the most bytes live is the peak;
//    memory.activations is the Saved bytes live there, memory.workspace the rest. Pipeline
//    parallelism (1F1B) holds 1/pp of the layers but min(pp, micro-batches) micro-batches in
//    flight on its first stage, so the Saved bytes are scaled by that over pp.
// 6. The buffers are placed in the arena by passes/MemoryPlan.cpp (integer, aligned offsets).
// 7. Totals: recompute FLOPs per step (model FLOPs of the re-run forward; executed FLOPs add the
//    executed count to flops.executed), and memory.peak = model states + activations +
//    workspace.
//
// Infer plans have no backward: the walk covers the forward only, nothing is saved, and the
// transients at the peak are the workspace.
#include "passes/CheckpointChain.h"
#include "passes/Passes.h"
#include "passes/Solvers.h"

#include <array>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include <algorithm>
#include <cmath>
#include <optional>

namespace tally {

struct ChainParts;

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
  std::vector<TensorId> sources; ///< stored activations no op makes (live from step 0)
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
  std::vector<double> saved, other; ///< LiveDeltas
  /// The schedule of the last walk whose caller read none (compareWalk), for the next walk
  /// to fill.
  std::vector<ScheduleStep> schedule;
};

/// Room for `need` elements in a scratch list (the schedule, the deltas). A list that must
/// grow takes room for twice as many: the walks of one analysis grow longer (a curve's from
/// none to full), and growing the list for each mapped and zeroed new pages each time; room
/// never written is never touched.
template <class T> void reserveScratch(std::vector<T> &v, size_t need) {
  if (v.capacity() < need) {
    v.clear();
    v.reserve(2 * need);
  }
}
/// A scratch list of `need` elements of `value`, in room reserveScratch made.
template <class T> void assignScratch(std::vector<T> &v, size_t need, const T &value) {
  reserveScratch(v, need);
  v.assign(need, value);
}

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
  };
  std::vector<std::unique_ptr<Variant>> variants;
  size_t reused = 0;
  WalkScratch scratch; ///< the working lists its walks share, one walk at a time
  /// The graph's facts (FactsStructure), built on first use; how many times one was built.
  std::shared_ptr<const FactsStructure> structure;
  size_t structures = 0;
};

std::shared_ptr<WalkMemo> newWalkMemo() { return std::make_shared<WalkMemo>(); }

WalkMemoStats walkMemoStats(const WalkMemo &memo) {
  WalkMemoStats s;
  s.reused = memo.reused;
  s.variants = memo.variants.size();
  s.structures = memo.structures;
  for (const auto &v : memo.variants) {
    s.walks += v->walks.size();
    s.chainSolves += v->chainSolves;
  }
  return s;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Step 1: facts about the graph.

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
  /// Analysis::walks (or null) and its walks done under these facts.
  WalkMemo *memo = nullptr;
  WalkMemo::Variant *walked = nullptr;
  std::vector<bool> split;                    ///< per stored tensor: split by tensor parallelism
  /// The repeat copies (Analysis::copies): in the order of their first op, and per op the
  /// index of its copy or kNone.
  const std::vector<Copy> &copies;
  const std::vector<uint32_t> &copyOfOp;
  /// per op: roofline seconds of its forward on the target (executed FLOPs and bytes at the
  /// op's compute dtype, before any parallel split): what recomputing it costs.
  std::vector<double> opTime;
  /// The per-op records the walks read the re-run FLOPs from: the analysis's, or a copy of
  /// them kept by walks that run while later passes write the analysis's (planActivations).
  const OpTable *ops;
  /// The bytes a buffer takes on one device, rounded up to whole bytes: per stored tensor
  /// (bytes(t)), and per extra buffer in the order of extras.items (a walk makes millions of
  /// buffers; these are computed once).
  std::vector<double> tensorBuffer, extraBuffer;
  /// The whole bytes of a walk's key (liveness): a stored tensor's (keys below the tensor
  /// count), else an extra buffer's.
  double keyBuffer(uint32_t key) const {
    return key < tensorBuffer.size() ? tensorBuffer[key] : extraBuffer[key - tensorBuffer.size()];
  }

  Facts(const Analysis &a, std::shared_ptr<const FactsStructure> st)
      : g(*a.graph), train(a.plan->isTrain),
        tensorDegree(static_cast<double>(std::max<int64_t>(1, a.plan->parallel.tensor))),
        structure(std::move(st)), hasBackward(structure->hasBackward),
        readers(structure->readers), savers(structure->savers), reads(structure->reads),
        keeps(structure->keeps), writes(structure->writes), extras(structure->extras),
        copies(a.copies->copies), copyOfOp(a.copies->ofOp), ops(&a.ops) {}

  bool isActivation(TensorId t) const { return g.tensors[t].role == TensorRole::Activation; }
  /// Bytes of a stored tensor on one device (its tensor-parallel share).
  double bytes(TensorId t) const {
    return structure->tensorBytes[t] / (split[t] ? tensorDegree : 1);
  }
  /// Whether an op's extra saved buffers (masks, statistics) are split: when its output is.
  bool opSplit(const Op &op) const { return !op.outputs.empty() && split[g.storageOf(op.outputs[0])]; }
};

/// Megatron's split, propagated in topological order (see step 1 above).
void markSplit(Facts &f) {
  const Graph &g = f.g;
  f.split.assign(g.tensors.size(), false);
  if (f.tensorDegree <= 1)
    return;
  for (const Op &op : g.ops) {
    bool out = false;
    if (op.kind == OpKind::Matmul && op.inputs.size() == 2 &&
        g.isParamStorage(op.inputs[0]) != g.isParamStorage(op.inputs[1])) {
      TensorId x = g.isParamStorage(op.inputs[0]) ? op.inputs[1] : op.inputs[0];
      out = !f.split[g.storageOf(x)];
    } else if (opClass(op.kind) != OpClass::Reduction && op.kind != OpKind::CrossEntropy &&
               op.kind != OpKind::Embedding) {
      for (TensorId t : op.inputs)
        out = out || f.split[g.storageOf(t)];
    }
    // moe's saved expert buffers (outputs 1-4) are split like an MLP's hidden; y is whole.
    for (size_t i = 0; i < op.outputs.size(); ++i)
      f.split[g.storageOf(op.outputs[i])] = op.kind == OpKind::Moe ? i > 0 : out;
  }
}

/// The facts a walk reads of op `o`: its roofline time, FLOPs and executed FLOPs.
std::array<double, 3> opFacts(const Facts &f, const Analysis &a, OpId o) {
  const OpAnalysis &oa = a.ops[o];
  return {f.opTime[o], oa.forward.flops, oa.forward.executedFlops};
}

/// Whether `key` holds these facts, compared exactly (numbers by ==, the saved lists by
/// content unless they are the same lists). O(ops); no list is built to compare (a
/// 10,000-layer key is millions of numbers; building one per candidate was most of the
/// facts' cost once the graph's part was shared).
bool sameFacts(const WalkMemo::FactsKey &key, const Facts &f, const Analysis &a) {
  if (key.tensorDegree != f.tensorDegree || key.train != (f.train ? 1.0 : 0.0) ||
      key.sequenceParallel != (a.plan->parallel.sequenceParallel ? 1.0 : 0.0) ||
      key.opFacts.size() != f.g.ops.size())
    return false;
  if (key.saved != a.saved) {
    if (!key.saved || !a.saved || key.saved->from != a.saved->from ||
        key.saved->items.size() != a.saved->items.size())
      return false;
    for (size_t i = 0; i < a.saved->items.size(); ++i)
      if (key.saved->items[i].tensor != a.saved->items[i].tensor ||
          key.saved->items[i].bytes != a.saved->items[i].bytes)
        return false;
  }
  for (OpId o = 0; o < f.g.ops.size(); ++o)
    if (key.triples[key.opFacts[o]] != opFacts(f, a, o))
      return false;
  return true;
}

/// The variant of `memo` whose facts are these (WalkMemo), made when there is none.
WalkMemo::Variant *memoVariant(WalkMemo &memo, const Facts &f, const Analysis &a) {
  for (const auto &v : memo.variants)
    if (sameFacts(v->facts, f, a))
      return v.get();
  auto v = std::make_unique<WalkMemo::Variant>();
  WalkMemo::FactsKey &key = v->facts;
  key.tensorDegree = f.tensorDegree;
  key.train = f.train ? 1.0 : 0.0;
  key.sequenceParallel = a.plan->parallel.sequenceParallel ? 1.0 : 0.0;
  key.saved = a.saved;
  // Ops sharing a record (OpTable) mostly share their triple: the one last made for the
  // record is tried first, compared bit for bit.
  key.opFacts.resize(f.g.ops.size());
  std::vector<uint32_t> lastOfRecord(a.ops.recordSlots(), kNone);
  for (OpId o = 0; o < f.g.ops.size(); ++o) {
    std::array<double, 3> t = opFacts(f, a, o);
    uint32_t &k = lastOfRecord[a.ops.recordOf(o)];
    if (k == kNone || std::memcmp(key.triples[k].data(), t.data(), sizeof t) != 0) {
      k = static_cast<uint32_t>(key.triples.size());
      key.triples.push_back(t);
    }
    key.opFacts[o] = k;
  }
  memo.variants.push_back(std::move(v));
  return memo.variants.back().get();
}

/// The graph's part of the facts: which ops have a backward, each stored activation's
/// readers and savers, each op's reads, keeps, writes and extra buffers.
std::shared_ptr<const FactsStructure> buildStructure(const Analysis &a) {
  const Graph &g = *a.graph;
  auto st = std::make_shared<FactsStructure>();
  FactsStructure &f = *st;
  f.graph = &g;
  f.train = a.plan->isTrain;
  auto isActivation = [&](TensorId t) { return g.tensors[t].role == TensorRole::Activation; };
  f.hasBackward.assign(g.ops.size(), false);
  // (tensor, op) pairs in op order, each once: an op's pairs are consecutive per tensor.
  std::vector<std::pair<TensorId, OpId>> readers, savers;
  std::vector<OpId> lastReader(g.tensors.size(), kNone), lastSaver(g.tensors.size(), kNone);
  // Room for the lists as a transformer's ops fill them (about two activations read and one
  // kept or written per op), so that a deep model's are not copied as they grow.
  size_t n = g.ops.size();
  for (FactsStructure::PerOp *list : {&f.reads, &f.keeps, &f.writes, &f.extras})
    list->start.reserve(n + 1);
  f.reads.items.reserve(2 * n);
  f.writes.items.reserve(n);
  f.keeps.items.reserve(n);
  readers.reserve(2 * n);
  savers.reserve(n);
  auto addOnce = [](std::vector<std::pair<TensorId, OpId>> &pairs, std::vector<OpId> &last,
                    TensorId t, OpId o) {
    if (last[t] != o)
      pairs.push_back({t, o}), last[t] = o;
  };
  for (OpId o = 0; o < g.ops.size(); ++o) {
    const Op &op = g.ops[o];
    for (TensorId t : op.inputs) {
      f.hasBackward[o] = f.hasBackward[o] || (f.train && g.tensors[t].requiresGrad);
      TensorId s = g.storageOf(t);
      if (isActivation(s)) {
        addOnce(readers, lastReader, s, o);
        f.reads.addOnce(s);
      }
    }
    for (TensorId t : op.outputs) {
      TensorId s = g.storageOf(t);
      if (isActivation(s) && g.tensors[s].producer == o)
        f.writes.addOnce(s);
    }
    llvm::ArrayRef<SavedTensor> saved = a.savedOf(o);
    for (uint32_t i = 0; i < saved.size(); ++i) {
      if (saved[i].tensor == kNone) {
        f.extras.addOnce(i);
        continue;
      }
      TensorId s = g.storageOf(saved[i].tensor);
      if (isActivation(s)) {
        addOnce(savers, lastSaver, s, o);
        f.keeps.addOnce(s);
      }
    }
    f.reads.close();
    f.keeps.close();
    f.writes.close();
    f.extras.close();
  }
  f.readers.build(g.tensors.size(), readers);
  f.savers.build(g.tensors.size(), savers);
  f.gradProducer.assign(g.tensors.size(), kNone);
  f.gradReader.assign(g.tensors.size(), kNone);
  for (TensorId t = 0; t < g.tensors.size(); ++t) {
    const Tensor &tensor = g.tensors[t];
    if (g.storageOf(t) != t || !isActivation(t))
      continue;
    if (tensor.producer == kNone)
      f.sources.push_back(t);
    else if (f.train && tensor.requiresGrad)
      f.gradProducer[t] = tensor.producer;
    for (OpId r : f.readers[t])
      if (f.hasBackward[r])
        f.gradReader[t] = r; // readers are in op order
  }
  for (OpId o = 0; o < g.ops.size(); ++o)
    f.backwardOps += f.hasBackward[o];
  f.tensorBytes.resize(g.tensors.size());
  for (TensorId t = 0; t < g.tensors.size(); ++t)
    f.tensorBytes[t] = g.bytes(t);
  return st;
}

/// The graph's part of the facts: the walk memo's when it holds this graph's (under the same
/// training flag; the saved lists are the graph's), else built and kept there.
std::shared_ptr<const FactsStructure> structureOf(const Analysis &a) {
  const Graph &g = *a.graph;
  WalkMemo *memo = a.walks.get();
  std::shared_ptr<const FactsStructure> st;
  if (memo && memo->structure && memo->structure->graph == &g &&
      memo->structure->train == a.plan->isTrain)
    st = memo->structure;
  else
    st = buildStructure(a);
  if (memo && memo->structure != st) {
    memo->structure = st;
    ++memo->structures;
  }
  return st;
}

/// What one micro-batch's walk is multiplied by for a whole optimizer step: `flops` for its
/// FLOPs (batch / micro_batch micro-batches over all replicas, as OpCosts counts the model's),
/// `seconds` for its op times to give one device's (StepTime.cpp: the device runs m = batch /
/// (micro_batch · data) micro-batches through 1/pipeline of the copies; the op times are
/// already its tensor and context share).
struct StepScale {
  double flops = 1, seconds = 1;
};

StepScale stepScale(const Plan &plan) {
  if (!plan.isTrain)
    return {};
  double micro = static_cast<double>(plan.batch) / static_cast<double>(plan.microBatch);
  return {micro, micro / degree(plan.parallel.data) / degree(plan.parallel.pipeline)};
}

/// Step 1: the graph's part (structureOf), then the layout's.
Facts gatherFacts(const Analysis &a) {
  const Graph &g = *a.graph;
  Facts f(a, structureOf(a));
  markSplit(f);
  // Sequence parallelism (Korthikanti et al. 2022; passes/StepTime.cpp): the activations outside
  // the tensor-parallel regions are split over the sequence, so every activation is split.
  if (a.plan->parallel.sequenceParallel)
    for (TensorId t = 0; t < g.tensors.size(); ++t)
      f.split[t] = f.split[t] || f.isActivation(t);
  f.opTime.assign(g.ops.size(), 0);
  // Computed once per shared record and op class (OpTable::recordOf): a deep model's layers
  // share their records.
  // Each op's time is one device's: its work over its tensor and context split, as the step
  // time divides it (StepTime.cpp, opWorkSplits).
  struct Known {
    bool made = false;
    OpClass c = OpClass::View;
    double split = 1, time = 0;
  };
  std::vector<double> splits = opWorkSplits(g, *a.plan);
  std::vector<Known> timeOfRecord(a.ops.recordSlots());
  for (OpId o = 0; o < g.ops.size(); ++o) {
    OpClass c = opClass(g.ops[o].kind);
    Known &known = timeOfRecord[a.ops.recordOf(o)];
    if (!known.made || known.c != c || known.split != splits[o]) {
      const OpAnalysis &oa = a.ops[o];
      KernelWork work;
      work.flops = oa.forward.executedFlops;
      work.bytes = oa.forward.bytesRead + oa.forward.bytesWritten;
      work.transcendentals = oa.forward.transcendentals;
      work.outsideBytes = flashOutsideBytes(a, o, false);
      known = {true, c, splits[o],
               kernelTime(a.plan->target, c, oa.computeDtype, splitWork(work, splits[o]))};
    }
    f.opTime[o] = known.time;
  }
  f.tensorBuffer.assign(g.tensors.size(), 0);
  for (TensorId t = 0; t < g.tensors.size(); ++t)
    if (g.storageOf(t) == t && f.isActivation(t))
      f.tensorBuffer[t] = std::ceil(f.bytes(t));
  f.extraBuffer.assign(f.extras.items.size(), 0);
  for (OpId o = 0; o < g.ops.size(); ++o) {
    double divisor = f.opSplit(g.ops[o]) ? f.tensorDegree : 1;
    for (uint32_t k = 0; k < f.extraCount(o); ++k)
      f.extraBuffer[f.extras.start[o] + k] = std::ceil(a.savedOf(o)[f.extras.of(o)[k]].bytes / divisor);
  }
  if (a.walks) {
    f.memo = a.walks.get();
    f.walked = memoVariant(*f.memo, f, a);
  }
  return f;
}

// ---------------------------------------------------------------------------------------------
// Steps 2-5: one policy's schedule, buffers and peak.

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

/// Step 3 for block segments and selective ops: the forward of every op in order, then the
/// backward of every op that has one in reverse order; each segment is re-run (Recompute
/// steps) just before the first backward step (the highest op) among its ops' and, for a
/// selective op, those of the ops that keep its outputs. A segment none of whose ops has a
/// backward saved nothing, so it is never re-run. The steps are made as they are read
/// (forEach): segmentSchedule writes them out, and a walk that only compares policies reads
/// them once without (Steps): writing and reading the list was 40% of such a walk of a
/// 100,000-layer step.
class SegmentSchedule {
public:
  SegmentSchedule(const Facts &f, const Policy &p) : f_(f) {
    const Graph &g = f.g;
    // The segments' ops, flat: segment s is ops_[from_[s], from_[s + 1]), sorted.
    std::vector<bool> forOutputs;
    auto close = [&](bool outputs) {
      if (!std::is_sorted(ops_.begin() + from_.back(), ops_.end())) // copies' ops come sorted
        std::sort(ops_.begin() + from_.back(), ops_.end());
      from_.push_back(static_cast<uint32_t>(ops_.size()));
      forOutputs.push_back(outputs);
    };
    for (const auto &sg : p.segments) {
      for (size_t c = sg.first; c < sg.second && c < f.copies.size(); ++c)
        ops_.insert(ops_.end(), f.copies[c].ops.begin(), f.copies[c].ops.end());
      close(false);
    }
    for (const auto &seg : p.opSegments) {
      ops_.insert(ops_.end(), seg.begin(), seg.end());
      close(false);
    }
    for (OpId o : p.selectiveOps) {
      ops_.push_back(o);
      close(!p.selectiveKeepsOutputs);
    }
    size_t segments = forOutputs.size();
    // Each segment's trigger, then the segments by trigger, highest first (a stable sort:
    // segments with one trigger stay in segment order).
    trigger_.assign(segments, kNone);
    for (size_t seg = 0; seg < segments; ++seg) {
      OpId &t = trigger_[seg];
      auto consider = [&](OpId o) {
        if (f.hasBackward[o] && (t == kNone || o > t))
          t = o;
      };
      for (uint32_t i = from_[seg]; i < from_[seg + 1]; ++i) {
        consider(ops_[i]);
        if (forOutputs[seg])
          for (TensorId out : g.ops[ops_[i]].outputs)
            for (OpId saver : f.savers[g.storageOf(out)])
              consider(saver);
      }
    }
    steps_ = g.ops.size() + f.structure->backwardOps;
    order_.reserve(segments);
    for (size_t seg = 0; seg < segments; ++seg)
      if (trigger_[seg] != kNone) {
        order_.push_back(static_cast<uint32_t>(seg));
        steps_ += from_[seg + 1] - from_[seg];
      }
    std::stable_sort(order_.begin(), order_.end(),
                     [&](uint32_t x, uint32_t y) { return trigger_[x] > trigger_[y]; });
  }
  /// How many steps: every op's forward, each backward, each re-run segment's ops.
  size_t size() const { return steps_; }
  /// visit(i, step) for every step i, in order.
  template <class Visit> void forEach(Visit &&visit) const {
    size_t n = f_.g.ops.size();
    uint32_t i = 0;
    for (OpId o = 0; o < n; ++o)
      visit(i++, ScheduleStep{ScheduleStep::Forward, o});
    size_t k = 0; // order_[k]: the next segment to re-run, by trigger from the highest
    for (OpId o = static_cast<OpId>(n); o-- > 0;) {
      if (!f_.hasBackward[o])
        continue;
      for (; k < order_.size() && trigger_[order_[k]] == o; ++k)
        for (uint32_t j = from_[order_[k]]; j < from_[order_[k] + 1]; ++j)
          visit(i++, ScheduleStep{ScheduleStep::Recompute, ops_[j]});
      visit(i++, ScheduleStep{ScheduleStep::Backward, o});
    }
  }
  /// visit(op) for every Recompute step, in order (forEach's, without the others).
  template <class Visit> void forEachRecompute(Visit &&visit) const {
    for (uint32_t seg : order_)
      for (uint32_t j = from_[seg]; j < from_[seg + 1]; ++j)
        visit(ops_[j]);
  }

private:
  const Facts &f_;
  std::vector<OpId> ops_;
  std::vector<uint32_t> from_{0}, order_;
  std::vector<OpId> trigger_;
  size_t steps_ = 0;
};

void segmentSchedule(const Facts &f, const Policy &p, Walk &w) {
  SegmentSchedule schedule(f, p);
  reserveScratch(w.schedule, schedule.size());
  schedule.forEach([&](uint32_t, ScheduleStep st) { w.schedule.push_back(st); });
}

/// The steps a walk reads: its schedule written out (Walk::schedule), or a segment
/// schedule's, made as they are read.
struct Steps {
  const std::vector<ScheduleStep> *list = nullptr;
  const SegmentSchedule *made = nullptr;
  size_t size() const { return made ? made->size() : list->size(); }
  /// visit(i, step) for every step i, in order.
  template <class Visit> void forEach(Visit &&visit) const {
    if (made) {
      made->forEach(visit);
      return;
    }
    for (uint32_t i = 0; i < list->size(); ++i)
      visit(i, (*list)[i]);
  }
  /// visit(op) for every Recompute step, in order.
  template <class Visit> void forEachRecompute(Visit &&visit) const {
    if (made) {
      made->forEachRecompute(visit);
      return;
    }
    for (const ScheduleStep &st : *list)
      if (st.kind == ScheduleStep::Recompute)
        visit(st.op);
  }
};

/// Step 3 for `recompute_all`: the forward keeps nothing made inside the repeat copies (step
/// 4 sees no later reader of the first run's tensors); just before the first backward step of
/// copy c, the forward of copies 0..c runs again from copy 0's kept input (an episode), and
/// only copy c's re-run is read by a backward. O(1) copies live, L(L+1)/2 copy forwards
/// re-run. Needs copiesContiguous.
void fromInputSchedule(const Facts &f, Walk &w) {
  size_t n = f.g.ops.size(), L = f.copies.size();
  OpId firstCopyOp = f.copies.front().ops.front();
  std::vector<bool> started(L, false);
  for (OpId o = 0; o < n; ++o)
    w.schedule.push_back({ScheduleStep::Forward, o});
  for (OpId o = static_cast<OpId>(n); o-- > 0;) {
    if (!f.hasBackward[o])
      continue;
    uint32_t c = f.copyOfOp[o];
    if (c != kNone && !started[c]) {
      started[c] = true;
      for (OpId r = firstCopyOp; r <= f.copies[c].ops.back(); ++r)
        w.schedule.push_back({ScheduleStep::Recompute, r});
    }
    w.schedule.push_back({ScheduleStep::Backward, o});
  }
}

/// Live bytes per schedule step, as differences: a buffer adds its bytes at its first step
/// and takes them off after its last (Saved ones in `saved`, the rest in `other`).
struct LiveDeltas {
  std::vector<double> &saved, &other;
  /// When set: the buffers' sizes rounded up to kAlignment, summed (nullopt once past
  /// INT64_MAX): what the memory plan needs when it lists no buffers (Analysis::listPlan).
  std::optional<int64_t> *aligned = nullptr;
  /// A buffer of `bytes` live from step `first` to step `last` (at least `first`).
  void add(bool isSaved, uint32_t first, uint32_t last, double bytes) {
    std::vector<double> &d = isSaved ? saved : other;
    d[first] += bytes;
    d[std::max(first, last) + 1] -= bytes;
    if (aligned && *aligned) {
      // As planMemory sizes a buffer: its whole bytes (< 2^63, else it cannot be held), aligned.
      std::optional<int64_t> size =
          bytes < 0x1p63 ? checkedAlignUp(static_cast<int64_t>(bytes)) : std::nullopt;
      *aligned = size ? checkedAdd(**aligned, *size) : std::nullopt;
    }
  }
};

/// One buffer of a walk (`bytes`: whole bytes, Facts::tensorBuffer or extraBuffer): into the
/// deltas that find the peak and, when the walk keeps its buffers (the applied policy's memory
/// plan, the chain's stage sizes), into `w.buffers`; the walks that only compare policies
/// keep none (a 10,000-layer walk made 10^6 of them).
void addBuffer(Walk &w, LiveDeltas &live, bool keep, TensorId t, OpId op, double bytes,
               uint32_t first, uint32_t last, Label what, Buffer::Kind kind) {
  if (!(bytes > 0))
    return;
  last = std::max(first, last);
  live.add(kind == Buffer::Saved, first, last, bytes);
  if (!keep)
    return;
  Buffer b;
  b.tensor = t;
  b.op = op;
  b.size = bytes;
  // A tensor's element count fits int64 (lowering checks it), its bytes need not: 2^62 f32
  // elements are 2^64 bytes. Such a buffer keeps its size for the analysis; planMemory says
  // the plan cannot hold it (converting a double ≥ 2^63 to int64 is undefined).
  b.bytes = bytes < 0x1p63 ? static_cast<int64_t>(bytes) : 0;
  b.first = first;
  b.last = last;
  b.what = what;
  b.kind = kind;
  w.buffers.push_back(b);
}

/// Walk::keptPerCopy: per copy, the bytes of the activations and extra buffers its ops made
/// in the forward (not re-runs) that are still live when the backward starts: saved for a
/// backward or kept as the input of a recomputed segment. From the walk's instances, so that
/// no buffer list is needed (whole bytes: the sums are exact in any order).
void keptByCopy(const Facts &f, Walk &w, const std::vector<LiveInstance> &inst) {
  const Graph &g = f.g;
  size_t T = g.tensors.size();
  uint32_t forwardEnd = 0; // the first step after the forward of every op
  for (uint32_t i = 0; i < w.schedule.size(); ++i)
    if (w.schedule[i].kind == ScheduleStep::Forward)
      forwardEnd = i + 1;
  w.keptPerCopy.assign(f.copies.size(), 0);
  for (const LiveInstance &in : inst) {
    if (!(in.first < forwardEnd && in.last >= forwardEnd))
      continue;
    OpId op = kNone;
    if (in.key < T) {
      op = g.tensors[in.key].producer;
    } else { // extra buffer k of op o: key T + extras.start[o] + k
      uint32_t item = static_cast<uint32_t>(in.key - T);
      auto after = std::upper_bound(f.extras.start.begin(), f.extras.start.end(), item);
      op = static_cast<OpId>(after - f.extras.start.begin()) - 1;
    }
    double bytes = f.keyBuffer(in.key);
    if (bytes > 0 && op != kNone && op < f.copyOfOp.size() && f.copyOfOp[op] != kNone)
      w.keptPerCopy[f.copyOfOp[op]] += bytes;
  }
}

/// An instance's buffer into the deltas, when it has bytes (Facts::keyBuffer).
inline void addInstance(const Facts &f, LiveDeltas &live, const LiveInstance &in) {
  double bytes = f.keyBuffer(in.key);
  if (bytes > 0)
    live.add(in.saved, in.first, in.last, bytes);
}

/// A walk's instances, every one listed in the order made (`inst`; `current` is each key's
/// newest): what the memory plan's buffers and keptByCopy read.
struct ListedInstances {
  std::vector<LiveInstance> &inst;
  std::vector<uint32_t> &current;
  ListedInstances(WalkScratch &s, size_t keys) : inst(s.inst), current(s.current) {
    inst.clear();
    // Room for each activation and extra buffer made twice (a re-run makes them again):
    // regrowing copied the list in every walk that re-runs ops; room never used is not touched.
    inst.reserve(2 * keys);
    current.assign(keys, kNone);
  }
  void make(uint32_t key, uint32_t step, bool again) {
    current[key] = static_cast<uint32_t>(inst.size());
    inst.push_back({key, step, step, false, again});
  }
  void use(uint32_t key, uint32_t step, bool saved) {
    if (current[key] == kNone)
      return;
    LiveInstance &in = inst[current[key]];
    in.last = std::max(in.last, step);
    in.saved = in.saved || saved;
  }
  bool made(uint32_t key) const { return current[key] != kNone; }
};

/// A walk's instances when only the live bytes per step are wanted (the walks that compare
/// policies: the trade-off curve, auto's and sqrt's candidates, the budget fixes and the
/// layout search): each key's newest instance only, an older one added to the deltas when a
/// newer is made, the rest by finish(). No list of every instance (one per buffer made:
/// millions in a deep model), and no second pass over one. The deltas are whole bytes, so
/// their sums (exact below 2^53) do not depend on the order buffers are added in.
struct OpenInstances {
  std::vector<LiveInstance> &open;
  LiveDeltas &live;
  const Facts &f;
  OpenInstances(WalkScratch &s, size_t keys, LiveDeltas &live, const Facts &f)
      : open(s.inst), live(live), f(f) {
    open.assign(keys, {0, kNone, 0, false, false});
  }
  void make(uint32_t key, uint32_t step, bool again) {
    LiveInstance &in = open[key];
    if (in.first != kNone)
      addInstance(f, live, in);
    in = {key, step, step, false, again};
  }
  void use(uint32_t key, uint32_t step, bool saved) {
    LiveInstance &in = open[key];
    if (in.first == kNone)
      return;
    in.last = std::max(in.last, step);
    in.saved = in.saved || saved;
  }
  bool made(uint32_t key) const { return open[key].first != kNone; }
  void finish() {
    for (const LiveInstance &in : open)
      if (in.first != kNone)
        addInstance(f, live, in);
  }
};

/// Step 4's pass over the schedule: every instance made and used (`book`: ListedInstances or
/// OpenInstances), and per op the step of its backward (`bwd`). Whether the backward steps
/// run once per op with a backward, in reverse op order (every schedule tally makes does): a
/// gradient then starts at its last reader's backward.
template <class Book>
bool runInstances(const Facts &f, const Steps &steps, Book &book, std::vector<uint32_t> &bwd) {
  uint32_t T = static_cast<uint32_t>(f.g.tensors.size());
  bwd.assign(f.g.ops.size(), kNone);
  for (TensorId t : f.structure->sources)
    book.make(t, 0, false);
  bool reverse = true;
  size_t backwardSteps = 0;
  OpId lastBackward = kNone;
  steps.forEach([&](uint32_t i, ScheduleStep st) __attribute__((always_inline)) {
    OpId o = st.op;
    uint32_t extraKey = T + f.extras.start[o];
    if (st.kind == ScheduleStep::Backward) {
      bwd[o] = i;
      reverse = reverse && o < lastBackward;
      lastBackward = o;
      ++backwardSteps;
      for (TensorId t : f.keeps.of(o))
        book.use(t, i, true);
      for (uint32_t k = 0; k < f.extraCount(o); ++k)
        book.use(extraKey + k, i, true);
      return;
    }
    for (TensorId t : f.reads.of(o))
      book.use(t, i, false);
    bool again = st.kind == ScheduleStep::Recompute;
    for (TensorId t : f.writes.of(o))
      book.make(t, i, again);
    if (f.hasBackward[o])
      for (uint32_t k = 0; k < f.extraCount(o); ++k)
        book.make(extraKey + k, i, again);
  });
  return reverse && backwardSteps == f.structure->backwardOps;
}

/// Step 4 over any schedule. Every run of an op (its forward or a recompute) makes a new
/// instance of each activation it writes and of each extra buffer it saves; every later step
/// that reads the tensor uses its newest instance: a forward or recompute reading it as an
/// input, the op's backward reading what it keeps. An instance lives from the step that makes
/// it to the last step that uses it, and is Saved when a backward uses it (else Transient).
/// So a tensor made in a recomputed segment lives in the forward only to its last forward
/// reader (the backward reads the re-run's instance), and the schedule alone — one level of
/// segments, recompute_all's episodes or nested recomputation — decides every lifetime.
/// An activation's gradient lives from the backward of its first reader in the backward
/// (which starts it) to the backward of its producer (which consumes it).
void liveness(const Facts &f, const Analysis &a, Walk &w, const Steps &steps, LiveDeltas &live,
              bool keep, bool perCopy, WalkScratch &scratch) {
  const Graph &g = f.g;
  size_t n = g.ops.size(), T = g.tensors.size();
  // Keys: a stored tensor t is key t; op o's k-th extra buffer is key T + extras.start[o] + k.
  size_t keys = T + f.extras.items.size();
  std::vector<uint32_t> &bwd = scratch.bwd;
  std::optional<ListedInstances> listed;
  std::optional<OpenInstances> open;
  bool ordered;
  if (keep || perCopy) {
    listed.emplace(scratch, keys);
    ordered = runInstances(f, steps, *listed, bwd);
  } else {
    open.emplace(scratch, keys, live, f);
    ordered = runInstances(f, steps, *open, bwd);
  }

  // An activation's gradient: from the backward of its first reader to its producer's.
  static const Label gradientLabel("gradient");
  auto gradient = [&](TensorId t) {
    OpId p = f.structure->gradProducer[t];
    if (p == kNone || bwd[p] == kNone)
      return;
    uint32_t start = kNone;
    if (ordered) {
      if (f.structure->gradReader[t] != kNone)
        start = bwd[f.structure->gradReader[t]];
    } else {
      for (OpId r : f.readers[t])
        if (bwd[r] != kNone)
          start = std::min(start, bwd[r]);
    }
    if (start != kNone)
      addBuffer(w, live, keep, t, p, f.tensorBuffer[t], start, bwd[p], gradientLabel,
                Buffer::Gradient);
  };
  if (open) {
    // Only the live bytes per step, without listing buffers by tensor.
    open->finish();
    for (TensorId t = 0; t < T; ++t)
      if (open->made(t))
        gradient(t);
    return;
  }
  const std::vector<LiveInstance> &inst = listed->inst;
  if (perCopy)
    keptByCopy(f, w, inst);
  if (!keep) {
    // Only the live bytes per step: the buffers in the order they were made, without listing
    // them by tensor.
    for (const LiveInstance &in : inst)
      addInstance(f, live, in);
    for (TensorId t = 0; t < T; ++t)
      if (listed->made(t))
        gradient(t);
    return;
  }
  // Room for every buffer at once: one per instance and at most one gradient per tensor
  // (regrowing the list copied it, and mapped and zeroed each larger list anew).
  w.buffers.reserve(w.buffers.size() + inst.size() + T);
  // Each key's instances in the order they were made: a counting sort by key.
  std::vector<uint32_t> from(keys + 1, 0), order(inst.size());
  for (const LiveInstance &in : inst)
    ++from[in.key + 1];
  for (size_t k = 0; k + 1 < from.size(); ++k)
    from[k + 1] += from[k];
  {
    std::vector<uint32_t> next(from.begin(), from.end() - 1);
    for (uint32_t i = 0; i < inst.size(); ++i)
      order[next[inst[i].key]++] = i;
  }
  for (TensorId t = 0; t < T; ++t) {
    if (from[t] == from[t + 1])
      continue;
    OpId p = g.tensors[t].producer;
    double bytes = f.tensorBuffer[t];
    for (uint32_t j = from[t]; j < from[t + 1]; ++j) {
      const LiveInstance &in = inst[order[j]];
      static const Label recomputedSaved("recomputed, saved"), recomputed("recomputed"),
          saved("saved"), transient("transient");
      addBuffer(w, live, keep, t, p, bytes, in.first, in.last,
                in.recomputed ? (in.saved ? recomputedSaved : recomputed) : (in.saved ? saved : transient),
                in.saved ? Buffer::Saved : Buffer::Transient);
    }
    gradient(t);
  }
  for (OpId o = 0; o < n; ++o) {
    for (uint32_t k = 0; k < f.extraCount(o); ++k) {
      uint32_t key = static_cast<uint32_t>(T) + f.extras.start[o] + k;
      if (from[key] == from[key + 1])
        continue;
      const SavedTensor &st = a.savedOf(o)[f.extras.of(o)[k]];
      double bytes = f.extraBuffer[f.extras.start[o] + k];
      for (uint32_t j = from[key]; j < from[key + 1]; ++j) {
        const LiveInstance &in = inst[order[j]];
        addBuffer(w, live, keep, kNone, o, bytes, in.first, in.last, st.what,
                  in.saved ? Buffer::Saved : Buffer::Transient);
      }
    }
  }
}

/// Step 5: the step with the most bytes live, and the Saved bytes and the rest there.
void findPeak(Walk &w, const LiveDeltas &live) {
  size_t n = live.saved.size(); // the steps and one past the last
  double liveSaved = 0, liveOther = 0, best = -1;
  for (uint32_t i = 0; i + 1 < n; ++i) {
    liveSaved += live.saved[i];
    liveOther += live.other[i];
    if (liveSaved + liveOther > best) {
      best = liveSaved + liveOther;
      w.peakSaved = liveSaved;
      w.peakOther = liveOther;
      w.peakStep = i;
    }
  }
}

/// An op re-run alone before its backward: `selective` is Megatron's (Korthikanti et al.
/// 2022, "selective activation recomputation"): only the attention core — QKᵀ, softmax,
/// dropout and AV, tally's unfused attention op with its score, softmax and dropout buffers.
/// `selective_wide` (tally's, after llm.c) adds GELU/SiLU (the next matmul keeps their output)
/// and layer/RMS norms (the next matmul keeps theirs). Either only when the op's output is kept
/// by another op's backward and every activation it reads is kept for some backward anyway,
/// so re-running it holds nothing longer.
bool selectable(const Facts &f, OpId o, bool wide) {
  const Op &op = f.g.ops[o];
  bool core = op.kind == OpKind::Attention && !op.attrs->fused;
  bool cheap = op.kind == OpKind::Gelu || op.kind == OpKind::Silu ||
               op.kind == OpKind::LayerNorm || op.kind == OpKind::RmsNorm;
  bool kind = core || (wide && cheap);
  if (!kind || !f.hasBackward[o] || op.outputs.empty())
    return false;
  bool keptByOther = false;
  for (TensorId t : op.outputs)
    for (OpId s : f.savers[f.g.storageOf(t)])
      keptByOther = keptByOther || s != o;
  if (!keptByOther)
    return false;
  for (TensorId t : op.inputs) {
    TensorId s = f.g.storageOf(t);
    if (f.isActivation(s) && f.savers[s].empty())
      return false;
  }
  return true;
}

/// `selective` (the attention core, Megatron's) or `selective_wide` (with GELU, SiLU, norms).
Policy selectivePolicy(const Facts &f, bool wide) {
  Policy p;
  p.name = wide ? "selective_wide" : "selective";
  p.selectiveKeepsOutputs = !wide;
  for (OpId o = 0; o < f.g.ops.size(); ++o)
    if (selectable(f, o, wide))
      p.selectiveOps.push_back(o);
  return p;
}

/// Whether `recompute_all` can schedule this graph: the copies' ops follow one another in op
/// order (copy c's before copy c + 1's) with no other op between the first and the last.
bool copiesContiguous(const Facts &f) {
  if (f.copies.empty())
    return false;
  OpId next = f.copies.front().ops.front();
  for (const Copy &c : f.copies)
    for (OpId o : c.ops)
      if (o != next++)
        return false;
  return true;
}

/// Step 3 for one policy: its schedule (explicit, recompute_all's or the segments').
void buildSchedule(const Facts &f, const Policy &p, Walk &w) {
  if (!p.steps.empty())
    w.schedule = p.steps;
  else if (p.fromInput)
    fromInputSchedule(f, w);
  else
    segmentSchedule(f, p, w);
}

/// What decides a policy's schedule (and so its walk), as bytes: the WalkMemo key. The name
/// does not (sqrt of segment length 1 is full); the counts keep the lists apart.
std::string policyKey(const Policy &p) {
  std::string key;
  auto put = [&](uint64_t x) { key.append(reinterpret_cast<const char *>(&x), sizeof x); };
  put(p.fromInput);
  put(p.segments.size());
  for (const auto &sg : p.segments)
    put(sg.first), put(sg.second);
  put(p.selectiveOps.size());
  put(p.selectiveKeepsOutputs);
  for (OpId o : p.selectiveOps)
    put(o);
  put(p.opSegments.size());
  for (const auto &ops : p.opSegments) {
    put(ops.size());
    for (OpId o : ops)
      put(o);
  }
  put(p.steps.size());
  for (const ScheduleStep &st : p.steps)
    put((static_cast<uint64_t>(st.kind) << 32) | st.op);
  return key;
}

/// Steps 3-5 for one policy: its schedule, the recompute it costs, every buffer's lifetime
/// and the peak. `keepBuffers`: every buffer in w.buffers, for the memory plan; else only the
/// recompute and the peak, answered from Facts::memo when this policy was walked before under
/// the same facts (w.schedule is then empty). `alignedSum`: the buffers' aligned sizes summed
/// there instead of listed (LiveDeltas::aligned), and `perCopy` Walk::keptPerCopy (the walk
/// is then made, not looked up). `readsSchedule` false: the caller reads no w.schedule
/// (compareWalk), so a segment policy's steps are made as the walk reads them.
Walk walk(const Facts &f, const Analysis &a, const Policy &p, bool keepBuffers,
          std::optional<int64_t> *alignedSum = nullptr, bool perCopy = false,
          bool readsSchedule = true) {
  Walk w;
  std::string key;
  if (f.memo)
    key = policyKey(p);
  if (!keepBuffers && !alignedSum && !perCopy && f.memo) {
    auto it = f.walked->walks.find(key);
    if (it != f.walked->walks.end()) {
      ++f.memo->reused;
      const WalkMemo::Summary &m = it->second;
      w.recomputeFlops = m.recomputeFlops;
      w.recomputeExecuted = m.recomputeExecuted;
      w.recomputeTime = m.recomputeTime;
      w.peakSaved = m.peakSaved;
      w.peakOther = m.peakOther;
      w.peakStep = m.peakStep;
      w.memo = &it->second;
      return w;
    }
  }
  WalkScratch own; // a walk without a memo has lists of its own
  WalkScratch &scratch = f.memo ? f.memo->scratch : own;
  std::optional<SegmentSchedule> made;
  if (!readsSchedule && p.steps.empty() && !p.fromInput) {
    made.emplace(f, p);
  } else {
    w.schedule.swap(scratch.schedule); // the list a comparison walk gave back, if any
    w.schedule.clear();
    buildSchedule(f, p, w);
  }
  Steps steps{&w.schedule, made ? &*made : nullptr};
  steps.forEachRecompute([&](OpId o) {
    const OpAnalysis &oa = (*f.ops)[o];
    w.recomputeFlops += oa.forward.flops;
    w.recomputeExecuted += oa.forward.executedFlops;
    w.recomputeTime += f.opTime[o];
  });
  LiveDeltas live{scratch.saved, scratch.other, alignedSum};
  assignScratch(live.saved, steps.size() + 1, 0.0);
  assignScratch(live.other, steps.size() + 1, 0.0);
  liveness(f, a, w, steps, live, keepBuffers, perCopy, scratch);
  findPeak(w, live);
  // A walk that listed its buffers has the same recompute and peak: later buffer-less walks
  // of this policy (the trade-off curve's point for the applied policy) take them.
  if (f.memo)
    w.memo = &f.walked->walks
                  .emplace(std::move(key),
                           WalkMemo::Summary{w.recomputeFlops, w.recomputeExecuted,
                                             w.recomputeTime, w.peakSaved, w.peakOther,
                                             w.peakStep, nullptr})
                  .first->second;
  return w;
}

/// A walk whose caller reads only its recompute and peak (the trade-off curve, the
/// candidates of auto and sqrt, the budget fixes): a segment policy's steps are made as they
/// are read, and another's written schedule goes back to the scratch, for the next walk to
/// fill instead of mapping a new list.
Walk compareWalk(const Facts &f, const Analysis &a, const Policy &p) {
  Walk w = walk(f, a, p, false, nullptr, false, /*readsSchedule=*/false);
  if (f.memo && w.schedule.capacity() > 0) // a walk found in the memo took no list
    f.memo->scratch.schedule = std::move(w.schedule);
  return w;
}

/// Pipeline parallelism (step 5): the first stage holds 1/pp of the layers for
/// min(pp, micro-batches per step) micro-batches in flight.
double pipelineFactor(const Plan &plan) {
  double pp = static_cast<double>(std::max<int64_t>(1, plan.parallel.pipeline));
  if (pp <= 1)
    return 1;
  double micro = static_cast<double>(plan.batch) /
                 (static_cast<double>(plan.microBatch) *
                  static_cast<double>(std::max<int64_t>(1, plan.parallel.data)));
  double inFlight = std::min(pp, std::max(1.0, std::floor(micro)));
  // Interleaved 1F1B (interleave = v): the first stage warms up with (p − 1)/v more chunks,
  // 1 + (p − 1)/(p·v) times the activations (Korthikanti et al. 2022, §4.2.3).
  double v = static_cast<double>(std::max<int64_t>(1, plan.parallel.interleave));
  if (v > 1)
    inFlight *= 1 + (pp - 1) / (pp * v);
  return inFlight / pp;
}

/// Context parallelism (passes/StepTime.cpp): a rank holds s/c of every activation.
double contextShare(const Plan &plan) {
  return static_cast<double>(std::max<int64_t>(1, plan.parallel.context));
}

/// The Saved bytes at the peak per device, and with the workspace.
double deviceActivations(const Walk &w, const Plan &plan) {
  return w.peakSaved * pipelineFactor(plan) / contextShare(plan);
}
double deviceBytes(const Walk &w, const Plan &plan) {
  return deviceActivations(w, plan) + w.peakOther / contextShare(plan);
}

// ---------------------------------------------------------------------------------------------
// Step 2: choosing the policy.

/// Everything per device that does not depend on the schedule: the model states, the
/// gradient-accumulation buffer, the CUDA context, the communication buffers and the CUDA
/// step's workspace.
double staticBytes(const Analysis &a) {
  return a.memory.params + a.memory.grads + a.memory.master + a.memory.optimizer +
         a.memory.gradAccum + unallocatedBytes(a);
}

/// The memory per device that activations and workspace may use: the target's memory, or a
/// smaller `memory per device <=` budget, minus the model states and the framework memory:
/// (capacity − context − comm buffers) / (1 + allocator reserve) − the allocated states.
double activationLimit(const Analysis &a) {
  const Plan &plan = *a.plan;
  double capacity = memoryLimit(plan);
  double fixed = unallocatedBytes(a);
  return (capacity - fixed) / (1 + reserveFraction(plan)) - (staticBytes(a) - fixed);
}

void blockActivations(const Facts &f, Analysis &a); // step 6, below

/// Segments of `k` consecutive copies over the first `m` copies (the last may be shorter).
Policy segmentedPolicy(std::string name, size_t m, size_t k) {
  Policy p;
  p.name = std::move(name);
  k = std::max<size_t>(1, k);
  for (size_t c = 0; c < m; c += k)
    p.segments.push_back({c, std::min(m, c + k)});
  return p;
}

/// The first m copies, one per segment: none (m = 0), partial, full (m = L).
Policy partialPolicy(size_t m, size_t copies) {
  return segmentedPolicy(m == 0 ? "none" : m == copies ? "full" : "partial", m, 1);
}

/// The given copies (ascending), one per segment.
Policy chosenPolicy(std::string name, const std::vector<size_t> &chosen, size_t copies) {
  Policy p;
  p.name = chosen.empty() ? "none" : chosen.size() == copies ? "full" : std::move(name);
  for (size_t c : chosen)
    p.segments.push_back({c, c + 1});
  return p;
}

/// `every(k)`: all L copies in segments of k (k ≥ L: one segment of all of them).
Policy everyPolicy(const std::string &name, size_t copies, size_t k) {
  return segmentedPolicy(name, copies, std::min(std::max<size_t>(1, k), copies));
}

/// The segment length of "every(k)" (0 when the text is not that form; Sema checked it).
size_t everyLength(const std::string &req) {
  if (req.rfind("every(", 0) != 0 || req.size() < 8 || req.back() != ')')
    return 0;
  std::string digits = req.substr(6, req.size() - 7);
  if (digits.empty() || digits.size() > 19 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return 0;
  return static_cast<size_t>(std::stoull(digits));
}

/// `sqrt`: every copy checkpointed, in segments of the length k in 1..L whose walk needs the
/// least activations + workspace per device (ties: less recompute time, then the shorter
/// segment). Chen et al. (2016) choose k ≈ √(L·x/A) for blocks keeping A bytes on an input of
/// x bytes; measuring the real buffers' walks finds that minimum without trusting the model.
/// Candidates: every k up to kSqrtAllLengths copies; beyond, only the least k of each segment
/// count ⌈L/k⌉ (about 2√L of them: the same inputs kept, the shortest segments).
/// Up to kSqrtWalkAll candidates every one is walked. Beyond, a walk costs O(ops) and walking
/// 2√L of them made sqrt — and the device-memory fixes that try it — grow as L^1.5 (200
/// walks, 20 s, for 10,000 GPT blocks), so: three walks (k = 1, the middle candidate, k = L)
/// fit bytes(k) = c + x·⌈L/k⌉ + A·k, the fit's best candidate is walked with kSqrtWindow
/// neighbours each side, and the window moves toward any better neighbour until the best
/// walked candidate has kSqrtWindow walked neighbours on each side no better than it. The
/// answer is the best of the walked candidates: exact when bytes(k) over the candidates has
/// no local minimum wider than the window apart from the global one (the test compares
/// against every(k) for every k).
constexpr size_t kSqrtAllLengths = 64;
constexpr size_t kSqrtWalkAll = 24;
constexpr size_t kSqrtWindow = 3;

Policy sqrtPolicy(const Facts &f, const Analysis &a) {
  size_t L = f.copies.size();
  std::vector<size_t> ks;
  for (size_t k = 1; k <= L; ++k)
    if (L <= kSqrtAllLengths || k == 1 || (L + k - 2) / (k - 1) != (L + k - 1) / k)
      ks.push_back(k);
  struct Tried {
    bool done = false;
    double bytes = 0, time = 0;
  };
  std::vector<Tried> tried(ks.size());
  auto at = [&](size_t i) -> const Tried & {
    if (!tried[i].done) {
      Walk w = compareWalk(f, a, segmentedPolicy("sqrt", L, ks[i]));
      tried[i] = {true, deviceBytes(w, *a.plan), w.recomputeTime};
    }
    return tried[i];
  };
  // Strictly better; equal candidates keep the shorter segment (the lower index).
  auto better = [&](size_t i, size_t j) {
    const Tried &x = at(i), &y = at(j);
    return x.bytes < y.bytes || (x.bytes == y.bytes && x.time < y.time);
  };
  size_t n = ks.size();
  if (n <= kSqrtWalkAll) {
    size_t best = 0;
    for (size_t i = 1; i < n; ++i)
      if (better(i, best))
        best = i;
    return segmentedPolicy("sqrt", L, ks[best]);
  }
  // The fit: three walks, three unknowns (segments = ⌈L/k⌉).
  size_t mid = n / 2;
  auto segs = [&](size_t i) { return static_cast<double>((L + ks[i] - 1) / ks[i]); };
  double s0 = segs(0), s1 = segs(mid), s2 = segs(n - 1);
  double k0 = static_cast<double>(ks[0]), k1 = static_cast<double>(ks[mid]),
         k2 = static_cast<double>(ks[n - 1]);
  double y0 = at(0).bytes, y1 = at(mid).bytes, y2 = at(n - 1).bytes;
  // Subtract the third equation: (s0 − s2)·x + (k0 − k2)·A = y0 − y2, likewise for 1.
  double a11 = s0 - s2, a12 = k0 - k2, b1 = y0 - y2;
  double a21 = s1 - s2, a22 = k1 - k2, b2 = y1 - y2;
  double det = a11 * a22 - a12 * a21;
  size_t guess = mid;
  if (det != 0 && std::isfinite(det)) {
    double x = (b1 * a22 - a12 * b2) / det, A = (a11 * b2 - b1 * a21) / det;
    double bestFit = INFINITY;
    for (size_t i = 0; i < n; ++i) {
      double fit = x * segs(i) + A * static_cast<double>(ks[i]);
      if (fit < bestFit)
        bestFit = fit, guess = i;
    }
  }
  // The window search around the guess.
  size_t lo = guess > kSqrtWindow ? guess - kSqrtWindow : 0;
  size_t hi = std::min(n - 1, guess + kSqrtWindow);
  for (;;) {
    size_t best = lo;
    for (size_t i = lo + 1; i <= hi; ++i)
      if (better(i, best))
        best = i;
    bool moved = false;
    if (best < lo + kSqrtWindow && lo > 0)
      lo = best > kSqrtWindow ? best - kSqrtWindow : 0, moved = true;
    if (best + kSqrtWindow > hi && hi < n - 1)
      hi = std::min(n - 1, best + kSqrtWindow), moved = true;
    if (!moved)
      break;
  }
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (tried[i].done && better(i, best))
      best = i;
  return segmentedPolicy("sqrt", L, ks[best]);
}

/// Nested recomputation (CheckpointChain.h): the chain's stages are the ops before the repeat
/// copies, the copies (in groups of consecutive copies when there are more than
/// kChainCopies: the program is cubic in the stages), and the ops after them. Per stage, in
/// bytes per device: its input (the activations it reads that the stage before made), what
/// its backward keeps besides its output (activations it makes that a backward keeps, and
/// its ops' extra buffers), its work (its input's gradient and its largest activation's
/// gradient) and its forward's roofline seconds. Activations read by a stage further on than
/// the next (tables made once and read by every copy) are live throughout and come off the
/// budget. The budget is the limit per device in the walk's bytes (pipeline and context
/// shares undone), cut into kChainUnits units, each size rounded up to whole units; the
/// program's schedule is then walked, and the largest budget (of a few, from 1.5× the limit
/// down) whose walk fits is taken: the model is conservative, the walk exact. Needs the
/// copies to run one after another (copiesContiguous).
constexpr size_t kChainCopies = 128;
constexpr double kChainUnits = 100, kChainMaxUnits = 2000;
constexpr double kChainMaxScale = 2.0; ///< the largest budget tried, × the limit

/// The chain, its stages' sizes and the program solved once (docs above), for auto's limit:
/// every budget asked of it later (auto's scale search, the curve's smaller limits) is read
/// off the same solution.
struct Chain {
  std::vector<std::pair<OpId, OpId>> ranges; ///< per stage: its ops [lo, hi)
  std::vector<std::vector<OpId>> selOps;     ///< per stage: its selectable ops
  double unit = 0;                           ///< bytes per unit
  std::shared_ptr<const ChainSolution> solution;
};

/// The walk's bytes that a per-device limit allows (pipeline and context shares undone).
double rawBytes(const Analysis &a, double limit) {
  return limit * contextShare(*a.plan) / std::max(1.0, pipelineFactor(*a.plan));
}

} // namespace

/// The chain's stages as the facts decide them, in bytes (buildChain's docs above); the unit
/// and the program depend on the limit too.
struct ChainParts {
  std::vector<std::pair<OpId, OpId>> ranges;
  std::vector<std::vector<OpId>> selOps;
  std::vector<double> input, kept, work, seconds, keptSel, selSeconds;
};

namespace {

std::optional<ChainParts> buildChainParts(const Facts &f, const Analysis &a) {
  const Graph &g = f.g;
  size_t n = g.ops.size(), L = f.copies.size();
  if (L < 2 || !copiesContiguous(f))
    return std::nullopt;
  OpId first = f.copies.front().ops.front(), last = f.copies.back().ops.back();
  std::vector<std::pair<OpId, OpId>> ranges; // [lo, hi)
  if (first > 0)
    ranges.push_back({0, first});
  size_t group = (L + kChainCopies - 1) / kChainCopies;
  for (size_t c = 0; c < L; c += group)
    ranges.push_back({f.copies[c].ops.front(), f.copies[std::min(L, c + group) - 1].ops.back() + 1});
  if (last + 1 < n)
    ranges.push_back({last + 1, static_cast<OpId>(n)});
  size_t S = ranges.size();
  std::vector<uint32_t> stageOf(n, 0);
  std::vector<double> input(S, 0), kept(S, 0), seconds(S, 0);
  for (size_t s = 0; s < S; ++s)
    for (OpId o = ranges[s].first; o < ranges[s].second; ++o) {
      stageOf[o] = static_cast<uint32_t>(s);
      seconds[s] += f.opTime[o];
    }
  for (TensorId t = 0; t < g.tensors.size(); ++t) {
    OpId p = g.tensors[t].producer;
    if (g.storageOf(t) != t || !f.isActivation(t) || p == kNone)
      continue;
    uint32_t sp = stageOf[p];
    bool next = false, keptByBackward = false;
    for (OpId r : f.readers[t])
      next = next || stageOf[r] == sp + 1;
    for (OpId s : f.savers[t])
      keptByBackward = keptByBackward || f.hasBackward[s];
    double bytes = f.bytes(t);
    if (next)
      input[sp + 1] += bytes;
    else if (keptByBackward)
      kept[sp] += bytes;
  }
  for (OpId o = 0; o < n; ++o) {
    if (!f.hasBackward[o])
      continue;
    double divisor = f.opSplit(g.ops[o]) ? f.tensorDegree : 1;
    for (uint32_t k : f.extras.of(o))
      kept[stageOf[o]] += a.savedOf(o)[k].bytes / divisor;
  }
  // The select option: a stage's selectable ops (selective's), what dropping their outputs
  // and extra buffers between the forward and the backward saves, and their re-run's seconds.
  std::vector<std::vector<OpId>> selOps(S);
  std::vector<double> keptSel = kept, selSeconds(S, 0);
  for (OpId o = 0; o < n; ++o) {
    if (!selectable(f, o, /*wide=*/true))
      continue;
    uint32_t st = stageOf[o];
    selOps[st].push_back(o);
    selSeconds[st] += f.opTime[o];
    for (TensorId t : f.writes.of(o)) {
      bool next = false;
      for (OpId r : f.readers[t])
        next = next || stageOf[r] == st + 1;
      if (!next) // kept in the stage (selectable: another op's backward keeps it)
        keptSel[st] -= f.bytes(t);
    }
    double divisor = f.opSplit(g.ops[o]) ? f.tensorDegree : 1;
    for (uint32_t k : f.extras.of(o))
      keptSel[st] -= a.savedOf(o)[k].bytes / divisor;
  }
  // A stage's work, measured: in the walk of `none`, the most bytes live during the stage's
  // steps less what the stages before it keep (their kept bytes and outputs) and its own.
  // This counts the gradients in flight, transients and long-lived tensors as the walk does,
  // so the model's store-all plan needs exactly what the walk finds.
  std::vector<double> work(S, 0);
  {
    Walk none = walk(f, a, Policy(), true);
    std::vector<double> delta(none.schedule.size() + 1, 0);
    for (const Buffer &b : none.buffers) {
      delta[b.first] += b.size;
      delta[b.last + 1] -= b.size;
    }
    std::vector<double> most(S, 0);
    double live = 0;
    for (size_t i = 0; i < none.schedule.size(); ++i) {
      live += delta[i];
      uint32_t st = stageOf[none.schedule[i].op];
      most[st] = std::max(most[st], live);
    }
    double below = 0; // kept bytes and outputs of the stages before
    for (size_t s = 0; s < S; ++s) {
      double output = s + 1 < S ? input[s + 1] : 0;
      work[s] = std::max(0.0, most[s] - below - kept[s] - output);
      below += kept[s] + output;
    }
  }
  return ChainParts{std::move(ranges), std::move(selOps), std::move(input), std::move(kept),
                    std::move(work), std::move(seconds), std::move(keptSel), std::move(selSeconds)};
}

/// The chain for a limit: its parts (from the walk memo's variant when the facts were seen),
/// its unit, and the program solved for budgets up to kChainMaxScale × the limit — or a
/// solution already solved with the same unit for at least that budget (the program's cell
/// for a budget does not depend on the largest budget solved: ChainSolution).
std::optional<Chain> buildChain(const Facts &f, const Analysis &a, double limit) {
  if (limit <= 0)
    return std::nullopt;
  std::shared_ptr<const ChainParts> shared;
  if (f.walked && f.walked->chainPartsBuilt) {
    shared = f.walked->chainParts;
  } else {
    if (std::optional<ChainParts> p = buildChainParts(f, a))
      shared = std::make_shared<const ChainParts>(std::move(*p));
    if (f.walked) {
      f.walked->chainParts = shared;
      f.walked->chainPartsBuilt = true;
    }
  }
  if (!shared)
    return std::nullopt;
  const ChainParts &parts = *shared;
  const std::vector<double> &input = parts.input, &kept = parts.kept, &work = parts.work;
  size_t S = parts.ranges.size();
  double raw = rawBytes(a, limit);
  // The unit: an eighth of the smallest stage input, so that sizes made of whole inputs (the
  // usual case: activations of one [batch, seq, d] shape and its multiples) are exact; coarser
  // when the budget would need more than kChainMaxUnits of them (sizes then round up).
  double smallest = 0;
  for (double x : input)
    if (x > 0 && (smallest == 0 || x < smallest))
      smallest = x;
  double unit0 = smallest > 0 ? smallest / 8 : raw / kChainUnits;
  if (raw / unit0 > kChainMaxUnits)
    unit0 = raw / kChainMaxUnits;
  Chain chain;
  chain.ranges = parts.ranges;
  chain.selOps = parts.selOps;
  chain.unit = unit0;
  if (!(unit0 > 0))
    return chain;
  auto memory = static_cast<int64_t>(std::floor(kChainMaxScale * raw / unit0));
  if (f.walked && f.walked->chainSolution && f.walked->chainUnit == unit0 &&
      f.walked->chainSolution->memory() >= memory) {
    chain.solution = f.walked->chainSolution;
    return chain;
  }
  auto units = [&](double bytes) { return static_cast<int64_t>(std::ceil(bytes / unit0)); };
  std::vector<ChainStage> stages(S);
  for (size_t s = 0; s < S; ++s)
    stages[s] = {units(input[s]), units(kept[s]), units(work[s]), parts.seconds[s],
                 units(std::max(0.0, parts.keptSel[s])), parts.selSeconds[s]};
  chain.solution = std::make_shared<const ChainSolution>(std::move(stages), memory);
  if (f.walked) {
    f.walked->chainUnit = unit0;
    f.walked->chainSolution = chain.solution;
    ++f.walked->chainSolves;
  }
  return chain;
}

std::optional<Policy> nestedPolicy(const Facts &f, const Analysis &a, double limit,
                                   bool searchUp = true) {
  if (!f.chain)
    f.chain = std::make_shared<std::optional<Chain>>(buildChain(f, a, a.checkpoint.limitBytes));
  if (!*f.chain || !(*f.chain)->solution || limit <= 0)
    return std::nullopt;
  const Chain &chain = **f.chain;
  const Plan &plan = *a.plan;
  size_t n = f.g.ops.size();
  double raw = rawBytes(a, limit);
  // One budget: the program's schedule, if the program finds one, and whether its walk fits.
  struct Attempt {
    bool feasible = false, fits = false;
    Policy policy;
    double time = 0;
  };
  auto attempt = [&](double scale) {
    Attempt at;
    int64_t total = std::min(static_cast<int64_t>(std::floor(raw * scale / chain.unit)),
                             chain.solution->memory());
    if (total < 1)
      return at;
    ChainPlan cp = chain.solution->plan(total);
    if (!(at.feasible = cp.feasible))
      return at;
    Policy &p = at.policy;
    p.name = "nested";
    std::vector<bool> ran(n, false), again(n, false);
    for (const ChainAction &act : cp.actions) {
      auto [lo, hi] = chain.ranges[act.stage];
      if (act.kind == ChainAction::Forward) {
        for (OpId o = lo; o < hi; ++o) {
          p.steps.push_back({ran[o] ? ScheduleStep::Recompute : ScheduleStep::Forward, o});
          again[o] = again[o] || ran[o];
          ran[o] = true;
        }
      } else if (act.kind == ChainAction::Reselect) {
        for (OpId o : chain.selOps[act.stage])
          p.steps.push_back({ScheduleStep::Recompute, o});
        p.reselected += chain.selOps[act.stage].size();
      } else {
        for (OpId o = hi; o-- > lo;)
          if (f.hasBackward[o])
            p.steps.push_back({ScheduleStep::Backward, o});
      }
    }
    for (const Copy &c : f.copies)
      p.recomputedCopies += again[c.ops.front()];
    Walk w = compareWalk(f, a, p);
    at.fits = deviceBytes(w, plan) <= limit;
    at.time = w.recomputeTime;
    return at;
  };
  // The model is conservative, so the budget it is given may exceed the limit: from 1×, up
  // while the walk still fits, else down until it fits (a smaller budget never does better
  // than an infeasible one). The fitting attempt with the least recompute time wins.
  std::optional<Attempt> best;
  auto keep = [&](Attempt at) {
    if (at.fits && (!best || at.time < best->time))
      best = std::move(at);
  };
  Attempt at1 = attempt(1.0);
  bool up = at1.fits, feasible = at1.feasible;
  keep(std::move(at1));
  if (up && searchUp) {
    for (double scale : {1.15, 1.3, 1.5, 1.75, 2.0}) {
      Attempt at = attempt(scale);
      if (!at.fits)
        break;
      keep(std::move(at));
    }
  } else if (feasible) {
    for (double scale : {0.9, 0.8, 0.65, 0.5, 0.4}) {
      Attempt at = attempt(scale);
      if (!at.feasible || at.fits) {
        keep(std::move(at));
        break;
      }
    }
  }
  if (best)
    return best->policy;
  return std::nullopt;
}

/// `auto`: the least recompute time whose activations + workspace per device fit the limit,
/// over two families of single-copy segments: the first m copies (graph order), and the m
/// copies that save the most bytes per second of recompute (ranked: a copy's saved bytes
/// less the input it keeps, over the roofline time of its forward). Each family is searched
/// for its least fitting m by bisection (checkpointing one more copy never adds memory); the
/// fitting candidate with less recompute time wins, against selective (single cheap ops).
/// When none fits, sqrt (all copies, the segment length with the least memory), then
/// recompute_all (up to 256 copies), then the smallest footprint seen. Fills the trade-off
/// curve on the way.
Policy choosePolicy(const Facts &f, Analysis &a, StepScale scale) {
  const Plan &plan = *a.plan;
  size_t L = f.copies.size();
  a.checkpoint.limitBytes = activationLimit(a);
  // The ranking: saved bytes net of the kept input, per second of recompute.
  std::vector<double> gain(L, 0), seconds(L, 0);
  for (size_t c = 0; c < L; ++c) {
    gain[c] = a.blockActivations[c].savedBytes - a.blockActivations[c].inputBytes;
    for (OpId o : f.copies[c].ops)
      seconds[c] += f.opTime[o];
  }
  std::vector<size_t> ranked(L);
  for (size_t c = 0; c < L; ++c)
    ranked[c] = c;
  std::stable_sort(ranked.begin(), ranked.end(), [&](size_t x, size_t y) {
    // gain[x] / seconds[x] > gain[y] / seconds[y], without dividing by a zero time.
    return gain[x] * seconds[y] > gain[y] * seconds[x];
  });
  bool sameOrder = true;
  for (size_t c = 0; c < L; ++c)
    sameOrder = sameOrder && ranked[c] == c;

  struct Measured {
    Policy policy;
    double bytes = 0, time = 0;
  };
  auto record = [&](const Policy &p) {
    Walk w = compareWalk(f, a, p);
    Measured m{p, deviceBytes(w, plan), w.recomputeTime};
    a.checkpoint.options.push_back({p.name, static_cast<int64_t>(p.checkpointed()),
                                    w.recomputeFlops * scale.flops, m.bytes,
                                    w.recomputeTime * scale.seconds});
    return m;
  };
  // Walks are O(ops) each; memoize per family so the curve and the search share work.
  std::map<size_t, Measured> firstAt, rankedAt;
  auto measure = [&](bool byRank, size_t m) -> const Measured & {
    std::map<size_t, Measured> &memo = byRank ? rankedAt : firstAt;
    auto it = memo.find(m);
    if (it != memo.end())
      return it->second;
    Policy p;
    if (byRank) {
      std::vector<size_t> chosen(ranked.begin(), ranked.begin() + static_cast<long>(m));
      std::sort(chosen.begin(), chosen.end());
      p = chosenPolicy("ranked", chosen, L);
    } else {
      p = partialPolicy(m, L);
    }
    return memo.emplace(m, record(p)).first->second;
  };
  // 1. The trade-off curve: store-all, full, and evenly spaced counts in between (at most
  //    kCurvePoints walks, so the curve costs O(ops), not O(L · ops)).
  constexpr size_t kCurvePoints = 16;
  size_t stride = std::max<size_t>(1, (L + kCurvePoints - 1) / kCurvePoints);
  for (size_t m = 0; m < L; m += stride)
    measure(false, m);
  const Measured full = measure(false, L);
  // 2. Per family, the least m that fits, by bisection.
  std::optional<Measured> chosen;
  auto search = [&](bool byRank) {
    if (full.bytes > a.checkpoint.limitBytes)
      return;
    size_t lo = 0, hi = L; // bytes(hi) fits; find the least such m
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (measure(byRank, mid).bytes <= a.checkpoint.limitBytes)
        hi = mid;
      else
        lo = mid + 1;
    }
    const Measured &m = measure(byRank, hi);
    if (!chosen || m.time < chosen->time)
      chosen = m;
  };
  search(false);
  if (!sameOrder)
    search(true);
  Measured smallest = full;
  for (const auto *memo : {&firstAt, &rankedAt})
    for (const auto &kv : *memo)
      if (kv.second.bytes < smallest.bytes)
        smallest = kv.second;
  auto consider = [&](const Policy &p) {
    Measured m = record(p);
    if (m.bytes <= a.checkpoint.limitBytes && (!chosen || m.time < chosen->time))
      chosen = m;
    if (m.bytes < smallest.bytes)
      smallest = m;
  };
  // 3. selective re-runs single cheap ops: when it fits it often costs less than any block.
  //    Megatron's (the attention core) first, then the wide form (norms, GELU/SiLU too).
  for (bool wide : {false, true})
    if (!chosen || chosen->time > 0) {
      Policy sel = selectivePolicy(f, wide);
      if (!sel.selectiveOps.empty())
        consider(sel);
    }
  // 4. sqrt recomputes as much as full (every block once), so it comes after full; then
  //    recompute_all, O(1) blocks for L(L+1)/2 block forwards (up to kAutoRecomputeAll
  //    copies: its schedule grows as L²).
  constexpr size_t kAutoRecomputeAll = 256;
  // 5. nested recomputation (the chain program): fewer re-runs than sqrt or recompute_all
  //    when no single level fits, and the best mix of kept and re-run copies of different
  //    sizes when one does.
  if (!chosen || chosen->time > 0)
    if (std::optional<Policy> nested = nestedPolicy(f, a, a.checkpoint.limitBytes))
      consider(*nested);
  if (L > 0 && !chosen)
    consider(sqrtPolicy(f, a));
  if (L > 0 && !chosen && L <= kAutoRecomputeAll && copiesContiguous(f)) {
    Policy all = segmentedPolicy("recompute_all", L, L);
    all.fromInput = true;
    consider(all);
  }
  std::stable_sort(a.checkpoint.options.begin(), a.checkpoint.options.end(),
                   [](const auto &x, const auto &y) { return x.recomputeFlops < y.recomputeFlops; });
  return chosen ? chosen->policy : smallest.policy;
}

/// A block policy combined with selective (`full + selective`, `full + selective_wide`): the
/// block policy's segments, and selective's ops outside them (inside a recomputed copy nothing
/// is kept, so there is nothing left to re-run alone): the copies left stored and the ops
/// outside the copies.
Policy withSelective(const Facts &f, Policy blocks, bool wide) {
  std::vector<bool> inSegment(f.g.ops.size(), false);
  for (const auto &sg : blocks.segments)
    for (size_t c = sg.first; c < sg.second && c < f.copies.size(); ++c)
      for (OpId o : f.copies[c].ops)
        inSegment[o] = true;
  for (const auto &ops : blocks.opSegments)
    for (OpId o : ops)
      inSegment[o] = true;
  for (OpId o : selectivePolicy(f, wide).selectiveOps)
    if (!inSegment[o])
      blocks.selectiveOps.push_back(o);
  blocks.name += wide ? " + selective_wide" : " + selective";
  blocks.selectiveKeepsOutputs = !wide;
  return blocks;
}

/// `keep [h[0], h[4].mlp]`: the ops under the listed paths keep what their backward needs;
/// the rest of each repeat copy is one segment, re-run before its first backward step (a copy
/// none of whose ops is listed is checkpointed as `full` does). A path that names no op is an
/// error (a.checkpoint.error, reported by checkBudgets at the checkpoint setting).
Policy keepPolicy(const Facts &f, Analysis &a, const std::string &req) {
  llvm::StringRef list = llvm::StringRef(req).drop_front(strlen("keep ["));
  list.consume_back("]");
  llvm::SmallVector<llvm::StringRef, 8> parts;
  list.split(parts, ", ");
  std::vector<bool> kept(f.g.ops.size(), false);
  Policy p;
  p.name = "keep";
  for (llvm::StringRef path : parts) {
    a.checkpoint.saved.push_back(path.str());
    bool found = false;
    for (OpId o = 0; o < f.g.ops.size(); ++o) {
      std::string opPath = f.g.opPath(o);
      llvm::StringRef op = opPath;
      if (op.startswith(path) && (op.size() == path.size() || op[path.size()] == '.' ||
                                  op[path.size()] == '[')) {
        kept[o] = true;
        found = true;
      }
    }
    if (!found && a.checkpoint.error.empty())
      a.checkpoint.error = "checkpoint keep list names '" + path.str() +
                           "', which is no block or op of model " + f.g.model;
  }
  for (const Copy &c : f.copies) {
    std::vector<OpId> rest;
    for (OpId o : c.ops)
      if (!kept[o])
        rest.push_back(o);
    if (!rest.empty())
      p.opSegments.push_back(std::move(rest));
  }
  return p;
}

Policy requestedPolicy(const Facts &f, Analysis &a, StepScale scale, std::string req) {
  for (bool wide : {false, true}) {
    llvm::StringRef with = wide ? " + selective_wide" : " + selective";
    if (llvm::StringRef(req).endswith(with)) {
      req.resize(req.size() - with.size());
      return withSelective(f, requestedPolicy(f, a, scale, req), wide);
    }
  }
  size_t L = f.copies.size();
  if (a.plan->isTrain && req == "auto")
    return choosePolicy(f, a, scale);
  if (!a.plan->isTrain || req == "none")
    return Policy();
  if (req == "selective" || req == "selective_wide")
    return selectivePolicy(f, req == "selective_wide"); // per op: needs no repeat blocks
  if (L == 0) {
    a.checkpoint.note = "checkpoint = " + req +
                        " has nothing to checkpoint: the model has no repeat blocks, so every "
                        "activation is kept";
    return Policy();
  }
  if (size_t k = everyLength(req))
    return everyPolicy(req, L, k);
  if (llvm::StringRef(req).startswith("keep ["))
    return keepPolicy(f, a, req);
  if (req == "recompute_all") {
    if (!copiesContiguous(f)) {
      a.checkpoint.note = "checkpoint = recompute_all needs the repeat copies to run one after "
                          "another with no other op between them; full checkpointing is "
                          "applied instead";
      return partialPolicy(L, L);
    }
    Policy p = segmentedPolicy("recompute_all", L, L);
    p.fromInput = true;
    return p;
  }
  return req == "sqrt" ? sqrtPolicy(f, a) : partialPolicy(L, L);
}

// ---------------------------------------------------------------------------------------------
// Step 6: the memory plan.

/// What each copy keeps with no checkpointing, for the per-block report and the checks.
void blockActivations(const Facts &f, Analysis &a) {
  const Graph &g = f.g;
  a.blockActivations.assign(f.copies.size(), {});
  std::vector<bool> counted(g.tensors.size(), false);
  for (size_t c = 0; c < f.copies.size(); ++c)
    a.blockActivations[c].path = f.copies[c].path;
  for (OpId o = 0; o < g.ops.size(); ++o) {
    uint32_t c = f.copyOfOp[o];
    if (c != kNone)
      a.blockActivations[c].forwardFlops += a.ops[o].forward.flops;
    for (const SavedTensor &s : a.savedOf(o)) {
      double bytes = 0;
      if (s.tensor == kNone) {
        bytes = s.bytes / (f.opSplit(g.ops[o]) ? f.tensorDegree : 1);
      } else {
        TensorId t = g.storageOf(s.tensor);
        if (!f.isActivation(t) || counted[t])
          continue;
        counted[t] = true;
        bytes = f.bytes(t);
      }
      if (c != kNone)
        a.blockActivations[c].savedBytes += bytes;
    }
  }
  // A copy's input: stored tensors its ops read that were produced before it.
  std::vector<uint32_t> seenIn(g.tensors.size(), kNone); // the copy that last counted it
  for (size_t c = 0; c < f.copies.size(); ++c) {
    for (OpId o : f.copies[c].ops)
      for (TensorId t : g.ops[o].inputs) {
        TensorId b = g.storageOf(t);
        OpId p = g.tensors[b].producer;
        if (!f.isActivation(b) || seenIn[b] == c || (p != kNone && f.copyOfOp[p] == c))
          continue;
        seenIn[b] = static_cast<uint32_t>(c);
        a.blockActivations[c].inputBytes += f.bytes(b);
      }
  }
}

/// The paths whose inputs a policy keeps: the first copy of each recomputed segment.
std::vector<std::string> keptPaths(const Facts &f, const Policy &p) {
  std::vector<std::string> out;
  for (const auto &sg : p.segments)
    if (sg.first < f.copies.size())
      out.push_back(f.copies[sg.first].path);
  return out;
}

/// The applied plan per copy (Analysis::checkpoint.perBlock): the times all its ops re-run
/// (the copy's forward again), how many of its ops re-run more often (alone: selective), and
/// the bytes its ops' first runs keep past the forward (activations and extra
/// buffers made in the forward and still live when the backward starts: saved for a backward
/// or kept as the input of a recomputed segment; Walk::keptPerCopy).
void perBlock(const Facts &f, const Walk &w, Analysis &a) {
  size_t L = f.copies.size();
  std::vector<int64_t> runs(f.g.ops.size(), 0);
  for (const ScheduleStep &st : w.schedule)
    if (st.kind == ScheduleStep::Recompute)
      ++runs[st.op];
  a.checkpoint.perBlock.assign(L, {});
  for (size_t c = 0; c < L; ++c) {
    auto &b = a.checkpoint.perBlock[c];
    b.path = f.copies[c].path;
    b.reruns = runs[f.copies[c].ops.front()];
    for (OpId o : f.copies[c].ops)
      b.reruns = std::min(b.reruns, runs[o]);
    for (OpId o : f.copies[c].ops)
      b.reselected += runs[o] > b.reruns;
  }
  for (size_t c = 0; c < L && c < w.keptPerCopy.size(); ++c)
    a.checkpoint.perBlock[c].keptBytes = w.keptPerCopy[c];
}

using TradeOffPoint = decltype(Analysis::checkpoint)::Point;

/// The peak per device as the report gives it for activations and workspace of `bytes`: the
/// allocator reserve (StaticMemory.cpp) on everything but the context and the communication
/// buffers. Reads the model states' bytes (staticMemory), which no later pass writes.
double curvePeak(const Analysis &a, double bytes) {
  return reservedPeak(a, staticBytes(a) - unallocatedBytes(a) + bytes);
}

/// A policy's point on the trade-off curve, from its walk.
TradeOffPoint curvePoint(const Analysis &a, const std::string &name, int64_t checkpointed,
                         const Walk &w, StepScale scale) {
  return {name, checkpointed, curvePeak(a, deviceBytes(w, *a.plan)), w.recomputeFlops * scale.flops,
          w.recomputeTime * scale.seconds};
}

/// The trade-off curve (Analysis::checkpoint.curve): the Pareto front of (peak per device,
/// recompute seconds) over auto's candidates and nested plans for 3/4, 1/2 and 1/4 of its
/// limit, or, for another policy, over none, up to 4 evenly spaced partial counts, full and
/// the plan itself (`own`, its point). A point stays when no other needs no more memory for
/// less recompute.
void tradeOffCurve(const Facts &f, Analysis &a, const TradeOffPoint &own, StepScale scale) {
  const Plan &plan = *a.plan;
  size_t L = f.copies.size();
  decltype(a.checkpoint.curve) points;
  auto add = [&](const std::string &name, int64_t checkpointed, const Walk &x) {
    points.push_back(curvePoint(a, name, checkpointed, x, scale));
  };
  for (const auto &o : a.checkpoint.options)
    points.push_back({o.policy, o.checkpointed, curvePeak(a, o.bytes), o.recomputeFlops,
                      o.recomputeSeconds});
  if (plan.checkpoint == "auto") {
    for (double part : {0.75, 0.5, 0.25})
      if (std::optional<Policy> n = nestedPolicy(f, a, a.checkpoint.limitBytes * part, false))
        add(n->name, static_cast<int64_t>(n->checkpointed()), compareWalk(f, a, *n));
  } else {
    size_t stride = std::max<size_t>(1, (L + 3) / 4);
    for (size_t m = 0; m < L; m += stride) {
      Policy p = partialPolicy(m, L);
      add(p.name, static_cast<int64_t>(m), compareWalk(f, a, p));
    }
    Policy full = partialPolicy(L, L);
    add(full.name, static_cast<int64_t>(L), compareWalk(f, a, full));
  }
  points.push_back(own);
  std::stable_sort(points.begin(), points.end(), [](const auto &x, const auto &y) {
    return x.recomputeSeconds != y.recomputeSeconds ? x.recomputeSeconds < y.recomputeSeconds
                                                    : x.peakBytes < y.peakBytes;
  });
  a.checkpoint.curve.clear();
  for (const auto &pt : points)
    if (a.checkpoint.curve.empty() || pt.peakBytes < a.checkpoint.curve.back().peakBytes)
      a.checkpoint.curve.push_back(pt);
}

} // namespace

void prepareWalks(Analysis &a) { structureOf(a); }

void planActivations(Analysis &a, std::function<void()> *curveLater) {
  const Plan &plan = *a.plan;
  Facts f = gatherFacts(a);
  StepScale scale = stepScale(plan);
  a.checkpoint.requested = plan.checkpoint;
  a.checkpoint.blocks = static_cast<int64_t>(f.copies.size());
  // auto ranks the copies by what they keep; the facts decide it (the walk memo's variant).
  if (f.walked && f.walked->blocksBuilt) {
    a.blockActivations = f.walked->blocks;
  } else {
    blockActivations(f, a);
    if (f.walked) {
      f.walked->blocks = a.blockActivations;
      f.walked->blocksBuilt = true;
    }
  }
  Policy p = requestedPolicy(f, a, scale, plan.checkpoint);
  // A candidate priced alone (Analysis::priceOnly) needs the peak and, for its step time, the
  // schedule's Recompute steps, not the buffers: its walk may come from the memo, which keeps
  // no schedule, but does keep those steps once a candidate applied the policy.
  // The applied policy's buffers, for the memory plan (Analysis::listPlan): listed, or only
  // summed when nothing reads the list — then the plan fits 64-bit byte offsets when the
  // sum with the local gradients' bound does (planMemory), and else the buffers are listed
  // after all, for the memory plan to say what does not fit.
  bool list = !a.priceOnly && a.listPlan;
  bool perCopy = plan.isTrain && !f.copies.empty() && !a.priceOnly;
  std::optional<int64_t> aligned = 0;
  Walk w = walk(f, a, p, list, a.priceOnly || list ? nullptr : &aligned, perCopy);
  if (!a.priceOnly && !list) {
    const std::optional<int64_t> &local = a.localGradientBytes; // analyze took it from the step
    if (!aligned || !local || !checkedAdd(*aligned, *local)) {
      w = walk(f, a, p, true, nullptr, perCopy);
      list = true;
      if (!a.step || a.step->skipped.count > 0) { // released, or compact: the listed plan reads it whole
        a.step = std::make_shared<const Graph>(buildTrainingStep(*a.graph, plan));
        a.stepReleased = false;
      }
    }
  }
  a.planListed = list;
  std::shared_ptr<const std::vector<ScheduleStep>> recomputeSteps;
  if (a.priceOnly && w.memo && w.memo->recomputeSteps) {
    recomputeSteps = w.memo->recomputeSteps; // the schedule is not built again
  } else {
    if (w.schedule.empty())
      buildSchedule(f, p, w);
    if (a.priceOnly) {
      auto steps = std::make_shared<std::vector<ScheduleStep>>();
      for (const ScheduleStep &st : w.schedule)
        if (st.kind == ScheduleStep::Recompute)
          steps->push_back(st);
      recomputeSteps = steps;
      if (w.memo)
        w.memo->recomputeSteps = recomputeSteps;
    }
  }

  a.checkpoint.policy = p.name;
  if (!p.selectiveOps.empty()) {
    // Which ops selective re-runs, by kind: "selective re-runs 8 ops: 4 gelu, 4 layer_norm".
    std::map<std::string, int64_t> kinds;
    for (OpId o : p.selectiveOps)
      ++kinds[opName(f.g.ops[o].kind).str()];
    std::string list;
    for (const auto &kv : kinds)
      list += (list.empty() ? "" : ", ") + std::to_string(kv.second) + " " + kv.first;
    a.checkpoint.note = (p.name.find("selective_wide") != std::string::npos ? "selective_wide"
                                                                             : "selective") +
                        std::string(" re-runs ") + std::to_string(p.selectiveOps.size()) +
                        " ops alone before the backward that needs their outputs: " + list;
  } else if (p.reselected > 0) {
    a.checkpoint.note = "the nested plan also re-runs " + std::to_string(p.reselected) +
                        " cheap ops (norms, GELU/SiLU, unfused attention) alone before the "
                        "backward of the blocks it keeps";
  } else if (p.name == "selective") {
    a.checkpoint.note = "selective found no attention core to re-run (it re-runs unfused "
                        "attention, Megatron's selective recompute; flash attention keeps no "
                        "scores; selective_wide also re-runs norms and GELU/SiLU)";
  } else if (p.name == "selective_wide") {
    a.checkpoint.note = "selective_wide found no op to re-run (no GELU, SiLU, norm or unfused "
                        "attention whose output another op keeps)";
  }
  a.checkpoint.checkpointed = static_cast<int64_t>(p.checkpointed());
  a.checkpoint.segment = static_cast<int64_t>(p.segment());
  if (p.opSegments.empty())
    a.checkpoint.saved = keptPaths(f, p); // keep lists wrote theirs
  a.checkpoint.recomputeFlops = w.recomputeFlops * scale.flops;
  a.flops.recompute = a.checkpoint.recomputeFlops;
  a.flops.executed += w.recomputeExecuted * scale.flops;

  a.memory.activations = deviceActivations(w, plan);
  a.memory.workspace = w.peakOther / contextShare(plan);
  a.memory.peak = staticBytes(a) + a.memory.activations + a.memory.workspace;

  // The curve is for reports: the layout search and the budget-fix trials re-analyse plans
  // thousands of times and read only the peak and the times (a curve there made `tally
  // solve layout` 4× slower).
  bool curve = plan.isTrain && !f.copies.empty() && !a.priceOnly && !a.whatIf &&
               (!a.diagnosticsOnly || plan.checkpoint == "auto");
  if (plan.isTrain && !f.copies.empty() && !a.priceOnly)
    perBlock(f, w, a);

  a.livePeakBytes = w.peakSaved + w.peakOther;
  a.peakStep = w.peakStep;
  // The plan's own analysis (not a solver's candidate) walks no more after the curve (only a
  // budget fix search would, which makes them again): the walks' working lists and the
  // graph's facts go back then, before the memory plan makes its own (250 MB of a
  // 100,000-layer check's peak). The walks done stay in the memo.
  auto release = [&a](Facts &facts) {
    if (a.priceOnly || !facts.memo)
      return;
    facts.memo->scratch = WalkScratch();
    if (facts.memo->structure.use_count() == 2) // the memo's and these facts': no one else reads it
      facts.memo->structure.reset();
  };
  if (curve) {
    TradeOffPoint own = curvePoint(a, p.name, static_cast<int64_t>(p.checkpointed()), w, scale);
    if (curveLater && f.g.ops.size() >= kThreadedOps) {
      // Left to the caller, with what the walks read that later passes write: the records.
      struct Later {
        Facts facts;
        OpTable ops;
      };
      auto later = std::make_shared<Later>(Later{std::move(f), a.ops});
      later->facts.ops = &later->ops;
      *curveLater = [later, own, scale, release, &a] {
        tradeOffCurve(later->facts, a, own, scale);
        release(later->facts);
      };
    } else {
      tradeOffCurve(f, a, own, scale);
      release(f);
    }
  } else {
    release(f);
  }
  // A candidate priced alone keeps only the Recompute steps, in order: its step time reads
  // no other (Analysis::schedule).
  a.schedule = a.priceOnly ? *recomputeSteps : std::move(w.schedule);
  a.buffers = std::move(w.buffers);
}

} // namespace tally
