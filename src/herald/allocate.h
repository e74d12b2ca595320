#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/no_init.h"
#include "common/parallel.h"

namespace hetu {
namespace herald {

// fn(begin, end) over chunks of [0, n) on the pool's threads, or all of it here without a pool.
// Callers write each index's results to places of its own, so results never depend on the
// thread count.
template <typename Fn>
void ParallelFor(Pool* pool, int64_t n, int64_t min_chunk, Fn fn) {
  if (pool) {
    pool->parallel_for(n, min_chunk, fn);
  } else {
    fn(int64_t(0), n);
  }
}

// Parallel loops give each thread at least this many samples.
constexpr int64_t kMinSamples = 128;

// From this many threads on, a batch's lists are made by parts of its samples in parallel (on 2,
// the parts' bookkeeping costs about what the second thread gives).
constexpr int kPartsFromThreads = 3;

// The pool for steps that pay from kPartsFromThreads threads on: `pool` there, else null (the
// calling thread).
inline Pool* PartsPool(Pool* pool) { return pool && pool->threads() >= kPartsFromThreads ? pool : nullptr; }

// The parts of n samples made apart: one per thread, each of at least kMinSamples samples; one
// part below kPartsFromThreads threads.
inline int64_t SampleParts(Pool* pool, int64_t n) {
  if (!PartsPool(pool)) return 1;
  return std::clamp<int64_t>(n / kMinSamples, 1, pool->threads());
}

// fn(p, first, last) for each part p of [0, n) cut in `parts`, the parts on the pool's threads.
template <typename Fn>
void EachPart(Pool* pool, int64_t n, int64_t parts, Fn fn) {
  ParallelFor(pool, parts, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) fn(p, PartBegin(n, p, parts), PartBegin(n, p + 1, parts));
  });
}

// A global batch's samples as the rows they read: sample s reads rows[begin[s] .. begin[s + 1]),
// each an index into the batch's distinct rows, and each once: a row that several of a sample's
// fields or bags name belongs to the sample once (docs/design.md section 3).
struct SampleRows {
  NoInitVector<int32_t> rows;  // written whole when made
  std::vector<int64_t> begin{0};
  std::vector<int32_t> reading;  // per distinct row: the samples that read it

  int64_t samples() const { return static_cast<int64_t>(begin.size()) - 1; }
  const int32_t* Begin(int64_t s) const { return rows.data() + begin[s]; }
  const int32_t* End(int64_t s) const { return rows.data() + begin[s + 1]; }

  // From slots [n, width] of indices into num_rows distinct rows, where `empty` marks a slot that
  // reads nothing (a bag's padding) and every other index is lowered by `shift`. With a pool of 3
  // threads or more, parts of the samples are read in parallel (the same lists).
  static SampleRows FromSlots(const int32_t* slots, int64_t n, int64_t width, int64_t num_rows, int32_t empty = -1,
                              int32_t shift = 0, Pool* pool = nullptr);
};

// Herald's allocators: which worker trains which sample of a global batch of n samples. Each
// worker receives exactly per_worker samples (n == num_workers * per_worker). Both are
// deterministic: every worker computes the same assignment. GreedyAllocate and ColocateAllocate's
// placement are defined in placement.cpp, its trades in trades.cpp, what ties them in allocate.cpp.

// The rows ColocateAllocate scores, by sample: those several but few enough samples of the batch
// read to be traded over (light), among them those the placement scores (lightest), and apart from
// both the rows no other sample reads (single: their costs are the sample's own whoever else goes
// where, so they are summed once per sample rather than looked at by every step). They follow from
// the batch alone, so a batch's can be found before its turn to be planned (Planner::Prepare).
// light and lightest number their rows among the light rows alone, light_rows[i] being the batch's
// row i names: the allocator's tables of rows then hold these, a fraction of the batch's rows, and
// stay in the nearer caches. single names the batch's rows.
struct ScoredRows {
  SampleRows light, lightest, single;
  std::vector<int32_t> light_rows;  // ascending
};
ScoredRows ScoredRowsOf(const SampleRows& samples, int num_workers, Pool* pool = nullptr);

// valid[r]: one bit per worker whose cache holds a valid copy of row r. Returns the cache scores
// [n, num_workers]: score(s, w) = rows of sample s valid in worker w's cache (docs/design.md section 7).
std::vector<int32_t> CacheScores(const SampleRows& samples, const uint64_t* valid, int num_workers,
                                 Pool* pool = nullptr);

// scores: [n, num_workers], the cache scores. Each sample goes to its best-scoring worker that
// still has room, samples with the highest best score first.
void GreedyAllocate(const int32_t* scores, int64_t n, int num_workers, int64_t per_worker, int64_t iteration,
                    int32_t* assignment, Pool* pool = nullptr);

// samples, valid: as for CacheScores. Each sample goes, in the same order as GreedyAllocate's, to
// the worker with room where it adds the fewest row transmissions to this iteration given the
// samples placed before it: a row valid in that worker's cache is free (the cache score), and so
// is a row that worker already reads this iteration, which would otherwise be shared
// (co-location). Pairs of samples then trade workers while a trade saves rows.
// seconds, if given: the time of the placement [0] and of the trades [1] are added to it.
// readers_out, if given: Readers() of the assignment made. scored: ScoredRowsOf(samples), if already
// found.
void ColocateAllocate(const SampleRows& samples, const uint64_t* valid, int64_t num_rows,
                      int num_workers, int64_t per_worker, int64_t iteration, int32_t* assignment,
                      Pool* pool = nullptr, double* seconds = nullptr, std::vector<uint64_t>* readers_out = nullptr,
                      const ScoredRows* scored = nullptr);

// Who reads each of the batch's num_rows distinct rows under an assignment: one bit per worker.
std::vector<uint64_t> Readers(const SampleRows& samples, int64_t num_rows, const int32_t* assignment);

// The transmissions ColocateAllocate estimates for an assignment (a test's yardstick).
int64_t EstimatedRows(const SampleRows& samples, const uint64_t* valid, int64_t num_rows, const int32_t* assignment);

}  // namespace herald
}  // namespace hetu
