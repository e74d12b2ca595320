// Herald's allocators: which worker trains which sample of a global batch.
#include "herald/allocate.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <string>

#include "herald/worker_mask.h"

namespace hetu {
namespace herald {

namespace {

// Parallel loops give each thread at least this many samples.
constexpr int64_t kMinSamples = 128;

// From this many threads on, a batch's lists are made by parts of its samples in parallel (on 2,
// the parts' bookkeeping costs about what the second thread gives).
constexpr int kPartsFromThreads = 3;

// The pool for steps that pay from kPartsFromThreads threads on: `pool` there, else null (the
// calling thread).
Pool* PartsPool(Pool* pool) { return pool && pool->threads() >= kPartsFromThreads ? pool : nullptr; }

// The parts of n samples made apart: one per thread, each of at least kMinSamples samples; one
// part below kPartsFromThreads threads.
int64_t SampleParts(Pool* pool, int64_t n) {
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
// ties in sample order: a stable counting sort by descending best score. (The trades order their
// candidates by saving with it too.)
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

// Whether a mask holds exactly one worker.
template <typename Mask>
inline bool OneWorker(Mask m) {
  return (m != 0) & ((m & static_cast<Mask>(m - 1)) == 0);
}

// Rows one iteration moves for a row read by the workers in `readers`, whose cached copies are
// valid at `valid` (section 7's plan): a pull for each reader without a valid copy; a gradient
// push from each reader when several read it; a write-back when a single holder's copy (dirty,
// as far as the estimate knows) is read elsewhere. Without branches: the sweeps ask it of rows
// at random, whose cases a branch would mispredict at nearly every row.
template <typename Mask>
inline __attribute__((always_inline)) int RowCost(Mask readers, Mask valid) {
  const int n = Workers(readers);
  const int pushes = n >= 2 ? n : 0;
  const int writeback = (readers != 0) & (valid != readers) & OneWorker(valid);
  return Workers(static_cast<Mask>(readers & ~valid)) + pushes + writeback;
}

// RowCost(m | Bit(w), v) - RowCost(m, v) for a worker w outside m: k1, plus k2 if w holds no
// valid copy (RowCost's three terms, case by case, as arithmetic rather than branches); 0 for w
// in m. No reader yet: w pulls (k2), and a sole holder's write-back goes (k1 + k2 = 2) or not.
// One reader: it becomes two, both push (2), and a write-back comes where the one reader is the
// sole holder (3). More: w pushes (1).
struct AddedCost {
  int k1, k2;
};
template <typename Mask>
inline AddedCost Added(Mask m, Mask v) {
  const int none = m == 0, one = OneWorker(m);
  return {(1 - none) * (1 + one * (1 + (v == m))), 1 + none * OneWorker(v)};
}
// What worker w adds, from the row's AddedCost c = Added(m, v): 0 for w in m. (WorkerLanes::Added
// is the same for every worker at once.)
template <typename Mask>
inline int AddedBy(AddedCost c, Mask m, Mask v, int w) {
  const int out = 1 - (m >> w & 1), pulls = 1 - (v >> w & 1);
  return out * (c.k1 + pulls * c.k2);
}

// Per-worker sums as vector lanes, one per worker, in 16-byte vectors (GCC and Clang vector
// extensions: SSE2 on any x86-64, NEON on ARM): each of a sample's rows adds to the lanes of the
// workers in or out of its masks with a few whole-vector operations, where a loop over a mask's
// bits mispredicts at nearly every row. Lane: int16_t (eight lanes to a vector) where the sums
// fit, which halves the operations per row; int32_t (four) otherwise (kNarrowLanesUpTo). Integer
// sums: the same on every CPU. Lanes past the cluster's workers are never read.
template <typename Lane>
struct LaneVector;
template <>
struct LaneVector<int16_t> {
  typedef int16_t type __attribute__((vector_size(16)));
};
template <>
struct LaneVector<int32_t> {
  typedef int32_t type __attribute__((vector_size(16)));
};

// of[b]: -1 in lane i where bit i of b is set, for every b of as many bits as a vector has lanes.
template <typename Lane>
struct LaneBits {
  static constexpr int kLanes = 16 / sizeof(Lane);
  typename LaneVector<Lane>::type of[1 << kLanes];
  LaneBits() {
    for (int b = 0; b < (1 << kLanes); ++b)
      for (int i = 0; i < kLanes; ++i) of[b][i] = static_cast<Lane>(-(b >> i & 1));
  }
};
template <typename Lane>
const LaneBits<Lane> kLaneBits;

// A sample's lane sums stay within 8 per row it reads (RowCost changes by at most 4 as a reader
// leaves or joins a row): 16-bit lanes hold the sums of samples of up to this many rows.
constexpr int64_t kNarrowLanesUpTo = 4095;

template <typename Mask, typename Lane>
struct WorkerLanes {
  using Vector = typename LaneVector<Lane>::type;
  static constexpr int kLanes = 16 / sizeof(Lane);
  static constexpr int kVectors = (8 * sizeof(Mask) + kLanes - 1) / kLanes;
  static constexpr int kAll = kVectors * kLanes;  // lanes in all, at least one per bit of Mask
  Vector v[kVectors] = {};

  // The lanes' bits of m: vector c's.
  static int Bits(uint64_t m, int c) { return static_cast<int>(m >> (kLanes * c) & ((1u << kLanes) - 1)); }
  // -1 in lane w where worker w is in m, else 0.
  static WorkerLanes In(Mask m) {
    WorkerLanes out;
    for (int c = 0; c < kVectors; ++c) out.v[c] = kLaneBits<Lane>.of[Bits(m, c)];
    return out;
  }
  // Lane w: RowCost(m | Bit(w), v) - RowCost(m, v), what worker w would add to the row's cost by
  // reading it (0 for the workers in m).
  static WorkerLanes Added(Mask m, Mask valid) {
    const AddedCost c = herald::Added(m, valid);
    const uint64_t out_m = static_cast<Mask>(~m), out_v = static_cast<Mask>(~valid);
    const Lane k1 = static_cast<Lane>(c.k1), k2 = static_cast<Lane>(c.k2);
    WorkerLanes out;
    for (int i = 0; i < kVectors; ++i)
      out.v[i] = kLaneBits<Lane>.of[Bits(out_m, i)] & (k1 + (kLaneBits<Lane>.of[Bits(out_v, i)] & k2));
    return out;
  }
  WorkerLanes& operator+=(const WorkerLanes& o) {
    for (int c = 0; c < kVectors; ++c) v[c] += o.v[c];
    return *this;
  }
  WorkerLanes& operator-=(const WorkerLanes& o) {
    for (int c = 0; c < kVectors; ++c) v[c] -= o.v[c];
    return *this;
  }
  // Lane w to out[w], every lane (out holds kAll).
  void Store(Lane* out) const { std::memcpy(out, v, sizeof v); }
  Lane At(int w) const { return v[w / kLanes][w % kLanes]; }
  // Bit w set where lane w is above 0.
  uint64_t Positive() const {
    uint64_t bits = 0;
    for (int c = 0; c < kVectors; ++c) {
      const Vector above = v[c] > 0;  // -1 where so
      uint64_t these = 0;
#if defined(__SSE2__)
      if constexpr (sizeof(Lane) == 2) {
        typedef short Shorts __attribute__((vector_size(16)));
        typedef char Bytes __attribute__((vector_size(16)));
        const Bytes packed = __builtin_ia32_packsswb128((Shorts)above, Shorts{});  // lane i to byte i
        these = static_cast<uint64_t>(__builtin_ia32_pmovmskb128(packed));
      } else {
        typedef float Floats __attribute__((vector_size(16)));  // movmskps takes the sign bit of each lane
        these = static_cast<uint64_t>(__builtin_ia32_movmskps((Floats)above));
      }
#else
      for (int i = 0; i < kLanes; ++i) these |= static_cast<uint64_t>(above[i] & 1) << i;
#endif
      bits |= these << (kLanes * c);
    }
    return bits;
  }
  static WorkerLanes Splat(Lane x) {
    WorkerLanes out;
    for (int c = 0; c < kVectors; ++c) out.v[c] = Vector{} + x;
    return out;
  }
};

// A row read by more samples of the global batch than this ends up on several workers whatever
// the allocation; counted as read by all (left out of the placement's costs, to which such a row
// adds nothing), it does not pull every later sample that reads it towards the worker that
// happened to take its first one.
constexpr int32_t kSharedAnyway = 4;

// Every pair of workers once, in rounds where each worker is in one pair at most (the circle
// method: worker m - 1 stays, the others turn; with an odd count, the pairs of a worker m - 1 that
// does not exist are left out). A pair is (lower, higher).
std::vector<std::vector<std::pair<int, int>>> PairRounds(int num_workers) {
  const int m = num_workers + (num_workers & 1);
  std::vector<std::vector<std::pair<int, int>>> rounds(m - 1);
  for (int k = 0; k < m - 1; ++k)
    for (int i = 0; i < m / 2; ++i) {
      const int a = i == 0 ? m - 1 : (k + i) % (m - 1), b = (k - i + m - 1) % (m - 1);
      if (a < num_workers && b < num_workers) rounds[k].emplace_back(std::min(a, b), std::max(a, b));
    }
  return rounds;
}

// Pairwise trades: a sample at worker a that would save rows at b changes places with one at b
// that would save rows at a, when the two moves together save rows. Loads are unchanged.
// Count: the type of the per-row, per-worker sample counts, wide enough for the batch's samples;
// Mask: the type of a row's worker masks, wide enough for the workers. (Narrow types keep more of
// the rows in the CPU's caches: the sweeps read a row's masks at random for every sample.)
// Lane: WorkerLanes' lanes.
template <typename Count, typename Mask, typename Lane>
class Trader {
 public:
  // The rows traded over are scored.light's, numbered as scored.light_rows; the rows no other
  // sample reads come in through alone, their AloneCosts.
  Trader(const ScoredRows& scored, const WorkerLanes<Mask, Lane>* alone, const uint64_t* valid, int num_workers,
         int32_t* assignment, Pool* pool)
      : samples_(scored.light), alone_(alone), n_(samples_.samples()), W_(num_workers),
        everyone_(static_cast<Mask>(AllWorkers(num_workers))), assign_(assignment), pool_(pool),
        count_(scored.light_rows.size() * num_workers + 8),  // + 8: CountMasks reads 8 at once
        row_(scored.light_rows.size()) {
    const int64_t num_rows = static_cast<int64_t>(row_.size());
    const int32_t* batch_row = scored.light_rows.data();
    ParallelFor(pool_, num_rows, 4096, [&](int64_t first, int64_t last) {
      std::fill(&count_[first * W_], &count_[last * W_], Count(0));
    });
    std::fill(count_.end() - 8, count_.end(), Count(0));
    // By worker: each task counts the samples of its own workers. Then by rows: a row's masks
    // from its counts, a pass that reads them in order (setting bits as each count reaches 1
    // and 2 was a branch per (sample, row) pair, and atomic with several tasks).
    ParallelFor(pool_, W_, 1, [&](int64_t first, int64_t last) {
      for (int64_t s = 0; s < n_; ++s) {
        const int w = assign_[s];
        if (w < first || w >= last) continue;
        for (const int32_t* r = Begin(s); r != End(s); ++r) ++CountOf(*r, w);
      }
    });
    ParallelFor(pool_, num_rows, 4096, [&](int64_t first, int64_t last) {
      for (int64_t r = first; r < last; ++r) {
        uint64_t readers, once;
        CountMasks(&count_[r * W_], &readers, &once);
        row_[r] = RowReaders{static_cast<Mask>(readers), static_cast<Mask>(once), static_cast<Mask>(valid[batch_row[r]])};
      }
    });
  }

  // Returns the number of trades made.
  int64_t Sweep() {
    // wants[a * W + b]: samples at a that would save rows at b (against the assignment as the
    // sweep finds it), the largest saving first. Parts of the samples gather theirs apart; each
    // list is then sorted by (saving, sample), an order that does not depend on the parts.
    using Wants = std::vector<std::vector<std::pair<int, int64_t>>>;
    const int parts = pool_ ? static_cast<int>(std::clamp<int64_t>(n_ / kMinSamples, 1, pool_->threads())) : 1;
    std::vector<Wants> found(parts, Wants(W_ * W_));
    EachPart(parts > 1 ? pool_ : nullptr, n_, parts, [&](int64_t p, int64_t first, int64_t last) {
      Lane saving[Lanes::kAll];  // Savings stores every lane
      for (int64_t s = first; s < last; ++s) {
        const int a = assign_[s];
        for (uint64_t to = Savings(s, saving); to; to &= to - 1)
          found[p][a * W_ + __builtin_ctzll(to)].emplace_back(-saving[__builtin_ctzll(to)], s);
      }
    });
    Wants wants(W_ * W_);
    ParallelFor(pool_, W_ * W_, W_, [&](int64_t first, int64_t last) {
      for (int64_t i = first; i < last; ++i) SortBySaving(found, i, &wants[i]);
    });
    // The pairs of workers trade in rounds, each worker in one pair of a round, the pairs of a round
    // at once. A pair sees the other workers' readers as the round found them: its own moves
    // change only its own workers' counts, and the rows' masks take them in after the round.
    int64_t trades = 0;
    for (const std::vector<std::pair<int, int>>& round : rounds_) {
      std::vector<std::vector<int64_t>> traded(round.size());
      ParallelFor(pool_, static_cast<int64_t>(round.size()), 1, [&](int64_t first, int64_t last) {
        for (int64_t i = first; i < last; ++i) {
          const auto [a, b] = round[i];
          Match(a, b, wants[a * W_ + b], wants[b * W_ + a], &traded[i]);
        }
      });
      // Each pair's bits of the rows its samples left and joined, the pairs at once (Recount: a
      // row's other bits are other pairs').
      ParallelFor(pool_, static_cast<int64_t>(round.size()), 1, [&](int64_t first, int64_t last) {
        for (int64_t i = first; i < last; ++i)
          for (const int64_t s : traded[i])
            for (const int32_t* r = Begin(s); r != End(s); ++r) {
              Recount(*r, round[i].first);
              Recount(*r, round[i].second);
            }
      });
      for (const std::vector<int64_t>& t : traded) trades += static_cast<int64_t>(t.size()) / 2;
    }
    return trades;
  }

 private:
  // List i of the parts' lists (each a list of (-saving, sample), samples ascending, the parts in
  // sample order) as one, sorted by (-saving, sample): a stable counting sort of the parts' lists
  // in turn, savings being a few rows (no list joined first).
  template <typename Wants>
  static void SortBySaving(const std::vector<Wants>& parts, int64_t i, std::vector<std::pair<int, int64_t>>* out) {
    int top = 0;
    size_t total = 0;
    for (const Wants& part : parts) {
      for (const auto& e : part[i]) top = std::max(top, -e.first);
      total += part[i].size();
    }
    std::vector<int64_t> start(top + 2, 0);  // start[top - saving]: where that saving's samples begin
    for (const Wants& part : parts)
      for (const auto& e : part[i]) ++start[top + e.first + 1];
    for (size_t k = 1; k < start.size(); ++k) start[k] += start[k - 1];
    out->resize(total);
    for (const Wants& part : parts)
      for (const auto& e : part[i]) (*out)[start[top + e.first]++] = e;
  }

  const int32_t* Begin(int64_t s) const { return samples_.Begin(s); }
  const int32_t* End(int64_t s) const { return samples_.End(s); }

  // out[to]: rows saved by moving sample s from its worker to `to`; out holds a lane per bit of
  // Mask. Returns a bit per worker where the saving is positive (never s's own), 0 where no move
  // saves rows (out then left as it was).
  uint64_t Savings(int64_t s, Lane* out) const {
    const int from = assign_[s];
    // Per row, with `rest` its readers without s: now - RowCost(rest | Bit(to)) = (now -
    // RowCost(rest)) - what adding `to` to rest adds, and now - RowCost(rest) is what adding
    // `from` back adds (0 where s is not from's last reader of it). So the saving at `to` is
    // added[from] - added[to], summed over the rows: the rows s alone reads (alone_) and the others.
    Lanes added = alone_[s];
    for (const int32_t* r = Begin(s); r != End(s); ++r) {
      const RowReaders& row = row_[*r];
      added += Lanes::Added(static_cast<Mask>(row.readers & ~(row.once & MaskBit(from))), row.valid);
    }
    // A move adds cost everywhere but where the rows s alone reads at its worker leave it
    // (`same`, the part of the saving that does not depend on the destination): without their
    // saving, none saves rows.
    const int same = added.At(from);
    if (same <= 0) return 0;
    Lanes saving = Lanes::Splat(static_cast<Lane>(same));
    saving -= added;
    saving.Store(out);
    return saving.Positive() & everyone_ & ~Bit(from);
  }

  // The trades of workers a and b: a sample at a that would save rows at b (from ab, the largest
  // saving first) goes there with the first sample at b (from ba) that, moved to a, makes the two
  // moves save rows together. The samples traded go to `traded`, two by two.
  void Match(int a, int b, const std::vector<std::pair<int, int64_t>>& ab,
             const std::vector<std::pair<int, int64_t>>& ba, std::vector<int64_t>* traded) {
    size_t j = 0;
    for (size_t i = 0; i < ab.size() && j < ba.size(); ++i) {
      // Earlier trades may have moved the sample or changed its saving.
      const int64_t s = ab[i].second;
      if (assign_[s] != a) continue;
      const int g = SavingTo(s, b, a, b);
      if (g <= 0) continue;
      Move(s, b);
      bool done = false;
      for (; j < ba.size() && !done; ++j) {
        const int64_t t = ba[j].second;
        if (assign_[t] != b) continue;
        if (g + SavingTo(t, a, a, b) > 0) {
          Move(t, a);
          traded->push_back(s);
          traded->push_back(t);
          done = true;
        }
      }
      if (!done) Move(s, a);
    }
  }

  // Savings(s)[to] alone, for a sample of worker a or b trading between the two: the workers a
  // and b read a row as their counts say now, the others as the row's masks say.
  int SavingTo(int64_t s, int to, int a, int b) const {
    const int from = assign_[s];
    const Mask pair = MaskBit(a) | MaskBit(b);
    int saving = alone_[s].At(from) - alone_[s].At(to);
    for (const int32_t* r = Begin(s); r != End(s); ++r) {
      const RowReaders& row = row_[*r];
      const Count ca = count_[*r * W_ + a], cb = count_[*r * W_ + b];
      const Mask readers = static_cast<Mask>((row.readers & ~pair) | (ca > 0 ? MaskBit(a) : 0) | (cb > 0 ? MaskBit(b) : 0));
      const Mask once = static_cast<Mask>((row.once & ~pair) | (ca == 1 ? MaskBit(a) : 0) | (cb == 1 ? MaskBit(b) : 0));
      const Mask rest = readers & ~(once & MaskBit(from));
      // As in Savings: what adding `from` back to rest adds, less what adding `to` adds.
      const AddedCost c = herald::Added(rest, row.valid);
      saving += AddedBy(c, rest, row.valid, from) - AddedBy(c, rest, row.valid, to);
    }
    return saving;
  }

  // Sample s to worker `to`: its counts only (the rows' masks follow after the round).
  void Move(int64_t s, int to) {
    const int from = assign_[s];
    for (const int32_t* r = Begin(s); r != End(s); ++r) {
      --CountOf(*r, from);
      ++CountOf(*r, to);
    }
    assign_[s] = to;
  }

  // The workers whose count at c (a row's W counts) is above 0, and those where it is 1: eight
  // counts at a time where counts are 16-bit and SSE2 is there (compare, pack, take the sign
  // bits), else one by one.
  void CountMasks(const Count* c, uint64_t* readers, uint64_t* once) const {
    uint64_t above = 0, one = 0;
#if defined(__SSE2__)
    if constexpr (sizeof(Count) == 2) {
      typedef short Shorts __attribute__((vector_size(16)));
      typedef char Bytes __attribute__((vector_size(16)));
      for (int w = 0; w < W_; w += 8) {  // past W: the next row's counts (or padding), masked off below
        Shorts v;
        std::memcpy(&v, c + w, sizeof v);
        const Shorts zero = {}, ones = {1, 1, 1, 1, 1, 1, 1, 1};
        const Bytes packed = __builtin_ia32_packsswb128(v != zero, v == ones);  // -1 where so
        const uint64_t bits = static_cast<uint32_t>(__builtin_ia32_pmovmskb128(packed));
        above |= (bits & 0xFF) << w;
        one |= (bits >> 8) << w;
      }
      *readers = above & everyone_;
      *once = one & everyone_;
      return;
    }
#endif
    for (int w = 0; w < W_; ++w) {
      above |= static_cast<uint64_t>(c[w] > 0) << w;
      one |= static_cast<uint64_t>(c[w] == 1) << w;
    }
    *readers = above;
    *once = one;
  }

  using Lanes = WorkerLanes<Mask, Lane>;
  static Mask MaskBit(int w) { return static_cast<Mask>(Bit(w)); }
  // Row r's bits for worker w, from the count of w's samples that read it: with several threads,
  // atomically where they change (other tasks may set other workers' bits of the row at once).
  void Recount(int64_t r, int w) {
    const int64_t c = CountOf(r, w);
    RowReaders& row = row_[r];
    const Mask bit = MaskBit(w);
    if (!pool_) {
      row.readers = static_cast<Mask>((row.readers & ~bit) | (c > 0 ? bit : 0));
      row.once = static_cast<Mask>((row.once & ~bit) | (c == 1 ? bit : 0));
      return;
    }
    SetBit(&row.readers, bit, c > 0);
    SetBit(&row.once, bit, c == 1);
  }
  static void SetBit(Mask* m, Mask bit, bool on) {
    if (((__atomic_load_n(m, __ATOMIC_RELAXED) & bit) != 0) == on) return;
    if (on) {
      __atomic_fetch_or(m, bit, __ATOMIC_RELAXED);
    } else {
      __atomic_fetch_and(m, static_cast<Mask>(~bit), __ATOMIC_RELAXED);
    }
  }

  const SampleRows& samples_;
  const WorkerLanes<Mask, Lane>* alone_;
  int64_t n_;
  int W_;
  Mask everyone_;
  int32_t* assign_;
  Pool* pool_;
  // [light rows, W]: samples of each worker that read each row (a row's counts together: a move
  // changes two of them).
  NoInitVector<Count> count_;
  Count& CountOf(int64_t r, int w) { return count_[r * W_ + w]; }
  // What Savings asks of a row, in one place: one bit per worker with count_ > 0 (readers), with
  // count_ == 1 (once: the row leaves the worker with that sample), with a valid copy.
  // (Padded to a power of two below 8-byte masks, so that no row straddles two cache lines.)
  struct alignas(sizeof(Mask) < 8 ? 4 * sizeof(Mask) : 8) RowReaders {
    Mask readers = 0, once = 0, valid = 0;
  };
  std::vector<RowReaders> row_;
  // The pairs of workers, in rounds where each worker is in one pair at most.
  std::vector<std::vector<std::pair<int, int>>> rounds_ = PairRounds(W_);
};

constexpr int kTradeSweeps = 2;

}  // namespace

namespace {

// Per row, the samples that read it and the last of them, side by side: one cache line.
struct Reading {
  int32_t count = 0, last = -1;
};

// FromSlots for samples [first, last): each sample's rows, each once, in slot order, written to
// `rows` on, with each sample's count of rows in size[s - first]. Counts the samples of each row in
// `reading`. Returns the rows written.
int64_t ReadSlots(const int32_t* slots, int64_t first, int64_t last, int64_t width, int32_t empty, int32_t shift,
                  Reading* reading, int32_t* rows, int64_t* size) {
  int64_t taken = 0;
  for (int64_t s = first; s < last; ++s) {
    __builtin_prefetch(slots + (s + 64) * width);  // the slots ahead: megabytes, read once
    const int64_t before = taken;
    for (const int32_t* v = slots + s * width; v != slots + (s + 1) * width; ++v) {
      if (*v == empty) continue;
      const int32_t r = *v - shift;
      Reading& row = reading[r];
      if (row.last == s) continue;
      row.last = static_cast<int32_t>(s);
      ++row.count;
      rows[taken++] = r;
    }
    size[s - first] = taken - before;
  }
  return taken;
}

}  // namespace

SampleRows SampleRows::FromSlots(const int32_t* slots, int64_t n, int64_t width, int64_t num_rows, int32_t empty,
                                 int32_t shift, Pool* pool) {
  SampleRows out;
  out.begin.assign(n + 1, 0);
  out.reading.resize(num_rows);
  // Parts of the samples in parallel (SampleParts), each with a count per row of its own: at most
  // 32 MiB of them.
  const int64_t parts =
      std::clamp<int64_t>((int64_t(32) << 20) / std::max<int64_t>(1, num_rows * 8), 1, SampleParts(pool, n));
  if (parts == 1) {
    std::vector<Reading> reading(num_rows);
    out.rows.resize(n * width);
    out.rows.resize(ReadSlots(slots, 0, n, width, empty, shift, reading.data(), out.rows.data(), &out.begin[1]));
    for (int64_t s = 0; s < n; ++s) out.begin[s + 1] += out.begin[s];
    for (int64_t r = 0; r < num_rows; ++r) out.reading[r] = reading[r].count;
    return out;
  }
  // Each part reads its samples into rows of its own (from its first sample's first slot), then
  // the parts' rows go end to end, and the rows' counts are summed over the parts.
  std::vector<std::vector<Reading>> reading(parts);
  NoInitVector<int32_t> scratch(n * width);
  std::vector<int64_t> taken(parts + 1, 0);
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) {
    reading[p].resize(num_rows);
    taken[p + 1] = ReadSlots(slots, first, last, width, empty, shift, reading[p].data(), &scratch[first * width],
                             &out.begin[first + 1]);
  });
  for (int64_t p = 0; p < parts; ++p) taken[p + 1] += taken[p];
  out.rows.resize(taken[parts]);
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) {
    std::copy(&scratch[first * width], &scratch[first * width] + (taken[p + 1] - taken[p]), &out.rows[taken[p]]);
    int64_t at = taken[p];
    for (int64_t s = first; s < last; ++s) out.begin[s + 1] = at += out.begin[s + 1];
  });
  ParallelFor(pool, num_rows, 4096, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int32_t count = 0;
      for (int64_t p = 0; p < parts; ++p) count += reading[p][r].count;
      out.reading[r] = count;
    }
  });
  return out;
}

