// Row gather, bag pooling and its gradient, sparse-gradient unique-and-sum, and row-wise optimizer steps on CPU.
#include "kernels/kernels.h"

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <string>

#include "common/parallel.h"
#include "kernels/sort.h"

namespace hetu {
namespace kernels {

int64_t gather_rows(const float* table, int64_t num_rows, int64_t width, const int64_t* ids, int64_t n,
                    float* out) {
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < 0 || ids[i] >= num_rows) return i;
  parallel_for(n, 2048, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i)
      std::memcpy(out + i * width, table + ids[i] * width, sizeof(float) * width);
  });
  return -1;
}

namespace {

// ---- row loops ----------------------------------------------------------------------------------
// A row's width known at compile time for the common embedding sizes, so that each row loop is
// a fixed run of vector instructions; any other width is a run-time count. Only the loops'
// shape changes: every float sees the same operations in the same order (bit for bit).
template <int64_t W>
struct FixedWidth {
  constexpr operator int64_t() const { return W; }
};

template <typename Fn>
void with_width(int64_t width, Fn fn) {
  switch (width) {
    case 8: return fn(FixedWidth<8>());
    case 16: return fn(FixedWidth<16>());
    case 32: return fn(FixedWidth<32>());
    case 64: return fn(FixedWidth<64>());
    case 128: return fn(FixedWidth<128>());
    default: return fn(width);
  }
}

// Rows are read scattered over a table much larger than the caches: a row this many reads ahead
// is requested while the current one is added, so the loads overlap instead of waiting in turn.
constexpr int64_t kAhead = 12;

inline void prefetch_row(const float* row, int64_t width) {
  for (int64_t j = 0; j < width; j += 16) __builtin_prefetch(row + j);   // 16 floats: a cache line
}

template <typename W>
inline void copy_row(float* __restrict dst, const float* __restrict src, W width) {
  for (int64_t j = 0; j < int64_t(width); ++j) dst[j] = src[j];
}

template <typename W>
inline void add_row(float* __restrict dst, const float* __restrict src, W width) {
  for (int64_t j = 0; j < int64_t(width); ++j) dst[j] += src[j];
}

// dst += src / d, or dst += src where d is 0 (a bag's gradient row, not divided).
template <typename W>
inline void add_row_divided(float* __restrict dst, const float* __restrict src, float d, W width) {
  if (d == 0.0f)
    add_row(dst, src, width);
  else
    for (int64_t j = 0; j < int64_t(width); ++j) dst[j] += src[j] / d;
}

// ---- ids grouped by value -----------------------------------------------------------------------
// A stable sort of the ids' positions by id (each id's positions stay in order of occurrence) and
// where each run of equal ids starts, runs ascending by id; with `from_zero`, the runs of
// negative ids (empty bag slots) left out. Per thread, reused; valid until this thread's next call.
struct IdRuns {
  const SortedIds* sorted;
  const std::vector<int64_t>* start;   // the runs' starts in sorted order, then the last run's end
  int64_t count() const { return static_cast<int64_t>(start->size()) - 1; }
};

IdRuns id_runs(const int64_t* ids, int64_t n, bool from_zero) {
  static thread_local std::vector<int64_t> start;
  const SortedIds& sorted = sort_ids(ids, n);
  int64_t i = 0;
  if (from_zero)
    while (i < n && sorted.id[i] < 0) ++i;
  start.clear();
  start.reserve(n - i + 1);
  for (const int64_t first = i; i < n; ++i)
    if (i == first || sorted.id[i] != sorted.id[i - 1]) start.push_back(i);
  start.push_back(n);
  return {&sorted, &start};
}

// Visits the distinct ids ascending with, for each, the sum of its rows in order of occurrence:
// row_of(i) is the i-th occurrence's row, divided by divisor_of(i) unless that is 0. The sum is
// taken in a fixed order whatever the thread count. The runs are split between threads in
// contiguous chunks; each chunk makes its visitor, visit = start_chunk(), sums into a row of its
// own and calls visit(r, id, sum) for the r-th distinct id once its sum is complete.
template <typename RowOf, typename DivisorOf, typename StartChunk>
void visit_id_sums(const IdRuns& runs, int64_t width, RowOf row_of, DivisorOf divisor_of, StartChunk start_chunk) {
  const int64_t* order = runs.sorted->pos.data();
  const int64_t* id = runs.sorted->id.data();
  const int64_t* start = runs.start->data();
  parallel_for(runs.count(), 512, [&](int64_t b, int64_t e) {
    auto visit = start_chunk();
    std::vector<float> sum_row(width);
    float* sum = sum_row.data();
    const int64_t last = start[e];
    with_width(width, [&](auto w) {
      for (int64_t r = b; r < e; ++r) {
        std::fill(sum, sum + width, 0.0f);
        for (int64_t k = start[r]; k < start[r + 1]; ++k) {
          if (k + kAhead < last) prefetch_row(row_of(order[k + kAhead]), w);
          add_row_divided(sum, row_of(order[k]), divisor_of(order[k]), w);
        }
        visit(r, id[start[r]], sum);
      }
    });
  });
}

// The distinct ids ascending (uniq) and each one's sum of rows (summed), by visit_id_sums.
template <typename RowOf, typename DivisorOf>
int64_t sum_rows_by_id(const IdRuns& runs, int64_t width, RowOf row_of, DivisorOf divisor_of,
                       std::vector<int64_t>* uniq, std::vector<float>* summed) {
  const int64_t u = runs.count();
  uniq->resize(u);
  summed->resize(static_cast<size_t>(u * width));
  int64_t* keys = uniq->data();
  float* rows = summed->data();
  visit_id_sums(runs, width, row_of, divisor_of, [&] {
    return [&](int64_t r, int64_t id, const float* sum) {
      keys[r] = id;
      std::memcpy(rows + r * width, sum, sizeof(float) * width);
    };
  });
  return u;
}

// pool_bags' gradient rows by slot: slot p of the ids [samples, slots] (flat) takes row
// bag_row(p) of the gradient [samples * bags, width], divided by divisor(p) (with `mean`, the
// bag's filled slots where more than one; else 0: not divided).
class SlotRows {
 public:
  SlotRows(const int64_t* ids, int64_t n, int64_t slots, const int64_t* bag_offsets, int64_t bags, bool mean)
      : slots_(slots), bags_(bags), mean_(mean) {
    static thread_local std::vector<int64_t> bag_of_slot;
    bag_of_slot.resize(slots);
    for (int64_t k = 0; k < bags; ++k)
      for (int64_t i = bag_offsets[k]; i < bag_offsets[k + 1]; ++i) bag_of_slot[i] = k;
    bag_of_slot_ = bag_of_slot.data();
    if (!mean) return;
    static thread_local std::vector<float> divisor;
    divisor.resize(n * bags);
    float* d = divisor.data();
    parallel_for(n, 256, [&](int64_t b, int64_t e) {
      for (int64_t s = b; s < e; ++s)
        for (int64_t k = 0; k < bags; ++k) {
          int64_t count = 0;
          for (int64_t i = s * slots + bag_offsets[k]; i < s * slots + bag_offsets[k + 1]; ++i) count += ids[i] >= 0;
          d[s * bags + k] = count > 1 ? static_cast<float>(count) : 0.0f;
        }
    });
    divisor_ = d;
  }
  int64_t bag_row(int64_t p) const {
    const int64_t s = p / slots_;
    return s * bags_ + bag_of_slot_[p - s * slots_];
  }
  float divisor(int64_t p) const { return mean_ ? divisor_[bag_row(p)] : 0.0f; }

