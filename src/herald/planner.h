// Herald's planner: one iteration at a time, the allocation of a global batch to workers and
// the exact communication plans of the workers it plans for (docs/design.md section 7): one worker's,
// or every worker's of a host (plan_link.h sends them theirs).
//
// Every host (or every worker) runs an identical Planner on the same sample stream, so all
// compute the same allocation and mutually consistent plans with no messages between hosts. The Planner keeps a model of every
// worker's cache: the CachePolicy that the real caches run (so predicted hits are actual hits),
// plus, per slot, whether the cached copy is valid (equal to the servers' row) and dirty (stepped
// locally, not yet written back). Where each worker caches a row is kept in one directory for
// all of them.
//
// The write-back of iteration t depends on which worker reads which rows at t+1, so Advance(t)
// returns the allocation of t and the finished plan of t-1.
//
// A plan runs on a pool of `threads` threads of its own: the allocation's cache scores and trade
// sweeps by samples (the placement itself on one thread), the cache models by worker (each
// worker's model is touched by one task only), the per-row valid masks by shards of keys. Every
// parallel step writes each index's results to places of its own and merges them in a fixed
// order, so plans are identical bit for bit whatever the thread count.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cache/policy.h"
#include "common/flat_map.h"
#include "common/huge_pages.h"
#include "common/parallel.h"
#include "herald/allocate.h"
#include "kernels/sort.h"

namespace hetu {
namespace herald {

// This worker's part of one iteration. keys: its distinct rows, ascending; hit, pull and owner
// are per key.
struct WorkerPlan {
  int64_t iteration = -1;
  std::vector<int64_t> samples;     // positions within the global batch, ascending
  std::vector<int64_t> keys;
  std::vector<uint8_t> hit;         // resident before this iteration (the policy's answer)
  std::vector<uint8_t> pull;        // not valid in the cache: fetch from the servers
  std::vector<uint8_t> owner;       // used by no other worker: stepped here (owner computes)
  std::vector<int64_t> invalidate;  // cached here and valid, but updated by another worker now
  std::vector<int64_t> writeback;   // ascending: sent to the servers at the end of the iteration
};

// Per kept rank (the planner's `ranks`, in their order): its samples of the iteration just
// allocated and, from the second iteration on, its plan of the previous one, now final.
struct Advanced {
  std::vector<std::vector<int64_t>> samples;
  bool has_finished = false;  // false for the first iteration
  std::vector<WorkerPlan> finished;
};

// A global batch as far as it follows from its ids alone, whatever the caches hold: its distinct
// rows, each sample's rows among them, and (colocate) the rows the allocation scores. Planner::
// Prepare makes one without touching the planner's state, so that a batch can be prepared on
// another thread while the one before it is planned (BatchPreparer).
struct PreparedBatch {
  int64_t num_ids = 0;        // the ids it was made from (samples times fields)
  std::vector<int64_t> keys;  // the distinct ids, ascending (a bag's padding, -1, left out)
  SampleRows samples;         // each sample's rows, as indices into keys
  bool scored = false;        // whether `rows` holds ScoredRowsOf(samples)
  ScoredRows rows;
  double seconds = 0;         // the time it took to make (BatchPreparer: with gathering its ids)
};

// What Prepare reuses from one call to the next, one per thread that prepares: megabytes that
// would otherwise be mapped (and zeroed) anew for every batch.
struct PrepareScratch {
  kernels::SortScratch sort;
  std::vector<int32_t> slots;  // each id's index among the batch's distinct ids
};

// kColocate and kGreedy: src/herald/allocate.h. kNone assigns samples [w*b, (w+1)*b) to worker
// w (the "plan only" ablation).
enum class Allocator { kColocate, kGreedy, kNone };
Allocator ParseAllocator(const std::string& name);

// The thread count of a planner for `ranks` workers: `threads` if positive, else
// HETU_PLANNER_THREADS if set, else one per worker it plans for (1 for a worker's own planner; a
// host's planner takes the threads its other workers no longer plan on), at most the cores.
int PlannerThreads(int threads, int ranks);

// Where a planner's time went, summed over its Advance calls (seconds).
struct PlanProfile {
  int64_t plans = 0;
  double ids = 0;         // the batch's distinct rows, each sample's rows and those the allocation
                          // scores (unless prepared: PreparedBatch), and the rows' valid masks
  double scores = 0;      // allocation: cache scores and the placement (greedy: all of it)
  double trades = 0;      // allocation: pairwise trades (colocate)
  double readers = 0;     // who reads each row (colocate: counted in trades)
  double workers = 0;     // every worker's cache model and plan, write-backs, invalidations
  double masks = 0;       // the valid masks brought up to date
  double total = 0;
};

class Planner {
 public:
  // ranks: the workers whose plans are kept (a worker's own rank; a host's planner, every rank
  // of the host); every worker's cache is modelled whatever they are. threads: see
  // PlannerThreads.
  Planner(int num_workers, std::vector<int> ranks, int64_t per_worker, cache::PolicyKind policy, int64_t capacity,
          int64_t pin_threshold, Allocator allocator, int threads = 0);
  // A copy plans on a pool of its own.
  Planner(const Planner& other);
  Planner(Planner&&) = default;

