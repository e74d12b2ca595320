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

int64_t pool_bags(const float* table, int64_t num_rows, int64_t width, const int64_t* ids, int64_t n, int64_t slots,
                  const int64_t* bag_offsets, int64_t bags, bool mean, float* out) {
  for (int64_t i = 0; i < n * slots; ++i)
    if (ids[i] < -1 || ids[i] >= num_rows) return i;
  parallel_for(n, 256, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s)
      for (int64_t k = 0; k < bags; ++k) {
        float* o = out + (s * bags + k) * width;
        int64_t count = 0;
        for (int64_t i = s * slots + bag_offsets[k]; i < s * slots + bag_offsets[k + 1]; ++i) {
          if (ids[i] < 0) continue;
          const float* row = table + ids[i] * width;
          // The first row is copied, not added to zeros: a bag of one is its row, bit for bit.
          if (count++ == 0)
            std::memcpy(o, row, sizeof(float) * width);
          else
            for (int64_t j = 0; j < width; ++j) o[j] += row[j];
        }
        if (count == 0) std::fill(o, o + width, 0.0f);
        if (mean && count > 1)
          for (int64_t j = 0; j < width; ++j) o[j] /= static_cast<float>(count);
      }
  });
  return -1;
}

namespace {

// Ids grouped by value: a stable sort of their positions by id (each id's positions stay in order
// of occurrence) and where each run of equal ids starts (runs ascend by id). Per thread, reused;
// valid until this thread's next call.
struct IdRuns {
  const SortedIds* sorted;
  const std::vector<int64_t>* start;   // the runs' starts in sorted order, then the end
  int64_t count() const { return static_cast<int64_t>(start->size()) - 1; }
};

IdRuns id_runs(const int64_t* ids, int64_t n) {
  static thread_local std::vector<int64_t> start;
  const SortedIds& sorted = sort_ids(ids, n);
  start.clear();
  start.reserve(n + 1);
  for (int64_t i = 0; i < n; ++i)
    if (i == 0 || sorted.id[i] != sorted.id[i - 1]) start.push_back(i);
  start.push_back(n);
  return {&sorted, &start};
}

// Visits the distinct ids ascending with, for each, the sum of its rows in order of occurrence,
// where add_row(i, dst) adds row i into dst (zeroed first): the sum is taken in a fixed order
// whatever the thread count. The runs are split between threads in contiguous chunks; each chunk
// makes its visitor, visit = start_chunk(), and sums into a row of its own, calling
// visit(r, id, sum) for the r-th distinct id once its sum is complete.
template <typename AddRow, typename StartChunk>
void visit_id_sums(const IdRuns& runs, int64_t width, AddRow add_row, StartChunk start_chunk) {
  const std::vector<int64_t>& order = runs.sorted->pos;
  const std::vector<int64_t>& id = runs.sorted->id;
  const std::vector<int64_t>& start = *runs.start;
  parallel_for(runs.count(), 512, [&](int64_t b, int64_t e) {
    auto visit = start_chunk();
    std::vector<float> sum(width);
    for (int64_t r = b; r < e; ++r) {
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t k = start[r]; k < start[r + 1]; ++k) add_row(order[k], sum.data());
      visit(r, id[start[r]], sum.data());
    }
  });
}

// The distinct ids ascending (uniq) and each one's sum of rows (summed) by visit_id_sums.
template <typename AddRow>
int64_t sum_rows_by_id(const int64_t* ids, int64_t n, int64_t width, AddRow add_row, std::vector<int64_t>* uniq,
                       std::vector<float>* summed) {
  const IdRuns runs = id_runs(ids, n);
  const int64_t u = runs.count();
  uniq->resize(u);
  summed->resize(static_cast<size_t>(u * width));
  int64_t* keys = uniq->data();
  float* rows = summed->data();
  visit_id_sums(runs, width, add_row, [&] {
    return [&](int64_t r, int64_t id, const float* sum) {
      keys[r] = id;
      std::memcpy(rows + r * width, sum, sizeof(float) * width);
    };
  });
  return u;
}