namespace {

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

namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Per sample, lane w: what the rows that no other sample reads (single) cost if the sample goes to
// worker w, summed over them. Such a row's readers are the sample's worker alone, whatever the
// other samples do: the placement scores it as a row no one reads yet, and moving the sample from
// worker a to b saves alone[a] - alone[b] of it. So the sequential steps need not look at it.
template <typename Mask, typename Lane>
std::vector<WorkerLanes<Mask, Lane>> AloneCosts(const SampleRows& single, const uint64_t* valid, Pool* pool) {
  using Lanes = WorkerLanes<Mask, Lane>;
  std::vector<Lanes> out(single.samples());
  ParallelFor(pool, single.samples(), kMinSamples, [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      Lanes a{};
      for (const int32_t* r = single.Begin(s); r != single.End(s); ++r) a += Lanes::Added(Mask(0), static_cast<Mask>(valid[*r]));
      out[s] = a;
    }
  });
  return out;
}

// ColocateAllocate's placement: each sample, strongest cache preference first, to the worker with
// room where it adds the fewest rows. Mask: a type of at least W bits.
// scored: the rows it scores, `lightest` (those 2 to kSharedAnyway samples read; a row more read
// counts as read by every worker, which adds nothing to any worker's cost, so it is left out);
// alone: each sample's AloneCosts, what the rows no other sample reads cost at each worker.
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

