// `tally solve QUESTION [FLAGS]`: what-if questions answered by the solvers (passes/Solvers.h).
//
//   run-time    --params --tokens --devices --target --mfu [--dtype]     days for 6·N·D FLOPs
//   max-params  --devices --target --optimizer --precision               largest N whose states fit
//   micro-batch FILE [--plan] [--memory] [--zero] [--target] [--precision]  largest micro-batch
//   devices     FILE [--plan] [--memory] [--zero] [--target] [--precision]  fewest devices
//   layout      --params N | FILE [--plan] --devices N [--target] [--memory] [--precision]
//               the 10 fastest (tensor, pipeline, interleave, data, micro-batch, ZeRO,
//               checkpoint) layouts that fit
//   serve       --model FILE | FILE [--plan] --context N [--latency-budget T] [--target]
//               [--precision]   the largest concurrency that fits within the latency budget
//
// Prints the answer and its derivation, or with --format json one object
// {"question", "answer", "unit", "inputs", "derivation"}. Exit codes: 0 an answer, 1 an input
// error (the file, or no answer exists), 2 bad usage (unknown question, missing or bad flag).
#include "driver/Compiler.h"
#include "support/Suggest.h"
#include "frontend/Sema.h"
#include "ir/Target.h"
#include "ir/Units.h"
#include "passes/Passes.h"
#include "passes/Solvers.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cmath>
#include <cstdio>

using namespace llvm;