  // ids: [num_workers * per_worker, fields] row ids of global batch `iteration`, row-major.
  // Iterations must come in order 0, 1, 2, ...
  Advanced Advance(const int64_t* ids, int64_t fields, int64_t iteration);
  // The same, for a batch that Prepare made.
  Advanced Advance(PreparedBatch batch, int64_t iteration);
  // The part of Advance that depends on the batch alone, on `pool` (null: this thread). It reads
  // only the planner's settings, so it may run on another thread during an Advance.
  PreparedBatch Prepare(const int64_t* ids, int64_t fields, PrepareScratch* scratch, Pool* pool = nullptr) const;
  // Global batches have num_workers * per_worker samples.
  int64_t batch_samples() const { return W_ * b_; }

  // Every worker's cached copy of `rows` (n of them) is dropped, neither valid nor dirty: rows
  // whose old contents are discarded, never written back (a dynamic table's slots re-assigned
  // to another key, hetu.dynamic). The copies stay resident under the policy, so the hits it
  // predicts are unchanged; a worker that reads one pulls it. Called between Advance(t-1) and
  // Advance(t) for rows re-assigned at t: the write-back of t-1, decided in Advance(t), then
  // leaves them out, as the real caches (PlanCache::Forget at the start of step t) do.
  void Forget(const int64_t* rows, int64_t n);

  // One bit per worker whose cached copy of `key` is valid now (after the last Advance).
  uint64_t ValidMask(int64_t key) const;

  int threads() const { return threads_; }
  const std::vector<int>& ranks() const { return ranks_; }
  const PlanProfile& profile() const { return profile_; }

 private:
  // A worker's cache: its policy (told its rows' slots by the directory) and, per slot, whether
  // the copy is valid and dirty, and the directory entry of its row (in the shard of the row).
  struct CacheModel {
    cache::CachePolicy policy;
    std::vector<uint8_t> valid, dirty;
    std::vector<int32_t> entry;
    CacheModel(cache::PolicyKind kind, int64_t capacity, int64_t pin_threshold)
        : policy(kind, capacity, pin_threshold, /*indexed=*/false), valid(capacity, 0), dirty(capacity, 0),
          entry(capacity, -1) {}
  };
  // Every row some worker caches, in one place for all workers: per row an entry with each
  // worker's slot and the workers whose copy is valid. A batch row is then looked up once for all
  // workers, where a map per worker (the real caches' index) costs a lookup per row and worker:
  // random reads of tables of megabytes, which were most of a plan. Sharded by key (see
  // ShardOf); each shard's rows are added and removed by one task.
  struct DirectoryShard {
    FlatMap<int32_t> entry_of;    // row -> its entry
    // (Reserved up front on huge pages, as the map: grown by doubling, they were paged in anew.)
    std::vector<int64_t, HugePageAllocator<int64_t>> key;     // per entry: its row, -1 while free
    std::vector<uint64_t, HugePageAllocator<uint64_t>> valid;  // per entry: one bit per worker whose copy is valid
    std::vector<int32_t, HugePageAllocator<int32_t>> slots;   // [entry, W]: each worker's slot of the row, -1 where it has none
    std::vector<int32_t> free;    // entries free for reuse
  };