// ColocateAllocate's trades.
template <typename T>
void Trade(T&& trader) {
  for (int sweep = 0; sweep < kTradeSweeps; ++sweep)
    if (trader.Sweep() == 0) break;
}

// The trades leave out the rows that more than this many samples per worker of the global batch
// read (4 W samples at the default of 4): such a row is read by every worker, or nearly, before and
// after any trade, yet it would be scored at every sample that reads it, and these are most of a
// batch's (sample, row) pairs. HETU_PLANNER_TRADE_SHARED sets it; 0 trades over every row (the
// allocation of earlier versions; docs/results.md compares the two).
int64_t TradeShared(int num_workers) {
  int64_t per_worker = 4;
  if (const char* env = std::getenv("HETU_PLANNER_TRADE_SHARED")) {
    char* end = nullptr;
    per_worker = std::strtoll(env, &end, 10);
    if (end == env || *end != '\0' || per_worker < 0)
      throw std::invalid_argument(std::string("HETU_PLANNER_TRADE_SHARED=") + env +
                                  ": expected a count of samples per worker (0: trade over every row)");
  }
  if (per_worker == 0 || per_worker > std::numeric_limits<int32_t>::max() / num_workers)
    return std::numeric_limits<int64_t>::max();
  return std::max<int64_t>(kSharedAnyway, per_worker * num_workers);
}

