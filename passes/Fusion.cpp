// Fusion of elementwise chains: which consecutive entries of the step schedule one generated
// kernel runs (codegen prints it: codegen/EmitFused.cpp, `fused`), and what that saves.
//
// 1. A run is a maximal sequence of consecutive stepSchedule entries of one kind (forward,
//    recompute or backward) whose ops are fusableElementwise and have outputs of one element
//    count and one storage dtype: a chain (an op reads what an earlier one produced) or ops
//    side by side (the two products of a mul's backward, then the activation's backward that
//    reads one of them). Views, dropout, matmuls end a run; a layer or RMS norm forward whose
//    input the run computes ends it as its last op (the residual add into the next norm): the
//    kernel runs the elementwise ops on a row, then normalises that row, reading x back from
//    cache (the row was just written).
// 2. Inside the kernel, element e is computed op after op in registers: a value produced in
//    the run is read from the register (rounded to its storage type first, so the results
//    equal the unfused ops' bit for bit), every other operand from memory at its
//    ElementIndex. An output is written unless nothing after the run reads it (its buffer
//    ends at the run's schedule step and no later entry of that step reads it: a bias add
//    whose only reader is the residual add in the same run); the memory plan does not change,
//    such a buffer just stays unused. At most 64 ops per run.
// 3. Memory safety: threads run elements in any order, so a run stops before an op that
//    would write a buffer overlapping one an earlier op of the run reads or writes from
//    memory, unless it is the same bytes at the same index (element e reads, then writes,
//    its own element); and before an op that reads from memory a buffer the run has written
//    (another thread may not have written it yet).
// 4. Savings, per micro-batch: each read of a register value saves that tensor's bytes, each
//    output not written its bytes, a norm ending the run its read of x; each op after the
//    first saves one kernel launch.
// 5. Before the runs: a matmul whose output only a bias add reads (the next entry, forward or
//    recompute) becomes one matmul with a bias epilogue writing the add's output (cuBLASLt's
//    CUBLASLT_EPILOGUE_BIAS; the CPU adds the bias to each tile before storing it). The add's
//    whole traffic and launch are saved (the matmul writes the add's output instead of its
//    own, of the same size); those two entries join no run. They are charged to the op's forward
//    (forward entries) or to its forward op's backward (backward entries); recompute runs
//    repeat the forward ones, and StepTime prices a recompute with the forward's time.
#include "passes/Fusion.h"
#include "ir/OpRules.h"

#include "passes/Passes.h"

#include <algorithm>

