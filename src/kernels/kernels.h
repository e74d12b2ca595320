// CPU kernels behind hetu's hot paths. All are safe to call without the GIL.
#pragma once
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "common/optim_rules.h"
#include "common/rng.h"

namespace hetu {
namespace kernels {

// out[i] = table[ids[i]]. Returns -1, or the position of the first id outside [0, num_rows).
int64_t gather_rows(const float* table, int64_t num_rows, int64_t width, const int64_t* ids, int64_t n,
                    float* out);

// Bags (multi-hot fields): each of the n samples has `slots` id slots, grouped into `bags` bags,
// bag k being slots [bag_offsets[k], bag_offsets[k + 1]); -1 marks an empty slot.
// out[s, k] = the sum (or, with `mean`, the mean) of the rows of bag k of sample s, added in slot
// order; an empty bag gives zeros. Returns -1, or the position of the first id outside
// [0, num_rows) that is not -1.
int64_t pool_bags(const float* table, int64_t num_rows, int64_t width, const int64_t* ids, int64_t n, int64_t slots,
                  const int64_t* bag_offsets, int64_t bags, bool mean, float* out);

// pool_bags' sparse gradient, summed per id: the distinct ids of the filled slots, ascending
// (uniq), and for each the sum, in sample and slot order, of its bags' upstream gradients
// grads[s, k] (each divided by its bag's length for `mean`): what unique_sum makes of one row per
// filled slot, bit for bit, without those rows. Returns the number of distinct ids.
int64_t bag_gradient(const int64_t* ids, int64_t n, int64_t slots, const int64_t* bag_offsets, int64_t bags,
                     bool mean, const float* grads, int64_t width, std::vector<int64_t>* uniq,
                     std::vector<float>* summed);

// bag_gradient and apply_rows in one pass, for a table this process owns: each distinct id's sum
// (in bag_gradient's order) is stepped into its row as soon as it is complete, never written out.
// The table, state and step counts come out bit for bit as bag_gradient, unique_sum and
// apply_rows leave them, for every optimizer kind and storage type. table: [num_rows, width];
// state: [num_rows, state_width(cfg.kind, width)]; steps: [num_rows]. Returns -1, or the position
// of the first id outside [0, num_rows) that is not -1 (then nothing is stepped). A single-id
// lookup's gradient is bags of one slot (slots = bags = 1) with `empty_slots` false: -1 is then
// a bad id like any other outside the table, and the sums are unique_sum's of the occurrences.
int64_t bag_gradient_step(const int64_t* ids, int64_t n, int64_t slots, const int64_t* bag_offsets, int64_t bags,
                          bool mean, const float* grads, const optim::Config& cfg, float lr, float* table,
                          int64_t num_rows, int64_t width, float* state, int64_t* steps, bool empty_slots = true);

// Sums the rows of `grads` that share an id. uniq comes out sorted ascending; each id's rows
// are added in their order of occurrence. Returns the number of unique ids.
int64_t unique_sum(const int64_t* ids, const float* grads, int64_t n, int64_t width, std::vector<int64_t>* uniq,
                   std::vector<float>* summed);

// One optimizer step of rows[i] (unique) of a table with gradient grads[i].
// state: [num_rows, slots*width]; steps: [num_rows].
void apply_rows(const optim::Config& cfg, float lr, float* table, float* state, int64_t* steps, int64_t width,
                const int64_t* rows, const float* grads, int64_t n);

// A catch-up kind's rows[i] (any order, repeats allowed; ids outside [0, num_rows) skipped)
// brought to step `target` (optim::catch_up_row): the steps they skipped, applied before they
// are read or stepped.
void catch_up_rows(const optim::Config& cfg, float* table, float* state, int64_t* steps, int64_t num_rows,
                   int64_t width, const int64_t* rows, int64_t n, int64_t target);

// One optimizer step of a dense tensor of `size` floats. state: slots arrays of `size` floats.
void apply_dense(const optim::Config& cfg, float lr, float* w, float* state, int64_t* step, const float* g,
                 int64_t size);

// out[s] = op(a[s]) x op(b[s]) for the `batch` products of a stack: op(a[s]) is [m, k] (a[s]
// stored [k, m] with trans_a), op(b[s]) [k, n] (stored [n, k] with trans_b), out [batch, m, n];
// all row-major and contiguous. Each element is summed over k in order, products and sums
// rounded apart: the same bits for every version, CPU and thread count. `variant`: a version of
// matmul_variants() to run ("": runnable_matmul_variant("")), checked by the caller.
void batched_matmul(const float* a, const float* b, int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a,
                    bool trans_b, float* out, const std::string& variant = "");
// batched_matmul's versions, best first: "avx512f", "avx2", "default".
const std::vector<std::string>& matmul_variants();
// `want` checked (known, runnable on this CPU; std::invalid_argument if not), or for "" the
// version HETU_SIMD names (checked alike), else the best this CPU runs.
std::string runnable_matmul_variant(const std::string& want);

// sigmoid(z) through e = exp(-|z|), which never overflows, as hetu.ops.activation.sigmoid.
inline float sigmoid(float z) {
  const float e = std::exp(-std::fabs(z));
  return (z >= 0.0f ? 1.0f : e) / (e + 1.0f);
}
// out[i] = silu(x[i]) = x[i] sigmoid(x[i]) (kernels/activation.cpp), threaded; `variant` one of
// matmul_variants() ("": runnable_matmul_variant("")), checked by the caller.
void silu(const float* x, int64_t n, float* out, const std::string& variant = "");
// out[i] = g[i] d silu / dx at x[i] = g[i] sigmoid(x[i]) (1 + x[i] (1 - sigmoid(x[i]))).
void silu_backward(const float* g, const float* x, int64_t n, float* out, const std::string& variant = "");

// Attention weights over scores [batch, heads, lq, lk] (kernels/attention.cpp): key j is allowed
// for query i iff mask[b, j] != 0 (mask [batch, lk], or null: every key) and, when causal,
// j <= i. Disallowed entries come out 0. Every row is one thread's, in key order: the same bits
// on every thread count.
struct AttentionShape {
  int64_t batch, heads, lq, lk;
  const float* mask;
  bool causal;
  float scale;
};
// out = softmax over the allowed keys of scale * scores; a row without one is zeros.
void masked_softmax(const AttentionShape& shape, const float* scores, float* out);
// out = d(scores) of masked_softmax from grad and its output probs: scale * probs * (grad - <grad, probs>).
void masked_softmax_backward(const AttentionShape& shape, const float* grad, const float* probs, float* out);
// out = silu(scale * scores) / lk on the allowed keys (HSTU's pointwise attention).
void pointwise_attention(const AttentionShape& shape, const float* scores, float* out);
// out = d(scores) of pointwise_attention from grad and its input scores.
void pointwise_attention_backward(const AttentionShape& shape, const float* grad, const float* scores, float* out);

// out [batch, L, L] = HSTU's bucket of each time gap |t[b, i] - t[b, j]| of times [batch, L]: the
// number of thresholds (ascending) at or below it, thresholds[k - 1] being the least gap in bucket
// k or above (hetu.ops.attention.bucket_thresholds). Threaded over (b, i).
void time_buckets(const int64_t* times, int64_t batch, int64_t length, const int64_t* thresholds,
                  int64_t num_thresholds, int64_t* out);
// out[b] = the sum of values[i] over index[i] == b, in double and in index order, as np.bincount
// does (the same bits); returns -1, or the first i whose index is outside [0, buckets).
int64_t bucket_sums(const int64_t* index, const float* values, int64_t n, int64_t buckets, float* out);

// Rows [row_begin, row_end) of a parameter initialised by rng::init_value.
void init_fill(int kind, double a, double b, uint64_t seed, uint64_t stream, int64_t row_begin, int64_t row_end,
               int64_t width, float* out);

// init_fill's rows rows[0..n) (any order, repeats allowed) into out [n, width]: row k of out is
// row rows[k] of the initializer (per-sample random draws keyed by each sample's data row).
void init_fill_rows(int kind, double a, double b, uint64_t seed, uint64_t stream, const int64_t* rows, int64_t n,
                    int64_t width, float* out);

}  // namespace kernels
}  // namespace hetu
