// Autodiff and step assembly, a transform: the forward graph of a train plan becomes the whole
// training step — the forward ops unchanged (same ids), then the backward ops that compute
// every gradient, then the optimizer phase (overflow check, update, zero-grad). The analyses
// price these ops and codegen prints them; docs/ir.md describes the result.
//
// 1. Which tensors get a gradient: walk the forward in reverse from the loss. An op's
//    backward runs when one of its outputs has a gradient and one of its inputs needs one
//    (requiresGrad: float tensors computed from a trainable parameter; never data, integers or
//    frozen parameters). Views have no backward op: the gradient of a view is the same view of
//    its base's gradient, so `transpose(wte.weight)` in a tied head writes straight into the
//    embedding's gradient, and the parts of a split write into one buffer.
// 2. How each gradient is written. A parameter's gradient lives in the flat grads region and is
//    always accumulated (zero-grad runs after each update, so the micro-batches of a step sum
//    there). An activation read by several ops gets one gradient: the first writer (in backward
//    order) overwrites it, later writers add in place (accumulate bit of the op: the kernels'
//    `+=`, like llm.c, not an extra op and, as in PyTorch's derivative counts, no extra FLOPs).
//    Writes through views are in place too: the parts of one split each overwrite their own
//    part; any other mix of views starts with a zero fill.
// 3. The backward of each op, one builder per kind (PyTorch's derivatives.yaml, written once:
//    the table of passes/BackwardTable.h, each kind's entry in its family's file): matmul as
//    two matmuls over transposed views (flattening the batch when the other operand is a
//    weight), elementwise ops as elementwise ops, and a backward kind per fused op (norms,
//    softmax, attention, cross entropy, embedding, moe; topk and gather scatter_add).
//    A gradient computed at a broadcast shape is summed back with reduce_to. The loss gradient
//    is a fill of 1 / micro-steps (× the loss scale under fp16 loss scaling).
// 4. The optimizer phase: under loss scaling a sum_squares over the gradients (the overflow
//    check that skips the step), the optimizer_update over the flat parameter region, and
//    zero_grad of the gradient region for the next step.
// 5. A compact step (for the passes that only price and check it: `tally check` and the
//    reports; Graph::Skipped). A deep model's step is mostly its repeat copies' backward ops,
//    each copy's those of the copy after it with every id shifted: at 100,000 layers, 2.4
//    million ops and 4.5 million tensors made, priced and checked one by one, and then
//    released (a compact one: 131 ops and 1.2 million tensors, the parameters' gradients). The builder's work on a copy reads only the copy's forward ops and tensors, the
//    write modes of their gradients (step 2), and whether each of their gradients exists and
//    was written yet. So when (a) the copies of a run are each the one before with every id
//    shifted (ops, attributes, tensor records, parameters), (b) no op outside a copy reads its
//    tensors but the next copy, which reads one (its output), and (c) two copies built one
//    after the other found those states the same at their start and made the same backward
//    ops and tensors (ids shifted), then each copy below them would make them again: those
//    copies are not built, down to the run's lowest, which is (its input gradient, which they
//    would have written, is made for it: Skipped::boundary). The checks are exact
//    comparisons; when one fails, the step is whole.
#include "passes/BackwardBuilder.h"
#include "passes/HeadPadding.h"

#include <algorithm>

