// The trades between workers that follow ColocateAllocate's placement (placement.h): pairs of
// workers swap samples while a swap saves rows, loads unchanged (docs/design.md section 7,
// docs/herald_performance_log.md).
#pragma once
#include <cstdint>

#include "herald/allocate.h"
#include "herald/row_cost.h"

namespace hetu {
namespace herald {

// Trades over the assignment the placement made, in up to kTradeSweeps sweeps (fewer where a sweep
// trades nothing). The rows traded over are scored.light's; alone: each sample's AloneCosts, what
// the rows no other sample reads cost at each worker.
template <typename Mask, typename Lane>
void Trade(const ScoredRows& scored, const WorkerLanes<Mask, Lane>* alone, const uint64_t* valid, int num_workers,
           int32_t* assignment, Pool* pool);

// The trades leave out the rows that more than this many samples per worker of the global batch
// read (4 W samples at the default of 4): such a row is read by every worker, or nearly, before and
// after any trade, yet it would be scored at every sample that reads it, and these are most of a
// batch's (sample, row) pairs. HETU_PLANNER_TRADE_SHARED sets it; 0 trades over every row (the
// allocation of earlier versions; docs/results/planner.md compares the two).
int64_t TradeShared(int num_workers);

}  // namespace herald
}  // namespace hetu
