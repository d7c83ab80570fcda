// Nested and optimal checkpointing (issue 9): the chain program of passes/CheckpointChain.h
// against an independent one written here, and `auto` against exhaustive search over every
// keep/recompute choice (through `checkpoint = keep [...]`) on random heterogeneous models.
#include "Support.h"

#include "passes/CheckpointChain.h"

#include "llvm/ADT/StringExtras.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>

using namespace tally;
using namespace tally::test;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

/// The model of CheckpointChain.h, read from its text and written again top-down with a memo:
/// the least forward time through stages s..t with m units free, the input of s held.
double independentCost(const std::vector<ChainStage> &st, int64_t memory) {
  size_t S = st.size();
  auto out = [&](size_t s) { return s + 1 < S ? st[s + 1].input : int64_t(0); };
  std::map<std::tuple<size_t, size_t, int64_t>, double> memo;
  std::function<double(size_t, size_t, int64_t)> cost = [&](size_t s, size_t t, int64_t m) {
    if (m < 0)
      return kInf;
    auto key = std::make_tuple(s, t, m);
    if (auto it = memo.find(key); it != memo.end())
      return it->second;
    double best = kInf;
    int64_t need = st[s].kept + out(s) + st[s].work;
    if (need <= m && s == t)
      best = st[s].forward;
    if (need <= m && s < t) {
      best = st[s].forward + cost(s + 1, t, m - st[s].kept - out(s));
      if (st[s].selective > 0 && st[s].keptSelective < st[s].kept)
        best = std::min(best, st[s].forward + st[s].selective +
                                  cost(s + 1, t, m - st[s].keptSelective - out(s)));
    }
    double run = 0; // forward seconds of s..s'-1
    for (size_t sp = s + 1; sp <= t; ++sp) {
      run += st[sp - 1].forward;
      best = std::min(best, run + cost(sp, t, m - st[sp].input) + cost(s, sp - 1, m));
    }
    memo[key] = best;
    return best;
  };
  return cost(0, S - 1, memory);
}

/// Replays a solved schedule: every stage's backward once, last stage first; each backward
/// after a forward of its stage that no other backward has used; the forward seconds add up.
void checkActions(const std::vector<ChainStage> &st, const ChainPlan &p) {
  size_t S = st.size();
  size_t nextBackward = S;
  std::vector<bool> fresh(S, false);
  double seconds = 0;
  for (const ChainAction &a : p.actions) {
    REQUIRE(a.stage < S);
    if (a.kind == ChainAction::Forward) {
      seconds += st[a.stage].forward;
      fresh[a.stage] = true;
      CHECK(a.stage < nextBackward); // nothing after a stage whose backward ran is re-run
    } else if (a.kind == ChainAction::Reselect) {
      seconds += st[a.stage].selective;
      CHECK(a.stage + 1 == nextBackward); // right before its own backward
    } else {
      REQUIRE(nextBackward > 0);
      CHECK(a.stage == nextBackward - 1);
      CHECK(fresh[a.stage]);
      nextBackward = a.stage;
    }
  }
  CHECK(nextBackward == 0);
  CHECK(seconds == Approx(p.forwardTime).epsilon(1e-12));
}

} // namespace

