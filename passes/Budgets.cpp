// Budgets: the plan's `budget` block (and the --budget-* flags) against the analysis. A broken
// budget is an error at its line, followed by notes that propose fixes, each one computed by
// analysing a changed plan with the solvers (passes/Solvers.h) rather than guessed.
//
// 1. For each budget read the analysed number: memory per device = memory.peak, step time =
//    time.step, MFU = time.mfu, run time = time.run (seconds; a train plan needs `tokens`).
//    For an infer plan the inference pass puts one decode step, the decode MFU and the whole
//    generation there; its budgets are checked, and the fixes below are for training only.
// 2. Compare with the limit (`<=`/`<` an upper bound, `>=`/`>` a lower bound); a kept budget
//    says nothing.
// 3. A broken upper bound on memory proposes: the cheapest checkpoint policy that fits (and
//    its extra FLOPs), the largest smaller micro-batch that fits, the lowest higher ZeRO
//    stage that fits, and the fewest data-parallel devices that fit (ZeRO-3 when the plan's
//    stage never fits; not named when it is today's count, which the ZeRO note covers).
//    When the plan's loss is PyTorch's eager cross entropy and its buffers weigh (the eager
//    loss's extra bytes over a fused kernel's, counted from the logits, at least 2% of the
//    peak), it also names the peak with one fused loss kernel (`cross_entropy = fused`),
//    analysed on its own graph. Data degrees and micro-batches are bisected (fewestDevices' and largestMicroBatch's
//    `bisect`: fitting is monotone in them), so a 10,000-layer plan prices about log2 of its
//    degrees, not each, and re-lowers as few micro-batches.
// 4. A broken upper bound on step time or run time proposes the fewest data-parallel devices
//    that meet it and still fit in memory (memoryLimit: the device's memory or a smaller
//    memory budget, even one the plan breaks now: a fix should keep every budget), bisected
//    likewise (where a slower network makes more devices slower, the layout named meets the
//    budget but may not be the fewest that do).
// 5. A broken lower bound on MFU proposes the smallest larger micro-batch that reaches it and
//    fits in memory (or the best that fits, when it raises MFU by 1% of itself or more), and
//    dropping recompute (checkpoint = none) when that fits.
// Inside a solver's trial (a candidate plan being analysed) budgets are not checked. Every fix
// of one plan shares one AnalysisManager (passes/AnalysisManager.h): each distinct graph is lowered and
// differentiated once, each candidate priced once.
#include "passes/Passes.h"
#include "passes/Solvers.h"

#include "support/Diagnostics.h"
#include "support/Format.h"
#include "ir/Units.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

