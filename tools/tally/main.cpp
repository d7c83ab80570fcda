// The tally command line: parses flags (llvm::cl subcommands), runs the pipeline, and picks a
// renderer. Exit codes: 0 success, 1 an error diagnostic or a broken budget, 2 bad usage, an
// output that cannot be written (report/Output.h) or memory the system does not give.
#include "frontend/AST.h"
#include "driver/Compiler.h"
#include "frontend/Stack.h"
#include "ir/Graph.h"
#include "ir/Units.h"
#include "passes/Passes.h"
#include "passes/Solvers.h"
#include "report/Html.h"
#include "report/Output.h"
#include "report/Report.h"
#include "report/Sarif.h"
#include "tools/tally/Commands.h"
#include "tools/tally/PlanFlags.h"
#include "support/Memory.h"

#include "llvm/Support/BuryPointer.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/ErrorHandling.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/Process.h"
#include "llvm/Support/raw_ostream.h"

#include <unistd.h>

using namespace llvm;

namespace tally {
namespace opts {

cl::SubCommand Check("check", "Lint files: diagnostics only; exit 1 on an error or a broken budget");
cl::SubCommand Report("report", "Report parameters, FLOPs, memory, time and MFU for a plan");
cl::SubCommand Targets("targets", "List the built-in hardware catalogue");

cl::OptionCategory Cat("tally options");

cl::list<std::string> CheckFiles(cl::Positional, cl::desc("<file>..."), cl::OneOrMore,
                                 cl::sub(Check), cl::cat(Cat));
cl::opt<std::string> ReportFile(cl::Positional, cl::desc("<file>"), cl::Required,
                                cl::sub(Report), cl::cat(Cat));

cl::opt<std::string> PlanName("plan", cl::desc("The train or infer plan to analyze (default: the first)"),
                              cl::value_desc("name"), cl::sub(Check), cl::sub(Report), cl::cat(Cat));
enum class Format { Text, Json, Markdown, Html, Sarif };
cl::opt<Format> OutFormat("format", cl::desc("Report format"),
                          cl::values(clEnumValN(Format::Text, "text", "a budget statement (default)"),
                                     clEnumValN(Format::Json, "json", "one JSON object"),
                                     clEnumValN(Format::Markdown, "markdown", "Markdown tables"),
                                     clEnumValN(Format::Html, "html", "report: one HTML page with SVG charts"),
                                     clEnumValN(Format::Sarif, "sarif", "check: diagnostics as SARIF 2.1.0")),
                          cl::init(Format::Text), cl::sub(Check), cl::sub(Report), cl::sub(Targets), cl::cat(Cat));
cl::opt<std::string> Output("o", cl::desc("Write the report to this file"), cl::value_desc("file"),
                            cl::init("-"), cl::sub(Report), cl::cat(Cat));
enum class Emit { None, Ast, Ir, MemoryPlan, Analysis };
cl::opt<Emit> EmitStage("emit", cl::desc("Print one stage of the pipeline instead of the report"),
                        cl::values(clEnumValN(Emit::Ast, "ast", "the parsed AST"),
                                   clEnumValN(Emit::Ir, "ir", "the IR graph: the training step for train plans"),
                                   clEnumValN(Emit::MemoryPlan, "memory-plan", "the schedule and the memory plan"),
                                   clEnumValN(Emit::Analysis, "analysis", "the analysis as JSON")),
                        cl::init(Emit::None), cl::sub(Check), cl::sub(Report), cl::cat(Cat));

// Overrides of the file's settings.
PlanFlags Overrides(Cat, Check, Report);
PricingBackend Backend(Cat, Check, Report);

// Budgets on the command line: each replaces the file's budget of the same metric.
cl::opt<std::string> BudgetMemory("budget-memory", cl::desc("Budget: peak memory per device at most, e.g. 80GiB"),
                                  cl::value_desc("bytes"), cl::sub(Check), cl::sub(Report), cl::cat(Cat));
cl::opt<std::string> BudgetStepTime("budget-step-time", cl::desc("Budget: step time at most, e.g. 60s"),
                                    cl::value_desc("duration"), cl::sub(Check), cl::sub(Report), cl::cat(Cat));
cl::opt<std::string> BudgetMfu("budget-mfu", cl::desc("Budget: MFU at least, e.g. 40%"),
                               cl::value_desc("ratio"), cl::sub(Check), cl::sub(Report), cl::cat(Cat));
cl::opt<std::string> BudgetRunTime("budget-run-time", cl::desc("Budget: run time at most, e.g. 90days"),
                                   cl::value_desc("duration"), cl::sub(Check), cl::sub(Report), cl::cat(Cat));

DiagnosticFlags Diagnostics(Cat, Check, Report);

} // namespace opts

namespace {

/// The file's settings as the command line overrides them; `--backend cuda` prices tally's CUDA
/// step as `tally run --backend cuda` does (fused unless --fuse=false).
PlanOverrides overrides() { return opts::Overrides.overrides(opts::Backend.cuda()); }

int usageError(const std::string &msg) {
  errs() << "tally: error: " << msg << "\n";
  return 2;
}

/// An output that cannot be written (report/Output.h): an io-error, exit 2.
int outputError(const std::string &msg) {
  errs() << "tally: error: " << msg << " [io-error]\n";
  return kOutputErrorExit;
}

/// The --budget-* flags as budgets without a source location (so their diagnostics print as
/// "tally: error: ..."); nullopt, after a usage error, when one does not parse.
std::optional<std::vector<BudgetSpec>> budgetFlags() {
  struct Flag {
    const cl::opt<std::string> *opt;
    BudgetMetric metric;
    UnitDim dim;
    bool atMost;
  };
  const Flag flags[] = {{&opts::BudgetMemory, BudgetMetric::MemoryPerDevice, UnitDim::Bytes, true},
                        {&opts::BudgetStepTime, BudgetMetric::StepTime, UnitDim::Time, true},
                        {&opts::BudgetMfu, BudgetMetric::Mfu, UnitDim::Ratio, false},
                        {&opts::BudgetRunTime, BudgetMetric::RunTime, UnitDim::Time, true}};
  std::vector<BudgetSpec> out;
  for (const Flag &f : flags) {
    if (f.opt->getNumOccurrences() == 0)
      continue;
    std::string err;
    std::optional<double> v = parseQuantity(*f.opt, f.dim, err);
    if (!v) {
      usageError("--" + f.opt->ArgStr.str() + ": " + err);
      return std::nullopt;
    }
    BudgetSpec b;
    b.metric = f.metric;
    b.atMost = f.atMost;
    b.value = *v;
    out.push_back(b);
  }
  return out;
}

/// What a command ends with (its compilation and analysis) is left to the process's exit, as
/// clang's -disable-free does: freeing a 10,000-layer graph, its training step and their
/// analysis piece by piece was a tenth of `tally check`'s time. llvm::BuryPointer keeps the
/// object reachable, so LeakSanitizer does not count it as a leak; it holds 16 pointers, so
/// only the last file's and the last plan's objects are kept (check frees the others).
template <class T> T &keptToExit(std::unique_ptr<T> p) {
  T &r = *p;
  llvm::BuryPointer(std::move(p));
  return r;
}

/// Checks one file: parse, then lower and analyze every plan (or the one named).
int runCheck() {
  int status = 0;
  std::optional<std::vector<BudgetSpec>> budgets = budgetFlags();
  if (!budgets)
    return 2;
  // --format sarif|json (report/Sarif.h): diagnostics are collected, not printed, and written
  // as one SARIF log or one JSON object at the end.
  bool sarif = opts::OutFormat == opts::Format::Sarif;
  bool jsonDiags = opts::OutFormat == opts::Format::Json;
  if (opts::OutFormat != opts::Format::Text && !sarif && !jsonDiags)
    return usageError("tally check --format takes text, json or sarif");
  json::Array collected;
  for (size_t f = 0; f < opts::CheckFiles.size(); ++f) {
    const std::string &file = opts::CheckFiles[f];
    bool lastFile = f + 1 == opts::CheckFiles.size();
    auto owned = std::make_unique<Compilation>();
    Compilation &c = lastFile ? keptToExit(std::move(owned)) : *owned;
    if (!opts::Diagnostics.apply(c.diags))
      return 2;
    if (sarif || jsonDiags)
      c.diags.setOutput(nullptr);
    if (c.addFile(file) && opts::EmitStage == opts::Emit::Ast)
      printAST(*c.program.modules.back(), outs());
    std::vector<const PlanDecl *> plans;
    if (!c.diags.hasErrors()) {
      if (!opts::PlanName.empty()) {
        if (const PlanDecl *p = c.pickPlan(opts::PlanName))
          plans.push_back(p);
      } else {
        plans = c.program.planOrder;
      }
    }
    // Models no plan runs are type-checked too (with their defaults), after the plans.
    bool everyModel = !c.diags.hasErrors() && opts::PlanName.empty();
    for (const PlanDecl *p : plans) {
      if (!c.lower(*p, overrides()))
        continue;
      overrideBudgets(*c.plan, *budgets);
      auto analysis = std::make_unique<Analysis>(
          analyze(*c.graph, *c.plan, c.diags, c.relowerer(*p),
                  Results::check(opts::EmitStage == opts::Emit::MemoryPlan,
                                 opts::EmitStage == opts::Emit::Ir)));
      Analysis &a = lastFile && p == plans.back() ? keptToExit(std::move(analysis)) : *analysis;
      if (opts::EmitStage == opts::Emit::Ir)
        printGraph(*a.step, outs());
      if (opts::EmitStage == opts::Emit::MemoryPlan)
        renderMemoryPlan(a, outs(), false);
    }
    if (everyModel)
      c.checkModelsWithoutPlan();
    if (c.diags.hasErrors())
      status = 1;
    if (sarif)
      appendSarifResults(c.diags, c.sm, collected);
    if (jsonDiags)
      appendDiagnosticsJson(c.diags, c.sm, collected);
  }
  if (sarif)
    renderSarif(std::move(collected), outs());
  if (jsonDiags)
    outs() << formatv("{0:2}", json::Value(json::Object{{"diagnostics", std::move(collected)}}))
           << "\n";
  return status;
}

int runReport() {
  if (opts::OutFormat == opts::Format::Sarif)
    return usageError("--format sarif is for `tally check`");
  Compilation &c = keptToExit(std::make_unique<Compilation>());
  if (!opts::Diagnostics.apply(c.diags))
    return 2;
  std::optional<std::vector<BudgetSpec>> budgets = budgetFlags();
  if (!budgets)
    return 2;
  if (!c.addFile(opts::ReportFile))
    return 1;
  if (opts::EmitStage == opts::Emit::Ast) {
    printAST(*c.program.modules.back(), outs());
    return c.diags.hasErrors() ? 1 : 0;
  }
  const PlanDecl *decl = c.pickPlan(opts::PlanName);
  if (!decl || !c.lower(*decl, overrides()))
    return 1;
  overrideBudgets(*c.plan, *budgets);
  // --emit=ir stops at its stage, as a compiler's -emit does: the training step, built and
  // verified, printed; no pricing, lints or budgets (their diagnostics belong to the report).
  if (opts::EmitStage == opts::Emit::Ir) {
    Analysis &a =
        keptToExit(std::make_unique<Analysis>(analyzeStep(*c.graph, *c.plan, c.diags)));
    if (opts::OutFormat == opts::Format::Json)
      renderIrJson(*a.step, outs());
    else
      printGraph(*a.step, outs());
    return c.diags.hasErrors() ? 1 : 0;
  }
  // The reports print no arena offsets, buffers or step ops; the memory plan does.
  Analysis &a = keptToExit(std::make_unique<Analysis>(
      analyze(*c.graph, *c.plan, c.diags, c.relowerer(*decl),
              Results::report(opts::EmitStage == opts::Emit::MemoryPlan))));
  if (opts::EmitStage == opts::Emit::MemoryPlan) {
    renderMemoryPlan(a, outs(), opts::OutFormat == opts::Format::Json);
    return c.diags.hasErrors() ? 1 : 0;
  }
  // report/Output.h: a temporary file renamed into place; the inputs are never written over.
  std::vector<std::string> inputs;
  for (unsigned i = 1; i <= c.sm.getNumBuffers(); ++i)
    inputs.push_back(c.sm.getMemoryBuffer(i)->getBufferIdentifier().str());
  std::string err;
  std::unique_ptr<OutputFile> out = OutputFile::open(opts::Output, inputs, err);
  if (!out)
    return outputError(err);
  if (opts::EmitStage == opts::Emit::Analysis || opts::OutFormat == opts::Format::Json)
    renderJson(a, c.diags, out->os());
  else if (opts::OutFormat == opts::Format::Markdown)
    renderMarkdown(a, out->os());
  else if (opts::OutFormat == opts::Format::Html)
    renderHtml(a, c.diags, out->os());
  else
    renderText(a, out->os());
  if (!out->commit(err))
    return outputError(err);
  return c.diags.hasErrors() ? 1 : 0;
}

int runTargets() {
  if (opts::OutFormat == opts::Format::Html || opts::OutFormat == opts::Format::Sarif)
    return usageError("tally targets --format takes text, markdown or json");
  if (opts::OutFormat == opts::Format::Json) {
    json::Array list;
    for (const Target &t : targetCatalogue())
      list.push_back(json::Object{{"name", t.name},
                                  {"description", t.description},
                                  {"memory", t.memoryBytes},
                                  {"datasheet_memory", t.statedMemory()},
                                  {"bandwidth", t.bandwidth},
                                  {"peak_fp64", t.peakF64},
                                  {"peak_fp32", t.peakF32},
                                  {"peak_tf32", t.peakTF32},
                                  {"peak_bf16", t.peakBF16},
                                  {"peak_fp16", t.peakF16},
                                  {"peak_fp8", t.peakFP8},
                                  {"peak_int8", t.peakINT8},
                                  {"host_link", t.hostLink},
                                  {"interconnect", t.interconnect},
                                  {"ridge_bf16", t.ridge(Dtype::BF16)},
                                  {"multiprocessors", t.multiprocessors},
                                  {"transcendental_s", t.transcendentalTime},
                                  {"kernel_launch_s", t.kernelLaunch},
                                  {"source", t.source}});
    outs() << formatv("{0:2}", json::Value(std::move(list))) << "\n";
    return 0;
  }
  // One row per target, Markdown or aligned text: the same cells either way.
  bool markdown = opts::OutFormat == opts::Format::Markdown;
  const char *row = markdown ? "| {0} | {1} | {2} | {3} | {4} | {5} | {6} | {7:f1} |\n"
                             : "{0,-10} {1,-28} {2,10} {3,10} {4,14} {5,14} {6,14} {7,10:f1}\n";
  if (markdown)
    outs() << "| name | device | memory | bandwidth | bf16 dense | tf32 dense | fp32 | ridge bf16 |\n"
              "|---|---|---:|---:|---:|---:|---:|---:|\n";
  else
    outs() << formatv("{0,-10} {1,-28} {2,10} {3,10} {4,14} {5,14} {6,14} {7,10}\n", "name",
                      "device", "memory", "bandwidth", "bf16 dense", "tf32 dense", "fp32",
                      "ridge bf16");
  for (const Target &t : targetCatalogue())
    outs() << formatv(row, t.name, t.description, formatValue(t.memoryBytes, UnitDim::Bytes),
                      formatRate(t.bandwidth, UnitDim::ByteRate),
                      formatRate(t.peakBF16, UnitDim::FlopRate),
                      formatRate(t.peakTF32, UnitDim::FlopRate),
                      formatRate(t.peakF32, UnitDim::FlopRate), t.ridge(Dtype::BF16));
  outs() << "\nDense (not sparse) datasheet rates; sources in docs/targets.md. Memory as the driver reports\n"
            "it (an H100 80GB: 81,559 MiB), which plans are checked against.\n";
  return 0;
}

/// Runs the command that the command line chose; its exit code.
int runCommand() {
  if (opts::Check)
    return runCheck();
  if (opts::Report)
    return runReport();
  if (opts::Targets)
    return runTargets();
  if (int rc = runExtraCommand(); rc >= 0)
    return rc;
  errs() << "tally: error: no command given; try `tally --help`\n";
  return 2;
}

} // namespace
} // namespace tally