 private:
  int64_t slots_, bags_;
  bool mean_;
  const int64_t* bag_of_slot_ = nullptr;
  const float* divisor_ = nullptr;
};

// The first position of an id outside [0, num_rows) that is not an empty slot (-1, where
// `empty_slots`), or -1.
int64_t first_bad_slot(const int64_t* ids, int64_t n, int64_t num_rows, bool empty_slots = true) {
  const int64_t lowest = empty_slots ? -1 : 0;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] < lowest || ids[i] >= num_rows) return i;
  return -1;
}

}  // namespace

int64_t pool_bags(const float* table, int64_t num_rows, int64_t width, const int64_t* ids, int64_t n, int64_t slots,
                  const int64_t* bag_offsets, int64_t bags, bool mean, float* out) {
  const int64_t bad = first_bad_slot(ids, n * slots, num_rows);
  if (bad >= 0) return bad;
  // Samples split between threads, each writing its own samples' bags.
  parallel_for(n, 64, [&](int64_t b, int64_t e) {
    const int64_t last = e * slots;
    with_width(width, [&](auto w) {
      for (int64_t s = b; s < e; ++s)
        for (int64_t k = 0; k < bags; ++k) {
          float* o = out + (s * bags + k) * w;
          int64_t count = 0;
          for (int64_t i = s * slots + bag_offsets[k]; i < s * slots + bag_offsets[k + 1]; ++i) {
            if (i + kAhead < last && ids[i + kAhead] >= 0) prefetch_row(table + ids[i + kAhead] * w, w);
            if (ids[i] < 0) continue;
            const float* row = table + ids[i] * w;
            // The first row is copied, not added to zeros: a bag of one is its row, bit for bit.
            if (count++ == 0)
              copy_row(o, row, w);
            else
              add_row(o, row, w);
          }
          if (count == 0) std::fill(o, o + int64_t(w), 0.0f);
          if (mean && count > 1)
            for (int64_t j = 0; j < int64_t(w); ++j) o[j] /= static_cast<float>(count);
        }
    });
  });
  return -1;
}

