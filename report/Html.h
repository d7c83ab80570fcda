// Html.h — the HTML report: one self-contained page (inline CSS and SVG, no script, no network)
// with the charts of report/SvgCharts.h followed by the tables of the text report.
#pragma once

#include "support/Diagnostics.h"
#include "passes/Analysis.h"

#include "llvm/Support/raw_ostream.h"

namespace tally {

/// Writes the page for one analyzed plan: headline and settings, the diagnostics (budget
/// violations, warnings), the roofline, memory per device, FLOPs and time by block, the
/// checkpoint trade-off curve, then every table of buildReport (report/Sections.h).
void renderHtml(const Analysis &a, const DiagnosticEngine &diags, llvm::raw_ostream &os);

} // namespace tally
