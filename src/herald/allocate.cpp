// Herald's allocator: which worker trains which sample of a global batch.
#include "herald/allocate.h"

#include <algorithm>
#include <numeric>

namespace hetu {
namespace herald {

void GreedyAllocate(const int32_t* scores, int64_t n, int num_workers, int64_t per_worker, int64_t iteration,
                    int32_t* assignment) {
  // Samples with the strongest preference choose first.
  std::vector<int32_t> best(n, 0);
  for (int64_t s = 0; s < n; ++s)
    best[s] = *std::max_element(scores + s * num_workers, scores + (s + 1) * num_workers);
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return best[a] > best[b]; });
  std::vector<int64_t> load(num_workers, 0);
  for (int64_t s : order) {
    const int32_t* row = scores + s * num_workers;
    // Ties go to the least-loaded worker, then to the first in a cyclic order that rotates with
    // the sample and the iteration, so that no worker is favoured.
    const int start = static_cast<int>((s + iteration) % num_workers);
    int chosen = -1;
    for (int k = 0; k < num_workers; ++k) {
      const int w = (start + k) % num_workers;
      if (load[w] >= per_worker) continue;
      if (chosen < 0 || row[w] > row[chosen] || (row[w] == row[chosen] && load[w] < load[chosen])) chosen = w;
    }
    assignment[s] = chosen;
    ++load[chosen];
  }
}

}  // namespace herald
}  // namespace hetu
