// What-if solvers (see Solvers.h): closed forms for run time and the largest model that fits,
// and searches over candidate plans for the largest micro-batch and the fewest devices.
//
// Algorithm of the searches:
// 1. List the candidates: micro-batches dividing batch / data (largest first), or data-parallel
//    degrees dividing batch / micro_batch (smallest first).
// 2. For each, copy the plan and change the one setting; re-lower the model when the graph
//    depends on it (the micro-batch is a dimension of every activation), else reuse the graph.
// 3. Run the whole analysis on the candidate with diagnostics muted and budgets not checked,
//    and stop at the first candidate that meets the goal: scanning in order makes the answer
//    the largest (or fewest) that fits without assuming memory is monotone in the setting.
#include "passes/Solvers.h"
#include "passes/Stack.h"

#include "support/Diagnostics.h"
#include "support/Format.h"

#include "llvm/Support/SourceMgr.h"

#include <algorithm>
#include <numeric>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

namespace tally {

std::string derivationNumber(double v) {
  return isExactInteger(v, 1e6) ? integerText(v) : compactExponent(significant(v, 4));
}

namespace {


std::string dtypeWord(Dtype d) { return d == Dtype::Invalid ? "none" : nameOf(d).str(); }



std::vector<int64_t> powersOfTwo(int64_t n);

/// The positive divisors of n, ascending; past 2^40 (a trial division would take seconds)
/// the powers of two up to n instead.
std::vector<int64_t> divisors(int64_t n) {
  if (n > (int64_t(1) << 40))
    return powersOfTwo(n);
  std::vector<int64_t> low, high;
  for (int64_t d = 1; d * d <= n; ++d)
    if (n % d == 0) {
      low.push_back(d);
      if (d != n / d)
        high.push_back(n / d);
    }
  low.insert(low.end(), high.rbegin(), high.rend());
  return low;
}

/// Powers of two from 1 up to n, ascending.
std::vector<int64_t> powersOfTwo(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t p = 1; p <= n && p > 0; p *= 2)
    out.push_back(p);
  return out;
}

std::string fitsWord(double peak, double limit) {
  return peak <= limit ? "fits" : "does not fit";
}

/// "memory limit per device = 74.51 GiB (80e9 B, the H100_SXM's memory)".
std::string limitLine(const Plan &plan, double limit) {
  std::string line = "memory limit per device = " + formatBytes(limit) + " (" + derivationNumber(limit) + " B";
  if (limit == plan.target.memoryBytes)
    line += ", the " + plan.target.name + "'s memory";
  return line + ")";
}

} // namespace

// ---- closed forms ----------------------------------------------------------------------------

SolverAnswer solveRunTime(double params, double tokens, int64_t devices, const Target &target,
                          double mfu, Dtype dtype) {
  SolverAnswer r;
  r.question = "run-time";
  r.unit = "days";
  double peak = target.peakFor(dtype);
  r.inputs = {numberInput("params", params),   numberInput("tokens", tokens),
              numberInput("devices", static_cast<double>(devices)),
              wordInput("target", target.name), numberInput("mfu", mfu),
              wordInput("dtype", dtypeWord(dtype)), numberInput("peak_flops", peak)};
  if (!(params > 0) || !(tokens > 0))
    r.error = "params and tokens must be positive";
  else if (devices < 1)
    r.error = "devices must be at least 1";
  else if (!(mfu > 0) || mfu > 1)
    r.error = "mfu must be a fraction in (0, 1], such as 0.5 or 50%";
  else if (!(peak > 0))
    r.error = target.name + " has no " + dtypeWord(dtype) + " peak rate";
  if (!r.ok())
    return r;

  double flops = 6 * params * tokens;
  double throughput = static_cast<double>(devices) * peak * mfu;
  double seconds = flops / throughput;
  r.answer = seconds / 86400.0;
  r.derivation = {
      "FLOPs = 6 · N · D = 6 × " + derivationNumber(params) + " × " + derivationNumber(tokens) + " = " + derivationNumber(flops) +
          " (forward 2ND + backward 4ND)",
      "peak = " + target.name + " dense " + dtypeWord(dtype) + " = " +
          formatRate(peak, UnitDim::FlopRate) + " per device",
      "throughput = devices × peak × MFU = " + std::to_string(devices) + " × " + derivationNumber(peak) +
          " × " + derivationNumber(mfu) + " = " + derivationNumber(throughput) + " FLOP/s",
      "time = FLOPs / throughput = " + derivationNumber(flops) + " / " + derivationNumber(throughput) + " = " +
          derivationNumber(seconds) + " s",
      "days = " + derivationNumber(seconds) + " s / 86400 s = " + formatDuration(seconds)};
  return r;
}

