// Nested activation checkpointing over a chain of stages: the dynamic program of Beaumont et
// al. (2019, "Optimal checkpointing for heterogeneous chains", the Rotor algorithm), which
// generalises Griewank's Revolve to stages of different sizes and costs. CheckpointNested.cpp
// builds the chain (the ops before the repeat copies, each copy or group of copies, the ops
// after them), solves it for a memory budget and writes the answer out as a schedule, whose
// real peak its liveness walk then measures.
//
// The model, in whole memory units (the caller rounds bytes up):
// - Stage s has an input of x[s] units (stage s − 1's output; x[0] is what the chain starts
//   from and is not counted), keeps kept[s] units for its backward besides its output, needs
//   work[s] units more while its backward runs (the gradients in flight), and its forward
//   takes forward[s] seconds. out(s) = x[s + 1] (0 for the last stage) is its output, or the
//   gradient of its output while its backward runs.
// - need(s) = kept[s] + out(s) + work[s]: what running stage s's forward keeping everything,
//   then its backward, holds.
// - Cost(s, t, m): the least forward time (first runs and re-runs) that takes the backward
//   through stages s..t when stage s's input is held by the caller and m units are free:
//     s = t:  forward[s], if need(s) ≤ m;
//     keep:   forward[s] + Cost(s + 1, t, m − kept[s] − out(s)), if need(s) ≤ m
//             (run stage s keeping everything; its backward comes after the rest's);
//     select: forward[s] + selective[s] + Cost(s + 1, t, m − keptSelective[s] − out(s)),
//             if need(s) ≤ m and the stage has selective ops (run stage s keeping all but the
//             outputs of its cheap ops — norms, GELU/SiLU, unfused attention — and re-run
//             those just before its backward: Megatron's selective recompute, per stage);
//     drop:   forward[s..s'−1] + Cost(s', t, m − x[s']) + Cost(s, s' − 1, m), s < s' ≤ t
//             (run s..s'−1 keeping only the input of s', finish s'..t, then redo s..s'−1
//             with the same free memory).
// - The answer is Cost(0, S − 1, budget); the recompute time is that minus the sum of the
//   forwards. Ranges holding the same sequence of stages share their costs, so the time is
//   O(R·S·budget) and the memory O(R·budget) for R distinct ranges: O(S) ranges for a chain
//   of identical copies between a head and a tail, O(S²) at worst.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tally {

struct ChainStage {
  int64_t input = 0; ///< x: units of the stage's input
  int64_t kept = 0;  ///< units its backward keeps besides its output
  int64_t work = 0;  ///< units its backward needs besides those and its output's gradient
  double forward = 0; ///< seconds of its forward
  /// What it keeps when its selective ops' outputs are dropped and re-made before its
  /// backward (kept when it has none), and the seconds of that re-run (0: no such option).
  int64_t keptSelective = 0;
  double selective = 0;
};

/// One step of the solved schedule: run a stage's forward (the first time or again), re-run
/// its selective ops (the select option), or run its backward.
struct ChainAction {
  enum Kind : uint8_t { Forward, Reselect, Backward } kind;
  uint32_t stage;
};

struct ChainPlan {
  bool feasible = false;
  double forwardTime = 0;    ///< every forward run, first runs included
  std::vector<ChainAction> actions;
};

/// The program solved once for every free memory 0..memory: plan(m) for any m ≤ memory is
/// read off the same table, so several budgets (auto's scale search, the trade-off curve)
/// cost one solve.
class ChainSolution {
public:
  ChainSolution(std::vector<ChainStage> stages, int64_t memory);
  /// The least-forward-time schedule within m units (m ≤ the memory solved for).
  ChainPlan plan(int64_t m) const;
  int64_t memory() const { return memory_; }

private:
  std::vector<ChainStage> st_;
  int64_t memory_;
  std::vector<int64_t> out_;
  std::vector<uint32_t> rangeId_; ///< per range (s ≤ t): its row
  std::vector<double> cost_;      ///< per (row, m)
  std::vector<int32_t> how_;      ///< -1 leaf, 0 keep, -3 select, s' − s > 0 drop up to s'
  size_t at(size_t s, size_t t, int64_t m) const;
  void emit(size_t s, size_t t, int64_t m, std::vector<ChainAction> &actions) const;
};

/// The least-forward-time schedule of the chain within `memory` units (the model above).
ChainPlan solveChain(const std::vector<ChainStage> &stages, int64_t memory);

} // namespace tally