TEST_CASE("checkpoint chain: the program equals an independent one on random chains",
          "[checkpoint-chain]") {
  std::mt19937 rng(20261201);
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  int feasible = 0, nested = 0, selected = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::vector<ChainStage> st(static_cast<size_t>(pick(1, 7)));
    for (ChainStage &s : st) {
      s = {pick(0, 4), pick(0, 8), pick(0, 3), static_cast<double>(pick(1, 9))};
      if (pick(0, 1)) // a select option: keeps less, re-runs a cheap part
        s.keptSelective = pick(0, static_cast<int>(s.kept)), s.selective = pick(1, 3) / 4.0;
      else
        s.keptSelective = s.kept;
    }
    // A repeated stretch of identical stages now and then (rows shared between ranges).
    if (st.size() > 3 && trial % 3 == 0)
      std::fill(st.begin() + 1, st.end() - 1, st[1]);
    // One table answers every budget up to its own (the budget searches read it so): each
    // budget read from a table solved for 40 units equals the independent program's, so the
    // splits the table skips (CheckpointChain.cpp: the floors) could not have won anywhere.
    if (trial % 4 == 0) {
      ChainSolution table(st, 40);
      for (int64_t m = 0; m <= 40; m += 3) {
        INFO("trial " << trial << ", budget " << m << " read from a table of 40");
        double want = independentCost(st, m);
        ChainPlan p = table.plan(m);
        REQUIRE(p.feasible == (want != kInf));
        if (p.feasible)
          CHECK(p.forwardTime == Approx(want).epsilon(1e-12));
      }
    }
    int64_t memory = pick(0, 40);
    INFO("trial " << trial << ", " << st.size() << " stages, memory " << memory);
    double expected = independentCost(st, memory);
    ChainPlan p = solveChain(st, memory);
    REQUIRE(p.feasible == (expected != kInf));
    if (!p.feasible)
      continue;
    ++feasible;
    CHECK(p.forwardTime == Approx(expected).epsilon(1e-12));
    checkActions(st, p);
    std::vector<int> runs(st.size(), 0);
    for (const ChainAction &a : p.actions)
      runs[a.stage] += a.kind == ChainAction::Forward;
    nested += *std::max_element(runs.begin(), runs.end()) >= 3; // re-run twice: nested
    selected += std::any_of(p.actions.begin(), p.actions.end(),
                            [](const ChainAction &a) { return a.kind == ChainAction::Reselect; });
  }
  CHECK(feasible > 100); // the draw exercises the program, not only its infeasible answer
  CHECK(nested > 5);     // and schedules that re-run some stage twice
  CHECK(selected > 5);   // and ones that take the select option
}

TEST_CASE("checkpoint chain: L identical stages need fewer re-runs as memory grows (Revolve)",
          "[checkpoint-chain]") {
  // Stages of input 1, keeping 4, no work, forward 1 s: with memory for everything no re-run;
  // less memory never costs less; at the least feasible memory (one stage's 5 units and one
  // checkpoint) the schedule is recompute_all's, L(L+1)/2 = 2,080 runs less the last stage's
  // re-runs it needs not; with log2(L) = 6 more checkpoints, Revolve's regime, about L·log L.
  const size_t L = 64;
  std::vector<ChainStage> st(L, ChainStage{1, 4, 0, 1.0});
  double prev = 0;
  int64_t least = -1;
  for (int64_t m = 5 * static_cast<int64_t>(L); m >= 0; --m) {
    ChainPlan p = solveChain(st, m);
    if (!p.feasible) {
      least = m + 1;
      break;
    }
    if (m == 5 * static_cast<int64_t>(L))
      CHECK(p.forwardTime == L);
    CHECK(p.forwardTime >= prev); // monotone as memory falls
    prev = p.forwardTime;
  }
  REQUIRE(least > 0);
  ChainPlan tight = solveChain(st, least);
  INFO("least memory " << least << " units, forward runs " << tight.forwardTime);
  CHECK(tight.forwardTime < 2080);
  ChainPlan six = solveChain(st, least + 6);
  INFO("with 6 more units: forward runs " << six.forwardTime);
  CHECK(six.forwardTime <= L * std::log2(static_cast<double>(L)));
}

