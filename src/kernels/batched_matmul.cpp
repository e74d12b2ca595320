// A stack of small matrix products (DLRM's pairwise dots: [batch, 27, 64] x [batch, 64, 27]),
// threaded over the stack. NumPy's matmul of a stack calls the BLAS once per product, and a
// product this small costs less than the call.
//
// Every output element is summed in one fixed order, out[i, j] = ((0 + a(i,0) b(0,j)) + a(i,1)
// b(1,j)) + ..., each product and sum rounded apart (no fused multiply-add: the build's
// -ffp-contract=off, and vector extensions, which it does not fuse). A vector lane is one output
// element, so the width of the vectors changes nothing: the AVX-512, AVX2 and baseline versions,
// and any thread count, give the same bits.

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/parallel.h"
#include "common/simd.h"
#include "kernels/kernels.h"

namespace hetu {
namespace kernels {

namespace {

constexpr int kRows = 4;  // output rows a block keeps in registers

// One product op(A)[m, k] x op(B)[k, n] -> out [m, n], row-major, in blocks of kRows rows by
// 2 vectors of V floats (1 where n fits one): each step down k broadcasts one float of each of the block's rows of A
// (read where it is: a row's floats are `a_step` apart) and loads two vectors of a row of B.
// B is read in place when its rows are whole blocks wide, else copied to rows padded with zeros
// (transposed first with trans_b). A block past A's last row repeats that row. What padding and
// repeated rows compute is not written out.
// Inlined into each version below, so that all of it is compiled for that version's instructions.
#define HETU_INLINE inline __attribute__((always_inline))

template <int V>
struct Product {
  typedef float Vec __attribute__((vector_size(V * sizeof(float))));

  HETU_INLINE static Vec load(const float* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }

  HETU_INLINE static void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

  // op(B) as [k][n_padded] floats.
  HETU_INLINE static void pack_b(const float* b, int64_t n, int64_t k, bool trans_b, int64_t n_padded, float* packed) {
    if (trans_b) {
      // Four of B's rows at a time, each read in order: four columns of the copy.
      int64_t j = 0;
      for (; j + 4 <= n; j += 4)
        for (int64_t p = 0; p < k; ++p)
          for (int c = 0; c < 4; ++c) packed[p * n_padded + j + c] = b[(j + c) * k + p];
      for (; j < n; ++j)
        for (int64_t p = 0; p < k; ++p) packed[p * n_padded + j] = b[j * k + p];
    }
    for (int64_t p = 0; p < k; ++p) {
      float* row = packed + p * n_padded;
      if (!trans_b) std::memcpy(row, b + p * n, sizeof(float) * n);
      std::fill(row + n, row + n_padded, 0.0f);
    }
  }

  // acc[r] = the rows rows[r] of op(A) times columns [j, j + NV * V) of B.
  template <int NV>
  HETU_INLINE static void block(const float* const rows[kRows], int64_t a_step, const float* b, int64_t b_stride,
                                int64_t k, int64_t j, Vec acc[kRows][NV]) {
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < NV; ++c) acc[r][c] = Vec{};
    for (int64_t p = 0; p < k; ++p) {
      Vec bv[NV];
      for (int c = 0; c < NV; ++c) bv[c] = load(b + p * b_stride + j + c * V);
      for (int r = 0; r < kRows; ++r) {
        const float ar = rows[r][p * a_step];
        for (int c = 0; c < NV; ++c) acc[r][c] = acc[r][c] + ar * bv[c];
      }
    }
  }

  // Blocks NV vectors wide. b: op(B) as [k][b_stride] floats, b_stride a multiple of NV * V.
  template <int NV>
  HETU_INLINE static void multiply(const float* a, bool trans_a, const float* b, int64_t b_stride, int64_t m,
                                   int64_t n, int64_t k, float* out) {
    constexpr int kCols = NV * V;
    const int64_t a_row = trans_a ? 1 : k, a_step = trans_a ? m : 1;
    Vec acc[kRows][NV];
    float edge[kCols];
    for (int64_t i = 0; i < m; i += kRows) {
      const float* rows[kRows];
      for (int r = 0; r < kRows; ++r) rows[r] = a + std::min<int64_t>(i + r, m - 1) * a_row;
      const int live = static_cast<int>(std::min<int64_t>(kRows, m - i));
      for (int64_t j = 0; j < n; j += kCols) {
        block<NV>(rows, a_step, b, b_stride, k, j, acc);
        const int64_t cols = std::min<int64_t>(kCols, n - j);
        for (int r = 0; r < live; ++r) {
          float* to = cols == kCols ? out + (i + r) * n + j : edge;
          for (int c = 0; c < NV; ++c) store(to + c * V, acc[r][c]);
          if (cols != kCols) std::memcpy(out + (i + r) * n + j, edge, sizeof(float) * cols);
        }
      }
    }
  }

