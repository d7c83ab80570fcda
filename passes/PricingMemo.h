// Analysis::opTimesMemo (passes/StepTime.cpp, passes/Roofline.cpp): the per-op results of the
// roofline and of the step time's step 2 for the last candidates of one AnalysisManager
// (AnalysisManager::keepLayoutFacts). The layout search times hundreds of candidates that
// differ only in pipeline, interleave, data, ZeRO or micro-batch count; both passes read
// none of those, and their per-op loops were most of each candidate's time.
#pragma once

#include "passes/Analysis.h"
#include "passes/KeptEntries.h"

#include <memory>
#include <string>
#include <vector>

namespace tally {

struct TensorParallel;
struct TensorParallelMemo;

/// What step 2 reads of a candidate besides its op records (compared whole, OpTable::sameLayout)
/// and the target and precision, which the candidates of one AnalysisManager share: the
/// tensor-parallel split (per graph part and tensor degree, context, sequence parallelism,
/// tensorStep and training: tensorParallelOf's memo), the padded head, the attention kernel the
/// stack runs, whether the CUDA step replays a graph and a shared host's share. An fp8 plan's
/// weight casts are per pipeline stage: its times are never taken from the memo.
struct OpTimesReads {
  std::shared_ptr<const TensorParallel> split;
  OpId padMatmul = kNone, padLoss = kNone;
  int64_t padded = 0, vocab = 0;
  std::string attention;
  bool native = false, cudaStep = false, captured = false;
  double share = 1; ///< Target::share (a rank of a shared host)
  bool operator==(const OpTimesReads &o) const {
    return split == o.split && padMatmul == o.padMatmul && padLoss == o.padLoss && share == o.share &&
           padded == o.padded && vocab == o.vocab && attention == o.attention &&
           native == o.native && cudaStep == o.cudaStep && captured == o.captured;
  }
};
struct OpTimesKey {
  OpTable records; ///< the op records step 2 read
  OpTimesReads reads;
};
/// Step 2's results: the op records and the dequantization totals.
struct OpTimesResult {
  OpTable ops;
  decltype(Analysis::dequant) dequant;
};

/// The roofline's input: the op records it read, per graph part (its tensor-parallel memo,
/// held, names it: its graph, precision and optimizer; the target is the manager's) and the
/// share of a shared host's rank (its ridge).
struct RooflineKey {
  std::shared_ptr<TensorParallelMemo> part;
  double share = 1;
  OpTable records;
};

struct OpTimesMemo {
  explicit OpTimesMemo(size_t keep) : entries(keep), roofline(keep) {}
  KeptEntries<OpTimesKey, OpTimesResult> entries;
  KeptEntries<RooflineKey, OpTable> roofline;
};

} // namespace tally
