#include "cache/policy.h"

#include <stdexcept>

namespace hetu {
namespace cache {

PolicyKind ParsePolicy(const std::string& name) {
  if (name == "lru") return kLRU;
  if (name == "lfu") return kLFU;
  if (name == "lfuopt") return kLFUOpt;
  throw std::invalid_argument("unknown cache policy '" + name + "': expected lru, lfu or lfuopt");
}

CachePolicy::CachePolicy(PolicyKind kind, int64_t capacity, int64_t pin_threshold)
    : kind_(kind), capacity_(capacity), pin_threshold_(pin_threshold) {
  if (capacity < 0) throw std::invalid_argument("cache capacity must be >= 0");
  where_.reserve(static_cast<size_t>(capacity) * 2 + 1);
  free_slots_.reserve(static_cast<size_t>(capacity));
  for (int64_t s = capacity - 1; s >= 0; --s) free_slots_.push_back(s);
}

int64_t CachePolicy::SlotOf(int64_t key) const {
  auto it = where_.find(key);
  return it == where_.end() ? -1 : it->second.slot;
}

std::vector<int64_t> CachePolicy::Keys() const {
  std::vector<int64_t> keys;
  keys.reserve(where_.size());
  for (const auto& kv : where_) keys.push_back(kv.first);
  return keys;
}

void CachePolicy::Touch(int64_t key, Entry& e) {
  if (kind_ == kLRU) {
    lru_.splice(lru_.begin(), lru_, e.lru_pos);
  } else if (!e.pinned) {
    lfu_.erase(Rank{e.freq, e.last_use, key});
  }
  e.freq += 1;
  e.last_use = tick_;
  if (kind_ == kLFUOpt && e.freq >= pin_threshold_) e.pinned = true;
  if (kind_ != kLRU && !e.pinned) lfu_.insert(Rank{e.freq, e.last_use, key});
}

void CachePolicy::Remove(int64_t key, Entry& e) {
  if (kind_ == kLRU) {
    lru_.erase(e.lru_pos);
  } else if (!e.pinned) {
    lfu_.erase(Rank{e.freq, e.last_use, key});
  }
  free_slots_.push_back(e.slot);
  where_.erase(key);
}

int64_t CachePolicy::PickVictim() {
  if (kind_ == kLRU) {
    // Rows of the current batch sit at the front; the back is the least recent.
    if (lru_.empty()) return -1;
    const int64_t key = lru_.back();
    return Evictable(where_.at(key)) ? key : -1;
  }
  for (const Rank& r : lfu_) {
    const int64_t key = std::get<2>(r);
    if (Evictable(where_.at(key))) return key;
  }
  return -1;
}

AccessResult CachePolicy::Access(const int64_t* keys, int64_t n) {
  ++tick_;
  AccessResult r;
  r.slot.assign(n, -1);
  r.hit.assign(n, 0);
  for (int64_t i = 1; i < n; ++i)
    if (keys[i - 1] >= keys[i]) throw std::invalid_argument("CachePolicy::Access: keys must be distinct and ascending");
  // Hits first: every resident row of the batch is touched, so none of them can be chosen as a
  // victim for a miss of the same batch.
  for (int64_t i = 0; i < n; ++i) {
    auto it = where_.find(keys[i]);
    if (it == where_.end()) continue;
    Touch(keys[i], it->second);
    r.slot[i] = it->second.slot;
    r.hit[i] = 1;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (r.hit[i]) continue;
    const int64_t key = keys[i];
    if (free_slots_.empty()) {
      const int64_t victim = capacity_ > 0 ? PickVictim() : -1;
      if (victim < 0) continue;  // every resident row is in use: bypass
      r.evicted_keys.push_back(victim);
      r.evicted_slots.push_back(where_.at(victim).slot);
      Remove(victim, where_.at(victim));
    }
    Entry e{free_slots_.back(), 0, 0, false, {}};
    free_slots_.pop_back();
    if (kind_ == kLRU) {
      lru_.push_front(key);
      e.lru_pos = lru_.begin();
    }
    auto& placed = where_.emplace(key, e).first->second;
    // Start as if untouched, then count this access like any other.
    if (kind_ != kLRU) lfu_.insert(Rank{placed.freq, placed.last_use, key});
    Touch(key, placed);
    r.slot[i] = placed.slot;
  }
  return r;
}

void CachePolicy::Erase(int64_t key) {
  auto it = where_.find(key);
  if (it != where_.end()) Remove(key, it->second);
}

}  // namespace cache
}  // namespace hetu
