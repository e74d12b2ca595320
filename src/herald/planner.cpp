#include "herald/planner.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "herald/allocate.h"
#include "herald/worker_mask.h"
#include "kernels/kernels.h"

namespace hetu {
namespace herald {

namespace {

// Loops over a batch's rows look a row this many places ahead up in advance, so that the cache
// misses of their hash-map lookups overlap instead of coming one after another.
constexpr size_t kLookAhead = 8;

void SortUnique(std::vector<int64_t>* v) {
  std::sort(v->begin(), v->end());
  v->erase(std::unique(v->begin(), v->end()), v->end());
}

}  // namespace

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

void Planner::SetValid(int w, int64_t slot, int64_t key, bool valid) {
  CacheModel& m = models_[w];
  if (m.valid[slot] == valid) return;
  m.valid[slot] = valid;
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

void Planner::Allocate(const BatchRows& batch, int64_t iteration, std::vector<int32_t>* assign) const {
  const int64_t n = W_ * b_;
  assign->resize(n);
  if (allocator_ == Allocator::kNone) {
    for (int64_t s = 0; s < n; ++s) (*assign)[s] = static_cast<int32_t>(s / b_);
  } else if (allocator_ == Allocator::kColocate) {
    ColocateAllocate(batch.rows.data(), n, batch.fields, batch.valid.data(), static_cast<int64_t>(batch.keys.size()),
                     W_, b_, iteration, assign->data());
  } else {
    GreedyAllocate(CacheScores(batch.rows.data(), n, batch.fields, batch.valid.data(), W_).data(), n, W_, b_,
                   iteration, assign->data());
  }
}

void Planner::FinishPending(const BatchRows& batch) {
  // Dirty rows are valid, so the valid mask finds every worker that may hold a row dirty.
  for (size_t r = 0; r < batch.keys.size(); ++r) {
    for (uint64_t held = batch.valid[r]; held; held &= held - 1) {
      const int w = __builtin_ctzll(held);
      if (!(batch.readers[r] & ~Bit(w))) continue;  // nobody else reads it
      CacheModel& m = models_[w];
      const int64_t slot = m.policy.SlotOf(batch.keys[r]);
      if (!m.dirty[slot]) continue;
      m.dirty[slot] = 0;
      if (w == rank_) pending_.writeback.push_back(batch.keys[r]);
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
  // The batch as indices into its distinct rows, each distinct row's valid mask (one lookup per
  // distinct row, not per id), the allocation, and who reads each row.
  BatchRows batch;
  batch.fields = fields;
  batch.rows.resize(n * fields);
  kernels::sorted_unique(ids, n * fields, &batch.keys, batch.rows.data());
  const size_t num_rows = batch.keys.size();
  batch.valid.resize(num_rows);
  for (size_t r = 0; r < num_rows; ++r) {
    if (r + kLookAhead < num_rows) valid_by_key_.Prefetch(batch.keys[r + kLookAhead]);
    batch.valid[r] = ValidMask(batch.keys[r]);
  }
  std::vector<int32_t> assign;
  Allocate(batch, iteration, &assign);
  batch.readers = Readers(batch.rows.data(), n, fields, static_cast<int64_t>(num_rows), assign.data());
  // Each worker's distinct rows, ascending, as indices into the batch's.
  std::vector<std::vector<int32_t>> worker_rows(W_);
  for (size_t r = 0; r < num_rows; ++r)
    for (uint64_t m = batch.readers[r]; m; m &= m - 1) worker_rows[__builtin_ctzll(m)].push_back(static_cast<int32_t>(r));

  Advanced out;
  if (has_pending_) {
    FinishPending(batch);
    out.has_finished = true;
    out.finished = std::move(pending_);
  }

  WorkerPlan mine;
  for (int w = 0; w < W_; ++w) {
    CacheModel& m = models_[w];
    const std::vector<int32_t>& rows = worker_rows[w];
    std::vector<int64_t> k(rows.size());
    for (size_t i = 0; i < rows.size(); ++i) k[i] = batch.keys[rows[i]];
    cache::AccessResult r = m.policy.Access(k.data(), static_cast<int64_t>(k.size()));
    std::vector<int64_t> writeback;
    for (size_t e = 0; e < r.evicted_keys.size(); ++e) {
      const int64_t slot = r.evicted_slots[e];
      if (m.dirty[slot]) writeback.push_back(r.evicted_keys[e]);
      SetValid(w, slot, r.evicted_keys[e], false);
      m.dirty[slot] = 0;
    }
    std::vector<uint8_t> pull(k.size()), owner(k.size());
    for (size_t i = 0; i < k.size(); ++i) {
      if (i + kLookAhead < k.size()) valid_by_key_.Prefetch(k[i + kLookAhead]);
      const int64_t slot = r.slot[i];
      owner[i] = batch.readers[rows[i]] == Bit(w);
      pull[i] = !(slot >= 0 && r.hit[i] && m.valid[slot]);
      if (slot >= 0) {
        // A row stepped by several workers changes on the servers: the copy is stale after t.
        SetValid(w, slot, k[i], owner[i]);
        m.dirty[slot] = owner[i];
      } else if (owner[i]) {
        writeback.push_back(k[i]);  // stepped here but not cached: its new value must reach the servers
      }
    }
    if (w == rank_) {
      mine.iteration = iteration;
      for (int64_t s = 0; s < n; ++s)
        if (assign[s] == w) mine.samples.push_back(s);
      mine.keys = std::move(k);
      mine.hit = std::move(r.hit);
      mine.pull = std::move(pull);
      mine.owner = std::move(owner);
      mine.writeback = std::move(writeback);
    }
  }
  // Valid cached copies of rows that other workers use now are updated elsewhere. (Dirty rows
  // are valid, so this also checks that no dirty row is updated by another worker.)
  // This iteration only cleared valid bits of workers that do not read a row, so rows with no
  // valid copy outside their readers before it need no lookup.
  for (size_t r = 0; r < num_rows; ++r) {
    if (!(batch.valid[r] & ~batch.readers[r])) continue;
    const int64_t key = batch.keys[r];
    for (uint64_t stale = ValidMask(key) & ~batch.readers[r]; stale; stale &= stale - 1) {
      const int w = __builtin_ctzll(stale);
      const int64_t slot = models_[w].policy.SlotOf(key);
      if (models_[w].dirty[slot])
        throw std::logic_error("Herald plan invariant broken at iteration " + std::to_string(iteration) +
                               ": worker " + std::to_string(w) + " holds dirty row " + std::to_string(key) +
                               " that another worker updates");
      if (w == rank_) mine.invalidate.push_back(key);
      SetValid(w, slot, key, false);
    }
  }
  out.samples = mine.samples;
  pending_ = std::move(mine);
  has_pending_ = true;
  return out;
}

}  // namespace herald
}  // namespace hetu
