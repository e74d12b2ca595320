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
#include "kernels/kernels.h"

namespace hetu {
namespace kernels {

namespace {

constexpr int kRows = 4;  // output rows a block keeps in registers

// One product op(A)[m, k] x op(B)[k, n] -> out [m, n], row-major, in blocks of kRows rows by
// 2 vectors of V floats. A is packed as kRows-row panels, each read down its k columns (one
// broadcast per row per step); B as [k, n padded to the block], so each step loads whole vectors.
// Padding is zeros, and what it computes is not written out.
// Inlined into each version below, so that all of it is compiled for that version's instructions.
#define HETU_INLINE inline __attribute__((always_inline))

template <int V>
struct Product {
  typedef float Vec __attribute__((vector_size(V * sizeof(float))));
  static constexpr int kCols = 2 * V;

  HETU_INLINE static Vec load(const float* p) {
    Vec v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }

  HETU_INLINE static void store(float* p, Vec v) { std::memcpy(p, &v, sizeof v); }

  // a_packed: [ceil(m / kRows) panels][k][kRows]; b_packed: [k][n_padded].
  HETU_INLINE static void pack(const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                   int64_t n_padded, float* a_packed, float* b_packed) {
    const int64_t panels = (m + kRows - 1) / kRows;
    for (int64_t panel = 0; panel < panels; ++panel)
      for (int64_t p = 0; p < k; ++p)
        for (int r = 0; r < kRows; ++r) {
          const int64_t i = panel * kRows + r;
          a_packed[(panel * k + p) * kRows + r] = i < m ? (trans_a ? a[p * m + i] : a[i * k + p]) : 0.0f;
        }
    for (int64_t p = 0; p < k; ++p) {
      float* row = b_packed + p * n_padded;
      if (trans_b)
        for (int64_t j = 0; j < n; ++j) row[j] = b[j * k + p];
      else
        std::memcpy(row, b + p * n, sizeof(float) * n);
      std::fill(row + n, row + n_padded, 0.0f);
    }
  }

  HETU_INLINE static void block(const float* a_panel, const float* b_packed, int64_t k, int64_t n_padded, int64_t j, Vec acc[kRows][2]) {
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = Vec{};
    for (int64_t p = 0; p < k; ++p) {
      const Vec b0 = load(b_packed + p * n_padded + j), b1 = load(b_packed + p * n_padded + j + V);
      for (int r = 0; r < kRows; ++r) {
        const float ar = a_panel[p * kRows + r];
        acc[r][0] = acc[r][0] + ar * b0;
        acc[r][1] = acc[r][1] + ar * b1;
      }
    }
  }

  HETU_INLINE static void multiply(const float* a_packed, const float* b_packed, int64_t m, int64_t n, int64_t k,
                       int64_t n_padded, float* out) {
    Vec acc[kRows][2];
    float edge[kRows][kCols];
    for (int64_t i = 0; i < m; i += kRows) {
      const float* a_panel = a_packed + (i / kRows) * k * kRows;
      const int rows = static_cast<int>(std::min<int64_t>(kRows, m - i));
      for (int64_t j = 0; j < n; j += kCols) {
        block(a_panel, b_packed, k, n_padded, j, acc);
        const int64_t cols = std::min<int64_t>(kCols, n - j);
        if (rows == kRows && cols == kCols) {
          for (int r = 0; r < kRows; ++r) {
            store(out + (i + r) * n + j, acc[r][0]);
            store(out + (i + r) * n + j + V, acc[r][1]);
          }
          continue;
        }
        for (int r = 0; r < rows; ++r) {
          store(edge[r], acc[r][0]);
          store(edge[r] + V, acc[r][1]);
          std::memcpy(out + (i + r) * n + j, edge[r], sizeof(float) * cols);
        }
      }
    }
  }

  // Products [begin, end) of the stack.
  HETU_INLINE static void run(const float* a, const float* b, int64_t m, int64_t n, int64_t k, bool trans_a, bool trans_b,
                  float* out, int64_t begin, int64_t end) {
    const int64_t n_padded = (n + kCols - 1) / kCols * kCols;
    std::vector<float> a_packed((m + kRows - 1) / kRows * kRows * k), b_packed(k * n_padded);
    for (int64_t s = begin; s < end; ++s) {
      pack(a + s * m * k, b + s * k * n, m, n, k, trans_a, trans_b, n_padded, a_packed.data(), b_packed.data());
      multiply(a_packed.data(), b_packed.data(), m, n, k, n_padded, out + s * m * n);
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

bool runnable(const std::string& variant) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (variant == "avx512f") return __builtin_cpu_supports("avx512f");
  if (variant == "avx2") return __builtin_cpu_supports("avx2");
#endif
  return variant == "default";
}

RunFn version_of(const std::string& variant) {
#if defined(__x86_64__)
  if (variant == "avx512f") return RunAvx512f;
  if (variant == "avx2") return RunAvx2;
#endif
  return RunDefault;
}

}  // namespace

const std::vector<std::string>& matmul_variants() {
  static const std::vector<std::string> variants{"avx512f", "avx2", "default"};
  return variants;
}

std::string runnable_matmul_variant(const std::string& want) {
  const auto& all = matmul_variants();
  if (want.empty()) {
    for (const auto& v : all)
      if (runnable(v)) return v;
    return "default";
  }
  if (std::find(all.begin(), all.end(), want) == all.end())
    throw std::invalid_argument("batched_matmul: no version '" + want + "' (avx512f, avx2, default)");
  if (!runnable(want)) throw std::invalid_argument("batched_matmul: this CPU cannot run '" + want + "'");
  return want;
}

void batched_matmul(const float* a, const float* b, int64_t batch, int64_t m, int64_t n, int64_t k, bool trans_a,
                    bool trans_b, float* out, const std::string& variant) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(out, out + batch * m * n, 0.0f);
    return;
  }
  static const RunFn best = version_of(runnable_matmul_variant(""));
  const RunFn run = variant.empty() ? best : version_of(runnable_matmul_variant(variant));
  // About 64K multiply-adds a chunk at least: a smaller one costs less than waking a thread.
  const int64_t min_chunk = std::max<int64_t>(1, (int64_t(1) << 16) / (m * n * k));
  parallel_for(batch, min_chunk, [&](int64_t begin, int64_t end) {
    run(a, b, m, n, k, trans_a, trans_b, out, begin, end);
  });
}

}  // namespace kernels
}  // namespace hetu
