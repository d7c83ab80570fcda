// Svg.cpp — the SVG writer and axis scales of Svg.h.
#include "report/Svg.h"

#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <cmath>

namespace tally {

namespace {

std::string px(double v) { return llvm::formatv("{0:f1}", v).str(); }

std::string titled(const std::string &open, llvm::StringRef tag, llvm::StringRef tooltip) {
  if (tooltip.empty())
    return open + "/>\n";
  return open + "><title>" + xmlEscape(tooltip) + "</title></" + tag.str() + ">\n";
}

std::string classAttr(llvm::StringRef cls) {
  return cls.empty() ? "" : " class=\"" + xmlEscape(cls) + "\"";
}

} // namespace

std::string xmlEscape(llvm::StringRef s) {
  std::string out;
  for (char c : s) {
    switch (c) {
    case '&': out += "&amp;"; break;
    case '<': out += "&lt;"; break;
    case '>': out += "&gt;"; break;
    case '"': out += "&quot;"; break;
    case '\'': out += "&#39;"; break;
    default: out += c;
    }
  }
  return out;
}

Svg::Svg(double width, double height, llvm::StringRef id, llvm::StringRef title,
         const std::vector<std::string> &seriesColors) {
  std::string colors;
  for (const std::string &c : seriesColors)
    colors += (colors.empty() ? "" : " ") + c;
  open_ = "<svg xmlns=\"http://www.w3.org/2000/svg\" id=\"" + xmlEscape(id) + "\" width=\"" +
          px(width) + "\" height=\"" + px(height) + "\" viewBox=\"0 0 " + px(width) + " " +
          px(height) + "\" role=\"img\" data-series-colors=\"" + xmlEscape(colors) +
          "\" font-family=\"sans-serif\">\n<title>" + xmlEscape(title) + "</title>\n";
}

void Svg::rect(double x, double y, double w, double h, llvm::StringRef fill,
               llvm::StringRef tooltip, llvm::StringRef cls) {
  body_ += titled("<rect x=\"" + px(x) + "\" y=\"" + px(y) + "\" width=\"" + px(std::max(w, 0.0)) +
                      "\" height=\"" + px(std::max(h, 0.0)) + "\" fill=\"" + xmlEscape(fill) + "\"" +
                      classAttr(cls),
                  "rect", tooltip);
}

void Svg::line(double x1, double y1, double x2, double y2, llvm::StringRef stroke, double width,
               llvm::StringRef dash, llvm::StringRef cls) {
  body_ += "<line x1=\"" + px(x1) + "\" y1=\"" + px(y1) + "\" x2=\"" + px(x2) + "\" y2=\"" +
           px(y2) + "\" stroke=\"" + xmlEscape(stroke) + "\" stroke-width=\"" + px(width) + "\"" +
           (dash.empty() ? "" : " stroke-dasharray=\"" + xmlEscape(dash) + "\"") +
           classAttr(cls) + "/>\n";
}

void Svg::circle(double cx, double cy, double r, llvm::StringRef fill, llvm::StringRef tooltip,
                 llvm::StringRef cls) {
  body_ += titled("<circle cx=\"" + px(cx) + "\" cy=\"" + px(cy) + "\" r=\"" + px(r) +
                      "\" fill=\"" + xmlEscape(fill) + "\" fill-opacity=\"0.8\"" + classAttr(cls),
                  "circle", tooltip);
}

void Svg::polyline(const std::vector<std::pair<double, double>> &points, llvm::StringRef stroke,
                   double width, llvm::StringRef cls) {
  std::string pts;
  for (const auto &[x, y] : points)
    pts += (pts.empty() ? "" : " ") + px(x) + "," + px(y);
  body_ += "<polyline points=\"" + pts + "\" fill=\"none\" stroke=\"" + xmlEscape(stroke) +
           "\" stroke-width=\"" + px(width) + "\"" + classAttr(cls) + "/>\n";
}

void Svg::text(double x, double y, llvm::StringRef s, llvm::StringRef anchor, double size,
               llvm::StringRef fill, double rotate) {
  body_ += "<text x=\"" + px(x) + "\" y=\"" + px(y) + "\" font-size=\"" + px(size) +
           "\" text-anchor=\"" + xmlEscape(anchor) + "\" fill=\"" + xmlEscape(fill) + "\"" +
           (rotate != 0 ? " transform=\"rotate(" + px(rotate) + " " + px(x) + " " + px(y) + ")\""
                        : "") +
           ">" + xmlEscape(s) + "</text>\n";
}

std::string Svg::str() const { return open_ + body_ + "</svg>\n"; }

LogScale LogScale::covering(double vmin, double vmax, double p0, double p1) {
  LogScale s;
  s.lo = static_cast<int>(std::floor(std::log10(vmin)));
  s.hi = static_cast<int>(std::ceil(std::log10(vmax)));
  if (s.hi <= s.lo)
    s.hi = s.lo + 1;
  s.p0 = p0;
  s.p1 = p1;
  return s;
}

double LogScale::operator()(double v) const {
  double t = (std::log10(v) - lo) / (hi - lo);
  return p0 + t * (p1 - p0);
}

LinearScale LinearScale::upTo(double vmax, double p0, double p1) {
  LinearScale s;
  s.p0 = p0;
  s.p1 = p1;
  if (!(vmax > 0)) {
    s.max = 1;
    s.step = 0.2;
    return s;
  }
  double raw = vmax / 5;
  double mag = std::pow(10, std::floor(std::log10(raw)));
  double step = mag;
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  s.step = step;
  s.max = std::ceil(vmax / step) * step;
  return s;
}

double LinearScale::operator()(double v) const { return p0 + v / max * (p1 - p0); }

} // namespace tally
