// The roofline of every op: the rate it computes at, the target's ridge point for that rate,
// and whether the op is compute- or memory-bound. docs/time.md explains the model with the
// lecture's intensity table.
//
// 1. The compute dtype of an op is the plan's activation dtype. The one exception is tf32: under
//    the `tf32` precision preset (or activations = tf32 in a record) matrix products (the
//    Matmul and Attention classes) run on the TF32 tensor cores at peakTF32, with fp32
//    storage; every other op computes in fp32. An fp32 plan's matmuls therefore run at the
//    fp32 (CUDA-core) rate unless the plan asks for tf32.
//    An fp8 GEMM of Transformer Engine's recipe (passes/Fp8.cpp) runs at the fp8 rate.
// 2. When the target states no rate for that dtype (fp8 on an A100, or a user target that
//    lists only some dtypes), the op runs at the next wider format the target has: fp8 → bf16
//    → fp16 → tf32 → fp32, bf16 ↔ fp16 → tf32 → fp32, tf32 → fp32, fp32 → f64; if none of
//    those has a rate, at the slowest rate the target states. computeDtype records the dtype
//    whose rate is used, so later passes read target.peakFor(computeDtype) directly.
// 3. ridge = peak(computeDtype) / bandwidth. The op's arithmetic intensity (forward FLOPs per
//    forward byte, from passes/OpCosts.cpp) decides: compute-bound iff intensity ≥ ridge.
//    Ops that move no bytes (views) are neither; they are marked memory-bound and take no time.
// 4. Analysis::ridge is the ridge at the activation dtype (with the fallback of step 2): on
//    H100_SXM in bf16, 989.5e12 / 3.35e12 = 295.37 FLOP/byte. Analysis::peakFlops is the rate
//    matrix products run at, the peak MFU divides by.
#include "passes/Passes.h"
#include "passes/PricingMemo.h"

#include "llvm/ADT/SmallVector.h"

namespace tally {

namespace {

/// The formats to try, widest-compatible first, for ops that compute in `d` (step 2).
llvm::SmallVector<Dtype, 5> fallbacks(Dtype d) {
  switch (d) {
  case Dtype::FP8E4M3:
  case Dtype::FP8E5M2:
    return {Dtype::FP8E4M3, Dtype::BF16, Dtype::F16, Dtype::TF32, Dtype::F32};
  case Dtype::BF16: return {Dtype::BF16, Dtype::F16, Dtype::TF32, Dtype::F32};
  case Dtype::F16: return {Dtype::F16, Dtype::BF16, Dtype::TF32, Dtype::F32};
  case Dtype::TF32: return {Dtype::TF32, Dtype::F32};
  case Dtype::F64: return {Dtype::F64, Dtype::F32};
  default: return {Dtype::F32, Dtype::F64};
  }
}

/// The dtype whose peak the target states and the op runs at (steps 1-2).
Dtype rateDtype(const Target &t, Dtype d) {
  for (Dtype c : fallbacks(d))
    if (t.peakFor(c) > 0)
      return c;
  Dtype slowest = d;
  for (Dtype c : {Dtype::F32, Dtype::TF32, Dtype::F16, Dtype::BF16, Dtype::FP8E4M3})
    if (t.peakFor(c) > 0 && (t.peakFor(slowest) <= 0 || t.peakFor(c) < t.peakFor(slowest)))
      slowest = c;
  return slowest;
}

bool runsTf32(const PrecisionPolicy &p) {
  return p.preset == "tf32" || p.activations == Dtype::TF32;
}

/// Step 1: the dtype an op of class `c` computes in under the plan's precision.
Dtype opComputeDtype(const PrecisionPolicy &p, OpClass c) {
  if (runsTf32(p))
    return c == OpClass::Matmul || c == OpClass::Attention ? Dtype::TF32 : Dtype::F32;
  return p.activations;
}

/// Steps 1-3 for every op (Analysis::opTimesMemo's roofline entry for the same graph part and
/// records, when there is one).
void rooflineOps(Analysis &a) {
  OpTimesMemo *memo = a.opTimesMemo && a.tensorParallelMemo ? a.opTimesMemo.get() : nullptr;
  const double share = a.plan->target.share;
  if (memo)
    if (const OpTable *done = memo->roofline.find([&](const RooflineKey &k) {
          return k.part == a.tensorParallelMemo && k.share == share && k.records.sameLayout(a.ops);
        })) {
      a.ops = *done;
      return;
    }
  OpTable before;
  if (memo)
    before = a.ops;
  const Graph &g = *a.graph;
  const Plan &plan = *a.plan;
  const Target &t = plan.target;
  for (OpId i = 0; i < g.ops.size() && i < a.ops.size(); ++i) {
    OpAnalysis oa = a.ops[i];
    oa.computeDtype = rateDtype(t, opComputeDtype(plan.precision, opClass(g.ops[i].kind)));
    if (isFp8Gemm(a, i)) // passes/Fp8.cpp: forward, data and weight gradients on the fp8 cores
      oa.computeDtype = rateDtype(t, Dtype::FP8E4M3);
    double bytes = oa.forward.bytesRead + oa.forward.bytesWritten;
    double ridge = t.ridge(oa.computeDtype);
    oa.computeBound = bytes > 0 && ridge > 0 && oa.intensity() >= ridge;
    a.ops.set(i, oa);
  }
  if (memo)
    memo->roofline.add({a.tensorParallelMemo, share, std::move(before)}, a.ops);
}

} // namespace

void roofline(Analysis &a) {
  const Plan &plan = *a.plan;
  const Target &t = plan.target;
  rooflineOps(a);
  a.ridge = t.ridge(rateDtype(t, plan.precision.activations));
  a.peakFlops = t.peakFor(rateDtype(t, opComputeDtype(plan.precision, OpClass::Matmul)));
}

} // namespace tally