StateBytes stateBytesPerParam(const PrecisionPolicy &p, unsigned optimizerStates) {
  StateBytes b;
  b.params = bytesOf(p.params);
  b.grads = bytesOf(p.grads);
  b.master = p.master == Dtype::Invalid ? 0 : bytesOf(p.master);
  b.optimizer = static_cast<double>(optimizerStates) * bytesOf(p.optimizer);
  return b;
}

SolverAnswer solveMaxParams(int64_t devices, const Target &target, const OptimizerSpec &opt,
                            const PrecisionPolicy &precision) {
  SolverAnswer r;
  r.question = "max-params";
  r.unit = "parameters";
  StateBytes b = stateBytesPerParam(precision, opt.states);
  // The lecture's arithmetic: the datasheet's figure (H100_SXM "80GB", 80e9 B). The driver
  // reports more (81,559 MiB); the last line gives the answer with that, which is what the
  // memory checks of a plan compare against.
  double mem = target.statedMemory();
  r.inputs = {numberInput("devices", static_cast<double>(devices)),
              wordInput("target", target.name),
              wordInput("optimizer", opt.name + (opt.name == "SGD" && opt.states ? " (momentum)" : "")),
              wordInput("precision", precision.preset),
              numberInput("memory_per_device", mem),
              numberInput("bytes_per_param", b.total())};
  if (devices < 1)
    r.error = "devices must be at least 1";
  else if (!(mem > 0))
    r.error = target.name + " states no memory size";
  if (!r.ok())
    return r;

  // The same question per device for each ZeRO stage: the unsharded classes take their full
  // bytes on every device, the sharded ones 1/devices of them. Stage 3 shards everything, so
  // it is the devices' total memory over the bytes per parameter: the headline answer.
  double n = static_cast<double>(devices);
  double perDevice[3] = {b.total(), b.params + b.grads + (b.master + b.optimizer) / n,
                         b.params + (b.grads + b.master + b.optimizer) / n};
  double total = n * mem;
  r.answer = std::floor(total / b.total());
  std::string optStates = std::to_string(opt.states) + " × " +
                          std::to_string(bytesOf(precision.optimizer)) + " (" +
                          std::to_string(opt.states) + " " + opt.name + " state" +
                          (opt.states == 1 ? "" : "s") + " in " + dtypeWord(precision.optimizer) +
                          ")";
  r.derivation.push_back("one device without sharding (ZeRO-0): " + derivationNumber(mem) + " B / " +
                         derivationNumber(perDevice[0]) + " B = " +
                         formatCount(std::floor(mem / perDevice[0])) + " parameters");
  r.derivation.push_back(
      "bytes per parameter = params " + derivationNumber(b.params) + " (" + dtypeWord(precision.params) +
      ") + grads " + derivationNumber(b.grads) + " (" + dtypeWord(precision.grads) + ") + master " +
      derivationNumber(b.master) + " (" + dtypeWord(precision.master) + ") + optimizer " + optStates + " = " +
      derivationNumber(b.total()) + " bytes");
  r.derivation.push_back("total memory = devices × memory = " + std::to_string(devices) + " × " +
                         derivationNumber(mem) + " B = " + derivationNumber(total) + " B");
  r.derivation.push_back("N = total memory / bytes per parameter = " + derivationNumber(total) + " / " +
                         derivationNumber(b.total()) + " = " + derivationNumber(r.answer) + " = " + formatCount(r.answer) +
                         " parameters (every state sharded over the " + std::to_string(devices) +
                         " devices: ZeRO-3)");
  for (int zero = 1; zero <= 2; ++zero)
    r.derivation.push_back("ZeRO-" + std::to_string(zero) + " over " + std::to_string(devices) +
                           " devices: " + derivationNumber(mem) + " B / " + derivationNumber(perDevice[zero]) +
                           " B per parameter per device = " +
                           formatCount(std::floor(mem / perDevice[zero])) + " parameters");
  if (target.memoryBytes != mem)
    r.derivation.push_back("the " + target.name + " reports " + formatBytes(target.memoryBytes) + " (" +
                           derivationNumber(target.memoryBytes) + " B, not the datasheet's " +
                           derivationNumber(mem) + "): " + formatCount(std::floor(n * target.memoryBytes / b.total())) +
                           " parameters with all of it; plans are checked against the reported memory");
  r.derivation.push_back("caveat: activations, workspace and fragmentation are not counted; a "
                         "trainable model must be smaller");
  return r;
}