namespace tally {

BufferIndex::BufferIndex(const Analysis &a) {
  const Graph &s = *a.step;
  for (const Buffer &b : a.buffers) {
    if (b.tensor == kNone)
      continue;
    TensorId key = b.tensor;
    // Activations' gradient buffers name the forward tensor; the memory plan's local
    // gradients name the gradient tensor itself.
    if (b.kind == Buffer::Gradient && s.tensors[key].role != TensorRole::Gradient)
      key = s.gradient[key];
    if (key != kNone)
      byTensor[key].push_back(&b);
  }
  // A gradient that shares its add's output gradient's buffer (a `contiguous` with `shares`,
  // passes/GradientShares.h) has that buffer; the step makes them in backward order, so the
  // input's buffers are known when its output's are asked.
  for (const Op &op : s.ops)
    if (op.kind == OpKind::Contiguous && op.attrs->shares) {
      auto in = byTensor.find(s.storageOf(op.inputs[0]));
      if (in != byTensor.end()) {
        std::vector<const Buffer *> same = in->second;
        byTensor[s.storageOf(op.outputs[0])] = std::move(same);
      }
    }
  stepOfEntry.assign(a.stepSchedule.size(), static_cast<uint32_t>(a.schedule.size()));
  for (size_t k = 0; k + 1 < a.stepIndexOf.size(); ++k)
    for (uint32_t e = a.stepIndexOf[k]; e < a.stepIndexOf[k + 1] && e < stepOfEntry.size(); ++e)
      stepOfEntry[e] = static_cast<uint32_t>(k);
}

const Buffer *BufferIndex::liveAt(TensorId base, uint32_t step) const {
  auto it = byTensor.find(base);
  if (it == byTensor.end())
    return nullptr;
  const Buffer *live = nullptr;
  for (const Buffer *b : it->second)
    if (b->first <= step && step <= b->last && (!live || b->first > live->first))
      live = b;
  return live;
}

std::optional<ElementIndex> elementIndex(const Graph &g, TensorId x, TensorId out) {
  const Tensor &tx = g.tensors[x];
  const Shape &os = g.tensors[out].shape;
  if (!isDense(tx.shape, tx.layout))
    return std::nullopt;
  int64_t n = checkedNumel(os).value_or(-1), m = checkedNumel(tx.shape).value_or(-1);
  if (n < 0 || m < 0)
    return std::nullopt;
  if (m == 1)
    return ElementIndex{ElementIndex::Scalar, 1};
  // The operand's sizes without leading 1s, right-aligned against the output's.
  size_t lead = 0;
  while (lead < tx.shape.size() && tx.shape[lead].size == 1)
    ++lead;
  size_t rank = tx.shape.size() - lead;
  if (rank > os.size())
    return std::nullopt;
  size_t off = os.size() - rank;
  bool same = true;
  for (size_t i = 0; i < rank; ++i)
    same = same && tx.shape[lead + i].size == os[off + i].size;
  if (same && m == n)
    return ElementIndex{ElementIndex::Same, 1};
  if (same) // the trailing dimensions, broadcast over the leading ones
    return ElementIndex{ElementIndex::Trailing, m};
  // The leading dimensions, 1 over the trailing ones ([B, S, 1] over [B, S, D]).
  size_t k = 0;
  while (k < rank && tx.shape[lead + k].size == os[off + k].size)
    ++k;
  for (size_t i = k; i < rank; ++i)
    if (tx.shape[lead + i].size != 1)
      return std::nullopt;
  if (off != 0 && lead < off) // leading dims of the output missing from the operand
    return std::nullopt;
  return ElementIndex{ElementIndex::Leading, n / m};
}

namespace {

bool floatStored(const Graph &g, TensorId t) { return isFloat(g.tensors[t].dtype); }

/// A pure unary kind (a row of ir/ops/Unary.def): one tensor in, one out, element by element.
bool unaryKind(OpKind k) { return unaryDef(k) != nullptr; }

} // namespace

bool fusableElementwise(const Graph &g, const Op &op) {
  if (op.outputs.size() != 1 || op.phase == Phase::Optimizer)
    return false;
  TensorId y = op.outputs[0];
  const Tensor &ty = g.tensors[y];
  if (!floatStored(g, y) || !isDense(ty.shape, ty.layout) || ty.viewOf != kNone)
    return false;
  if (binaryRuntime(op.kind)) { // add, sub, mul, div (ir/ops/Binary.def)
    if (op.attrs->hasScalar ? op.inputs.size() != 1 : op.inputs.size() != 2)
      return false;
  } else if (op.kind == OpKind::UnaryBackward) {
    if (!unaryKind(op.attrs->of))
      return false;
  } else {
    if (!unaryKind(op.kind) || op.inputs.size() != 1)
      return false;
    // In the backward a unary op is a negated gradient (unary_bwd of Neg), possibly added in
    // place; only the forward's kind is fused.
    if (op.phase != Phase::Forward || op.accumulate)
      return false;
  }
  for (TensorId x : op.inputs)
    if (!floatStored(g, x) || g.tensors[x].dtype != ty.dtype || !elementIndex(g, x, y))
      return false;
  return true;
}

namespace {

/// Bytes [start, end) of a tensor in one of the step's memory regions.
struct Range {
  int region = -1; ///< 0 arena, 1 params, 2 grads, 3 data; -1 unknown (never overlaps: not fused)
  int64_t start = 0, end = 0;
  bool overlaps(const Range &o) const { return region == o.region && start < o.end && o.start < end; }
  bool operator==(const Range &o) const { return region == o.region && start == o.start && end == o.end; }
};

struct RunBuilder {
  const Analysis &a;
  const Graph &s;
  const BufferIndex &buffers;
  std::unordered_map<TensorId, int64_t> paramOffset, gradOffset;

  RunBuilder(const Analysis &a, const BufferIndex &b) : a(a), s(*a.step), buffers(b) {
    for (const Region::Entry &e : a.regions.params.tensors)
      paramOffset[e.tensor] = e.offset;
    for (const Region::Entry &e : a.regions.grads.tensors)
      gradOffset[e.tensor] = e.offset;
  }