// Each sample's rows that 2 to `most` samples of the batch read (light), among them those that 2
// to `fewer` read (lightest; fewer <= most), both numbered as light_rows, and the rows it alone
// reads (single), from the batch's counts (SampleRows::reading, which the lists made here do not
// carry). With a pool of 3 threads or more, parts of the samples in parallel: a pass to count each
// part's rows, then one to write them.
ScoredRows LightRows(const SampleRows& samples, int64_t most, int64_t fewer, Pool* pool) {
  const int64_t n = samples.samples();
  ScoredRows out;
  SampleRows* lists[3] = {&out.light, &out.lightest, &out.single};
  for (SampleRows* list : lists) list->begin.resize(n + 1);
  // Per distinct row, its number among the light rows (shifted 3 up) and a bit per list that takes
  // it (light 1, lightest 2, single 4): asked once per row rather than at each of its samples.
  std::vector<int32_t> code(samples.reading.size());
  for (size_t r = 0; r < code.size(); ++r) {
    const int32_t c = samples.reading[r];
    const bool light = c > 1 && c <= most;
    code[r] = static_cast<int32_t>(out.light_rows.size()) << 3 | light | (c > 1 && c <= fewer) << 1 | (c == 1) << 2;
    if (light) out.light_rows.push_back(static_cast<int32_t>(r));
  }
  using Places = std::array<int64_t, 3>;
  // Samples [first, last) from places `at` on; `write`: or only count. One part writes each row
  // to every list (kept or overwritten by the next: no branch to mispredict); several parts write
  // only the rows kept, since the next part's rows follow theirs.
  auto take = [&](int64_t first, int64_t last, Places at, bool write) {
    const bool alone = first == 0 && last == n;
    int32_t* light = out.light.rows.data();
    int32_t* lightest = out.lightest.rows.data();
    int32_t* single = out.single.rows.data();
    int64_t at_light = at[0], at_lightest = at[1], at_single = at[2];
    for (int64_t s = first; s < last; ++s) {
      for (const int32_t* r = samples.Begin(s); r != samples.End(s); ++r) {
        const int32_t row_code = code[*r], numbered = row_code >> 3;
        const unsigned in = row_code & 7;
        if (write && alone) {
          light[at_light] = numbered;
          lightest[at_lightest] = numbered;
          single[at_single] = *r;
        } else if (write) {
          if (in & 1) light[at_light] = numbered;
          if (in & 2) lightest[at_lightest] = numbered;
          if (in & 4) single[at_single] = *r;
        }
        at_light += in & 1;
        at_lightest += in >> 1 & 1;
        at_single += in >> 2;
      }
      if (write) {
        out.light.begin[s + 1] = at_light;
        out.lightest.begin[s + 1] = at_lightest;
        out.single.begin[s + 1] = at_single;
      }
    }
    return Places{at_light, at_lightest, at_single};
  };
  const int64_t parts = SampleParts(pool, n);
  if (parts == 1) {
    // + 1: the last row written is one past those kept
    for (SampleRows* list : lists) list->rows.resize(samples.rows.size() + 1);
    const Places kept = take(0, n, Places{}, true);
    for (int k = 0; k < 3; ++k) lists[k]->rows.resize(kept[k]);
    return out;
  }
  std::vector<Places> at(parts + 1, Places{});
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) { at[p + 1] = take(first, last, Places{}, false); });
  for (int64_t p = 0; p < parts; ++p)
    for (int k = 0; k < 3; ++k) at[p + 1][k] += at[p][k];
  for (int k = 0; k < 3; ++k) lists[k]->rows.resize(at[parts][k] + 1);
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) { take(first, last, at[p], true); });
  for (int k = 0; k < 3; ++k) lists[k]->rows.resize(at[parts][k]);
  return out;
}

