// Elementwise activations on the CPU's threads (hetu.ops.activation). SiLU is HSTU's gate and
// projection activation over [batch, L, 4d] every block: as NumPy array code it takes five passes
// over memory and two temporaries. Elementwise, so the bits do not depend on the thread count.

#include "common/parallel.h"
#include "kernels/kernels.h"

namespace hetu {
namespace kernels {

namespace {
constexpr int64_t kChunk = int64_t(1) << 15;   // elements a thread takes at least
}  // namespace

void silu(const float* x, int64_t n, float* out) {
  parallel_for(n, kChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = sigmoid(x[i]) * x[i];
  });
}

void silu_backward(const float* g, const float* x, int64_t n, float* out) {
  parallel_for(n, kChunk, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float s = sigmoid(x[i]);
      out[i] = s * ((1.0f - s) * x[i] + 1.0f) * g[i];
    }
  });
}

}  // namespace kernels
}  // namespace hetu
