// The tensor-parallel split of a forward graph (Megatron's rule; passes/TensorSplit.cpp): shared
// by the step time (StepTime.cpp), which prices its traffic, and tensorSplit (Passes.h), which
// the activation planner and the generated step read. Private to passes/.
#pragma once

#include "passes/Collectives.h"
#include "passes/Passes.h"

#include <memory>
#include <mutex>
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
  /// Sequence parallelism (Korthikanti et al. 2022 §4.2.2), with traffic: each storage a
  /// column-parallel matmul reads, its whole bytes, in first-read order: all-gathered along the
  /// sequence before the matmul (and again in the backward, for the weight gradient).
  std::vector<double> gatherMessages;
  std::vector<std::vector<OpId>> gatherReaders; ///< per gather message, the matmuls reading it
  /// Sequence parallelism: the elements of the trainable parameters that only ops split by the
  /// sequence alone read (norms' weights and biases, a row-parallel matmul's bias; not the
  /// embeddings, whose lookup Megatron runs whole): their gradients are each rank's partial sums,
  /// all-reduced over the tensor group once per step (Megatron's sequence_parallel attribute).
  double sequenceGradElements = 0;
  /// Sequence parallelism, training: each storage where the embedding section (run whole on
  /// every rank, Megatron's LanguageModelEmbedding) is scattered along the sequence, its bytes:
  /// its gradient is all-gathered in the backward (the scatter's backward, mappings.py).
  std::vector<double> scatterMessages;
  std::vector<bool> sequenceSplit;      ///< sequence parallelism: per storage, 1/t of its tokens
  std::vector<TensorId> sequenceParams; ///< with traffic: those of sequenceGradElements
};

/// Step 1 of StepTime.cpp. With `traffic` false only `split` and `rowParallel` are made
/// (opWorkSplits: the activation planner prices every layout candidate's ops before its step
/// time does).
TensorParallel tensorParallel(const Graph &g, const Plan &plan, bool traffic = true);

/// The splits of one graph part's candidates (Analysis::tensorParallelMemo, made by
/// AnalysisManager for each graph part): tensorParallel reads of the plan only the degrees
/// below, so a search's candidates that share them share one split (the layout search and
/// the fix notes made it three times per candidate: the facts, the op times, the step time).
struct TensorParallelMemo {
  struct Key {
    int64_t tensor = 1, context = 1;
    bool sequenceParallel = false, tensorStep = false, train = false;
    bool operator==(const Key &o) const {
      return tensor == o.tensor && context == o.context && sequenceParallel == o.sequenceParallel &&
             tensorStep == o.tensorStep && train == o.train;
    }
  };
  std::mutex lock; ///< the trade-off curve's walks may read it from another thread
  std::vector<std::pair<Key, std::shared_ptr<const TensorParallel>>> entries;
};

/// tensorParallel(*a.graph, *a.plan) with its traffic, from a's memo when it has one (else
/// made now and not kept).
std::shared_ptr<const TensorParallel> tensorParallelOf(const Analysis &a);

/// Records the collectives of `messages` (bytes each, over group `group`) in
/// Analysis::collectives, one entry per distinct size, `times` calls per step for each message,
/// under pipeline stage `stage` (-1: every rank runs them). Collectives.cpp.
void recordMessages(Analysis &a, const char *what, char group, Collective c, const std::vector<double> &messages,
                    double divisor, double times, bool overlapped, int64_t stage = -1);

/// The generated tensor x pipeline step (Analysis::pipelineStep with tensor = t > 1): records
/// each stage's tensor-group collectives, m micro-batches of them per step (its row-parallel
/// outputs' all-reduces, its column inputs' gradients' all-reduces, and the all-gather of each
/// boundary tensor it receives: Megatron's scatter/gather), and returns the seconds per step of
/// the slowest stage's all-reduces (the all-gathers are priced with the sends, boundarySend).
/// PipelineStep.cpp.
double tensorPipelineComm(Analysis &a, const TensorParallel &tp, double m);
/// What recomputing op `o` sends over the tensor group again (StepTime.cpp): a row-parallel
/// op's outputs reduced again (into `rows`) and, under sequence parallelism (`sequence`), a
/// column-parallel matmul's input gathered again (into `gathers`), in bytes.
void addRecomputeMessages(const Graph &g, const TensorParallel &tp, OpId o, bool sequence, std::vector<double> &rows,
                          std::vector<double> &gathers);

} // namespace tally
