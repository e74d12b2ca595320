#include "herald/plan_cache.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <numeric>
#include <stdexcept>
#include <utility>

namespace hetu {
namespace herald {

namespace {

// Position of `key` in the ascending keys[0, n), or -1.
int64_t Find(const std::vector<int64_t>& keys, int64_t key) {
  const auto it = std::lower_bound(keys.begin(), keys.end(), key);
  return it != keys.end() && *it == key ? it - keys.begin() : -1;
}

}  // namespace

PlanCache::PlanCache(cache::PolicyKind kind, int64_t capacity, int64_t width, const optim::Config& optimizer,
                     int64_t pin_threshold)
    : policy_(kind, capacity, pin_threshold), width_(width), state_width_(optim::state_width(optimizer.kind, width)),
      optimizer_(optimizer), values_(optimizer.storage, capacity, width), state_(capacity * state_width_),
      steps_(capacity, 0),
      valid_(capacity, 0), dirty_(capacity, 0) {}

void PlanCache::Append(RowsOut* out, int64_t key, const float* values, const float* state, int64_t steps) const {
  out->keys.push_back(key);
  out->values.insert(out->values.end(), values, values + width_);
  out->state.insert(out->state.end(), state, state + state_width_);
  out->steps.push_back(steps);
}

void PlanCache::AppendSlot(RowsOut* out, int64_t key, int64_t slot) const {
  std::vector<float> row(width_);
  values_.Get(slot, row.data());
  Append(out, key, row.data(), &state_[slot * state_width_], steps_[slot]);
}

std::string PlanCache::Begin(const int64_t* keys, int64_t n, const uint8_t* plan_hit, const uint8_t* plan_pull,
                             float* vals, float* state, int64_t* steps, int64_t* served, int64_t* evictions,
                             int64_t catch_up_to) {
  std::optional<optim::CatchUp> catch_up;
  if (catch_up_to > 0 && optim::catches_up(optimizer_.kind)) catch_up.emplace(optimizer_, catch_up_to);
  cache::AccessResult r = policy_.Access(keys, n);
  int64_t wrong = 0;
  for (int64_t i = 0; i < n; ++i) wrong += (r.hit[i] != 0) != (plan_hit[i] != 0);
  if (wrong) return "cache hits differ from the scheduler's prediction on " + std::to_string(wrong) + " rows";

  // Evicted dirty rows leave with this step's write-back; their slots are reused below.
  std::vector<size_t> order(r.evicted_keys.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return r.evicted_keys[a] < r.evicted_keys[b]; });
  evicted_ = RowsOut();
  for (size_t e : order) {
    const int64_t slot = r.evicted_slots[e];
    if (dirty_[slot]) AppendSlot(&evicted_, r.evicted_keys[e], slot);
    valid_[slot] = dirty_[slot] = 0;
  }
  *evictions = static_cast<int64_t>(r.evicted_keys.size());

  // A row is read from the cache where its copy is valid; everything else is pulled.
  int64_t from_cache = 0;
  wrong = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = r.slot[i];
    const bool valid = slot >= 0 && r.hit[i] && valid_[slot];
    wrong += valid == (plan_pull[i] != 0);
    if (valid) {
      values_.Get(slot, vals + i * width_);
      std::memcpy(state + i * state_width_, &state_[slot * state_width_], state_width_ * sizeof(float));
      steps[i] = steps_[slot];
      if (catch_up && catch_up_to > steps[i]) {  // the copy kept in step with the working one
        catch_up->Row(vals + i * width_, state + i * state_width_, &steps[i], width_);
        values_.Put(slot, vals + i * width_);
        std::memcpy(&state_[slot * state_width_], state + i * state_width_, state_width_ * sizeof(float));
        steps_[slot] = steps[i];
      }
      ++from_cache;
    } else {
      std::fill(state + i * state_width_, state + (i + 1) * state_width_, 0.0f);
      steps[i] = 0;
    }
  }
  if (wrong) return "rows to pull differ from the plan on " + std::to_string(wrong) + " rows";
  *served = from_cache;
  step_keys_.assign(keys, keys + n);
  step_slots_ = std::move(r.slot);
  return "";
}

std::string PlanCache::Finish(const int64_t* keys, int64_t n, const uint8_t* owner, const float* summed, float lr,
                              float* vals, float* state, int64_t* steps, const int64_t* invalidate,
                              int64_t num_invalidate, const int64_t* writeback, int64_t num_writeback, RowsOut* out) {
  if (n != static_cast<int64_t>(step_keys_.size()) || !std::equal(keys, keys + n, step_keys_.begin()))
    return "gradient rows differ from the lookup";
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = step_slots_[i];
    if (owner[i]) {
      // Owner computes: the row's only user steps it, optimizer state included.
      optim::step_row(optimizer_, lr, vals + i * width_, state_width_ ? state + i * state_width_ : nullptr, steps + i,
                      summed + i * width_, width_);
      if (slot < 0) continue;
      values_.Put(slot, vals + i * width_);
      std::memcpy(&state_[slot * state_width_], state + i * state_width_, state_width_ * sizeof(float));
      steps_[slot] = steps[i];
      valid_[slot] = dirty_[slot] = 1;
    } else if (slot >= 0) {
      valid_[slot] = dirty_[slot] = 0;  // stepped on the servers: this copy is stale
    }
  }
  std::vector<int64_t> stale;
  for (int64_t j = 0; j < num_invalidate; ++j) {
    const int64_t slot = policy_.SlotOf(invalidate[j]);
    if (slot < 0) continue;
    if (dirty_[slot]) return "a dirty row (" + std::to_string(invalidate[j]) + ") would be invalidated";
    stale.push_back(slot);
  }
  for (int64_t slot : stale) valid_[slot] = 0;

  *out = RowsOut();
  for (int64_t j = 0; j < num_writeback; ++j) {
    const int64_t key = writeback[j];
    if (const int64_t e = Find(evicted_.keys, key); e >= 0) {
      Append(out, key, &evicted_.values[e * width_], &evicted_.state[e * state_width_], evicted_.steps[e]);
      continue;
    }
    const int64_t i = Find(step_keys_, key);
    if (i >= 0 && step_slots_[i] < 0) {  // stepped here but not cached (the cache was full)
      Append(out, key, vals + i * width_, state + i * state_width_, steps[i]);
      continue;
    }
    const int64_t slot = policy_.SlotOf(key);
    if (slot >= 0 && dirty_[slot]) {  // a clean row (already flushed) needs nothing
      AppendSlot(out, key, slot);
      dirty_[slot] = 0;
    }
  }
  evicted_ = RowsOut();
  step_keys_.clear();
  step_slots_.clear();
  return "";
}

void PlanCache::Forget(const int64_t* keys, int64_t n) {
  if (!step_keys_.empty())
    throw std::logic_error("PlanCache.forget: rows forgotten between a step's begin and finish");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t slot = policy_.SlotOf(keys[i]);
    if (slot >= 0) valid_[slot] = dirty_[slot] = 0;
  }
}

RowsOut PlanCache::Drain() {
  std::vector<std::pair<int64_t, int64_t>> rows;  // (key, slot)
  for (size_t slot = 0; slot < dirty_.size(); ++slot)
    if (dirty_[slot]) rows.emplace_back(policy_.KeyAt(static_cast<int64_t>(slot)), static_cast<int64_t>(slot));
  std::sort(rows.begin(), rows.end());
  RowsOut out;
  for (const auto& [key, slot] : rows) {
    AppendSlot(&out, key, slot);
    dirty_[slot] = 0;
  }
  return out;
}

}  // namespace herald
}  // namespace hetu
