// A worker's cached embedding rows (HET, DESIGN.md section 6): the replacement policy, and per
// slot the row's values, its local version and, with a staleness bound k > 0, the pending local
// updates and the optimizer state the local steps use.
//
// Every operation takes whole batches and names rows by key, never by a slot handed out
// earlier, and one mutex guards the whole store: a prefetch thread may prepare the next step
// while the training thread is still updating this one, and a row evicted in between is simply
// no longer found.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

#include "cache/policy.h"
#include "common/optim_rules.h"

namespace hetu {
namespace cache {

// A local version every server version is ahead of: the row must be pulled.
constexpr int64_t kNeverVersion = INT64_MIN / 4;

// Rows to push: keys ascending within each part, gradients summed, `counts` contributions each.
struct PushRows {
  std::vector<int64_t> keys;
  std::vector<float> grads;
  std::vector<int64_t> counts;
};

struct Prepared {
  std::vector<uint8_t> hit;             // per key: 1 if it was resident before this step
  std::vector<int64_t> local_version;   // per key: what the versioned pull compares against
  PushRows evicted;                     // pending updates of the rows evicted to make room
  int64_t evictions = 0;
};

class RowCache {
 public:
  RowCache(PolicyKind kind, int64_t capacity, int64_t width, int64_t bound, const optim::Config& optimizer,
           int64_t pin_threshold);

  // One step's distinct ascending keys through the policy. Evicted rows leave with their
  // pending updates (k > 0), which the caller pushes with this step's push.
  Prepared Prepare(const int64_t* keys, int64_t n);

  // Stores what the versioned pull returned (rows[j] is keys[pos[j]], at server version
  // versions[j]) in the rows' slots and writes every key's row to out[n, width]. Returns -1,
  // or the position of a key that was neither returned nor valid in the cache.
  int64_t Fill(const int64_t* keys, int64_t n, const int64_t* pos, const float* rows, const int64_t* versions,
               int64_t m, float* out);

  // k = 0 (write-through): the servers step these rows with every worker's sum, so the local
  // copies are stale from now on.
  void MarkStale(const int64_t* keys, int64_t n);

  // k > 0: the cached rows take the optimizer step locally and accumulate the gradient; rows
  // with more than k pending updates, and rows not cached, are returned to be pushed.
  PushRows Step(const int64_t* keys, const float* summed, int64_t n, float lr);

  // k > 0: every pending update, keys ascending (before validation, a checkpoint or the end).
  PushRows Drain();

  int64_t width() const { return width_; }
  int64_t bound() const { return bound_; }
  int64_t capacity() const { return policy_.capacity(); }
  int64_t size() const;
  std::vector<int64_t> Keys() const;
  // The resident row of `key` (values, local version, pending count); false if absent.
  bool Row(int64_t key, float* values, int64_t* version, int64_t* pending) const;

 private:
  void TakePending(int64_t key, int64_t slot, PushRows* out);  // moves a slot's pending updates out
  void ClearSlot(int64_t slot);

  mutable std::mutex mu_;
  CachePolicy policy_;
  const int64_t width_, bound_;
  const optim::Config optimizer_;
  const int slots_per_row_;
  std::vector<float> values_;        // [capacity, width]
  std::vector<int64_t> version_;     // [capacity]
  // k > 0 only:
  std::vector<int64_t> pending_;     // [capacity] local updates not yet pushed
  std::vector<float> pending_grad_;  // [capacity, width] their summed gradient
  std::vector<float> opt_state_;     // [capacity, slots * width]
  std::vector<int64_t> opt_steps_;   // [capacity]
};

}  // namespace cache
}  // namespace hetu