namespace tally {

namespace backward {

// ------------------------------------------------------------------------------------------
// Steps 1 and 2: which ops run a backward, and how each gradient is written.

/// Every input of `op` whose gradient the op's backward writes. A kind without a backward
/// (passes/BackwardTable.h: a view, whose gradient is its base's, or an integer index
/// generator) writes none; integer inputs (embedding ids, gather indices) need none.
template <class F> void Builder::contributions(const Op &op, F f) {
  if (!backwardFor(op.kind).build)
    return;
  for (unsigned i = 0; i < op.inputs.size(); ++i)
    if (needs(op.inputs[i]))
      f(op.inputs[i]);
}

bool Builder::runsBackward(const Op &op) const {
  if (!backwardFor(op.kind).build || op.outputs.empty())
    return false;
  return hasGrad[base(op.outputs[0])];
}

void Builder::planWrites(size_t forwardOps) {
  size_t n = forwardTensors;
  hasGrad.assign(n, false);
  mode.assign(n, Overwrite);
  written.assign(n, false);
  // The tensors (bases or views) through which each base's gradient is written, in
  // backward order, as one list grouped by base (a list per tensor was a small allocation
  // per activation: an eighth of a 30,000-layer check's page faults).
  std::vector<std::pair<TensorId, TensorId>> writes; // (base, tensor written)
  size_t inputs = 0; // at most one write per input of a forward op: room for them once
  for (OpId o = 0; o < forwardOps; ++o)
    inputs += g.ops[o].inputs.size();
  writes.reserve(inputs);
  hasGrad[g.loss] = true;
  for (OpId o = static_cast<OpId>(forwardOps); o-- > 0;) {
    const Op &op = g.ops[o];
    if (!runsBackward(op))
      continue;
    contributions(op, [&](TensorId x) {
      TensorId b = base(x);
      hasGrad[b] = true;
      writes.emplace_back(b, x);
    });
  }
  TensorLists byBase;
  byBase.build(n, writes);
  for (TensorId b = 0; b < n; ++b) {
    llvm::ArrayRef<TensorId> through = byBase[b];
    if (through.empty())
      continue;
    if (g.tensors[b].role == TensorRole::Param) {
      mode[b] = Accumulate;
      continue;
    }
    bool viaViews = std::any_of(through.begin(), through.end(), [&](TensorId x) { return x != b; });
    if (!viaViews) {
      mode[b] = Overwrite;
      continue;
    }
    // The parts of one split, each written once, all of them: each overwrites its part.
    OpId split = g.tensors[through[0]].producer;
    bool parts = split != kNone && g.ops[split].kind == OpKind::Split &&
                 through.size() == g.ops[split].outputs.size();
    std::vector<TensorId> sorted = through.vec();
    std::sort(sorted.begin(), sorted.end());
    parts = parts && std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
    for (TensorId x : through)
      parts = parts && g.tensors[x].producer == split;
    mode[b] = parts ? SplitParts : ZeroFirst;
  }
}

} // namespace backward

namespace {

using backward::Builder;

// ------------------------------------------------------------------------------------------
// Step 5: the run of repeat copies a compact step may skip.

/// Copies first .. first + count - 1 (RepeatCopies indices): copy first + i has the forward
/// ops [op0 + i·n, op0 + (i + 1)·n), and its tensors, parameter tensors, parameters and
/// instances are copy first's shifted by i·dt, i·dpt, i·dp and i·di (lowering makes every
/// parameter before any activation).
struct CopyRun {
  uint32_t first = 0, count = 0;
  OpId op0 = 0, n = 0;
  int64_t dt = 0, dpt = 0, dp = 0, di = 0;
  /// The run's copy whose last forward op is `o` (the backward meets it first), or -1.
  int64_t copyEndingAt(OpId o) const {
    if (n == 0 || o < op0 || (o - op0 + 1) % n != 0)
      return -1;
    int64_t i = (o - op0 + 1) / n - 1;
    return i < count ? i : -1;
  }
};

/// Finds the longest run of copies each of which is the copy before with every id shifted
/// (step 5 (a)) and whose tensors no op outside them reads but the next copy, which reads its
/// one output (b; the run's last copy's tensors may be read by anything: it is built).
class RunFinder {
public:
  RunFinder(const Graph &g, const RepeatCopies &rc) : g(g), rc(rc) {}

