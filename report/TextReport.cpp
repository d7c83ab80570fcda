// The text report: the report tables (report/Sections.cpp) laid out in aligned columns for a
// terminal, reading like a budget statement.
#include "report/Report.h"
#include "report/Sections.h"

#include "llvm/Support/ConvertUTF.h"

namespace tally {

namespace {

/// Display width of UTF-8 text (× and · are one column each).
size_t width(const std::string &s) {
  size_t n = 0;
  for (unsigned char c : s)
    n += (c & 0xC0) != 0x80;
  return n;
}

void pad(llvm::raw_ostream &os, const std::string &s, size_t w, bool right) {
  size_t n = width(s);
  if (right)
    os.indent(w > n ? w - n : 0) << s;
  else
    (os << s).indent(w > n ? w - n : 0);
}

void table(llvm::raw_ostream &os, const ReportTable &t) {
  os << t.title << "\n";
  std::vector<size_t> w(t.header.size(), 0);
  for (size_t i = 0; i < t.header.size(); ++i)
    w[i] = width(t.header[i]);
  for (const auto &r : t.rows)
    for (size_t i = 0; i < r.size() && i < w.size(); ++i)
      w[i] = std::max(w[i], width(r[i]));
  auto line = [&](const std::vector<std::string> &cells) {
    os << " ";
    for (size_t i = 0; i < cells.size(); ++i) {
      os << " ";
      // Text columns align left, number columns right (those whose header is not the first).
      bool last = i + 1 == cells.size();
      if (last && i > 0 && (t.header[i] == "note" || t.header[i] == "share of peak"))
        os << cells[i];
      else
        pad(os, cells[i], w[i], i > 0 && t.header[i] != "kind" && t.header[i] != "bound" &&
                                    t.header[i] != "note");
    }
    os << "\n";
  };
  line(t.header);
  for (const auto &r : t.rows)
    line(r);
  for (const std::string &n : t.notes)
    os << "  " << n << "\n";
  os << "\n";
}

} // namespace

void renderText(const Analysis &a, llvm::raw_ostream &os) {
  ReportContent c = buildReport(a);
  os << c.headline << "\n";
  for (const std::string &s : c.settings)
    os << "  " << s << "\n";
  os << "\n";
  for (const ReportTable &t : c.tables)
    table(os, t);
}

} // namespace tally
