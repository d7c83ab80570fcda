// The tensor-parallel split of a forward graph (Megatron's rule; passes/TensorSplit.cpp): shared
// by the step time (StepTime.cpp), which prices its traffic, and tensorSplit (Passes.h), which
// the activation planner and the generated step read. Private to passes/.
#pragma once

#include "passes/Passes.h"

#include <vector>

namespace tally {

struct TensorParallel {
  std::vector<double> split;       ///< per op: the divisor of its work (1 or t)
  std::vector<bool> rowParallel;   ///< per op: all-reduces its output in the forward
  double forwardBytes = 0;         ///< all-reduced in one forward
  double backwardBytes = 0;        ///< all-reduced in one backward
  std::vector<double> forwardMessages, backwardMessages; ///< each all-reduce's bytes
  /// Per backward message, the column-parallel ops that read its tensor (whose weight
  /// gradients an asynchronous all-reduce hides behind, Parallelism::tensorOverlap).
  std::vector<std::vector<OpId>> backwardReaders;
  std::vector<bool> storageSplit;  ///< per storage: each rank holds 1/t of it
  std::vector<bool> columnParallel; ///< per op: a column-parallel matmul (splits its output)
  std::vector<TensorId> columnInputs; ///< the storages of backwardMessages, in their order
};

/// Step 1 of StepTime.cpp. With `traffic` false only `split` and `rowParallel` are made
/// (opWorkSplits: the activation planner prices every layout candidate's ops before its step
/// time does).
TensorParallel tensorParallel(const Graph &g, const Plan &plan, bool traffic = true);

} // namespace tally
