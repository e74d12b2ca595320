// Herald's allocators: what ties the placement (placement.h) and the trades (trades.h) together.
// The batch's lists both read (SampleRows, ScoredRows), ColocateAllocate (the placement, then the
// trades, over the same costs), and who reads each row under the assignment made.
#include "herald/allocate.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>
#include <vector>

#include "herald/placement.h"
#include "herald/row_cost.h"
#include "herald/trades.h"
#include "herald/worker_mask.h"

namespace hetu {
namespace herald {

namespace {

// Per row, the samples that read it and the last of them, side by side: one cache line.
struct Reading {
  int32_t count = 0, last = -1;
};

// FromSlots for samples [first, last): each sample's rows, each once, in slot order, written to
// `rows` on, with each sample's count of rows in size[s - first]. Counts the samples of each row in
// `reading`. Returns the rows written.
int64_t ReadSlots(const int32_t* slots, int64_t first, int64_t last, int64_t width, int32_t empty, int32_t shift,
                  Reading* reading, int32_t* rows, int64_t* size) {
  int64_t taken = 0;
  for (int64_t s = first; s < last; ++s) {
    __builtin_prefetch(slots + (s + 64) * width);  // the slots ahead: megabytes, read once
    const int64_t before = taken;
    for (const int32_t* v = slots + s * width; v != slots + (s + 1) * width; ++v) {
      if (*v == empty) continue;
      const int32_t r = *v - shift;
      Reading& row = reading[r];
      if (row.last == s) continue;
      row.last = static_cast<int32_t>(s);
      ++row.count;
      rows[taken++] = r;
    }
    size[s - first] = taken - before;
  }
  return taken;
}

}  // namespace

SampleRows SampleRows::FromSlots(const int32_t* slots, int64_t n, int64_t width, int64_t num_rows, int32_t empty,
                                 int32_t shift, Pool* pool) {
  SampleRows out;
  out.begin.assign(n + 1, 0);
  out.reading.resize(num_rows);
  // Parts of the samples in parallel (SampleParts), each with a count per row of its own: at most
  // 32 MiB of them.
  const int64_t parts =
      std::clamp<int64_t>((int64_t(32) << 20) / std::max<int64_t>(1, num_rows * 8), 1, SampleParts(pool, n));
  if (parts == 1) {
    std::vector<Reading> reading(num_rows);
    out.rows.resize(n * width);
    out.rows.resize(ReadSlots(slots, 0, n, width, empty, shift, reading.data(), out.rows.data(), &out.begin[1]));
    for (int64_t s = 0; s < n; ++s) out.begin[s + 1] += out.begin[s];
    for (int64_t r = 0; r < num_rows; ++r) out.reading[r] = reading[r].count;
    return out;
  }
  // Each part reads its samples into rows of its own (from its first sample's first slot), then
  // the parts' rows go end to end, and the rows' counts are summed over the parts.
  std::vector<std::vector<Reading>> reading(parts);
  NoInitVector<int32_t> scratch(n * width);
  std::vector<int64_t> taken(parts + 1, 0);
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) {
    reading[p].resize(num_rows);
    taken[p + 1] = ReadSlots(slots, first, last, width, empty, shift, reading[p].data(), &scratch[first * width],
                             &out.begin[first + 1]);
  });
  for (int64_t p = 0; p < parts; ++p) taken[p + 1] += taken[p];
  out.rows.resize(taken[parts]);
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) {
    std::copy(&scratch[first * width], &scratch[first * width] + (taken[p + 1] - taken[p]), &out.rows[taken[p]]);
    int64_t at = taken[p];
    for (int64_t s = first; s < last; ++s) out.begin[s + 1] = at += out.begin[s + 1];
  });
  ParallelFor(pool, num_rows, 4096, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      int32_t count = 0;
      for (int64_t p = 0; p < parts; ++p) count += reading[p][r].count;
      out.reading[r] = count;
    }
  });
  return out;
}

