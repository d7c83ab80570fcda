// tally_fuzz: a libFuzzer target over the whole pipeline, in memory. Each input is one .tally
// file; it is parsed, named by Sema and printed as an AST; then every plan it declares (at most
// kMaxPlans) is lowered and analysed by every pass (with the budget-fix relowerer, as `check`
// and `report` run them) and rendered in every format `tally report` and `tally check` write:
// text, JSON, Markdown, HTML, --emit=ir (text and JSON), --emit=memory-plan (text and JSON),
// `explain` of the first and the last op and of the first block below the model, and the
// diagnostics as printed text, SARIF and JSON. Nothing is written to a file and no process is
// started: the renderers write to strings or a null stream.
//
// A crash, a sanitizer report, a hang (-timeout) or too much memory (-rss_limit_mb) is a
// finding. The target also aborts when a JSON renderer writes something llvm::json cannot
// parse back (a NaN or an infinity printed as "nan"/"inf", a broken escape), since JSON output
// is a contract (docs/language.md). Built by -DTALLY_FUZZ=ON; run by scripts/fuzz.sh; see
// docs/reliability.md.
#include "frontend/AST.h"
#include "driver/Compiler.h"
#include "ir/Graph.h"
#include "passes/Passes.h"
#include "report/Explain.h"
#include "report/Html.h"
#include "report/Report.h"
#include "report/Sarif.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"
#include "llvm/Support/raw_ostream.h"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

using namespace tally;

namespace {

/// Plans analysed per input: each costs a full pipeline run, and a few cover every path.
constexpr size_t kMaxPlans = 3;

/// Aborts (a finding) when `text`, written by a JSON renderer, is not valid JSON.
void requireJson(const std::string &text, const char *what) {
  llvm::Expected<llvm::json::Value> v = llvm::json::parse(text);
  if (v)
    return;
  std::string msg = llvm::toString(v.takeError());
  std::fprintf(stderr, "tally_fuzz: %s is not valid JSON: %s\n", what, msg.c_str());
  std::abort();
}

/// Renders one analysed plan in every format.
void renderAll(Analysis &a, Compilation &c) {
  llvm::raw_null_ostream null;
  std::string s;
  llvm::raw_string_ostream os(s);

  renderText(a, null);
  renderMarkdown(a, null);
  renderHtml(a, c.diags, null);
  renderJson(a, c.diags, os);
  os.flush();
  requireJson(s, "report --format json");
  s.clear();

  printGraph(*a.step, null);
  renderIrJson(*a.step, os);
  os.flush();
  requireJson(s, "report --emit=ir --format json");
  s.clear();

  renderMemoryPlan(a, null, false);
  renderMemoryPlan(a, os, true);
  os.flush();
  requireJson(s, "report --emit=memory-plan --format json");
  s.clear();

  // explain: the first and last op of the forward graph, and the first block instance below
  // the model (by path, as the CLI looks them up).
  const Graph &g = *a.graph;
  if (!g.ops.empty()) {
    for (const Op *op : {&g.ops.front(), &g.ops.back()}) {
      ExplainSelection sel = selectForExplain(g, g.opPath(*op));
      if (sel.kind != ExplainSelection::Op)
        continue;
      explainOpText(a, sel.op, c.diags, null);
      explainOpJson(a, sel.op, c.diags, os);
      os.flush();
      requireJson(s, "explain --op --format json");
      s.clear();
    }
  }
  if (g.instances.size() > 1) {
    ExplainSelection sel = selectForExplain(g, g.instancePath(1));
    if (sel.kind == ExplainSelection::Block) {
      explainBlockText(a, sel, null);
      explainBlockJson(a, sel, os);
      os.flush();
      requireJson(s, "explain (block) --format json");
      s.clear();
    }
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  llvm::StringRef text(reinterpret_cast<const char *>(data), size);
  Compilation c;
  llvm::raw_null_ostream printed; // diagnostics are formatted (carets, ranges) but not shown
  c.diags.setOutput(&printed);

  if (c.addSource("fuzz.tally", text) && !c.program.modules.empty())
    printAST(*c.program.modules.back(), printed);

  if (!c.diags.hasErrors()) {
    // Inputs of odd length are priced as tally's CUDA step (`--backend cuda`: the fusion pass
    // and the step's memory), the others as a framework run: both paths, one lowering each.
    PlanOverrides step;
    step.fuseKernels = step.cudaStep = (size & 1) != 0;
    size_t n = 0;
    for (const PlanDecl *p : c.program.planOrder) {
      if (n++ == kMaxPlans)
        break;
      if (!c.lower(*p, step))
        continue;
      Analysis a = analyze(*c.graph, *c.plan, c.diags, c.relowerer(*p));
      renderAll(a, c);
    }
  }

  // The diagnostics as `check --format sarif` and `check --format json` write them.
  llvm::json::Array sarif, list;
  appendSarifResults(c.diags, c.sm, sarif);
  appendDiagnosticsJson(c.diags, c.sm, list);
  std::string s;
  llvm::raw_string_ostream os(s);
  renderSarif(std::move(sarif), os);
  os << llvm::formatv("{0:2}", llvm::json::Value(llvm::json::Object{{"diagnostics", std::move(list)}}));
  os.flush();
  return 0;
}