// ---- searches over a plan ----------------------------------------------------------------

double accumulationSteps(const Plan &plan) {
  return static_cast<double>(plan.batch) /
         (static_cast<double>(plan.microBatch) * static_cast<double>(plan.parallel.data));
}

std::vector<int64_t> microBatchCandidates(const Plan &plan) {
  int64_t data = std::max<int64_t>(1, plan.parallel.data);
  if (plan.batch % data == 0)
    return divisors(plan.batch / data);
  return powersOfTwo(std::max<int64_t>(1, plan.batch / data));
}

std::optional<Candidate> largestMicroBatch(AnalysisManager &trials, double memoryLimit, int64_t atMost,
                                           std::vector<std::pair<int64_t, double>> *tried,
                                           bool bisect) {
  const Analysis &a = trials.base();
  std::vector<int64_t> cands;
  for (int64_t mb : microBatchCandidates(*a.plan))
    if (atMost <= 0 || mb <= atMost)
      cands.push_back(mb);
  // The candidate at `i`, when it lowers; whether it fits.
  auto tryAt = [&](size_t i, std::optional<Candidate> &fit) {
    Plan p = *a.plan;
    p.microBatch = cands[i];
    p.microBatchGiven = true;
    std::optional<Trial> t = trials.trial(p);
    if (!t)
      return false;
    if (tried)
      tried->push_back({cands[i], t->peak});
    if (t->peak > memoryLimit)
      return false;
    fit = Candidate{std::move(p), *t};
    return true;
  };
  std::optional<Candidate> fit;
  if (!bisect || cands.size() < 3) {
    for (size_t i = cands.size(); i-- > 0;)
      if (tryAt(i, fit))
        return fit;
    return std::nullopt;
  }
  // cands[lo] fits, cands[hi] does not.
  if (!tryAt(0, fit))
    return std::nullopt;
  size_t lo = 0, hi = cands.size() - 1;
  std::optional<Candidate> top;
  if (tryAt(hi, top))
    return top;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    std::optional<Candidate> m;
    if (tryAt(mid, m))
      lo = mid, fit = std::move(m);
    else
      hi = mid;
  }
  return fit;
}

std::optional<Candidate> fewestDevices(AnalysisManager &trials, int zero,
                                       const std::function<bool(const Trial &)> &goal,
                                       std::vector<Candidate> *tried, bool bisect,
                                       double memoryLimit) {
  const Plan &base = *trials.base().plan;
  int64_t modelParallel =
      base.parallel.tensor * base.parallel.pipeline * std::max<int64_t>(1, base.parallel.context);
  bool keepMicro = base.microBatchGiven;
  int64_t span = keepMicro ? base.batch / std::max<int64_t>(1, base.microBatch) : base.batch;
  std::vector<int64_t> cands;
  if (span < 1)
    return std::nullopt;
  if (!keepMicro || base.batch % base.microBatch == 0)
    cands = divisors(span);
  else
    cands = powersOfTwo(span);
  auto tryData = [&](int64_t data) -> std::optional<Candidate> {
    Plan p = base;
    p.parallel.data = data;
    p.parallel.devices = data * modelParallel;
    p.target.shareHost(p.parallel.devices);
    p.parallel.zero = zero;
    if (!keepMicro)
      p.microBatch = base.batch / data;
    if (modelStatesFloor(trials.base(), p) > memoryLimit)
      return std::nullopt;
    std::optional<Trial> t = trials.trial(p);
    if (t && tried)
      tried->push_back({p, *t});
    if (t && goal(*t))
      return Candidate{std::move(p), *t};
    return std::nullopt;
  };
  if (!bisect) {
    for (int64_t data : cands)
      if (std::optional<Candidate> c = tryData(data))
        return c;
    return std::nullopt;
  }
  // cands[hi] meets the goal; every candidate below lo does not.
  size_t lo = 0, hi = cands.size() - 1;
  std::optional<Candidate> met = tryData(cands[hi]);
  if (!met)
    return std::nullopt;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (std::optional<Candidate> c = tryData(cands[mid]))
      met = std::move(c), hi = mid;
    else
      lo = mid + 1;
  }
  return met;
}

