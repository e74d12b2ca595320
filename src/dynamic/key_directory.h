// Which int64 keys of a dynamic table hold a row (docs/design.md section 13): the one rule of
// admission and eviction that the servers, the caches, Herald's planner and the single process
// all apply, so that each of them knows the same resident keys at every step.
//
// A table of `capacity` rows has `buckets` buckets of capacity / buckets ways; key k lives in
// bucket BucketOf(k) = splitmix64(k) mod buckets, at slot (row) bucket * ways + way. Decisions
// are taken at the boundary of each step, from the distinct keys of that step's global batch
// alone, so they never depend on the numbers of workers or servers, nor on the order of keys
// within a batch. Step t, on the distinct keys D_t read at t:
//   1. each key of D_t counts one more read; a resident key's last-read step becomes t;
//   2. with a ttl, each resident key not read for more than ttl steps (t - last read > ttl)
//      leaves (it is never read at t);
//   3. per bucket, the keys of D_t that are not resident and whose count reached admit_after
//      are newcomers, ascending. They take the free ways; if those run out, resident keys not
//      read at t leave, oldest last read first (ties: the smaller key); if every way then holds
//      a key read at t, the newcomers with the larger keys wait. The admitted newcomers, in key
//      order, take the available ways in way order;
//   4. per bucket, the other keys of D_t that are not resident (counts below admit_after, and
//      the newcomers that wait) keep their counts in the bucket's probation slots: the free ones
//      first, then those of keys not read at t, oldest last read first (ties: the smaller key),
//      whose counts are forgotten; if all hold keys read at t, the larger keys' counts are lost.
// A key that leaves is forgotten with its count: if it returns, it counts from zero again and
// is admitted afresh (a new row, drawn from its key, and zero optimizer state).
//
// INT64_MIN cannot be a key (it marks a free slot).
#pragma once
#include <cstdint>
#include <deque>
#include <utility>
#include <vector>

#include "common/flat_map.h"

namespace hetu {
namespace dynamic {

struct DirectoryConfig {
  int64_t capacity = 0;        // rows; a multiple of buckets
  int64_t buckets = 1;
  int64_t admit_after = 1;     // reads before a key holds a row
  int64_t ttl = 0;             // steps without a read before a key leaves; 0: never
  int64_t probation_ways = -1; // probation slots per bucket; -1: as many as ways
};

// Running totals since the table started (a restored table continues its own).
struct DirectoryCounters {
  int64_t resident = 0;
  int64_t capacity = 0;
  int64_t admitted = 0;
  int64_t evicted = 0;
  int64_t missed = 0;  // per step, the distinct keys read that hold no row after the decisions
};

// What a step tells the tables that hold the rows.
struct StepResult {
  std::vector<int64_t> keys;   // distinct keys read, ascending
  std::vector<int64_t> slots;  // slot of each, or -1: not resident (reads zeros, gradient dropped)
  std::vector<int64_t> admitted_keys, admitted_slots;  // new rows to draw from their keys, ascending key
  std::vector<int64_t> evicted_keys, evicted_slots;    // rows that left, ascending key
};

// The whole state, as arrays: saving and restoring it continues the same decisions.
struct DirectoryState {
  int64_t step = 0;  // the last step applied (meaningful when stepped)
  bool stepped = false;
  std::vector<int64_t> keys, slots, counts, last_read;  // resident keys, ascending slot
  std::vector<int64_t> probation_keys, probation_index, probation_counts, probation_last_read;  // ascending index
  int64_t admitted = 0, evicted = 0, missed = 0;
};

// The documented bucket hash: splitmix64 of the key's bits (hetu::rng::splitmix64).
uint64_t BucketHash(int64_t key);

class KeyDirectory {
 public:
  explicit KeyDirectory(const DirectoryConfig& config);

  const DirectoryConfig& config() const { return config_; }
  int64_t ways() const { return ways_; }
  int64_t BucketOf(int64_t key) const;