int64_t unique_sum(const int64_t* ids, const float* grads, int64_t n, int64_t width, std::vector<int64_t>* uniq,
                   std::vector<float>* summed) {
  // Ids already distinct and ascending (a bag's gradient comes summed): each sum is its row.
  if (std::adjacent_find(ids, ids + n, [](int64_t a, int64_t b) { return a >= b; }) == ids + n) {
    uniq->assign(ids, ids + n);
    summed->resize(static_cast<size_t>(n * width));
    parallel_for(n, 2048, [&](int64_t b, int64_t e) {
      for (int64_t i = b * width; i < e * width; ++i) (*summed)[i] = 0.0f + grads[i];   // as the sum: -0 is +0
    });
    return n;
  }
  return sum_rows_by_id(
      id_runs(ids, n, false), width, [&](int64_t i) { return grads + i * width; }, [](int64_t) { return 0.0f; },
      uniq, summed);
}

int64_t bag_gradient(const int64_t* ids, int64_t n, int64_t slots, const int64_t* bag_offsets, int64_t bags,
                     bool mean, const float* grads, int64_t width, std::vector<int64_t>* uniq,
                     std::vector<float>* summed) {
  // The filled slots in sample and slot order are the flat ids' positions in order: sorted
  // stably by id, their gradient rows are read where they are, never copied per slot.
  const SlotRows slot_rows(ids, n, slots, bag_offsets, bags, mean);
  return sum_rows_by_id(
      id_runs(ids, n * slots, true), width, [&](int64_t p) { return grads + slot_rows.bag_row(p) * width; },
      [&](int64_t p) { return slot_rows.divisor(p); }, uniq, summed);
}

int64_t bag_gradient_step(const int64_t* ids, int64_t n, int64_t slots, const int64_t* bag_offsets, int64_t bags,
                          bool mean, const float* grads, const optim::Config& cfg, float lr, float* table,
                          int64_t num_rows, int64_t width, float* state, int64_t* steps, bool empty_slots) {
  const int64_t bad = first_bad_slot(ids, n * slots, num_rows, empty_slots);
  if (bad >= 0) return bad;
  const int64_t state_width = optim::state_width(cfg.kind, width);
  const auto start_chunk = [&] {
    // Adam's bias corrections, kept while the chunk's rows share a step count
    return [&, bias = optim::BiasCache()](int64_t, int64_t id, const float* sum) mutable {
      optim::step_row(cfg, lr, table + id * width, state_width ? state + id * state_width : nullptr, steps + id, sum,
                      width, &bias);
    };
  };
  const IdRuns runs = id_runs(ids, n * slots, true);
  if (slots == 1 && bags == 1) {
    // A lookup's gradient: slot p's row is row p, never divided (what unique_sum reads), without
    // SlotRows' per-slot index arithmetic.
    visit_id_sums(
        runs, width, [&](int64_t p) { return grads + p * width; }, [](int64_t) { return 0.0f; }, start_chunk);
    return -1;
  }
  const SlotRows slot_rows(ids, n, slots, bag_offsets, bags, mean);
  visit_id_sums(
      runs, width, [&](int64_t p) { return grads + slot_rows.bag_row(p) * width; },
      [&](int64_t p) { return slot_rows.divisor(p); }, start_chunk);
  return -1;
}

