// Row gather, sparse-gradient unique-and-sum, and row-wise optimizer steps on CPU.
#include "kernels/kernels.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>

#include "common/parallel.h"

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

// Positions 0..n-1 ordered by ids[position], ties in position order (a stable sort), by an LSD
// radix sort of (id - min id) on as many 11-bit digits as the id range needs.
// The result and the scratch arrays are per-thread and reused: at batch 4096 they are a few MB,
// which glibc would otherwise map and unmap (and the kernel zero) on every step.
const std::vector<int64_t>& stable_order_by_id(const int64_t* ids, int64_t n) {
  static thread_local std::vector<int64_t> order;
  order.resize(n);
  if (n == 0) return order;
  int64_t lo = ids[0], hi = ids[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, ids[i]);
    hi = std::max(hi, ids[i]);
  }
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  int bits = 0;
  while (bits < 64 && (range >> bits) != 0) ++bits;
  constexpr int kDigit = 11;
  constexpr uint64_t kMask = (uint64_t(1) << kDigit) - 1;
  const int passes = (bits + kDigit - 1) / kDigit;
  if (n < 64 || passes > 3) {  // tiny inputs or a huge id range: a comparison sort is as good
    std::iota(order.begin(), order.end(), int64_t(0));
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    return order;
  }
  struct Item {
    uint64_t key;
    int64_t pos;
  };
  static thread_local std::vector<Item> a, b;
  a.resize(n);
  b.resize(n);
  for (int64_t i = 0; i < n; ++i) a[i] = {static_cast<uint64_t>(ids[i]) - static_cast<uint64_t>(lo), i};
  static thread_local std::vector<int64_t> count;
  count.resize(kMask + 2);
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = pass * kDigit;
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0; i < n; ++i) ++count[((a[i].key >> shift) & kMask) + 1];
    for (size_t d = 1; d < count.size(); ++d) count[d] += count[d - 1];
    for (int64_t i = 0; i < n; ++i) b[count[(a[i].key >> shift) & kMask]++] = a[i];
    a.swap(b);
  }
  for (int64_t i = 0; i < n; ++i) order[i] = a[i].pos;
  return order;
}

}  // namespace

void sorted_unique(const int64_t* ids, int64_t n, std::vector<int64_t>* out, int32_t* inverse) {
  const std::vector<int64_t>& order = stable_order_by_id(ids, n);
  out->clear();
  for (int64_t i = 0; i < n; ++i) {
    if (out->empty() || out->back() != ids[order[i]]) out->push_back(ids[order[i]]);
    if (inverse) inverse[order[i]] = static_cast<int32_t>(out->size() - 1);
  }
}

int64_t unique_sum(const int64_t* ids, const float* grads, int64_t n, int64_t width, std::vector<int64_t>* uniq,
                   std::vector<float>* summed) {
  // A stable sort of positions by id keeps each id's rows in occurrence order, so the sum is
  // taken in a fixed order whatever the thread count.
  const std::vector<int64_t>& order = stable_order_by_id(ids, n);
  // A reference, not the thread_local itself, is what the parallel lambda must see: named
  // directly there, a thread_local would be each worker's own (empty) instance.
  static thread_local std::vector<int64_t> run_start_tls;
  std::vector<int64_t>& run_start = run_start_tls;
  run_start.clear();
  run_start.reserve(n + 1);
  for (int64_t i = 0; i < n; ++i)
    if (i == 0 || ids[order[i]] != ids[order[i - 1]]) run_start.push_back(i);
  const int64_t u = static_cast<int64_t>(run_start.size());
  run_start.push_back(n);
  uniq->resize(u);
  summed->assign(static_cast<size_t>(u * width), 0.0f);
  parallel_for(u, 512, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      (*uniq)[r] = ids[order[run_start[r]]];
      float* dst = summed->data() + r * width;
      for (int64_t k = run_start[r]; k < run_start[r + 1]; ++k) {
        const float* src = grads + order[k] * width;
        for (int64_t j = 0; j < width; ++j) dst[j] += src[j];
      }
    }
  });
  return u;
}

void apply_rows(const optim::Config& cfg, float lr, float* table, float* state, int64_t* steps, int64_t width,
                const int64_t* rows, const float* grads, int64_t n) {
  const int64_t state_width = optim::slots(cfg.kind) * width;
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
  // The tensor is one row; chunks of it are stepped in parallel with the same step count.
  // Adam keeps m and v as two separate arrays of `size`, so each chunk addresses its own
  // slice of both.
  const int nslots = optim::slots(cfg.kind);
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