  // Applies step t (greater than every step before) to the keys of its global batch (any
  // order, repeats allowed). A step taken `revocable` (ahead of its turn, while the step before
  // trains) stays pending until Keep() makes it final or TakeBack() restores the directory as it
  // was before it; nothing else may step, save or load the directory in between.
  StepResult Step(int64_t t, const int64_t* keys, int64_t n, bool revocable = false);
  bool pending() const { return undo_.active; }
  void Keep();
  void TakeBack();

  // slots[i]: the slot of keys[i] now, or -1. Changes nothing.
  void Lookup(const int64_t* keys, int64_t n, int64_t* slots) const;

  DirectoryCounters counters() const;
  DirectoryState Save() const;
  void Load(const DirectoryState& state);

 private:
  struct Pending {
    int64_t bucket, key, count, position;  // position: index in StepResult::keys
  };

  void Evict(int64_t slot, StepResult* out);
  void SweepExpired(int64_t t, StepResult* out);
  void Admit(int64_t t, const Pending* first, const Pending* last, StepResult* out, std::vector<Pending>* waiting);
  void KeepCounts(int64_t t, const Pending* first, const Pending* last);
  void RebuildExpiryQueue();
  // Before a change of slot `slot` (or of probation slot `slot`): its values, for TakeBack.
  void Remember(int64_t slot);
  void RememberProbation(int64_t j);

  // One kind of slot (resident, or probation) as a revocable step found it before each change:
  // Restore puts the values back, last change first, and the slot's key in `where`.
  struct SlotLog {
    std::vector<int64_t> at, keys, counts, last_reads;
    void Record(int64_t i, const std::vector<int64_t>& key, const std::vector<int64_t>& count,
                const std::vector<int64_t>& last_read);
    void Restore(std::vector<int64_t>* key, std::vector<int64_t>* count, std::vector<int64_t>* last_read,
                 FlatMap<int64_t>* where) const;
  };
  // What a revocable step changed, in order: the slots' and probation slots' values before
  // each change, the counters before it, and the expiry queue's reads popped from its front and
  // pushed at its back.
  struct Undo {
    bool active = false;
    int64_t step = 0, resident = 0, admitted = 0, evicted = 0, missed = 0;
    bool stepped = false;
    SlotLog slots, places;
    std::vector<std::pair<int64_t, int64_t>> popped;
    size_t pushed = 0;
  };
  Undo undo_;

  DirectoryConfig config_;
  int64_t ways_ = 0;
  int64_t probation_ways_ = 0;

  // Per slot: its key (FlatMap<int64_t>::kEmpty when free), count and last-read step.
  std::vector<int64_t> key_, count_, last_read_;
  FlatMap<int64_t> slot_of_;
  // Per probation slot (bucket * probation_ways + j): the same for keys not yet admitted.
  std::vector<int64_t> probation_key_, probation_count_, probation_last_read_;
  FlatMap<int64_t> probation_of_;

  // (step, slot) of each read of a resident key, oldest first: with a ttl, the keys that may
  // have expired are at its front. An entry is stale once its slot was read again or changed key.
  std::deque<std::pair<int64_t, int64_t>> reads_;

  void DistinctKeys(const int64_t* keys, int64_t n, std::vector<int64_t>* out);
  std::vector<int64_t> scratch_ways_, scratch_old_;  // Admit's and KeepCounts' working lists
  std::vector<int64_t> scratch_set_;                  // DistinctKeys' open-addressed set
  std::vector<uint64_t> scratch_sort_a_, scratch_sort_b_;
  std::vector<uint8_t> admitted_at_;                 // per distinct key of the step: admitted now

  int64_t step_ = 0;
  bool stepped_ = false;
  int64_t resident_ = 0, admitted_ = 0, evicted_ = 0, missed_ = 0;
};

}  // namespace dynamic
}  // namespace hetu