void apply_rows(const optim::Config& cfg, float lr, float* table, float* state, int64_t* steps, int64_t width,
                const int64_t* rows, const float* grads, int64_t n) {
  const int64_t state_width = optim::state_width(cfg.kind, width);
  parallel_for(n, 256, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = rows[i];
      optim::step_row(cfg, lr, table + r * width, state_width ? state + r * state_width : nullptr, steps + r,
                      grads + i * width, width);
    }
  });
}

void catch_up_rows(const optim::Config& cfg, float* table, float* state, int64_t* steps, int64_t num_rows,
                   int64_t width, const int64_t* rows, int64_t n, int64_t target) {
  const int64_t state_width = optim::state_width(cfg.kind, width);
  const optim::CatchUp catch_up(cfg, target);
  // Each part takes the rows r with r % parts in its range, whatever their order and repeats:
  // no two threads touch one row, and a repeat finds its row at `target` already. Ids outside
  // the table (an empty slot's -1) are skipped.
  const int64_t parts = std::max<int64_t>(1, std::min<int64_t>(num_threads(), n / 1024));
  parallel_for(parts, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = 0; i < n; ++i) {
      const int64_t r = rows[i];
      if (r < 0 || r >= num_rows || steps[r] >= target || r % parts < b || r % parts >= e) continue;
      catch_up.Row(table + r * width, state + r * state_width, steps + r, width);
    }
  });
}

void apply_dense(const optim::Config& cfg, float lr, float* w, float* state, int64_t* step, const float* g,
                 int64_t size) {
  // The tensor is one row; chunks of it are stepped in parallel with the same step count, which
  // an element-wise kind (the only kind bindings.cpp lets through) allows. Adam keeps m and v as
  // two separate arrays of `size`, so each chunk addresses its own slice of both.
  const int64_t nslots = optim::state_width(cfg.kind, 1);  // arrays of `size` floats
  const int64_t t0 = *step;
  parallel_for(size, 1 << 15, [&](int64_t b, int64_t e) {
    int64_t t = t0;
    if (nslots < 2) {
      optim::step_row(cfg, lr, w + b, nslots ? state + b : nullptr, &t, g + b, e - b);
      return;
    }
    // Two-slot state: step blocks whose m and v are gathered side by side in a small local
    // buffer (cache-resident, no allocation), then scattered back.
    constexpr int64_t kBlock = 1024;
    float local[2 * kBlock];
    for (int64_t lo = b; lo < e; lo += kBlock) {
      const int64_t len = std::min(kBlock, e - lo);
      std::memcpy(local, state + lo, sizeof(float) * len);
      std::memcpy(local + len, state + size + lo, sizeof(float) * len);
      t = t0;
      optim::step_row(cfg, lr, w + lo, local, &t, g + lo, len);
      std::memcpy(state + lo, local, sizeof(float) * len);
      std::memcpy(state + size + lo, local + len, sizeof(float) * len);
    }
  });
  *step = t0 + 1;
}

void init_fill(int kind, double a, double b, uint64_t seed, uint64_t stream, int64_t row_begin, int64_t row_end,
               int64_t width, float* out) {
  parallel_for(row_end - row_begin, 1024, [&](int64_t lo, int64_t hi) {
    rng::fill_rows(kind, a, b, seed, stream, row_begin + lo, row_begin + hi, width, out + lo * width);
  });
}

void init_fill_rows(int kind, double a, double b, uint64_t seed, uint64_t stream, const int64_t* rows, int64_t n,
                    int64_t width, float* out) {
  parallel_for(n, std::max<int64_t>(1, 4096 / std::max<int64_t>(1, width)), [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) rng::fill_rows(kind, a, b, seed, stream, rows[k], rows[k] + 1, width, out + k * width);
  });
}

}  // namespace kernels
}  // namespace hetu