namespace {
/// Where every failed allocation ends (InitLLVM's new handler reports it as a bad alloc): one
/// line on stderr, written without allocating, and exit 2, instead of LLVM's abort with its
/// "PLEASE submit a bug report" banner. Any thread may call it; it does not return.
[[noreturn]] void outOfMemory(void *, const char *, bool) {
  static const char message[] =
      "tally: error: out of memory: the analysis needs more memory than the system gives it "
      "[out-of-memory]\n";
  ssize_t ignored = ::write(2, message, sizeof message - 1);
  (void)ignored;
  ::_exit(tally::kOutputErrorExit);
}
} // namespace

int main(int argc, char **argv) {
  tally::tuneAllocator();
  InitLLVM init(argc, argv);
  llvm::install_bad_alloc_error_handler(outOfMemory);
  using namespace tally;
  cl::HideUnrelatedOptions({&opts::Cat, &cl::getGeneralCategory()});
  cl::SetVersionPrinter([](raw_ostream &os) { os << "tally 0.1\n"; });
  std::string errors;
  raw_string_ostream errStream(errors);
  if (!cl::ParseCommandLineOptions(
          argc, argv,
          "tally: a compiler and static analyzer for model configurations\n\n"
          "  tally check FILE...            diagnostics only; exit 1 on an error or a broken budget\n"
          "  tally report FILE              parameters, FLOPs, memory, time, MFU\n"
          "  tally explain FILE --op PATH   how one op's or block's numbers were derived\n"
          "  tally solve QUESTION [FLAGS]   run-time, max-params, micro-batch, devices\n"
          "  tally targets                  the hardware catalogue\n"
          "  tally build FILE -o DIR        the generated training step (C++ for the CPU)\n"
          "  tally run FILE                 build and run it: estimated beside measured\n"
          "  tally calibrate [-o FILE]      measure this machine as the `host` target\n"
          "  tally import-hf CONFIG.json    a .tally model from a Hugging Face config.json\n"
          "  tally lsp                      a Language Server for editors, on stdio\n",
          &errStream)) {
    errStream.flush();
    errs() << errors;
    return 2;
  }
  installTargetLoader(); // `target = host` and target files (tools/tally/Calibrate.cpp)
  ignoreBrokenPipes();    // a closed stdout is an io-error (exit 2), not SIGPIPE's code 74
  // frontend/Stack.h: deep expressions within the documented limits never overflow the stack.
  return finishStandardStreams(runOnFrontendStack(runCommand));
}
