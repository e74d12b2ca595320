// Sets of workers as bit masks (one bit per worker, up to 64): who reads a row, whose cached
// copy of it is valid.
#pragma once
#include <cstdint>

#include "common/popcount.h"

namespace hetu {
namespace herald {

inline uint64_t Bit(int w) { return uint64_t(1) << w; }
inline uint64_t AllWorkers(int num_workers) { return num_workers == 64 ? ~uint64_t(0) : Bit(num_workers) - 1; }

// Workers in a mask of type Mask: 8- and 16-bit masks (clusters of up to 16 workers) take the
// table, a lookup per byte; wider masks a branch-free bit count (common/popcount.h).
struct SmallPopCount {
  uint8_t of[256];
  constexpr SmallPopCount() : of() {
    for (int m = 0; m < 256; ++m) of[m] = static_cast<uint8_t>((m & 1) + (m >> 1 & 1) + (m >> 2 & 1) + (m >> 3 & 1) +
                                                               (m >> 4 & 1) + (m >> 5 & 1) + (m >> 6 & 1) + (m >> 7 & 1));
  }
};
inline constexpr SmallPopCount kSmallPopCount;
template <typename Mask>
inline int Workers(Mask m) {
  if constexpr (sizeof(Mask) == 1) {
    return kSmallPopCount.of[m];
  } else if constexpr (sizeof(Mask) == 2) {
    return kSmallPopCount.of[m & 0xFF] + kSmallPopCount.of[m >> 8];
  } else {
    return PopCount(m);
  }
}

}  // namespace herald
}  // namespace hetu
