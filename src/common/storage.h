// The type an embedding table's rows are stored and moved in (docs/design.md section 5): float32,
// or 16-bit bfloat16 or IEEE half. Arithmetic is always float32: a 16-bit row widens to float32
// exactly, is stepped in float32 (optimizer state stays float32), and the result is rounded to
// nearest, ties to even. The conversions are integer operations on the bits, so every CPU, build
// and vector width gives the same bits; a float32 array that holds only rounded values is the same
// table as the 16-bit one (what the worker caches and the single process keep).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

namespace hetu {
namespace storage {

enum Type : int { kF32 = 0, kBF16 = 1, kF16 = 2 };
constexpr int kNumTypes = 3;

inline const char* name(int t) { return t == kBF16 ? "bf16" : t == kF16 ? "fp16" : "fp32"; }
inline int64_t bytes(int t) { return t == kF32 ? 4 : 2; }  // per element

inline uint32_t bits_of(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

// bfloat16: the upper half of a float32, rounded to nearest even; a NaN stays a (quiet) NaN.
inline uint16_t to_bf16(float x) {
  uint32_t u = bits_of(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float from_bf16(uint16_t h) { return float_of(static_cast<uint32_t>(h) << 16); }

// IEEE binary16, rounded to nearest even, with subnormals; beyond 65504 (from 65520 on, the
// halfway point) an infinity, as IEEE rounding gives.
inline uint16_t to_f16(float x) {
  const uint32_t u = bits_of(x);
  const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity (or is one)
  if (a >= 0x38800000u) {  // a normal half: rebias the exponent (127 -> 15), round 23 -> 10 bits
    uint32_t m = a - (112u << 23);
    m += 0xfffu + ((m >> 13) & 1u);
    return static_cast<uint16_t>(sign | (m >> 13));
  }
  if (a < 0x33000000u) return static_cast<uint16_t>(sign);  // below 2^-25: zero (2^-25 ties to 0)
  // A subnormal half: k units of 2^-24, k = mantissa >> (126 - exponent), rounded to even.
  const uint32_t e = a >> 23, mant = (a & 0x7fffffu) | 0x800000u, shift = 126 - e;
  uint32_t k = mant >> shift;
  const uint32_t rest = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
  if (rest > half || (rest == half && (k & 1u))) ++k;
  return static_cast<uint16_t>(sign | k);
}
inline float from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu;
  uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return float_of(sign | 0x7f800000u | (m << 13));
  if (e) return float_of(sign | ((e + 112) << 23) | (m << 13));
  if (!m) return float_of(sign);
  uint32_t exp = 113;  // a subnormal: shift the mantissa up to its leading one
  while (!(m & 0x400u)) {
    m <<= 1;
    --exp;
  }
  return float_of(sign | (exp << 23) | ((m & 0x3ffu) << 13));
}

inline uint16_t narrow(int t, float x) { return t == kBF16 ? to_bf16(x) : to_f16(x); }
inline float widen(int t, uint16_t h) { return t == kBF16 ? from_bf16(h) : from_f16(h); }
// x rounded to type t, as a float32.
inline float round_to(int t, float x) { return t == kF32 ? x : widen(t, narrow(t, x)); }

inline void round_row(int t, float* x, int64_t n) {
  if (t == kF32) return;
  for (int64_t i = 0; i < n; ++i) x[i] = round_to(t, x[i]);
}
// n elements of type t (float32 or 16-bit) to and from float32.
inline void narrow_row(int t, const float* in, void* out, int64_t n) {
  if (t == kF32) {
    std::memcpy(out, in, n * 4);
    return;
  }
  uint16_t* o = static_cast<uint16_t*>(out);
  for (int64_t i = 0; i < n; ++i) o[i] = narrow(t, in[i]);
}
inline void widen_row(int t, const void* in, float* out, int64_t n) {
  if (t == kF32) {
    std::memcpy(out, in, n * 4);
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(in);
  for (int64_t i = 0; i < n; ++i) out[i] = widen(t, h[i]);
}

// "fp32" | "bf16" | "fp16" -> the type; -1 for any other name.
inline int parse(const std::string& s) {
  for (int t = 0; t < kNumTypes; ++t)
    if (s == name(t)) return t;
  return -1;
}

}  // namespace storage
}  // namespace hetu