// Readers(), with the masks gathered as narrow as the workers allow (a table that stays in the
// first-level cache) and widened after. With a pool of 3 threads or more, parts of the samples
// gather masks of their own (setting a shared row's bits from several cores moves its cache line
// from core to core at every sample), which are then joined by parts of the rows.
template <typename Mask>
std::vector<uint64_t> NarrowReaders(const SampleRows& samples, int64_t num_rows, const int32_t* assignment,
                                    Pool* pool = nullptr) {
  const int64_t n = samples.samples();
  auto gather = [&](int64_t first, int64_t last, Mask* narrow) {
    for (int64_t s = first; s < last; ++s) {
      const Mask bit = static_cast<Mask>(Bit(assignment[s]));
      for (const int32_t* r = samples.Begin(s); r != samples.End(s); ++r) narrow[*r] |= bit;
    }
  };
  const int64_t parts = SampleParts(pool, n);
  std::vector<uint64_t> out(num_rows);
  if (parts == 1) {
    std::vector<Mask> narrow(num_rows, 0);
    gather(0, n, narrow.data());
    std::copy(narrow.begin(), narrow.end(), out.begin());
    return out;
  }
  std::vector<std::vector<Mask>> narrow(parts);
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) {
    narrow[p].assign(num_rows, 0);
    gather(first, last, narrow[p].data());
  });
  ParallelFor(pool, num_rows, 4096, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      Mask m = 0;
      for (int64_t p = 0; p < parts; ++p) m |= narrow[p][r];
      out[r] = m;
    }
  });
  return out;
}

}  // namespace