SolverAnswer solveMicroBatch(const Analysis &a, const Relower &relower, double memoryLimit) {
  const Plan &plan = *a.plan;
  SolverAnswer r;
  r.question = "micro-batch";
  r.unit = "sequences";
  r.inputs = {wordInput("plan", plan.name),
              numberInput("batch", static_cast<double>(plan.batch)),
              numberInput("data_parallel", static_cast<double>(plan.parallel.data)),
              numberInput("seq", static_cast<double>(plan.seq)),
              wordInput("target", plan.target.name),
              wordInput("checkpoint", plan.checkpoint),
              numberInput("memory_limit", memoryLimit)};
  if (!plan.isTrain) {
    r.error = "plan '" + plan.name + "' is an infer plan; micro-batches are for training";
    return r;
  }
  std::vector<int64_t> cands = microBatchCandidates(plan);
  int64_t data = plan.parallel.data;
  r.derivation.push_back(
      "per-device batch = batch / data = " + std::to_string(plan.batch) + " / " +
      std::to_string(data) + (plan.batch % data == 0
                                  ? " = " + std::to_string(plan.batch / data) +
                                        "; candidates: its divisors, largest first"
                                  : " is not whole; candidates: powers of two, largest first"));
  r.derivation.push_back(limitLine(plan, memoryLimit));
  std::vector<std::pair<int64_t, double>> tried;
  AnalysisManager trials(a, relower);
  std::optional<Candidate> best = largestMicroBatch(trials, memoryLimit, 0, &tried);
  for (const auto &[mb, peak] : tried)
    r.derivation.push_back("micro_batch = " + std::to_string(mb) + ": peak " + formatBytes(peak) +
                           " per device, " + fitsWord(peak, memoryLimit));
  if (!best) {
    if (tried.empty())
      r.error = "could not lower plan '" + plan.name + "' with another micro-batch";
    else
      r.error = "even micro_batch = " + std::to_string(tried.back().first) + " needs " +
                formatBytes(tried.back().second) + " per device, more than " +
                formatBytes(memoryLimit) +
                "; try checkpointing, a higher ZeRO stage or more devices";
    return r;
  }
  r.answer = static_cast<double>(best->plan.microBatch);
  double acc = accumulationSteps(best->plan);
  r.derivation.push_back(
      "accumulation steps = batch / (micro_batch × data) = " + std::to_string(plan.batch) +
      " / (" + std::to_string(best->plan.microBatch) + " × " + std::to_string(data) + ") = " +
      derivationNumber(acc) + (acc == std::floor(acc) ? "" : " (not whole: some micro-steps are partial)"));
  return r;
}

SolverAnswer solveDevices(const Analysis &a, const Relower &relower, double memoryLimit) {
  const Plan &plan = *a.plan;
  SolverAnswer r;
  r.question = "devices";
  r.unit = "devices";
  const Parallelism &par = plan.parallel;
  r.inputs = {wordInput("plan", plan.name),
              numberInput("batch", static_cast<double>(plan.batch)),
              numberInput("micro_batch", static_cast<double>(plan.microBatch)),
              numberInput("tensor_parallel", static_cast<double>(par.tensor)),
              numberInput("pipeline_parallel", static_cast<double>(par.pipeline)),
              numberInput("zero", par.zero),
              wordInput("target", plan.target.name),
              numberInput("memory_limit", memoryLimit)};
  auto fits = [&](const Trial &t) { return t.peak <= memoryLimit; };
  std::vector<Candidate> tried;
  AnalysisManager trials(a, relower);
  std::optional<Candidate> found = fewestDevices(trials, par.zero, fits, &tried);
  std::optional<Candidate> zero3 = par.zero >= 3 ? found : fewestDevices(trials, 3, fits);

  r.derivation.push_back("kept: tensor × pipeline = " + std::to_string(par.tensor) + " × " +
                         std::to_string(par.pipeline) + ", zero = " + std::to_string(par.zero) +
                         (plan.microBatchGiven
                              ? ", micro_batch = " + std::to_string(plan.microBatch)
                              : "; micro_batch = batch / data for each data degree"));
  r.derivation.push_back(limitLine(plan, memoryLimit));
  r.derivation.push_back("now: " + std::to_string(par.devices) +
                         (par.devices == 1 ? " device" : " devices") + " (data = " +
                         std::to_string(par.data) + "), peak " + formatBytes(a.memory.peak) +
                         " per device, " + fitsWord(a.memory.peak, memoryLimit));
  auto show = [&](const Candidate &c) {
    return std::to_string(c.plan.parallel.devices) +
           (c.plan.parallel.devices == 1 ? " device" : " devices") + " (data = " +
           std::to_string(c.plan.parallel.data) + ", zero = " +
           std::to_string(c.plan.parallel.zero) + "): peak " + formatBytes(c.trial.peak) +
           " per device";
  };
  for (const Candidate &c : tried)
    r.derivation.push_back(show(c) + ", " + fitsWord(c.trial.peak, memoryLimit));
  if (zero3 && par.zero < 3)
    r.derivation.push_back("with zero = 3: " + show(*zero3));
  else if (par.zero < 3)
    r.derivation.push_back("with zero = 3: no data degree fits either");
  if (!found) {
    r.error = "no data-parallel degree fits " + formatBytes(memoryLimit) + " per device with zero = " +
              std::to_string(par.zero) +
              (zero3 && par.zero < 3
                   ? "; with zero = 3, " + std::to_string(zero3->plan.parallel.devices) +
                         " devices fit (try --zero 3)"
                   : "; try checkpointing, a smaller micro-batch or tensor parallelism");
    return r;
  }
  r.answer = static_cast<double>(found->plan.parallel.devices);
  r.derivation.push_back("fewest: " + show(*found) + ", accumulation steps " +
                         derivationNumber(accumulationSteps(found->plan)));
  return r;
}

