// Tensor parallelism in the generated step (CPU, MPI; Plan::tensorStep): the all-reduces of
// Megatron's split, at the ops tensorSplit (passes/StepTime.cpp) names, the rule the estimate
// prices. The step graph is one rank's shard (passes/TensorShard.cpp), so every other call is
// the single-rank call on smaller shapes.
// - Forward (and recompute): after each row-parallel matmul its output, a partial sum on each
//   rank, is summed over the tensor group (tally_comm::tp_all_reduce, a ring that counts the
//   bytes it sends).
// - Backward: each storage read by column-parallel matmuls (tensorSplit's columnInputs) has its
//   gradient, the sum of those matmuls' partial input gradients, summed over the group once,
//   after the last backward op that writes it. Such a storage must be read by nothing else
//   (else the other readers' whole gradients would be summed t times): refused.
#include "codegen/EmitInternal.h"

namespace tally::codegen::emit {

bool Emitter::indexTensorParallel() {
  if (!tensorParallel())
    return true;
  const Graph &g = *a.graph;
  tp = tensorSplit(g, plan);
  std::vector<bool> column(g.tensors.size(), false);
  for (TensorId x : tp.columnInputs)
    column[x] = true;
  for (OpId i = 0; i < g.ops.size(); ++i)
    for (TensorId x : g.ops[i].inputs)
      if (column[g.storageOf(x)] && !tp.columnParallel[i]) {
        op = &s.ops[i];
        return fail("tensor " + g.tensorName(g.storageOf(x)) +
                    " is read by a column-parallel matmul and by this op: the generated tensor-parallel "
                    "step all-reduces the gradient of a column-parallel input only when column-parallel "
                    "matmuls alone read it");
      }
  // Sequence parallel: one column-parallel matmul per gathered input, whose input gradient is
  // reduce-scattered once after it (the estimate's one reduce-scatter per column input).
  std::vector<OpId> reader(g.tensors.size(), kNone);
  for (OpId i = 0; i < g.ops.size() && sequenceParallel(); ++i) {
    if (!tp.columnParallel[i])
      continue;
    OpId &first = reader[g.storageOf(weightMatmulOperands(g, g.ops[i]).first)];
    if (first != kNone) {
      op = &s.ops[i];
      return fail("its input is also read by the column-parallel " + g.opPath(g.ops[first]) +
                  ": the generated sequence-parallel step gathers each column input for one matmul and "
                  "reduce-scatters its gradient once (fuse the two into one matmul, as Megatron's linear_fc1 does)");
    }
    first = i;
  }
  // The last backward entry writing each such gradient (or a view of it).
  std::map<TensorId, size_t> lastWrite;
  for (TensorId x : tp.columnInputs)
    if (x < s.gradient.size() && s.gradient[x] != kNone)
      lastWrite[s.gradient[x]] = SIZE_MAX;
  for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
    const StepEntry &se = a.stepSchedule[e];
    if (se.kind != StepEntry::Backward)
      continue;
    for (TensorId o : s.ops[se.op].outputs) {
      auto it = lastWrite.find(s.storageOf(o));
      if (it != lastWrite.end())
        it->second = e;
    }
  }
  for (auto &[grad, e] : lastWrite)
    if (e != SIZE_MAX)
      tpReduceAfter[e].push_back(grad);
  return true;
}

void Emitter::tensorParallelAfter(size_t e) {
  if (!tensorParallel() || sequenceParallel()) // sequence parallel: sequenceBefore/After
    return;
  const StepEntry &se = a.stepSchedule[e];
  auto allReduce = [&](TensorId x, const std::string &why) {
    body += "\n  // tensor parallel: " + why + "\n";
    site("tensor_parallel.all_reduce", "communication");
    line(llvm::formatv("tally_comm::tp_all_reduce<{0}>(ctx, {1}, {2});", T(x), ptr(x), n(x)).str());
  };
  if (se.kind != StepEntry::Backward && se.op < tp.rowParallel.size() && tp.rowParallel[se.op])
    for (TensorId o : s.ops[se.op].outputs)
      allReduce(o, "the row-parallel partial sums of " + commentSafe(s.opPath(s.ops[se.op])) + " summed over the ranks");
  auto r = tpReduceAfter.find(e);
  if (r != tpReduceAfter.end())
    for (TensorId grad : r->second)
      allReduce(grad, "the gradient of a column-parallel input, summed over the ranks");
}

