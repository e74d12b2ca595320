// Counter-based random numbers for parameter initialisation.
//
// A value depends only on (seed, stream, index), never on what was drawn before, so any
// slice of a table (one server's key range, one worker's rows) is initialised to exactly
// the values that initialising the whole table in one process gives. hetu's initializers
// and the parameter server both draw through this header.
#pragma once
#include <cmath>
#include <cstdint>

namespace hetu {
namespace rng {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

inline uint64_t hash3(uint64_t seed, uint64_t stream, uint64_t index) {
  return splitmix64(splitmix64(splitmix64(seed) ^ stream) ^ index);
}

// Uniform in the open interval (0, 1), 53 bits.
inline double uniform01(uint64_t seed, uint64_t stream, uint64_t index) {
  return (static_cast<double>(hash3(seed, stream, index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal by Box-Muller on two independent uniforms of the same index.
inline double standard_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  const double u1 = uniform01(seed, stream, 2 * index);
  const double u2 = uniform01(seed, stream, 2 * index + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

// Standard normal restricted to [-2, 2] by redrawing: attempt k uses a derived stream,
// so the result is still a pure function of (seed, stream, index).
inline double truncated_standard_normal(uint64_t seed, uint64_t stream, uint64_t index) {
  for (uint64_t attempt = 0;; ++attempt) {
    const double x = standard_normal(seed, stream + attempt * 0xD1B54A32D192ED03ULL, index);
    if (x >= -2.0 && x <= 2.0) return x;
  }
}

enum InitKind : int { kConstant = 0, kUniform = 1, kNormal = 2, kTruncatedNormal = 3 };

// Value of element `index` (row * width + col) of a parameter initialised with `kind`.
// a, b: constant -> (value, unused); uniform -> (low, high); normal and truncated normal
// -> (mean, stddev).
inline float init_value(int kind, double a, double b, uint64_t seed, uint64_t stream, uint64_t index) {
  switch (kind) {
    case kConstant: return static_cast<float>(a);
    case kUniform: return static_cast<float>(a + (b - a) * uniform01(seed, stream, index));
    case kNormal: return static_cast<float>(a + b * standard_normal(seed, stream, index));
    default: return static_cast<float>(a + b * truncated_standard_normal(seed, stream, index));
  }
}

// Fills out[0 .. (row_end-row_begin)*width) with rows [row_begin, row_end) of the parameter:
// init_value of each element, with the (seed, stream) half of hash3 taken once for all of them
// (a dynamic table's admissions draw a short row per key, where it was a third of the cost).
inline void fill_rows(int kind, double a, double b, uint64_t seed, uint64_t stream, int64_t row_begin,
                      int64_t row_end, int64_t width, float* out) {
  const uint64_t first = static_cast<uint64_t>(row_begin) * static_cast<uint64_t>(width);
  const uint64_t count = static_cast<uint64_t>(row_end - row_begin) * static_cast<uint64_t>(width);
  const uint64_t keyed = splitmix64(splitmix64(seed) ^ stream);  // hash3(seed, stream, i) = splitmix64(keyed ^ i)
  auto unit = [keyed](uint64_t index) {  // uniform01
    return (static_cast<double>(splitmix64(keyed ^ index) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
  };
  switch (kind) {
    case kConstant:
      for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<float>(a);
      return;
    case kUniform:
      for (uint64_t i = 0; i < count; ++i) out[i] = static_cast<float>(a + (b - a) * unit(first + i));
      return;
    case kNormal:
      for (uint64_t i = 0; i < count; ++i) {  // standard_normal
        const uint64_t index = first + i;
        const double u1 = unit(2 * index), u2 = unit(2 * index + 1);
        out[i] = static_cast<float>(a + b * (std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2)));
      }
      return;
    default:
      for (uint64_t i = 0; i < count; ++i) out[i] = init_value(kind, a, b, seed, stream, first + i);
  }
}

// Stable 64-bit id of a parameter name (FNV-1a), used as its stream.
inline uint64_t name_stream(const char* name) {
  uint64_t h = 1469598103934665603ULL;
  for (const char* p = name; *p; ++p) h = (h ^ static_cast<unsigned char>(*p)) * 1099511628211ULL;
  return h;
}

}  // namespace rng
}  // namespace hetu