namespace tally {

namespace {

/// "80.00 GiB" → "80 GiB": a budget prints as the user wrote it.
std::string trimZeros(std::string s) {
  auto sp = s.find(' ');
  std::string numPart = s.substr(0, sp), rest = sp == std::string::npos ? "" : s.substr(sp);
  if (numPart.find('.') != std::string::npos) {
    while (!numPart.empty() && numPart.back() == '0')
      numPart.pop_back();
    if (!numPart.empty() && numPart.back() == '.')
      numPart.pop_back();
  }
  return numPart + rest;
}

std::string percent(double ratio) { return formatPercent(ratio); }

/// The command-line flag that sets a budget of this metric.
const char *flagOf(BudgetMetric m) {
  switch (m) {
  case BudgetMetric::MemoryPerDevice: return "--budget-memory";
  case BudgetMetric::StepTime: return "--budget-step-time";
  case BudgetMetric::Mfu: return "--budget-mfu";
  case BudgetMetric::RunTime: return "--budget-run-time";
  }
  return "";
}

DiagKind kindOf(BudgetMetric m) {
  switch (m) {
  case BudgetMetric::MemoryPerDevice: return DiagKind::BudgetMemory;
  case BudgetMetric::StepTime: return DiagKind::BudgetStepTime;
  case BudgetMetric::Mfu: return DiagKind::BudgetMfu;
  case BudgetMetric::RunTime: return DiagKind::BudgetRunTime;
  }
  return DiagKind::BudgetMemory;
}

/// The memory a time or MFU fix must stay within: the plan's memory limit (the device's
/// memory or a smaller memory budget: a fix breaks neither), unbounded when neither is known.
double fixMemoryLimit(const Analysis &a) {
  double limit = memoryLimit(*a.plan);
  return limit > 0 ? limit : INFINITY;
}

std::string layout(const Plan &p) {
  return std::to_string(p.parallel.devices) + " × " + p.target.name + " (data = " +
         std::to_string(p.parallel.data) + ", zero = " + std::to_string(p.parallel.zero) + ")";
}

std::string accumulationText(const Plan &p) {
  return "accumulation steps " + significant(accumulationSteps(p));
}

// ---- fixes -------------------------------------------------------------------------------

/// Step 3: fixes for a peak memory per device above `limit`.
std::vector<std::string> memoryFixes(AnalysisManager &trials, double limit) {
  // Every candidate below is read for its peak and FLOPs only: its time is not priced.
  struct MemoryOnly {
    AnalysisManager &m;
    bool was;
    explicit MemoryOnly(AnalysisManager &m) : m(m), was(m.memoryOnly()) { m.setMemoryOnly(true); }
    ~MemoryOnly() { m.setMemoryOnly(was); }
  } memoryOnly(trials);
  const Analysis &a = trials.base();
  std::vector<std::string> notes;
  const Plan &plan = *a.plan;
  auto fits = [&](const Trial &t) { return t.peak <= limit; };

  // Checkpoint policies: the same graph, another plan.checkpoint.
  if (plan.isTrain && a.memory.activations > 0) {
    std::string best, leanest;
    Trial bestT, leanestT;
    for (const char *policy : {"sqrt", "full", "auto", "none"}) {
      if (plan.checkpoint == policy)
        continue;
      Plan p = plan;
      p.checkpoint = policy;
      std::optional<Trial> t = trials.trial(p, /*checkpointOnly=*/true);
      if (!t)
        continue;
      if (fits(*t) && (best.empty() || t->executedFlops < bestT.executedFlops))
        best = policy, bestT = *t;
      if (leanest.empty() || t->peak < leanestT.peak)
        leanest = policy, leanestT = *t;
    }
    std::string head = "activations are " + formatBytes(a.memory.activations) + "; ";
    if (plan.checkpoint == "auto") {
      // auto already applied the smallest footprint it found: say how low any plan goes.
      double least = a.memory.peak;
      std::string how = a.checkpoint.policy;
      for (const auto &pt : a.checkpoint.curve)
        if (pt.peakBytes < least)
          least = pt.peakBytes, how = pt.policy;
      notes.push_back(head + "no checkpoint plan fits: the least peak any reaches is " +
                      formatBytes(least) + " (" + how + ")");
    } else if (!best.empty()) {
      std::string cost;
      if (a.flops.executed > 0) {
        double extra = bestT.executedFlops / a.flops.executed - 1;
        cost = std::string(" for ") + (extra >= 0 ? "+" : "") + percent(extra) + " FLOPs";
      }
      notes.push_back(head + "checkpoint = " + best + " fits in " + formatBytes(bestT.peak) + cost);
    } else if (!leanest.empty() && leanestT.peak < a.memory.peak) {
      notes.push_back(head + "even checkpoint = " + leanest + " needs " +
                      formatBytes(leanestT.peak));
    }
  }

  // The eager loss (ir/ops/Loss.cpp): what it keeps (log_softmax's fp32 output, an extra
  // buffer) and its backward's working set, less the logits a fused kernel keeps instead, read
  // from the op's own rules. Named when that is 2% of the peak or more: then a fused loss is
  // analysed.
  if (plan.isTrain && crossEntropyKernel(plan) == CrossEntropyKernel::Eager) {
    double extra = 0;
    const Graph &g = *a.graph;
    for (OpId o = 0; o < g.ops.size(); ++o) {
      const Op &op = g.ops[o];
      if (op.kind != OpKind::CrossEntropy || op.attrs->loss != CrossEntropyKernel::Eager)
        continue;
      extra += backwardScratch(g, op) - g.bytes(op.inputs[0]);
      for (const SavedTensor &s : a.savedOf(o))
        extra += s.tensor == kNone ? s.bytes : 0;
    }
    if (extra >= 0.02 * a.memory.peak) {
      Plan p = plan;
      p.parallel.crossEntropy = "fused";
      if (std::optional<Trial> t = trials.trial(p); t && t->peak < a.memory.peak)
        notes.push_back("the loss runs as PyTorch's eager cross entropy on an fp32 copy of the logits; one "
                        "fused loss kernel (cross_entropy = fused: a compiled loss, flash-attn's or Liger's) " +
                        std::string(fits(*t) ? "fits in " : "needs ") + formatBytes(t->peak));
    }
  }

  // A smaller micro-batch (more accumulation steps). When the model states alone exceed the
  // limit no micro-batch fits, and none is lowered to show it (a re-lowered graph with its
  // own step and checkpoint search was most of a deep model's budget fixes).
  double statesFloor = plan.isTrain ? modelStatesFloor(a, plan) : 0;
  if (plan.isTrain && plan.microBatch > 1 && statesFloor > limit) {
    notes.push_back("no micro_batch fits: the model states and framework memory alone need " +
                    formatBytes(statesFloor));
  } else if (plan.isTrain && plan.microBatch > 1) {
    std::vector<std::pair<int64_t, double>> tried;
    if (auto c = largestMicroBatch(trials, limit, plan.microBatch - 1, &tried, true))
      notes.push_back("micro_batch = " + std::to_string(c->plan.microBatch) + " fits in " +
                      formatBytes(c->trial.peak) + " (" + accumulationText(c->plan) + ")");
    else if (!tried.empty())
      notes.push_back("even micro_batch = " + std::to_string(tried.back().first) + " needs " +
                      formatBytes(tried.back().second));
  }

  // A higher ZeRO stage over the same data-parallel group.
  if (plan.isTrain && plan.parallel.data > 1 && plan.parallel.zero < 3) {
    std::optional<Trial> last;
    int stage = plan.parallel.zero + 1;
    for (; stage <= 3; ++stage) {
      Plan p = plan;
      p.parallel.zero = stage;
      // A stage whose model states alone break the limit cannot fit; only zero = 3's peak
      // is named when none does, so the others are not analysed.
      if (stage < 3 && modelStatesFloor(a, p) > limit)
        continue;
      last = trials.trial(p);
      if (last && fits(*last))
        break;
    }
    if (last && stage <= 3)
      notes.push_back("zero = " + std::to_string(stage) + " fits in " + formatBytes(last->peak));
    else if (last)
      notes.push_back("even zero = 3 needs " + formatBytes(last->peak));
  }

  // More data-parallel devices (which help memory through ZeRO sharding or a smaller
  // derived micro-batch).
  // A layout on as many devices as now is the ZeRO note again: only other counts are named.
  if (plan.isTrain) {
    std::optional<Candidate> c =
        fewestDevices(trials, plan.parallel.zero, fits, nullptr, true, limit);
    if (!c && plan.parallel.zero < 3)
      c = fewestDevices(trials, 3, fits, nullptr, true, limit);
    if (c && c->plan.parallel.devices != plan.parallel.devices)
      notes.push_back(layout(c->plan) + " fits in " + formatBytes(c->trial.peak));
  }
  return notes;
}

/// Step 4: the fewest devices whose step time (or run time) meets `limit`, still in memory.
std::vector<std::string> timeFixes(AnalysisManager &trials, double limit, bool runTime) {
  const Analysis &a = trials.base();
  std::vector<std::string> notes;
  const Plan &plan = *a.plan;
  if (!plan.isTrain)
    return notes;
  double mem = fixMemoryLimit(a);
  auto meets = [&](const Trial &t) {
    double v = runTime ? t.runTime : t.stepTime;
    return v > 0 && v <= limit && t.peak <= mem;
  };
  if (auto c = fewestDevices(trials, plan.parallel.zero, meets, nullptr, true, mem)) {
    double v = runTime ? c->trial.runTime : c->trial.stepTime;
    notes.push_back(layout(c->plan) + " gives a " + (runTime ? "run time" : "step time") +
                    " of " + formatDuration(v) + " in " + formatBytes(c->trial.peak) +
                    " per device");
  } else {
    int64_t span = plan.microBatchGiven ? plan.batch / std::max<int64_t>(1, plan.microBatch)
                                        : plan.batch;
    int64_t most = span * plan.parallel.tensor * plan.parallel.pipeline *
                   std::max<int64_t>(1, plan.parallel.context);
    notes.push_back("no data-parallel layout of up to " + std::to_string(most) + " × " +
                    plan.target.name + " meets it within " + formatBytes(mem) + " per device");
  }
  return notes;
}

/// Step 5: a larger micro-batch, or less recompute, that raises MFU to `target`.
std::vector<std::string> mfuFixes(AnalysisManager &trials, double target) {
  const Analysis &a = trials.base();
  std::vector<std::string> notes;
  const Plan &plan = *a.plan;
  if (!plan.isTrain)
    return notes;
  double mem = fixMemoryLimit(a);
  std::optional<Candidate> reach, bestUnder;
  for (int64_t mb : microBatchCandidates(plan)) {
    if (mb <= plan.microBatch)
      continue;
    Plan p = plan;
    p.microBatch = mb;
    p.microBatchGiven = true;
    std::optional<Trial> t = trials.trial(p);
    if (!t || t->peak > mem)
      continue;
    if (t->mfu >= target) {
      reach = Candidate{p, *t};
      break;
    }
    // A raise under 1% of the current MFU is noise, not a fix.
    if (t->mfu > a.time.mfu * 1.01 && (!bestUnder || t->mfu > bestUnder->trial.mfu))
      bestUnder = Candidate{p, *t};
  }
  auto describeMb = [](const Candidate &c) {
    return "micro_batch = " + std::to_string(c.plan.microBatch) + " " + "(" +
           accumulationText(c.plan) + ", " + formatBytes(c.trial.peak) + " per device)";
  };
  if (reach)
    notes.push_back(describeMb(*reach) + " reaches MFU " + percent(reach->trial.mfu));
  else if (bestUnder)
    notes.push_back(describeMb(*bestUnder) + " raises MFU to " + percent(bestUnder->trial.mfu) +
                    ", the most a micro-batch that fits gives");
  else if (plan.microBatch < microBatchCandidates(plan).back())
    notes.push_back("no larger micro-batch that fits in " + formatBytes(mem) +
                    " raises MFU by 1% or more");
  if (plan.checkpoint != "none") {
    Plan p = plan;
    p.checkpoint = "none";
    std::optional<Trial> t = trials.trial(p, /*checkpointOnly=*/true);
    if (t && t->peak <= mem && t->mfu > a.time.mfu * 1.01)
      notes.push_back("checkpoint = none (no recompute) " +
                      std::string(t->mfu >= target ? "reaches MFU " : "raises MFU to ") +
                      percent(t->mfu) + " in " + formatBytes(t->peak) + " per device");
  }
  return notes;
}

// ---- checking ------------------------------------------------------------------------------

/// Emits one broken budget: the error at its line (or from its flag) with the fix notes.
void report(DiagnosticEngine &diags, const BudgetSpec &b, std::string message,
            const std::vector<std::string> &notes) {
  bool fromFlag = !b.range.isValid();
  if (fromFlag)
    message += std::string(" (") + flagOf(b.metric) + ")";
  auto d = diags.report(kindOf(b.metric), b.range.Start, std::move(message));
  d.range(b.range);
  for (const std::string &n : notes)
    d.note(b.range.Start, n);
}

/// "exceeds the budget of" or "is below the budget of", as the comparison says.
std::string breaks(const BudgetSpec &b) {
  return b.atMost ? " exceeds the budget of " : " is below the budget of ";
}

bool broken(const BudgetSpec &b, double actual) {
  return b.atMost ? actual > b.value : actual < b.value;
}

} // namespace

void checkBudgets(Analysis &a, DiagnosticEngine &diags, const Relower &relower) {
  if (!a.wanted(Result::Budgets))
    return;
  const Plan &plan = *a.plan;
  if (!a.checkpoint.error.empty()) {
    auto where = plan.settingRanges.find("checkpoint");
    llvm::SMRange range = where != plan.settingRanges.end() ? where->second : llvm::SMRange();
    diags.report(DiagKind::InvalidValue, range.Start, a.checkpoint.error).range(range);
  }
  AnalysisManager trials(a, relower); // every fix below shares its trials' work
  for (const BudgetSpec &b : plan.budgets) {
    switch (b.metric) {
    case BudgetMetric::MemoryPerDevice: {
      double peak = a.memory.peak;
      if (!broken(b, peak))
        break;
      report(diags, b,
             "peak memory per device " + formatBytes(peak) + breaks(b) +
                 trimZeros(formatBytes(b.value)),
             b.atMost ? memoryFixes(trials, b.value) : std::vector<std::string>{});
      break;
    }
    case BudgetMetric::StepTime: {
      double step = a.time.step;
      if (!broken(b, step))
        break;
      report(diags, b,
             "step time " + formatDuration(step) + breaks(b) + formatDuration(b.value),
             b.atMost ? timeFixes(trials, b.value, false) : std::vector<std::string>{});
      break;
    }
    case BudgetMetric::Mfu: {
      double mfu = a.time.mfu;
      if (!broken(b, mfu))
        break;
      report(diags, b, "MFU " + percent(mfu) + breaks(b) + percent(b.value),
             b.atMost ? std::vector<std::string>{} : mfuFixes(trials, b.value));
      break;
    }
    case BudgetMetric::RunTime: {
      if (plan.isTrain && plan.tokens <= 0) {
        report(diags, b,
               "run time cannot be checked against the budget of " + formatDuration(b.value) +
                   ": plan '" + plan.name + "' does not say its training tokens",
               {"add a setting such as `tokens = 2T`"});
        break;
      }
      double run = a.time.run;
      if (!broken(b, run))
        break;
      report(diags, b, "run time " + formatDuration(run) + breaks(b) + formatDuration(b.value),
             b.atMost ? timeFixes(trials, b.value, true) : std::vector<std::string>{});
      break;
    }
    }
  }
  // Device memory is always a limit: a peak above the target's memory is an error even with
  // no memory budget (a broken memory budget at or below it has already said so).
  double device = plan.target.memoryBytes;
  bool budgetSaid = false;
  for (const BudgetSpec &b : plan.budgets)
    budgetSaid = budgetSaid || (b.metric == BudgetMetric::MemoryPerDevice && b.atMost &&
                                b.value <= device && broken(b, a.memory.peak));
  if (device > 0 && a.memory.peak > device && !budgetSaid) {
    // At the plan's `target` setting, so that `check` with several plans says which one.
    auto where = plan.settingRanges.find("target");
    llvm::SMRange range = where != plan.settingRanges.end() ? where->second : llvm::SMRange();
    auto d = diags.report(DiagKind::DeviceMemory, range.Start,
                          "peak memory per device " + formatBytes(a.memory.peak) +
                              " exceeds the " + formatBytes(device) + " of one " +
                              plan.target.name);
    d.range(range);
    for (const std::string &n : memoryFixes(trials, device))
      d.note(llvm::SMLoc(), n);
  }
}

} // namespace tally
