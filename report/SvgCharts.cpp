// SvgCharts.cpp — the four charts of the HTML report (see SvgCharts.h).
//
// Each chart is a fixed-size SVG: a plot area with axes, the data marks with hover titles, and
// labels. Sizes are in pixels; the page lays the charts out one under another.
#include "report/SvgCharts.h"
#include "support/Format.h"

#include "report/Copies.h"
#include "report/Svg.h"

#include "ir/Units.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/Path.h"

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdio>

namespace tally {

namespace {

constexpr double kWidth = 760;
constexpr const char *kGrid = "#e3e3e3";
constexpr const char *kAxis = "#555";
constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

/// A tick label: at most four significant digits, no trailing zeros ("0.01", "20", "1e+06").
std::string chartNumber(double v) { return significant(v, 4); }

/// 10^k as a short number: 0.01, 1, 1000, 1e+06.
std::string decade(int k) { return chartNumber(std::pow(10.0, k)); }

/// A legend entry: a coloured square and its text.
void legend(Svg &s, double x, double y, llvm::StringRef color, llvm::StringRef label) {
  s.rect(x, y - 9, 10, 10, color, "", "legend");
  s.text(x + 14, y, label, "start", 11);
}

/// A label centred at x, kept inside the chart: one that would run past the right edge ends
/// there instead (tick labels at the axis' end; text taken as 0.6 of its size a character).
void centred(Svg &s, double x, double y, llvm::StringRef text, double size) {
  double half = 0.3 * size * static_cast<double>(text.size());
  if (x + half > kWidth - 2)
    s.text(kWidth - 2, y, text, "end", size);
  else
    s.text(x, y, text, "middle", size);
}

/// The width a legend entry takes, with room after it: the square, and the label at 11 px
/// sans-serif taken as 6.6 px a character (wider than DejaVu Sans' digits and lower case, so
/// an estimate errs towards room; tests/html/check_html.py measures the rendered text).
double legendWidth(llvm::StringRef label) { return 14 + 6.6 * static_cast<double>(label.size()) + 24; }

} // namespace

std::string rooflineChart(const Analysis &a, const DiagnosticEngine &diags) {
  const Graph &g = *a.graph;
  const Target &t = a.plan->target;
  double bw = t.bandwidth, peak = a.peakFlops;
  if (!(bw > 0) || !(peak > 0))
    return "";

  // One point per op pattern: the first copy stands for all (the copies are identical).
  struct Point {
    OpId op;
    unsigned copies = 0;
    double rate = 0;
  };
  std::vector<Point> points;
  CopyGroups copies = opCopies(g, instanceCopies(g));
  std::vector<size_t> index(copies.groups.size(), SIZE_MAX); // a group's point
  double xmin = a.ridge > 0 ? a.ridge : peak / bw, xmax = xmin, ymin = peak, ymax = peak;
  for (OpId i = 0; i < g.ops.size() && i < a.ops.size(); ++i) {
    const OpAnalysis &o = a.ops[i];
    if (!(o.forwardTime > 0) || !(o.intensity() > 0) || !(o.forward.executedFlops > 0))
      continue;
    size_t &at = index[copies.of[i]];
    if (at == SIZE_MAX) {
      at = points.size();
      double split = o.tensorSplit > 0 ? o.tensorSplit : 1;
      points.push_back({i, 0, o.forward.executedFlops / split / o.forwardTime});
      xmin = std::min(xmin, o.intensity());
      xmax = std::max(xmax, o.intensity());
      ymin = std::min(ymin, points.back().rate);
    }
    ++points[at].copies;
  }
  if (points.empty())
    return "";

  const double H = 460, left = 100, right = kWidth - 30, top = 30, bottom = H - 60;
  LogScale xs = LogScale::covering(xmin / 2, xmax * 2, left, right);
  LogScale ys = LogScale::covering(ymin / 2, ymax * 2, bottom, top);
  bool anyLaunchBound = false;
  for (const Point &p : points)
    anyLaunchBound = anyLaunchBound || a.ops[p.op].launchBound;
  std::vector<std::string> series = {chartcolor::ComputeBound, chartcolor::MemoryBound};
  if (anyLaunchBound)
    series.push_back(chartcolor::LaunchBound);
  Svg s(kWidth, H, "roofline", "Roofline of " + t.name, series);

  // Grid and axes: one line per decade.
  for (int k = xs.lo; k <= xs.hi; ++k) {
    s.line(xs(std::pow(10.0, k)), top, xs(std::pow(10.0, k)), bottom, kGrid);
    centred(s, xs(std::pow(10.0, k)), bottom + 16, decade(k), 11);
  }
  int ystep = ys.hi - ys.lo > 8 ? 2 : 1;
  for (int k = ys.lo; k <= ys.hi; ++k) {
    s.line(left, ys(std::pow(10.0, k)), right, ys(std::pow(10.0, k)), kGrid);
    if ((k - ys.lo) % ystep == 0)
      s.text(left - 6, ys(std::pow(10.0, k)) + 4, formatRate(std::pow(10.0, k), UnitDim::FlopRate),
             "end", 11);
  }
  s.line(left, bottom, right, bottom, kAxis);
  s.line(left, top, left, bottom, kAxis);
  s.text((left + right) / 2, H - 18, "arithmetic intensity (FLOP/byte, forward)", "middle", 12);
  s.text(18, (top + bottom) / 2, "attained FLOP/s", "middle", 12, "#222", -90);

  // The ceilings: bandwidth × intensity up to the ridge, then the compute rate.
  double knee = peak / bw;
  double x0 = std::max(std::pow(10.0, xs.lo), std::pow(10.0, ys.lo) / bw);
  double xEnd = std::pow(10.0, xs.hi);
  if (x0 < knee)
    s.line(xs(x0), ys(bw * x0), xs(std::min(knee, xEnd)), ys(bw * std::min(knee, xEnd)), "#333", 2.5,
           "", "ceiling memory-ceiling");
  if (knee < xEnd)
    s.line(xs(std::max(knee, std::pow(10.0, xs.lo))), ys(peak), xs(xEnd), ys(peak), "#333", 2.5, "",
           "ceiling compute-ceiling");
  // Above the rising memory ceiling, ending on it: the line is below the whole label (it rises
  // to the right) and the ops are under the ceiling. The label's right end sits halfway along
  // the ceiling, or further right when the label would run past the y axis.
  if (x0 < knee) {
    std::string label = "memory " + formatRate(bw, UnitDim::ByteRate);
    double xa = xs(x0), xb = xs(std::min(knee, xEnd));
    double xe = std::min(xb, std::max((xa + xb) / 2, left + 10 + 6.6 * label.size()));
    double ye = ys(bw * x0) + (ys(bw * std::min(knee, xEnd)) - ys(bw * x0)) * (xe - xa) / std::max(1.0, xb - xa);
    s.text(xe - 6, ye - 8, label, "end", 11);
  }
  s.text(right - 4, ys(peak) - 6, "compute " + formatRate(peak, UnitDim::FlopRate), "end", 11);
  if (a.ridge > 0) {
    s.line(xs(a.ridge), top, xs(a.ridge), bottom, "#999", 1, "5 4", "ridge");
    s.text(xs(a.ridge) + 4, bottom - 8, llvm::formatv("ridge {0:f1} FLOP/byte", a.ridge).str(),
           "start", 11, "#666");
  }

  // The ops.
  for (const Point &p : points) {
    const Op &op = g.ops[p.op];
    const OpAnalysis &o = a.ops[p.op];
    std::string file;
    unsigned line = 0, column = 0;
    diags.position(op.range.Start, file, line, column);
    // The file too: an op written in the standard library (Linear's matmul) points there.
    std::string where = line ? ", " + llvm::sys::path::filename(file).str() + " line " +
                                   std::to_string(line)
                             : "";
    std::string tip = repeatPattern(g.opPath(op)) + (p.copies > 1 ? " ×" + std::to_string(p.copies) : "") +
                      " (" + opName(op.kind).str() + where + "): " +
                      llvm::formatv("{0:f1} FLOP/byte, ", o.intensity()).str() +
                      formatRate(p.rate, UnitDim::FlopRate) + ", " +
                      (o.launchBound    ? "launch-bound (its work is shorter than its launch)"
                       : o.computeBound ? "compute-bound"
                                        : "memory-bound") +
                      ", forward " + formatDuration(o.forwardTime);
    s.circle(xs(o.intensity()), ys(p.rate), 4.5,
             o.launchBound    ? chartcolor::LaunchBound
             : o.computeBound ? chartcolor::ComputeBound
                              : chartcolor::MemoryBound,
             tip, "op");
  }
  legend(s, left + 12, top + 16, chartcolor::ComputeBound, "compute-bound op");
  legend(s, left + 12, top + 32, chartcolor::MemoryBound, "memory-bound op");
  if (anyLaunchBound)
    legend(s, left + 12, top + 48, chartcolor::LaunchBound, "launch-bound op");
  return s.str();
}

std::string memoryChart(const Analysis &a) {
  const Plan &p = *a.plan;
  struct Part {
    const char *kind;
    double bytes;
    const char *color;
  };
  std::vector<Part> parts = {{"params", a.memory.params, "#4c72b0"}};
  if (p.isTrain) {
    parts.push_back({"grads", a.memory.grads + a.memory.gradAccum, "#dd8452"});
    parts.push_back({"master weights", a.memory.master, "#937860"});
    parts.push_back({"optimizer state", a.memory.optimizer, "#8172b3"});
    if (a.memory.zeroGathered + a.memory.unshardedGrads > 0)
      parts.push_back({"ZeRO transients", a.memory.zeroGathered + a.memory.unshardedGrads, "#c44e52"});
  }
  parts.push_back({"activations", a.memory.activations, "#55a868"});
  parts.push_back({"workspace", a.memory.workspace, "#da8bc3"});
  double framework = unallocatedBytes(a) + a.memory.allocatorReserve;
  if (framework > 0)
    parts.push_back({"framework", framework, "#8c8c8c"});
  double budget = 0;
  for (const BudgetSpec &b : p.budgets)
    if (b.metric == BudgetMetric::MemoryPerDevice)
      budget = b.value;
  double capacity = p.target.memoryBytes;

  const double left = 90, right = kWidth - 30, barTop = 58, barH = 40;
  LinearScale xs = LinearScale::upTo(std::max({a.memory.peak, capacity, budget}) / kGiB, left, right);
  // A peak under a tenth of the axis would be a sliver: a second bar shows it zoomed.
  bool zoom = a.memory.peak > 0 && a.memory.peak < 0.1 * xs.max * kGiB;
  const double zoomTop = barTop + barH + 44;
  // The legend: entries left to right, a new row where the next would pass the right edge.
  struct Entry {
    double x;
    int row;
  };
  std::vector<Entry> entries;
  std::vector<std::string> labels;
  double lx = left;
  int rowsOfLegend = 1;
  for (const Part &part : parts) {
    labels.push_back(std::string(part.kind) + " " + formatBytes(part.bytes));
    if (lx > left && lx + legendWidth(labels.back()) - 24 > kWidth - 10) {
      lx = left;
      ++rowsOfLegend;
    }
    entries.push_back({lx, rowsOfLegend - 1});
    lx += legendWidth(labels.back());
  }
  const double legendTop = (zoom ? zoomTop + barH + 40 : barTop + barH + 50);
  const double H = legendTop + 18 * rowsOfLegend + 8;
  std::vector<std::string> colors;
  for (const Part &part : parts)
    colors.push_back(part.color);
  Svg s(kWidth, H, "memory", "Memory per device on " + p.target.name, colors);

  for (double v = 0; v <= xs.max + xs.step / 2; v += xs.step) {
    s.line(xs(v), barTop - 8, xs(v), barTop + barH + 8, kGrid);
    centred(s, xs(v), barTop + barH + 22, chartNumber(v) + " GiB", 11);
  }
  s.text(left - 8, barTop + barH / 2 + 4, "per device", "end", 12);
  double x = 0;
  for (const Part &part : parts) {
    if (part.bytes > 0)
      s.rect(xs(x / kGiB), barTop, xs((x + part.bytes) / kGiB) - xs(x / kGiB), barH, part.color,
             std::string(part.kind) + ": " + formatBytes(part.bytes), "segment");
    x += part.bytes;
  }
  s.line(xs(a.memory.peak / kGiB), barTop - 4, xs(a.memory.peak / kGiB), barTop + barH + 4, "#222", 1.5);
  centred(s, xs(a.memory.peak / kGiB), barTop - 8, "peak " + formatBytes(a.memory.peak), 11);
  if (capacity > 0) {
    s.line(xs(capacity / kGiB), barTop - 14, xs(capacity / kGiB), barTop + barH + 10, "#000", 2.5,
           "", "capacity");
    s.text(xs(capacity / kGiB), barTop - 18, "capacity " + formatBytes(capacity), "end", 11);
  }
  if (budget > 0) {
    s.line(xs(budget / kGiB), barTop - 28, xs(budget / kGiB), barTop + barH + 10, "#c00", 2, "6 3",
           "budget");
    s.text(xs(budget / kGiB), barTop - 32, "budget " + formatBytes(budget), "end", 11, "#c00");
  }
  if (zoom) {
    s.text(left - 8, zoomTop + barH / 2 - 2, "zoomed", "end", 12);
    s.text(left - 8, zoomTop + barH / 2 + 12, "to the peak", "end", 11);
    double z = 0;
    for (const Part &part : parts) {
      if (part.bytes > 0)
        s.rect(left + z / a.memory.peak * (right - left), zoomTop,
               part.bytes / a.memory.peak * (right - left), barH, part.color,
               std::string(part.kind) + ": " + formatBytes(part.bytes), "segment");
      z += part.bytes;
    }
    centred(s, left, zoomTop + barH + 14, "0", 11);
    centred(s, right, zoomTop + barH + 14, formatBytes(a.memory.peak), 11);
  }
  for (size_t i = 0; i < parts.size(); ++i)
    legend(s, entries[i].x, legendTop + 18 * entries[i].row, parts[i].color, labels[i]);
  return s.str();
}

std::string blocksChart(const Analysis &a) {
  if (a.params.byBlock.empty())
    return "";
  struct Row {
    std::string label;
    double forward, backward, time;
  };
  std::vector<Row> rows;
  const Analysis::BlockCount &model = a.params.byBlock.front();
  for (const Analysis::BlockCount &b : a.params.byBlock) {
    const Instance &in = a.graph->instances[b.instance];
    if (in.depth == 1)
      rows.push_back({a.graph->instancePath(b.instance) + " (" + *in.block + ")", b.forwardFlops, b.backwardFlops, b.time});
  }
  if (model.selfForwardFlops + model.selfBackwardFlops > 0)
    rows.push_back({"(model's own ops)", model.selfForwardFlops, model.selfBackwardFlops,
                    model.selfTime});
  // What the step spends outside the blocks' ops: time only, no FLOPs.
  if (a.plan->isTrain) {
    if (a.time.communication > 0)
      rows.push_back({"(communication)", 0, 0, a.time.communication});
    if (a.time.bubble > 0)
      rows.push_back({"(pipeline bubble)", 0, 0, a.time.bubble});
  }
  if (rows.empty())
    return "";
  double fmax = 0, tmax = 0;
  for (const Row &r : rows) {
    fmax = std::max(fmax, r.forward + r.backward);
    tmax = std::max(tmax, r.time);
  }
  const double rowH = 24, top = 44, labelW = 190, gap = 70;
  const double H = top + rows.size() * rowH + 40;
  const double f0 = labelW, f1 = f0 + 250, t0 = f1 + gap, t1 = kWidth - 30;
  LinearScale fs = LinearScale::upTo(fmax, f0, f1), ts = LinearScale::upTo(tmax, t0, t1);
  Svg s(kWidth, H, "blocks", "FLOPs and time by block",
        {chartcolor::Forward, chartcolor::Backward, chartcolor::Time});
  s.text(f0, 16, a.plan->isTrain ? "FLOPs per step" : "FLOPs", "start", 12);
  legend(s, f0 + 100, 16, chartcolor::Forward, "forward");
  legend(s, f0 + 170, 16, chartcolor::Backward, "backward");
  s.text(t0, 16, a.plan->isTrain ? "time per step, one device" : "time of the prefill, one device", "start", 12);
  double bottom = top + rows.size() * rowH;
  for (const auto &[scale, lo, hi, isTime] :
       {std::tuple<LinearScale, double, double, bool>{fs, f0, f1, false},
        std::tuple<LinearScale, double, double, bool>{ts, t0, t1, true}}) {
    for (double v = 0; v <= scale.max + scale.step / 2; v += scale.step * 2) {
      s.line(scale(v), top - 6, scale(v), bottom, kGrid);
      centred(s, scale(v), bottom + 16, isTime ? formatDuration(v) : formatFlops(v), 10);
    }
    s.line(lo, bottom, hi, bottom, kAxis);
  }
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row &r = rows[i];
    double y = top + i * rowH + 3, h = rowH - 8;
    std::string label = r.label.size() > 30 ? r.label.substr(0, 29) + "…" : r.label;
    s.text(f0 - 8, y + h - 4, label, "end", 11);
    if (r.forward + r.backward > 0) { // communication and the bubble have time only
      s.rect(fs(0), y, fs(r.forward) - fs(0), h, chartcolor::Forward,
             r.label + ": forward " + formatFlops(r.forward), "bar");
      s.rect(fs(r.forward), y, fs(r.forward + r.backward) - fs(r.forward), h, chartcolor::Backward,
             r.label + ": backward " + formatFlops(r.backward), "bar");
    }
    s.rect(ts(0), y, ts(r.time) - ts(0), h, chartcolor::Time,
           r.label + ": " + formatDuration(r.time), "bar");
  }
  return s.str();
}