  // Products [begin, end) of the stack.
  HETU_INLINE static void run(const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a,
                              bool trans_b, float* out, int64_t begin, int64_t end) {
    const bool narrow = n <= V;   // one vector a block row: two would be half padding
    const int64_t cols = narrow ? V : 2 * V;
    const bool in_place = !trans_b && n % cols == 0;
    const int64_t n_padded = (n + cols - 1) / cols * cols;
    std::vector<float> packed(in_place ? 0 : k * n_padded);
    for (int64_t s = begin; s < end; ++s) {
      const float* b_s = b + s * k * n;
      if (!in_place) pack_b(b_s, n, k, trans_b, n_padded, packed.data());
      const float* b_rows = in_place ? b_s : packed.data();
      if (narrow)
        multiply<1>(a + s * m * k, trans_a, b_rows, n_padded, m, n, k, out + s * m * n);
      else
        multiply<2>(a + s * m * k, trans_a, b_rows, n_padded, m, n, k, out + s * m * n);
    }
  }
};

using RunFn = void (*)(const float*, const float*, int64_t, int64_t, int64_t, bool, bool, float*, int64_t, int64_t);

#define HETU_PRODUCT_VERSION(NAME, ATTR, V)                                                                    \
  ATTR void NAME(const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b, \
                 float* out, int64_t begin, int64_t end) {                                                   \
    Product<V>::run(a, b, m, n, k, trans_a, trans_b, out, begin, end);                                       \
  }
#if defined(__x86_64__)
HETU_PRODUCT_VERSION(RunAvx512f, __attribute__((target("avx512f"))), 16)
HETU_PRODUCT_VERSION(RunAvx2, __attribute__((target("avx2"))), 8)
#endif
HETU_PRODUCT_VERSION(RunDefault, , 4)
#undef HETU_PRODUCT_VERSION
#undef HETU_INLINE

RunFn version_of(const std::string& variant) {
#if defined(__x86_64__)
  if (variant == "avx512f") return RunAvx512f;
  if (variant == "avx2") return RunAvx2;
#endif
  return RunDefault;
}

// The process's pool for the stacks (a new one in a forked child, whose parent's threads are
// gone). Not parallel_for's pool: that one waits for each of its parts, and on a busy host a
// thread the OS had not yet woken held a 1 ms product up for 4-5 ms (median); in this one the threads
// take chunks as they come, and the caller does them all if the other threads are late.
Pool& products_pool() { return *per_process<Pool>([] { return new Pool(num_threads()); }); }

}  // namespace

const std::vector<std::string>& matmul_variants() { return simd::variants(); }

std::string runnable_matmul_variant(const std::string& want) {
  const auto& all = matmul_variants();
  const char* env = std::getenv("HETU_SIMD");   // as the servers' step loop: one switch for both
  const std::string asked = !want.empty() ? want : env && *env ? env : "";
  const std::string where = !want.empty() ? "batched_matmul: " : "HETU_SIMD: ";
  if (asked.empty()) {
    for (const auto& v : all)
      if (simd::runnable(v)) return v;
    return "default";
  }
  if (std::find(all.begin(), all.end(), asked) == all.end())
    throw std::invalid_argument(where + "no version '" + asked + "' (avx512f, avx2, default)");
  if (!simd::runnable(asked)) throw std::invalid_argument(where + "this CPU cannot run '" + asked + "'");
  return asked;
}

void batched_matmul(const float* a, const float* b, int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a,
                    bool trans_b, float* out, const std::string& variant) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(out, out + batch * m * n, 0.0f);
    return;
  }
  const RunFn run = version_of(variant.empty() ? runnable_matmul_variant("") : variant);
  // About 64K multiply-adds a chunk at least: a smaller one costs less than waking a thread.
  const int64_t min_chunk = std::max<int64_t>(1, (int64_t(1) << 16) / (m * n * k));
  products_pool().parallel_for(batch, min_chunk, [&](int64_t begin, int64_t end) {
    run(a, b, m, n, k, trans_a, trans_b, out, begin, end);
  });
}

}  // namespace kernels
}  // namespace hetu
