// ZeRO 2 and 3 in the memory plan (planMemory's step 4): what the generated step holds
// besides its shards, and when it moves each piece (Analysis::zero; codegen/EmitZero.cpp
// prints the moves).
//
// 1. Gradients (ZeRO ≥ 2). The grads region holds only this rank's piece of each gradient,
//    summed over the micro-batches, so the backward of one micro-batch writes a parameter's
//    whole gradient into an arena buffer (kind Gradient, tensor the parameter), live from the
//    first backward entry that writes or reads it to the last: zeroed before the first, then
//    after the last reduce-scattered over the ranks into the pieces (every micro-batch, as
//    DeepSpeed's stage 2 reduces each gradient once the backward has produced it, and frees
//    it: deepspeed/runtime/zero/stage_1_and_2.py, reduce_independent_p_g_buckets_and_remove_grads).
// 2. Parameters (ZeRO 3). The params region holds this rank's piece of every parameter. The
//    units are FSDP's: each repeat-block copy (the transformer block a wrapping policy wraps),
//    and the root, every other parameter (the embedding, the final norm, a tied head). Each
//    unit's parameters are all-gathered into arena buffers (kind Transient, tensor the
//    parameter) before the first forward entry that reads one of them and live until the last
//    one, then freed ("reshard after forward"); gathered again before the first backward or
//    recompute entry that reads one and freed after the last (FSDP's documentation, "FSDP
//    Notes": forward and backward pre-hooks all-gather, post-hooks free the unsharded
//    parameters). A unit's parameters are gathered together even where an entry reads only
//    some of them, as one flat parameter is.
// Only when the plan is listed (the schedule exists); the buffers are placed with the others.
// 3. Data x pipeline (PipelineStep.cpp): the same scan with each entry's chunk in the key
//    (zeroMovesOf), so that each move stays within one chunk: a tied parameter's gradient is
//    reduced by each chunk that writes it, and a unit split over chunks (the root: the embedding
//    on the first stage, the final norm and a tied head on the last) is gathered by each chunk
//    for the parameters of it that the chunk's phase reads. The buffers stay the one-device
//    plan's: a chunk's slot holds those its entries use.
#include "passes/Passes.h"

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace tally {

namespace {

/// Bytes of tensor `x` in `dtype`, exact when it fits int64 (the regions checked it).
void sizeBuffer(Buffer &b, const Tensor &x, Dtype dtype) {
  std::optional<int64_t> n = checkedNumel(x.shape);
  std::optional<int64_t> bytes = n ? checkedMul(*n, static_cast<int64_t>(bytesOf(dtype))) : std::nullopt;
  b.bytes = bytes.value_or(0);
  b.size = numel(x.shape) * static_cast<double>(bytesOf(dtype));
}

} // namespace

Analysis::ZeroMoves zeroMovesOf(const Analysis &a, const std::vector<uint32_t> &chunkOfOp) {
  Analysis::ZeroMoves moves;
  const Plan &plan = *a.plan;
  if (!plan.isTrain || plan.parallel.zero < 2 || plan.parallel.data <= 1 || !a.step)
    return moves;
  const Graph &s = *a.step;
  constexpr uint32_t kUnset = UINT32_MAX;
  using Range = std::pair<uint32_t, uint32_t>;
  // Per (parameter tensor, chunk): the entries its gradient is written or read at.
  std::map<std::pair<TensorId, uint32_t>, Range> gradUse;
  // Per (unit, phase: 0 forward, 1 backward and recompute, chunk): the entries reading its params.
  std::map<std::tuple<uint32_t, int, uint32_t>, Range> unitUse;
  // With chunks: the parameters each (unit, phase, chunk) reads (the root unit spans stages).
  std::map<std::tuple<uint32_t, int, uint32_t>, std::set<TensorId>> unitReads;
  auto unitOf = [&](TensorId p) -> uint32_t {
    const Tensor &x = s.tensors[p];
    if (!a.copies || x.param >= s.params.size())
      return kNone;
    uint32_t inst = s.params[x.param].instance;
    return inst < a.copies->ofInstance.size() ? a.copies->ofInstance[inst] : kNone;
  };
  auto widen = [](Range &r, uint32_t e) {
    if (r.first == kUnset || e < r.first)
      r.first = e;
    if (r.second == kUnset || e > r.second)
      r.second = e;
  };
  for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
    const StepEntry &se = a.stepSchedule[e];
    if (se.kind == StepEntry::Optimizer)
      continue;
    const Op &op = s.ops[se.op];
    uint32_t entry = static_cast<uint32_t>(e);
    uint32_t chunk = se.op < chunkOfOp.size() ? chunkOfOp[se.op] : 0;
    auto use = [&](TensorId t, bool input) {
      if (t == kNone)
        return;
      const Tensor &x = s.tensors[s.storageOf(t)];
      if (x.role == TensorRole::Gradient && x.gradOf != kNone && s.tensors[x.gradOf].role == TensorRole::Param)
        widen(gradUse.try_emplace({x.gradOf, chunk}, kUnset, kUnset).first->second, entry);
      else if (x.role == TensorRole::Param && input && plan.parallel.zero >= 3) {
        std::tuple<uint32_t, int, uint32_t> key{unitOf(s.storageOf(t)), se.kind == StepEntry::Forward ? 0 : 1, chunk};
        widen(unitUse.try_emplace(key, kUnset, kUnset).first->second, entry);
        if (!chunkOfOp.empty())
          unitReads[key].insert(s.storageOf(t));
      }
    };
    for (TensorId t : op.inputs)
      use(t, true);
    for (TensorId t : op.outputs)
      use(t, false);
  }
  for (const ParamInfo &pi : s.params) {
    if (!pi.trainable)
      continue;
    for (auto it = gradUse.lower_bound({pi.tensor, 0}); it != gradUse.end() && it->first.first == pi.tensor; ++it)
      moves.reduces.push_back({pi.tensor, it->second.first, it->second.second});
  }
  std::sort(moves.reduces.begin(), moves.reduces.end(),
            [](const auto &x, const auto &y) { return x.last < y.last || (x.last == y.last && x.param < y.param); });
  for (const auto &[key, use] : unitUse) {
    Analysis::ZeroMoves::Gather gather{use.first, use.second, std::get<0>(key), std::get<1>(key) == 1, {}};
    // The unit's parameters together, as one flat parameter is; split over chunks, those of
    // the unit that the chunk's phase reads (each stage gathers its part of the root).
    for (const ParamInfo &pi : s.params)
      if (unitOf(pi.tensor) == std::get<0>(key) && (chunkOfOp.empty() || unitReads[key].count(pi.tensor)))
        gather.params.push_back(pi.tensor);
    moves.gathers.push_back(std::move(gather));
  }
  std::sort(moves.gathers.begin(), moves.gathers.end(),
            [](const auto &x, const auto &y) { return x.entry < y.entry || (x.entry == y.entry && x.unit < y.unit); });
  return moves;
}

