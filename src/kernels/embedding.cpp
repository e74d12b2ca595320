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

int64_t unique_sum(const int64_t* ids, const float* grads, int64_t n, int64_t width, std::vector<int64_t>* uniq,
                   std::vector<float>* summed) {
  // Stable sort of positions by id keeps each id's rows in occurrence order, so the sum is
  // taken in a fixed order whatever the thread count.
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
  std::vector<int64_t> run_start;
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
    const int64_t len = e - b;
    int64_t t = t0;
    if (nslots < 2) {
      optim::step_row(cfg, lr, w + b, nslots ? state + b : nullptr, &t, g + b, len);
      return;
    }
    // Two-slot state: gather this chunk's m and v side by side, step, scatter back.
    std::vector<float> local(2 * len);
    std::memcpy(local.data(), state + b, sizeof(float) * len);
    std::memcpy(local.data() + len, state + size + b, sizeof(float) * len);
    optim::step_row(cfg, lr, w + b, local.data(), &t, g + b, len);
    std::memcpy(state + b, local.data(), sizeof(float) * len);
    std::memcpy(state + size + b, local.data() + len, sizeof(float) * len);
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
