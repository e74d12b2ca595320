// The servers' row-step loop, compiled once per vector width the CPU may have, and the choice
// between those versions (HETU_SIMD). Every version performs the same IEEE operations on each
// float (the build has -ffp-contract=off, and the one reduction, row-wise AdaGrad's sum of
// squares, stays in index order: without -ffast-math no compiler may reassociate it into vector
// lanes), so rows come out bit for bit the same whichever runs: a worker's cached copy, stepped
// by hetu's own SSE2 build, equals the server's on every CPU. tests/test_simd.py holds every
// version to that.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/optim_rules.h"
#include "row_placement.h"
#include "shard_arrays.h"

namespace ps {

// Rows of a shard: the row at slot r has its values at values[r * width] (elements of
// hetu::storage::Type `storage`), its state at state[r * state_width]; row k sits at slot
// slot(k), its step count and version in counters. A 16-bit row is widened, stepped in float32
// and rounded back (common/storage.h).
struct StepRowsView {
  void* values;
  int storage;
  float* state;
  UnitCounters* counters;
  SlotIndex slot;
  int64_t width, state_width;
};

// The versions, best first: "avx512f", "avx2", "default".
const std::vector<std::string>& SimdVariants();
// Whether this CPU can run `variant`.
bool SimdRunnable(const std::string& variant);
// The version the servers run: HETU_SIMD if set (checked: a known name this CPU can run, else
// std::runtime_error naming the variable), else the best this CPU can run. Read once.
const std::string& SimdVariant();

// One optimizer step of rows keys[b..e) (distinct, of `rows`) with grads[i * width]; each row's
// version grows by counts[i] (1 when counts is null).
using StepLoopFn = void (*)(const hetu::optim::Config& cfg, float lr, const StepRowsView& rows, const int64_t* keys,
                            int64_t b, int64_t e, const float* grads, const int64_t* counts);
// The version `variant`; std::invalid_argument if this CPU cannot run it.
StepLoopFn StepLoopOf(const std::string& variant);

}  // namespace ps
