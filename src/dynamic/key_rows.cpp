#include "dynamic/key_rows.h"

#include "common/parallel.h"

namespace hetu {
namespace dynamic {

void FillKeyRows(int kind, double a, double b, uint64_t seed, uint64_t stream, const int64_t* keys, int64_t n,
                 int64_t width, float* out) {
  parallel_for(n, 256, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i)
      rng::fill_rows(kind, a, b, seed, KeyStream(stream, keys[i]), 0, 1, width, out + i * width);
  });
}

}  // namespace dynamic
}  // namespace hetu
