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
#include "passes/Passes.h"

#include <algorithm>
#include <map>

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

void zeroMoves(Analysis &a, const std::vector<uint32_t> &stepOfEntry) {
  const Plan &plan = *a.plan;
  if (!plan.isTrain || plan.parallel.zero < 2 || plan.parallel.data <= 1 || !a.step)
    return;
  const Graph &s = *a.step;
  constexpr uint32_t kUnset = UINT32_MAX;
  // Per parameter tensor: the entries its gradient is written or read at.
  std::map<TensorId, std::pair<uint32_t, uint32_t>> gradUse;
  // Per unit and phase (0 forward, 1 backward and recompute): the entries reading its params.
  std::map<std::pair<uint32_t, int>, std::pair<uint32_t, uint32_t>> unitUse;
  auto unitOf = [&](TensorId p) -> uint32_t {
    const Tensor &x = s.tensors[p];
    if (!a.copies || x.param >= s.params.size())
      return kNone;
    uint32_t inst = s.params[x.param].instance;
    return inst < a.copies->ofInstance.size() ? a.copies->ofInstance[inst] : kNone;
  };
  auto widen = [](std::pair<uint32_t, uint32_t> &r, uint32_t e) {
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
    auto use = [&](TensorId t, bool input) {
      if (t == kNone)
        return;
      const Tensor &x = s.tensors[s.storageOf(t)];
      if (x.role == TensorRole::Gradient && x.gradOf != kNone && s.tensors[x.gradOf].role == TensorRole::Param)
        widen(gradUse.try_emplace(x.gradOf, kUnset, kUnset).first->second, entry);
      else if (x.role == TensorRole::Param && input && plan.parallel.zero >= 3)
        widen(unitUse.try_emplace({unitOf(s.storageOf(t)), se.kind == StepEntry::Forward ? 0 : 1}, kUnset, kUnset)
                  .first->second,
              entry);
    };
    for (TensorId t : op.inputs)
      use(t, true);
    for (TensorId t : op.outputs)
      use(t, false);
  }
  std::vector<Buffer> added;
  for (const ParamInfo &pi : s.params) {
    auto it = gradUse.find(pi.tensor);
    if (!pi.trainable || it == gradUse.end())
      continue;
    Buffer b;
    b.tensor = pi.tensor;
    b.op = a.stepSchedule[it->second.first].op;
    sizeBuffer(b, s.tensors[pi.tensor], plan.precision.grads);
    b.first = stepOfEntry[it->second.first];
    b.last = stepOfEntry[it->second.second];
    b.what = "parameter gradient of one micro-batch (ZeRO)";
    b.kind = Buffer::Gradient;
    added.push_back(b);
    a.zero.reduces.push_back({pi.tensor, it->second.first, it->second.second});
  }
  std::sort(a.zero.reduces.begin(), a.zero.reduces.end(),
            [](const auto &x, const auto &y) { return x.last < y.last || (x.last == y.last && x.param < y.param); });
  for (const auto &[key, use] : unitUse) {
    Analysis::ZeroMoves::Gather gather{use.first, key.first, key.second == 1, {}};
    for (const ParamInfo &pi : s.params) {
      if (unitOf(pi.tensor) != key.first)
        continue;
      Buffer b;
      b.tensor = pi.tensor;
      b.op = a.stepSchedule[use.first].op;
      sizeBuffer(b, s.tensors[pi.tensor], plan.precision.params);
      b.first = stepOfEntry[use.first];
      b.last = stepOfEntry[use.second];
      b.what = key.second == 1 ? "gathered parameter, backward (ZeRO 3)" : "gathered parameter, forward (ZeRO 3)";
      b.kind = Buffer::Transient;
      added.push_back(b);
      gather.params.push_back(pi.tensor);
    }
    a.zero.gathers.push_back(std::move(gather));
  }
  std::sort(a.zero.gathers.begin(), a.zero.gathers.end(),
            [](const auto &x, const auto &y) { return x.entry < y.entry || (x.entry == y.entry && x.unit < y.unit); });
  a.buffers.reserve(a.buffers.size() + added.size());
  a.buffers.insert(a.buffers.end(), added.begin(), added.end());
}

} // namespace tally
