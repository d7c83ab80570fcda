// Step 1 of the activation-memory pass (passes/Activations.cpp): the facts about the graph
// that its walks read. The graph's part (FactsStructure: which ops have a backward, who reads,
// keeps and writes each stored activation, the gradients' producers and readers), built once
// per graph and kept in the walk memo; then the layout's part (tensor-parallel and sequence
// splits, each op's roofline time, each buffer's bytes on one device), and the walk memo's
// variant for these facts (WalkMemo).
#include "passes/ActivationsInternal.h"
#include "passes/TensorParallel.h"

#include <cmath>
#include <cstring>

namespace tally {

std::shared_ptr<WalkMemo> newWalkMemo() { return std::make_shared<WalkMemo>(); }

std::shared_ptr<LayoutFactsMemo> newLayoutFactsMemo(size_t keep) {
  return std::make_shared<LayoutFactsMemo>(keep);
}

std::pair<size_t, size_t> layoutFactsCounts(const LayoutFactsMemo &memo) {
  return {memo.entries.made(), memo.entries.reused()};
}

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

namespace activations {

namespace {

/// Megatron's split, propagated in topological order (see step 1 of passes/Activations.cpp).
void markSplit(LayoutFacts &lf, const FactsStructure &st, double tensorDegree,
               const TensorParallel &tp) {
  const Graph &g = *st.graph;
  lf.split.assign(g.tensors.size(), false);
  if (tensorDegree <= 1)
    return;
  // The split the step time prices (StepTime.cpp, tensorSplit): one rule.
  lf.split = tp.storageSplit;
  // moe's saved expert buffers (outputs 1-4) are split like an MLP's hidden; y is whole.
  for (OpId o : st.moeOps) {
    const Op &op = g.ops[o];
    for (size_t i = 1; i < op.outputs.size(); ++i)
      lf.split[g.storageOf(op.outputs[i])] = true;
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
      key.opFacts.size() != f.g.ops.size() || key.padLogits != f.padLogits || key.padGrow != f.padGrow)
    return false;
  if (key.fp8Bytes != a.fp8.savedBytes &&
      (!key.fp8Bytes || !a.fp8.savedBytes || *key.fp8Bytes != *a.fp8.savedBytes))
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
  key.fp8Bytes = a.fp8.savedBytes;
  key.padLogits = f.padLogits;
  key.padGrow = f.padGrow;
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
    f.stored.push_back(t);
    if (tensor.producer == kNone)
      f.sources.push_back(t);
    else if (f.train && tensor.requiresGrad)
      f.gradProducer[t] = tensor.producer;
    for (OpId r : f.readers[t])
      if (f.hasBackward[r])
        f.gradReader[t] = r; // readers are in op order
  }
  static const GradientShares none;
  f.shares = &none;
  if (f.train) {
    f.sharesOnce = a.gradientShares && a.gradientShares->graph() == &g
                       ? a.gradientShares
                       : std::make_shared<GradientSharesOnce>(g);
    f.shares = &f.sharesOnce->get();
  }
  f.opClasses.resize(g.ops.size());
  for (OpId o = 0; o < g.ops.size(); ++o) {
    f.backwardOps += f.hasBackward[o];
    f.opClasses[o] = opClass(g.ops[o].kind);
    if (g.ops[o].kind == OpKind::Moe)
      f.moeOps.push_back(o);
  }
  f.tensorBytes.resize(g.tensors.size());
  for (TensorId t = 0; t < g.tensors.size(); ++t)
    f.tensorBytes[t] = g.bytes(t);
  return st;
}

} // namespace

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

StepScale stepScale(const Plan &plan) {
  if (!plan.isTrain)
    return {};
  double micro = static_cast<double>(plan.batch) / static_cast<double>(plan.microBatch);
  return {micro, micro / degree(plan.parallel.data) / degree(plan.parallel.pipeline)};
}

namespace {

/// The layout's part of the facts (LayoutFacts) for analysis `a`, made into `lf`; `f` views
/// it (its members are lf's) and is read for the bytes of a stored tensor.
void makeLayoutFacts(LayoutFacts &lf, const Facts &f, const Analysis &a,
                     const TensorParallel &tp) {
  const Graph &g = *a.graph;
  markSplit(lf, *f.structure, f.tensorDegree, tp);
  // Sequence parallelism (Korthikanti et al. 2022; passes/StepTime.cpp): the activations outside
  // the tensor-parallel regions are split over the sequence (TensorSplit.cpp, sequenceSplit), so
  // every activation is split but the embedding section's before it is scattered and, under
  // Plan::tensorStep, the whole head's logits and loss.
  if (a.plan->parallel.sequenceParallel && f.tensorDegree > 1) {
    const std::vector<bool> &seq = tp.sequenceSplit;
    for (TensorId t = 0; t < g.tensors.size() && t < seq.size(); ++t)
      lf.split[t] = lf.split[t] || (f.isActivation(t) && seq[g.storageOf(t)]);
  }
  lf.opTime.assign(g.ops.size(), 0);
  // Computed once per shared record and op class (OpTable::recordOf): a deep model's layers
  // share their records.
  // Each op's time is one device's: its work over its tensor and context split, as the step
  // time divides it (StepTime.cpp, opWorkSplits).
  struct Known {
    bool made = false;
    OpClass c = OpClass::View;
    double split = 1, time = 0;
  };
  const std::vector<double> &splits = tp.split;
  std::vector<Known> timeOfRecord(a.ops.recordSlots());
  const std::vector<OpClass> &classes = f.structure->opClasses;
  for (OpId o = 0; o < g.ops.size(); ++o) {
    OpClass c = classes[o];
    Known &known = timeOfRecord[a.ops.recordOf(o)];
    if (!known.made || known.c != c || known.split != splits[o]) {
      const OpAnalysis &oa = a.ops[o];
      KernelWork work;
      work.flops = oa.forward.executedFlops;
      work.bytes = oa.forward.bytesRead + oa.forward.bytesWritten;
      work.transcendentals = oa.forward.transcendentals;
      work.outsideBytes = flashOutsideBytes(a, o, false);
      work.measuredArithmetic = unaryArithmetic(a.plan->target, g, g.ops[o], false);
      work.calls = oa.forward.kernels; // an eager norm's eight
      work.forks = forkingCalls(a.plan->target, g, g.ops[o], splits[o], work.calls);
      known = {true, c, splits[o],
               kernelTime(a.plan->target, c, oa.computeDtype, splitWork(work, splits[o]))};
    }
    lf.opTime[o] = known.time;
  }
  lf.tensorBuffer.assign(g.tensors.size(), 0);
  for (TensorId t : f.structure->stored)
    lf.tensorBuffer[t] = std::ceil(f.bytes(t));
  lf.extraBuffer.assign(f.extras.items.size(), 0);
  for (OpId o = 0; o < g.ops.size(); ++o) {
    if (f.extraCount(o) == 0)
      continue;
    double divisor = f.buffersSplit(g.ops[o]) ? f.tensorDegree : 1;
    for (uint32_t k = 0; k < f.extraCount(o); ++k)
      lf.extraBuffer[f.extras.start[o] + k] = std::ceil(a.savedOf(o)[f.extras.of(o)[k]].bytes / divisor);
    // An op whose backward holds a working set (the eager loss) keeps an extra buffer for that
    // backward, so it is among these ops: no second pass over a deep model's ops.
    if (f.hasBackward[o])
      if (double scratch = backwardScratch(g, g.ops[o]); scratch > 0)
        lf.backwardScratch.emplace_back(o, std::ceil(scratch / divisor));
  }
  if (a.walks)
    lf.walked = memoVariant(*a.walks, f, a);
}

} // namespace

/// Step 1: the graph's part (structureOf), then the layout's: Analysis::layoutFacts' entry
/// for the same inputs, else made (and kept there, when there is a memo).
Facts gatherFacts(const Analysis &a) {
  std::shared_ptr<const FactsStructure> st = structureOf(a);
  std::shared_ptr<const TensorParallel> tp = tensorParallelOf(a);
  // The key's split is the graph part's (tensorParallelOf's memo); without that memo each
  // call makes a new split and no entry could be read again.
  LayoutFactsMemo *memo = a.tensorParallelMemo ? a.layoutFacts.get() : nullptr;
  LayoutFactsMemo::Key key;
  if (memo) {
    key = {a.walks, tp, a.saved, a.fp8.savedBytes,
           a.headPad.applies() ? a.headPad.logits : kNone,
           a.headPad.applies() ? static_cast<double>(a.headPad.padded) / static_cast<double>(a.headPad.vocab) : 1.0,
           a.plan->target.share};
    if (const auto *found = memo->entries.find([&](const LayoutFactsMemo::Key &k) { return k == key; })) {
      Facts f(a, std::move(st), *found);
      f.memo = a.walks.get();
      return f;
    }
  }
  auto lf = std::make_shared<LayoutFacts>();
  Facts f(a, std::move(st), lf);
  f.memo = a.walks.get();
  makeLayoutFacts(*lf, f, a, *tp);
  f.walked = lf->walked;
  if (memo)
    memo->entries.add(std::move(key), lf);
  return f;
}

} // namespace activations
} // namespace tally
