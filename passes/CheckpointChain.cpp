// The chain dynamic program of CheckpointChain.h, bottom-up over the length of the stage
// range, every free-memory amount 0..budget at once.
#include "passes/CheckpointChain.h"

#include <algorithm>
#include <limits>
#include <map>
#include <tuple>

namespace tally {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
size_t pairIndex(size_t s, size_t t) { return t * (t + 1) / 2 + s; }
} // namespace

// Cost(s, t, ·) depends only on the stages s..t, so ranges holding the same sequence of
// stages share one row: a chain of L identical copies between a head and a tail has O(L)
// distinct ranges, not O(L²). Ranges are interned by length: id(s, t) = the id of the pair
// (id(s, t − 1), the id of stage t).
size_t ChainSolution::at(size_t s, size_t t, int64_t m) const {
  return static_cast<size_t>(rangeId_[pairIndex(s, t)]) * static_cast<size_t>(memory_ + 1) +
         static_cast<size_t>(m);
}

void ChainSolution::emit(size_t s, size_t t, int64_t m, std::vector<ChainAction> &actions) const {
  // how is relative to the row's first range; a split point is shifted to this range's start.
  int32_t how = how_[at(s, t, m)];
  auto forward = [&](size_t a, size_t b) {
    for (size_t i = a; i < b; ++i)
      actions.push_back({ChainAction::Forward, static_cast<uint32_t>(i)});
  };
  if (how == -1) { // leaf
    forward(s, s + 1);
    actions.push_back({ChainAction::Backward, static_cast<uint32_t>(s)});
  } else if (how == 0) { // keep stage s
    forward(s, s + 1);
    emit(s + 1, t, m - st_[s].kept - out_[s], actions);
    actions.push_back({ChainAction::Backward, static_cast<uint32_t>(s)});
  } else if (how == -3) { // keep stage s but its selective ops' outputs
    forward(s, s + 1);
    emit(s + 1, t, m - st_[s].keptSelective - out_[s], actions);
    actions.push_back({ChainAction::Reselect, static_cast<uint32_t>(s)});
    actions.push_back({ChainAction::Backward, static_cast<uint32_t>(s)});
  } else { // drop s..s'-1, keep the input of s' (how = s' − s)
    size_t sp = s + static_cast<size_t>(how);
    forward(s, sp);
    emit(sp, t, m - st_[sp].input, actions);
    emit(s, sp - 1, m, actions);
  }
}

