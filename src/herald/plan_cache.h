// A worker's cached embedding rows under Herald's plan (docs/design.md section 7): the replacement
// policy (the CachePolicy the scheduler models, so predicted hits are actual hits), and per slot
// the row's values, optimizer state and step count, whether the copy is valid (equal to the
// servers' row) and whether it is dirty (stepped here, not yet written back).
//
// A step is Begin (the policy, checked against the plan; cached valid rows copied out) and
// Finish (owner rows stepped and kept, shared rows' copies dropped, invalidations, the planned
// write-back gathered). The pulls and the push are the caller's (hetu.rows.herald.HeraldTable).
// Only the training thread uses it: no lock.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "cache/policy.h"
#include "cache/stored_rows.h"
#include "common/optim_rules.h"

namespace hetu {
namespace herald {

// Rows sent to the servers as they are here: values, optimizer state and step counts.
struct RowsOut {
  std::vector<int64_t> keys;
  std::vector<float> values, state;
  std::vector<int64_t> steps;
};

class PlanCache {
 public:
  PlanCache(cache::PolicyKind kind, int64_t capacity, int64_t width, const optim::Config& optimizer,
            int64_t pin_threshold);

  // The step's distinct ascending keys through the policy. Fails (a message; nothing changed
  // but the policy) if the hits or the rows to pull differ from the plan's. Writes the rows that
  // are valid here to vals [n, width], state [n, state_width] and steps [n]; the caller fills the
  // pulled ones. Evicted dirty rows are kept until this step's write-back. Under a catch-up kind
  // the valid rows are first brought to step `catch_up_to` (the pulled ones come so from the
  // servers).
  std::string Begin(const int64_t* keys, int64_t n, const uint8_t* plan_hit, const uint8_t* plan_pull, float* vals,
                    float* state, int64_t* steps, int64_t* served, int64_t* evictions, int64_t catch_up_to = 0);

  // After the backward pass, with the arrays Begin filled (and the pulls completed): steps the
  // owner rows (owner computes) with their summed gradients [n, width], keeps them dirty,
  // drops the cached copies of shared rows, invalidates `invalidate`, and gathers the planned
  // write-back (ascending keys) into *out. Fails if a dirty row would be invalidated.
  std::string Finish(const int64_t* keys, int64_t n, const uint8_t* owner, const float* summed, float lr, float* vals,
                     float* state, int64_t* steps, const int64_t* invalidate, int64_t num_invalidate,
                     const int64_t* writeback, int64_t num_writeback, RowsOut* out);

  // The cached copies of `keys` (n of them) are dropped, neither valid nor dirty, and stay
  // resident (Planner::Forget, which the plan followed): rows whose old contents are discarded.
  // Between steps only (after Finish, before Begin).
  void Forget(const int64_t* keys, int64_t n);

  // Every dirty row, ascending keys, now clean (before validation, a checkpoint or the end).
  RowsOut Drain();

  int64_t width() const { return width_; }
  int64_t state_width() const { return state_width_; }
  int64_t capacity() const { return policy_.capacity(); }

 private:
  void Append(RowsOut* out, int64_t key, const float* values, const float* state, int64_t steps) const;
  void AppendSlot(RowsOut* out, int64_t key, int64_t slot) const;  // a cached row, widened

  cache::CachePolicy policy_;
  const int64_t width_, state_width_;
  const optim::Config optimizer_;
  cache::StoredRows values_;  // in the table's storage type
  std::vector<float> state_;
  std::vector<int64_t> steps_;
  std::vector<uint8_t> valid_, dirty_;

  // The current step, between Begin and Finish.
  std::vector<int64_t> step_keys_, step_slots_;
  RowsOut evicted_;  // evicted dirty rows, ascending keys
};

}  // namespace herald
}  // namespace hetu
