#include "cache/policy.h"

#include <limits>
#include <stdexcept>
#include <string>

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
  if (capacity > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("cache capacity " + std::to_string(capacity) + " rows: at most 2^31 - 1 supported");
  where_.reserve(static_cast<size_t>(std::min<int64_t>(capacity, 1 << 16)));  // grows as rows arrive
  slot_key_.assign(capacity, -1);
  if (kind == kLRU) stamp_.assign(capacity, -1);
  free_slots_.reserve(static_cast<size_t>(capacity));
  for (int64_t s = capacity - 1; s >= 0; --s) free_slots_.push_back(s);
}

int64_t CachePolicy::SlotOf(int64_t key) const {
  const Entry* e = where_.Find(key);
  return e ? e->slot : -1;
}

std::vector<int64_t> CachePolicy::Keys() const {
  std::vector<int64_t> keys;
  keys.reserve(where_.size());
  where_.ForEach([&](int64_t key, const Entry&) { keys.push_back(key); });
  return keys;
}

void CachePolicy::StampUse(int64_t slot) {
  stamp_[slot] = ++clock_;
  // Superseded records are dropped once they could outnumber the resident rows: each row's
  // records are then read at most twice, and uses_ stays within twice the capacity.
  if (uses_.size() >= 2 * static_cast<size_t>(capacity_) + 64) {
    size_t kept = 0;
    for (size_t i = uses_head_; i < uses_.size(); ++i)
      if (Current(uses_[i])) uses_[kept++] = uses_[i];
    uses_.resize(kept);
    uses_head_ = 0;
  }
  uses_.push_back(Use{slot, clock_});
}

void CachePolicy::Touch(int64_t key, Entry& e) {
  if (kind_ == kLRU) {
    StampUse(e.slot);
  } else if (!e.pinned) {
    lfu_.erase(Rank{e.freq, e.last_use, key});
  }
  e.freq += 1;
  e.last_use = static_cast<uint32_t>(tick_);
  if (kind_ == kLFUOpt && e.freq >= pin_threshold_) e.pinned = true;
  if (kind_ != kLRU && !e.pinned) lfu_.insert(Rank{e.freq, e.last_use, key});
}

void CachePolicy::Remove(int64_t key, Entry& e) {
  if (kind_ == kLRU) {
    stamp_[e.slot] = -1;
  } else if (!e.pinned) {
    lfu_.erase(Rank{e.freq, e.last_use, key});
  }
  slot_key_[e.slot] = -1;
  free_slots_.push_back(e.slot);
  where_.Erase(key);  // last: it may move other entries (and e)
}

int64_t CachePolicy::PickVictim() {
  if (kind_ == kLRU) {
    while (uses_head_ < uses_.size() && !Current(uses_[uses_head_])) ++uses_head_;
    if (uses_head_ == uses_.size()) return -1;
    // The least recent row; if the current batch touched even that one, it touched them all.
    const Use& oldest = uses_[uses_head_];
    return oldest.stamp < access_first_stamp_ ? slot_key_[oldest.slot] : -1;
  }
  for (const Rank& r : lfu_) {
    const int64_t key = std::get<2>(r);
    if (Evictable(*where_.Find(key))) return key;
  }
  return -1;
}

AccessResult CachePolicy::Access(const int64_t* keys, int64_t n) {
  if (tick_ == std::numeric_limits<uint32_t>::max())
    throw std::overflow_error("cache policy: more than 2^32 - 1 batches through one cache");
  ++tick_;
  access_first_stamp_ = clock_ + 1;
  AccessResult r;
  r.slot.assign(n, -1);
  r.hit.assign(n, 0);
  for (int64_t i = 1; i < n; ++i)
    if (keys[i - 1] >= keys[i]) throw std::invalid_argument("CachePolicy::Access: keys must be distinct and ascending");
  // Hits first: every resident row of the batch is touched, so none of them can be chosen as a
  // victim for a miss of the same batch.
  constexpr int64_t kLookAhead = 8;  // rows looked up in advance, so that their cache misses overlap
  for (int64_t i = 0; i < n; ++i) {
    if (i + kLookAhead < n) where_.Prefetch(keys[i + kLookAhead]);
    Entry* e = where_.Find(keys[i]);
    if (!e) continue;
    Touch(keys[i], *e);
    r.slot[i] = e->slot;
    r.hit[i] = 1;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (r.hit[i]) continue;
    const int64_t key = keys[i];
    if (free_slots_.empty()) {
      const int64_t victim = capacity_ > 0 ? PickVictim() : -1;
      if (victim < 0) continue;  // every resident row is in use: bypass
      Entry& gone = *where_.Find(victim);
      r.evicted_keys.push_back(victim);
      r.evicted_slots.push_back(gone.slot);
      Remove(victim, gone);
    }
    const Entry e{static_cast<int32_t>(free_slots_.back()), 0, 0, false};
    free_slots_.pop_back();
    slot_key_[e.slot] = key;
    Entry& placed = *where_.Insert(key, e).first;
    // Start as if untouched, then count this access like any other.
    if (kind_ != kLRU) lfu_.insert(Rank{placed.freq, placed.last_use, key});
    Touch(key, placed);
    r.slot[i] = placed.slot;
  }
  return r;
}

void CachePolicy::Erase(int64_t key) {
  if (Entry* e = where_.Find(key)) Remove(key, *e);
}

}  // namespace cache
}  // namespace hetu