  /// Where t's bytes are at schedule step `step`, as the generated code addresses them
  /// (codegen's ptr: params, parameter gradients, input data, else the live arena buffer).
  Range rangeOf(TensorId t, uint32_t step) const {
    TensorId b = s.storageOf(t);
    const Tensor &bt = s.tensors[b];
    int64_t bytes = static_cast<int64_t>(s.bytes(t));
    int64_t elem = b == t ? 0 : s.tensors[t].layout.offset() * static_cast<int64_t>(bytesOf(s.tensors[t].dtype));
    auto in = [&](int region, int64_t off) { return Range{region, off + elem, off + elem + bytes}; };
    if (bt.role == TensorRole::Param) {
      auto it = paramOffset.find(b);
      return it == paramOffset.end() ? Range{} : in(1, it->second);
    }
    if (bt.role == TensorRole::Gradient && bt.gradOf != kNone && s.tensors[bt.gradOf].role == TensorRole::Param) {
      auto it = gradOffset.find(bt.gradOf);
      return it == gradOffset.end() ? Range{} : in(2, it->second);
    }
    if (bt.role == TensorRole::Input)
      return Range{3, 0, 0}; // read only: never written by a step op
    const Buffer *live = buffers.liveAt(b, step);
    if (!live)
      return Range{};
    if (chunks == nullptr)
      return in(0, live->offset);
    // A pipeline stage's arena: the buffer's offset in the run's chunk's slot (PipelineStep.cpp
    // places each chunk's buffers again on their own), where the generated step has it.
    const auto &slot = (*chunks)[chunk].offset;
    auto it = slot.find(static_cast<uint32_t>(live - a.buffers.data()));
    return it == slot.end() ? Range{} : in(0, it->second);
  }

  /// The generated pipeline step's chunks (Analysis::pipelineStep; null without one) and the
  /// chunk of the run being built: a run never leaves its chunk, whose unit runs it.
  const std::vector<Analysis::PipelineStep::Chunk> *chunks = nullptr;
  uint32_t chunk = 0;

  // The run being built.
  StepEntry::Kind kind = StepEntry::Forward;
  int64_t n = 0;
  Dtype dtype = Dtype::Invalid;
  uint32_t first = 0, count = 0;
  double saved = 0;
  bool norm = false;                              ///< the run ends in a norm (FusedKernel::norm)
  std::vector<uint32_t> normOver;                 ///< ops of the run whose output the norm's outputs overlap
  std::vector<double> savedBy;                    ///< per op of the run: bytes read from registers
  std::vector<TensorId> produced;                 ///< values in registers
  std::vector<std::pair<Range, TensorId>> reads;  ///< operands read from memory, with their tensor
  std::vector<Range> writes;

  bool inRegisters(TensorId t) const { return std::find(produced.begin(), produced.end(), t) != produced.end(); }

  void reset() {
    count = 0;
    saved = 0;
    norm = false;
    normOver.clear();
    savedBy.clear();
    produced.clear();
    reads.clear();
    writes.clear();
  }

  /// Whether op (entry e) can join the run; fills its reads and writes when it can.
  bool joins(const Op &op, uint32_t step) {
    TensorId y = op.outputs[0];
    for (TensorId x : op.inputs) {
      if (inRegisters(x)) {
        // A register value is the output's own element: only read at the same index.
        std::optional<ElementIndex> ix = elementIndex(s, x, y);
        if (!ix || ix->kind != ElementIndex::Same)
          return false;
        continue;
      }
      Range r = rangeOf(x, step);
      if (r.region < 0)
        return false;
      for (const Range &w : writes)
        if (w.overlaps(r))
          return false; // written by another element's thread, maybe not yet
    }
    Range w = rangeOf(y, step);
    if (w.region < 0 || w.region == 1 || w.region == 3)
      return false;
    auto sameElement = [&](const Range &r, TensorId x) {
      std::optional<ElementIndex> ix = elementIndex(s, x, y);
      return r == w && ix && ix->kind == ElementIndex::Same && s.tensors[x].dtype == s.tensors[y].dtype;
    };
    for (const auto &[r, x] : reads)
      if (r.overlaps(w) && !sameElement(r, x))
        return false;
    for (TensorId x : op.inputs)
      if (!inRegisters(x)) {
        Range r = rangeOf(x, step);
        if (r.overlaps(w) && !sameElement(r, x))
          return false;
      }
    for (const Range &o : writes)
      if (o.overlaps(w) && !(o == w))
        return false;
    return true;
  }

