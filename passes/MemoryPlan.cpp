// The memory plan as the generated step uses it: the schedule over the training step's ops,
// and the flat regions of parameters, gradients, master weights and optimizer state.
//
// 1. The schedule: each step of Activations' schedule becomes the step graph's ops — a
//    forward or recompute step its forward op, a backward step the backward ops of that
//    forward op in the order autodiff emitted them (the loss gradient's fill goes with the
//    first backward step) — then the optimizer ops. stepIndexOf maps a schedule step (the
//    buffers' first/last) to its first entry here.
// 2. The regions, one replica, unsharded, each tensor at an offset aligned to kAlignment:
//    params (every parameter, at the params dtype), grads (trainable parameters, grads
//    dtype), master (trainable parameters, master dtype, when the policy keeps a master copy),
//    optimizer (for each state of the optimizer, each trainable parameter, optimizer dtype).
//    One allocation per region serves the step; the optimizer walks a region as one array.
//    ZeRO ≥ 1 with data = d > 1 shards master and optimizer (the generated step's ZeRO-1):
//    the grads region's E elements (padding included) split into d runs of ⌈E/d⌉, rank r
//    owning run r; master holds one run (alignUp(⌈E/d⌉ · its bytes)) and the optimizer one
//    run per state. StaticMemory's estimate, T·bytes/d per class, differs only by the padding.
//    ZeRO 2 and 3 shard each tensor instead (Analysis::regions.tensorShards): grads, master
//    and optimizer (and at stage 3 params) hold one piece of ⌈n/d⌉ elements per tensor.
// 3. The arena: the step's tensors that Activations' liveness does not cover — the loss
//    gradient and the local gradients autodiff computes before summing them into a broadcast
//    input's gradient — live within the one schedule step whose backward ops write and read
//    them, and join the buffers. A parameter's gradient is not among them: under ZeRO 0 and 1
//    the step writes it into the grads region (codegen/EmitStep.cpp, Emitter::ptr), under
//    ZeRO 2 and 3 into its own buffer of step 4, so it has no buffer here (issue 39). Then every buffer is placed in integer bytes: walking the
//    buffers in the order they are created, each takes the first free block that holds its size
//    rounded up to kAlignment (buffers whose last use is before its first step are freed first,
//    coalescing neighbours), else goes on top: a caching allocator's first fit. The arena is the
//    highest end. An analysis whose offsets nobody reads (Analysis::placeBuffers: check, the
//    reports) places nothing unless kernel fusion reads them: it only needs to know the plan
//    fits, which the sum of the aligned sizes (an upper bound on the arena) says when it fits
//    int64.
// 4. ZeRO 2 and 3 (passes/ZeroShards.cpp): a parameter's gradient of one micro-batch and, at
//    stage 3, each unit's gathered parameters are arena buffers too, live from their first to
//    their last use; the step moves them as Analysis::zero says.
// Every size, offset and sum here is an int64 byte count computed with checked arithmetic
// (checkedMul, checkedAdd, checkedAlignUp): a model can have elements that fit int64 and bytes
// that do not (a [3e9, 3e9] f32 weight: 9e18 elements, 3.6e19 bytes). The first size or offset
// that does not fit makes the plan not representable: Analysis::planOverflow says what, the
// arena, the regions and the offsets stay 0, and the pipeline reports it ([overflow]).
#include "passes/Passes.h"

#include "ir/Units.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>

