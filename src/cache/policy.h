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
  // indexed: the policy finds each key's slot in a map of its own. Without one, the caller says
  // where each key is (the Access with `resident`): Herald's planner keeps every worker's slots
  // of a row in one directory, one lookup for all its workers' policies.
  CachePolicy(PolicyKind kind, int64_t capacity, int64_t pin_threshold = 8, bool indexed = true);

  // An indexed policy's access.
  AccessResult Access(const int64_t* keys, int64_t n);
  // An unindexed policy's access: resident[i] is keys[i]'s slot, or -1 if it is not cached.
  AccessResult Access(const int64_t* keys, const int32_t* resident, int64_t n);
  // Removes a row (e.g. invalidated and written back); no-op if absent. Indexed only.
  void Erase(int64_t key);
  int64_t SlotOf(int64_t key) const;  // -1 if absent. Indexed only.
  int64_t KeyAt(int64_t slot) const { return slot_key_[slot]; }  // -1 if the slot is free
  bool Contains(int64_t key) const { return SlotOf(key) >= 0; }
  int64_t size() const { return capacity_ - static_cast<int64_t>(free_slots_.size()); }
  int64_t capacity() const { return capacity_; }
  PolicyKind kind() const { return kind_; }
  std::vector<int64_t> Keys() const;

 private:
  // (freq, last_use, key, slot): LFU order. The slot follows the key, which alone orders
  // resident rows: it is there to be found without a lookup.
  using Rank = std::tuple<int64_t, int64_t, int64_t, int64_t>;
  Rank RankOf(int64_t slot) const { return Rank{freq_[slot], last_use_[slot], slot_key_[slot], slot}; }

  // Both accesses: the rest of an access once each key's slot is known.
  AccessResult Apply(const int64_t* keys, const int32_t* resident, int64_t n);
  bool Evictable(int64_t slot) const { return last_use_[slot] != static_cast<uint32_t>(tick_) && !pinned_[slot]; }
  int64_t PickVictim();  // a slot; -1 if every resident row is protected
  void Touch(int64_t slot);
  void Remove(int64_t slot);
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
  bool indexed_;
  int64_t tick_ = 0;
  // key -> slot (indexed only): 16-byte cells, so that a lookup touches one cache line.
  FlatMap<int32_t> where_;
  std::vector<int64_t> slot_key_;    // the row each slot holds
  // Per slot, LFU only: uses, the access that last used it, and whether it is pinned. Slots are
  // below 2^31 (the constructor checks) and uses and ticks below 2^32 (Access checks).
  std::vector<uint32_t> freq_, last_use_;
  std::vector<uint8_t> pinned_;
  std::vector<int64_t> stamp_;       // per slot, LRU only: its last touch, -1 while free
  std::vector<Use> uses_;            // touches, oldest first, from uses_head_ on
  size_t uses_head_ = 0;
  int64_t clock_ = 0;                // the last stamp handed out
  int64_t access_first_stamp_ = 1;   // stamps from here on were touched by the current Access
  std::set<Rank> lfu_;      // unpinned rows, least frequent (then least recent) first
  std::vector<int64_t> free_slots_;
};

}  // namespace cache
}  // namespace hetu