// ---- sequence parallelism ------------------------------------------------------------------
// The step graph holds each sequence-split tensor as one rank's 1/t of its tokens
// (passes/TensorShard.cpp, shardSequence). An op whose operands are all such shards (a norm, a
// residual add, dropout, a bias) runs on the shard. An op that meets them beside a tensor with
// the whole sequence reads them gathered and writes them whole, outside the arena:
// - each sequence-split input is all-gathered first (tally_comm::tp_seq_all_gather: before a
//   column-parallel matmul or the whole head, and in the backward the row outputs' gradients,
//   the inputs again for the weight gradients and the embeddings' gradient); within one
//   backward a buffer gathered once serves the ops that read it until it is written;
// - each sequence-split output is written whole, then reduce-scattered into the shard when the
//   op read a parameter cut over the tensor group (a row-parallel matmul's partial sums, a
//   column input's gradient: tp_seq_reduce_scatter) or sliced (alike on every rank: the
//   embeddings' sum, the whole head's input gradient: tp_seq_slice).
// Once per step the gradients of the parameters only sequence-split ops read are all-reduced
// (with data parallelism after the data group's reduction, as Megatron-LM: EmitStep.cpp).

int Emitter::seqDim(TensorId t) const {
  TensorId b = s.storageOf(t);
  return b < a.sequenceDim.size() ? a.sequenceDim[b] : -1;
}

void Emitter::seqRows(TensorId t, int64_t &rows, int64_t &chunk) const {
  TensorId b = s.storageOf(t);
  const Shape &sh = s.tensors[b].shape;
  int k = seqDim(b);
  rows = chunk = 1;
  for (size_t d = 0; d < sh.size(); ++d)
    (static_cast<int>(d) < k ? rows : chunk) *= sh[d].size;
}

bool Emitter::sequenceBefore(size_t e) {
  sequenceOuts.clear();
  shapeNow.clear();
  scratchNow.clear();
  if (!sequenceParallel())
    return true;
  if (a.stepSchedule[e].kind != StepEntry::Backward || !inBackward)
    gatheredNow.clear();
  inBackward = a.stepSchedule[e].kind == StepEntry::Backward;
  const Op &o = *op;
  auto state = [&](TensorId x) { // parameters and their gradients: not split along the sequence
    const Tensor &v = s.tensors[s.storageOf(x)];
    return v.role == TensorRole::Param ||
           (v.role == TensorRole::Gradient && v.gradOf != kNone && s.tensors[v.gradOf].role == TensorRole::Param);
  };
  auto wholeSequence = [&](TensorId x) {
    for (const Dim &d : s.tensors[x].shape)
      if (d.sym != 0 && d.sym < s.symbols.size() && s.symbols[d.sym] == "seq")
        return true;
    return false;
  };
  std::vector<TensorId> all(o.inputs.begin(), o.inputs.end());
  all.insert(all.end(), o.outputs.begin(), o.outputs.end());
  bool shard = false, whole = false, view = false;
  for (TensorId x : all)
    if (!state(x) && seqDim(x) >= 0) {
      shard = true;
      view = view || s.tensors[x].viewOf != kNone;
    } else if (!state(x) && wholeSequence(s.storageOf(x))) {
      whole = true;
    }
  if (!shard)
    return true;
  const std::string why = " the sequence-parallel step runs on one rank's share of the tokens only elementwise ops, "
                          "norms, dropout and a bias's gradient";
  if (!whole) {
    bool ok = opClass(o.kind) == OpClass::Elementwise || o.kind == OpKind::LayerNorm || o.kind == OpKind::RmsNorm ||
              o.kind == OpKind::LayerNormBackward || o.kind == OpKind::RmsNormBackward || o.kind == OpKind::Contiguous ||
              (o.kind == OpKind::ReduceTo && state(o.outputs[0]));
    return (ok && !view) || fail("reads a tensor split along the sequence" + std::string(view ? " through a view" : "") +
                                 ":" + why);
  }
  bool cut = false; // a parameter cut over the tensor group: the op's outputs are partial sums
  for (TensorId x : o.inputs) {
    const Tensor &v = s.tensors[s.storageOf(x)];
    cut = cut || (v.role == TensorRole::Param && v.param < a.tensorShards.size() && a.tensorShards[v.param].dim >= 0);
  }
  auto wholeShape = [&](TensorId b) {
    Shape sh = s.tensors[b].shape;
    sh[static_cast<size_t>(seqDim(b))].size *= plan.parallel.tensor;
    return sh;
  };
  for (TensorId x : o.inputs) {
    TensorId b = s.storageOf(x);
    if (state(x) || seqDim(b) < 0 || scratchNow.count(b))
      continue;
    int64_t rows, chunk, count = n(b) * plan.parallel.tensor;
    seqRows(b, rows, chunk);
    std::string src = ptr(b);
    auto have = gatheredNow.find(src);
    int slot = have != gatheredNow.end() ? have->second : nextSlot;
    if (have == gatheredNow.end()) {
      nextSlot ^= 1;
      for (auto it = gatheredNow.begin(); it != gatheredNow.end();)
        it = it->second == slot ? gatheredNow.erase(it) : std::next(it);
      body += "\n  // sequence parallel: %" + std::to_string(b) + " gathered along the sequence\n";
      site("tensor_parallel.sequence_all_gather", "communication");
      line(llvm::formatv("tally_comm::tp_seq_all_gather<{0}>(ctx, {1}, tally_comm::sp_scratch<{0}>({2}, {3}), {4}, {5});",
                         T(b), src, slot, count, rows, chunk)
               .str());
      gatheredNow[src] = slot;
    }
    scratchNow[b] = llvm::formatv("tally_comm::sp_scratch<{0}>({1}, {2})", T(b), slot, count).str();
    shapeNow[b] = wholeShape(b);
  }
  for (size_t k = 0; k < o.outputs.size(); ++k) {
    TensorId x = o.outputs[k], b = s.storageOf(x);
    if (state(x) || seqDim(b) < 0)
      continue;
    if (b != x || !sequenceOuts.empty())
      return fail("writes a view of a tensor split along the sequence, or two such tensors:" + why);
    int64_t count = n(b) * plan.parallel.tensor;
    std::string scratch = llvm::formatv("tally_comm::sp_scratch<{0}>(2, {1})", T(b), count).str();
    if (acc(static_cast<unsigned>(k)))
      line(llvm::formatv("std::fill_n({0}, {1}, {2}{{});", scratch, count, T(b)).str());
    sequenceOuts.push_back({x, cut, acc(static_cast<unsigned>(k))});
    scratchNow[b] = scratch;
    shapeNow[b] = wholeShape(b);
  }
  return true;
}

