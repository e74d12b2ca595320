#include "cache/row_cache.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>

#include "common/parallel.h"

namespace hetu {
namespace cache {

RowCache::RowCache(PolicyKind kind, int64_t capacity, int64_t width, int64_t bound, const optim::Config& optimizer,
                   int64_t pin_threshold)
    : policy_(kind, capacity, pin_threshold),
      width_(width),
      bound_(bound),
      optimizer_(optimizer),
      state_width_(optim::state_width(optimizer.kind, width)),
      values_(optimizer.storage, capacity, width) {
  if (width < 1) throw std::invalid_argument("RowCache: width must be at least 1, got " + std::to_string(width));
  if (bound < 0) throw std::invalid_argument("RowCache: bound must not be negative, got " + std::to_string(bound));
  version_.assign(capacity, kNeverVersion);
  opt_state_.assign(capacity * state_width_, 0.0f);
  opt_steps_.assign(capacity, 0);
  pending_.assign(capacity, 0);
  if (bound > 0) pending_grad_.assign(capacity * width, 0.0f);
}

void RowCache::TakePending(int64_t key, int64_t slot, PushRows* out) {
  if (pending_[slot] == 0) return;
  float* g = &pending_grad_[slot * width_];
  out->keys.push_back(key);
  out->grads.insert(out->grads.end(), g, g + width_);
  out->counts.push_back(pending_[slot]);
  version_[slot] += pending_[slot];
  pending_[slot] = 0;
  std::fill(g, g + width_, 0.0f);
}

void RowCache::ClearSlot(int64_t slot) {
  version_[slot] = kNeverVersion;
  std::fill_n(opt_state_.begin() + slot * state_width_, state_width_, 0.0f);
  opt_steps_[slot] = 0;
  pending_[slot] = 0;
  if (bound_ > 0) std::fill_n(&pending_grad_[slot * width_], width_, 0.0f);
}

Prepared RowCache::Prepare(const int64_t* keys, int64_t n) {
  std::lock_guard<std::mutex> lk(mu_);
  AccessResult r = policy_.Access(keys, n);
  Prepared p;
  // The policy has already handed the evicted slots to new rows; their old contents are still
  // there until the pull fills them, so the write-back reads them first.
  for (size_t j = 0; j < r.evicted_keys.size(); ++j) {
    TakePending(r.evicted_keys[j], r.evicted_slots[j], &p.evicted);
    ClearSlot(r.evicted_slots[j]);
  }
  p.evictions = static_cast<int64_t>(r.evicted_keys.size());
  p.local_version.resize(n);
  for (int64_t i = 0; i < n; ++i)
    p.local_version[i] = r.slot[i] >= 0 && r.hit[i] ? version_[r.slot[i]] : kNeverVersion;
  p.hit = std::move(r.hit);
  return p;
}

int64_t RowCache::Fill(const int64_t* keys, int64_t n, const int64_t* pos, const float* rows,
                       const int64_t* versions, const float* state, const int64_t* steps, int64_t m, float* out,
                       int64_t catch_up_to) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<uint8_t> returned(n, 0);
  const size_t row_bytes = width_ * sizeof(float);
  const int64_t sw = state_width_;
  std::optional<optim::CatchUp> catch_up;
  if (catch_up_to > 0 && optim::catches_up(optimizer_.kind)) catch_up.emplace(optimizer_, catch_up_to);
  for (int64_t j = 0; j < m; ++j) {
    const int64_t i = pos[j];
    if (i < 0 || i >= n) throw std::invalid_argument("RowCache.fill: position " + std::to_string(i) + " out of range");
    returned[i] = 1;
    std::memcpy(out + i * width_, rows + j * width_, row_bytes);
    const int64_t s = policy_.SlotOf(keys[i]);
    if (s < 0) continue;  // bypasses the cache this step
    values_.Put(s, rows + j * width_);
    version_[s] = versions[j];
    if (state && sw) std::memcpy(&opt_state_[s * sw], state + j * sw, sw * sizeof(float));
    if (steps) opt_steps_[s] = steps[j];
  }
  for (int64_t i = 0; i < n; ++i) {
    if (returned[i]) continue;
    const int64_t s = policy_.SlotOf(keys[i]);
    if (s < 0 || version_[s] == kNeverVersion) return i;  // the pull must have returned it
    values_.Get(s, out + i * width_);
    if (catch_up && catch_up_to > opt_steps_[s]) {
      catch_up->Row(out + i * width_, &opt_state_[s * sw], &opt_steps_[s], width_);
      values_.Put(s, out + i * width_);  // rounded to the storage type: stored exactly
    }
  }
  return -1;
}

PushRows RowCache::Step(const int64_t* keys, const float* summed, int64_t n, float lr) {
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int64_t> slots, rows_cached;
  std::vector<float> grads_cached;
  PushRows out, bypass;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = policy_.SlotOf(keys[i]);
    const float* g = summed + i * width_;
    if (s < 0) {
      if (bound_ == 0) continue;  // the caller pushes every row
      bypass.keys.push_back(keys[i]);
      bypass.grads.insert(bypass.grads.end(), g, g + width_);
      bypass.counts.push_back(1);
      continue;
    }
    slots.push_back(s);
    rows_cached.push_back(i);
    grads_cached.insert(grads_cached.end(), g, g + width_);
  }
  // The local copy takes the step now, by the servers' rule, with its state cached beside it.
  const int64_t sw = state_width_;
  parallel_for(static_cast<int64_t>(slots.size()), 256, [&](int64_t b, int64_t e) {
    std::vector<float> row(width_);
    for (int64_t j = b; j < e; ++j) {
      const int64_t s = slots[j];
      values_.Get(s, row.data());
      optim::step_row(optimizer_, lr, row.data(), sw ? &opt_state_[s * sw] : nullptr, &opt_steps_[s],
                      &grads_cached[j * width_], width_);
      values_.Put(s, row.data());
    }
  });
  if (bound_ == 0) {
    // Pushed now with one contribution each; the servers' version of a row that no other
    // worker updated this iteration ends equal to this one, and the next read is a hit.
    for (int64_t s : slots) version_[s] += 1;
    return out;
  }
  for (size_t j = 0; j < slots.size(); ++j) {
    const int64_t s = slots[j];
    float* acc = &pending_grad_[s * width_];
    const float* g = &grads_cached[j * width_];
    for (int64_t c = 0; c < width_; ++c) acc[c] += g[c];
    if (++pending_[s] > bound_) TakePending(keys[rows_cached[j]], s, &out);
  }
  out.keys.insert(out.keys.end(), bypass.keys.begin(), bypass.keys.end());
  out.grads.insert(out.grads.end(), bypass.grads.begin(), bypass.grads.end());
  out.counts.insert(out.counts.end(), bypass.counts.begin(), bypass.counts.end());
  return out;
}

PushRows RowCache::Drain() {
  std::lock_guard<std::mutex> lk(mu_);
  PushRows out;
  if (bound_ == 0) return out;  // nothing is ever pending
  std::vector<int64_t> keys = policy_.Keys();
  std::sort(keys.begin(), keys.end());
  for (int64_t k : keys) TakePending(k, policy_.SlotOf(k), &out);
  return out;
}

int64_t RowCache::size() const {
  std::lock_guard<std::mutex> lk(mu_);
  return policy_.size();
}

std::vector<int64_t> RowCache::Keys() const {
  std::lock_guard<std::mutex> lk(mu_);
  return policy_.Keys();
}

bool RowCache::Row(int64_t key, float* values, float* state, int64_t* steps, int64_t* version,
                   int64_t* pending) const {
  std::lock_guard<std::mutex> lk(mu_);
  const int64_t s = policy_.SlotOf(key);
  if (s < 0) return false;
  values_.Get(s, values);
  const int64_t sw = state_width();
  std::memcpy(state, &opt_state_[s * sw], sw * sizeof(float));
  *steps = opt_steps_[s];
  *version = version_[s];
  *pending = pending_[s];
  return true;
}

}  // namespace cache
}  // namespace hetu
