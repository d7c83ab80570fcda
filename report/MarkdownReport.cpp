// The Markdown report: the same tables as the text report (report/Sections.cpp) as Markdown,
// for pull requests and notebooks.
#include "report/Report.h"
#include "report/Sections.h"

namespace tally {

namespace {

std::string escape(const std::string &s) {
  std::string out;
  for (char c : s) {
    if (c == '|' || c == '*' || c == '_' || c == '[' || c == ']')
      out += '\\';
    out += c;
  }
  return out;
}

} // namespace

void renderMarkdown(const Analysis &a, llvm::raw_ostream &os) {
  ReportContent c = buildReport(a);
  os << "# " << escape(c.headline) << "\n\n";
  for (const std::string &s : c.settings)
    os << "- " << escape(s) << "\n";
  os << "\n";
  for (const ReportTable &t : c.tables) {
    os << "## " << t.title << "\n\n|";
    for (const std::string &h : t.header)
      os << " " << escape(h) << " |";
    os << "\n|";
    for (size_t i = 0; i < t.header.size(); ++i)
      os << (i == 0 ? " --- |" : " ---: |");
    os << "\n";
    for (const auto &r : t.rows) {
      os << "|";
      for (const std::string &cell : r)
        os << " " << escape(cell) << " |";
      os << "\n";
    }
    os << "\n";
    for (const std::string &n : t.notes)
      os << escape(n) << "\n\n";
  }
}

} // namespace tally
