// `tally solve serve` (issue 45): the largest concurrency an infer plan serves at a context
// within an inter-token latency budget, and that fits.
//
// 1. Analyse the plan at concurrency 1 (batch = 1): its serving capacity (passes/Inference.cpp
//    step 6) says how many sequences of max_context tokens the cache could hold beside the
//    weights and one prompt's prefill, M. More sequences only add workspace, so no
//    concurrency above M fits.
// 2. A concurrency N is good when N sequences fit beside the prefill of N prompts (N ≤ the
//    max_concurrent of the plan at batch N) and the decode step with every sequence at
//    max_context is within the budget. Each candidate is the plan with batch N, re-lowered
//    (the batch is a dimension of every activation) and analysed whole, so its numbers are
//    the ones `tally report` prints for that plan.
// 3. Both conditions only get harder as N grows (the step reads every sequence's cache; the
//    workspace grows with the batch): 1 must be good, then M is tried, then the gap is
//    bisected between the largest good and the smallest bad candidate.
#include "passes/Solvers.h"

#include "support/Format.h"

#include <algorithm>
#include <cmath>
#include <map>

namespace tally {

namespace {


/// One candidate concurrency, as its analysis prices it.
struct ServeRow {
  int64_t concurrent = 0;
  bool lowered = false;            ///< false: the plan could not be lowered at this batch
  double kvMemory = 0, kvNeeded = 0, maxConcurrent = 0;
  double latency = 0, firstToken = 0, tokensPerGpu = 0;
  bool fits = false, within = false;
  bool good() const { return lowered && fits && within; }
};

} // namespace

SolverAnswer solveServe(const Analysis &a, const Relower &relower, double latencyBudget) {
  const Plan &plan = *a.plan;
  const auto &inf = a.inference;
  SolverAnswer r;
  r.question = "serve";
  r.unit = "sequences";
  r.inputs = {wordInput("plan", plan.name),
              wordInput("target", plan.target.name),
              numberInput("tensor_parallel", static_cast<double>(plan.parallel.tensor)),
              numberInput("context", inf.maxContext),
              numberInput("prompt", static_cast<double>(plan.prompt)),
              numberInput("kv_block", inf.kvBlock),
              wordInput("kv_dtype", nameOf(inf.kvDtype).str()),
              numberInput("latency_budget_s", latencyBudget),
              numberInput("memory_limit", memoryLimit(plan))};
  if (plan.isTrain) {
    r.error = "plan '" + plan.name + "' is a train plan; serve needs an infer plan (--plan NAME)";
    return r;
  }
  if (inf.encoder) {
    r.error = "the model is an encoder (none of its attention is causal): it keeps no KV cache "
              "and decodes nothing, so there is no decode step to serve within a latency budget";
    return r;
  }
  if (inf.kvBytesPerSequence <= 0) {
    r.error = "the model keeps no KV cache (no self-attention): its concurrency is not bounded "
              "by the cache";
    return r;
  }
  std::string ctx = integerText(inf.maxContext);
  r.derivation.push_back(
      "KV per token = " + integerText(inf.kvBytesPerToken) + " B per device (K and V of " +
      std::to_string(inf.layers) + " layers, " + std::to_string(inf.kvHeads) + " KV heads, " +
      nameOf(inf.kvDtype).str() +
      (inf.kvReplication > 1 ? ", each KV head on " + derivationNumber(inf.kvReplication) + " tensor ranks"
                             : std::string()) +
      ")");
  r.derivation.push_back("a sequence of " + ctx + " tokens = " + derivationNumber(inf.kvBlocksPerSequence) +
                         " blocks of " + derivationNumber(inf.kvBlock) + " tokens = " +
                         integerText(inf.kvBytesPerSequence) + " B per device");

  AnalysisManager trials(a, relower);
  std::map<int64_t, ServeRow> rows;
  auto analyse = [&](int64_t n) -> const ServeRow & {
    auto it = rows.find(n);
    if (it != rows.end())
      return it->second;
    Plan candidate = plan;
    candidate.batch = candidate.microBatch = n;
    ServeRow row;
    row.concurrent = n;
    if (std::optional<Analysis> t = trials.layout(candidate)) {
      const auto &ci = t->inference;
      row.lowered = true;
      row.kvMemory = ci.kvMemoryBytes;
      row.kvNeeded = static_cast<double>(n) * ci.kvBytesPerSequence;
      row.maxConcurrent = ci.maxConcurrent;
      row.fits = static_cast<double>(n) <= ci.maxConcurrent;
      row.latency = ci.interTokenLatency;
      row.firstToken = ci.timeToFirstToken;
      row.tokensPerGpu = ci.tokensPerSecondPerGpu;
      row.within = latencyBudget <= 0 || ci.interTokenLatency <= latencyBudget;
    }
    return rows.emplace(n, row).first->second;
  };

  const ServeRow &one = analyse(1);
  if (!one.lowered) {
    r.error = "could not lower plan '" + plan.name + "' with one sequence";
    return r;
  }
  r.derivation.push_back("at concurrency 1 the cache may take " + formatBytes(one.kvMemory) +
                         " (" + integerText(std::round(one.kvMemory)) + " B) of " +
                         formatBytes(memoryLimit(plan)) + ": at most floor(" +
                         derivationNumber(one.kvMemory) + " / " + derivationNumber(inf.kvBytesPerSequence) + ") = " +
                         derivationNumber(one.maxConcurrent) + " sequences");
  r.derivation.push_back("inter-token latency = a decode step with every sequence at " + ctx +
                         " tokens (the weights and every sequence's cache read once)" +
                         (latencyBudget > 0 ? "; budget " + formatDuration(latencyBudget)
                                            : "; no latency budget"));
  int64_t answer = 0;
  if (!one.fits) {
    r.error = "one sequence of " + ctx + " tokens does not fit: the cache may take " +
              formatBytes(one.kvMemory) + ", a sequence needs " +
              formatBytes(inf.kvBytesPerSequence);
  } else if (!one.within) {
    r.error = "even one sequence's inter-token latency, " + formatDuration(one.latency) +
              ", is over the budget of " + formatDuration(latencyBudget);
  } else {
    int64_t lo = 1, hi = static_cast<int64_t>(std::min(one.maxConcurrent, 9.0e15));
    if (hi > lo && !analyse(hi).good()) {
      while (hi - lo > 1) {
        int64_t mid = lo + (hi - lo) / 2;
        (analyse(mid).good() ? lo : hi) = mid;
      }
    } else {
      lo = hi;
    }
    answer = lo;
  }
  for (const auto &[n, row] : rows) {
    r.rows.push_back({numberInput("concurrent", static_cast<double>(n)),
                      numberInput("kv_bytes", row.kvNeeded),
                      numberInput("kv_memory_bytes", row.kvMemory),
                      wordInput("fits", row.lowered ? (row.fits ? "yes" : "no") : "not lowered"),
                      numberInput("inter_token_latency_s", row.latency),
                      numberInput("time_to_first_token_s", row.firstToken),
                      numberInput("tokens_per_s_per_gpu", row.tokensPerGpu),
                      wordInput("within_budget", row.within ? "yes" : "no")});
  }
  if (!r.ok())
    return r;
  const ServeRow &best = rows.at(answer);
  r.answer = static_cast<double>(answer);
  r.derivation.push_back(
      "the largest that fits" + std::string(latencyBudget > 0 ? " within the budget" : "") +
      ": " + std::to_string(answer) + " sequences, inter-token latency " +
      formatDuration(best.latency) + ", time to first token " + formatDuration(best.firstToken) +
      ", " + derivationNumber(best.tokensPerGpu) + " tokens/s per GPU");
  return r;
}

} // namespace tally