  std::optional<CopyRun> find() {
    size_t nCopies = rc.copies.size();
    if (nCopies < 2)
      return std::nullopt;
    ownership();
    CopyRun best, cur;
    for (uint32_t c = 0; c + 1 < nCopies; ++c) {
      CopyRun shift;
      bool ok = pairShift(c, shift);
      bool extends = ok && cur.count > 0 && cur.first + cur.count - 1 == c && shift.n == cur.n &&
                     shift.dt == cur.dt && shift.dpt == cur.dpt && shift.dp == cur.dp &&
                     shift.di == cur.di;
      if (extends) {
        cur.count += 1;
      } else if (ok) {
        cur = shift;
        cur.first = c;
        cur.count = 2;
      } else {
        cur = CopyRun();
      }
      if (cur.count > best.count)
        best = cur;
    }
    if (best.count == 0)
      return std::nullopt;
    return best;
  }

  /// Whether copy c's tensors are read only by its own ops and its one output by copy c + 1
  /// (step 5 (b)); that output, or kNone.
  bool sealed(uint32_t c) const { return !leaky[c] && boundary[c] != kNone; }
  TensorId outputOf(uint32_t c) const { return boundary[c]; }
  /// The id of forward tensor `t`'s counterpart one copy on (t shifted when a copy makes it).
  TensorId shifted(TensorId t, const CopyRun &s) const {
    if (owner[t] == kNone)
      return t;
    return static_cast<TensorId>(t + (g.tensors[t].role == TensorRole::Param ? s.dpt : s.dt));
  }

private:
  const Graph &g;
  const RepeatCopies &rc;
  std::vector<uint32_t> owner;    ///< per forward tensor: the copy that makes it (its producer's, or its parameter's instance's)
  std::vector<TensorId> boundary; ///< per copy: the one tensor of it the next copy reads
  std::vector<bool> leaky;        ///< per copy: some other op reads its tensors

  void ownership() {
    size_t nCopies = rc.copies.size();
    owner.assign(g.tensors.size(), kNone);
    for (OpId o = 0; o < g.ops.size(); ++o)
      if (rc.ofOp[o] != kNone)
        for (TensorId t : g.ops[o].outputs)
          owner[t] = rc.ofOp[o];
    for (const ParamInfo &p : g.params)
      if (p.instance < rc.ofInstance.size())
        owner[p.tensor] = rc.ofInstance[p.instance];
    boundary.assign(nCopies, kNone);
    leaky.assign(nCopies, false);
    for (OpId o = 0; o < g.ops.size(); ++o) {
      uint32_t reader = rc.ofOp[o];
      for (TensorId t : g.ops[o].inputs) {
        uint32_t c = owner[t];
        if (c == kNone || c == reader)
          continue;
        if (reader != kNone && reader == c + 1 && (boundary[c] == kNone || boundary[c] == t))
          boundary[c] = t;
        else
          leaky[c] = true;
      }
    }
    for (TensorId t : g.outputs)
      if (owner[t] != kNone)
        leaky[owner[t]] = true;
    if (g.loss != kNone && owner[g.loss] != kNone)
      leaky[owner[g.loss]] = true;
  }

