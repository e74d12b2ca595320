// Herald's allocators: which worker trains which sample of a global batch.
#include "herald/allocate.h"

#include <algorithm>
#include <numeric>

#include "herald/worker_mask.h"

namespace hetu {
namespace herald {

namespace {

// Ties go to the least-loaded worker, then to the first in a cyclic order that rotates with the
// sample and the iteration, so that no worker is favoured. cost: lower is better.
template <typename Cost>
int BestWorkerWithRoom(const Cost& cost, const std::vector<int64_t>& load, int num_workers, int64_t per_worker,
                       int64_t sample, int64_t iteration) {
  const int start = static_cast<int>((sample + iteration) % num_workers);
  int chosen = -1;
  for (int k = 0; k < num_workers; ++k) {
    const int w = (start + k) % num_workers;
    if (load[w] >= per_worker) continue;
    if (chosen < 0 || cost(w) < cost(chosen) || (cost(w) == cost(chosen) && load[w] < load[chosen])) chosen = w;
  }
  return chosen;
}

// Samples with the strongest cache preference (highest best score) choose first.
std::vector<int64_t> StrongestFirst(const int32_t* scores, int64_t n, int num_workers) {
  std::vector<int32_t> best(n);
  for (int64_t s = 0; s < n; ++s)
    best[s] = *std::max_element(scores + s * num_workers, scores + (s + 1) * num_workers);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return best[a] > best[b]; });
  return order;
}

// Rows one iteration moves for a row read by the workers in `readers`, whose cached copies are
// valid at `valid` (section 7's plan): a pull for each reader without a valid copy; a gradient
// push from each reader when several read it; a write-back when a single holder's copy (dirty,
// as far as the estimate knows) is read elsewhere.
int RowCost(uint64_t readers, uint64_t valid) {
  if (readers == 0) return 0;
  const int n = Workers(readers);
  int cost = Workers(readers & ~valid);
  if (n >= 2) cost += n;
  if (valid != readers && valid != 0 && (valid & (valid - 1)) == 0) cost += 1;  // one holder
  return cost;
}

// A row read by more samples of the global batch than this ends up on several workers whatever
// the allocation; counted as read by all from the start, it does not pull every later sample
// that reads it towards the worker that happened to take its first one.
constexpr int32_t kSharedAnyway = 4;

// Pairwise trades: a sample at worker a that would save rows at b changes places with one at b
// that would save rows at a, when the two moves together save rows. Loads are unchanged.
class Trader {
 public:
  Trader(const int32_t* rows, int64_t n, int64_t fields, const uint64_t* valid, int64_t num_rows, int num_workers,
         int32_t* assignment)
      : rows_(rows), n_(n), fields_(fields), W_(num_workers),
        everyone_(AllWorkers(num_workers)), assign_(assignment),
        count_(num_rows * num_workers, 0), row_(num_rows) {
    for (int64_t s = 0; s < n; ++s)
      for (const int32_t* r = Begin(s); r != End(s); ++r) ++count_[*r * W_ + assign_[s]];
    for (int64_t r = 0; r < num_rows; ++r) {
      row_[r].valid = valid[r];
      for (int w = 0; w < W_; ++w) Recount(r, w);
    }
  }

  // Returns the number of trades made.
  int64_t Sweep() {
    // wants[a * W + b]: samples at a that would save rows at b, the largest saving first.
    std::vector<std::vector<std::pair<int, int64_t>>> wants(W_ * W_);
    std::vector<int> saving(W_);
    for (int64_t s = 0; s < n_; ++s) {
      Savings(s, &saving);
      for (int to = 0; to < W_; ++to)
        if (saving[to] > 0) wants[assign_[s] * W_ + to].emplace_back(-saving[to], s);
    }
    for (auto& v : wants) std::sort(v.begin(), v.end());
    int64_t trades = 0;
    for (int a = 0; a < W_; ++a)
      for (int b = a + 1; b < W_; ++b) {
        const auto& ab = wants[a * W_ + b];
        const auto& ba = wants[b * W_ + a];
        size_t j = 0;
        for (size_t i = 0; i < ab.size() && j < ba.size(); ++i) {
          // Earlier trades may have moved the sample or changed its saving.
          const int64_t s = ab[i].second;
          if (assign_[s] != a) continue;
          Savings(s, &saving);
          const int g = saving[b];
          if (g <= 0) continue;
          Move(s, b);
          bool traded = false;
          for (; j < ba.size() && !traded; ++j) {
            const int64_t t = ba[j].second;
            if (assign_[t] != b) continue;
            Savings(t, &saving);
            if (g + saving[a] > 0) {
              Move(t, a);
              traded = true;
              ++trades;
            }
          }
          if (!traded) Move(s, a);
        }
      }
    return trades;
  }

 private:
  const int32_t* Begin(int64_t s) const { return rows_ + s * fields_; }
  const int32_t* End(int64_t s) const { return rows_ + (s + 1) * fields_; }

  // (*out)[to]: rows saved by moving sample s from its worker to `to` (0 for its own worker).
  void Savings(int64_t s, std::vector<int>* out) const {
    const int from = assign_[s];
    std::fill(out->begin(), out->end(), 0);
    for (const int32_t* r = Begin(s); r != End(s); ++r) {
      const RowReaders& row = row_[*r];
      const uint64_t rest = row.readers & ~(row.once & Bit(from));
      if (rest == everyone_) continue;  // read by every worker whatever this sample does
      const int now = RowCost(row.readers, row.valid);
      for (int to = 0; to < W_; ++to)
        if (to != from) (*out)[to] += now - RowCost(rest | Bit(to), row.valid);
    }
  }

