// Herald's sample placement: each sample of a global batch, one after another, to the worker with
// room where it costs least (docs/design.md section 7). GreedyAllocate scores by cache hits alone;
// ColocateAllocate's placement (Place) by the rows a sample adds to the iteration, before its trades
// (trades.h). GreedyAllocate and CacheScores are declared with the allocators in allocate.h.
#pragma once
#include <cstdint>

#include "herald/allocate.h"
#include "herald/row_cost.h"

namespace hetu {
namespace herald {

// ColocateAllocate's placement: each sample, strongest cache preference first, to the worker with
// room where it adds the fewest rows. Mask: a type of at least W bits.
// scored: the rows it scores, `lightest` (those 2 to kSharedAnyway samples read; a row more read
// counts as read by every worker, which adds nothing to any worker's cost, so it is left out);
// alone: each sample's AloneCosts, what the rows no other sample reads cost at each worker.
template <typename Mask, typename Lane>
void Place(const SampleRows& samples, const ScoredRows& scored, const WorkerLanes<Mask, Lane>* alone,
           const uint64_t* valid, int64_t num_rows, int W, int64_t per_worker, int64_t iteration, int32_t* assignment,
           Pool* pool);

}  // namespace herald
}  // namespace hetu