ScoredRows ScoredRowsOf(const SampleRows& samples, int num_workers, Pool* pool) {
  // The rows the trades score, and among them those the placement scores.
  return LightRows(samples, TradeShared(num_workers), kSharedAnyway, pool);
}

void ColocateAllocate(const SampleRows& samples, const uint64_t* valid, int64_t num_rows, int num_workers,
                      int64_t per_worker, int64_t iteration, int32_t* assignment, Pool* pool, double* seconds,
                      std::vector<uint64_t>* readers_out, const ScoredRows* scored) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = samples.samples();
  const int W = num_workers;
  ScoredRows found;
  if (!scored) {
    found = ScoredRowsOf(samples, W, pool);
    scored = &found;
  }
  const SampleRows& single = scored->single;
  // Rows' worker masks as narrow as the workers allow, and lanes as the samples' rows allow.
  auto allocate = [&](auto mask, auto lane) {
    using Mask = decltype(mask);
    using Lane = decltype(lane);
    const std::vector<WorkerLanes<Mask, Lane>> alone = AloneCosts<Mask, Lane>(single, valid, pool);
    Place<Mask, Lane>(samples, *scored, alone.data(), valid, num_rows, W, per_worker, iteration, assignment, pool);
    const auto placed = std::chrono::steady_clock::now();
    if (seconds) seconds[0] += Since(start);
    if (n <= std::numeric_limits<uint16_t>::max()) {
      Trade(Trader<uint16_t, Mask, Lane>(*scored, alone.data(), valid, W, assignment, pool));
    } else {
      Trade(Trader<int32_t, Mask, Lane>(*scored, alone.data(), valid, W, assignment, pool));
    }
    if (readers_out) *readers_out = NarrowReaders<Mask>(samples, num_rows, assignment, pool);
    if (seconds) seconds[1] += Since(placed);
  };
  int64_t longest = 0;  // the most rows a sample reads
  for (int64_t s = 0; s < n; ++s) longest = std::max(longest, samples.begin[s + 1] - samples.begin[s]);
  auto with_lanes = [&](auto mask) {
    if (longest <= kNarrowLanesUpTo) {
      allocate(mask, int16_t());
    } else {
      allocate(mask, int32_t());
    }
  };
  if (W <= 8) {
    with_lanes(uint8_t());
  } else if (W <= 16) {
    with_lanes(uint16_t());
  } else if (W <= 32) {
    with_lanes(uint32_t());
  } else {
    with_lanes(uint64_t());
  }
}

std::vector<uint64_t> Readers(const SampleRows& samples, int64_t num_rows, const int32_t* assignment) {
  return NarrowReaders<uint64_t>(samples, num_rows, assignment);
}

int64_t EstimatedRows(const SampleRows& samples, const uint64_t* valid, int64_t num_rows, const int32_t* assignment) {
  const std::vector<uint64_t> readers = Readers(samples, num_rows, assignment);
  int64_t total = 0;
  for (int64_t r = 0; r < num_rows; ++r) total += RowCost(readers[r], valid[r]);
  return total;
}

}  // namespace herald
}  // namespace hetu