namespace {

double Since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Per sample, lane w: what the rows that no other sample reads (single) cost if the sample goes to
// worker w, summed over them. Such a row's readers are the sample's worker alone, whatever the
// other samples do: the placement scores it as a row no one reads yet, and moving the sample from
// worker a to b saves alone[a] - alone[b] of it. So the sequential steps need not look at it.
template <typename Mask, typename Lane>
std::vector<WorkerLanes<Mask, Lane>> AloneCosts(const SampleRows& single, const uint64_t* valid, Pool* pool) {
  using Lanes = WorkerLanes<Mask, Lane>;
  std::vector<Lanes> out(single.samples());
  ParallelFor(pool, single.samples(), kMinSamples, [&](int64_t first, int64_t last) {
    for (int64_t s = first; s < last; ++s) {
      Lanes a{};
      for (const int32_t* r = single.Begin(s); r != single.End(s); ++r) a += Lanes::Added(Mask(0), static_cast<Mask>(valid[*r]));
      out[s] = a;
    }
  });
  return out;
}

// Each sample's rows that 2 to `most` samples of the batch read (light), among them those that 2
// to `fewer` read (lightest; fewer <= most), both numbered as light_rows, and the rows it alone
// reads (single), from the batch's counts (SampleRows::reading, which the lists made here do not
// carry). With a pool of 3 threads or more, parts of the samples in parallel: a pass to count each
// part's rows, then one to write them.
ScoredRows LightRows(const SampleRows& samples, int64_t most, int64_t fewer, Pool* pool) {
  const int64_t n = samples.samples();
  ScoredRows out;
  SampleRows* lists[3] = {&out.light, &out.lightest, &out.single};
  for (SampleRows* list : lists) list->begin.resize(n + 1);
  // Per distinct row, its number among the light rows (shifted 3 up) and a bit per list that takes
  // it (light 1, lightest 2, single 4): asked once per row rather than at each of its samples.
  std::vector<int32_t> code(samples.reading.size());
  for (size_t r = 0; r < code.size(); ++r) {
    const int32_t c = samples.reading[r];
    const bool light = c > 1 && c <= most;
    code[r] = static_cast<int32_t>(out.light_rows.size()) << 3 | light | (c > 1 && c <= fewer) << 1 | (c == 1) << 2;
    if (light) out.light_rows.push_back(static_cast<int32_t>(r));
  }
  using Places = std::array<int64_t, 3>;
  // Samples [first, last) from places `at` on; `write`: or only count. One part writes each row
  // to every list (kept or overwritten by the next: no branch to mispredict); several parts write
  // only the rows kept, since the next part's rows follow theirs.
  auto take = [&](int64_t first, int64_t last, Places at, bool write) {
    const bool alone = first == 0 && last == n;
    int32_t* light = out.light.rows.data();
    int32_t* lightest = out.lightest.rows.data();
    int32_t* single = out.single.rows.data();
    int64_t at_light = at[0], at_lightest = at[1], at_single = at[2];
    for (int64_t s = first; s < last; ++s) {
      for (const int32_t* r = samples.Begin(s); r != samples.End(s); ++r) {
        const int32_t row_code = code[*r], numbered = row_code >> 3;
        const unsigned in = row_code & 7;
        if (write && alone) {
          light[at_light] = numbered;
          lightest[at_lightest] = numbered;
          single[at_single] = *r;
        } else if (write) {
          if (in & 1) light[at_light] = numbered;
          if (in & 2) lightest[at_lightest] = numbered;
          if (in & 4) single[at_single] = *r;
        }
        at_light += in & 1;
        at_lightest += in >> 1 & 1;
        at_single += in >> 2;
      }
      if (write) {
        out.light.begin[s + 1] = at_light;
        out.lightest.begin[s + 1] = at_lightest;
        out.single.begin[s + 1] = at_single;
      }
    }
    return Places{at_light, at_lightest, at_single};
  };
  const int64_t parts = SampleParts(pool, n);
  if (parts == 1) {
    // + 1: the last row written is one past those kept
    for (SampleRows* list : lists) list->rows.resize(samples.rows.size() + 1);
    const Places kept = take(0, n, Places{}, true);
    for (int k = 0; k < 3; ++k) lists[k]->rows.resize(kept[k]);
    return out;
  }
  std::vector<Places> at(parts + 1, Places{});
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) { at[p + 1] = take(first, last, Places{}, false); });
  for (int64_t p = 0; p < parts; ++p)
    for (int k = 0; k < 3; ++k) at[p + 1][k] += at[p][k];
  for (int k = 0; k < 3; ++k) lists[k]->rows.resize(at[parts][k] + 1);
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) { take(first, last, at[p], true); });
  for (int k = 0; k < 3; ++k) lists[k]->rows.resize(at[parts][k]);
  return out;
}

