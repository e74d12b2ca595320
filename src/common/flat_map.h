// A hash map from int64 row ids, for the per-row bookkeeping of the caches and of Herald's
// planner, which look up every row of every batch several times per iteration. Open
// addressing with linear probing over one array of (key, value) cells: a lookup of a resident
// row touches one cache line, where std::unordered_map follows a pointer to a separately
// allocated node (and separate key, value and occupancy arrays cost one miss each). Erase shifts
// the following entries back instead of leaving tombstones, so lookups stay short however many
// rows come and go.
//
// kEmpty (INT64_MIN) marks a free cell and cannot be a key; row ids are never negative.
// Pointers returned by Find / Insert stay valid until the next Insert or Erase.
#pragma once
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <utility>
#include <vector>

#include "common/huge_pages.h"

namespace hetu {

template <typename V>
class FlatMap {
 public:
  static constexpr int64_t kEmpty = std::numeric_limits<int64_t>::min();

  explicit FlatMap(size_t expected = 8) { Rehash(SlotsFor(expected)); }

  size_t size() const { return size_; }

  // Makes room for `expected` entries without rehashing.
  void reserve(size_t expected) {
    if (SlotsFor(expected) > cells_.size()) Rehash(SlotsFor(expected));
  }

  V* Find(int64_t key) {
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      Cell& c = cells_[i];
      if (c.key == key) return &c.value;
      if (c.key == kEmpty) return nullptr;
    }
  }
  const V* Find(int64_t key) const { return const_cast<FlatMap*>(this)->Find(key); }

  // Hints the cache to load the cell where a lookup of `key` starts; batched lookups issue it
  // some keys ahead so that their misses overlap.
  void Prefetch(int64_t key) const { __builtin_prefetch(&cells_[Home(key)]); }

  // The entry of `key`, created as `value` if absent; second: whether it was created.
  std::pair<V*, bool> Insert(int64_t key, const V& value) {
    if (V* v = Find(key)) return {v, false};
    if (key == kEmpty) throw std::invalid_argument("FlatMap: INT64_MIN cannot be a key");
    if (2 * (size_ + 1) > cells_.size()) Rehash(2 * cells_.size());
    size_t i = Home(key);
    while (cells_[i].key != kEmpty) i = (i + 1) & mask_;
    cells_[i].key = key;
    cells_[i].value = value;
    ++size_;
    return {&cells_[i].value, true};
  }

  bool Erase(int64_t key) {
    size_t hole = Home(key);
    for (;; hole = (hole + 1) & mask_) {
      if (cells_[hole].key == kEmpty) return false;
      if (cells_[hole].key == key) break;
    }
    // Entries after the hole whose probe passed through it move back into it.
    for (size_t j = (hole + 1) & mask_; cells_[j].key != kEmpty; j = (j + 1) & mask_) {
      const size_t home = Home(cells_[j].key);
      const bool reachable_without_hole = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (reachable_without_hole) continue;
      cells_[hole] = std::move(cells_[j]);
      hole = j;
    }
    cells_[hole].key = kEmpty;
    --size_;
    return true;
  }

  template <typename F>
  void ForEach(F f) const {
    for (const Cell& c : cells_)
      if (c.key != kEmpty) f(c.key, c.value);
  }

 private:
  struct Cell {
    int64_t key = kEmpty;
    V value{};
  };

  // At most half full.
  static size_t SlotsFor(size_t n) {
    size_t slots = 16;
    while (slots < 2 * n) slots *= 2;
    return slots;
  }

  size_t Home(int64_t key) const {
    uint64_t h = static_cast<uint64_t>(key);  // murmur3's finaliser: ids are often consecutive
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return static_cast<size_t>(h) & mask_;
  }

  using Cells = std::vector<Cell, HugePageAllocator<Cell>>;

  void Rehash(size_t slots) {
    Cells cells(slots);
    cells.swap(cells_);
    mask_ = slots - 1;
    size_ = 0;
    for (const Cell& c : cells)
      if (c.key != kEmpty) Insert(c.key, c.value);
  }

  Cells cells_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace hetu