namespace tally {
namespace solveopts {

cl::SubCommand Solve("solve",
                     "What-if questions: run-time, max-params, micro-batch FILE, devices FILE, "
                     "layout, serve");
cl::OptionCategory Cat("tally solve options");

cl::opt<std::string> Question(cl::Positional, cl::Required,
                              cl::desc("<run-time|max-params|micro-batch|devices|layout|serve>"),
                              cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> File(cl::Positional, cl::desc("[file]"),
                          cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> PlanName("plan", cl::desc("The train plan to solve for (default: the first)"),
                              cl::value_desc("name"), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> Params("params", cl::desc("Parameter count, e.g. 70B or 7e10"),
                            cl::value_desc("count"), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> Tokens("tokens", cl::desc("Training tokens, e.g. 15T"), cl::value_desc("count"),
                            cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> Devices("devices", cl::desc("Number of devices"), cl::value_desc("n"),
                             cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> TargetName("target",
                                cl::desc("Device from the catalogue, e.g. H100_SXM (for a FILE: "
                                         "overrides the plan's target, e.g. '8 x H100_SXM')"),
                                cl::value_desc("target"), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> Mfu("mfu", cl::desc("Model FLOPs utilization, e.g. 0.5 or 50%"),
                         cl::value_desc("fraction"), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> Optimizer("optimizer",
                               cl::desc("SGD, SGDM (with momentum), AdaGrad, RMSprop, Adam, AdamW, "
                                        "Lion (any case)"),
                               cl::value_desc("name"), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> Precision("precision",
                               cl::desc("Precision preset: fp32, tf32, bf16, fp16, mixed_bf16, "
                                        "mixed_fp16 (for a FILE: overrides the plan's)"),
                               cl::value_desc("preset"), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> DtypeName("dtype", cl::desc("Compute dtype whose peak run-time uses (default bf16)"),
                               cl::value_desc("dtype"), cl::init("bf16"), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> Memory("memory",
                            cl::desc("Memory limit per device, e.g. 80GiB (default: the plan's "
                                     "memory budget, else the device's memory)"),
                            cl::value_desc("bytes"), cl::sub(Solve), cl::cat(Cat));
cl::opt<int> Zero("zero", cl::desc("ZeRO stage 0-3 to solve with (default: the plan's)"),
                  cl::value_desc("stage"), cl::init(-1), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> ModelFile("model", cl::desc("serve: the file with the infer plan (as FILE)"),
                               cl::value_desc("file"), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> Context("context",
                             cl::desc("serve: the context each sequence may reach (max_context)"),
                             cl::value_desc("tokens"), cl::sub(Solve), cl::cat(Cat));
cl::opt<std::string> LatencyBudget("latency-budget",
                                   cl::desc("serve: the longest inter-token latency, e.g. 50ms"),
                                   cl::value_desc("time"), cl::sub(Solve), cl::cat(Cat));
enum class Format { Text, Json };
cl::opt<Format> OutFormat("format", cl::desc("Output format"),
                          cl::values(clEnumValN(Format::Text, "text", "the answer and its derivation"),
                                     clEnumValN(Format::Json, "json", "one JSON object")),
                          cl::init(Format::Text), cl::sub(Solve), cl::cat(Cat));

} // namespace solveopts

namespace solvecmd {

using namespace solveopts;

namespace {

int usage(const std::string &msg) {
  errs() << "tally solve: error: " << msg << "\n";
  return 2;
}

int inputError(const std::string &msg) {
  errs() << "tally solve: error: " << msg << "\n";
  return 1;
}

/// Refuses flags the question does not use, so a typo in the question is not silently
/// answered with half the flags ignored.
bool onlyFlags(const std::vector<cl::Option *> &allowed, std::string &bad) {
  cl::Option *all[] = {&File, &PlanName, &Params, &Tokens, &Devices, &TargetName, &Mfu,
                       &Optimizer, &Precision, &DtypeName, &Memory, &Zero,
                       &ModelFile, &Context, &LatencyBudget};
  for (cl::Option *o : all) {
    if (o->getNumOccurrences() == 0 || std::find(allowed.begin(), allowed.end(), o) != allowed.end())
      continue;
    bad = o == &File ? "a file" : "--" + o->ArgStr.str();
    return false;
  }
  return true;
}

/// A required flag's value, parsed as a quantity of dimension `want`; prints the usage error.
std::optional<double> quantity(const cl::opt<std::string> &flag, UnitDim want) {
  if (flag.getNumOccurrences() == 0) {
    usage("missing --" + flag.ArgStr.str());
    return std::nullopt;
  }
  std::string err;
  auto v = parseQuantity(flag, want, err);
  if (!v)
    usage("--" + flag.ArgStr.str() + ": " + err +
          (want == UnitDim::Ratio ? " (write a fraction such as 0.5 or 50%)" : ""));
  return v;
}

std::optional<int64_t> deviceCount() {
  auto v = quantity(Devices, UnitDim::None);
  if (!v)
    return std::nullopt;
  if (*v != std::floor(*v) || *v < 1 || *v > 1e9) {
    usage("--devices must be a whole number of devices, not " + Devices);
    return std::nullopt;
  }
  return static_cast<int64_t>(*v);
}

const Target *catalogueTarget() {
  if (TargetName.getNumOccurrences() == 0) {
    usage("missing --target (`tally targets` lists them)");
    return nullptr;
  }
  if (const Target *t = findTarget(TargetName))
    return t;
  std::vector<std::string> names;
  for (const Target &t : targetCatalogue())
    names.push_back(t.name);
  std::string close = closestName(TargetName, names);
  usage("unknown target '" + TargetName + "'" +
        didYouMean(close) +
        " (`tally targets` lists them)");
  return nullptr;
}

std::optional<PrecisionPolicy> precisionFlag() {
  if (Precision.getNumOccurrences() == 0) {
    usage("missing --precision (fp32, bf16, mixed_bf16, ...)");
    return std::nullopt;
  }
  if (auto p = precisionPreset(Precision))
    return p;
  std::string close = closestName(Precision, precisionPresetNames());
  usage("unknown precision '" + Precision + "'" +
        didYouMean(close));
  return std::nullopt;
}

std::optional<OptimizerSpec> optimizerFlag() {
  if (Optimizer.getNumOccurrences() == 0) {
    usage("missing --optimizer (SGD, AdaGrad, Adam, AdamW, ...)");
    return std::nullopt;
  }
  if (auto o = optimizerPreset(Optimizer))
    return o;
  // Compare in lower case (the names are case-insensitive), then answer in the usual case.
  std::vector<std::string> lower;
  for (const std::string &n : optimizerNames())
    lower.push_back(StringRef(n).lower());
  std::string close = closestName(StringRef(Optimizer).lower(), lower);
  for (const std::string &n : optimizerNames())
    if (StringRef(n).equals_insensitive(close))
      close = n;
  usage("unknown optimizer '" + Optimizer + "'" +
        didYouMean(close));
  return std::nullopt;
}

// ---- output ----------------------------------------------------------------------------------

/// The headline: the answer in the unit's own words.
std::string headline(const SolverAnswer &r) {
  if (r.unit == "days")
    return formatDuration(r.answer * 86400.0);
  if (r.unit == "parameters") {
    std::string out = formatCount(r.answer) + " parameters";
    for (const SolverInput &in : r.inputs)
      if (in.name == "bytes_per_param")
        out += " at " + formatCount(in.number) + " bytes each";
    return out;
  }
  return formatCount(r.answer) + " " + r.unit;
}

void printText(const SolverAnswer &r, raw_ostream &os) {
  if (r.question == "layout") {
    // The table of layouts, best first, then the search's derivation.
    os << "layout: " << r.rows.size() << " fastest layouts that fit, best first\n";
    // A mixture of experts' rows end with the expert degree (passes/Solvers.cpp, solveLayout).
    const bool experts = !r.rows.empty() && r.rows.front().size() > 11;
    char line[256];
    std::snprintf(line, sizeof line, "  %4s %6s %8s %10s %5s %5s %5s %4s %-14s %10s %6s %11s%s\n",
                  "rank", "tensor", "pipeline", "interleave", "data", "micro", "accum", "zero",
                  "checkpoint", "step time", "MFU", "memory", experts ? "  expert" : "");
    os << line;
    for (size_t i = 0; i < r.rows.size(); ++i) {
      const auto &row = r.rows[i];
      auto n = [&](size_t k) { return static_cast<long long>(row[k].number); };
      std::snprintf(line, sizeof line,
                    "  %4zu %6lld %8lld %10lld %5lld %5lld %5lld %4lld %-14s %10s %5.1f%% %11s\n",
                    i + 1, n(0), n(1), n(2), n(3), n(4), n(5), n(6), row[7].text.c_str(),
                    formatDuration(row[8].number).c_str(), row[9].number * 100,
                    formatBytes(row[10].number).c_str());
      os << llvm::StringRef(line).rtrim("\n");
      if (experts)
        os << llvm::format("  %6lld", n(11));
      os << "\n";
    }
  } else if (r.question == "serve") {
    // The answer, then the candidates tried, by concurrency, then the derivation.
    os << "serve: " << headline(r);
    for (const SolverInput &in : r.inputs)
      if (in.name == "context")
        os << " at " << formatCount(in.number) << " tokens";
    os << "\n";
    char line[256];
    std::snprintf(line, sizeof line, "  %10s %12s %12s %11s %13s %10s %14s %6s\n", "concurrent",
                  "KV needed", "KV memory", "fits", "inter-token", "first token",
                  "tokens/s/GPU", "budget");
    os << line;
    for (const auto &row : r.rows) {
      std::snprintf(line, sizeof line, "  %10lld %12s %12s %11s %13s %10s %14.1f %6s\n",
                    static_cast<long long>(row[0].number), formatBytes(row[1].number).c_str(),
                    formatBytes(row[2].number).c_str(), row[3].text.c_str(),
                    formatDuration(row[4].number).c_str(), formatDuration(row[5].number).c_str(),
                    row[6].number, row[7].text.c_str());
      os << line;
    }
  } else {
    os << r.question << ": " << headline(r) << "\n";
  }
  for (const std::string &line : r.derivation)
    os << "  " << line << "\n";
}

void printJson(const SolverAnswer &r, raw_ostream &os) {
  json::OStream j(os, 2);
  j.object([&] {
    j.attribute("question", r.question);
    j.attribute("answer", r.answer);
    j.attribute("unit", r.unit);
    j.attributeObject("inputs", [&] {
      for (const SolverInput &in : r.inputs) {
        if (in.text.empty())
          j.attribute(in.name, in.number);
        else
          j.attribute(in.name, in.text);
      }
    });
    j.attributeArray("derivation", [&] {
      for (const std::string &line : r.derivation)
        j.value(line);
    });
    if (r.question == "layout" || r.question == "serve")
      j.attributeArray(r.question == "layout" ? "layouts" : "candidates", [&] {
        for (const auto &row : r.rows)
          j.object([&] {
            for (const SolverInput &in : row) {
              if (in.text.empty())
                j.attribute(in.name, in.number);
              else
                j.attribute(in.name, in.text);
            }
          });
      });
  });
  os << "\n";
}

int finish(const SolverAnswer &r) {
  if (!r.ok() && r.question == "serve" && OutFormat == Format::Text && !r.rows.empty()) {
    // The candidates tried say why none is the answer.
    SolverAnswer tried = r;
    tried.error.clear();
    printText(tried, outs());
  }
  if (!r.ok())
    return inputError(r.question + ": " + r.error);
  // JSON has no inf or nan, and neither is an answer: inputs so large (or an MFU so small)
  // that the arithmetic leaves the doubles are an error in both formats.
  bool finite = std::isfinite(r.answer);
  for (const SolverInput &in : r.inputs)
    finite = finite && (!in.text.empty() || std::isfinite(in.number));
  if (!finite)
    return inputError(r.question + ": the answer is not a finite number (" +
                      (std::isnan(r.answer) ? std::string("undefined") : "it overflows a double") +
                      "); the inputs are out of range");
  if (OutFormat == Format::Json)
    printJson(r, outs());
  else
    printText(r, outs());
  return 0;
}

// ---- the questions -----------------------------------------------------------------------

int runTimeQuestion() {
  std::string bad;
  if (!onlyFlags({&Params, &Tokens, &Devices, &TargetName, &Mfu, &DtypeName}, bad))
    return usage(bad + " does not apply to run-time");
  auto params = quantity(Params, UnitDim::None);
  if (!params)
    return 2;
  auto tokens = quantity(Tokens, UnitDim::None);
  if (!tokens)
    return 2;
  auto devices = deviceCount();
  if (!devices)
    return 2;
  const Target *t = catalogueTarget();
  if (!t)
    return 2;
  auto mfu = quantity(Mfu, UnitDim::Ratio);
  if (!mfu)
    return 2;
  auto dtype = parseDtype(StringRef(DtypeName).lower());
  if (!dtype)
    return usage("unknown dtype '" + DtypeName + "' (bf16, fp16, tf32, fp32, fp8_e4m3, ...)");
  return finish(solveRunTime(*params, *tokens, *devices, *t, *mfu, *dtype));
}

int maxParamsQuestion() {
  std::string bad;
  if (!onlyFlags({&Devices, &TargetName, &Optimizer, &Precision}, bad))
    return usage(bad + " does not apply to max-params");
  auto devices = deviceCount();
  if (!devices)
    return 2;
  const Target *t = catalogueTarget();
  if (!t)
    return 2;
  auto opt = optimizerFlag();
  if (!opt)
    return 2;
  auto precision = precisionFlag();
  if (!precision)
    return 2;
  return finish(solveMaxParams(*devices, *t, *opt, *precision));
}

/// micro-batch and devices: compile FILE, pick and lower the plan, analyze it, and search.
int planQuestion(bool devices) {
  std::string bad;
  if (!onlyFlags({&File, &PlanName, &Memory, &Zero, &TargetName, &Precision}, bad))
    return usage(bad + " does not apply to " + Question);
  if (File.empty())
    return usage(Question + " needs a FILE: tally solve " + Question + " FILE [--plan NAME]");
  if (Zero.getNumOccurrences() && (Zero < 0 || Zero > 3))
    return usage("--zero is a ZeRO stage: 0, 1, 2 or 3");
  std::optional<double> memoryFlag;
  if (Memory.getNumOccurrences()) {
    memoryFlag = quantity(Memory, UnitDim::Bytes);
    if (!memoryFlag)
      return 2;
  }

  Compilation c;
  if (!c.addFile(File))
    return 1;
  const PlanDecl *decl = c.pickPlan(PlanName);
  if (!decl)
    return 1;
  PlanOverrides o;
  o.target = TargetName;
  o.precision = Precision;
  if (!c.lower(*decl, o))
    return 1;
  Plan &plan = *c.plan;
  if (!plan.isTrain)
    return inputError("plan '" + plan.name + "' is an infer plan; " + Question +
                      " is a training question");
  if (Zero.getNumOccurrences())
    plan.parallel.zero = Zero;
  // The memory limit: the flag, else the plan's (its memory budget or the device's memory,
  // whichever is less). The budgets themselves are not checked here: this is a what-if, not
  // a lint.
  double limit = memoryLimit(plan);
  if (memoryFlag)
    limit = *memoryFlag;
  plan.budgets.clear();
  Relower relower = c.relowerer(*decl);
  Analysis a = analyze(*c.graph, plan, c.diags, relower);
  if (c.diags.hasErrors())
    return 1;
  return finish(devices ? solveDevices(a, relower, limit) : solveMicroBatch(a, relower, limit));
}

/// The model `layout --params N` searches for: Megatron's GPT written in the language (pre-norm
/// blocks, GeLU MLP of 4d, fused causal attention, tied head; vocabulary 51,200, sequence
/// 2,048), shaped like GPT-3 (Brown et al. 2020, Table 2.1: 128 per head, d / layers ≈ 128),
/// with GPT-3 175B's batch of 1,536 sequences, AdamW, mixed_bf16 with f32 gradient
/// accumulation (Megatron's defaults).
std::string gptSource(double params, const std::string &target, int64_t &layers) {
  // 12·L·d² parameters in the blocks with d = 128·L: L = ∛(N / (12·128²)), a multiple of 8
  // from 8 layers on.
  double l = std::cbrt(params / (12.0 * 128 * 128));
  layers = std::max<int64_t>(1, std::llround(l));
  if (layers >= 8)
    layers = std::max<int64_t>(8, std::llround(l / 8) * 8);
  int64_t d = 128 * layers;
  std::string L = std::to_string(layers), D = std::to_string(d);
  return "block MLP(d) {\n"
         "  fc = Linear(d, 4 * d)\n  proj = Linear(4 * d, d)\n"
         "  forward(x) { return proj(gelu(fc(x))) }\n}\n"
         "block SelfAttention(d, heads) {\n"
         "  qkv = Linear(d, 3 * d)\n  proj = Linear(d, d)\n"
         "  forward(x) {\n    q, k, v = split(qkv(x), 3, dim = -1)\n"
         "    return proj(attention(q, k, v, heads = heads, causal = true))\n  }\n}\n"
         "block Block(d, heads) {\n"
         "  ln1 = LayerNorm(d)\n  attn = SelfAttention(d, heads)\n"
         "  ln2 = LayerNorm(d)\n  mlp = MLP(d)\n"
         "  forward(x) {\n    x = x + attn(ln1(x))\n    return x + mlp(ln2(x))\n  }\n}\n"
         "model GPT(vocab = 51200, ctx = 2048, d, heads, layers) {\n"
         "  wte = Embedding(vocab, d)\n  wpe = Embedding(ctx, d)\n"
         "  h = repeat(layers) Block(d, heads)\n  lnf = LayerNorm(d)\n"
         "  forward(tokens: i32[batch, seq]) {\n"
         "    x = h(wte(tokens) + wpe(positions(seq)))\n"
         "    return cross_entropy(lnf(x) @ transpose(wte.weight), next_tokens(tokens))\n"
         "  }\n}\n"
         "train gpt {\n  model = GPT(d = " + D + ", heads = " + L + ", layers = " + L + ")\n"
         "  batch = 1536\n  seq = 2048\n  micro_batch = 1\n  optimizer = AdamW(lr = 1e-4)\n"
         "  precision = mixed_bf16\n  grad_dtype = f32\n"
         "  target = " + target + "\n}\n";
}

/// layout: the model from FILE (its plan's batch, sequence, precision, budgets and layout
/// settings such as sequence_parallel are kept) or a GPT-3-shaped model of --params.
int layoutQuestion() {
  std::string bad;
  if (!onlyFlags({&File, &PlanName, &Params, &Devices, &TargetName, &Memory, &Precision}, bad))
    return usage(bad + " does not apply to layout");
  if (File.empty() == (Params.getNumOccurrences() == 0))
    return usage("layout needs a FILE or --params N (one of them): tally solve layout "
                 "--params 175B --devices 4096");
  if (Params.getNumOccurrences() && PlanName.getNumOccurrences())
    return usage("--plan names a plan of a FILE; --params builds its own");
  auto devices = deviceCount();
  if (!devices)
    return 2;
  std::optional<double> memoryFlag;
  if (Memory.getNumOccurrences()) {
    memoryFlag = quantity(Memory, UnitDim::Bytes);
    if (!memoryFlag)
      return 2;
  }
  Compilation c;
  std::string modelLine;
  if (Params.getNumOccurrences()) {
    auto params = quantity(Params, UnitDim::None);
    if (!params)
      return 2;
    if (*params < 1e6 || *params > 1e14)
      return usage("--params is between 1M and 100T parameters, not " + Params);
    std::string target = TargetName.getNumOccurrences() ? std::string(TargetName) : "H100_SXM";
    if (!findTarget(target)) {
      catalogueTarget(); // says which names exist
      return 2;
    }
    int64_t layers = 0;
    if (!c.addSource("<layout --params>", gptSource(*params, target, layers)))
      return 1;
    modelLine = "model: GPT-3-shaped, " + std::to_string(layers) + " layers, d = " +
                std::to_string(128 * layers) + ", " + std::to_string(layers) +
                " heads (128 each), batch 1536 × seq 2048, AdamW, mixed_bf16, grad_dtype f32, " +
                target;
  } else if (!c.addFile(File)) {
    return 1;
  }
  const PlanDecl *decl = c.pickPlan(PlanName);
  if (!decl)
    return 1;
  PlanOverrides o;
  if (!File.empty())
    o.target = TargetName;
  o.precision = Precision;
  if (!c.lower(*decl, o))
    return 1;
  Plan &plan = *c.plan;
  if (!plan.isTrain)
    return inputError("plan '" + plan.name + "' is an infer plan; layout is a training question");
  double limit = memoryLimit(plan);
  if (memoryFlag)
    limit = *memoryFlag;
  // The base plan is analysed without its budgets (this is a search, not a lint); the search
  // then checks every candidate against them.
  std::vector<BudgetSpec> budgets = std::move(plan.budgets);
  plan.budgets.clear();
  // Its own layout may not fit (or not divide the batch): that is what the search is for, so
  // it is priced without budgets, device-memory fixes or diagnostics (the file's own errors
  // were reported above); the search needs its graph, parameters and repeat blocks.
  Relower relower = c.relowerer(*decl);
  DiagnosticEngine quiet(c.sm);
  quiet.setOutput(nullptr);
  Analysis a = analyzeLayout(analyzeGraph(*c.graph, plan), plan, quiet);
  plan.budgets = std::move(budgets);
  SolverAnswer r = solveLayout(a, relower, *devices, limit);
  if (!modelLine.empty())
    r.derivation.insert(r.derivation.begin(), modelLine);
  return finish(r);
}

/// serve: compile the file (--model FILE or FILE), take its infer plan (--plan, else the
/// first infer plan) with max_context = --context, and search the concurrency.
int serveQuestion() {
  std::string bad;
  if (!onlyFlags({&File, &ModelFile, &PlanName, &Context, &LatencyBudget, &TargetName,
                  &Precision},
                 bad))
    return usage(bad + " does not apply to serve");
  if (File.empty() == ModelFile.empty())
    return usage("serve needs the model's file, once: tally solve serve --model FILE --target "
                 "H100_SXM --context 8192 [--latency-budget 50ms]");
  std::string file = File.empty() ? std::string(ModelFile) : std::string(File);
  auto context = quantity(Context, UnitDim::None);
  if (!context)
    return 2;
  if (*context != std::floor(*context) || *context < 1 || *context > 9.0e15)
    return usage("--context is a whole number of tokens, not " + Context);
  double budget = 0;
  if (LatencyBudget.getNumOccurrences()) {
    auto b = quantity(LatencyBudget, UnitDim::Time);
    if (!b)
      return 2;
    if (!(*b > 0))
      return usage("--latency-budget is a positive time such as 50ms, not " + LatencyBudget);
    budget = *b;
  }
  Compilation c;
  if (!c.addFile(file))
    return 1;
  const PlanDecl *decl = nullptr;
  if (PlanName.empty()) {
    for (const PlanDecl *p : c.program.planOrder)
      if (!p->isTrain && !decl)
        decl = p;
    if (!decl)
      return inputError("serve: " + file + " has no infer plan; declare one, such as `infer "
                        "serve { model = M() prompt = 512 generate = 256 target = H100_SXM }`");
  } else if (!(decl = c.pickPlan(PlanName))) {
    return 1;
  }
  if (decl->isTrain)
    return inputError("serve: plan '" + decl->name + "' is a train plan; serve needs an infer "
                      "plan");
  PlanOverrides o;
  o.target = TargetName;
  o.precision = Precision;
  o.maxContext = static_cast<int64_t>(*context);
  if (!c.lower(*decl, o))
    return 1;
  Plan &plan = *c.plan;
  Relower relower = c.relowerer(*decl);
  Analysis a = analyze(*c.graph, plan, c.diags, relower);
  if (c.diags.hasErrors())
    return 1;
  return finish(solveServe(a, relower, budget));
}

} // namespace
} // namespace solvecmd

/// True when the command line names `tally solve`.
bool solveSelected() { return static_cast<bool>(solveopts::Solve); }

/// Runs `tally solve`; returns the exit code.
int runSolve() {
  using namespace solvecmd;
  if (Question == "run-time")
    return runTimeQuestion();
  if (Question == "max-params")
    return maxParamsQuestion();
  if (Question == "micro-batch")
    return planQuestion(false);
  if (Question == "devices")
    return planQuestion(true);
  if (Question == "layout")
    return layoutQuestion();
  if (Question == "serve")
    return serveQuestion();
  std::string close = closestName(
      Question, {"run-time", "max-params", "micro-batch", "devices", "layout", "serve"});
  return usage("unknown question '" + Question + "'" +
               didYouMean(close) +
               " (questions: run-time, max-params, micro-batch, devices, layout, serve)");
}

} // namespace tally
