// Attention weights of sequential recommenders over rows of scores (SASRec's masked softmax,
// HSTU's pointwise SiLU), threaded over the rows.
//
// Scores are [batch, heads, lq, lk] (heads: the product of any axes between batch and the last
// two), row r = (b * heads + h) * lq + i. Key j is allowed for query i iff mask[b, j] != 0 (no
// mask: every key) and, when causal, j <= i. Every row is computed by one thread, its keys in
// ascending order, its sums in double: the results do not depend on the thread count.

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/parallel.h"
#include "kernels/kernels.h"

namespace hetu {
namespace kernels {

namespace {

// About 16K scores a chunk at least: a smaller one costs less than waking a thread.
constexpr int64_t kChunkScores = int64_t(1) << 14;

// fn(r, allowed, end) for every row r, on the threads: allowed(j) for key j < end; every key at
// or past end is disallowed.
template <typename Fn>
void for_rows(const AttentionShape& s, Fn fn) {
  const int64_t rows = s.batch * s.heads * s.lq;
  if (rows == 0 || s.lk == 0) return;
  parallel_for(rows, std::max<int64_t>(1, kChunkScores / s.lk), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t i = r % s.lq, b = r / (s.heads * s.lq);
      const int64_t keys = s.causal ? std::min(i + 1, s.lk) : s.lk;
      const float* m = s.mask ? s.mask + b * s.lk : nullptr;
      fn(r, [m](int64_t j) { return m == nullptr || m[j] != 0.0f; }, keys);
    }
  });
}

}  // namespace

void masked_softmax(const AttentionShape& s, const float* scores, float* out) {
  for_rows(s, [&](int64_t r, auto allowed, int64_t keys) {
    const float* x = scores + r * s.lk;
    float* y = out + r * s.lk;
    float top = -INFINITY;
    for (int64_t j = 0; j < keys; ++j)
      if (allowed(j)) top = std::max(top, s.scale * x[j]);
    double total = 0.0;
    for (int64_t j = 0; j < keys; ++j) {
      y[j] = allowed(j) ? std::exp(s.scale * x[j] - top) : 0.0f;
      total += y[j];
    }
    std::fill(y + keys, y + s.lk, 0.0f);
    if (total == 0.0) return;   // no key allowed: zeros
    for (int64_t j = 0; j < keys; ++j) y[j] = static_cast<float>(y[j] / total);
  });
}

void masked_softmax_backward(const AttentionShape& s, const float* grad, const float* probs, float* out) {
  for_rows(s, [&](int64_t r, auto allowed, int64_t keys) {
    const float* g = grad + r * s.lk;
    const float* y = probs + r * s.lk;
    float* dx = out + r * s.lk;
    double dot = 0.0;
    for (int64_t j = 0; j < keys; ++j)
      if (allowed(j)) dot += static_cast<double>(g[j]) * y[j];
    const float d = static_cast<float>(dot);
    for (int64_t j = 0; j < keys; ++j) dx[j] = allowed(j) ? s.scale * (y[j] * (g[j] - d)) : 0.0f;
    std::fill(dx + keys, dx + s.lk, 0.0f);
  });
}

void pointwise_attention(const AttentionShape& s, const float* scores, float* out) {
  const float n = static_cast<float>(s.lk);
  for_rows(s, [&](int64_t r, auto allowed, int64_t keys) {
    const float* x = scores + r * s.lk;
    float* y = out + r * s.lk;
    for (int64_t j = 0; j < keys; ++j) {
      const float z = s.scale * x[j];
      y[j] = allowed(j) ? z * sigmoid(z) / n : 0.0f;
    }
    std::fill(y + keys, y + s.lk, 0.0f);
  });
}

void pointwise_attention_backward(const AttentionShape& s, const float* grad, const float* scores, float* out) {
  const float n = static_cast<float>(s.lk);
  for_rows(s, [&](int64_t r, auto allowed, int64_t keys) {
    const float* g = grad + r * s.lk;
    const float* x = scores + r * s.lk;
    float* dx = out + r * s.lk;
    for (int64_t j = 0; j < keys; ++j) {
      if (!allowed(j)) {
        dx[j] = 0.0f;
        continue;
      }
      const float z = s.scale * x[j], sg = sigmoid(z);
      dx[j] = g[j] * (s.scale * (sg * (1.0f + z * (1.0f - sg)))) / n;
    }
    std::fill(dx + keys, dx + s.lk, 0.0f);
  });
}

void time_buckets(const int64_t* times, int64_t batch, int64_t length, const int64_t* thresholds,
                  int64_t num_thresholds, int64_t* out) {
  parallel_for(batch * length, std::max<int64_t>(1, kChunkScores / std::max<int64_t>(1, length)),
               [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t* t = times + (r / length) * length;
      const int64_t ti = t[r % length];
      int64_t* o = out + r * length;
      // The count of thresholds at or below each gap, found from the previous key's by stepping
      // up or down: a history in time order moves a gap's bucket by a step or none from key to
      // key (the buckets grow as the logarithm), so this takes a comparison or two where a
      // binary search took seven mispredicted ones; any order of times gets the same counts.
      int64_t b = 0;
      for (int64_t j = 0; j < length; ++j) {
        const int64_t gap = ti >= t[j] ? ti - t[j] : t[j] - ti;
        while (b < num_thresholds && thresholds[b] <= gap) ++b;
        while (b > 0 && thresholds[b - 1] > gap) --b;
        o[j] = b;
      }
    }
  });
}

int64_t bucket_sums(const int64_t* index, const float* values, int64_t n, int64_t buckets, float* out) {
  std::vector<double> sums(static_cast<size_t>(buckets), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t b = index[i];
    if (b < 0 || b >= buckets) return i;
    sums[b] += static_cast<double>(values[i]);
  }
  for (int64_t b = 0; b < buckets; ++b) out[b] = static_cast<float>(sums[b]);
  return -1;
}

}  // namespace kernels
}  // namespace hetu
