// Svg.h — a small SVG writer and the axis scales the HTML report's charts are drawn with.
//
// Charts are plain SVG 1.1 elements written as text: no script, no external reference, so
// the page reads in any browser offline. Every data mark can carry a <title>, which browsers
// show as a hover tooltip. Coordinates are pixels, printed with one decimal.
#pragma once

#include "llvm/ADT/StringRef.h"

#include <string>
#include <utility>
#include <vector>

namespace tally {

/// Escapes &, <, >, " and ' for XML text and attribute values.
std::string xmlEscape(llvm::StringRef s);

/// One SVG element tree being written; str() closes it.
class Svg {
public:
  /// An <svg> of `width` × `height` pixels with the given id, an accessible <title>, and a
  /// data-series-colors attribute listing the colours of its data marks (for tests).
  Svg(double width, double height, llvm::StringRef id, llvm::StringRef title,
      const std::vector<std::string> &seriesColors);

  /// A filled rectangle; `tooltip` becomes a <title> child when not empty.
  void rect(double x, double y, double w, double h, llvm::StringRef fill,
            llvm::StringRef tooltip = "", llvm::StringRef cls = "");
  /// A straight line; `dash` is a stroke-dasharray such as "6 4" (empty: solid).
  void line(double x1, double y1, double x2, double y2, llvm::StringRef stroke, double width = 1,
            llvm::StringRef dash = "", llvm::StringRef cls = "");
  /// A filled circle with an optional tooltip.
  void circle(double cx, double cy, double r, llvm::StringRef fill, llvm::StringRef tooltip = "",
              llvm::StringRef cls = "");
  /// An open polyline through the points.
  void polyline(const std::vector<std::pair<double, double>> &points, llvm::StringRef stroke,
                double width = 1.5, llvm::StringRef cls = "");
  /// Text at (x, y); `anchor` is start, middle or end; `rotate` turns it about (x, y).
  void text(double x, double y, llvm::StringRef s, llvm::StringRef anchor = "start",
            double size = 12, llvm::StringRef fill = "#222", double rotate = 0);

  /// The finished element.
  std::string str() const;

private:
  std::string body_;
  std::string open_;
};

/// A base-10 logarithmic axis: whole decades [10^lo, 10^hi] onto pixels [p0, p1].
struct LogScale {
  int lo = 0, hi = 1;
  double p0 = 0, p1 = 1;
  /// The decades that cover [vmin, vmax] (both > 0), at least one wide.
  static LogScale covering(double vmin, double vmax, double p0, double p1);
  /// The pixel of v (> 0); values outside the decades map outside [p0, p1].
  double operator()(double v) const;
};

/// A linear axis from 0 to a "nice" maximum at or above vmax, onto pixels [p0, p1].
struct LinearScale {
  double max = 1, step = 1;
  double p0 = 0, p1 = 1;
  /// max is the smallest multiple of a 1-2-5 step with about five steps that reaches vmax.
  static LinearScale upTo(double vmax, double p0, double p1);
  double operator()(double v) const;
};

} // namespace tally
