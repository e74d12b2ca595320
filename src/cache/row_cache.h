// A worker's cached embedding rows (HET, docs/design.md section 6): the replacement policy, and per
// slot the row's values, its optimizer state and step count (as pulled, then stepped locally by
// the servers' rule), its local version and, with a staleness bound k > 0, the pending local
// updates not yet pushed.
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
#include "cache/stored_rows.h"
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
  // versions[j], with optimizer state state[j] and step count steps[j] when the pull brought
  // them, else null) in the rows' slots and writes every key's row to out[n, width]. Returns -1,
  // or the position of a key that was neither returned nor valid in the cache. Under a catch-up
  // kind the cached rows read are first brought to step `catch_up_to` (the returned ones come so
  // from the servers): the same rows, bit for bit, as the servers' copies brought there.
  int64_t Fill(const int64_t* keys, int64_t n, const int64_t* pos, const float* rows, const int64_t* versions,
               const float* state, const int64_t* steps, int64_t m, float* out, int64_t catch_up_to = 0);

  // The cached rows take the optimizer step locally, by the servers' rule with the state cached
  // beside them, and count it as pending. Rows with more than k pending updates are due: their
  // version takes the pending count and they are returned to be pushed, with rows not cached.
  // At k = 0 every row is due at once, so nothing accumulates: the cached rows' versions take
  // their one contribution here and the caller pushes `summed` as it is (nothing is returned).
  PushRows Step(const int64_t* keys, const float* summed, int64_t n, float lr);

  // k > 0: every pending update, keys ascending (before validation, a checkpoint or the end).
  PushRows Drain();

  int64_t width() const { return width_; }
  int64_t bound() const { return bound_; }
  int64_t capacity() const { return policy_.capacity(); }
  int64_t state_width() const { return state_width_; }
  int64_t size() const;
  std::vector<int64_t> Keys() const;
  // The resident row of `key` (values, optimizer state, steps, local version, pending count);
  // false if absent.
  bool Row(int64_t key, float* values, float* state, int64_t* steps, int64_t* version, int64_t* pending) const;

 private:
  void TakePending(int64_t key, int64_t slot, PushRows* out);  // moves a slot's pending updates out
  void ClearSlot(int64_t slot);

  mutable std::mutex mu_;
  CachePolicy policy_;
  const int64_t width_, bound_;
  const optim::Config optimizer_;
  const int64_t state_width_;  // optimizer state floats per row
  StoredRows values_;                // [capacity, width], in the table's storage type
  std::vector<int64_t> version_;     // [capacity]
  std::vector<float> opt_state_;     // [capacity, state_width]
  std::vector<int64_t> opt_steps_;   // [capacity]
  std::vector<int64_t> pending_;     // [capacity] local updates not yet pushed (k > 0)
  std::vector<float> pending_grad_;  // [capacity, width] their summed gradient (k > 0 only)
};

}  // namespace cache
}  // namespace hetu