// Readers(), with the masks gathered as narrow as the workers allow (a table that stays in the
// first-level cache) and widened after. With a pool of 3 threads or more, parts of the samples
// gather masks of their own (setting a shared row's bits from several cores moves its cache line
// from core to core at every sample), which are then joined by parts of the rows.
template <typename Mask>
std::vector<uint64_t> NarrowReaders(const SampleRows& samples, int64_t num_rows, const int32_t* assignment,
                                    Pool* pool = nullptr) {
  const int64_t n = samples.samples();
  auto gather = [&](int64_t first, int64_t last, Mask* narrow) {
    for (int64_t s = first; s < last; ++s) {
      const Mask bit = static_cast<Mask>(Bit(assignment[s]));
      for (const int32_t* r = samples.Begin(s); r != samples.End(s); ++r) narrow[*r] |= bit;
    }
  };
  const int64_t parts = SampleParts(pool, n);
  std::vector<uint64_t> out(num_rows);
  if (parts == 1) {
    std::vector<Mask> narrow(num_rows, 0);
    gather(0, n, narrow.data());
    std::copy(narrow.begin(), narrow.end(), out.begin());
    return out;
  }
  std::vector<std::vector<Mask>> narrow(parts);
  EachPart(pool, n, parts, [&](int64_t p, int64_t first, int64_t last) {
    narrow[p].assign(num_rows, 0);
    gather(first, last, narrow[p].data());
  });
  ParallelFor(pool, num_rows, 4096, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      Mask m = 0;
      for (int64_t p = 0; p < parts; ++p) m |= narrow[p][r];
      out[r] = m;
    }
  });
  return out;
}

}  // namespace

ScoredRows ScoredRowsOf(const SampleRows& samples, int num_workers, Pool* pool) {
  // The rows the trades score, and among them those the placement scores.
  return LightRows(samples, TradeShared(num_workers), kSharedAnyway, pool);
}

void ColocateAllocate(const SampleRows& samples, const uint64_t* valid, int64_t num_rows, int num_workers,
                      int64_t per_worker, int64_t iteration, int32_t* assignment, Pool* pool, double* seconds,
                      std::vector<uint64_t>* readers_out, const ScoredRows* scored) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t n = samples.samples();
  const int W = num_workers;
  ScoredRows found;
  if (!scored) {
    found = ScoredRowsOf(samples, W, pool);
    scored = &found;
  }
  const SampleRows& single = scored->single;
  // Rows' worker masks as narrow as the workers allow, and lanes as the samples' rows allow.
  auto allocate = [&](auto mask, auto lane) {
    using Mask = decltype(mask);
    using Lane = decltype(lane);
    const std::vector<WorkerLanes<Mask, Lane>> alone = AloneCosts<Mask, Lane>(single, valid, pool);
    Place<Mask, Lane>(samples, *scored, alone.data(), valid, num_rows, W, per_worker, iteration, assignment, pool);
    const auto placed = std::chrono::steady_clock::now();
    if (seconds) seconds[0] += Since(start);
    Trade<Mask, Lane>(*scored, alone.data(), valid, W, assignment, pool);
    if (readers_out) *readers_out = NarrowReaders<Mask>(samples, num_rows, assignment, pool);
    if (seconds) seconds[1] += Since(placed);
  };
  int64_t longest = 0;  // the most rows a sample reads
  for (int64_t s = 0; s < n; ++s) longest = std::max(longest, samples.begin[s + 1] - samples.begin[s]);
  auto with_lanes = [&](auto mask) {
    if (longest <= kNarrowLanesUpTo) {
      allocate(mask, int16_t());
    } else {
      allocate(mask, int32_t());
    }
  };
  if (W <= 8) {
    with_lanes(uint8_t());
  } else if (W <= 16) {
    with_lanes(uint16_t());
  } else if (W <= 32) {
    with_lanes(uint32_t());
  } else {
    with_lanes(uint64_t());
  }
}

std::vector<uint64_t> Readers(const SampleRows& samples, int64_t num_rows, const int32_t* assignment) {
  return NarrowReaders<uint64_t>(samples, num_rows, assignment);
}

int64_t EstimatedRows(const SampleRows& samples, const uint64_t* valid, int64_t num_rows, const int32_t* assignment) {
  const std::vector<uint64_t> readers = Readers(samples, num_rows, assignment);
  int64_t total = 0;
  for (int64_t r = 0; r < num_rows; ++r) total += RowCost(readers[r], valid[r]);
  return total;
}

}  // namespace herald
}  // namespace hetu