namespace tally {

static_assert(sizeof(Buffer) == 48 && sizeof(SavedTensor) == 16,
              "Buffer or SavedTensor grew: a 100,000-layer plan has millions of each (issue 12)");

namespace {

/// Places buffers in one arena as a caching allocator would: walk the buffers in the order
/// they are created, return to a free list every buffer whose last use is before the new
/// one's first, and put the new one in the first free block that holds it (or at the top).
/// Lifetimes that overlap never share bytes; the arena may exceed the live peak by
/// fragmentation. O(n log n + n · free blocks). False when a buffer's aligned size or the top
/// passes INT64_MAX; every other sum (coalescing, splitting a block) stays below the top.
bool placeBuffers(std::vector<Buffer> &buffers, int64_t &arena) {
  size_t n = buffers.size();
  std::vector<size_t> byFirst(n), byLast(n);
  for (size_t i = 0; i < n; ++i)
    byFirst[i] = byLast[i] = i;
  std::stable_sort(byFirst.begin(), byFirst.end(), [&](size_t x, size_t y) {
    return buffers[x].first != buffers[y].first ? buffers[x].first < buffers[y].first
                                                : buffers[x].bytes > buffers[y].bytes;
  });
  std::stable_sort(byLast.begin(), byLast.end(),
                   [&](size_t x, size_t y) { return buffers[x].last < buffers[y].last; });
  std::map<int64_t, int64_t> freeList; // offset → size, coalesced
  int64_t top = 0;
  auto release = [&](const Buffer &b) {
    if (b.bytes <= 0)
      return;
    // Placed below the top, so its aligned size and every block's end are at most the top.
    auto [it, inserted] = freeList.emplace(b.offset, alignUp(b.bytes));
    if (it != freeList.begin()) {
      auto prev = std::prev(it);
      if (prev->first + prev->second == it->first) {
        prev->second += it->second;
        freeList.erase(it);
        it = prev;
      }
    }
    auto next = std::next(it);
    if (next != freeList.end() && it->first + it->second == next->first) {
      it->second += next->second;
      freeList.erase(next);
    }
    if (it->first + it->second == top) { // a free block at the top shrinks the top
      top = it->first;
      freeList.erase(it);
    }
  };
  size_t freed = 0;
  arena = 0;
  for (size_t i : byFirst) {
    Buffer &b = buffers[i];
    while (freed < n && buffers[byLast[freed]].last < b.first)
      release(buffers[byLast[freed++]]);
    if (b.bytes <= 0) {
      b.offset = 0;
      continue;
    }
    std::optional<int64_t> size = checkedAlignUp(b.bytes);
    if (!size)
      return false;
    auto fit = std::find_if(freeList.begin(), freeList.end(),
                            [&](const auto &blk) { return blk.second >= *size; });
    if (fit != freeList.end()) {
      b.offset = fit->first;
      int64_t rest = fit->second - *size;
      freeList.erase(fit);
      if (rest > 0)
        freeList.emplace(b.offset + *size, rest);
    } else {
      std::optional<int64_t> end = checkedAdd(top, *size);
      if (!end)
        return false;
      b.offset = top;
      top = *end;
    }
    arena = std::max(arena, top);
  }
  return true;
}

/// n elements of `dtype` aligned: nullopt when the bytes or their rounding pass INT64_MAX.
std::optional<int64_t> alignedBytes(int64_t n, Dtype dtype) {
  std::optional<int64_t> bytes = checkedMul(n, static_cast<int64_t>(bytesOf(dtype)));
  return bytes ? checkedAlignUp(*bytes) : std::nullopt;
}

/// Lays `states` copies of the tensors `ts` out in a region (listing each when `list`, else
/// only its size); false when a tensor's bytes or the region's size pass INT64_MAX. With
/// `pieces` > 1 (ZeRO 2 and 3) each tensor holds one piece of ⌈n / pieces⌉ elements.
bool lay(Region &r, Dtype dtype, const Graph &g, const std::vector<TensorId> &ts, unsigned states,
         bool list, int64_t pieces = 1) {
  r.dtype = dtype;
  if (list)
    r.tensors.reserve(r.tensors.size() + states * ts.size());
  for (unsigned s = 0; s < states; ++s)
    for (TensorId t : ts) {
      std::optional<int64_t> n = checkedNumel(g.tensors[t].shape); // lowering checked it
      if (n && pieces > 1) // ⌈n / pieces⌉ without n + pieces - 1
        n = *n / pieces + (*n % pieces != 0);
      std::optional<int64_t> bytes = n ? checkedMul(*n, static_cast<int64_t>(bytesOf(dtype))) : std::nullopt;
      std::optional<int64_t> aligned = bytes ? checkedAlignUp(*bytes) : std::nullopt;
      std::optional<int64_t> end = aligned ? checkedAdd(r.bytes, *aligned) : std::nullopt;
      if (!end)
        return false;
      if (list)
        r.tensors.push_back({t, s, r.bytes, *bytes});
      r.bytes = *end;
    }
  return true;
}

/// Step 1: Analysis::stepSchedule and stepIndexOf.
void scheduleOps(Analysis &a) {
  const Graph &g = *a.graph;
  const Graph &s = *a.step;
  const Plan &plan = *a.plan;
  // Step 1. The backward ops of each forward op, in one list grouped by forward op (a vector
  // per forward op was 80 MB of a 100,000-layer check).
  std::vector<std::pair<OpId, OpId>> backwardPairs; // (forward op, backward op)
  std::vector<OpId> lossFill, optimizer;
  for (OpId i = static_cast<OpId>(g.ops.size()); i < s.ops.size(); ++i) {
    const Op &op = s.ops[i];
    if (op.phase == Phase::Optimizer)
      optimizer.push_back(i);
    else if (op.forwardOp == kNone)
      lossFill.push_back(i);
    else
      backwardPairs.emplace_back(op.forwardOp, i);
  }
  TensorLists backwardOf; // indexed by forward op
  backwardOf.build(g.ops.size(), backwardPairs);
  backwardPairs = {};
  size_t entries = lossFill.size() + optimizer.size();
  for (const ScheduleStep &st : a.schedule)
    entries += st.kind == ScheduleStep::Backward ? backwardOf[st.op].size() : 1;
  a.stepSchedule.reserve(entries);
  a.stepIndexOf.assign(a.schedule.size() + 1, 0);
  bool filled = false;
  for (size_t k = 0; k < a.schedule.size(); ++k) {
    const ScheduleStep &st = a.schedule[k];
    a.stepIndexOf[k] = static_cast<uint32_t>(a.stepSchedule.size());
    switch (st.kind) {
    case ScheduleStep::Forward:
      a.stepSchedule.push_back({StepEntry::Forward, st.op});
      break;
    case ScheduleStep::Recompute:
      a.stepSchedule.push_back({StepEntry::Recompute, st.op});
      break;
    case ScheduleStep::Backward:
      if (!filled) {
        for (OpId f : lossFill)
          a.stepSchedule.push_back({StepEntry::Backward, f});
        filled = true;
      }
      for (OpId b : backwardOf[st.op])
        a.stepSchedule.push_back({StepEntry::Backward, b});
      break;
    }
  }
  a.stepIndexOf[a.schedule.size()] = static_cast<uint32_t>(a.stepSchedule.size());
  if (plan.isTrain)
    for (OpId o : optimizer)
      a.stepSchedule.push_back({StepEntry::Optimizer, o});
}

} // namespace

namespace {
/// The aligned bytes of the dense gradient tensors among [from, to) (parameters' gradients
/// too, unless `params` is false); nullopt past INT64_MAX.
std::optional<int64_t> gradientBytes(const Graph &step, size_t from, size_t to, bool params) {
  std::optional<int64_t> sum = 0;
  for (TensorId t = static_cast<TensorId>(from); t < to && sum; ++t) {
    const Tensor &x = step.tensors[t];
    if (x.role != TensorRole::Gradient || x.viewOf != kNone)
      continue;
    if (!params && x.gradOf != kNone && step.tensors[x.gradOf].role == TensorRole::Param)
      continue;
    std::optional<int64_t> n = checkedNumel(x.shape);
    std::optional<int64_t> bytes = n ? checkedMul(*n, static_cast<int64_t>(bytesOf(x.dtype))) : std::nullopt;
    std::optional<int64_t> size = bytes ? checkedAlignUp(*bytes) : std::nullopt;
    sum = size ? checkedAdd(*sum, *size) : std::nullopt;
  }
  return sum;
}
/// A parameter's gradient: the step writes it into the grads region (ZeRO 0 and 1) or into the
/// buffer step 4 gives it (ZeRO 2 and 3), never into a local gradient buffer.
bool parameterGradient(const Graph &step, const Tensor &x) {
  return x.gradOf != kNone && step.tensors[x.gradOf].role == TensorRole::Param;
}
} // namespace

std::optional<int64_t> localGradientBound(const Graph &step, size_t forwardTensors) {
  std::optional<int64_t> sum = gradientBytes(step, forwardTensors, step.tensors.size(), true);
  const Graph::Skipped &sk = step.skipped;
  if (sk.count == 0 || !sum)
    return sum;
  // A compact step: each skipped copy would have made the model copy's gradients but its
  // parameters' (the optimizer phase made those); the lowest one's input gradient is made
  // (the boundary), counted above.
  std::optional<int64_t> perCopy = gradientBytes(step, sk.modelTensorsBegin, sk.modelTensorsEnd, false);
  std::optional<int64_t> boundary = gradientBytes(step, sk.boundary, sk.boundary + 1, true);
  std::optional<int64_t> skipped = perCopy ? checkedMul(*perCopy, sk.count) : std::nullopt;
  if (!skipped || !boundary || *boundary > *sum)
    return std::nullopt;
  return checkedAdd(*sum - *boundary, *skipped);
}

/// The step's gradient tensors that Activations' buffers hold: an activation's gradient, and a
/// gradient sharing another's buffer (a `contiguous` that `shares`, passes/GradientShares.h).
static std::vector<bool> coveredGradients(const Analysis &a, const Graph &s) {
  std::vector<bool> covered(s.tensors.size(), false);
  for (const Buffer &b : a.buffers)
    if (b.kind == Buffer::Gradient && b.tensor != kNone && s.gradient[b.tensor] != kNone)
      covered[s.gradient[b.tensor]] = true;
  for (const Op &op : s.ops)
    if (op.kind == OpKind::Contiguous && op.attrs->shares)
      covered[s.storageOf(op.outputs[0])] = true;
  return covered;
}

namespace {

/// The graph whose parameter shapes the regions hold: the step's under Plan::tensorStep (one
/// tensor-parallel rank's parameters) and with a padded head (passes/HeadPadding.h: its
/// weight's V' rows), else the forward graph's.
const Graph &regionGraph(const Analysis &a) {
  const bool stepShapes = (a.plan->tensorStep && a.tensorStepError.empty()) || a.headPad.applies();
  return stepShapes && a.step ? *a.step : *a.graph;
}

} // namespace

void planMemory(Analysis &a) {
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  // Unlisted (Analysis::planListed), the walk proved the buffers with the local gradients fit
  // int64 when summed: no schedule, no local gradient buffers, regions as sizes alone.
  const bool listed = a.planListed;

  a.stepSchedule.clear();
  a.stepIndexOf.clear();
  a.zero = {};
  if (listed)
    scheduleOps(a);

  // Step 3.
  if (plan.isTrain && listed) {
    const Graph &s = *a.step;
    std::vector<uint32_t> stepOfEntry(a.stepSchedule.size(), 0);
    for (size_t k = 0; k + 1 < a.stepIndexOf.size(); ++k)
      for (uint32_t e = a.stepIndexOf[k]; e < a.stepIndexOf[k + 1]; ++e)
        stepOfEntry[e] = static_cast<uint32_t>(k);
    std::vector<bool> covered = coveredGradients(a, s);
    // The local gradients first, then room for exactly that many more buffers (the list holds
    // millions in a deep model: regrowing it held the old and the new list together).
    std::vector<std::pair<uint32_t, TensorId>> locals; // (schedule entry, gradient)
    for (size_t e = 0; e < a.stepSchedule.size(); ++e) {
      if (a.stepSchedule[e].kind != StepEntry::Backward)
        continue;
      const Op &op = s.ops[a.stepSchedule[e].op];
      for (TensorId t : op.outputs) {
        const Tensor &x = s.tensors[t];
        if (x.role != TensorRole::Gradient || x.viewOf != kNone || covered[t] || parameterGradient(s, x))
          continue;
        covered[t] = true;
        locals.emplace_back(static_cast<uint32_t>(e), t);
      }
    }
    a.buffers.reserve(a.buffers.size() + locals.size());
    for (const auto &[e, t] : locals) {
      const Tensor &x = s.tensors[t];
      Buffer b;
      b.tensor = t;
      b.op = a.stepSchedule[e].op;
      std::optional<int64_t> n = checkedNumel(x.shape); // lowering checked it
      std::optional<int64_t> bytes =
          n ? checkedMul(*n, static_cast<int64_t>(bytesOf(x.dtype))) : std::nullopt;
      b.bytes = bytes.value_or(0);
      b.size = numel(x.shape) * static_cast<double>(bytesOf(x.dtype));
      b.first = b.last = stepOfEntry[e];
      b.what = "local gradient";
      b.kind = Buffer::Gradient;
      a.buffers.push_back(b);
    }
    zeroMoves(a, stepOfEntry); // step 4
  }
  // Step 2 and 3 in integers; the first size that does not fit int64 ends the plan.
  auto reset = [&] {
    a.arenaBytes = 0;
    for (Buffer &b : a.buffers)
      b.offset = 0;
    a.regions.params = Region();
    a.regions.grads = Region();
    a.regions.master = Region();
    a.regions.optimizer = Region();
    a.regions.shard = 0;
    a.regions.tensorShards = 0;
  };
  a.planOverflow.clear();
  reset();
  auto unrepresentable = [&](std::string what) {
    a.planOverflow = std::move(what);
    reset();
  };
  for (const Buffer &b : a.buffers)
    if (!(b.size < 0x1p63)) {
      std::string name = "buffer " + (b.tensor == kNone ? std::string() : "%" + std::to_string(b.tensor) + " ") +
                         "(" + std::string(b.what) + (b.op < a.step->ops.size() ? " of op " + a.step->opPath(b.op) : std::string()) + ")";
      return unrepresentable(name + " is " + formatBytes(b.size) + ", past 2^63 - 1 bytes");
    }
  // Unless the offsets are read (Analysis::placeBuffers, kernel fusion), only whether the
  // plan fits matters: the arena is at most the buffers' aligned sizes summed, so when that
  // sum fits, so does every placement, and the placement is skipped.
  bool place = a.placesBuffers();
  if (!place) {
    std::optional<int64_t> sum = 0;
    for (const Buffer &b : a.buffers)
      if (sum && b.bytes > 0) {
        std::optional<int64_t> size = checkedAlignUp(b.bytes);
        sum = size ? checkedAdd(*sum, *size) : std::nullopt;
      }
    place = !sum;
  }
  if (place && !placeBuffers(a.buffers, a.arenaBytes))
    return unrepresentable("the activation arena passes 2^63 - 1 bytes");

  // Step 2.
  const Graph &pg = regionGraph(a);
  std::vector<TensorId> all, trainable;
  for (const ParamInfo &p : g.params) {
    all.push_back(p.tensor);
    if (p.trainable)
      trainable.push_back(p.tensor);
  }
  auto regionTooLarge = [&](const char *name) {
    unrepresentable(std::string("the ") + name + " region passes 2^63 - 1 bytes");
  };
  const Parallelism &par = plan.parallel;
  // ZeRO 2 and 3: every tensor of the regions it shards cut into data pieces, one per rank.
  int64_t pieces = plan.isTrain && par.zero >= 2 && par.data > 1 ? par.data : 1;
  if (!lay(a.regions.params, plan.precision.params, pg, all, 1, listed, par.zero >= 3 ? pieces : 1))
    return regionTooLarge("params");
  if (!plan.isTrain)
    return;
  if (!lay(a.regions.grads, plan.precision.grads, pg, trainable, 1, listed, pieces))
    return regionTooLarge("grads");
  int64_t gradBytes = static_cast<int64_t>(bytesOf(plan.precision.grads));
  if (pieces > 1) {
    a.regions.tensorShards = par.zero;
    if (plan.precision.master != Dtype::Invalid &&
        !lay(a.regions.master, plan.precision.master, pg, trainable, 1, listed, pieces))
      return regionTooLarge("master");
    if (!lay(a.regions.optimizer, plan.precision.optimizer, pg, trainable, optimizerStates(plan.optimizer), listed,
             pieces))
      return regionTooLarge("optimizer");
    return;
  }
  if (par.zero >= 1 && par.data > 1 && gradBytes > 0) {
    int64_t elems = a.regions.grads.bytes / gradBytes;
    // ⌈elems / data⌉ without elems + data - 1, which overflows for data near 2^63.
    a.regions.shard = elems / par.data + (elems % par.data != 0);
    auto shardOf = [&](Region &r, Dtype d, unsigned states) {
      r.dtype = d;
      std::optional<int64_t> one = alignedBytes(a.regions.shard, d);
      std::optional<int64_t> all = one ? checkedMul(states, *one) : std::nullopt;
      r.bytes = all.value_or(0);
      return all.has_value();
    };
    if (plan.precision.master != Dtype::Invalid && !shardOf(a.regions.master, plan.precision.master, 1))
      return regionTooLarge("master");
    if (!shardOf(a.regions.optimizer, plan.precision.optimizer, optimizerStates(plan.optimizer)))
      return regionTooLarge("optimizer");
    return;
  }
  if (plan.precision.master != Dtype::Invalid && !lay(a.regions.master, plan.precision.master, pg, trainable, 1, listed))
    return regionTooLarge("master");
  if (!lay(a.regions.optimizer, plan.precision.optimizer, pg, trainable, optimizerStates(plan.optimizer), listed))
    return regionTooLarge("optimizer");
}

bool placeArena(std::vector<Buffer> &buffers, int64_t &arena) { return placeBuffers(buffers, arena); }

bool layStageRegions(const Analysis &a, const std::vector<bool> &holds, Region &params, Region &grads, Region &master,
                     Region &optimizer, int64_t pieces) {
  const Graph &g = regionGraph(a); // tensor x pipeline: the stage's tensor cuts
  const Plan &plan = *a.plan;
  std::vector<TensorId> all, trainable;
  for (size_t i = 0; i < g.params.size(); ++i) {
    if (i >= holds.size() || !holds[i])
      continue;
    all.push_back(g.params[i].tensor);
    if (g.params[i].trainable)
      trainable.push_back(g.params[i].tensor);
  }
  params = grads = master = optimizer = Region();
  const int64_t paramPieces = plan.parallel.zero >= 3 ? pieces : 1;
  return lay(params, plan.precision.params, g, all, 1, true, paramPieces) &&
         lay(grads, plan.precision.grads, g, trainable, 1, true, pieces) &&
         (plan.precision.master == Dtype::Invalid || lay(master, plan.precision.master, g, trainable, 1, true, pieces)) &&
         lay(optimizer, plan.precision.optimizer, g, trainable, optimizerStates(plan.optimizer), true, pieces);
}

} // namespace tally