  /// Whether copy c + 1's forward ops are copy c's with every id shifted; the shifts.
  bool pairShift(uint32_t c, CopyRun &s) {
    const std::vector<OpId> &A = rc.copies[c].ops, &B = rc.copies[c + 1].ops;
    if (A.empty() || A.size() != B.size())
      return false;
    OpId n = static_cast<OpId>(A.size()), a0 = A[0], b0 = B[0];
    if (b0 != a0 + n || A.back() != a0 + n - 1 || B.back() != b0 + n - 1)
      return false; // each copy's ops are consecutive (A[i] < A[i + 1]: op order)
    s.op0 = a0;
    s.n = n;
    s.di = static_cast<int64_t>(g.ops[b0].instance) - static_cast<int64_t>(g.ops[a0].instance);
    bool haveDt = false, haveDpt = false, haveDp = false;
    auto sameTensor = [&](TensorId ta, TensorId tb) {
      if (ta == tb)
        return owner[ta] == kNone; // read by both copies: made outside every copy
      uint32_t oa = owner[ta];
      if (oa == kNone || owner[tb] != oa + 1 || (oa != c && oa + 1 != c))
        return false;
      const Tensor &x = g.tensors[ta], &y = g.tensors[tb];
      bool param = x.role == TensorRole::Param;
      int64_t d = static_cast<int64_t>(tb) - static_cast<int64_t>(ta);
      int64_t &shift = param ? s.dpt : s.dt;
      bool &have = param ? haveDpt : haveDt;
      if (have && d != shift)
        return false;
      shift = d;
      have = true;
      if (x.shape != y.shape || x.dtype != y.dtype || x.role != y.role ||
          x.requiresGrad != y.requiresGrad || !(x.layout == y.layout) || x.gradOf != y.gradOf)
        return false;
      if ((x.viewOf == kNone) != (y.viewOf == kNone) ||
          (x.viewOf != kNone && shifted(x.viewOf, s) != y.viewOf))
        return false;
      if ((x.producer == kNone) != (y.producer == kNone) ||
          (x.producer != kNone && y.producer != x.producer + n))
        return false;
      if ((x.param == kNone) != (y.param == kNone))
        return false;
      if (x.param != kNone) {
        int64_t dp = static_cast<int64_t>(y.param) - static_cast<int64_t>(x.param);
        if ((haveDp && dp != s.dp) || g.params[x.param].trainable != g.params[y.param].trainable)
          return false;
        s.dp = dp;
        haveDp = true;
      }
      return true;
    };
    for (OpId j = 0; j < n; ++j) {
      const Op &a = g.ops[a0 + j], &b = g.ops[b0 + j];
      if (a.kind != b.kind || a.phase != b.phase || a.ordinal != b.ordinal ||
          a.accumulate != b.accumulate || !sameAttrs(*a.attrs, *b.attrs) ||
          static_cast<int64_t>(b.instance) - static_cast<int64_t>(a.instance) != s.di ||
          a.inputs.size() != b.inputs.size() || a.outputs.size() != b.outputs.size())
        return false;
      for (size_t i = 0; i < a.inputs.size(); ++i)
        if (!sameTensor(a.inputs[i], b.inputs[i]))
          return false;
      for (size_t i = 0; i < a.outputs.size(); ++i)
        if (!sameTensor(a.outputs[i], b.outputs[i]))
          return false;
    }
    return haveDt;
  }
};

/// Step 5 in the backward loop: notes where each copy of the run begins (its last forward op,
/// which the loop meets first), compares the backward of the run's third- and second-last
/// copies (the model, and the copy after it), and says where the loop goes on.
class Skipper {
public:
  Skipper(Builder &b, const RunFinder &f, const CopyRun &run)
      : b(b), g(b.g), f(f), run(run), opsAt(run.count, 0), tensorsAt(run.count, 0) {}

  /// Called before the backward of op `o`. True when the copies below the model are skipped
  /// from here: then `o` is where the loop goes on (it goes on at o - 1, the last op of the
  /// run's first copy).
  bool before(OpId &o) {
    int64_t i = run.copyEndingAt(o);
    if (i < 0)
      return false;
    int64_t m = static_cast<int64_t>(run.count);
    opsAt[i] = g.ops.size();
    tensorsAt[i] = g.tensors.size();
    if (i == m - 2)
      entryState(i, modelNext);
    if (i == m - 3)
      entryState(i, model);
    if (i == m - 4 && skip()) {
      g.skipped.count = static_cast<uint32_t>(m - 4);
      g.skipped.first = run.first + 1;
      g.skipped.model = run.first + static_cast<uint32_t>(m - 3);
      g.skipped.modelTensorsBegin = static_cast<TensorId>(tensorsAt[m - 3]);
      g.skipped.modelTensorsEnd = static_cast<TensorId>(g.tensors.size());
      TensorId y = f.outputOf(run.first); // the skipped copies' lowest input
      g.skipped.boundary = b.gradOf(y);
      b.written[y] = true;
      o = run.op0 + run.n;
      return true;
    }
    return false;
  }

private:
  Builder &b;
  Graph &g;
  const RunFinder &f;
  const CopyRun &run;
  std::vector<size_t> opsAt, tensorsAt; ///< per copy of the run: the step's sizes when its backward began
  std::vector<uint8_t> modelNext, model; ///< entryState of the model and of the copy after it
  std::vector<uint8_t> state; ///< entryState of the copy skip() compares (one list for all)

