#include "herald/planner.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "herald/allocate.h"
#include "kernels/kernels.h"

namespace hetu {
namespace herald {

namespace {

uint64_t Bit(int w) { return uint64_t(1) << w; }

void SortUnique(std::vector<int64_t>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

}  // namespace

uint64_t Planner::Users::MaskOf(int64_t key) const {
  auto it = std::lower_bound(keys.begin(), keys.end(), key);
  return it != keys.end() && *it == key ? mask[it - keys.begin()] : 0;
}

Allocator ParseAllocator(const std::string& name) {
  if (name == "colocate") return Allocator::kColocate;
  if (name == "greedy") return Allocator::kGreedy;
  if (name == "none") return Allocator::kNone;
  throw std::invalid_argument("unknown Herald allocator '" + name + "': expected colocate, greedy or none");
}

Planner::Planner(int num_workers, int rank, int64_t per_worker, cache::PolicyKind policy, int64_t capacity,
                 int64_t pin_threshold, Allocator allocator)
    : W_(num_workers), rank_(rank), b_(per_worker), allocator_(allocator) {
  // Who reads a row is kept as one bit per worker.
  if (num_workers < 1 || num_workers > 64)
    throw std::invalid_argument("Herald planner: " + std::to_string(num_workers) + " workers; 1 to 64 supported");
  if (rank < 0 || rank >= num_workers)
    throw std::invalid_argument("Herald planner: rank " + std::to_string(rank) + " of " +
                                std::to_string(num_workers) + " workers");
  if (per_worker < 1) throw std::invalid_argument("Herald planner: batch size must be positive");
  if (capacity < 1) throw std::invalid_argument("Herald planner: cache capacity must be at least one row");
  models_.reserve(num_workers);
  for (int w = 0; w < num_workers; ++w) models_.emplace_back(policy, capacity, pin_threshold);
}

void Planner::SetValid(int w, int64_t slot, bool valid) {
  CacheModel& m = models_[w];
  if (m.valid[slot] == valid) return;
  m.valid[slot] = valid;
  const int64_t key = m.slot_key[slot];
  if (valid) {
    *valid_by_key_.Insert(key, 0).first |= Bit(w);
  } else if ((*valid_by_key_.Find(key) &= ~Bit(w)) == 0) {
    valid_by_key_.Erase(key);
  }
}

uint64_t Planner::ValidMask(int64_t key) const {
  const uint64_t* mask = valid_by_key_.Find(key);
  return mask ? *mask : 0;
}

void Planner::Allocate(const int64_t* ids, int64_t fields, int64_t iteration, std::vector<int32_t>* assign) const {
  const int64_t n = W_ * b_;
  assign->resize(n);
  if (allocator_ == Allocator::kNone) {
    for (int64_t s = 0; s < n; ++s) (*assign)[s] = static_cast<int32_t>(s / b_);
    return;
  }
  // The batch's rows as indices into its distinct rows, and each distinct row's valid mask: one
  // lookup per distinct row, not per id.
  std::vector<int64_t> distinct;
  std::vector<int32_t> rows(n * fields);
  kernels::sorted_unique(ids, n * fields, &distinct, rows.data());
  std::vector<uint64_t> valid(distinct.size());
  for (size_t r = 0; r < distinct.size(); ++r) valid[r] = ValidMask(distinct[r]);
  if (allocator_ == Allocator::kColocate) {
    ColocateAllocate(rows.data(), n, fields, valid.data(), static_cast<int64_t>(distinct.size()), W_, b_, iteration,
                     assign->data());
  } else {
    GreedyAllocate(CacheScores(rows.data(), n, fields, valid.data(), W_).data(), n, W_, b_, iteration,
                   assign->data());
  }
}

void Planner::FinishPending(const Users& users) {
  // Dirty rows are valid, so the valid mask finds every worker that may hold a row dirty.
  for (size_t u = 0; u < users.keys.size(); ++u) {
    for (uint64_t held = ValidMask(users.keys[u]); held; held &= held - 1) {
      const int w = __builtin_ctzll(held);
      if (!(users.mask[u] & ~Bit(w))) continue;  // nobody else reads it
      CacheModel& m = models_[w];
      const int64_t slot = m.policy.SlotOf(users.keys[u]);
      if (!m.dirty[slot]) continue;
      m.dirty[slot] = 0;
      if (w == rank_) pending_.writeback.push_back(users.keys[u]);
    }
  }
  SortUnique(&pending_.writeback);
}

Advanced Planner::Advance(const int64_t* ids, int64_t fields, int64_t iteration) {
  if (iteration != next_)
    throw std::invalid_argument("Herald planner: iteration " + std::to_string(iteration) + " given, " +
                                std::to_string(next_) + " expected (plans depend on every earlier iteration)");
  ++next_;
  const int64_t n = W_ * b_;
  std::vector<int32_t> assign;
  Allocate(ids, fields, iteration, &assign);

  // Each worker's distinct rows, and who reads each row of the global batch.
  std::vector<std::vector<int64_t>> keys(W_);
  std::vector<std::pair<int64_t, int>> reads;
  {
    std::vector<std::vector<int64_t>> worker_ids(W_);
    for (int64_t s = 0; s < n; ++s)
      worker_ids[assign[s]].insert(worker_ids[assign[s]].end(), ids + s * fields, ids + (s + 1) * fields);
    for (int w = 0; w < W_; ++w) {
      kernels::sorted_unique(worker_ids[w].data(), static_cast<int64_t>(worker_ids[w].size()), &keys[w]);
      for (int64_t k : keys[w]) reads.emplace_back(k, w);
    }
  }
  std::sort(reads.begin(), reads.end());
  Users users;
  for (const auto& r : reads) {
    if (users.keys.empty() || users.keys.back() != r.first) {
      users.keys.push_back(r.first);
      users.mask.push_back(0);
    }
    users.mask.back() |= Bit(r.second);
  }

  Advanced out;
  if (has_pending_) {
    FinishPending(users);
    out.has_finished = true;
    out.finished = std::move(pending_);
  }

  WorkerPlan mine;
  for (int w = 0; w < W_; ++w) {
    CacheModel& m = models_[w];
    const std::vector<int64_t>& k = keys[w];
    cache::AccessResult r = m.policy.Access(k.data(), static_cast<int64_t>(k.size()));
    std::vector<int64_t> writeback;
    for (size_t e = 0; e < r.evicted_keys.size(); ++e) {
      const int64_t slot = r.evicted_slots[e];
      if (m.dirty[slot]) writeback.push_back(r.evicted_keys[e]);
      SetValid(w, slot, false);
      m.dirty[slot] = 0;
      m.slot_key[slot] = -1;
    }
    std::vector<uint8_t> pull(k.size()), owner(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      const int64_t slot = r.slot[i];
      owner[i] = users.MaskOf(k[i]) == Bit(w);
      pull[i] = !(slot >= 0 && r.hit[i] && m.valid[slot]);
      if (slot >= 0) {
        // A row stepped by several workers changes on the servers: the copy is stale after t.
        m.slot_key[slot] = k[i];
        SetValid(w, slot, owner[i]);
        m.dirty[slot] = owner[i];
      } else if (owner[i]) {
        writeback.push_back(k[i]);  // stepped here but not cached: its new value must reach the servers
      }
    }
    if (w == rank_) {
      mine.iteration = iteration;
      for (int64_t s = 0; s < n; ++s)
        if (assign[s] == w) mine.samples.push_back(s);
      mine.keys = k;
      mine.hit = std::move(r.hit);
      mine.pull = std::move(pull);
      mine.owner = std::move(owner);
      mine.writeback = std::move(writeback);
    }
  }
  // Valid cached copies of rows that other workers use now are updated elsewhere. (Dirty rows
  // are valid, so this also checks that no dirty row is updated by another worker.)
  for (size_t u = 0; u < users.keys.size(); ++u) {
    for (uint64_t stale = ValidMask(users.keys[u]) & ~users.mask[u]; stale; stale &= stale - 1) {
      const int w = __builtin_ctzll(stale);
      const int64_t slot = models_[w].policy.SlotOf(users.keys[u]);
      if (models_[w].dirty[slot])
        throw std::logic_error("Herald plan invariant broken at iteration " + std::to_string(iteration) +
                               ": worker " + std::to_string(w) + " holds dirty row " +
                               std::to_string(users.keys[u]) + " that another worker updates");
      if (w == rank_) mine.invalidate.push_back(users.keys[u]);
      SetValid(w, slot, false);
    }
  }
  out.samples = mine.samples;
  pending_ = std::move(mine);
  has_pending_ = true;
  return out;
}

}  // namespace herald
}  // namespace hetu
