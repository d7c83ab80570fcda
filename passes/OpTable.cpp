// Analysis::ops: per-op records shared between ops with equal values (passes/OpTable.h).
#include "passes/OpTable.h"

#include "ir/Graph.h"

#include <cstddef>
#include <cstring>

namespace tally {

static_assert(sizeof(OpAnalysis) == 136 && offsetof(OpAnalysis, unused) + 5 == offsetof(OpAnalysis, forwardTime) &&
                  offsetof(OpAnalysis, tensorSplit) + sizeof(double) == sizeof(OpAnalysis),
              "OpAnalysis has unnamed padding: records are compared and hashed as bytes");

namespace {
constexpr size_t kWords = sizeof(OpAnalysis) / sizeof(uint64_t);

uint64_t hashOf(const OpAnalysis &r) {
  uint64_t w[kWords];
  std::memcpy(w, &r, sizeof w);
  uint64_t h = 0;
  for (uint64_t x : w)
    h = (h ^ x) * 0x9e3779b97f4a7c15ull + (h >> 29);
  h ^= h >> 32;
  return h >= ~0ull - 1 ? h - 2 : h; // DenseMap's empty and tombstone keys are never a hash
}
} // namespace

bool OpTable::same(const OpAnalysis &x, const OpAnalysis &y) {
  return std::memcmp(&x, &y, sizeof(OpAnalysis)) == 0;
}

void OpTable::assign(size_t n) {
  *this = OpTable();
  if (n == 0)
    return;
  OpAnalysis empty;
  add(empty, hashOf(empty));
  holders_[0] = static_cast<uint32_t>(n);
  recordOf_.assign(n, 0);
}

uint32_t OpTable::find(const OpAnalysis &value, uint64_t hash) const {
  auto it = index_.find(hash);
  for (uint32_t r = it == index_.end() ? kNone : it->second; r != kNone; r = sameHash_[r])
    if (same(records_[r], value))
      return r;
  return kNone;
}

uint32_t OpTable::add(const OpAnalysis &value, uint64_t hash) {
  uint32_t r;
  if (!free_.empty()) {
    r = free_.back();
    free_.pop_back();
  } else {
    r = static_cast<uint32_t>(records_.size());
    records_.emplace_back();
    holders_.push_back(0);
    movedTo_.push_back(kNone);
    hash_.push_back(0);
    sameHash_.push_back(kNone);
  }
  records_[r] = value;
  holders_[r] = 0;
  movedTo_[r] = kNone;
  hash_[r] = hash;
  auto [it, inserted] = index_.try_emplace(hash, r);
  sameHash_[r] = inserted ? kNone : it->second;
  it->second = r; // first in its chain
  return r;
}

void OpTable::release(uint32_t r) {
  if (--holders_[r] != 0)
    return;
  auto it = index_.find(hash_[r]);
  if (it->second == r) {
    if (sameHash_[r] == kNone)
      index_.erase(it);
    else
      it->second = sameHash_[r];
  } else {
    uint32_t p = it->second;
    while (sameHash_[p] != r)
      p = sameHash_[p];
    sameHash_[p] = sameHash_[r];
  }
  free_.push_back(r);
}

bool OpTable::sameLayout(const OpTable &o) const {
  if (recordOf_ != o.recordOf_ || records_.size() != o.records_.size())
    return false;
  for (size_t r = 0; r < records_.size(); ++r)
    if (!same(records_[r], o.records_[r]))
      return false;
  return true;
}

void OpTable::set(size_t op, const OpAnalysis &value) {
  uint32_t from = recordOf_[op];
  if (same(records_[from], value))
    return;
  // Ops that repeat move together: the record the previous op with this record moved to.
  uint32_t to = movedTo_[from];
  if (to == kNone || holders_[to] == 0 || !same(records_[to], value)) {
    uint64_t hash = hashOf(value);
    to = find(value, hash);
    if (to == kNone)
      to = add(value, hash);
  }
  movedTo_[from] = to;
  ++holders_[to];
  recordOf_[op] = to;
  release(from);
}

size_t OpTable::distinct() const { return records_.size() - free_.size(); }

} // namespace tally
