// Herald's planner: one iteration at a time, the allocation of a global batch to workers and
// this worker's exact communication plan (DESIGN.md section 7).
//
// Every worker runs an identical Planner on the same sample stream, so all compute the same
// allocation and mutually consistent plans with no messages. The Planner keeps a model of every
// worker's cache: the CachePolicy that the real caches run (so predicted hits are actual hits),
// plus, per slot, whether the cached copy is valid (equal to the servers' row) and dirty (stepped
// locally, not yet written back).
//
// The write-back of iteration t depends on which worker reads which rows at t+1, so Advance(t)
// returns the allocation of t and the finished plan of t-1.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cache/policy.h"
#include "common/flat_map.h"

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

struct Advanced {
  std::vector<int64_t> samples;  // this worker's samples of the iteration just allocated
  bool has_finished = false;     // false for the first iteration
  WorkerPlan finished;           // the plan of the previous iteration, now final
};

// kColocate and kGreedy: src/herald/allocate.h. kNone assigns samples [w*b, (w+1)*b) to worker
// w (the "plan only" ablation).
enum class Allocator { kColocate, kGreedy, kNone };
Allocator ParseAllocator(const std::string& name);

class Planner {
 public:
  Planner(int num_workers, int rank, int64_t per_worker, cache::PolicyKind policy, int64_t capacity,
          int64_t pin_threshold, Allocator allocator);

  // ids: [num_workers * per_worker, fields] row ids of global batch `iteration`, row-major.
  // Iterations must come in order 0, 1, 2, ...
  Advanced Advance(const int64_t* ids, int64_t fields, int64_t iteration);

  // One bit per worker whose cached copy of `key` is valid now (after the last Advance).
  uint64_t ValidMask(int64_t key) const;

 private:
  struct CacheModel {
    cache::CachePolicy policy;
    std::vector<uint8_t> valid, dirty;
    CacheModel(cache::PolicyKind kind, int64_t capacity, int64_t pin_threshold)
        : policy(kind, capacity, pin_threshold), valid(capacity, 0), dirty(capacity, 0) {}
  };

  // One global batch as the planner sees it. keys: its distinct rows, ascending; rows: [n, fields],
  // each id as an index into keys; valid: per distinct row, one bit per worker whose cached copy
  // is valid before the iteration; readers: one bit per worker that reads it (once allocated).
  struct BatchRows {
    int64_t fields = 0;
    std::vector<int64_t> keys;
    std::vector<int32_t> rows;
    std::vector<uint64_t> valid, readers;
  };

  void Allocate(const BatchRows& batch, int64_t iteration, std::vector<int32_t>* assign) const;
  // valid[slot] of worker w's model (the slot holding, or until now holding, `key`), mirrored in
  // valid_by_key_.
  void SetValid(int w, int64_t slot, int64_t key, bool valid);
  // Rule: at the end of t-1 a worker writes back its dirty rows that another worker reads at t.
  void FinishPending(const BatchRows& batch);

  int W_, rank_;
  int64_t b_;
  Allocator allocator_;
  int64_t next_ = 0;
  std::vector<CacheModel> models_;
  // Per row, one bit per worker whose cached copy is valid: one lookup answers for all workers
  // (allocation scores, invalidation) where the models alone would need one per worker.
  FlatMap<uint64_t> valid_by_key_;
  bool has_pending_ = false;
  WorkerPlan pending_;
};

}  // namespace herald
}  // namespace hetu
