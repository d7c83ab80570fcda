// A graph's list of records (its tensors, ops, parameters or instances), which may begin with
// another graph's records without copying them.
//
// The training step is the forward graph plus what autodiff and step assembly add, with the
// same ids (passes/Backward.cpp). It used to copy the forward graph's records: at 30,000
// layers that was a fifth of `check`'s memory and an eighth of its time (issue 12). Now the
// step's lists share the forward graph's: ids below the shared count are the forward graph's
// records, the rest the step's own. The shared part is the other graph's storage, read and
// written through either graph; transforms only append (passes never change a graph), so
// neither changes the other. Copying a Records copies every record it shows, so a copied
// graph is independent of the one it came from; only `extend` shares. A record is read
// through two cached addresses (no vector or shared_ptr indirection: passes index records
// billions of times), so shared storage never moves: a graph whose records are shared and
// that grows past its room moves to storage of its own first, leaving the sharer its own.
#pragma once

#include <algorithm>
#include <cassert>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <utility>
#include <vector>

namespace tally {

template <class T> class Records {
public:
  Records() = default;
  Records(const Records &other) { copyFrom(other); }
  Records(Records &&other) noexcept { swap(other); }
  Records &operator=(const Records &other) {
    if (this != &other) {
      Records fresh(other);
      swap(fresh);
    }
    return *this;
  }
  Records &operator=(Records &&other) noexcept {
    Records fresh(std::move(other));
    swap(fresh);
    return *this;
  }

  /// Records that begin with all of `base`'s (shared, not copied) and add their own after.
  /// A base that itself shares is copied instead (a step is never extended again).
  static Records extend(const Records &base) {
    Records r;
    if (base.nShared_ == 0) {
      if (!base.own_)
        return r;
      r.shared_ = base.own_;
      r.sharedAddr_ = reinterpret_cast<uintptr_t>(base.own_->data());
      r.nShared_ = base.own_->size();
      r.size_ = r.nShared_;
    } else {
      r.copyFrom(base);
    }
    return r;
  }

  size_t size() const { return size_; }
  bool empty() const { return size() == 0; }
  /// How many of the records are another graph's (extend).
  size_t sharedCount() const { return nShared_; }

  const T &operator[](size_t i) const { return *at(i); }
  T &operator[](size_t i) { return *at(i); }
  const T &front() const { return (*this)[0]; }
  T &front() { return (*this)[0]; }
  const T &back() const { return (*this)[size() - 1]; }
  T &back() { return (*this)[size() - 1]; }

  size_t capacity() const { return nShared_ + (own_ ? own_->capacity() : 0); }
  /// Room for `n` records in all (the shared ones count), allocated once.
  void reserve(size_t n) {
    if (n > nShared_) {
      grow(n - nShared_).reserve(n - nShared_);
      cache();
    }
  }
  void push_back(const T &x) { emplace_back(x); }
  void push_back(T &&x) { emplace_back(std::move(x)); }
  template <class... A> T &emplace_back(A &&...args) {
    std::vector<T> &v = grow(size_ - nShared_ + 1);
    v.emplace_back(std::forward<A>(args)...);
    cache();
    return v.back();
  }

  template <class R, class V> class Iter {
  public:
    using iterator_category = std::random_access_iterator_tag;
    using value_type = T;
    using difference_type = std::ptrdiff_t;
    using pointer = V *;
    using reference = V &;
    Iter() = default;
    Iter(R *r, size_t i) : r_(r), i_(i) {}
    V &operator*() const { return (*r_)[i_]; }
    V *operator->() const { return &(*r_)[i_]; }
    V &operator[](difference_type n) const { return (*r_)[i_ + n]; }
    Iter &operator++() { ++i_; return *this; }
    Iter operator++(int) { Iter t = *this; ++i_; return t; }
    Iter &operator--() { --i_; return *this; }
    Iter operator--(int) { Iter t = *this; --i_; return t; }
    Iter &operator+=(difference_type n) { i_ += n; return *this; }
    Iter &operator-=(difference_type n) { i_ -= n; return *this; }
    Iter operator+(difference_type n) const { return Iter(r_, i_ + n); }
    Iter operator-(difference_type n) const { return Iter(r_, i_ - n); }
    difference_type operator-(const Iter &o) const {
      return static_cast<difference_type>(i_) - static_cast<difference_type>(o.i_);
    }
    bool operator==(const Iter &o) const { return i_ == o.i_; }
    bool operator!=(const Iter &o) const { return i_ != o.i_; }
    bool operator<(const Iter &o) const { return i_ < o.i_; }
    bool operator>(const Iter &o) const { return i_ > o.i_; }
    bool operator<=(const Iter &o) const { return i_ <= o.i_; }
    bool operator>=(const Iter &o) const { return i_ >= o.i_; }

  private:
    R *r_ = nullptr;
    size_t i_ = 0;
  };
  using iterator = Iter<Records, T>;
  using const_iterator = Iter<const Records, const T>;
  iterator begin() { return iterator(this, 0); }
  iterator end() { return iterator(this, size()); }
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(this, size()); }

private:
  /// The own storage, ready to hold `n` records: made when there is none, and moved to
  /// storage of this graph's alone when it must move to grow while another graph shares it.
  std::vector<T> &grow(size_t n) {
    if (!own_)
      own_ = std::make_shared<std::vector<T>>();
    else if (n > own_->capacity() && own_.use_count() > 1) {
      auto mine = std::make_shared<std::vector<T>>();
      mine->reserve(std::max(n, 2 * own_->size()));
      mine->insert(mine->end(), own_->begin(), own_->end());
      own_ = std::move(mine);
    }
    return *own_;
  }
  void cache() {
    ownAddr_ = reinterpret_cast<uintptr_t>(own_ ? own_->data() : nullptr) - nShared_ * sizeof(T);
    size_ = nShared_ + (own_ ? own_->size() : 0);
  }
  /// Record i: a select and a load, as a vector's (ownAddr_ is where own record 0 would be
  /// if the shared ones were before it in the same array).
  T *at(size_t i) const {
    assert(i < size_);
    return reinterpret_cast<T *>((i < nShared_ ? sharedAddr_ : ownAddr_) + i * sizeof(T));
  }
  void copyFrom(const Records &other) {
    if (other.empty())
      return;
    auto v = std::make_shared<std::vector<T>>();
    v->reserve(other.size());
    for (const T &x : other)
      v->push_back(x);
    own_ = std::move(v);
    cache();
  }
  void swap(Records &o) noexcept {
    std::swap(shared_, o.shared_);
    std::swap(sharedAddr_, o.sharedAddr_);
    std::swap(nShared_, o.nShared_);
    std::swap(own_, o.own_);
    std::swap(ownAddr_, o.ownAddr_);
    std::swap(size_, o.size_);
  }

  std::shared_ptr<std::vector<T>> shared_; ///< the base's storage (extend), or null
  uintptr_t sharedAddr_ = 0;               ///< its records' address (they never move while shared)
  size_t nShared_ = 0;                     ///< how many of them are these records' first
  std::shared_ptr<std::vector<T>> own_;    ///< the records after them (null: none yet)
  uintptr_t ownAddr_ = 0;                  ///< own_'s records' address − nShared_ records
  size_t size_ = 0;                        ///< nShared_ + own_'s size
};

} // namespace tally