  /// Whether a layer or RMS norm forward can end the run: its input is a value of the run with
  /// the run's element count and dtype, and its outputs overlap nothing the run reads or
  /// writes, except y over the very bytes of an operand each row reads at its own elements.
  bool normJoins(const Op &op, uint32_t step) {
    if ((op.kind != OpKind::LayerNorm && op.kind != OpKind::RmsNorm) || norm || count == 0 ||
        op.attrs->norm == NormKernel::Eager) // eight PyTorch ops, not one kernel to join
      return false;
    TensorId x = op.inputs[0], y = op.outputs[0];
    if (!inRegisters(x) || checkedNumel(s.tensors[x].shape).value_or(-1) != n ||
        s.tensors[y].dtype != dtype || checkedNumel(s.tensors[y].shape).value_or(-1) != n)
      return false;
    for (size_t i = 1; i < op.inputs.size(); ++i)
      if (s.tensors[op.inputs[i]].dtype != dtype)
        return false;
    for (size_t i = 0; i < op.outputs.size(); ++i) {
      Range w = rangeOf(op.outputs[i], step);
      if (w.region != 0)
        return false;
      for (uint32_t j = 0; j < writes.size(); ++j)
        if (writes[j].overlaps(w))
          normOver.push_back(j); // fine only if op j's output is not written (close decides)
      for (const auto &[r, t] : reads) {
        std::optional<ElementIndex> ix = elementIndex(s, t, x);
        if (r.overlaps(w) && !(i == 0 && r == w && ix && ix->kind == ElementIndex::Same && s.tensors[t].dtype == dtype))
          return false;
      }
    }
    return true;
  }

  void addNorm(const Op &op) {
    double bytes = s.bytes(op.inputs[0]); // read back from cache, not memory
    saved += bytes;
    savedBy.push_back(bytes);
    norm = true;
    ++count;
  }

