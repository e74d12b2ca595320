#pragma once
#include <cstdint>
#include <vector>

namespace hetu {
namespace herald {

// scores: [n, num_workers], score(s, w) = rows of sample s valid in worker w's cache.
// Each worker receives exactly per_worker samples (n == num_workers * per_worker); each sample
// goes to its best-scoring worker that still has room, samples with the highest best score
// first. Deterministic: every worker computes the same assignment.
void GreedyAllocate(const int32_t* scores, int64_t n, int num_workers, int64_t per_worker, int64_t iteration,
                    int32_t* assignment);

}  // namespace herald
}  // namespace hetu
