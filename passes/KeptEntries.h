// The newest few values a search priced, by key (AnalysisManager::keepLayoutFacts): the walks'
// layout facts (passes/ActivationFacts.cpp), the roofline's records (passes/Roofline.cpp) and
// the step time's per-op times (passes/StepTime.cpp). A found entry becomes the newest; adding
// one past `keep` drops the oldest. The layout search visits its candidates so that those
// sharing a key come one after another, so a few entries are enough (each is O(ops)).
#pragma once

#include <algorithm>
#include <cstddef>
#include <utility>
#include <vector>

namespace tally {

template <class Key, class Value> class KeptEntries {
public:
  explicit KeptEntries(size_t keep = 0) : keep_(keep) {}
  /// The value of the entry whose key `matches` (a predicate on a Key), made the newest; null
  /// when none does.
  template <class Matches> const Value *find(Matches matches) {
    for (auto it = entries_.begin(); it != entries_.end(); ++it)
      if (matches(it->first)) {
        std::rotate(it, it + 1, entries_.end());
        ++reused_;
        return &entries_.back().second;
      }
    return nullptr;
  }
  /// A new entry, the newest; the oldest goes when `keep` are kept already (none with keep 0).
  void add(Key key, Value value) {
    ++made_;
    if (keep_ == 0)
      return;
    if (entries_.size() >= keep_)
      entries_.erase(entries_.begin());
    entries_.emplace_back(std::move(key), std::move(value));
  }
  size_t made() const { return made_; }     ///< entries added (tests)
  size_t reused() const { return reused_; } ///< entries found (tests)

private:
  size_t keep_;
  std::vector<std::pair<Key, Value>> entries_; ///< the newest last
  size_t made_ = 0, reused_ = 0;
};

} // namespace tally