void Emitter::sequenceAfter(size_t) {
  if (!sequenceParallel())
    return;
  std::vector<SequenceOut> outs = std::move(sequenceOuts);
  sequenceOuts.clear();
  shapeNow.clear();
  scratchNow.clear();
  for (const SequenceOut &so : outs) {
    int64_t rows, chunk, all = n(so.t) * plan.parallel.tensor;
    seqRows(so.t, rows, chunk);
    std::string scratch = llvm::formatv("tally_comm::sp_scratch<{0}>(2, {1})", T(so.t), all).str();
    body += std::string("\n  // sequence parallel: ") +
            (so.reduce ? "the partial sums reduce-scattered along the sequence\n"
                       : "this rank's share of the sequence kept\n");
    site(so.reduce ? "tensor_parallel.sequence_reduce_scatter" : "tensor_parallel.sequence_scatter", "communication");
    line(llvm::formatv("tally_comm::{0}<{1}>(ctx, {2}, {3}, {4}, {5}, {6});",
                       so.reduce ? "tp_seq_reduce_scatter" : "tp_seq_slice", T(so.t), scratch, ptr(so.t), rows, chunk,
                       boolean(so.accumulate))
             .str());
  }
  for (TensorId x : op->outputs)
    gatheredNow.erase(ptr(x));
}

std::string Emitter::sequenceGradients() {
  std::string out;
  if (!sequenceParallel())
    return out;
  for (TensorId p : tp.sequenceParams) {
    auto g = gradOffset.find(p);
    if (g == gradOffset.end() || p >= s.gradient.size() || s.gradient[p] == kNone)
      continue;
    // Under ZeRO 2 and 3 G holds this data rank's piece of it, the same piece on every rank of
    // the tensor group: the piece is summed.
    out += "  // sequence parallel: " + commentSafe(s.tensorName(p)) + "'s gradient" + (pieced() ? " (this data rank's piece)" : "") +
           ", summed over the tensor group\n" + siteText("tensor_parallel.sequence_gradients", "communication") +
           llvm::formatv("  tally_comm::tp_all_reduce<{0}>(ctx, G<{0}>({1}), {2});\n", T(s.gradient[p]), g->second,
                         pieced() ? pieceOf(p) : n(p))
               .str();
  }
  return out;
}

} // namespace tally::codegen::emit
