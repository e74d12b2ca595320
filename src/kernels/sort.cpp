#include "kernels/sort.h"

#include <algorithm>
#include <numeric>

#include "common/popcount.h"

namespace hetu {
namespace kernels {

const SortedIds& sort_ids(const int64_t* ids, int64_t n) {
  static thread_local SortedIds out;
  out.id.resize(n);
  out.pos.resize(n);
  if (n == 0) return out;
  int64_t lo = ids[0], hi = ids[0];
  for (int64_t i = 1; i < n; ++i) {
    lo = std::min(lo, ids[i]);
    hi = std::max(hi, ids[i]);
  }
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  int bits = 0;
  while (bits < 64 && (range >> bits) != 0) ++bits;
  int pos_bits = 0;
  while ((uint64_t(1) << pos_bits) < static_cast<uint64_t>(n)) ++pos_bits;
  constexpr int kDigit = 11;
  constexpr uint64_t kMask = (uint64_t(1) << kDigit) - 1;
  const int passes = (bits + kDigit - 1) / kDigit;
  // Tiny inputs, or an id range too wide for three digits or for one word with the positions:
  // a comparison sort is as good.
  if (n < 64 || passes > 3 || bits + pos_bits > 64) {
    std::iota(out.pos.begin(), out.pos.end(), int64_t(0));
    std::stable_sort(out.pos.begin(), out.pos.end(), [&](int64_t a, int64_t b) { return ids[a] < ids[b]; });
    for (int64_t i = 0; i < n; ++i) out.id[i] = ids[out.pos[i]];
    return out;
  }
  static thread_local std::vector<uint64_t> a, b;
  a.resize(n);
  b.resize(n);
  for (int64_t i = 0; i < n; ++i)
    a[i] = (static_cast<uint64_t>(ids[i]) - static_cast<uint64_t>(lo)) << pos_bits | static_cast<uint64_t>(i);
  // Each pass takes the input as two halves with their own bucket offsets, the second's after
  // the first's in each bucket: ids are skewed, runs of one bucket are common, and each half's
  // counter updates then wait only on their own, so the two chains overlap.
  static thread_local std::vector<int64_t> count;
  count.resize(2 * (kMask + 1));
  int64_t* const first = count.data();
  int64_t* const second = first + kMask + 1;
  const int64_t half = n / 2;
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = pos_bits + pass * kDigit;
    auto digit = [&](uint64_t v) { return (v >> shift) & kMask; };
    std::fill(count.begin(), count.end(), 0);
    for (int64_t i = 0, j = half; i < half; ++i, ++j) {
      ++first[digit(a[i])];
      ++second[digit(a[j])];
    }
    if (n % 2) ++second[digit(a[n - 1])];
    int64_t at = 0;
    for (uint64_t d = 0; d <= kMask; ++d) {
      const int64_t in_first = first[d], in_second = second[d];
      first[d] = at;
      second[d] = at + in_first;
      at += in_first + in_second;
    }
    for (int64_t i = 0, j = half; i < half; ++i, ++j) {
      b[first[digit(a[i])]++] = a[i];
      b[second[digit(a[j])]++] = a[j];
    }
    if (n % 2) b[second[digit(a[n - 1])]++] = a[n - 1];
    a.swap(b);
  }
  const uint64_t pos_mask = (uint64_t(1) << pos_bits) - 1;
  for (int64_t i = 0; i < n; ++i) {
    out.id[i] = static_cast<int64_t>((a[i] >> pos_bits) + static_cast<uint64_t>(lo));
    out.pos[i] = static_cast<int64_t>(a[i] & pos_mask);
  }
  return out;
}

void sorted_unique(const int64_t* ids, int64_t n, std::vector<int64_t>* out, int32_t* inverse) {
  const SortedIds& sorted = sort_ids(ids, n);
  out->clear();
  for (int64_t i = 0; i < n; ++i) {
    if (out->empty() || out->back() != sorted.id[i]) out->push_back(sorted.id[i]);
    if (inverse) inverse[sorted.pos[i]] = static_cast<int32_t>(out->size() - 1);
  }
}

namespace {

// Ids are numbered through a bitmap over their range when the range is below this many times
// their number (the bitmap and its words' first indices are then at most 3/4 of a byte an id,
// where the sort moves 16 bytes a pass per id).
constexpr uint64_t kDenseRangePerId = 8;

// Passes over the ids (megabytes) load them this many ids ahead, a line at a time: the hardware's
// own prefetcher stops at every 4 KiB page.
constexpr int64_t kFarAhead = 1024;

// The dense numbering's two bit-counting loops: the set bits of each word of the bitmap, and each
// id's index (its word's first index plus the set bits below it). On x86-64 they run with the
// popcnt instruction where the CPU has one (every x86-64 CPU since 2008; the portable build may
// not assume it), else with the branch-free count. The same numbers either way.
template <typename Count>
__attribute__((always_inline)) inline int64_t CountBits(const uint64_t* present, int64_t begin, int64_t end,
                                                        Count count) {
  int64_t n = 0;
  for (int64_t w = begin; w < end; ++w) n += count(present[w]);
  return n;
}
template <typename Count>
__attribute__((always_inline)) inline void RankIds(const int64_t* ids, int64_t begin, int64_t end, int64_t lo,
                                                   const uint64_t* present, const int32_t* first, int32_t* inverse,
                                                   Count count) {
  for (int64_t i = begin; i < end; ++i) {
    if ((i & 7) == 0) __builtin_prefetch(ids + i + kFarAhead);
    const uint64_t d = static_cast<uint64_t>(ids[i]) - static_cast<uint64_t>(lo);
    inverse[i] = first[d >> 6] + count(present[d >> 6] & ((uint64_t(1) << (d & 63)) - 1));
  }
}
struct PortableCount {
  int operator()(uint64_t x) const { return PopCount(x); }
};
#if defined(__x86_64__) && defined(__GNUC__)
struct PopcntCount {
  __attribute__((target("popcnt"))) int operator()(uint64_t x) const { return __builtin_popcountll(x); }
};
__attribute__((target("popcnt"))) int64_t CountBitsPopcnt(const uint64_t* present, int64_t begin, int64_t end) {
  return CountBits(present, begin, end, PopcntCount());
}
__attribute__((target("popcnt"))) void RankIdsPopcnt(const int64_t* ids, int64_t begin, int64_t end, int64_t lo,
                                                     const uint64_t* present, const int32_t* first, int32_t* inverse) {
  RankIds(ids, begin, end, lo, present, first, inverse, PopcntCount());
}
bool HasPopcnt() {
  static const bool has = __builtin_cpu_supports("popcnt");
  return has;
}
#else
constexpr bool HasPopcnt() { return false; }
int64_t CountBitsPopcnt(const uint64_t*, int64_t, int64_t) { return 0; }
void RankIdsPopcnt(const int64_t*, int64_t, int64_t, int64_t, const uint64_t*, const int32_t*, int32_t*) {}
#endif

}  // namespace

void sorted_unique_parallel(const int64_t* ids, int64_t n, Pool* pool, SortScratch* scratch,
                            std::vector<int64_t>* keys, int32_t* inverse) {
  // What sorted_unique computes (the distinct ids ascending, and each id's index among
  // them: one answer, however it is found), in parts that run in parallel. A batch's ids mostly
  // lie in a range a few times their number (the table's rows): then a table over the range
  // marks the ids present and numbers them in order, three passes with no sort. Otherwise the
  // passes of an LSD radix sort are split in parts: each part counts its digits, the counts give
  // every part its place in each digit's run, and each part scatters its own ids.
  if (n == 0) {
    keys->clear();
    return;
  }
  const int parts = pool ? static_cast<int>(std::clamp<int64_t>(n / 32768, 1, pool->threads())) : 1;
  if (parts == 1) pool = nullptr;
  auto each_part = [&](int64_t size, auto fn) {  // fn(part, first, end) over `parts` parts of [0, size)
    auto run = [&](int64_t first, int64_t last) {
      for (int64_t p = first; p < last; ++p)
        fn(static_cast<int>(p), PartBegin(size, static_cast<int>(p), parts),
           PartBegin(size, static_cast<int>(p) + 1, parts));
    };
    if (pool)
      pool->parallel_for(parts, 1, run);
    else
      run(int64_t(0), int64_t(parts));
  };
  std::vector<int64_t> lows(parts), highs(parts);
  each_part(n, [&](int p, int64_t b, int64_t e) {
    // Four of each, so that the comparisons of neighbouring ids do not wait on one another.
    int64_t lo[4], hi[4];
    std::fill(lo, lo + 4, ids[b]);
    std::fill(hi, hi + 4, ids[b]);
    int64_t i = b;
    for (; i + 4 <= e; i += 4) {
      if ((i & 7) == 0) __builtin_prefetch(ids + i + kFarAhead);
      for (int k = 0; k < 4; ++k) {
        lo[k] = std::min(lo[k], ids[i + k]);
        hi[k] = std::max(hi[k], ids[i + k]);
      }
    }
    for (; i < e; ++i) {
      lo[0] = std::min(lo[0], ids[i]);
      hi[0] = std::max(hi[0], ids[i]);
    }
    lows[p] = *std::min_element(lo, lo + 4);
    highs[p] = *std::max_element(hi, hi + 4);
  });
  const int64_t lo = *std::min_element(lows.begin(), lows.end());
  const int64_t hi = *std::max_element(highs.begin(), highs.end());
  const uint64_t range = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
  if (range < kDenseRangePerId * static_cast<uint64_t>(n)) {
    // One bit per id of the range where the id occurs (each part sets its own bitmap, which are
    // then ORed: parts writing one would pass its lines back and forth), each word's first index
    // among the distinct ids, then an id's index is its word's first plus the set bits below it.
    // Bitmap and indices are a few bytes per 64 ids: they stay in the CPU's first-level cache,
    // where a table of an index per id of the range would not.
    const int64_t words = static_cast<int64_t>(range / 64) + 1;
    scratch->present.assign(static_cast<size_t>(words) * parts, 0);
    scratch->first.resize(words);
    uint64_t* const present = scratch->present.data();
    int32_t* const first = scratch->first.data();
    each_part(n, [&](int p, int64_t begin, int64_t end) {
      uint64_t* const mine = present + static_cast<size_t>(words) * p;
      for (int64_t i = begin; i < end; ++i) {
        if ((i & 7) == 0) __builtin_prefetch(ids + i + kFarAhead);
        const uint64_t d = static_cast<uint64_t>(ids[i]) - static_cast<uint64_t>(lo);
        mine[d >> 6] |= uint64_t(1) << (d & 63);
      }
    });
    if (parts > 1) {
      each_part(words, [&](int, int64_t begin, int64_t end) {
        for (int p = 1; p < parts; ++p)
          for (int64_t w = begin; w < end; ++w) present[w] |= present[static_cast<size_t>(words) * p + w];
      });
    }
    std::vector<int64_t> starts(parts + 1, 0);  // distinct ids before each part of the words
    each_part(words, [&](int p, int64_t begin, int64_t end) {
      starts[p + 1] = HasPopcnt() ? CountBitsPopcnt(present, begin, end) : CountBits(present, begin, end, PortableCount());
    });
    for (int p = 0; p < parts; ++p) starts[p + 1] += starts[p];
    keys->resize(starts[parts]);
    int64_t* k = keys->data();
    each_part(words, [&](int p, int64_t begin, int64_t end) {
      int64_t u = starts[p];
      for (int64_t w = begin; w < end; ++w) {
        first[w] = static_cast<int32_t>(u);
        for (uint64_t bits = present[w]; bits; bits &= bits - 1) k[u++] = lo + 64 * w + __builtin_ctzll(bits);
      }
    });
    each_part(n, [&](int, int64_t begin, int64_t end) {
      if (HasPopcnt()) {
        RankIdsPopcnt(ids, begin, end, lo, present, first, inverse);
      } else {
        RankIds(ids, begin, end, lo, present, first, inverse, PortableCount());
      }
    });
    return;
  }
  if (parts <= 1) {
    sorted_unique(ids, n, keys, inverse);
    return;
  }
  int bits = 0;
  while (bits < 64 && (range >> bits) != 0) ++bits;
  int pos_bits = 0;
  while ((uint64_t(1) << pos_bits) < static_cast<uint64_t>(n)) ++pos_bits;
  if (bits + pos_bits > 64) {  // ids too far apart to share a word with their positions
    sorted_unique(ids, n, keys, inverse);
    return;
  }
  constexpr int kDigit = 11;
  constexpr uint64_t kMask = (uint64_t(1) << kDigit) - 1;
  const int passes = (bits + kDigit - 1) / kDigit;
  std::vector<uint64_t>& a = scratch->a;
  std::vector<uint64_t>& b = scratch->b;
  a.resize(n);
  b.resize(n);
  each_part(n, [&](int, int64_t first, int64_t end) {
    for (int64_t i = first; i < end; ++i)
      a[i] = (static_cast<uint64_t>(ids[i]) - static_cast<uint64_t>(lo)) << pos_bits | static_cast<uint64_t>(i);
  });
  std::vector<int64_t> count(static_cast<size_t>(parts) * (kMask + 1));
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = pos_bits + pass * kDigit;
    each_part(n, [&](int p, int64_t first, int64_t end) {
      int64_t* c = &count[static_cast<size_t>(p) * (kMask + 1)];
      std::fill(c, c + kMask + 1, 0);
      for (int64_t i = first; i < end; ++i) ++c[(a[i] >> shift) & kMask];
    });
    int64_t at = 0;
    for (uint64_t d = 0; d <= kMask; ++d)
      for (int p = 0; p < parts; ++p) {
        int64_t& c = count[static_cast<size_t>(p) * (kMask + 1) + d];
        const int64_t here = c;
        c = at;
        at += here;
      }
    each_part(n, [&](int p, int64_t first, int64_t end) {
      int64_t* c = &count[static_cast<size_t>(p) * (kMask + 1)];
      for (int64_t i = first; i < end; ++i) b[c[(a[i] >> shift) & kMask]++] = a[i];
    });
    a.swap(b);
  }
  // Distinct ids: each part counts the runs that start in it, then writes its keys and the
  // inverse of its ids.
  const uint64_t pos_mask = (uint64_t(1) << pos_bits) - 1;
  auto value = [&](int64_t i) { return a[i] >> pos_bits; };
  std::vector<int64_t> starts(parts + 1, 0);
  each_part(n, [&](int p, int64_t first, int64_t end) {
    int64_t runs = 0;
    for (int64_t i = first; i < end; ++i) runs += i == 0 || value(i) != value(i - 1);
    starts[p + 1] = runs;
  });
  for (int p = 0; p < parts; ++p) starts[p + 1] += starts[p];
  keys->resize(starts[parts]);
  int64_t* k = keys->data();
  each_part(n, [&](int p, int64_t first, int64_t end) {
    int64_t u = starts[p] - 1;
    for (int64_t i = first; i < end; ++i) {
      if (i == 0 || value(i) != value(i - 1)) k[++u] = static_cast<int64_t>(value(i) + static_cast<uint64_t>(lo));
      inverse[a[i] & pos_mask] = static_cast<int32_t>(u);
    }
  });
}

}  // namespace kernels
}  // namespace hetu