ChainSolution::ChainSolution(std::vector<ChainStage> stages, int64_t memory)
    : st_(std::move(stages)), memory_(std::max<int64_t>(memory, 0)) {
  const std::vector<ChainStage> &st = st_;
  size_t S = st.size();
  if (S == 0)
    return;
  std::vector<int64_t> need(S, 0);
  out_.assign(S, 0);
  std::vector<double> prefix(S + 1, 0); // prefix[i]: forward seconds of stages 0..i-1
  for (size_t s = 0; s < S; ++s) {
    out_[s] = s + 1 < S ? st[s + 1].input : 0;
    need[s] = st[s].kept + out_[s] + st[s].work;
    prefix[s + 1] = prefix[s] + st[s].forward;
  }
  const std::vector<int64_t> &out = out_;
  // A stage's identity includes its output (the next stage's input): it is in need(s).
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t, double, int64_t, double>, uint32_t>
      stageIds;
  std::vector<uint32_t> stageId(S);
  for (size_t s = 0; s < S; ++s)
    stageId[s] = stageIds.emplace(std::make_tuple(st[s].input, st[s].kept, st[s].work, out[s],
                                                  st[s].forward, st[s].keptSelective,
                                                  st[s].selective),
                                  static_cast<uint32_t>(stageIds.size()))
                     .first->second;
  rangeId_.assign(S * (S + 1) / 2, 0);
  std::vector<std::pair<size_t, size_t>> rows; // each row's first range
  std::map<std::pair<uint32_t, uint32_t>, uint32_t> rangeIds;
  for (size_t len = 1; len <= S; ++len)
    for (size_t s = 0; s + len <= S; ++s) {
      size_t t = s + len - 1;
      auto key = len == 1 ? std::make_pair(UINT32_MAX, stageId[s])
                          : std::make_pair(rangeId_[pairIndex(s, t - 1)], stageId[t]);
      auto [it, fresh] = rangeIds.emplace(key, static_cast<uint32_t>(rows.size()));
      if (fresh)
        rows.push_back({s, t});
      rangeId_[pairIndex(s, t)] = it->second;
    }
  size_t cells = rows.size() * static_cast<size_t>(memory_ + 1);
  cost_.assign(cells, kInf);
  how_.assign(cells, -2);
  // Row by row (by length: every row a range needs is filled before it). Within a row the
  // options are tried in a fixed order — run stage s and keep going (0), the same with the
  // select option (-3), then each split point sp ascending — and the first strictly cheaper
  // one wins; the split options run over all budgets m at once, reading the two sub-rows
  // contiguously (the m-outer order read them a row apart per step: 3x slower).
  size_t width = static_cast<size_t>(memory_ + 1);
  // Per row: the least budget at which its cost is finite (width when none is). Below it a
  // split that needs the row adds infinity, so the split loops start above both sub-rows'.
  std::vector<size_t> firstFinite(rows.size(), width);
  auto finiteFrom = [&](size_t s, size_t t) { return firstFinite[rangeId_[pairIndex(s, t)]]; };
  for (auto [s, t] : rows) {
    double *best = &cost_[at(s, t, 0)];
    int32_t *how = &how_[at(s, t, 0)];
    for (int64_t m = need[s]; m <= memory_; ++m) {
      if (s == t) {
        best[m] = st[s].forward, how[m] = -1;
        continue;
      }
      int64_t rest = m - st[s].kept - out[s];
      double c = st[s].forward + cost_[at(s + 1, t, rest)];
      if (c < best[m])
        best[m] = c, how[m] = 0;
      if (st[s].selective > 0 && st[s].keptSelective < st[s].kept) {
        int64_t more = m - st[s].keptSelective - out[s];
        double cs = st[s].forward + st[s].selective + cost_[at(s + 1, t, more)];
        if (cs < best[m])
          best[m] = cs, how[m] = -3;
      }
    }
    // Splitting at sp costs at least every forward of the range plus those of s..sp−1 again
    // (the two sub-rows cost at least their forwards, and s..sp−1 runs twice). So where the
    // row already costs less than that floor, split sp cannot win, nor can any later one (the
    // floor grows with sp): its loop stops at `end`, the lowest budget above which the row
    // stays under the floor, which only falls as sp grows and the row improves. The margin
    // covers the rounding of these sums; where the floor is not clearly above the row,
    // nothing is skipped, so the table is exactly the one without the cut.
    size_t end = width;
    for (size_t sp = s + 1; sp <= t; ++sp) {
      double floor = (prefix[t + 1] - prefix[s] + prefix[sp] - prefix[s]) * (1 - 1e-9);
      while (end > 0 && best[end - 1] < floor)
        --end;
      if (end == 0)
        break;
      int64_t input = st[sp].input;
      if (input > memory_)
        continue;
      size_t shift = static_cast<size_t>(std::max<int64_t>(input, 0));
      const double *after = &cost_[at(sp, t, 0)];   // [sp, t] with m − input
      const double *before = &cost_[at(s, sp - 1, 0)]; // [s, sp − 1] with m
      double fwd = prefix[sp] - prefix[s];
      int32_t split = static_cast<int32_t>(sp - s);
      size_t from = std::max({shift, finiteFrom(sp, t) + shift, finiteFrom(s, sp - 1)});
      for (size_t m = from; m < end; ++m) {
        double c = fwd + after[m - shift] + before[m];
        if (c < best[m])
          best[m] = c, how[m] = split;
      }
    }
    size_t first = 0;
    while (first < width && !(best[first] < kInf))
      ++first;
    firstFinite[rangeId_[pairIndex(s, t)]] = first;
  }
}

ChainPlan ChainSolution::plan(int64_t m) const {
  ChainPlan plan;
  size_t S = st_.size();
  if (S == 0 || m < 0 || m > memory_)
    return plan;
  double total = cost_[at(0, S - 1, m)];
  if (total == kInf)
    return plan;
  plan.feasible = true;
  plan.forwardTime = total;
  emit(0, S - 1, m, plan.actions);
  return plan;
}

ChainPlan solveChain(const std::vector<ChainStage> &st, int64_t memory) {
  if (st.empty() || memory < 0)
    return ChainPlan();
  return ChainSolution(st, memory).plan(memory);
}

} // namespace tally
