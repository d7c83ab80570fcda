// Kernel fusion of elementwise chains (passes/Fusion.cpp), and what the pass and the code
// generator both need to read the memory plan: which buffer holds a tensor at a schedule step,
// and how an operand of an elementwise op is indexed from the op's flat output index.
#pragma once

#include "passes/Analysis.h"

#include <unordered_map>

namespace tally {

/// The arena buffers of the memory plan by tensor, and the schedule step of every entry of
/// Analysis::stepSchedule. Built from a complete analysis (planMemory has run).
class BufferIndex {
public:
  explicit BufferIndex(const Analysis &a);
  /// The buffer holding `base` (a storage tensor: no view) at schedule step `step`: the newest
  /// of its buffers live there (a recomputed tensor has several), or null.
  const Buffer *liveAt(TensorId base, uint32_t step) const;
  /// The schedule step (index into Analysis::schedule) of stepSchedule entry `entry`;
  /// schedule.size() for optimizer entries.
  uint32_t stepOf(size_t entry) const { return entry < stepOfEntry.size() ? stepOfEntry[entry] : kNone; }

private:
  std::unordered_map<TensorId, std::vector<const Buffer *>> byTensor;
  std::vector<uint32_t> stepOfEntry;
};

/// How element e of an elementwise op's output (dense, n elements) finds an operand's element:
/// the same index (Same), e % m (Trailing: the operand is the output's trailing dimensions,
/// broadcast over the leading ones: a bias), e / m (Leading: the operand is the output's
/// leading dimensions with size-1 trailing ones: a per-row statistic), or 0 (Scalar).
struct ElementIndex {
  enum Kind : uint8_t { Same, Trailing, Leading, Scalar } kind = Same;
  int64_t m = 1;
};
/// The index of dense operand `x` read by an elementwise op with output `out`; nullopt when
/// the operand is strided or broadcast in another pattern (the op then runs unfused).
std::optional<ElementIndex> elementIndex(const Graph &g, TensorId x, TensorId out);

/// Whether one generated kernel can run `op` element by element: a forward unary op, a binary
/// op (two tensors or a tensor and a constant), or the backward of a unary op (gelu, silu,
/// relu, tanh, sigmoid, exp, neg), with one dense output of a floating dtype and operands
/// indexed by elementIndex. Dropout, copies and everything with rows or reductions are not.
bool fusableElementwise(const Graph &g, const Op &op);

/// Fusion.cpp: with Plan::fuseKernels (the CUDA backend's step, or --fuse), the runs of
/// consecutive elementwise entries of the step schedule that one generated kernel runs
/// (Analysis::fusion), and the traffic and kernel launches that saves per op (OpAnalysis
/// fused*), which passes/StepTime.cpp prices. Needs the memory plan: a run stops where a
/// write would overlap a buffer another element still reads. Runs after planMemory.
void fuseKernels(Analysis &a);

} // namespace tally
