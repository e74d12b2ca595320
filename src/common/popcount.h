// Set bits in a word. The portable build has no popcnt instruction, and the library call in its
// place costs several times this branch-free count.
#pragma once
#include <cstdint>

namespace hetu {

inline int PopCount(uint64_t x) {
  x = x - ((x >> 1) & 0x5555555555555555ULL);
  x = (x & 0x3333333333333333ULL) + ((x >> 2) & 0x3333333333333333ULL);
  x = (x + (x >> 4)) & 0x0f0f0f0f0f0f0f0fULL;
  return static_cast<int>((x * 0x0101010101010101ULL) >> 56);
}

}  // namespace hetu
