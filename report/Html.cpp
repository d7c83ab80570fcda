// Html.cpp — the HTML report (see Html.h). The page is static: inline CSS, inline SVG charts
// with <title> hover text, and the tables of report/Sections.cpp. Charts that do not apply
// (no checkpoint options without `checkpoint = auto`) are replaced by a sentence saying why.
#include "report/Html.h"

#include "report/Sections.h"
#include "report/Svg.h"
#include "report/SvgCharts.h"

#include "ir/Units.h"

namespace tally {

namespace {

constexpr const char *kStyle = R"(
body { font-family: sans-serif; color: #222; max-width: 800px; margin: 24px auto; padding: 0 16px; }
h1 { font-size: 20px; margin-bottom: 4px; }
h2 { font-size: 16px; margin: 28px 0 8px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
p.settings { margin: 2px 0; color: #555; }
figure { margin: 0; }
figcaption { font-size: 12px; color: #555; margin-top: 4px; }
p.empty { color: #777; font-style: italic; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0; }
th, td { padding: 3px 10px; border-bottom: 1px solid #eee; }
th { text-align: left; background: #f6f6f6; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
p.note { font-size: 12px; color: #555; margin: 4px 0; }
ul.diags { font-size: 13px; padding-left: 18px; }
li.error { color: #b00; }
li.warning { color: #a60; }
)";

/// A cell that starts with a digit, sign or dot is a number: right-aligned.
bool numeric(const std::string &cell) {
  return !cell.empty() && (std::isdigit(static_cast<unsigned char>(cell[0])) || cell[0] == '-' ||
                           cell[0] == '.');
}

void table(const ReportTable &t, llvm::raw_ostream &os) {
  os << "<h2>" << xmlEscape(t.title) << "</h2>\n<table>\n";
  if (!t.header.empty()) {
    os << "<tr>";
    for (const std::string &h : t.header)
      os << "<th>" << xmlEscape(h) << "</th>";
    os << "</tr>\n";
  }
  for (const auto &row : t.rows) {
    os << "<tr>";
    for (const std::string &cell : row)
      os << (numeric(cell) ? "<td class=\"num\">" : "<td>") << xmlEscape(cell) << "</td>";
    os << "</tr>\n";
  }
  os << "</table>\n";
  for (const std::string &n : t.notes)
    os << "<p class=\"note\">" << xmlEscape(n) << "</p>\n";
}

/// A chart section: the SVG and a caption, or a sentence when the chart does not apply.
void chart(llvm::StringRef title, const std::string &svg, llvm::StringRef caption,
           llvm::StringRef whyEmpty, llvm::raw_ostream &os) {
  os << "<h2>" << xmlEscape(title) << "</h2>\n";
  if (svg.empty()) {
    os << "<p class=\"empty\">" << xmlEscape(whyEmpty) << "</p>\n";
    return;
  }
  os << "<figure>\n" << svg << "<figcaption>" << xmlEscape(caption) << "</figcaption>\n</figure>\n";
}

} // namespace

void renderHtml(const Analysis &a, const DiagnosticEngine &diags, llvm::raw_ostream &os) {
  ReportContent c = buildReport(a);
  os << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>"
     << xmlEscape(c.headline) << "</title>\n<style>" << kStyle << "</style>\n</head>\n<body>\n";
  os << "<h1>" << xmlEscape(c.headline) << "</h1>\n";
  for (const std::string &s : c.settings)
    os << "<p class=\"settings\">" << xmlEscape(s) << "</p>\n";

  if (!diags.diagnostics().empty()) {
    os << "<h2>Diagnostics</h2>\n<ul class=\"diags\">\n";
    for (const Diagnostic &d : diags.diagnostics()) {
      std::string where = d.line ? d.file + ":" + std::to_string(d.line) + ": " : "";
      os << "<li class=\"" << severityName(d.severity) << "\">" << xmlEscape(where)
         << severityName(d.severity) << ": " << xmlEscape(d.message) << " ["
         << codeOf(d.kind) << "]</li>\n";
    }
    os << "</ul>\n";
  }

  chart("Roofline", rooflineChart(a, diags),
        "Each point is an op (the copies of a repeated block as one) at its forward intensity and "
        "the rate it attains (its FLOPs over its estimated time); hover for its path and source "
        "line.",
        "No op takes time in this plan.", os);
  chart("Memory per device", memoryChart(a),
        "Resident at the worst moment of the step, by kind, against the device's capacity and the "
        "memory budget.",
        "", os);
  chart("FLOPs and time by block", blocksChart(a),
        "Model FLOPs and time per step of each top-level block.", "The model has no blocks.", os);
  chart("Activation checkpointing", checkpointChart(a),
        "Recompute FLOPs against activation memory for each number of checkpointed blocks; the "
        "red point is the plan's choice.",
        "checkpoint = " + a.checkpoint.requested +
            ": only checkpoint = auto weighs the trade-off, so there is no curve to draw.",
        os);

  if (a.plan->isTrain && a.plan->parallel.pipeline > 1)
    chart("Pipeline schedule", pipelineChart(a),
          "Each row is a pipeline stage; boxes are the forward and backward of one micro-batch "
          "(numbered), gaps are the bubble: " +
              formatDuration(a.pipeline.bubble) + " idle per stage in the " +
              std::to_string(a.pipeline.shownMicroBatches) + " micro-batches drawn.",
          a.plan->parallel.interleave > 1 && a.plan->parallel.pipeline > 1 &&
                  a.time.accumulationSteps % a.plan->parallel.pipeline != 0
              ? "The interleaved schedule runs micro-batches in rounds of the pipeline's size; "
                "this plan's micro-batch count is not a multiple of it, so there is no schedule "
                "to draw."
              : "Pipelines of more than 512 stages or 64 chunks per stage are not drawn.",
          os);

  for (const ReportTable &t : c.tables)
    table(t, os);
  os << "</body>\n</html>\n";
}

} // namespace tally
