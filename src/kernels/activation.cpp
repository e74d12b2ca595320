// Elementwise activations on the CPU's threads (hetu.ops.activation). SiLU is HSTU's gate and
// projection activation over [batch, L, 4d] every block: as NumPy array code it takes five passes
// over memory and two temporaries.
//
// Each value is taken to double and its sigmoid computed from e = exp(-|x|), which never
// overflows, by one fixed sequence of IEEE operations: n = the nearest integer to z / ln 2, r = z
// - n ln 2 in two parts (Cody and Waite), exp(r) by its Taylor polynomial of degree 11 (relative
// error below 1e-14 for |r| <= ln 2 / 2), times 2^n written into the exponent's bits; z < -708
// gives e = 0, as the library's exp underflows to there. The result is rounded once to float32:
// within half an ulp of the exact value but where that lies within 1e-14 of a rounding boundary.
// A vector lane is one element and every version (AVX-512, AVX2, baseline) and the tail run the
// same operations (no fused multiply-add: the build's -ffp-contract=off), so the bits depend on
// neither the CPU nor the thread count. The library's scalar exp took 75 ms for HSTU's 5M values.

#include <cstdint>
#include <cstring>
#include <string>

#include "common/parallel.h"
#include "kernels/kernels.h"

namespace hetu {
namespace kernels {

namespace {

constexpr int64_t kChunk = int64_t(1) << 15;   // elements a thread takes at least

#define HETU_INLINE inline __attribute__((always_inline))

template <int V>
struct SiluLanes {
  typedef double VD __attribute__((vector_size(V * sizeof(double))));
  typedef int64_t VI __attribute__((vector_size(V * sizeof(int64_t))));

  HETU_INLINE static VD splat(double v) { return VD{} + v; }

  // exp(z) for z <= 0 (or NaN), lane by lane.
  HETU_INLINE static VD exp_nonpositive(VD z) {
    const VD low = splat(-708.0);
    const VD zc = z < low ? low : z;   // n stays >= -1021: 2^n a normal double
    const VD shifter = splat(0x1.8p52);  // adding it rounds to an integer, kept in the low bits
    const VD t = zc * splat(1.4426950408889634) + shifter;
    const VD n = t - shifter;
    VD r = zc - n * splat(6.93147180369123816490e-01);  // ln 2's high part: n times it is exact
    r = r - n * splat(1.90821492927058770002e-10);
    VD p = splat(1.0 / 39916800.0);
    p = p * r + splat(1.0 / 3628800.0);
    p = p * r + splat(1.0 / 362880.0);
    p = p * r + splat(1.0 / 40320.0);
    p = p * r + splat(1.0 / 5040.0);
    p = p * r + splat(1.0 / 720.0);
    p = p * r + splat(1.0 / 120.0);
    p = p * r + splat(1.0 / 24.0);
    p = p * r + splat(1.0 / 6.0);
    p = p * r + splat(0.5);
    p = p * r + splat(1.0);
    p = p * r + splat(1.0);
    VI t_bits, shifter_bits;
    std::memcpy(&t_bits, &t, sizeof t_bits);
    std::memcpy(&shifter_bits, &shifter, sizeof shifter_bits);
    const VI exponent = (t_bits - shifter_bits + 1023) << 52;
    VD scale;
    std::memcpy(&scale, &exponent, sizeof scale);
    const VD e = p * scale;
    return z < low ? splat(0.0) : e;
  }

  // V floats as doubles, and back (through arrays: GCC takes a template's vector types for their
  // element type until instantiated, so neither subscripts nor __builtin_convertvector compile).
  HETU_INLINE static VD widen(const float* in) {
    double wide[V];
    for (int l = 0; l < V; ++l) wide[l] = in[l];
    VD v;
    std::memcpy(&v, wide, sizeof v);
    return v;
  }

  HETU_INLINE static void narrow(VD v, float* out) {
    double wide[V];
    std::memcpy(wide, &v, sizeof v);
    for (int l = 0; l < V; ++l) out[l] = static_cast<float>(wide[l]);
  }

  // V values: out = silu(x), or with g, out = g d silu / dx at x.
  HETU_INLINE static void block(const float* x_in, const float* g_in, float* out) {
    const VD x = widen(x_in);
    const VD zero = splat(0.0), one = splat(1.0);
    const VD e = exp_nonpositive(x < zero ? x : -x);
    const VD s = (x >= zero ? one : e) / (e + one);
    narrow(g_in == nullptr ? s * x : s * ((one - s) * x + one) * widen(g_in), out);
  }

  HETU_INLINE static void run(const float* x, const float* g, float* out, int64_t begin, int64_t end) {
    int64_t i = begin;
    for (; i + V <= end; i += V) block(x + i, g ? g + i : nullptr, out + i);
    if (i == end) return;
    float xs[V] = {}, gs[V] = {}, ys[V];   // the tail, padded: the same lanes' operations
    std::memcpy(xs, x + i, sizeof(float) * (end - i));
    if (g) std::memcpy(gs, g + i, sizeof(float) * (end - i));
    block(xs, g ? gs : nullptr, ys);
    std::memcpy(out + i, ys, sizeof(float) * (end - i));
  }
};

using SiluFn = void (*)(const float*, const float*, float*, int64_t, int64_t);

#define HETU_SILU_VERSION(NAME, ATTR, V)                                                         \
  ATTR void NAME(const float* x, const float* g, float* out, int64_t begin, int64_t end) { \
    SiluLanes<V>::run(x, g, out, begin, end);                                                  \
  }
#if defined(__x86_64__)
HETU_SILU_VERSION(SiluAvx512f, __attribute__((target("avx512f"))), 8)
HETU_SILU_VERSION(SiluAvx2, __attribute__((target("avx2"))), 4)
#endif
HETU_SILU_VERSION(SiluDefault, , 2)
#undef HETU_SILU_VERSION
#undef HETU_INLINE

SiluFn version_of(const std::string& variant) {
#if defined(__x86_64__)
  if (variant == "avx512f") return SiluAvx512f;
  if (variant == "avx2") return SiluAvx2;
#endif
  return SiluDefault;
}

void silu_lanes(const float* x, const float* g, int64_t n, float* out, const std::string& variant) {
  // "": the version HETU_SIMD names, else the best this CPU runs (as the batched products choose).
  const SiluFn run = version_of(variant.empty() ? runnable_matmul_variant("") : variant);
  parallel_for(n, kChunk, [&](int64_t begin, int64_t end) { run(x, g, out, begin, end); });
}

}  // namespace

void silu(const float* x, int64_t n, float* out, const std::string& variant) {
  silu_lanes(x, nullptr, n, out, variant);
}

void silu_backward(const float* g, const float* x, int64_t n, float* out, const std::string& variant) {
  silu_lanes(x, g, n, out, variant);
}

}  // namespace kernels
}  // namespace hetu
