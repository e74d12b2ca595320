// Elementwise activations on the CPU's threads (hetu.ops.activation). SiLU is HSTU's gate and
// projection activation over [batch, L, 4d] every block: as NumPy array code it takes five passes
// over memory and two temporaries. Elementwise, so the bits do not depend on the thread count.

#include <cmath>

#include "common/parallel.h"
#include "kernels/kernels.h"

namespace hetu {
namespace kernels {

namespace {
constexpr int64_t kChunk = int64_t(1) << 15;   // elements a thread takes at least
}  // namespace

// In double, rounded once to float32: each value within half an ulp of the exact one, whatever
// the float exp's own error.
inline double sigmoid_double(double z) {
  const double e = std::exp(-std::fabs(z));
  return (z >= 0.0 ? 1.0 : e) / (e + 1.0);
}

void silu(const float* x, int64_t n, float* out) {
  parallel_for(n, kChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = static_cast<float>(sigmoid_double(x[i]) * x[i]);
  });
}

void silu_backward(const float* g, const float* x, int64_t n, float* out) {
  parallel_for(n, kChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const double s = sigmoid_double(x[i]);
      out[i] = static_cast<float>(s * ((1.0 - s) * x[i] + 1.0) * g[i]);
    }
  });
}

}  // namespace kernels
}  // namespace hetu
