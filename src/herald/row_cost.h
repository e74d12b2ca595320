// What a row costs the iteration under an assignment, as both steps of ColocateAllocate count it
// (the placement, placement.h, and the trades, trades.h): the rows one iteration moves for a row
// given who reads it and who holds a valid copy, what one more reader adds, and the per-worker
// sums of those in vector lanes.
#pragma once
#include <cstdint>
#include <cstring>

#include "herald/worker_mask.h"

namespace hetu {
namespace herald {

// Whether a mask holds exactly one worker.
template <typename Mask>
inline bool OneWorker(Mask m) {
  return (m != 0) & ((m & static_cast<Mask>(m - 1)) == 0);
}

// Rows one iteration moves for a row read by the workers in `readers`, whose cached copies are
// valid at `valid` (section 7's plan): a pull for each reader without a valid copy; a gradient
// push from each reader when several read it; a write-back when a single holder's copy (dirty,
// as far as the estimate knows) is read elsewhere. Without branches: the sweeps ask it of rows
// at random, whose cases a branch would mispredict at nearly every row.
template <typename Mask>
inline __attribute__((always_inline)) int RowCost(Mask readers, Mask valid) {
  const int n = Workers(readers);
  const int pushes = n >= 2 ? n : 0;
  const int writeback = (readers != 0) & (valid != readers) & OneWorker(valid);
  return Workers(static_cast<Mask>(readers & ~valid)) + pushes + writeback;
}

// RowCost(m | Bit(w), v) - RowCost(m, v) for a worker w outside m: k1, plus k2 if w holds no
// valid copy (RowCost's three terms, case by case, as arithmetic rather than branches); 0 for w
// in m. No reader yet: w pulls (k2), and a sole holder's write-back goes (k1 + k2 = 2) or not.
// One reader: it becomes two, both push (2), and a write-back comes where the one reader is the
// sole holder (3). More: w pushes (1).
struct AddedCost {
  int k1, k2;
};
template <typename Mask>
inline AddedCost Added(Mask m, Mask v) {
  const int none = m == 0, one = OneWorker(m);
  return {(1 - none) * (1 + one * (1 + (v == m))), 1 + none * OneWorker(v)};
}
// What worker w adds, from the row's AddedCost c = Added(m, v): 0 for w in m. (WorkerLanes::Added
// is the same for every worker at once.)
template <typename Mask>
inline int AddedBy(AddedCost c, Mask m, Mask v, int w) {
  const int out = 1 - (m >> w & 1), pulls = 1 - (v >> w & 1);
  return out * (c.k1 + pulls * c.k2);
}

// Per-worker sums as vector lanes, one per worker, in 16-byte vectors (GCC and Clang vector
// extensions: SSE2 on any x86-64, NEON on ARM): each of a sample's rows adds to the lanes of the
// workers in or out of its masks with a few whole-vector operations, where a loop over a mask's
// bits mispredicts at nearly every row. Lane: int16_t (eight lanes to a vector) where the sums
// fit, which halves the operations per row; int32_t (four) otherwise (kNarrowLanesUpTo). Integer
// sums: the same on every CPU. Lanes past the cluster's workers are never read.
template <typename Lane>
struct LaneVector;
template <>
struct LaneVector<int16_t> {
  typedef int16_t type __attribute__((vector_size(16)));
};
template <>
struct LaneVector<int32_t> {
  typedef int32_t type __attribute__((vector_size(16)));
};

// of[b]: -1 in lane i where bit i of b is set, for every b of as many bits as a vector has lanes.
template <typename Lane>
struct LaneBits {
  static constexpr int kLanes = 16 / sizeof(Lane);
  typename LaneVector<Lane>::type of[1 << kLanes];
  LaneBits() {
    for (int b = 0; b < (1 << kLanes); ++b)
      for (int i = 0; i < kLanes; ++i) of[b][i] = static_cast<Lane>(-(b >> i & 1));
  }
};
template <typename Lane>
const LaneBits<Lane> kLaneBits;

// A sample's lane sums stay within 8 per row it reads (RowCost changes by at most 4 as a reader
// leaves or joins a row): 16-bit lanes hold the sums of samples of up to this many rows.
constexpr int64_t kNarrowLanesUpTo = 4095;

template <typename Mask, typename Lane>
struct WorkerLanes {
  using Vector = typename LaneVector<Lane>::type;
  static constexpr int kLanes = 16 / sizeof(Lane);
  static constexpr int kVectors = (8 * sizeof(Mask) + kLanes - 1) / kLanes;
  static constexpr int kAll = kVectors * kLanes;  // lanes in all, at least one per bit of Mask
  Vector v[kVectors] = {};