// ---- the layout search -----------------------------------------------------------------

namespace {

/// The most query heads and key/value heads of any attention op (0 when there is none).
void attentionHeads(const Graph &g, int64_t &heads, int64_t &kvHeads) {
  for (const Op &op : g.ops) {
    if (opClass(op.kind) != OpClass::Attention)
      continue;
    heads = std::max(heads, op.attrs->heads);
    kvHeads = std::max(kvHeads, op.attrs->kvHeads > 0 ? op.attrs->kvHeads : op.attrs->heads);
  }
}

/// The greatest common divisor of the moe ops' expert counts (their weights' first dimension,
/// inputs 3-5): the expert degrees that divide every one; 0 without a moe op.
int64_t moeExperts(const Graph &g) {
  int64_t experts = 0;
  for (const Op &op : g.ops)
    if (op.kind == OpKind::Moe && op.inputs.size() > 3 && !g.tensors[op.inputs[3]].shape.empty())
      experts = std::gcd(experts, g.tensors[op.inputs[3]].shape[0].size);
  return experts;
}

/// Does `t` meet the plan's step-time, MFU and run-time budgets? (Memory is the limit.)
bool meetsBudgets(const Plan &plan, const Trial &t) {
  for (const BudgetSpec &b : plan.budgets) {
    double v = b.metric == BudgetMetric::StepTime ? t.stepTime
               : b.metric == BudgetMetric::Mfu    ? t.mfu
               : b.metric == BudgetMetric::RunTime ? t.runTime
                                                   : -1;
    if (v < 0 || (b.metric == BudgetMetric::RunTime && plan.tokens <= 0))
      continue;
    if (b.atMost ? v > b.value : v < b.value)
      return false;
  }
  return true;
}

/// Orders layouts: the least step time; ties (the time model is flat in some settings) go to
/// fewer model-parallel ranks, a larger micro-batch, a lower ZeRO stage, less recompute.
bool betterLayout(const ParallelLayout &x, const ParallelLayout &y) {
  auto rank = [](const std::string &c) {
    return c == "none" ? 0 : c == "selective" ? 1 : c == "selective_wide" ? 2 : 3;
  };
  if (x.trial.stepTime != y.trial.stepTime)
    return x.trial.stepTime < y.trial.stepTime;
  int64_t mx = x.tensor * x.pipeline, my = y.tensor * y.pipeline;
  if (mx != my)
    return mx < my;
  if (x.tensor != y.tensor)
    return x.tensor < y.tensor;
  if (x.interleave != y.interleave)
    return x.interleave < y.interleave;
  if (x.microBatch != y.microBatch)
    return x.microBatch > y.microBatch;
  if (x.zero != y.zero)
    return x.zero < y.zero;
  if (rank(x.checkpoint) != rank(y.checkpoint))
    return rank(x.checkpoint) < rank(y.checkpoint);
  return x.expert < y.expert; // a smaller expert group: fewer ranks in each all-to-all
}

/// Does the plan have a budget on its time (step time, MFU, run time)? A candidate's fit then
/// needs its time.
bool timeBudgets(const Plan &plan) {
  return std::any_of(plan.budgets.begin(), plan.budgets.end(),
                     [](const BudgetSpec &b) { return b.metric != BudgetMetric::MemoryPerDevice; });
}

/// The per-micro-batch forward, backward and recompute op times over all stages (stepTime's
/// F + B + R) of the candidates that share what an op's time reads of a candidate
/// (passes/StepTime.cpp, opTimes) besides the target and precision, which a search keeps: the
/// graph, the tensor degree (each op's split), the head's padding and the stack (its attention
/// kernel and fusion), which the layout decides, and the checkpoint policy, which with the
/// graph decides the ops re-run (the walk's schedule; the pipeline does not change it). Taken
/// from the first of them that is timed; the bound reads them for the others
/// (tests/unit/test_solvers.cpp checks that searches with and without it answer alike).
struct OpTimeSums {
  const Analysis *part;
  int64_t tensor;
  int64_t padded;
  std::string policy;
  std::string stack, attention; ///< the stack the layout picks, and its attention kernel
  bool native, fused;           ///< runsNativeAttention, fusedGates
  double W;
};

} // namespace

