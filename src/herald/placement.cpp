// Herald's sample placement: the greedy allocator and ColocateAllocate's placement.
#include "herald/placement.h"

#include <algorithm>
#include <limits>
#include <vector>

#include "herald/worker_mask.h"

namespace hetu {
namespace herald {

namespace {

// Ties go to the least-loaded worker, then to the first in a cyclic order that rotates with the
// sample and the iteration, so that no worker is favoured. cost: lower is better. -1 if no
// worker has room.
template <typename Cost>
int BestWorkerWithRoom(const Cost& cost, const std::vector<int64_t>& load, int num_workers, int64_t per_worker,
                       int64_t sample, int64_t iteration) {
  // (cost, load) as one key per worker, lower better, and the lowest found over all workers at
  // once: loops that compilers vectorise, where a running best would be a chain of dependent
  // selects, one per worker.
  constexpr int64_t kNoRoom = std::numeric_limits<int64_t>::max();
  const int64_t span = per_worker + 1;  // above any load of a worker with room
  int64_t key[64];
  int64_t best = kNoRoom;
  for (int w = 0; w < num_workers; ++w) {
    key[w] = load[w] < per_worker ? cost(w) * span + load[w] : kNoRoom;
    best = std::min(best, key[w]);
  }
  if (best == kNoRoom) return -1;
  uint64_t ties = 0;
  for (int w = 0; w < num_workers; ++w) ties |= static_cast<uint64_t>(key[w] == best) << w;
  const int start = static_cast<int>((sample + iteration) % num_workers);
  const uint64_t from_start = ties >> start;  // the ties at start, start + 1, ..., then from 0
  return from_start ? start + __builtin_ctzll(from_start) : __builtin_ctzll(ties);
}

// Samples with the strongest cache preference (highest best score, best[s] >= 0) choose first,
// ties in sample order: a stable counting sort by descending best score.
std::vector<int64_t> StrongestFirst(const std::vector<int32_t>& best) {
  const int64_t n = static_cast<int64_t>(best.size());
  const int32_t top = n ? *std::max_element(best.begin(), best.end()) : 0;
  std::vector<int64_t> start(top + 2, 0);  // start[top - score]: where that score's samples begin
  for (int64_t s = 0; s < n; ++s) ++start[top - best[s] + 1];
  for (size_t i = 1; i < start.size(); ++i) start[i] += start[i - 1];
  std::vector<int64_t> order(n);
  for (int64_t s = 0; s < n; ++s) order[start[top - best[s]]++] = s;
  return order;
}

// score[w] += rows of sample s valid in worker w's cache.
void AddCacheScores(const SampleRows& samples, const uint64_t* valid, int64_t s, int32_t* score) {
  for (const int32_t* r = samples.Begin(s); r != samples.End(s); ++r)
    for (uint64_t m = valid[*r]; m; m &= m - 1) ++score[__builtin_ctzll(m)];
}

}  // namespace

std::vector<int32_t> CacheScores(const SampleRows& samples, const uint64_t* valid, int num_workers, Pool* pool) {
  const int64_t n = samples.samples();
  std::vector<int32_t> scores(n * num_workers, 0);
  ParallelFor(pool, n, kMinSamples, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) AddCacheScores(samples, valid, s, &scores[s * num_workers]);
  });
  return scores;
}

void GreedyAllocate(const int32_t* scores, int64_t n, int num_workers, int64_t per_worker, int64_t iteration,
                    int32_t* assignment, Pool* pool) {
  std::vector<int32_t> best(n);
  ParallelFor(pool, n, 4 * kMinSamples, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s)
      best[s] = *std::max_element(scores + s * num_workers, scores + (s + 1) * num_workers);
  });
  std::vector<int64_t> load(num_workers, 0);
  for (int64_t s : StrongestFirst(best)) {
    const int32_t* row = scores + s * num_workers;
    const int chosen = BestWorkerWithRoom([&](int w) { return -row[w]; }, load, num_workers, per_worker, s, iteration);
    assignment[s] = chosen;
    ++load[chosen];
  }
}

template <typename Mask, typename Lane>
void Place(const SampleRows& samples, const ScoredRows& scored, const WorkerLanes<Mask, Lane>* alone,
           const uint64_t* valid, int64_t num_rows, int W, int64_t per_worker, int64_t iteration, int32_t* assignment,
           Pool* pool) {
  const int64_t n = samples.samples();
  const SampleRows& shared = scored.lightest;
  const int64_t num_light = static_cast<int64_t>(scored.light_rows.size());  // what `shared` numbers
  // Per light row, the workers that read it so far and those holding a valid copy, side by side
  // and as narrow as the workers allow: each sample reads both of each of its rows, at random.
  // (Filled on this thread, the only one that reads it.)
  struct Row {
    Mask readers, valid;
  };
  NoInitVector<Row> row(num_light);  // written whole below
  for (int64_t i = 0; i < num_light; ++i) row[i] = Row{Mask(0), static_cast<Mask>(valid[scored.light_rows[i]])};
  // Every row's valid mask, as narrow, for the cache scores (in parallel from kPartsFromThreads
  // threads: on two, the step costs what the second thread gives).
  NoInitVector<Mask> narrow_valid(num_rows);
  ParallelFor(PartsPool(pool), num_rows, 4096, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) narrow_valid[r] = static_cast<Mask>(valid[r]);
  });
  using Lanes = WorkerLanes<Mask, Lane>;
  // Each sample's best cache score, counted in lanes of its own rather than a [n, W] table.
  std::vector<int32_t> best(n);
  ParallelFor(pool, n, kMinSamples, [&](int64_t begin, int64_t end) {
    for (int64_t s = begin; s < end; ++s) {
      Lanes score{};
      for (const int32_t* r = samples.Begin(s); r != samples.End(s); ++r) score -= Lanes::In(narrow_valid[*r]);
      Lane lanes[Lanes::kAll];
      score.Store(lanes);
      best[s] = *std::max_element(lanes, lanes + W);
    }
  });
  const std::vector<int64_t> order = StrongestFirst(best);
  // The samples one by one, on this thread whatever the pool: a sample's costs are its alone
  // costs and those of its few lightest rows, which cost about what the bookkeeping of blocks
  // placed in parallel and corrected after did (the sequential pass of blocks alone took as long
  // as this whole loop on one core, and longer on many, reading costs from other cores' caches).
  std::vector<int64_t> load(W, 0);
  for (const int64_t s : order) {
    Lanes added = alone[s];
    // (A row every worker reads adds nothing to the lanes of the workers.)
    for (const int32_t* r = shared.Begin(s); r != shared.End(s); ++r) added += Lanes::Added(row[*r].readers, row[*r].valid);
    Lane cost[Lanes::kAll];
    added.Store(cost);
    const int chosen = BestWorkerWithRoom([&](int w) { return cost[w]; }, load, W, per_worker, s, iteration);
    assignment[s] = chosen;
    ++load[chosen];
    const Mask bit = static_cast<Mask>(Bit(chosen));
    for (const int32_t* r = shared.Begin(s); r != shared.End(s); ++r) row[*r].readers |= bit;
  }
}

#define HETU_PLACE(Mask, Lane)                                                                         \
  template void Place<Mask, Lane>(const SampleRows&, const ScoredRows&, const WorkerLanes<Mask, Lane>*, \
                                  const uint64_t*, int64_t, int, int64_t, int64_t, int32_t*, Pool*);
HETU_HERALD_EACH_MASK_AND_LANE(HETU_PLACE)
#undef HETU_PLACE

}  // namespace herald
}  // namespace hetu
