// The per-op analysis records (Analysis::ops), one record per distinct value rather than one
// per op.
//
// A deep model's repeat copies give the same numbers op for op: every layer's qkv matmul has
// the same FLOPs, bytes, backward FLOPs and times. At 100,000 layers the records were 1.5
// million × 128 bytes (issue 12); here each op holds the index of a record (4 bytes) and ops
// with equal records share one. Equal means every field bit for bit (a NaN equals the same
// NaN, 0 and -0 differ), so sharing never changes a number a report prints.
//
// Records are written through set(): an op's record is replaced, not edited in place, and
// the op moves to the record equal to its new value (found through the record its previous
// one last moved ops to, else a hash of the value), or to a new one. A record no op holds is
// reused. So a pass that writes every op in order costs a comparison per op when ops repeat,
// and a hash per op when they do not; reads are an index and a load.
#pragma once

#include "ir/OpRules.h"

#include <llvm/ADT/DenseMap.h>

#include <cstdint>
#include <vector>

namespace tally {

/// Per-op results, indexed like Graph::ops. FLOPs and bytes are for one micro-batch on the
/// whole (unsharded) graph, as lowered.
struct OpAnalysis {
  ForwardCost forward;
  double inputGradFlops = 0;     ///< backward FLOPs for gradients of activations
  double weightGradFlops = 0;    ///< backward FLOPs for gradients of parameters
  double executedBackwardFlops = 0;
  double backwardBytes = 0;      ///< bytes the backward reads and writes (2× forward, a documented estimate)
  double backwardTranscendentals = 0; ///< exp/erf/... evaluations of the backward ops (ForwardCost)
  double backwardCalls = 0;      ///< kernel calls of the backward ops (views excluded)
  Dtype computeDtype = Dtype::F32; ///< the rate the op runs at (peakFor)
  bool computeBound = false;     ///< intensity ≥ the target's ridge for computeDtype
  bool launchBound = false;      ///< StepTime: its forward waits on its kernel launches (the
                                 ///< launch floor is longer than its work)
  uint8_t unused[5] = {};        ///< named padding: a record is compared and hashed as bytes (OpTable)
  /// Forward FLOPs / forward bytes (0 for views), from `forward` as costOps set it.
  double intensity() const {
    double bytes = forward.bytesRead + forward.bytesWritten;
    return bytes > 0 ? forward.flops / bytes : 0;
  }
  double forwardTime = 0;        ///< seconds per micro-batch on one device (after parallel split)
  double backwardTime = 0;
  double tensorSplit = 1;        ///< StepTime: tensor-parallel degree dividing this op's work (1: runs whole)
};

class OpTable {
public:
  size_t size() const { return recordOf_.size(); }
  bool empty() const { return recordOf_.empty(); }
  const OpAnalysis &operator[](size_t op) const { return records_[recordOf_[op]]; }
  /// `n` ops, each with a default record.
  void assign(size_t n);
  /// Op `op`'s record becomes `value`.
  void set(size_t op, const OpAnalysis &value);
  /// Every op's record, in op order.
  class const_iterator {
  public:
    const_iterator(const OpTable *t, size_t i) : t_(t), i_(i) {}
    const OpAnalysis &operator*() const { return (*t_)[i_]; }
    const_iterator &operator++() { ++i_; return *this; }
    bool operator!=(const const_iterator &o) const { return i_ != o.i_; }
  private:
    const OpTable *t_;
    size_t i_;
  };
  const_iterator begin() const { return {this, 0}; }
  const_iterator end() const { return {this, size()}; }
  /// Records some op holds (what the table costs, beside 4 bytes per op).
  size_t distinct() const;
  /// The index of op `op`'s record, below recordSlots(): ops with the same index have equal
  /// records (a pass deriving a number from the record alone computes it once per index;
  /// the index says nothing across tables or after a set()).
  uint32_t recordOf(size_t op) const { return recordOf_[op]; }
  size_t recordSlots() const { return records_.size(); }

  /// Whether two records are equal, bit for bit (every byte of the record is a field).
  static bool same(const OpAnalysis &x, const OpAnalysis &y);
  /// Whether two tables hold the same records in the same slots for every op (O(ops), one
  /// comparison of the per-op slots): tables made by the same sets from the same table are;
  /// equal tables laid out otherwise are not said to be.
  bool sameLayout(const OpTable &o) const;

private:
  uint32_t find(const OpAnalysis &value, uint64_t hash) const; ///< an equal record, or kNone
  uint32_t add(const OpAnalysis &value, uint64_t hash);
  void release(uint32_t record);

  std::vector<uint32_t> recordOf_;  ///< per op
  std::vector<OpAnalysis> records_;
  std::vector<uint32_t> holders_;   ///< per record: the ops holding it (0: free)
  std::vector<uint32_t> movedTo_;   ///< per record: the record the last op leaving it went to
  std::vector<uint64_t> hash_;      ///< per record: the hash of its bytes
  std::vector<uint32_t> sameHash_;  ///< per record: the next held record with its hash (a chain)
  std::vector<uint32_t> free_;      ///< records no op holds, for reuse
  llvm::DenseMap<uint64_t, uint32_t> index_; ///< hash → the first held record with it
};

} // namespace tally
