// Ids drawn for a sequence model's sampled softmax: uniform negative items keyed by where they are
// used, so that every training mode and worker count draws the same ones (hetu.data.sequences).
//
// Negative j of position p of the sample at dataset row `sample`, at training step `step`:
//   h = splitmix64(splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ step) ^ sample) ^ p) ^ j)
// (rng::splitmix64; every value an unsigned 64-bit integer), mapped to [0, num_items) by
// uniform_below. It depends on those five numbers only: not on the batch it is drawn in, its
// order, or the threads that draw it.
#pragma once
#include <cstdint>

#include "common/rng.h"

namespace hetu {
namespace kernels {

// splitmix64(state ^ x): one link of the key's chain.
inline uint64_t chain_key(uint64_t state, uint64_t x) { return rng::splitmix64(state ^ x); }

// An integer uniform in [0, n), n >= 1, from a uniform 64-bit h by Lemire's multiply-shift
// ("Fast random integer generation in an interval", 2019): the high 64 bits of h x n, exactly
// uniform because a product whose low 64 bits fall below 2^64 mod n (a chance below n / 2^64) is
// rejected, h then replaced by splitmix64(h) until one is kept.
inline uint64_t uniform_below(uint64_t h, uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(h) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;  // 2^64 mod n
    while (low < threshold) {
      h = rng::splitmix64(h);
      m = static_cast<unsigned __int128>(h) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

// out[k, p, j] (k < n, p < length, j < num_negatives) = the negative above for sample
// samples[k], or -1 where targets[k, p] == -1 (a position with no target draws none).
// threads: 0 for the process's pool (HETU_NUM_THREADS), else a pool of that many for this call;
// the numbers are the same either way.
void draw_negatives(uint64_t seed, uint64_t step, const int64_t* samples, const int64_t* targets, int64_t n,
                    int64_t length, int64_t num_negatives, int64_t num_items, int64_t* out, int threads = 0);

}  // namespace kernels
}  // namespace hetu
