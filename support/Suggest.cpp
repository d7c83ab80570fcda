// Name suggestions for "unknown ..." diagnostics: the closest candidate by edit distance (a
// swap of two adjacent letters counts as one typo, a change of case as none). Every layer that
// reports an unknown name (Sema, the lowering, the CLI's flags, `tally explain`) uses these.
#include "support/Suggest.h"

#include <algorithm>

namespace tally {

/// True when `a` becomes `b` by swapping two adjacent characters ("GTP2" and "GPT2").
static bool isTransposition(llvm::StringRef a, llvm::StringRef b) {
  if (a.size() != b.size() || a.size() < 2)
    return false;
  size_t i = 0;
  while (i < a.size() && a[i] == b[i])
    ++i;
  return i + 1 < a.size() && a[i] == b[i + 1] && a[i + 1] == b[i] &&
         a.substr(i + 2) == b.substr(i + 2);
}

std::string closestName(llvm::StringRef name, const std::vector<std::string> &candidates) {
  std::string best;
  unsigned bestDist = ~0u;
  unsigned limit = std::max<unsigned>(1, name.size() / 3);
  for (const std::string &c : candidates) {
    if (c == name)
      continue;
    unsigned d = name.edit_distance(c, true, limit + 1);
    if (isTransposition(name, c))
      d = 1; // a swap is one typo, not two replacements
    if (llvm::StringRef(c).equals_insensitive(name))
      d = 0;
    if (d <= limit && d < bestDist) {
      bestDist = d;
      best = c;
    }
  }
  return best;
}

std::string didYouMean(const std::string &close) {
  return close.empty() ? "" : "; did you mean '" + close + "'?";
}

} // namespace tally
