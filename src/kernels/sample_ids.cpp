// Counter-based negatives of a sequence model (sample_ids.h). Safe to call without the GIL.
#include "kernels/sample_ids.h"

#include <algorithm>

#include "common/parallel.h"

namespace hetu {
namespace kernels {

namespace {

// Rows [begin, end) of the n x length positions.
void draw_rows(uint64_t seed, uint64_t step, const int64_t* samples, const int64_t* targets, int64_t length,
               int64_t num_negatives, uint64_t num_items, int64_t* out, int64_t begin, int64_t end) {
  const uint64_t seeded = chain_key(rng::splitmix64(seed), step);
  for (int64_t row = begin; row < end; ++row) {
    int64_t* o = out + row * num_negatives;
    if (targets[row] == -1) {
      std::fill(o, o + num_negatives, int64_t(-1));
      continue;
    }
    const int64_t k = row / length, p = row % length;
    const uint64_t position = chain_key(chain_key(seeded, static_cast<uint64_t>(samples[k])), static_cast<uint64_t>(p));
    for (int64_t j = 0; j < num_negatives; ++j)
      o[j] = static_cast<int64_t>(uniform_below(chain_key(position, static_cast<uint64_t>(j)), num_items));
  }
}

}  // namespace

void draw_negatives(uint64_t seed, uint64_t step, const int64_t* samples, const int64_t* targets, int64_t n,
                    int64_t length, int64_t num_negatives, int64_t num_items, int64_t* out, int threads) {
  const int64_t rows = n * length;
  if (rows == 0 || num_negatives == 0) return;
  auto work = [&](int64_t begin, int64_t end) {
    draw_rows(seed, step, samples, targets, length, num_negatives, static_cast<uint64_t>(num_items), out, begin, end);
  };
  // each row's draws are its own, so the cut into chunks changes nothing but the speed
  const int64_t min_chunk = std::max<int64_t>(1, 4096 / std::max<int64_t>(1, num_negatives));
  if (threads <= 0) {
    parallel_for(rows, min_chunk, work);
  } else {
    Pool pool(threads);
    pool.parallel_for(rows, min_chunk, work);
  }
}

}  // namespace kernels
}  // namespace hetu