std::string checkpointChart(const Analysis &a) {
  const auto &c = a.checkpoint;
  if (c.options.empty())
    return "";
  double fmax = 0, bmax = c.limitBytes;
  for (const auto &o : c.options) {
    fmax = std::max(fmax, o.recomputeFlops);
    bmax = std::max(bmax, o.bytes);
  }
  const double H = 380, left = 90, right = kWidth - 30, top = 30, bottom = H - 60;
  LinearScale xs = LinearScale::upTo(fmax, left, right);
  LinearScale ys = LinearScale::upTo(bmax / kGiB, bottom, top);
  Svg s(kWidth, H, "checkpoint", "Activation checkpointing trade-off",
        {chartcolor::Curve, chartcolor::Chosen});
  for (double v = 0; v <= xs.max + xs.step / 2; v += xs.step) {
    s.line(xs(v), top, xs(v), bottom, kGrid);
    centred(s, xs(v), bottom + 16, formatFlops(v), 11);
  }
  for (double v = 0; v <= ys.max + ys.step / 2; v += ys.step) {
    s.line(left, ys(v), right, ys(v), kGrid);
    s.text(left - 6, ys(v) + 4, chartNumber(v) + " GiB", "end", 11);
  }
  s.line(left, bottom, right, bottom, kAxis);
  s.line(left, top, left, bottom, kAxis);
  s.text((left + right) / 2, H - 18, "recompute FLOPs per step", "middle", 12);
  s.text(18, (top + bottom) / 2, "activations + workspace per device", "middle", 12, "#222", -90);
  if (c.limitBytes > 0) {
    s.line(left, ys(c.limitBytes / kGiB), right, ys(c.limitBytes / kGiB), "#c00", 1.5, "6 3", "limit");
    s.text(right - 4, ys(c.limitBytes / kGiB) - 6, "memory left for activations " + formatBytes(c.limitBytes),
           "end", 11, "#c00");
  }
  // The curve: store-all, partial counts and full, in order of blocks recomputed; sqrt apart.
  std::vector<std::pair<double, double>> curve;
  for (const auto &o : c.options)
    if (o.policy != "sqrt")
      curve.push_back({xs(o.recomputeFlops), ys(o.bytes / kGiB)});
  std::sort(curve.begin(), curve.end());
  s.polyline(curve, chartcolor::Curve, 2, "curve");
  for (const auto &o : c.options) {
    bool chosen = o.policy == c.policy && o.checkpointed == c.checkpointed;
    std::string tip = o.policy + ": " + std::to_string(o.checkpointed) + " of " +
                      std::to_string(c.blocks) + " blocks recomputed, " +
                      formatFlops(o.recomputeFlops) + " recompute, " + formatBytes(o.bytes) +
                      (chosen ? " (chosen)" : "");
    if (chosen)
      continue;
    s.circle(xs(o.recomputeFlops), ys(o.bytes / kGiB), o.policy == "sqrt" ? 5 : 3.5,
             o.policy == "sqrt" ? "#999" : chartcolor::Curve, tip, "option");
  }
  for (const auto &o : c.options)
    if (o.policy == c.policy && o.checkpointed == c.checkpointed) {
      std::string tip = "chosen: " + o.policy + ", " + std::to_string(o.checkpointed) + " of " +
                        std::to_string(c.blocks) + " blocks recomputed, " +
                        formatFlops(o.recomputeFlops) + " recompute, " + formatBytes(o.bytes);
      s.circle(xs(o.recomputeFlops), ys(o.bytes / kGiB), 7, chartcolor::Chosen, tip, "chosen");
      double lx = xs(o.recomputeFlops) + 10;
      bool nearRight = lx > right - 120;
      s.text(nearRight ? lx - 20 : lx, ys(o.bytes / kGiB) - 10, "chosen: " + o.policy,
             nearRight ? "end" : "start", 12, chartcolor::Chosen);
      break;
    }
  return s.str();
}