double computeBound(double W, double m, double p, double v) {
  return W / p * (m + (p - 1) / v);
}

namespace {

/// The state of one layout search (searchLayouts): the candidates that fit, the best times so
/// far and the op-time sums of each kind of candidate timed.
struct LayoutSearcher {
  const Plan &base;
  AnalysisManager &analyses;
  LayoutSearch &out;
  double memoryLimit;
  size_t keep;
  bool bound;
  std::vector<ParallelLayout> fits;
  // The `keep` best step times so far (a max-heap) and the op-time sums of each kind of
  // candidate timed: a fitting candidate whose computeBound exceeds the heap's top cannot be
  // among the `keep` best and is not timed (a plan with time budgets, or an infer plan, times
  // every one).
  std::vector<double> bestTimes;
  std::vector<OpTimeSums> sums;

  /// Whether `cand` (its layout and micro-batch set) fits under one of the checkpoint
  /// policies, the first that does taken (recomputing more only adds time): Megatron's
  /// selective (the attention core) first, then tally's wider form (norms and GELU/SiLU too),
  /// then whole blocks.
  bool tryPolicies(Plan &cand) {
    const Parallelism &par = cand.parallel;
    const int64_t t = par.tensor, p = par.pipeline, v = par.interleave, d = par.data, m = cand.microBatch;
    for (const char *policy : {"none", "selective", "selective_wide", "full"}) {
      cand.checkpoint = policy;
      // Memory first: the time of only a candidate that fits is priced.
      Analysis r = *analyses.layout(cand, /*timed=*/false);
      ++out.analysed;
      if (r.memory.peak > memoryLimit)
        continue; // more recompute may fit
      const Analysis *part = analyses.graphPart(cand);
      const int64_t padded = r.headPad.applies() ? r.headPad.padded : 0;
      // The stack is chosen from the layout (passes/Stack.h): its attention kernel and
      // fusion change op times.
      OpTimeSums key{part, t, padded, cand.checkpoint, stackName(cand), attentionKernel(cand),
                     runsNativeAttention(cand), fusedGates(cand), 0};
      auto known = std::find_if(sums.begin(), sums.end(), [&](const OpTimeSums &x) {
        return x.part == key.part && x.tensor == key.tensor && x.padded == key.padded &&
               x.policy == key.policy && x.stack == key.stack && x.attention == key.attention &&
               x.native == key.native && x.fused == key.fused;
      });
      if (bound && known != sums.end() && keep > 0 && bestTimes.size() >= keep) {
        double steps = static_cast<double>(base.batch) / static_cast<double>(m * d);
        // A relative margin for the order the stages' sums are added in.
        double floor = computeBound(known->W, steps, static_cast<double>(p),
                                    static_cast<double>(v)) * (1 - 1e-9);
        if (floor > bestTimes.front()) {
          ++out.fitted; // no time budget: memory is the fit
          ++out.unpriced;
          return true;
        }
      }
      analyses.priceTime(r);
      if (known == sums.end()) {
        key.W = r.time.microBatchCompute;
        sums.push_back(std::move(key));
      }
      Trial tr = trialOf(r);
      if (meetsBudgets(base, tr)) {
        ++out.fitted;
        fits.push_back({t, p, v, d, m, par.zero, r.checkpoint.policy, tr, par.expert});
        bestTimes.push_back(tr.stepTime);
        std::push_heap(bestTimes.begin(), bestTimes.end());
        if (bestTimes.size() > keep) {
          std::pop_heap(bestTimes.begin(), bestTimes.end());
          bestTimes.pop_back();
        }
      }
      return true;
    }
    return false;
  }

