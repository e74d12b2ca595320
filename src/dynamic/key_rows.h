// Initial rows of a dynamic table's keys (docs/design.md section 13): the row a key starts from is
// drawn from the table's initializer seeded by (table seed, table stream, key) alone, so a key
// starts from the same row on every node, whichever slot it takes and whenever it is admitted.
#pragma once
#include <cstdint>

#include "common/rng.h"

namespace hetu {
namespace dynamic {

// The counter-based stream of `key` in the table whose stream is `stream` (rng.h): element j
// of the key's row is rng::init_value(kind, a, b, seed, KeyStream(stream, key), j).
inline uint64_t KeyStream(uint64_t stream, int64_t key) {
  return rng::splitmix64(stream ^ rng::splitmix64(static_cast<uint64_t>(key)));
}

// out[i * width .. (i + 1) * width): the initial row of keys[i].
void FillKeyRows(int kind, double a, double b, uint64_t seed, uint64_t stream, const int64_t* keys, int64_t n,
                 int64_t width, float* out);

}  // namespace dynamic
}  // namespace hetu