  OpId firstOp(int64_t i) const { return run.op0 + static_cast<OpId>(i) * run.n; }

  /// Per tensor slot of copy i's forward ops, in order: whether its gradient exists, whether
  /// something wrote it, its write mode and whether it gets one (steps 1 and 2); into `st`,
  /// which the copies compared in turn share (a list made per copy was 1% of a check).
  void entryState(int64_t i, std::vector<uint8_t> &st) const {
    st.clear();
    for (OpId o = firstOp(i); o < firstOp(i) + run.n; ++o) {
      auto add = [&](TensorId t) {
        TensorId base = b.base(t);
        st.push_back(static_cast<uint8_t>((g.gradient[t] != kNone ? 1 : 0) | (b.written[base] ? 2 : 0) |
                                          (b.hasGrad[base] ? 4 : 0) | (b.mode[base] << 3)));
      };
      for (TensorId t : g.ops[o].inputs)
        add(t);
      for (TensorId t : g.ops[o].outputs)
        add(t);
    }
  }
  /// The write modes and gradient flags alone (bits 2 and up), of copy i's slots.
  static bool samePlan(const std::vector<uint8_t> &x, const std::vector<uint8_t> &y) {
    if (x.size() != y.size())
      return false;
    for (size_t k = 0; k < x.size(); ++k)
      if ((x[k] >> 2) != (y[k] >> 2))
        return false;
    return true;
  }

  /// Whether the copies below the model (but the run's first) may be skipped: step 5 (b) for
  /// them and the first, (c) for the model and the copy after it, and the same write plans.
  bool skip() {
    int64_t m = static_cast<int64_t>(run.count);
    if (m < 5 || model.empty() || model != modelNext)
      return false;
    for (int64_t i = 0; i <= m - 4; ++i)
      if (!f.sealed(run.first + static_cast<uint32_t>(i)))
        return false;
    for (int64_t i = 1; i <= m - 4; ++i) {
      entryState(i, state);
      if (!samePlan(state, model))
        return false;
    }
    TensorId y = f.outputOf(run.first), modelInput = f.outputOf(run.first + static_cast<uint32_t>(m - 4));
    if (g.tensors[y].viewOf != kNone || g.gradient[y] != kNone || b.written[y] ||
        g.tensors[modelInput].viewOf != kNone || g.gradient[modelInput] == kNone || !b.written[modelInput])
      return false;
    return sameBlocks(opsAt[m - 3], g.ops.size(), tensorsAt[m - 3], g.tensors.size(),
                      opsAt[m - 2], tensorsAt[m - 2]);
  }

