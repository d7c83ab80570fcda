// Name suggestions shared by every layer (support/Suggest.cpp).
#pragma once

#include "llvm/ADT/StringRef.h"

#include <string>
#include <vector>

namespace tally {

/// The closest string to `name` among `candidates` by edit distance (a swap of adjacent letters
/// one typo; the same words in another order, or with '_' or case changed, closest), or ""
/// when none is close.
std::string closestName(llvm::StringRef name, const std::vector<std::string> &candidates);
/// "a, b, c": the valid values of an enumerated setting, for a note after "unknown ...".
std::string choiceList(const std::vector<std::string> &candidates);
/// The tail of an "unknown ..." message: "; did you mean 'close'?", or "" when `close` is "".
std::string didYouMean(const std::string &close);

} // namespace tally
