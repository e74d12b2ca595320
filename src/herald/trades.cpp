// The trades between workers: ColocateAllocate's pairwise swaps of samples after the placement.
#include "herald/trades.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "herald/worker_mask.h"

namespace hetu {
namespace herald {

namespace {

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

template <typename Mask, typename Lane>
void Trade(const ScoredRows& scored, const WorkerLanes<Mask, Lane>* alone, const uint64_t* valid, int num_workers,
           int32_t* assignment, Pool* pool) {
  auto sweep = [](auto&& trader) {
    for (int s = 0; s < kTradeSweeps; ++s)
      if (trader.Sweep() == 0) break;
  };
  // Counts as narrow as the batch's samples allow.
  if (scored.light.samples() <= std::numeric_limits<uint16_t>::max()) {
    sweep(Trader<uint16_t, Mask, Lane>(scored, alone, valid, num_workers, assignment, pool));
  } else {
    sweep(Trader<int32_t, Mask, Lane>(scored, alone, valid, num_workers, assignment, pool));
  }
}

#define HETU_TRADE(Mask, Lane)                                                                              \
  template void Trade<Mask, Lane>(const ScoredRows&, const WorkerLanes<Mask, Lane>*, const uint64_t*, int, int32_t*, \
                                  Pool*);
HETU_HERALD_EACH_MASK_AND_LANE(HETU_TRADE)
#undef HETU_TRADE

// The trades leave out the rows that more than this many samples per worker of the global batch
// read (4 W samples at the default of 4): such a row is read by every worker, or nearly, before and
// after any trade, yet it would be scored at every sample that reads it, and these are most of a
// batch's (sample, row) pairs. HETU_PLANNER_TRADE_SHARED sets it; 0 trades over every row (the
// allocation of earlier versions; docs/results/planner.md compares the two).
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

}  // namespace herald
}  // namespace hetu