  // One global batch as the planner sees it. keys: its distinct rows, ascending; samples: each
  // sample's rows as indices into keys; valid: per distinct row, one bit per worker whose cached
  // copy is valid before the iteration; readers: one bit per worker that reads it (once
  // allocated); after: the valid bits after the iteration (once planned). A row read by several
  // workers is stepped on the servers and valid nowhere after it; one read by one worker is valid
  // there alone, if it caches the row.
  struct BatchRows {
    std::vector<int64_t> keys;
    std::vector<int32_t> entry;  // per row: its directory entry (every batch row has one)
    SampleRows samples;
    std::vector<uint64_t> valid, readers, after;
    bool scored = false;  // whether scored_rows holds ScoredRowsOf(samples) (PreparedBatch)
    ScoredRows scored_rows;
    // A worker's rows, each list ascending: those it reads, those it held valid before the
    // iteration that another worker reads (written back if dirty), and those it held valid and
    // does not read (stale if another worker updates them). Found for every worker in one pass
    // over the rows, a part of them per thread: [part * W + w].
    struct WorkerRows {
      std::vector<int32_t> reads, shared_held, held_elsewhere;
    };
    std::vector<WorkerRows> by_worker;
    int parts = 1;
  };
  // batch->by_worker from its valid masks and readers.
  void SplitByWorker(BatchRows* batch, Pool* pool) const;
  // The directory is kept in 64 shards with several threads, in one with one (a single table is
  // kinder to the TLB).
  int ShardOf(int64_t key) const {
    return shards_ == 1 ? 0 : static_cast<int>((static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL) >> 58);
  }
  // Worker w's slots of row `key`, whose directory entry is e: [W].
  int32_t* SlotsOf(int64_t key, int32_t e) { return &directory_[ShardOf(key)].slots[static_cast<size_t>(e) * W_]; }
  // The batch's rows into the directory (each finds its entry, or takes a new one) and their valid
  // masks: batch->entry, batch->valid.
  void FindRows(BatchRows* batch, Pool* pool);
  // Entries whose row no worker caches any longer leave the directory: those of the rows that
  // some worker evicted or left uncached this iteration (emptied_).
  void DropUncached(Pool* pool);
  // Worker w's part of an iteration: its write-backs of t-1 (rows another worker reads now),
  // its cache model through this batch, its plan (written to `plan` if w is a kept rank, else
  // null) and its stale copies. Touches models_[w], emptied_[w], w's plans, w's column of the
  // directory's slots, the valid bits of w's evicted copies, and the entries of after[] of the
  // rows w alone reads, and no others. Returns the position (in the batch's rows)
  // of a dirty row another worker updates, or -1.
  int64_t PlanWorker(int w, const BatchRows& batch, int64_t iteration, WorkerPlan* plan, uint64_t* after);

  // The allocation, and batch->readers under it.
  void Allocate(BatchRows* batch, int64_t iteration, std::vector<int32_t>* assign);
  // Worker w evicted `key` from `slot`: the copy is gone from the directory, and w's bit from
  // the key's valid mask. (The masks of the batch's rows are set whole after every worker is
  // planned.)
  void Evicted(int w, int64_t slot, int64_t key);

  int W_;
  std::vector<int> ranks_;
  std::vector<int> kept_;  // per worker: its index in ranks_, or -1
  int64_t b_;
  Allocator allocator_;
  int threads_;
  int shards_;                  // of the directory: 1, or 64 with several threads
  std::unique_ptr<Pool> pool_;  // null with one thread
  // Plans of fewer ids than this run on the calling thread alone.
  static constexpr int64_t kParallelIds = 16384;
  Pool* plan_pool_ = nullptr;   // the current plan's: pool_, or null for a small plan
  int64_t next_ = 0;
  std::vector<CacheModel> models_;
  std::vector<DirectoryShard> directory_;
  // emptied_[w * shards_ + shard]: the entries of the rows that worker w evicted or left uncached
  // this iteration; those that no worker caches now leave the directory.
  std::vector<std::vector<int32_t>> emptied_;
  bool has_pending_ = false;
  std::vector<WorkerPlan> pending_;  // per kept rank: the plan of the last iteration, not final yet
  PlanProfile profile_;
  PrepareScratch scratch_;  // Advance's (from ids), on pool_
};

}  // namespace herald
}  // namespace hetu