  void add(const Op &op, uint32_t step) {
    double bytes = 0;
    for (TensorId x : op.inputs) {
      if (inRegisters(x))
        bytes += s.bytes(x);
      else
        reads.push_back({rangeOf(x, step), x});
    }
    saved += bytes;
    savedBy.push_back(bytes);
    writes.push_back(rangeOf(op.outputs[0], step));
    produced.push_back(op.outputs[0]);
    ++count;
  }
};

/// Step 2: an output that nothing after entry `last` reads is not written: its buffer's last
/// schedule step is that entry's, and no later entry of that step reads it.
bool unreadAfter(const Analysis &a, const BufferIndex &buffers, const RunBuilder &run, uint32_t e,
                 uint32_t last) {
  const Graph &s = *a.step;
  const Op &op = s.ops[a.stepSchedule[e].op];
  TensorId y = op.outputs[0];
  if (op.accumulate || y == s.loss || s.tensors[y].role == TensorRole::Input || s.tensors[y].viewOf != kNone ||
      std::find(s.outputs.begin(), s.outputs.end(), y) != s.outputs.end() || run.rangeOf(y, buffers.stepOf(e)).region != 0)
    return false;
  for (uint32_t f = e + 1; f <= last; ++f) // a later op adds into it in memory
    if (s.ops[a.stepSchedule[f].op].outputs[0] == y)
      return false;
  const Buffer *b = buffers.liveAt(y, buffers.stepOf(e));
  if (!b || b->last != buffers.stepOf(last))
    return false;
  size_t stop = b->last + 1 < a.stepIndexOf.size() ? a.stepIndexOf[b->last + 1] : a.stepSchedule.size();
  for (size_t f = last + 1; f < stop; ++f)
    for (TensorId x : s.ops[a.stepSchedule[f].op].inputs)
      if (s.storageOf(x) == y)
        return false;
  return true;
}

/// Step 5: a matmul (entry e) whose output only the next entry reads, an add of a bias over
/// its last dimension, runs as one matmul with a bias epilogue into the add's output: the
/// matmul's own output is never written, the add is no kernel of its own. The product must be
/// one matrix product (A dense, B a matrix, C dense) and the add's output overlap none of its
/// operands (cuBLASLt's D may not alias A, B or the bias).
bool biasEpilogue(const Analysis &a, const BufferIndex &buffers, const RunBuilder &run, size_t e) {
  const Graph &s = *a.step;
  if (e + 1 >= a.stepSchedule.size())
    return false;
  const StepEntry &me = a.stepSchedule[e], &ae = a.stepSchedule[e + 1];
  if (me.kind != ae.kind || me.kind == StepEntry::Optimizer || me.kind == StepEntry::Backward)
    return false;
  const Op &mm = s.ops[me.op], &add = s.ops[ae.op];
  if (mm.kind != OpKind::Matmul || mm.accumulate || add.kind != OpKind::Add || add.attrs->hasScalar ||
      add.accumulate || add.inputs.size() != 2 || add.outputs.size() != 1)
    return false;
  TensorId x = mm.inputs[0], w = mm.inputs[1], c = mm.outputs[0], y = add.outputs[0];
  TensorId bias = add.inputs[0] == c ? add.inputs[1] : add.inputs[1] == c ? add.inputs[0] : kNone;
  const Tensor &tc = s.tensors[c], &ty = s.tensors[y];
  if (bias == kNone || bias == c || tc.shape.empty() || s.tensors[w].shape.size() != 2 ||
      !isDense(s.tensors[x].shape, s.tensors[x].layout) || s.tensors[x].shape.size() < 2 ||
      !isDense(tc.shape, tc.layout) || tc.viewOf != kNone || !isDense(ty.shape, ty.layout) || ty.viewOf != kNone ||
      !isFloat(tc.dtype))
    return false;
  for (TensorId t : {x, w, bias, y})
    if (s.tensors[t].dtype != tc.dtype)
      return false;
  std::optional<ElementIndex> bi = elementIndex(s, bias, y), ci = elementIndex(s, c, y);
  if (!bi || !ci || bi->kind != ElementIndex::Trailing || bi->m != tc.shape.back().size ||
      ci->kind != ElementIndex::Same || s.tensors[bias].shape.size() != 1)
    return false;
  if (!unreadAfter(a, buffers, run, static_cast<uint32_t>(e), static_cast<uint32_t>(e + 1)))
    return false;
  uint32_t ms = buffers.stepOf(e), as = buffers.stepOf(e + 1);
  Range out = run.rangeOf(y, as);
  if (out.region != 0)
    return false;
  for (auto [t, st] : {std::pair{x, ms}, std::pair{w, ms}, std::pair{bias, as}}) {
    Range r = run.rangeOf(t, st);
    if (r.region < 0 || r.overlaps(out))
      return false;
  }
  return true;
}

/// Step 4: a kernel's totals, and its savings charged per op (savedBy: bytes per entry; every
/// entry after the first saves its launch) to the op's forward (forward entries) or its
/// forward op's backward (backward entries); recompute kernels repeat the forward ones.
void recordKernel(Analysis &a, const Analysis::FusedKernel &k, const std::vector<double> &savedBy) {
  const Graph &s = *a.step;
  a.fusion.kernels.push_back(k);
  a.fusion.epilogues += k.epilogue ? 1 : 0;
  a.fusion.ops += k.count;
  a.fusion.launchesSaved += k.count - 1;
  a.fusion.bytesSaved += k.bytesSaved;
  StepEntry::Kind kind = a.stepSchedule[k.first].kind;
  for (uint32_t i = 0; i < k.count && kind != StepEntry::Recompute; ++i) {
    const Op &op = s.ops[a.stepSchedule[k.first + i].op];
    double calls = i == 0 ? 0 : 1;
    if (kind == StepEntry::Forward) {
      FusedSavings &f = a.fusion.savings[a.stepSchedule[k.first + i].op];
      f.forwardBytes += savedBy[i];
      f.forwardCalls += calls;
    } else if (op.forwardOp < a.fusion.savings.size()) {
      FusedSavings &f = a.fusion.savings[op.forwardOp];
      f.backwardBytes += savedBy[i];
      f.backwardCalls += calls;
    }
  }
}

} // namespace

void fuseKernels(Analysis &a) {
  a.fusion = {};
  if (!a.plan->fuseKernels || !a.step || !a.planOverflow.empty() || a.stepSchedule.empty())
    return;
  a.fusion.enabled = true;
  a.fusion.savings.assign(a.ops.size(), FusedSavings());
  const Graph &s = *a.step;
  BufferIndex buffers(a);
  RunBuilder run(a, buffers);
  const auto &ps = a.pipelineStep;
  if (!ps.chunks.empty())
    run.chunks = &ps.chunks;
  // The chunk a pipelined step runs entry e in (0 without stages).
  auto chunkOf = [&](size_t e) { return run.chunks ? ps.chunkOfOp[a.stepSchedule[e].op] : 0; };

  auto unread = [&](uint32_t i) { return unreadAfter(a, buffers, run, run.first + i, run.first + run.count - (run.norm ? 2 : 1)); };
  std::vector<bool> consumed(a.stepSchedule.size(), false);
  for (size_t e = 0; e + 1 < a.stepSchedule.size(); ++e) {
    run.chunk = chunkOf(e);
    if (chunkOf(e + 1) != run.chunk || !biasEpilogue(a, buffers, run, e))
      continue;
    // The add's whole traffic (the product read, the bias read, its output written, now by the
    // matmul instead of the product) and its launch.
    const Op &add = s.ops[a.stepSchedule[e + 1].op];
    double bytes = s.bytes(add.inputs[0]) + s.bytes(add.inputs[1]) + s.bytes(add.outputs[0]);
    recordKernel(a, {static_cast<uint32_t>(e), 2, bytes, 1, false, true}, {0, bytes});
    consumed[e] = consumed[e + 1] = true;
    ++e;
  }
  auto close = [&]() {
    uint64_t unwritten = 0;
    if (run.count >= 2) {
      for (uint32_t i = 0; i + (run.norm ? 1 : 0) < run.count; ++i)
        if (unread(i)) {
          unwritten |= uint64_t(1) << i;
          double bytes = s.bytes(s.ops[a.stepSchedule[run.first + i].op].outputs[0]);
          run.savedBy[i] += bytes;
          run.saved += bytes;
        }
      // A norm may write over an output of the run only where that output is never written.
      for (uint32_t j : run.normOver)
        if (run.norm && !(unwritten >> j & 1)) {
          run.norm = false;
          --run.count;
          run.saved -= run.savedBy.back();
          run.savedBy.pop_back();
        }
    }
    if (run.count >= 2)
      recordKernel(a, {run.first, run.count, run.saved, unwritten, run.norm}, run.savedBy);
    run.reset();
  };

  for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
    const StepEntry &se = a.stepSchedule[e];
    const Op &op = s.ops[se.op];
    if (consumed[e]) { // a matmul with a bias epilogue (step 5)
      close();
      a.fusion.elementwiseOps += fusableElementwise(s, op) ? 1 : 0;
      continue;
    }
    if (run.count > 0 && se.kind == run.kind && chunkOf(e) == run.chunk && run.normJoins(op, buffers.stepOf(e))) {
      run.addNorm(op);
      close();
      continue;
    }
    if (se.kind == StepEntry::Optimizer || !fusableElementwise(s, op)) {
      close();
      continue;
    }
    a.fusion.elementwiseOps += 1;
    uint32_t step = buffers.stepOf(e);
    TensorId y = op.outputs[0];
    int64_t n = checkedNumel(s.tensors[y].shape).value_or(-1);
    bool continues = run.count > 0 && run.count < 64 && se.kind == run.kind && n == run.n && s.tensors[y].dtype == run.dtype &&
                     chunkOf(e) == run.chunk && run.joins(op, step);
    if (!continues) {
      close();
      run.chunk = chunkOf(e);
      if (!run.joins(op, step))
        continue;
      run.kind = se.kind;
      run.n = n;
      run.dtype = s.tensors[y].dtype;
      run.first = static_cast<uint32_t>(e);
    }
    run.add(op, step);
  }
  close();
  std::sort(a.fusion.kernels.begin(), a.fusion.kernels.end(),
            [](const Analysis::FusedKernel &x, const Analysis::FusedKernel &y) { return x.first < y.first; });
}

} // namespace tally