  /// The interleaves `vs` of layout `cand` (tensor, pipeline, data, ZeRO set), each over its
  /// micro-batches smallest first up to the first that fits under no policy. The interleaves
  /// go innermost: one micro-batch's candidates then differ only in what the walks' layout
  /// facts do not read (AnalysisManager::keepLayoutFacts), so they share them.
  void searchInterleaves(Plan &cand, const Analysis &a, const std::vector<int64_t> &vs) {
    std::vector<int64_t> open; // the interleaves whose smaller micro-batches all fitted
    for (int64_t v : vs) {
      cand.parallel.interleave = v;
      // The model states and framework memory with the allocator's reserve: when they
      // alone exceed the limit, nothing fits.
      if (modelStatesFloor(a, cand) > memoryLimit)
        ++out.prunedStatic;
      else
        open.push_back(v);
    }
    for (int64_t m : divisors(base.batch / cand.parallel.data)) {
      if (open.empty())
        break;
      cand.microBatch = m;
      cand.microBatchGiven = true;
      if (!analyses.graphPart(cand))
        continue;
      std::vector<int64_t> fitted;
      for (int64_t v : open) {
        cand.parallel.interleave = v;
        if (tryPolicies(cand))
          fitted.push_back(v); // else a larger micro-batch needs more memory still
      }
      open = std::move(fitted);
    }
  }
};

} // namespace

LayoutSearch searchLayouts(const Analysis &a, const Relower &relower, int64_t devices,
                           double memoryLimit, size_t keep, bool bound) {
  const Plan &base = *a.plan;
  LayoutSearch out;
  attentionHeads(*a.graph, out.heads, out.kvHeads);
  out.layers = a.checkpoint.blocks;
  out.experts = moeExperts(*a.graph);
  int64_t context = std::max<int64_t>(1, base.parallel.context);
  int64_t perNode = std::max<int64_t>(1, base.target.gpusPerNode);
  if (devices < 1 || devices % context != 0) {
    out.error = std::to_string(devices) + " devices do not split into context groups of " +
                std::to_string(context);
    return out;
  }
  // Graphs by micro-batch, lowered once each, with the passes that depend on the graph alone
  // (parameters, op costs, the backward) run once each: a layout changes neither. Every
  // micro-batch is tried under each layout, so all its graphs stay cached; the walks' layout
  // facts of the last few (tensor degree, micro-batch, stack) are kept.
  AnalysisManager analyses(a, relower, /*keepGraphs=*/SIZE_MAX);
  analyses.keepLayoutFacts(4);
  // A plan with time budgets, or an infer plan, times every fitting candidate.
  LayoutSearcher search{base, analyses, out, memoryLimit, keep,
                        bound && base.isTrain && !timeBudgets(base), {}, {}, {}};
  int64_t perContext = devices / context;
  for (int64_t t : divisors(perContext)) {
    if (t > perNode || (out.heads > 0 && (out.heads % t || out.kvHeads % t)))
      continue;
    for (int64_t p : divisors(perContext / t)) {
      if (p > 1 && (out.layers < p || out.layers % p))
        continue;
      int64_t d = perContext / t / p;
      if (base.batch % d)
        continue;
      // The shapes whose expert layout Megatron-Core runs (ir/Plan.h, expertFit): for a
      // mixture of experts each expert degree dividing the experts, the plan's folding kept
      // (the expert tensor degree, written as the tensor degree, follows it); else the plan's.
      for (int64_t e : out.experts > 0 ? divisors(out.experts) : std::vector<int64_t>{base.parallel.expert}) {
        Plan shape = base;
        Parallelism &sp = shape.parallel;
        sp.tensor = t, sp.pipeline = p, sp.data = d, sp.devices = devices, sp.expert = e;
        if (sp.expertTensor == std::max<int64_t>(1, base.parallel.tensor))
          sp.expertTensor = 0; // written as the tensor degree (1 under tensor 1 folds nothing)
        std::vector<int64_t> interleaves;
        for (int64_t v : p > 1 ? divisors(out.layers / p) : std::vector<int64_t>{1}) {
          sp.interleave = v;
          if (expertFit(sp) == ExpertFit::Ok)
            interleaves.push_back(v);
        }
        out.shapes += static_cast<int64_t>(interleaves.size());
        for (int zero = 0; zero <= (d > 1 ? 3 : 0) && !interleaves.empty(); ++zero) {
          Plan cand = shape;
          cand.parallel.zero = zero;
          search.searchInterleaves(cand, a, interleaves);
        }
      }
    }
  }
  out.lowered = analyses.graphsLowered();
  if (out.shapes == 0) {
    out.error = std::to_string(devices) + " devices do not factor into tensor × pipeline × data" +
                (context > 1 ? " × context " + std::to_string(context) : std::string()) +
                " with tensor dividing the " + std::to_string(out.heads) +
                " heads and at most " + std::to_string(perNode) +
                " (gpus_per_node), pipeline dividing the " + std::to_string(out.layers) +
                " layers and data dividing the batch of " + std::to_string(base.batch) +
                (out.experts > 0 ? ", and an expert degree dividing the " + std::to_string(out.experts) +
                                       " experts whose group the plan could state (ir/Plan.h expertFit)"
                                 : std::string());
    return out;
  }
  std::vector<ParallelLayout> &fits = search.fits;
  std::sort(fits.begin(), fits.end(), betterLayout);
  if (fits.size() > keep)
    fits.resize(keep);
  out.best = std::move(fits);
  if (out.best.empty())
    out.error = "no layout of " + std::to_string(devices) + " × " + base.target.name +
                " fits " + formatBytes(memoryLimit) + " per device" +
                (timeBudgets(base) ? std::string(" and meets the plan's budgets") : std::string()) +
                " (" + std::to_string(out.shapes) + " shapes searched, " +
                std::to_string(out.prunedStatic) + " pruned on model states alone, " +
                std::to_string(out.analysed) + " analysed)";
  return out;
}