// pool_bags' filled slots in sample and slot order: each one's id, the bag gradient row it takes
// and what that row is divided by (0: not divided). The gradient rows are read where they are,
// never copied per slot. Per thread, reused; valid until this thread's next call.
struct FilledSlots {
  std::vector<int64_t> id, bag;
  std::vector<float> divisor;
};

const FilledSlots& filled_slots(const int64_t* ids, int64_t n, int64_t slots, const int64_t* bag_offsets,
                                int64_t bags, bool mean) {
  static thread_local FilledSlots out;
  out.id.clear();
  out.bag.clear();
  out.divisor.clear();
  for (int64_t s = 0; s < n; ++s)
    for (int64_t k = 0; k < bags; ++k) {
      const int64_t lo = s * slots + bag_offsets[k], hi = s * slots + bag_offsets[k + 1];
      int64_t count = 0;
      for (int64_t i = lo; i < hi; ++i) count += ids[i] >= 0;
      for (int64_t i = lo; i < hi; ++i) {
        if (ids[i] < 0) continue;
        out.id.push_back(ids[i]);
        out.bag.push_back(s * bags + k);
        out.divisor.push_back(mean && count > 1 ? static_cast<float>(count) : 0.0f);
      }
    }
  return out;
}

// dst += slot i's share of its bag's gradient (FilledSlots).
inline void add_slot_grad(const FilledSlots& f, const float* grads, int64_t width, int64_t i, float* dst) {
  const float* g = grads + f.bag[i] * width;
  const float d = f.divisor[i];
  if (d == 0.0f)
    for (int64_t j = 0; j < width; ++j) dst[j] += g[j];
  else
    for (int64_t j = 0; j < width; ++j) dst[j] += g[j] / d;
}

}  // namespace

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
  return sum_rows_by_id(ids, n, width, [&](int64_t i, float* dst) {
    const float* src = grads + i * width;
    for (int64_t j = 0; j < width; ++j) dst[j] += src[j];
  }, uniq, summed);
}

int64_t bag_gradient(const int64_t* ids, int64_t n, int64_t slots, const int64_t* bag_offsets, int64_t bags,
                     bool mean, const float* grads, int64_t width, std::vector<int64_t>* uniq,
                     std::vector<float>* summed) {
  const FilledSlots& f = filled_slots(ids, n, slots, bag_offsets, bags, mean);
  return sum_rows_by_id(f.id.data(), static_cast<int64_t>(f.id.size()), width,
                        [&](int64_t i, float* dst) { add_slot_grad(f, grads, width, i, dst); }, uniq, summed);
}

int64_t bag_gradient_step(const int64_t* ids, int64_t n, int64_t slots, const int64_t* bag_offsets, int64_t bags,
                          bool mean, const float* grads, const optim::Config& cfg, float lr, float* table,
                          int64_t num_rows, int64_t width, float* state, int64_t* steps) {
  for (int64_t i = 0; i < n * slots; ++i)
    if (ids[i] < -1 || ids[i] >= num_rows) return i;
  const FilledSlots& f = filled_slots(ids, n, slots, bag_offsets, bags, mean);
  const int64_t state_width = optim::state_width(cfg.kind, width);
  visit_id_sums(id_runs(f.id.data(), static_cast<int64_t>(f.id.size())), width,
                [&](int64_t i, float* dst) { add_slot_grad(f, grads, width, i, dst); },
                [&] {
                  // Adam's bias corrections, kept while the chunk's rows share a step count
                  return [&, bias = optim::BiasCache()](int64_t, int64_t id, const float* sum) mutable {
                    optim::step_row(cfg, lr, table + id * width, state_width ? state + id * state_width : nullptr,
                                    steps + id, sum, width, &bias);
                  };
                });
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

}  // namespace kernels
}  // namespace hetu