void zeroMoves(Analysis &a, const std::vector<uint32_t> &stepOfEntry) {
  a.zero = zeroMovesOf(a, {});
  const Plan &plan = *a.plan;
  // The buffers in the order the placement has always seen them (it is a first fit in that
  // order): the gradients by parameter, then the gathers by unit and phase.
  std::map<TensorId, const Analysis::ZeroMoves::Reduce *> reduceOf;
  for (const Analysis::ZeroMoves::Reduce &r : a.zero.reduces)
    reduceOf[r.param] = &r;
  std::vector<const Analysis::ZeroMoves::Gather *> gathers;
  for (const Analysis::ZeroMoves::Gather &g : a.zero.gathers)
    gathers.push_back(&g);
  std::sort(gathers.begin(), gathers.end(), [](const auto *x, const auto *y) {
    return x->unit < y->unit || (x->unit == y->unit && x->backward < y->backward);
  });
  std::vector<Buffer> added;
  for (const ParamInfo &pi : a.step->params) {
    auto it = reduceOf.find(pi.tensor);
    if (it == reduceOf.end())
      continue;
    const Analysis::ZeroMoves::Reduce &r = *it->second;
    Buffer b;
    b.tensor = r.param;
    b.op = a.stepSchedule[r.first].op;
    sizeBuffer(b, a.step->tensors[r.param], plan.precision.grads);
    b.first = stepOfEntry[r.first];
    b.last = stepOfEntry[r.last];
    b.what = "parameter gradient of one micro-batch (ZeRO)";
    b.kind = Buffer::Gradient;
    added.push_back(b);
  }
  for (const Analysis::ZeroMoves::Gather *g : gathers)
    for (TensorId t : g->params) {
      Buffer b;
      b.tensor = t;
      b.op = a.stepSchedule[g->entry].op;
      sizeBuffer(b, a.step->tensors[t], plan.precision.params);
      b.first = stepOfEntry[g->entry];
      b.last = stepOfEntry[g->last];
      b.what = g->backward ? "gathered parameter, backward (ZeRO 3)" : "gathered parameter, forward (ZeRO 3)";
      b.kind = Buffer::Transient;
      added.push_back(b);
    }
  a.buffers.reserve(a.buffers.size() + added.size());
  a.buffers.insert(a.buffers.end(), added.begin(), added.end());
}

} // namespace tally