SolverAnswer solveLayout(const Analysis &a, const Relower &relower, int64_t devices,
                         double memoryLimit) {
  const Plan &plan = *a.plan;
  SolverAnswer r;
  r.question = "layout";
  r.unit = "s";
  r.inputs = {numberInput("devices", static_cast<double>(devices)),
              wordInput("target", plan.target.name), numberInput("params", a.params.total),
              numberInput("batch", static_cast<double>(plan.batch)),
              numberInput("seq", static_cast<double>(plan.seq)),
              numberInput("memory_limit", memoryLimit)};
  LayoutSearch s = searchLayouts(a, relower, devices, memoryLimit);
  r.inputs.push_back(numberInput("heads", static_cast<double>(s.heads)));
  r.inputs.push_back(numberInput("layers", static_cast<double>(s.layers)));
  r.inputs.push_back(numberInput("gpus_per_node", static_cast<double>(plan.target.gpusPerNode)));
  r.derivation.push_back(
      "constraints: tensor divides " + std::to_string(s.heads) + " heads and ≤ " +
      std::to_string(plan.target.gpusPerNode) + " (gpus_per_node); pipeline divides " +
      std::to_string(s.layers) + " layers; interleave divides layers / pipeline; tensor × "
      "pipeline × data = " + std::to_string(devices) + "; micro_batch × accumulation × data = "
      "batch " + std::to_string(plan.batch) +
      (s.experts > 0 ? "; expert divides the " + std::to_string(s.experts) +
                           " experts and " + (expertLayout(plan.parallel).folded ? "tensor × context × data"
                                                                                 : "data")
                     : std::string()));
  r.derivation.push_back(limitLine(plan, memoryLimit));
  r.derivation.push_back("searched " + std::to_string(s.shapes) +
                         (s.experts > 0 ? " (tensor, pipeline, interleave, data, expert)"
                                        : " (tensor, pipeline, interleave, data)") +
                         " shapes × ZeRO 0-3: " +
                         std::to_string(s.prunedStatic) +
                         " pruned on model states alone, " + std::to_string(s.analysed) +
                         " analysed (" + std::to_string(s.lowered) + " graphs lowered), " +
                         std::to_string(s.fitted) + " fit");
  if (!s.error.empty()) {
    r.error = s.error;
    return r;
  }
  r.answer = s.best.front().trial.stepTime;
  for (const ParallelLayout &l : s.best) {
    double accumulation = static_cast<double>(plan.batch) /
                          static_cast<double>(l.microBatch * l.data);
    r.rows.push_back({numberInput("tensor", static_cast<double>(l.tensor)),
                      numberInput("pipeline", static_cast<double>(l.pipeline)),
                      numberInput("interleave", static_cast<double>(l.interleave)),
                      numberInput("data", static_cast<double>(l.data)),
                      numberInput("micro_batch", static_cast<double>(l.microBatch)),
                      numberInput("accumulation_steps", accumulation),
                      numberInput("zero", l.zero), wordInput("checkpoint", l.checkpoint),
                      numberInput("step_s", l.trial.stepTime), numberInput("mfu", l.trial.mfu),
                      numberInput("memory_per_device", l.trial.peak)});
    if (s.experts > 0)
      r.rows.back().push_back(numberInput("expert", static_cast<double>(l.expert)));
  }
  return r;
}

} // namespace tally
