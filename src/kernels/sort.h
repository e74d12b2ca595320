// Radix sorts of ids: the one thread's (behind unique_sum, bag_gradient and sorted_unique) and
// the parallel one that Herald's planner runs on each global batch.
#pragma once
#include <cstdint>
#include <vector>

#include "common/parallel.h"

namespace hetu {
namespace kernels {

// The ids in ascending order, with their positions; equal ids in position order (a stable
// sort). An LSD radix sort on as many 11-bit digits of (id - min id) as the id range needs, of
// one word per id: (id - min id) above the position, so that the positions, already in order,
// stay in order under the stable passes over the id's digits.
// The result and the scratch arrays are per-thread and reused: at batch 4096 they are a few MB,
// which glibc would otherwise map and unmap (and the kernel zero) on every step.
// The answer stands until this thread's next call.
struct SortedIds {
  std::vector<int64_t> id, pos;
};
const SortedIds& sort_ids(const int64_t* ids, int64_t n);

// The distinct ids, ascending. With `inverse` (n entries), also each id's position in `out`.
void sorted_unique(const int64_t* ids, int64_t n, std::vector<int64_t>* out, int32_t* inverse = nullptr);

// What sorted_unique_parallel keeps between calls: the radix sort's words, and the bitmap over a
// dense range of ids with each of its words' first index.
struct SortScratch {
  std::vector<uint64_t> a, b;
  std::vector<uint64_t> present;
  std::vector<int32_t> first;
};

// sorted_unique (inverse required) on `pool`'s threads, or on this one without a pool: the same
// answer whatever the thread count.
void sorted_unique_parallel(const int64_t* ids, int64_t n, Pool* pool, SortScratch* scratch,
                            std::vector<int64_t>* keys, int32_t* inverse);

}  // namespace kernels
}  // namespace hetu
