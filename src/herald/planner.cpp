#include "herald/planner.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <stdexcept>
#include <utility>

#include "herald/allocate.h"
#include "herald/worker_mask.h"
#include "kernels/sort.h"

namespace hetu {
namespace herald {

namespace {

// Loops over a batch's rows look a row this many places ahead up in advance, so that the cache
// misses of their hash-map lookups overlap instead of coming one after another.
constexpr size_t kLookAhead = 8;
// The directory's map is larger, its lookups a miss to memory for rows no cache has seen: further.
constexpr size_t kMapAhead = 16;

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

int PlannerThreads(int threads, int ranks) {
  if (threads > 0) return std::min(threads, 256);
  if (const char* env = std::getenv("HETU_PLANNER_THREADS")) {
    const int v = std::atoi(env);
    if (v > 0) return std::min(v, 256);
  }
  cpu_set_t cpus;
  const int cores = sched_getaffinity(0, sizeof cpus, &cpus) == 0 ? CPU_COUNT(&cpus) : 1;
  return std::clamp(std::min(ranks, cores), 1, 256);
}

Planner::Planner(int num_workers, std::vector<int> ranks, int64_t per_worker, cache::PolicyKind policy,
                 int64_t capacity, int64_t pin_threshold, Allocator allocator, int threads)
    : W_(num_workers), ranks_(std::move(ranks)), b_(per_worker), allocator_(allocator),
      threads_(PlannerThreads(threads, static_cast<int>(ranks_.size()))), shards_(threads_ > 1 ? 64 : 1) {
  // Who reads a row is kept as one bit per worker.
  if (num_workers < 1 || num_workers > 64)
    throw std::invalid_argument("Herald planner: " + std::to_string(num_workers) + " workers; 1 to 64 supported");
  if (ranks_.empty()) throw std::invalid_argument("Herald planner: no rank to plan for");
  kept_.assign(num_workers, -1);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    const int rank = ranks_[i];
    if (rank < 0 || rank >= num_workers)
      throw std::invalid_argument("Herald planner: rank " + std::to_string(rank) + " of " +
                                  std::to_string(num_workers) + " workers");
    if (kept_[rank] >= 0) throw std::invalid_argument("Herald planner: rank " + std::to_string(rank) + " given twice");
    kept_[rank] = static_cast<int>(i);
  }
  pending_.resize(ranks_.size());
  if (per_worker < 1) throw std::invalid_argument("Herald planner: batch size must be positive");
  if (capacity < 1) throw std::invalid_argument("Herald planner: cache capacity must be at least one row");
  models_.reserve(num_workers);
  for (int w = 0; w < num_workers; ++w) models_.emplace_back(policy, capacity, pin_threshold);
  directory_.resize(shards_);
  // Room for every worker's cache full of rows of its own, up to 2^16 rows a cache and 64 MiB of
  // slots (beyond, the directory grows as rows arrive).
  const int64_t room = std::min<int64_t>(num_workers * std::min<int64_t>(capacity, 1 << 16),
                                         (int64_t(64) << 20) / (sizeof(int32_t) * num_workers));
  const size_t entries = static_cast<size_t>(room / shards_);
  for (DirectoryShard& d : directory_) {
    d.entry_of.reserve(entries);
    d.key.reserve(entries);
    d.valid.reserve(entries);
    d.slots.reserve(entries * num_workers);
  }
  emptied_.resize(static_cast<size_t>(num_workers) * shards_);
  if (threads_ > 1) pool_ = std::make_unique<Pool>(threads_);
}

Planner::Planner(const Planner& o)
    : W_(o.W_), ranks_(o.ranks_), kept_(o.kept_), b_(o.b_), allocator_(o.allocator_), threads_(o.threads_), shards_(o.shards_),
      pool_(o.threads_ > 1 ? std::make_unique<Pool>(o.threads_) : nullptr), next_(o.next_), models_(o.models_),
      directory_(o.directory_), emptied_(o.emptied_), has_pending_(o.has_pending_), pending_(o.pending_),
      profile_(o.profile_) {}

void Planner::Evicted(int w, int64_t slot, int64_t key) {
  CacheModel& m = models_[w];
  const int sh = ShardOf(key);
  DirectoryShard& d = directory_[sh];
  const int32_t e = m.entry[slot];
  d.slots[static_cast<size_t>(e) * W_ + w] = -1;
  if (m.valid[slot]) {
    m.valid[slot] = 0;
    // Atomic: other workers' tasks may evict the same row at once (their copies not valid, so
    // they leave this word alone, but nothing here rests on that).
    __atomic_fetch_and(&d.valid[e], ~Bit(w), __ATOMIC_RELAXED);
  }
  emptied_[static_cast<size_t>(w) * shards_ + sh].push_back(e);
}

void Planner::FindRows(BatchRows* batch, Pool* pool) {
  const int64_t num_rows = static_cast<int64_t>(batch->keys.size());
  batch->entry.resize(num_rows);
  batch->valid.resize(num_rows);
  // Shard sh's rows (`rows`, or all of them with a single shard), on one task.
  auto find = [&](int sh, const int32_t* rows, int64_t count) {
    DirectoryShard& d = directory_[sh];
    for (int64_t i = 0; i < count; ++i) {
      if (i + static_cast<int64_t>(kMapAhead) < count)
        d.entry_of.Prefetch(batch->keys[rows ? rows[i + kMapAhead] : i + kMapAhead]);
      const int64_t r = rows ? rows[i] : i;
      const int64_t key = batch->keys[r];
      const auto [entry, added] = d.entry_of.Insert(key, 0);
      if (added) {
        if (d.free.empty()) {
          *entry = static_cast<int32_t>(d.key.size());
          d.key.push_back(key);
          d.valid.push_back(0);
          d.slots.insert(d.slots.end(), W_, -1);
        } else {
          *entry = d.free.back();
          d.free.pop_back();
          d.key[*entry] = key;  // a free entry's valid mask is 0 and its slots -1
        }
      }
      batch->entry[r] = *entry;
    }
    // Then the masks, apart: each is a cache miss of its own, which overlap when looked up ahead.
    for (int64_t i = 0; i < count; ++i) {
      if (i + static_cast<int64_t>(kLookAhead) < count)
        __builtin_prefetch(&d.valid[batch->entry[rows ? rows[i + kLookAhead] : i + kLookAhead]]);
      const int64_t r = rows ? rows[i] : i;
      batch->valid[r] = d.valid[batch->entry[r]];
    }
  };
  if (shards_ == 1) {
    find(0, nullptr, num_rows);
    return;
  }
  std::vector<std::vector<int32_t>> by_shard(shards_);  // the rows of each shard
  for (int64_t r = 0; r < num_rows; ++r) by_shard[ShardOf(batch->keys[r])].push_back(static_cast<int32_t>(r));
  ParallelFor(pool, shards_, 1, [&](int64_t first, int64_t end) {
    for (int64_t sh = first; sh < end; ++sh)
      find(static_cast<int>(sh), by_shard[sh].data(), static_cast<int64_t>(by_shard[sh].size()));
  });
}

void Planner::DropUncached(Pool* pool) {
  ParallelFor(shards_ > 1 ? pool : nullptr, shards_, 1, [&](int64_t first, int64_t end) {
    for (int64_t sh = first; sh < end; ++sh) {
      DirectoryShard& d = directory_[sh];
      for (int w = 0; w < W_; ++w)
        for (const int32_t e : emptied_[static_cast<size_t>(w) * shards_ + sh]) {
          if (d.key[e] < 0) continue;  // already dropped: several workers evicted it
          const int32_t* slots = &d.slots[static_cast<size_t>(e) * W_];
          if (std::any_of(slots, slots + W_, [](int32_t slot) { return slot >= 0; })) continue;
          d.entry_of.Erase(d.key[e]);
          d.key[e] = -1;
          d.valid[e] = 0;
          d.free.push_back(e);
        }
    }
  });
}

void Planner::Forget(const int64_t* rows, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    DirectoryShard& d = directory_[ShardOf(rows[i])];
    const int32_t* e = d.entry_of.Find(rows[i]);
    if (!e) continue;  // cached by no worker
    const int32_t* slots = SlotsOf(rows[i], *e);
    for (int w = 0; w < W_; ++w)
      if (slots[w] >= 0) models_[w].valid[slots[w]] = models_[w].dirty[slots[w]] = 0;
    d.valid[*e] = 0;
  }
}

uint64_t Planner::ValidMask(int64_t key) const {
  const DirectoryShard& d = directory_[ShardOf(key)];
  const int32_t* e = d.entry_of.Find(key);
  return e ? d.valid[*e] : 0;
}

void Planner::Allocate(BatchRows* batch, int64_t iteration, std::vector<int32_t>* assign) {
  const int64_t n = W_ * b_;
  const int64_t num_rows = static_cast<int64_t>(batch->keys.size());
  assign->resize(n);
  if (allocator_ == Allocator::kColocate) {
    double seconds[2] = {0, 0};
    ColocateAllocate(batch->samples, batch->valid.data(), num_rows, W_, b_, iteration, assign->data(), plan_pool_,
                     seconds, &batch->readers,  // readers come with it
                     batch->scored ? &batch->scored_rows : nullptr);
    profile_.scores += seconds[0];
    profile_.trades += seconds[1];
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  if (allocator_ == Allocator::kNone) {
    for (int64_t s = 0; s < n; ++s) (*assign)[s] = static_cast<int32_t>(s / b_);
  } else {
    GreedyAllocate(CacheScores(batch->samples, batch->valid.data(), W_, plan_pool_).data(), n, W_, b_, iteration,
                   assign->data(), plan_pool_);
  }
  const auto allocated = std::chrono::steady_clock::now();
  profile_.scores += std::chrono::duration<double>(allocated - start).count();
  batch->readers = Readers(batch->samples, num_rows, assign->data());
  profile_.readers += std::chrono::duration<double>(std::chrono::steady_clock::now() - allocated).count();
}

void Planner::SplitByWorker(BatchRows* batch, Pool* pool) const {
  const int64_t num_rows = static_cast<int64_t>(batch->keys.size());
  batch->parts = pool ? pool->threads() : 1;
  batch->by_worker.assign(static_cast<size_t>(batch->parts) * W_, {});
  // A row costs a step per worker that reads or holds it, not one per worker.
  ParallelFor(pool, batch->parts, 1, [&](int64_t first, int64_t end) {
    for (int64_t p = first; p < end; ++p) {
      BatchRows::WorkerRows* lists = &batch->by_worker[p * W_];
      for (int64_t r = num_rows * p / batch->parts; r < num_rows * (p + 1) / batch->parts; ++r) {
        const uint64_t valid = batch->valid[r], readers = batch->readers[r];
        for (uint64_t m = valid | readers; m; m &= m - 1) {
          const int w = __builtin_ctzll(m);
          const uint64_t me = Bit(w);
          if (readers & me) lists[w].reads.push_back(static_cast<int32_t>(r));
          if (!(valid & me)) continue;
          if (readers & ~me) lists[w].shared_held.push_back(static_cast<int32_t>(r));
          if (!(readers & me)) lists[w].held_elsewhere.push_back(static_cast<int32_t>(r));
        }
      }
    }
  });
}

int64_t Planner::PlanWorker(int w, const BatchRows& batch, int64_t iteration, WorkerPlan* plan, uint64_t* after) {
  CacheModel& m = models_[w];
  const uint64_t me = Bit(w);
  for (int sh = 0; sh < shards_; ++sh) emptied_[static_cast<size_t>(w) * shards_ + sh].clear();

  // w's rows (BatchRows::WorkerRows): one part's lists, or the parts' end to end.
  const BatchRows::WorkerRows* mine = &batch.by_worker[w];
  BatchRows::WorkerRows joined;
  if (batch.parts > 1) {
    for (int p = 0; p < batch.parts; ++p) {
      const BatchRows::WorkerRows& part = batch.by_worker[static_cast<size_t>(p) * W_ + w];
      joined.reads.insert(joined.reads.end(), part.reads.begin(), part.reads.end());
      joined.shared_held.insert(joined.shared_held.end(), part.shared_held.begin(), part.shared_held.end());
      joined.held_elsewhere.insert(joined.held_elsewhere.end(), part.held_elsewhere.begin(), part.held_elsewhere.end());
    }
    mine = &joined;
  }
  const std::vector<int32_t>& rows = mine->reads;
  const std::vector<int32_t>& shared_held = mine->shared_held;
  const std::vector<int32_t>& held_elsewhere = mine->held_elsewhere;

  // The end of t-1: w writes back its dirty rows that another worker reads at t. (Dirty rows
  // are valid, so the valid masks find every one.)
  if (has_pending_) {
    for (const int32_t r : shared_held) {
      const int64_t slot = SlotsOf(batch.keys[r], batch.entry[r])[w];
      if (!m.dirty[slot]) continue;
      m.dirty[slot] = 0;
      if (plan) pending_[kept_[w]].writeback.push_back(batch.keys[r]);
    }
    if (plan) SortUnique(&pending_[kept_[w]].writeback);
  }

  // w's rows through its cache model.
  std::vector<int64_t> k(rows.size());
  std::vector<int32_t> resident(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    if (i + kLookAhead < rows.size()) {
      const int32_t ahead = rows[i + kLookAhead];
      __builtin_prefetch(SlotsOf(batch.keys[ahead], batch.entry[ahead]) + w);
    }
    k[i] = batch.keys[rows[i]];
    resident[i] = SlotsOf(k[i], batch.entry[rows[i]])[w];
  }
  cache::AccessResult r = m.policy.Access(k.data(), resident.data(), static_cast<int64_t>(k.size()));
  std::vector<int64_t> writeback;
  for (size_t e = 0; e < r.evicted_keys.size(); ++e) {
    const int64_t slot = r.evicted_slots[e];
    if (m.dirty[slot]) writeback.push_back(r.evicted_keys[e]);
    Evicted(w, slot, r.evicted_keys[e]);
    m.dirty[slot] = 0;
  }
  std::vector<uint8_t> pull(k.size()), owner(k.size());
  for (size_t i = 0; i < k.size(); ++i) {
    const int64_t slot = r.slot[i];
    owner[i] = batch.readers[rows[i]] == me;
    pull[i] = !(slot >= 0 && r.hit[i] && m.valid[slot]);
    if (slot >= 0 && !r.hit[i]) {  // newly cached: the directory learns where
      const int32_t e = batch.entry[rows[i]];
      SlotsOf(k[i], e)[w] = static_cast<int32_t>(slot);
      m.entry[slot] = e;
    } else if (slot < 0) {  // not cached: the row may be cached nowhere now
      emptied_[static_cast<size_t>(w) * shards_ + ShardOf(k[i])].push_back(batch.entry[rows[i]]);
    }
    if (slot >= 0) {
      // A row stepped by several workers changes on the servers: the copy is stale after t.
      m.valid[slot] = owner[i];
      m.dirty[slot] = owner[i];
      if (owner[i]) after[rows[i]] = me;
    } else if (owner[i]) {
      writeback.push_back(k[i]);  // stepped here but not cached: its new value must reach the servers
    }
  }

  // Valid cached copies of rows that other workers use now are updated elsewhere. Only readers
  // set valid bits, so w's stale copies are among those valid before the iteration (less what
  // its evictions just dropped). (Dirty rows are valid, so this also checks that no dirty row is
  // updated by another worker.)
  std::vector<int64_t> invalidate;
  int64_t broken = -1;
  for (const int32_t i : held_elsewhere) {
    const int64_t key = batch.keys[i];
    const int64_t slot = SlotsOf(key, batch.entry[i])[w];
    if (slot < 0 || !m.valid[slot]) continue;
    if (m.dirty[slot]) {
      broken = i;
      break;
    }
    if (plan) invalidate.push_back(key);
    m.valid[slot] = 0;
  }

  if (plan) {
    plan->iteration = iteration;
    plan->keys = std::move(k);
    plan->hit = std::move(r.hit);
    plan->pull = std::move(pull);
    plan->owner = std::move(owner);
    plan->invalidate = std::move(invalidate);
    plan->writeback = std::move(writeback);
  }
  return broken;
}

namespace {

double Since(std::chrono::steady_clock::time_point* start) {
  const auto now = std::chrono::steady_clock::now();
  const double s = std::chrono::duration<double>(now - *start).count();
  *start = now;
  return s;
}

}  // namespace

PreparedBatch Planner::Prepare(const int64_t* ids, int64_t fields, PrepareScratch* scratch, Pool* pool) const {
  const auto begin = std::chrono::steady_clock::now();
  const int64_t n = W_ * b_;
  PreparedBatch out;
  out.num_ids = n * fields;
  std::vector<int32_t>& slots = scratch->slots;
  slots.resize(n * fields);  // written whole
  kernels::sorted_unique_parallel(ids, n * fields, pool, &scratch->sort, &out.keys, slots.data());
  // A bag's empty slots (-1) sort first and name no row.
  const bool padded = !out.keys.empty() && out.keys[0] == -1;
  if (padded) out.keys.erase(out.keys.begin());
  const int64_t num_rows = static_cast<int64_t>(out.keys.size());
  // Small batches (a few hundred microseconds) gain nothing from the pool.
  if (out.num_ids < kParallelIds) pool = nullptr;
  out.samples = SampleRows::FromSlots(slots.data(), n, fields, num_rows, padded ? 0 : -1, padded ? 1 : 0, pool);
  if (allocator_ == Allocator::kColocate) {
    out.rows = ScoredRowsOf(out.samples, W_, pool);
    out.scored = true;
  }
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return out;
}

Advanced Planner::Advance(const int64_t* ids, int64_t fields, int64_t iteration) {
  PreparedBatch batch = Prepare(ids, fields, &scratch_, pool_.get());
  // Counted as the batch's ids (it is most of what they cost).
  profile_.ids += batch.seconds;
  profile_.total += batch.seconds;
  return Advance(std::move(batch), iteration);
}

Advanced Planner::Advance(PreparedBatch prepared, int64_t iteration) {
  if (iteration != next_)
    throw std::invalid_argument("Herald planner: iteration " + std::to_string(iteration) + " given, " +
                                std::to_string(next_) + " expected (plans depend on every earlier iteration)");
  const int64_t n = W_ * b_;
  if (prepared.samples.samples() != n)
    throw std::invalid_argument("Herald planner: a batch of " + std::to_string(prepared.samples.samples()) +
                                " samples prepared for iteration " + std::to_string(iteration) + ", " +
                                std::to_string(n) + " expected");
  ++next_;
  const auto begin = std::chrono::steady_clock::now();
  auto lap = begin;
  // Small plans (a few hundred microseconds) gain nothing from the pool: they run here.
  Pool* pool = plan_pool_ = prepared.num_ids >= kParallelIds ? pool_.get() : nullptr;
  // The batch as indices into its distinct rows, each distinct row's valid mask (one lookup per
  // distinct row, not per id), the allocation, and who reads each row.
  BatchRows batch;
  batch.keys = std::move(prepared.keys);
  batch.samples = std::move(prepared.samples);
  batch.scored = prepared.scored;
  batch.scored_rows = std::move(prepared.rows);
  const int64_t num_rows = static_cast<int64_t>(batch.keys.size());
  FindRows(&batch, pool);
  profile_.ids += Since(&lap);
  std::vector<int32_t> assign;
  Allocate(&batch, iteration, &assign);
  lap = std::chrono::steady_clock::now();

  // Every worker's model and plan, one task per worker.
  SplitByWorker(&batch, pool);
  batch.after.assign(num_rows, 0);
  std::vector<WorkerPlan> plans(ranks_.size());
  std::vector<int64_t> broken(W_, -1);
  std::vector<std::exception_ptr> errors(W_);
  ParallelFor(pool, W_, 1, [&](int64_t first, int64_t end) {
    for (int64_t w = first; w < end; ++w) {
      try {
        broken[w] = PlanWorker(static_cast<int>(w), batch, iteration, kept_[w] >= 0 ? &plans[kept_[w]] : nullptr,
                               batch.after.data());
      } catch (...) {
        errors[w] = std::current_exception();
      }
    }
  });
  for (const std::exception_ptr& e : errors)
    if (e) std::rethrow_exception(e);
  int bad = -1;
  for (int w = 0; w < W_; ++w)
    if (broken[w] >= 0 && (bad < 0 || broken[w] < broken[bad])) bad = w;
  if (bad >= 0)
    throw std::logic_error("Herald plan invariant broken at iteration " + std::to_string(iteration) + ": worker " +
                           std::to_string(bad) + " holds dirty row " + std::to_string(batch.keys[broken[bad]]) +
                           " that another worker updates");
  profile_.workers += Since(&lap);

  // The valid masks: each row whose mask the iteration changed takes its new mask whole (the
  // copies evicted have left the masks already; a row of the batch that a worker evicted is
  // among those changed: its evicting worker's bit was in its mask and cannot be after it).
  // Then the rows no worker caches leave the directory.
  ParallelFor(pool, num_rows, 4096, [&](int64_t first, int64_t end) {
    for (int64_t r = first; r < end; ++r)
      if (batch.valid[r] != batch.after[r]) directory_[ShardOf(batch.keys[r])].valid[batch.entry[r]] = batch.after[r];
  });
  DropUncached(pool);
  profile_.masks += Since(&lap);

  Advanced out;
  if (has_pending_) {
    out.has_finished = true;
    out.finished = std::move(pending_);
  }
  for (int64_t s = 0; s < n; ++s)
    if (kept_[assign[s]] >= 0) plans[kept_[assign[s]]].samples.push_back(s);
  out.samples.reserve(plans.size());
  for (const WorkerPlan& p : plans) out.samples.push_back(p.samples);
  pending_ = std::move(plans);
  has_pending_ = true;
  if (pool) pool->Rest();  // the next plan is an iteration away
  profile_.total += std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  ++profile_.plans;
  return out;
}

}  // namespace herald
}  // namespace hetu
