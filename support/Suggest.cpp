// Name suggestions for "unknown ..." diagnostics: the closest candidate by edit distance (a
// swap of two adjacent letters counts as one typo, a change of case as none). Every layer that
// reports an unknown name (Sema, the lowering, the CLI's flags, `tally explain`) uses these.
#include "support/Suggest.h"

#include "llvm/ADT/SmallVector.h"

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

/// The optimal-string-alignment distance: insertions, deletions, replacements and swaps of two
/// adjacent letters each cost one ("baises" is one typo from "biases", two from "bias").
static unsigned typoDistance(llvm::StringRef a, llvm::StringRef b) {
  std::vector<std::vector<unsigned>> d(a.size() + 1, std::vector<unsigned>(b.size() + 1));
  for (size_t i = 0; i <= a.size(); ++i)
    d[i][0] = static_cast<unsigned>(i);
  for (size_t j = 0; j <= b.size(); ++j)
    d[0][j] = static_cast<unsigned>(j);
  for (size_t i = 1; i <= a.size(); ++i)
    for (size_t j = 1; j <= b.size(); ++j) {
      d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1,
                          d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0u : 1u)});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
    }
  return d[a.size()][b.size()];
}

/// A name's words, lower-cased, without '_' and sorted: "bf16_mixed" and "mixed_bf16" (words in
/// another order), "adam_w" and "AdamW" (a separator more) are the same name written otherwise.
static std::string canonical(llvm::StringRef name) {
  llvm::SmallVector<llvm::StringRef, 4> words;
  name.split(words, '_', -1, false);
  std::vector<std::string> lower;
  for (llvm::StringRef w : words)
    lower.push_back(w.lower());
  std::sort(lower.begin(), lower.end());
  std::string out;
  for (const std::string &w : lower)
    out += w;
  return out;
}

/// closestName within `limit` typos.
static std::string closestWithin(llvm::StringRef name, const std::vector<std::string> &candidates,
                                 unsigned limit) {
  std::string best;
  unsigned bestDist = ~0u;
  std::string canon = canonical(name);
  for (const std::string &c : candidates) {
    if (c == name)
      continue;
    unsigned d = name.size() > 64 || c.size() > 64 ? name.edit_distance(c, true, limit + 1)
                                                   : typoDistance(name, c);
    if (isTransposition(name, c))
      d = 1; // a swap is one typo, not two replacements
    // The same words in another order, each with its own typos ("bf16_mixde"): the typos plus
    // one for the order.
    std::string cc = canonical(c);
    if (cc == canon)
      d = std::min(d, 1u);
    else if (cc.size() <= 64 && canon.size() <= 64 && c.find('_') != std::string::npos)
      d = std::min(d, typoDistance(canon, cc) + 1);
    if (llvm::StringRef(c).equals_insensitive(name))
      d = 0;
    // Among equally close names, a swap of letters is the likelier typo ("fb16": bf16, not f16).
    bool better = d < bestDist || (d == bestDist && isTransposition(name, c) &&
                                    !isTransposition(name, best));
    if (d <= limit && better) {
      bestDist = d;
      best = c;
    }
  }
  return best;
}

std::string closestName(llvm::StringRef name, const std::vector<std::string> &candidates) {
  // A third of the name's letters may be wrong; among a handful of candidates (a block's
  // parameters, a setting's values) half of them ("baises" is three typos from "bias").
  std::string best = closestWithin(name, candidates, std::max<unsigned>(1, name.size() / 3));
  if (best.empty() && candidates.size() <= 12 && name.size() >= 5)
    best = closestWithin(name, candidates, static_cast<unsigned>(name.size() / 2));
  return best;
}

std::string didYouMean(const std::string &close) {
  return close.empty() ? "" : "; did you mean '" + close + "'?";
}

std::string choiceList(const std::vector<std::string> &candidates) {
  std::string out;
  for (const std::string &c : candidates)
    out += (out.empty() ? "" : ", ") + c;
  return out;
}

} // namespace tally