  void Move(int64_t s, int to) {
    const int from = assign_[s];
    for (const int32_t* r = Begin(s); r != End(s); ++r) {
      --count_[*r * W_ + from];
      ++count_[*r * W_ + to];
      Recount(*r, from);
      Recount(*r, to);
    }
    assign_[s] = to;
  }

  // Row r's bits for worker w, from the count of w's samples that read it.
  void Recount(int64_t r, int w) {
    const int32_t c = count_[r * W_ + w];
    RowReaders& row = row_[r];
    row.readers = (row.readers & ~Bit(w)) | (c > 0 ? Bit(w) : 0);
    row.once = (row.once & ~Bit(w)) | (c == 1 ? Bit(w) : 0);
  }

  const int32_t* rows_;
  int64_t n_, fields_;
  int W_;
  uint64_t everyone_;
  int32_t* assign_;
  std::vector<int32_t> count_;  // [num_rows, W]: samples of each worker that read each row
  // What Savings asks of a row, in one place: one bit per worker with count_ > 0 (readers), with
  // count_ == 1 (once: the row leaves the worker with that sample), with a valid copy.
  struct RowReaders {
    uint64_t readers = 0, once = 0, valid = 0;
  };
  std::vector<RowReaders> row_;
};

constexpr int kTradeSweeps = 2;

}  // namespace

std::vector<int32_t> CacheScores(const int32_t* rows, int64_t n, int64_t fields, const uint64_t* valid,
                                 int num_workers) {
  std::vector<int32_t> scores(n * num_workers, 0);
  for (int64_t s = 0; s < n; ++s) {
    int32_t* score = &scores[s * num_workers];
    for (int64_t f = 0; f < fields; ++f)
      for (uint64_t m = valid[rows[s * fields + f]]; m; m &= m - 1) ++score[__builtin_ctzll(m)];
  }
  return scores;
}

void GreedyAllocate(const int32_t* scores, int64_t n, int num_workers, int64_t per_worker, int64_t iteration,
                    int32_t* assignment) {
  std::vector<int64_t> load(num_workers, 0);
  for (int64_t s : StrongestFirst(scores, n, num_workers)) {
    const int32_t* row = scores + s * num_workers;
    const int chosen = BestWorkerWithRoom([&](int w) { return -row[w]; }, load, num_workers, per_worker, s, iteration);
    assignment[s] = chosen;
    ++load[chosen];
  }
}

void ColocateAllocate(const int32_t* rows, int64_t n, int64_t fields, const uint64_t* valid, int64_t num_rows,
                      int num_workers, int64_t per_worker, int64_t iteration, int32_t* assignment) {
  const uint64_t everyone = AllWorkers(num_workers);
  std::vector<uint64_t> readers(num_rows, 0);
  {
    std::vector<int32_t> samples_reading(num_rows, 0);
    for (int64_t i = 0; i < n * fields; ++i) ++samples_reading[rows[i]];
    for (int64_t r = 0; r < num_rows; ++r)
      if (samples_reading[r] > kSharedAnyway) readers[r] = everyone;
  }
  const std::vector<int32_t> scores = CacheScores(rows, n, fields, valid, num_workers);
  std::vector<int64_t> load(num_workers, 0);
  std::vector<int32_t> added(num_workers);
  for (int64_t s : StrongestFirst(scores.data(), n, num_workers)) {
    const int32_t* r = rows + s * fields;
    std::fill(added.begin(), added.end(), 0);
    for (int64_t f = 0; f < fields; ++f) {
      const uint64_t m = readers[r[f]], v = valid[r[f]];
      if (m == everyone) continue;  // costs the same wherever the sample goes
      const int now = RowCost(m, v);
      for (int w = 0; w < num_workers; ++w) added[w] += RowCost(m | Bit(w), v) - now;
    }
    const int chosen =
        BestWorkerWithRoom([&](int w) { return added[w]; }, load, num_workers, per_worker, s, iteration);
    assignment[s] = chosen;
    ++load[chosen];
    for (int64_t f = 0; f < fields; ++f) readers[r[f]] |= Bit(chosen);
  }
  Trader trader(rows, n, fields, valid, num_rows, num_workers, assignment);
  for (int sweep = 0; sweep < kTradeSweeps; ++sweep)
    if (trader.Sweep() == 0) break;
}

std::vector<uint64_t> Readers(const int32_t* rows, int64_t n, int64_t fields, int64_t num_rows,
                              const int32_t* assignment) {
  std::vector<uint64_t> readers(num_rows, 0);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t f = 0; f < fields; ++f) readers[rows[s * fields + f]] |= Bit(assignment[s]);
  return readers;
}

int64_t EstimatedRows(const int32_t* rows, int64_t n, int64_t fields, const uint64_t* valid, int64_t num_rows,
                      const int32_t* assignment) {
  const std::vector<uint64_t> readers = Readers(rows, n, fields, num_rows, assignment);
  int64_t total = 0;
  for (int64_t r = 0; r < num_rows; ++r) total += RowCost(readers[r], valid[r]);
  return total;
}

}  // namespace herald
}  // namespace hetu