  /// Whether the backward ops and tensors made for the model, ops [a0, a1) and tensors
  /// [t0, t1), are those made for the copy after it (from b0 and u0) with every id shifted.
  /// Compared: every field the builder, the costs and the step's check read (a gradient
  /// tensor's producer, its last writer, is none of them, nor an op's source range).
  bool sameBlocks(size_t a0, size_t a1, size_t t0, size_t t1, size_t b0, size_t u0) const {
    size_t fwdT = b.forwardTensors;
    if (b0 + (a1 - a0) != a0 || u0 + (t1 - t0) != t0)
      return false; // the copy after the model's block ends where the model's begins
    auto mapT = [&](TensorId t) -> TensorId {
      if (t == kNone)
        return kNone;
      if (t >= t0 && t < t1)
        return static_cast<TensorId>(t - t0 + u0);
      if (t < fwdT)
        return f.shifted(t, run);
      TensorId u = g.tensors[t].gradOf; // made before the model's block: only an input's gradient
      if (u == kNone || u >= fwdT || g.gradient[u] != t)
        return kNone - 1; // matches nothing
      TensorId v = f.shifted(u, run);
      return v < fwdT ? g.gradient[v] : kNone - 1;
    };
    OpId runBegin = run.op0, runEnd = run.op0 + run.count * run.n;
    auto mapO = [&](OpId o) -> OpId {
      return o != kNone && o >= runBegin && o < runEnd ? o + run.n : o;
    };
    for (size_t k = 0; k < a1 - a0; ++k) {
      const Op &x = g.ops[a0 + k], &y = g.ops[b0 + k];
      if (x.kind != y.kind || x.phase != y.phase || x.accumulate != y.accumulate ||
          !sameAttrs(*x.attrs, *y.attrs) || mapO(x.forwardOp) != y.forwardOp ||
          static_cast<int64_t>(y.instance) - static_cast<int64_t>(x.instance) != run.di ||
          x.inputs.size() != y.inputs.size() || x.outputs.size() != y.outputs.size())
        return false;
      for (size_t i = 0; i < x.inputs.size(); ++i)
        if (mapT(x.inputs[i]) != y.inputs[i])
          return false;
      for (size_t i = 0; i < x.outputs.size(); ++i)
        if (mapT(x.outputs[i]) != y.outputs[i])
          return false;
    }
    for (size_t k = 0; k < t1 - t0; ++k) {
      const Tensor &x = g.tensors[t0 + k], &y = g.tensors[u0 + k];
      if (x.shape != y.shape || x.dtype != y.dtype || x.role != y.role ||
          x.requiresGrad != y.requiresGrad || !(x.layout == y.layout) || x.param != y.param ||
          mapT(x.viewOf) != y.viewOf || mapT(x.gradOf) != y.gradOf)
        return false;
    }
    return true;
  }
};

/// FLOPs per trainable parameter of one optimizer update: see docs/counting.md. Every
/// per-step scalar (lr, bias corrections) is computed once per step and not counted.
double updateFlopsPerParam(const OptimizerSpec &o) {
  bool decay = o.weightDecay > 0;
  const std::string &n = o.name;
  if (n == "AdamW")
    return 13 + (decay ? 1 : 0);
  if (n == "Lion")
    return 9 + (decay ? 1 : 0);
  double f = 0;
  if (n == "Adam")
    f = 13;
  else if (n == "AdaGrad")
    f = 7;
  else if (n == "RMSprop")
    f = 9 + (o.momentum > 0 ? 2 : 0);
  else // SGD
    f = 2 + (o.momentum > 0 ? 2 : 0);
  return f + (decay ? 2 : 0);
}

} // namespace

double optimizerFlopsPerParam(const OptimizerSpec &o, bool lossScaling) {
  return updateFlopsPerParam(o) + (lossScaling ? 1 : 0);
}

bool sameStep(const Plan &a, const Plan &b) {
  return a.isTrain == b.isTrain && a.precision.grads == b.precision.grads &&
         a.precision.lossScaling == b.precision.lossScaling &&
         a.optimizer.name == b.optimizer.name &&
         optimizerFlopsPerParam(a.optimizer, a.precision.lossScaling) ==
             optimizerFlopsPerParam(b.optimizer, b.precision.lossScaling);
}

namespace {
Graph buildStep(const Graph &forward, const Plan &plan, const RepeatCopies *compact,
                GradientSharesOnce *shares);
} // namespace

Graph buildTrainingStep(const Graph &forward, const Plan &plan, const RepeatCopies *compact,
                        GradientSharesOnce *shares) {
  if (shares && shares->graph() != &forward)
    shares = nullptr;
  // The padded LM head (passes/HeadPadding.h): the step of a copy of the forward graph whose
  // head weight and logits are padded, with the same ids, so the memory plan, the arena and
  // the emitter all see the padded buffers. The padding changes three tensors' shapes and
  // nothing else, so the copy's gradient shares are the forward graph's unless an add reads
  // or writes one of them (sharesReadShapeOf).
  HeadPadding hp = headPadding(forward, plan);
  if (hp.applies()) {
    Graph padded = paddedForward(forward, hp);
    if (shares && sharesReadShapeOf(forward, {hp.weight, hp.view, hp.logits}))
      shares = nullptr;
    return buildStep(padded, plan, compact, shares);
  }
  return buildStep(forward, plan, compact, shares);
}

namespace {
Graph buildStep(const Graph &forward, const Plan &plan, const RepeatCopies *compact,
                GradientSharesOnce *shares) {
  // The step begins as the forward graph, sharing its records (Graph::extend: ids and records
  // are the forward's, not copies of them), and reserves room for what it adds once rather
  // than regrowing op by op. Measured: the step has 2.3-2.6 ops per forward op plus about one
  // per parameter, and 2.3-3.1 tensors per forward tensor (GPT-2, Llama-2-7B, Mixtral, a GPT
  // of 100 to 10,000 layers: 3.05, so 3× was short and the last tensors regrew the whole
  // vector). Room never used is never touched: it costs address space, not memory.
  bool train = plan.isTrain && forward.loss != kNone;
  Graph g = forward.extend();
  if (train) {
    g.ops.reserve(4 * forward.ops.size() + 2 * forward.params.size() + 64);
    g.tensors.reserve(4 * forward.tensors.size() + 2 * forward.params.size() + 64);
  }
  g.gradient.reserve(g.tensors.capacity()); // one entry per tensor the step will have
  g.gradient.assign(g.tensors.size(), kNone);
  g.differentiated = true;
  if (!train)
    return g;
  size_t forwardOps = g.ops.size();
  Builder b(g, plan);
  b.planWrites(forwardOps);
  if (shares) {
    b.shares = &shares->get();
  } else {
    b.ownShares = gradientShares(forward);
    b.shares = &b.ownShares;
  }

  // The loss gradient: the step's loss is the mean over its micro-batches, batch / micro_batch
  // of them split over the data-parallel ranks. Each rank seeds 1 / (its micro-batches); the
  // average over the ranks (the step's gradient reduction) divides by the rest.
  double microSteps = static_cast<double>(plan.batch) /
                      (static_cast<double>(plan.microBatch) * static_cast<double>(std::max<int64_t>(1, plan.parallel.data)));
  OpAttrs seed;
  seed.scalar = (plan.precision.lossScaling ? kLossScale : 1.0) / microSteps;
  b.emit(OpKind::Fill, {}, {b.gradOf(g.loss)}, seed);

  // Step 5: a compact step skips what a run of copies would repeat.
  std::optional<RunFinder> finder;
  std::optional<CopyRun> run;
  std::optional<Skipper> skipper;
  if (compact) {
    finder.emplace(forward, *compact);
    run = finder->find();
    if (run && run->count >= 5)
      skipper.emplace(b, *finder, *run);
  }
  for (OpId o = static_cast<OpId>(forwardOps); o-- > 0;) {
    if (skipper && skipper->before(o))
      continue;
    if (b.runsBackward(g.ops[o]))
      b.opBackward(o);
  }

  // Step 4: the optimizer phase over the trainable parameters.
  llvm::SmallVector<TensorId, 3> params, grads;
  for (const ParamInfo &p : g.params)
    if (p.trainable) {
      params.push_back(p.tensor);
      grads.push_back(b.gradOf(p.tensor));
    }
  if (params.empty())
    return g;
  llvm::SmallVector<TensorId, 3> updateInputs = grads;
  if (plan.precision.lossScaling) {
    TensorId norm = b.temp(Shape(), Dtype::F32);
    b.emit(OpKind::SumSquares, grads, {norm}, SharedAttrs(), 0, Phase::Optimizer);
    updateInputs.push_back(norm);
  }
  OpAttrs u;
  u.optimizer = plan.optimizer.name;
  u.scalar = optimizerFlopsPerParam(plan.optimizer, plan.precision.lossScaling);
  b.emit(OpKind::OptimizerUpdate, updateInputs, params, u, 0, Phase::Optimizer);
  b.emit(OpKind::ZeroGrad, {}, grads, SharedAttrs(), 0, Phase::Optimizer);
  return g;
}
} // namespace

} // namespace tally
