// Which embedding rows a worker's cache holds: the replacement policy alone, without values.
//
// The real cache (values, versions, pending updates) and Herald's scheduler, which predicts
// every worker's cache, both drive this class with the same key sequence, so the prediction is
// exact by construction.
//
// One call to Access() is one iteration: the batch's distinct keys, ascending. The resident keys
// (hits) are touched first, in key order; then each miss, in key order, is inserted, evicting a
// row that the current batch does not use. When every resident row is in use by the batch (the
// cache is smaller than the batch's distinct rows), the miss bypasses the cache this iteration.
#pragma once
#include <cstdint>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "common/flat_map.h"

namespace hetu {
namespace cache {

enum PolicyKind : int { kLRU = 0, kLFU = 1, kLFUOpt = 2 };

PolicyKind ParsePolicy(const std::string& name);

struct AccessResult {
  std::vector<int64_t> slot;          // per key: its slot, or -1 if it bypasses the cache
  std::vector<uint8_t> hit;           // per key: 1 if it was resident before this access
  std::vector<int64_t> evicted_keys;  // rows removed to make room ...
  std::vector<int64_t> evicted_slots; // ... and the slots they held (now reused)
};

class CachePolicy {
 public:
  // pin_threshold: LFU-opt pins a row once it has been used this many times.
  CachePolicy(PolicyKind kind, int64_t capacity, int64_t pin_threshold = 8);

  AccessResult Access(const int64_t* keys, int64_t n);
  // Removes a row (e.g. invalidated and written back); no-op if absent.
  void Erase(int64_t key);
  int64_t SlotOf(int64_t key) const;  // -1 if absent
  int64_t KeyAt(int64_t slot) const { return slot_key_[slot]; }  // -1 if the slot is free
  bool Contains(int64_t key) const { return SlotOf(key) >= 0; }
  int64_t size() const { return static_cast<int64_t>(where_.size()); }
  int64_t capacity() const { return capacity_; }
  PolicyKind kind() const { return kind_; }
  std::vector<int64_t> Keys() const;

 private:
  // 16 bytes, so that a map cell is 24: the planner keeps one map per worker it models, and
  // every lookup of a batch row lands in one of them. Slots are below 2^31 (the constructor
  // checks) and uses and ticks below 2^32 (Access checks).
  struct Entry {
    int32_t slot;
    uint32_t freq;
    uint32_t last_use;
    bool pinned;
  };
  using Rank = std::tuple<int64_t, int64_t, int64_t>;  // (freq, last_use, key): LFU order

  bool Evictable(const Entry& e) const { return e.last_use != static_cast<uint32_t>(tick_) && !e.pinned; }
  int64_t PickVictim();  // -1 if every resident row is protected
  void Touch(int64_t key, Entry& e);
  void Remove(int64_t key, Entry& e);
  // LRU order, kept lazily: each touch of a slot sets its stamp and appends (slot, stamp) to
  // uses_; a record is current while the slot still has that stamp, so the first current record
  // is the least recent row. A touch writes one stamp where relinking a list threaded through
  // the slots costs a cache miss per neighbour on a large cache.
  struct Use {
    int64_t slot, stamp;
  };
  void StampUse(int64_t slot);
  bool Current(const Use& u) const { return stamp_[u.slot] == u.stamp; }

  PolicyKind kind_;
  int64_t capacity_;
  int64_t pin_threshold_;
  int64_t tick_ = 0;
  FlatMap<Entry> where_;
  std::vector<int64_t> stamp_;       // per slot, LRU only: its last touch, -1 while free
  std::vector<Use> uses_;            // touches, oldest first, from uses_head_ on
  size_t uses_head_ = 0;
  int64_t clock_ = 0;                // the last stamp handed out
  int64_t access_first_stamp_ = 1;   // stamps from here on were touched by the current Access
  std::vector<int64_t> slot_key_;       // the row each slot holds
  std::set<Rank> lfu_;      // unpinned rows, least frequent (then least recent) first
  std::vector<int64_t> free_slots_;
};

}  // namespace cache
}  // namespace hetu
