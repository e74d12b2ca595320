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

CachePolicy::CachePolicy(PolicyKind kind, int64_t capacity, int64_t pin_threshold, bool indexed)
    : kind_(kind), capacity_(capacity), pin_threshold_(pin_threshold), indexed_(indexed) {
  if (capacity < 0) throw std::invalid_argument("cache capacity must be >= 0");
  if (capacity > std::numeric_limits<int32_t>::max())
    throw std::invalid_argument("cache capacity " + std::to_string(capacity) + " rows: at most 2^31 - 1 supported");
  if (indexed) where_.reserve(static_cast<size_t>(std::min<int64_t>(capacity, 1 << 16)));  // grows as rows arrive
  slot_key_.assign(capacity, -1);
  if (kind == kLRU) {
    stamp_.assign(capacity, -1);
  } else {
    freq_.assign(capacity, 0);
    last_use_.assign(capacity, 0);
    pinned_.assign(capacity, 0);
  }
  free_slots_.reserve(static_cast<size_t>(capacity));
  for (int64_t s = capacity - 1; s >= 0; --s) free_slots_.push_back(s);
}

int64_t CachePolicy::SlotOf(int64_t key) const {
  if (!indexed_) throw std::logic_error("CachePolicy::SlotOf: the policy has no index (its caller keeps the slots)");
  const int32_t* slot = where_.Find(key);
  return slot ? *slot : -1;
}

std::vector<int64_t> CachePolicy::Keys() const {
  std::vector<int64_t> keys;
  keys.reserve(static_cast<size_t>(size()));
  if (indexed_) {
    where_.ForEach([&](int64_t key, int32_t) { keys.push_back(key); });
  } else {
    for (const int64_t key : slot_key_)
      if (key >= 0) keys.push_back(key);
  }
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

void CachePolicy::Touch(int64_t slot) {
  if (kind_ == kLRU) {
    StampUse(slot);
    return;
  }
  if (!pinned_[slot]) lfu_.erase(RankOf(slot));
  freq_[slot] += 1;
  last_use_[slot] = static_cast<uint32_t>(tick_);
  if (kind_ == kLFUOpt && freq_[slot] >= pin_threshold_) pinned_[slot] = 1;
  if (!pinned_[slot]) lfu_.insert(RankOf(slot));
}

void CachePolicy::Remove(int64_t slot) {
  if (kind_ == kLRU) {
    stamp_[slot] = -1;
  } else if (!pinned_[slot]) {
    lfu_.erase(RankOf(slot));
  }
  if (indexed_) where_.Erase(slot_key_[slot]);
  slot_key_[slot] = -1;
  free_slots_.push_back(slot);
}

int64_t CachePolicy::PickVictim() {
  if (kind_ == kLRU) {
    while (uses_head_ < uses_.size() && !Current(uses_[uses_head_])) ++uses_head_;
    if (uses_head_ == uses_.size()) return -1;
    // The least recent row; if the current batch touched even that one, it touched them all.
    const Use& oldest = uses_[uses_head_];
    return oldest.stamp < access_first_stamp_ ? oldest.slot : -1;
  }
  for (const Rank& r : lfu_) {
    const int64_t slot = std::get<3>(r);
    if (Evictable(slot)) return slot;
  }
  return -1;
}

namespace {

void CheckAscending(const int64_t* keys, int64_t n) {
  for (int64_t i = 1; i < n; ++i)
    if (keys[i - 1] >= keys[i]) throw std::invalid_argument("CachePolicy::Access: keys must be distinct and ascending");
}

}  // namespace

AccessResult CachePolicy::Access(const int64_t* keys, int64_t n) {
  if (!indexed_) throw std::logic_error("CachePolicy::Access: the policy has no index; pass each key's slot");
  CheckAscending(keys, n);
  std::vector<int32_t> resident(n);
  constexpr int64_t kLookAhead = 8;  // rows looked up in advance, so that their cache misses overlap
  for (int64_t i = 0; i < n; ++i) {
    if (i + kLookAhead < n) where_.Prefetch(keys[i + kLookAhead]);
    const int32_t* slot = where_.Find(keys[i]);
    resident[i] = slot ? *slot : -1;
  }
  return Apply(keys, resident.data(), n);
}

AccessResult CachePolicy::Access(const int64_t* keys, const int32_t* resident, int64_t n) {
  if (indexed_) throw std::logic_error("CachePolicy::Access: an indexed policy finds its keys' slots itself");
  CheckAscending(keys, n);
  return Apply(keys, resident, n);
}

AccessResult CachePolicy::Apply(const int64_t* keys, const int32_t* resident, int64_t n) {
  if (tick_ == std::numeric_limits<uint32_t>::max())
    throw std::overflow_error("cache policy: more than 2^32 - 1 batches through one cache");
  ++tick_;
  access_first_stamp_ = clock_ + 1;
  AccessResult r;
  r.slot.assign(n, -1);
  r.hit.assign(n, 0);
  // Hits first: every resident row of the batch is touched, so none of them can be chosen as a
  // victim for a miss of the same batch.
  for (int64_t i = 0; i < n; ++i) {
    if (resident[i] < 0) continue;
    Touch(resident[i]);
    r.slot[i] = resident[i];
    r.hit[i] = 1;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (r.hit[i]) continue;
    const int64_t key = keys[i];
    if (free_slots_.empty()) {
      const int64_t victim = capacity_ > 0 ? PickVictim() : -1;
      if (victim < 0) continue;  // every resident row is in use: bypass
      r.evicted_keys.push_back(slot_key_[victim]);
      r.evicted_slots.push_back(victim);
      Remove(victim);
    }
    const int64_t slot = free_slots_.back();
    free_slots_.pop_back();
    slot_key_[slot] = key;
    if (indexed_) where_.Insert(key, static_cast<int32_t>(slot));
    // Start as if untouched, then count this access like any other.
    if (kind_ != kLRU) {
      freq_[slot] = 0;
      last_use_[slot] = 0;
      pinned_[slot] = 0;
      lfu_.insert(RankOf(slot));
    }
    Touch(slot);
    r.slot[i] = slot;
  }
  return r;
}

void CachePolicy::Erase(int64_t key) {
  if (!indexed_) throw std::logic_error("CachePolicy::Erase: the policy has no index (its caller keeps the slots)");
  if (const int32_t* slot = where_.Find(key)) Remove(*slot);
}

}  // namespace cache
}  // namespace hetu
