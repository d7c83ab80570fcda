// The content of the people-facing reports (text and Markdown) as titled tables of
// formatted cells, built once from an Analysis. The text and Markdown renderers only lay these
// tables out, so both always say the same thing.
#pragma once

#include "passes/Analysis.h"

#include <string>
#include <vector>

namespace tally {

struct ReportTable {
  std::string title;
  std::vector<std::string> header;            ///< column names; empty for label/value tables
  std::vector<std::vector<std::string>> rows; ///< formatted cells
  std::vector<std::string> notes;             ///< sentences printed under the table
};

struct ReportContent {
  std::string headline;                       ///< "train gpt2_124M: model GPT2 on 8 × H100_SXM ..."
  std::vector<std::string> settings;          ///< one line each: batch, precision, optimizer
  std::vector<ReportTable> tables;
};

/// Formats the analysis into tables: parameters by block, FLOPs (with 6ND), memory per device
/// by kind, the ten most expensive ops with their bound, time (step, MFU, run), inference.
ReportContent buildReport(const Analysis &a);

/// 1234567 → "1,234,567"; numbers past 2^53 or with fractions in e-notation.
std::string groupDigits(double v);

} // namespace tally