std::string pipelineChart(const Analysis &a) {
  const auto &pl = a.pipeline;
  if (pl.slots.empty() || pl.makespan <= 0)
    return "";
  const double left = 80, right = kWidth - 20, top = 40;
  const double rowH = std::clamp(360.0 / static_cast<double>(pl.stages), 6.0, 26.0);
  const double bottom = top + rowH * static_cast<double>(pl.stages);
  const double H = bottom + 50;
  LinearScale xs = LinearScale::upTo(pl.makespan, left, right);
  Svg s(kWidth, H, "pipeline", "Pipeline schedule", {chartcolor::Forward, chartcolor::Backward});
  legend(s, left, 16, chartcolor::Forward, "forward");
  legend(s, left + 80, 16, chartcolor::Backward,
         a.time.recompute > 0 ? "backward (with recompute)" : "backward");
  std::string shown = std::to_string(pl.shownMicroBatches) + " of " +
                      std::to_string(pl.microBatches) + " micro-batches";
  s.text(right, 16, pl.shownMicroBatches < pl.microBatches ? shown + " shown" : shown, "end", 11);
  for (double v = 0; v <= xs.max + xs.step / 2; v += xs.step) {
    s.line(xs(v), top - 4, xs(v), bottom, kGrid);
    centred(s, xs(v), bottom + 16, formatDuration(v), 10);
  }
  s.line(left, bottom, right, bottom, kAxis);
  s.text((left + right) / 2, H - 8, "time from the start of the step", "middle", 12);
  // Stage labels: every row when they fit, else every k-th.
  int64_t every = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(12.0 / rowH)));
  for (int64_t st = 0; st < pl.stages; st += every)
    s.text(left - 6, top + rowH * (static_cast<double>(st) + 0.5) + 4, "stage " + std::to_string(st),
           "end", std::min(11.0, rowH));
  for (const Analysis::PipelineSlot &slot : pl.slots) {
    double x = xs(slot.start), w = std::max(0.5, xs(slot.end) - xs(slot.start));
    double y = top + rowH * slot.stage + 1, h = rowH - 2;
    std::string what = std::string(slot.backward ? "backward" : "forward") + " of micro-batch " +
                       std::to_string(slot.microBatch) +
                       (pl.interleave > 1 ? ", chunk " + std::to_string(slot.chunk) : "");
    s.rect(x, y, w, h, slot.backward ? chartcolor::Backward : chartcolor::Forward,
           "stage " + std::to_string(slot.stage) + ": " + what + ", " + formatDuration(slot.start) +
               " to " + formatDuration(slot.end),
           "slot");
    if (w >= 14 && h >= 10)
      s.text(x + w / 2, y + h / 2 + 4, std::to_string(slot.microBatch), "middle",
             std::min(10.0, h - 2), "#fff");
  }
  return s.str();
}

} // namespace tally