  // The lanes' bits of m: vector c's.
  static int Bits(uint64_t m, int c) { return static_cast<int>(m >> (kLanes * c) & ((1u << kLanes) - 1)); }
  // -1 in lane w where worker w is in m, else 0.
  static WorkerLanes In(Mask m) {
    WorkerLanes out;
    for (int c = 0; c < kVectors; ++c) out.v[c] = kLaneBits<Lane>.of[Bits(m, c)];
    return out;
  }
  // Lane w: RowCost(m | Bit(w), v) - RowCost(m, v), what worker w would add to the row's cost by
  // reading it (0 for the workers in m).
  static WorkerLanes Added(Mask m, Mask valid) {
    const AddedCost c = herald::Added(m, valid);
    const uint64_t out_m = static_cast<Mask>(~m), out_v = static_cast<Mask>(~valid);
    const Lane k1 = static_cast<Lane>(c.k1), k2 = static_cast<Lane>(c.k2);
    WorkerLanes out;
    for (int i = 0; i < kVectors; ++i)
      out.v[i] = kLaneBits<Lane>.of[Bits(out_m, i)] & (k1 + (kLaneBits<Lane>.of[Bits(out_v, i)] & k2));
    return out;
  }
  WorkerLanes& operator+=(const WorkerLanes& o) {
    for (int c = 0; c < kVectors; ++c) v[c] += o.v[c];
    return *this;
  }
  WorkerLanes& operator-=(const WorkerLanes& o) {
    for (int c = 0; c < kVectors; ++c) v[c] -= o.v[c];
    return *this;
  }
  // Lane w to out[w], every lane (out holds kAll).
  void Store(Lane* out) const { std::memcpy(out, v, sizeof v); }
  Lane At(int w) const { return v[w / kLanes][w % kLanes]; }
  // Bit w set where lane w is above 0.
  uint64_t Positive() const {
    uint64_t bits = 0;
    for (int c = 0; c < kVectors; ++c) {
      const Vector above = v[c] > 0;  // -1 where so
      uint64_t these = 0;
#if defined(__SSE2__)
      if constexpr (sizeof(Lane) == 2) {
        typedef short Shorts __attribute__((vector_size(16)));
        typedef char Bytes __attribute__((vector_size(16)));
        const Bytes packed = __builtin_ia32_packsswb128((Shorts)above, Shorts{});  // lane i to byte i
        these = static_cast<uint64_t>(__builtin_ia32_pmovmskb128(packed));
      } else {
        typedef float Floats __attribute__((vector_size(16)));  // movmskps takes the sign bit of each lane
        these = static_cast<uint64_t>(__builtin_ia32_movmskps((Floats)above));
      }
#else
      for (int i = 0; i < kLanes; ++i) these |= static_cast<uint64_t>(above[i] & 1) << i;
#endif
      bits |= these << (kLanes * c);
    }
    return bits;
  }
  static WorkerLanes Splat(Lane x) {
    WorkerLanes out;
    for (int c = 0; c < kVectors; ++c) out.v[c] = Vector{} + x;
    return out;
  }
};

// A row read by more samples of the global batch than this ends up on several workers whatever
// the allocation; counted as read by all (left out of the placement's costs, to which such a row
// adds nothing), it does not pull every later sample that reads it towards the worker that
// happened to take its first one.
constexpr int32_t kSharedAnyway = 4;

// The (Mask, Lane) pairs ColocateAllocate picks from: the narrowest mask that holds the workers,
// the narrowest lanes that hold a sample's sums. X(Mask, Lane) for each (placement.cpp and
// trades.cpp instantiate their steps with it).
#define HETU_HERALD_EACH_MASK_AND_LANE(X)                                                  \
  X(uint8_t, int16_t) X(uint8_t, int32_t) X(uint16_t, int16_t) X(uint16_t, int32_t) \
  X(uint32_t, int16_t) X(uint32_t, int32_t) X(uint64_t, int16_t) X(uint64_t, int32_t)

}  // namespace herald
}  // namespace hetu
