// A hash map from int64 row ids, for the per-row bookkeeping of the caches and of Herald's
// planner, which look up every row of every batch several times per iteration. Open
// addressing with linear probing: one array probe per lookup where std::unordered_map follows a
// pointer to a separately allocated node. Erase shifts the following entries back instead of
// leaving tombstones, so lookups stay short however many rows come and go.
//
// Pointers returned by Find / Insert stay valid until the next Insert or Erase.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

namespace hetu {

template <typename V>
class FlatMap {
 public:
  explicit FlatMap(size_t expected = 8) { Rehash(SlotsFor(expected)); }

  size_t size() const { return size_; }

  // Makes room for `expected` entries without rehashing.
  void reserve(size_t expected) {
    if (SlotsFor(expected) > keys_.size()) Rehash(SlotsFor(expected));
  }

  V* Find(int64_t key) {
    for (size_t i = Home(key);; i = (i + 1) & mask_) {
      if (!used_[i]) return nullptr;
      if (keys_[i] == key) return &values_[i];
    }
  }
  const V* Find(int64_t key) const { return const_cast<FlatMap*>(this)->Find(key); }

  // The entry of `key`, created as `value` if absent; second: whether it was created.
  std::pair<V*, bool> Insert(int64_t key, const V& value) {
    if (V* v = Find(key)) return {v, false};
    if (2 * (size_ + 1) > keys_.size()) Rehash(2 * keys_.size());
    size_t i = Home(key);
    while (used_[i]) i = (i + 1) & mask_;
    used_[i] = 1;
    keys_[i] = key;
    values_[i] = value;
    ++size_;
    return {&values_[i], true};
  }

  bool Erase(int64_t key) {
    size_t hole = Home(key);
    for (;; hole = (hole + 1) & mask_) {
      if (!used_[hole]) return false;
      if (keys_[hole] == key) break;
    }
    // Entries after the hole whose probe passed through it move back into it.
    for (size_t j = (hole + 1) & mask_; used_[j]; j = (j + 1) & mask_) {
      const size_t home = Home(keys_[j]);
      const bool reachable_without_hole = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (reachable_without_hole) continue;
      keys_[hole] = keys_[j];
      values_[hole] = std::move(values_[j]);
      hole = j;
    }
    used_[hole] = 0;
    --size_;
    return true;
  }

  template <typename F>
  void ForEach(F f) const {
    for (size_t i = 0; i < keys_.size(); ++i)
      if (used_[i]) f(keys_[i], values_[i]);
  }

 private:
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

  void Rehash(size_t slots) {
    std::vector<int64_t> keys(slots);
    std::vector<V> values(slots);
    std::vector<uint8_t> used(slots, 0);
    keys.swap(keys_);
    values.swap(values_);
    used.swap(used_);
    mask_ = slots - 1;
    size_ = 0;
    for (size_t i = 0; i < keys.size(); ++i)
      if (used[i]) Insert(keys[i], values[i]);
  }

  std::vector<int64_t> keys_;
  std::vector<V> values_;
  std::vector<uint8_t> used_;
  size_t mask_ = 0, size_ = 0;
};

}  // namespace hetu