namespace {

/// A random heterogeneous chain of K single-copy repeats: matmul blocks of random widths and
/// GELU blocks, so copies differ in what they keep and in what re-running them costs.
std::string randomModel(std::mt19937 &rng, size_t K, std::vector<std::string> &copies) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::string members, chain = "x";
  for (size_t i = 0; i < K; ++i) {
    std::string name = "c" + std::to_string(i);
    copies.push_back(name);
    if (pick(0, 2) == 0)
      members += "  " + name + " = repeat(1) Ew(d)\n";
    else
      members += "  " + name + " = repeat(1) Mm(d, " + std::to_string(64 * pick(1, 8)) + ")\n";
    chain = name + "(" + chain + ")";
  }
  return R"(
block Mm(d, w) {
  fc   = Linear(d, w)
  proj = Linear(w, d)
  forward(x) { return x + proj(gelu(fc(x))) }
}
block Ew(d) {
  forward(x) { return x + gelu(gelu(gelu(x))) }
}
model R(d = 64) {
)" + members + "  forward(x: f32[batch, d]) { return mean(" + chain + R"() }
}
train t { model = R()  batch = 256  optimizer = SGD(lr = 0.1)  precision = fp32
          checkpoint = {POLICY}  target = Small }
target Small {
  memory    = {MEM}
  bandwidth = 1 TB/s
  peak { fp32 = 10 TFLOP/s }
}
)";
}

std::string with(std::string text, const std::string &policy, const std::string &mem) {
  for (auto [key, value] : {std::pair{std::string("{POLICY}"), policy}, {"{MEM}", mem}})
    text.replace(text.find(key), key.size(), value);
  return text;
}

} // namespace

TEST_CASE("checkpoint: auto is never worse than exhaustive search over keep/recompute choices",
          "[checkpoint-chain]") {
  std::mt19937 rng(7);
#ifdef TALLY_UNDER_ASAN
  const std::vector<size_t> sizes = {6, 8}; // 320 compiles, not 832: 10-30x slower there
#else
  const std::vector<size_t> sizes = {6, 8, 9};
#endif
  for (size_t K : sizes) {
    std::vector<std::string> copies;
    std::string src = randomModel(rng, K, copies);
    // Every subset of copies kept (the rest recomputed), measured on a roomy device.
    struct Choice {
      std::string policy;
      double bytes, recompute;
    };
    std::vector<Choice> all;
    double states = 0;
    for (uint32_t mask = 0; mask < (1u << K); ++mask) {
      std::vector<std::string> kept;
      for (size_t i = 0; i < K; ++i)
        if (mask >> i & 1)
          kept.push_back(copies[i]);
      std::string policy = kept.empty() ? "full"
                           : kept.size() == K
                               ? "none"
                               : "keep [" + llvm::join(kept, ", ") + "]";
      Compiled c(with(src, policy, "80 GiB"));
      all.push_back({policy, c.a->memory.activations + c.a->memory.workspace,
                     c.a->time.recompute});
      states = c.a->memory.peak - all.back().bytes;
    }
    double most = 0, least = kInf;
    for (const Choice &c : all)
      most = std::max(most, c.bytes), least = std::min(least, c.bytes);
    INFO(K << " copies: activations + workspace from " << least << " to " << most << " B");
    double lastPeak = kInf;
    for (int step = 0; step <= 12; ++step) {
      double budget = states + least + (most - least) * (12 - step) / 12.0;
      Compiled a(with(src, "auto", std::to_string(static_cast<int64_t>(budget)) + " B"));
      double limit = a.a->checkpoint.limitBytes;
      double best = kInf;
      std::string bestPolicy;
      for (const Choice &c : all)
        if (c.bytes <= limit && c.recompute < best)
          best = c.recompute, bestPolicy = c.policy;
      double used = a.a->memory.activations + a.a->memory.workspace;
      INFO("budget " << budget << " B, limit " << limit << " B: auto chose "
                     << a.a->checkpoint.policy << " (" << used << " B, recompute "
                     << a.a->time.recompute << " s); exhaustive best " << bestPolicy << " ("
                     << best << " s)");
      if (best == kInf)
        continue; // no one-level choice fits: auto may still fit by nesting
      CHECK(used <= limit);
      CHECK(a.a->time.recompute <= best * (1 + 1e-9));
      CHECK(a.a->memory.peak <= lastPeak * (1 + 1e-12)); // never rises as the budget falls
      lastPeak = a.a->memory.peak;
    }
  }
}
