// `tally explain FILE --op PATH [--plan NAME] [--format text|json]`: how one op's shape,
// FLOPs, bytes, bound and time were derived, or the ops of one block with their totals. The
// plan is analyzed exactly as `tally report` analyzes it (Compilation::analyzePlan), and
// report/Explain.cpp formats what the passes computed.
//
// Exit codes: 0 explained, 1 an error in the file or a PATH that names no op or block (with a
// did-you-mean), 2 bad usage.
#include "driver/Compiler.h"
#include "support/Suggest.h"
#include "report/Explain.h"
#include "tools/tally/Commands.h"
#include "tools/tally/PlanFlags.h"

#include "llvm/Support/CommandLine.h"
#include "llvm/Support/raw_ostream.h"

using namespace llvm;

namespace tally {
namespace explainopts {

cl::SubCommand Explain("explain", "How one op's (or one block's) FLOPs, bytes, bound and time were derived");
cl::OptionCategory Cat("tally explain options");

cl::opt<std::string> File(cl::Positional, cl::desc("<file>"), cl::Required, cl::sub(Explain),
                          cl::cat(Cat));
cl::opt<std::string> OpPath("op",
                            cl::desc("An op path such as h[3].attn.qkv.matmul, a block such as "
                                     "h[3] or h[3].attn, or the copies of one as the reports' "
                                     "rows name them, h[*].attn (`tally report --emit=ir` lists op paths)"),
                            cl::value_desc("path"), cl::sub(Explain), cl::cat(Cat));
cl::opt<bool> Collectives("collectives",
                          cl::desc("Every collective of one step: the framework stack, and each "
                                   "collective's algorithm, protocol, steps, latency, bandwidth "
                                   "and time (docs/time.md)"),
                          cl::sub(Explain), cl::cat(Cat));
cl::opt<std::string> PlanName("plan", cl::desc("The train or infer plan (default: the first)"),
                              cl::value_desc("name"), cl::sub(Explain), cl::cat(Cat));
enum class Format { Text, Json };
cl::opt<Format> OutFormat("format", cl::desc("Output format"),
                          cl::values(clEnumValN(Format::Text, "text", "the derivation (default)"),
                                     clEnumValN(Format::Json, "json", "one JSON object")),
                          cl::init(Format::Text), cl::sub(Explain), cl::cat(Cat));
PlanFlags Overrides(Cat, Explain);
PricingBackend Backend(Cat, Explain); // as report's: the times explained are the ones it prices
DiagnosticFlags Diagnostics(Cat, Explain);

} // namespace explainopts

namespace explaincmd {

using namespace explainopts;

namespace {

PlanOverrides overrides() { return Overrides.overrides(Backend.cuda()); }

int explain() {
  if (OpPath.empty() == !Collectives) {
    errs() << "tally explain: give --op PATH (one op or block) or --collectives (the step's "
              "collectives), one of the two\n";
    return 2;
  }
  Compilation c;
  if (!Diagnostics.apply(c.diags))
    return 2;
  if (!c.addFile(File))
    return 1;
  const PlanDecl *decl = c.pickPlan(PlanName);
  if (!decl)
    return 1;
  std::optional<Analysis> a = c.analyzePlan(*decl, overrides());
  if (!a)
    return 1;
  bool json = OutFormat == Format::Json;
  if (Collectives) {
    if (json)
      explainCollectivesJson(*a, outs());
    else
      explainCollectivesText(*a, outs());
    return c.diags.hasErrors() ? 1 : 0;
  }
  ExplainSelection sel = selectForExplain(*a->graph, OpPath);
  if (sel.kind == ExplainSelection::None) {
    c.diags.report(DiagKind::UnknownName, SMLoc(),
                   "no op or block '" + OpPath + "' in plan " + a->plan->name +
                       (sel.outOfRange.empty() ? didYouMean(sel.suggestion)
                                               : ": " + sel.outOfRange))
        .note(SMLoc(), "`tally report " + File + " --emit=ir` lists every op path");
    return 1;
  }
  if (sel.kind == ExplainSelection::Op) {
    if (json)
      explainOpJson(*a, sel.op, c.diags, outs(), &sel);
    else
      explainOpText(*a, sel.op, c.diags, outs(), &sel);
  } else {
    if (json)
      explainBlockJson(*a, sel, outs());
    else
      explainBlockText(*a, sel, outs());
  }
  return c.diags.hasErrors() ? 1 : 0;
}

} // namespace
} // namespace explaincmd

int runExplain() {
  using namespace explaincmd;
  if (!Explain)
    return -1;
  return explain();
}

} // namespace tally
