#include "table.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <new>
#include <unordered_map>

#include "common/parallel.h"
#include "common/rng.h"
#include "logging.h"
#include "optim_config.h"
#include "step_loop.h"

namespace ps {

// A saved shard: this header, then its rows' values (in the table's storage type), optimizer
// state, steps and versions, each in slot order. The shard holds rows lo, lo + stride, ... below
// hi. Version 1 files (written before rows could be strided) end the header after `applied` and
// hold contiguous ranges; versions 1 and 2 end it before `storage` and hold float32 rows.
struct FileHeader {
  char magic[8];
  int64_t rows, width, dense, lo, hi, optim_kind, unit_state_width, applied;
  int64_t placement, stride;  // version 2 on: RowPlacement::Kind and its stride
  int64_t storage;            // version 3 on: hetu::storage::Type of the rows
};

// How a table draws its rows' initial values (the spec's init_* fields, seed and stream).
struct Initializer {
  int64_t kind;
  double a, b;
  uint64_t seed, stream;
  bool operator==(const Initializer& o) const {
    return kind == o.kind && a == o.a && b == o.b && seed == o.seed && stream == o.stream;
  }
};

// A disk-tier shard saved by cloning its row file (docs/design.md, "Disk tier"): a FileHeader
// (magic kRecordsMagic; the rows as a version 3 file names them), this header's own fields, the
// records' written bits (a uint64 word per 64 records), a hole up to `records_at`, then the row
// file's records as the tier wrote them: payload (the row as stored, its state, step, version)
// and the tier's hash of payload and slot. The records start at a multiple of the file system's
// block, because a clone shares whole blocks; a record never written is a hole there and holds
// its row as `init` draws it, with no state, step or version.
struct RecordsHeader {
  FileHeader file;
  int64_t record_bytes, records_at;
  Initializer init;
};

// Rows saved in another storage type than the table's: each slot's `width` elements are
// widened from `from` and rounded to `to` on the way in.
struct Recode {
  int from, to;
  int64_t width;
};

namespace {

const char kRecordsMagic[8] = {'H', 'E', 'T', 'U', 'P', 'R', '0', '1'};
const char kMagic[8] = {'H', 'E', 'T', 'U', 'P', 'S', '0', '3'};
const char kMagicV2[8] = {'H', 'E', 'T', 'U', 'P', 'S', '0', '2'};
const char kMagicV1[8] = {'H', 'E', 'T', 'U', 'P', 'S', '0', '1'};
constexpr size_t kHeaderBytesV1 = offsetof(FileHeader, placement);
constexpr size_t kHeaderBytesV2 = offsetof(FileHeader, storage);

Initializer InitializerOf(const pb::TableSpec& spec) {
  return {spec.init_kind(), spec.init_a(), spec.init_b(), spec.seed(), spec.stream()};
}

// Row `row` of the table as `init` draws it, `width` elements rounded to `storage`, into `out`.
void DrawRow(const Initializer& init, int storage, int64_t row, int64_t width, char* out) {
  std::vector<float> wide(storage == hetu::storage::kF32 ? 0 : width);
  float* drawn = wide.empty() ? reinterpret_cast<float*>(out) : wide.data();
  hetu::rng::fill_rows(static_cast<int>(init.kind), init.a, init.b, init.seed, init.stream, row, row + 1, width, drawn);
  if (!wide.empty()) hetu::storage::narrow_row(storage, drawn, out, width);
}

// What a save by server `server` under `placement` writes as lo, hi and stride.
void SavedRows(const RowPlacement& placement, int server, FileHeader* h) {
  const int64_t n = placement.Rows(server);
  h->lo = std::min(placement.rows(), placement.First(server));
  h->hi = n ? placement.Row(server, n - 1) + 1 : h->lo;
  h->placement = placement.kind();
  h->stride = placement.Stride();
}

// A shard of `rows` rows is stepped in units: one per row, or the whole shard when dense.
void Units(bool dense, int64_t rows, int64_t width, int64_t* units, int64_t* unit_width) {
  *units = dense ? 1 : rows;
  *unit_width = dense ? rows * width : width;
}

// A line's bookkeeping besides its row and state: counters (8), LineCache's arrays (18) and its
// slot map's cells (16 bytes each, 2 to 4 cells a line).
constexpr int64_t kLineBookkeeping = 8 + 18 + 64;

// A disk tier's lines: its cache bytes over a line's (row, state and bookkeeping), at least one
// and at most the shard's rows.
int64_t TierLines(const pb::TableSpec& spec, int64_t rows) {
  const int64_t state = hetu::optim::state_width(OptimFromProto(spec.optim()).kind, spec.width());
  const int64_t line = spec.width() * hetu::storage::bytes(spec.storage()) + state * 4 + kLineBookkeeping;
  return std::max<int64_t>(1, std::min<int64_t>(rows, spec.tier_cache_bytes() / line));
}

int64_t CeilDiv(int64_t a, int64_t b) { return a >= 0 ? (a + b - 1) / b : -((-a) / b); }
int64_t FloorDiv(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

std::string Sanitize(const std::string& name) {
  std::string s = name;
  for (char& c : s)
    if (!(isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.')) c = '_';
  return s;
}

}  // namespace

template <typename T>
HugeArray<T>::~HugeArray() {
  if (p_) munmap(p_, bytes_);
}

template <typename T>
void HugeArray<T>::Reset(size_t n, T fill) {
  if (n != n_) {
    if (p_) munmap(p_, bytes_);
    p_ = nullptr;
    n_ = n;
    bytes_ = std::max<size_t>(4096, n * sizeof(T));
    void* m = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) throw std::bad_alloc();
    if (bytes_ >= (size_t(2) << 20)) madvise(m, bytes_, MADV_HUGEPAGE);
    p_ = static_cast<T*>(m);
  }
  std::fill(p_, p_ + n_, fill);
}

template class HugeArray<char>;
template class HugeArray<int32_t>;
template class HugeArray<uint32_t>;
template class HugeArray<float>;
template class HugeArray<int64_t>;

TableShard::TableShard(const std::string& name, const pb::TableSpec& spec, int rank, int num_servers)
    : name_(name),
      spec_(spec),
      placement_(RowPlacement::Of(static_cast<RowPlacement::Kind>(spec.placement()), spec.dense(), spec.rows(),
                                  num_servers)),
      rank_(rank),
      slot_(placement_.Slots(rank)),
      rows_(placement_.Rows(rank)) {
  cfg_ = OptimFromProto(spec.optim());
  storage_ = spec.dense() ? hetu::storage::kF32 : spec.storage();
  cfg_.storage = storage_;
  row_bytes_ = width() * hetu::storage::bytes(storage_);
  Units(dense(), rows_, width(), &units_, &unit_width_);
  unit_state_width_ = hetu::optim::state_width(cfg_.kind, unit_width_);
  lines_ = units_;
  if (!spec.tier_dir().empty() && !dense()) {
    // The arrays become the cache's lines, the slots' rows go to the file.
    disk_slot_ = slot_;
    slot_ = SlotIndex{0, 1};
    asked_lines_ = lines_ = TierLines(spec, rows_);
    file_ = std::make_unique<RowFile>(spec.tier_dir() + "/" + Sanitize(name_) + ".shard" + std::to_string(rank) +
                                          "-of-" + std::to_string(num_servers) + ".rows",
                                      rows_, row_bytes_ + unit_state_width_ * int64_t(sizeof(float)) + 16);
    cache_ = std::make_unique<LineCache>(lines_);
  }
  Reset();
}

int64_t TableShard::Bytes(const pb::TableSpec& spec, int rank, int num_servers) {
  const auto placement = RowPlacement::Of(static_cast<RowPlacement::Kind>(spec.placement()), spec.dense(),
                                          spec.rows(), num_servers);
  const int64_t rows = placement.Rows(rank);
  const int storage = spec.dense() ? hetu::storage::kF32 : spec.storage();
  int64_t units = 0, unit_width = 0;
  Units(spec.dense(), rows, spec.width(), &units, &unit_width);
  const int64_t state = hetu::optim::state_width(OptimFromProto(spec.optim()).kind, unit_width);
  const int64_t unit_bytes = spec.width() * hetu::storage::bytes(storage) * (units ? rows / units : 0) +
                             state * int64_t(sizeof(float)) + 2 * int64_t(sizeof(int32_t));
  // A disk tier holds its lines, a bit per row (written or not) and, once saved with a mark,
  // 4 bytes per row (the versions a delta compares with).
  if (!spec.tier_dir().empty() && !spec.dense())
    return TierLines(spec, rows) * (unit_bytes - 8 + kLineBookkeeping) + rows / 8 + rows * 4;
  return units * unit_bytes;
}

void TableShard::Reset() {
  if (on_disk()) {
    // Rows are drawn when first staged (DrawLine): nothing to draw now.
    cache_->Clear();
    if (lines_ > asked_lines_) cache_->Shrink(asked_lines_);
    lines_ = line_capacity_ = asked_lines_;
    values_.Reset(lines_ * row_bytes_, 0);
    state_.Reset(lines_ * unit_state_width_, 0.0f);
    counters_.Reset(lines_);
    file_->Clear();
    ForgetPending();
    applied = -1;
    saved_mark_ = -1;
    return;
  }
  values_.Reset(rows_ * row_bytes_, 0);
  // Each row gets the values it has in the whole table, wherever it is placed, rounded to the
  // storage type. Drawing them is most of a large table's start-up (tens of ns an element), so
  // the server's threads share it; 16-bit rows are drawn through a small float32 buffer.
  const int64_t w = width();
  hetu::parallel_for(rows_, kParallelRows, [&](int64_t b, int64_t e) {
    std::vector<float> wide(storage_ == hetu::storage::kF32 ? 0 : std::min<int64_t>(e - b, kParallelRows) * w);
    for (int64_t i0 = b; i0 < e;) {
      const int64_t i1 = wide.empty() ? e : std::min(e, i0 + kParallelRows);
      float* out = wide.empty() ? reinterpret_cast<float*>(values_.data()) + i0 * w : wide.data();
      if (slot_.stride == 1) {
        hetu::rng::fill_rows(spec_.init_kind(), spec_.init_a(), spec_.init_b(), spec_.seed(), spec_.stream(),
                             slot_.first + i0, slot_.first + i1, w, out);
      } else {
        for (int64_t i = i0; i < i1; ++i) {
          const int64_t row = placement_.Row(rank_, i);
          hetu::rng::fill_rows(spec_.init_kind(), spec_.init_a(), spec_.init_b(), spec_.seed(), spec_.stream(), row,
                               row + 1, w, out + (i - i0) * w);
        }
      }
      if (!wide.empty()) hetu::storage::narrow_row(storage_, out, values_.data() + i0 * row_bytes_, (i1 - i0) * w);
      i0 = i1;
    }
  });
  state_.Reset(units_ * unit_state_width_, 0.0f);
  counters_.Reset(units_);
  ForgetPending();
  applied = -1;
  saved_mark_ = -1;  // the rows changed since any save: no delta until the next marked save
}

std::string TableShard::CheckKeys(const int64_t* keys, int64_t n) const {
  for (int64_t i = 0; i < n; ++i) {
    if (placement_.Holds(rank_, keys[i])) continue;
    if (keys[i] < 0 || keys[i] >= spec_.rows())
      return "table '" + name_ + "': key " + std::to_string(keys[i]) + " is outside the table's rows [0, " +
             std::to_string(spec_.rows()) + ")";
    return "table '" + name_ + "': key " + std::to_string(keys[i]) + " was sent to the server holding " +
           placement_.Describe(rank_) + " (" + RowPlacement::Name(placement_.kind()) + " placement)";
  }
  return "";
}

std::string TableShard::CheckVersionAdds(const int64_t* keys, const int64_t* adds, int64_t n, int64_t least,
                                         const char* what) const {
  for (int64_t i = 0; i < n; ++i)
    if (adds[i] < least)
      return "table '" + name_ + "', row " + std::to_string(keys[i]) + ": " + what + " " + std::to_string(adds[i]) +
             " (at least " + std::to_string(least) + "; a row's version never goes backwards)";
  return "";
}

namespace {
bool Increasing(const int64_t* keys, int64_t n) {
  for (int64_t i = 1; i < n; ++i)
    if (keys[i - 1] >= keys[i]) return false;
  return true;
}
}  // namespace

void TableShard::CatchUp(const int64_t* keys, int64_t n, int64_t target) {
  if (!catches_up() || target <= 0 || n == 0) return;
  std::vector<int64_t> lines;
  const bool distinct = Increasing(keys, n);
  CatchUpUnits(Stage(keys, n, true, &lines), n, target, distinct);
}

void TableShard::CatchUpUnits(const int64_t* keys, int64_t n, int64_t target, bool increasing) {
  if (!catches_up() || target <= 0 || n == 0) return;
  ReserveCounters(0, target, true);
  const int64_t w = width();
  const hetu::optim::CatchUp catch_up(cfg_, target);
  auto visit = [&](int64_t b, int64_t e) {
    std::vector<float> wide(storage_ == hetu::storage::kF32 ? 0 : w);  // a 16-bit row, widened
    for (int64_t i = b; i < e; ++i) {
      const int64_t r = slot_(keys[i]);
      int64_t s = counters_.step(r);
      if (s >= target) continue;
      char* row = &values_[r * row_bytes_];
      float* values = wide.empty() ? reinterpret_cast<float*>(row) : wide.data();
      if (!wide.empty()) hetu::storage::widen_row(storage_, row, values, w);
      catch_up.Row(values, &state_[r * unit_state_width_], &s, w);
      if (!wide.empty()) hetu::storage::narrow_row(storage_, values, row, w);
      counters_.Assign(r, s, 0);
    }
  };
  // Distinct rows (a worker's deduplicated keys): threads take disjoint runs of them.
  if (increasing) hetu::parallel_for(n, kParallelRows, visit);
  else visit(0, n);
}

void TableShard::Apply(const std::vector<Push>& given, float lr, int64_t catch_up_to) {
  std::vector<Push> pushes = given;
  // Disk tier: every push's rows staged at once (none evicted before all are stepped), and each
  // push's keys replaced by their lines; distinct keys have distinct lines.
  std::vector<int64_t> staged_keys, lines;
  const bool single_distinct = given.size() == 1 && given[0].keys && Increasing(given[0].keys, given[0].n);
  if (on_disk()) {
    for (const Push& p : given) staged_keys.insert(staged_keys.end(), p.keys, p.keys + p.n);
    Stage(staged_keys.data(), static_cast<int64_t>(staged_keys.size()), true, &lines);
    int64_t at = 0;
    for (Push& p : pushes) {
      p.keys = lines.data() + at;
      at += p.n;
    }
  }
  for (const Push& p : pushes)
    if (p.keys) CatchUpUnits(p.keys, p.n, catch_up_to, pushes.size() == 1 ? single_distinct : Increasing(p.keys, p.n));
  const int64_t w = width();
  if (dense()) {
    std::vector<float> sum;
    int64_t contributions = 0;
    for (const Push& p : pushes) {
      if (p.n == 0) continue;
      if (contributions++ == 0) sum.assign(p.values, p.values + p.n);
      else
        for (int64_t j = 0; j < p.n; ++j) sum[j] += p.values[j];
    }
    if (contributions == 0) return;
    ReserveCounters(contributions);
    counters_.Stepped(0, contributions, [&](int64_t* step) {
      hetu::optim::step_row(cfg_, lr, dense_values(), state_.data(), step, sum.data(), unit_width_);
    });
    return;
  }
  // One push of strictly increasing keys (what a worker's deduplicated batch is): nothing to
  // sum or count, step straight from the received buffer.
  if (pushes.size() == 1) {
    const Push& p = pushes[0];
    if (single_distinct) {  // distinct rows: threads can step disjoint runs of them
      int64_t most = 1;
      for (int64_t i = 0; p.counts && i < p.n; ++i) most = std::max(most, p.counts[i]);
      ReserveCounters(most);
      hetu::parallel_for(p.n, kParallelRows,
                         [&](int64_t b, int64_t e) { StepRows(p.keys, b, e, p.values, p.counts, lr); });
      return;
    }
  }
  // Unique keys in first-seen order; a row's gradient is the sum of its occurrences in push
  // order, which is worker-rank order under BSP.
  int64_t total = 0;
  for (const Push& p : pushes) total += p.n;
  std::unordered_map<int64_t, int64_t> index;
  index.reserve(static_cast<size_t>(total));
  std::vector<int64_t> order, add, last_push;
  order.reserve(total);
  for (size_t pi = 0; pi < pushes.size(); ++pi) {
    const Push& p = pushes[pi];
    for (int64_t i = 0; i < p.n; ++i) {
      auto ins = index.emplace(p.keys[i], static_cast<int64_t>(order.size()));
      const int64_t u = ins.first->second;
      if (ins.second) {
        order.push_back(p.keys[i]);
        add.push_back(p.counts ? p.counts[i] : 1);
        last_push.push_back(static_cast<int64_t>(pi));
      } else if (p.counts) {
        add[u] += p.counts[i];
      } else if (last_push[u] != static_cast<int64_t>(pi)) {
        add[u] += 1;  // default: one contribution per distinct key per push
        last_push[u] = static_cast<int64_t>(pi);
      }
    }
  }
  const float* grads;
  std::vector<float> sum;
  if (pushes.size() == 1 && static_cast<int64_t>(order.size()) == total) {
    grads = pushes[0].values;  // nothing to sum: step straight from the received buffer
  } else {
    sum.resize(order.size() * w);
    std::vector<char> seen(order.size(), 0);
    for (const Push& p : pushes) {
      for (int64_t i = 0; i < p.n; ++i) {
        const int64_t u = index[p.keys[i]];
        float* s = &sum[u * w];
        const float* g = p.values + i * w;
        if (!seen[u]) {
          std::memcpy(s, g, w * sizeof(float));
          seen[u] = 1;
        } else {
          for (int64_t j = 0; j < w; ++j) s[j] += g[j];
        }
      }
    }
    grads = sum.data();
  }
  ReserveCounters(add.empty() ? 0 : *std::max_element(add.begin(), add.end()));
  StepRows(order.data(), 0, static_cast<int64_t>(order.size()), grads, add.data(), lr);
}

void TableShard::ReserveCounters(int64_t version_add, int64_t steps, bool set_steps) {
  if (counters_.Reserve(steps, version_add, set_steps))
    PS_VLOG(0) << "table '" << name_ << "', server " << rank_
               << ": step counts and versions are 64 bits from now on (one could pass 2^31 - 1)";
}

void TableShard::StepRows(const int64_t* keys, int64_t b, int64_t e, const float* grads, const int64_t* counts,
                          float lr) {
  static const StepLoopFn step = StepLoopOf(SimdVariant());  // HETU_SIMD, checked when the server starts
  const StepRowsView rows{values_.data(), storage_, state_.data(), &counters_, slot_, width(), unit_state_width_};
  step(cfg_, lr, rows, keys, b, e, grads, counts);
}

void TableShard::Gather(const int64_t* given, int64_t n, void* out) const {
  std::vector<int64_t> lines;
  const int64_t* keys = Stage(given, n, false, &lines);
  const int64_t rb = row_bytes_;
  char* o = static_cast<char*>(out);
  // Large gathers are bound by memory latency; a second thread keeps more misses in flight
  // while the transport has nothing to send yet.
  hetu::parallel_for(n, kParallelRows, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (i + kAhead < e) Prefetch(slot_(keys[i + kAhead]));
      std::memcpy(o + i * rb, &values_[slot_(keys[i]) * rb], rb);
    }
  });
}

void TableShard::PrefetchRows(const int64_t* keys, int64_t n) const {
  // More rows than the cache holds would only evict each other: the first that fit.
  std::vector<int64_t> lines;
  if (on_disk()) Stage(keys, std::min(n, asked_lines_), false, &lines);
}

void TableShard::GatherDense(float* out) const { std::memcpy(out, values_.data(), values_.size()); }

std::vector<int64_t> TableShard::Stale(const int64_t* given, const int64_t* versions, int64_t n, int64_t bound) const {
  std::vector<int64_t> lines;
  const int64_t* keys = Stage(given, n, false, &lines);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i)
    if (counters_.version(Unit(keys[i])) - versions[i] > bound) idx.push_back(i);
  return idx;
}

int64_t TableShard::Version(int64_t key) const {
  std::vector<int64_t> lines;
  return counters_.version(Unit(*Stage(&key, 1, false, &lines)));
}

void TableShard::GatherState(const int64_t* given, int64_t n, float* state, int64_t* steps, int64_t* versions) const {
  std::vector<int64_t> lines;
  const int64_t* keys = Stage(given, n, false, &lines);
  const int64_t sw = unit_state_width_;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = slot_(keys[i]);
    if (sw) std::memcpy(state + i * sw, &state_[r * sw], sw * sizeof(float));
    steps[i] = counters_.step(r);
    versions[i] = counters_.version(r);
  }
}

void TableShard::Assign(const int64_t* given, int64_t n, const void* values, const float* state, const int64_t* steps,
                        const int64_t* version_add) {
  std::vector<int64_t> lines;
  const int64_t* keys = Stage(given, n, true, &lines);
  const int64_t rb = row_bytes_, sw = unit_state_width_;
  const char* v = static_cast<const char*>(values);
  int64_t most_steps = 0, most_add = 0;
  for (int64_t i = 0; i < n; ++i) {
    most_steps = std::max(most_steps, steps[i]);
    most_add = std::max(most_add, version_add[i]);
  }
  ReserveCounters(most_add, most_steps, true);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = slot_(keys[i]);
    std::memcpy(&values_[r * rb], v + i * rb, rb);
    if (sw) std::memcpy(&state_[r * sw], state + i * sw, sw * sizeof(float));
    counters_.Assign(r, steps[i], version_add[i]);
  }
}

std::string TableShard::FileName(const std::string& dir, int rank, int num_servers) const {
  return dir + "/" + Sanitize(name_) + ".shard" + std::to_string(rank) + "-of-" + std::to_string(num_servers) + ".bin";
}

namespace {

// Checkpoint counters of this process (TableShard::Checkpoints); a server saves and loads one
// table at a time, the atomics only let a stats request read them from another thread.
std::atomic<int64_t> g_saves{0}, g_saved_bytes{0}, g_loads{0}, g_loaded_bytes{0}, g_cloned_bytes{0};
std::atomic<double> g_save_seconds{0}, g_load_seconds{0};
// Bytes this thread's save or load shared with a row file by a clone instead of copying them.
thread_local int64_t t_cloned_bytes = 0;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void Add(std::atomic<double>& total, double x) {
  total.store(total.load(std::memory_order_relaxed) + x, std::memory_order_relaxed);
}

// Runs a save (`save`) or load that reports the bytes it moved, and counts it if it succeeds.
template <typename Run>
std::string Counted(bool save, Run&& run) {
  const double start = Now();
  int64_t bytes = 0;
  t_cloned_bytes = 0;
  std::string error = run(&bytes);
  if (error.empty()) {
    (save ? g_saves : g_loads).fetch_add(1, std::memory_order_relaxed);
    (save ? g_saved_bytes : g_loaded_bytes).fetch_add(bytes, std::memory_order_relaxed);
    g_cloned_bytes.fetch_add(t_cloned_bytes, std::memory_order_relaxed);
    Add(save ? g_save_seconds : g_load_seconds, Now() - start);
  }
  return error;
}

// Writes `path` through `path`.tmp, renamed in once `write(f)` (whether its writes succeeded)
// is synced to disk: a checkpoint that lists the file has it whole. "" or the error.
template <typename Write>
std::string WriteSynced(const std::string& table, const std::string& path, Write&& write) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) return "table '" + table + "': cannot write " + tmp + ": " + std::strerror(errno);
  bool ok = write(f);
  ok = (std::fflush(f) == 0) && ok;
  ok = (fsync(fileno(f)) == 0) && ok;  // on disk before the checkpoint that lists it is
  ok = (std::fclose(f) == 0) && ok;
  if (!ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    return "table '" + table + "': writing " + path + " failed: " + std::strerror(errno);
  }
  return "";
}

}  // namespace

TableShard::CheckpointCounters TableShard::Checkpoints() {
  CheckpointCounters c;
  c.saves = g_saves.load(std::memory_order_relaxed);
  c.saved_bytes = g_saved_bytes.load(std::memory_order_relaxed);
  c.save_seconds = g_save_seconds.load(std::memory_order_relaxed);
  c.loads = g_loads.load(std::memory_order_relaxed);
  c.loaded_bytes = g_loaded_bytes.load(std::memory_order_relaxed);
  c.load_seconds = g_load_seconds.load(std::memory_order_relaxed);
  c.cloned_bytes = g_cloned_bytes.load(std::memory_order_relaxed);
  return c;
}

std::string TableShard::Save(const std::string& dir, int rank, int num_servers) const {
  return Counted(true, [&](int64_t* bytes) { return SaveFile(dir, rank, num_servers, bytes); });
}

std::string TableShard::SaveFile(const std::string& dir, int rank, int num_servers, int64_t* bytes) const {
  std::string disk_error, how;
  const std::string path = FileName(dir, rank, num_servers);
  const std::string error = WriteSynced(name_, path, [&](FILE* f) {
    FileHeader h{};
    std::memcpy(h.magic, kMagic, 8);
    h.rows = spec_.rows();
    h.width = width();
    h.dense = dense();
    SavedRows(placement_, rank_, &h);
    h.optim_kind = cfg_.kind;
    h.unit_state_width = unit_state_width_;
    h.applied = applied;
    h.storage = storage_;
    if (on_disk()) {
      disk_error = SaveFileOnDisk(f, h, bytes, &how);
      return disk_error.empty();
    }
    bool ok = std::fwrite(&h, sizeof(h), 1, f) == 1;
    *bytes = sizeof(h);
    // Written straight from the shard's arrays: a save needs no copy of the table.
    auto put = [&](const void* p, size_t n) {
      ok = ok && (n == 0 || std::fwrite(p, n, 1, f) == 1);
      *bytes += static_cast<int64_t>(n);
    };
    put(values_.data(), values_.size());
    put(state_.data(), state_.size() * sizeof(float));
    // Step counts, then versions, as int64 whatever their width here (through a bounded buffer).
    std::vector<int64_t> counts(std::min<int64_t>(units_, int64_t(1) << 19));
    for (int section = 0; section < 2; ++section) {
      for (int64_t u0 = 0; u0 < units_ && ok; u0 += static_cast<int64_t>(counts.size())) {
        const int64_t m = std::min<int64_t>(counts.size(), units_ - u0);
        for (int64_t j = 0; j < m; ++j) counts[j] = section == 0 ? counters_.step(u0 + j) : counters_.version(u0 + j);
        put(counts.data(), m * sizeof(int64_t));
      }
    }
    return ok;
  });
  if (!disk_error.empty()) return "table '" + name_ + "': " + disk_error;
  // Which way a disk tier's save went, once a save: an operator sees whether it took space.
  if (error.empty() && on_disk()) LogLine() << "table '" << name_ << "', server " << rank_ << ": saved " << path << how;
  return error;
}

namespace {
// "8.0 KiB", "15.1 MiB": a save's line names amounts from a header's to a table's.
std::string Amount(int64_t bytes) {
  char s[32];
  if (bytes < (int64_t(1) << 20)) std::snprintf(s, sizeof s, "%.1f KiB", bytes / 1024.0);
  else std::snprintf(s, sizeof s, "%.1f MiB", bytes / 1048576.0);
  return s;
}
}  // namespace

std::string TableShard::SaveFileOnDisk(FILE* f, const FileHeader& h, int64_t* bytes, std::string* how) const {
  // The row file first holds every row the lines changed: its records are then the shard.
  const std::string written_back = const_cast<TableShard*>(this)->WriteBackLines();
  if (!written_back.empty()) return written_back;
  const int cloned = SaveRecords(f, h, bytes);
  if (cloned == 0) {
    *how = " by cloning the row file: " + Amount(t_cloned_bytes) + " shared with it, " + Amount(*bytes) + " written";
    return "";
  }
  if (!RowFile::CannotClone(cloned)) return std::string("writing the saved shard failed: ") + std::strerror(cloned);
  // No clone here: Save's layout, written whole.
  if (std::fwrite(&h, sizeof(h), 1, f) != 1) return std::string("writing the saved shard failed: ") + std::strerror(errno);
  *bytes = sizeof(h);
  // Save's sections, a staged chunk of slots at a time, each chunk's part of every section
  // written at its place in the file: a save holds no more of the table than a chunk.
  const int64_t rb = row_bytes_, sw = unit_state_width_, n = rows_;
  const long values_at = sizeof(FileHeader), state_at = values_at + n * rb, steps_at = state_at + n * sw * 4,
             versions_at = steps_at + n * 8;
  bool ok = true;
  LineChunk chunk;
  auto put = [&](long at, const void* p, size_t size) {
    ok = ok && (size == 0 || (std::fseek(f, at, SEEK_SET) == 0 && std::fwrite(p, size, 1, f) == 1));
    *bytes += static_cast<int64_t>(size);
  };
  try {
    ForSlotChunks(false, [&](int64_t s0, int64_t m, const int64_t* lines) {
      CopyOutLines(lines, m, &chunk);
      put(values_at + s0 * rb, chunk.values.data(), m * rb);
      put(state_at + s0 * sw * 4, chunk.state.data(), m * sw * 4);
      put(steps_at + s0 * 8, chunk.steps.data(), m * 8);
      put(versions_at + s0 * 8, chunk.versions.data(), m * 8);
    });
  } catch (const std::exception& e) {
    return e.what();
  }
  if (ok && std::fseek(f, 0, SEEK_END) != 0) ok = false;
  if (!ok) return std::string("writing the saved shard failed: ") + std::strerror(errno);
  *how = " whole: " + Amount(*bytes) + " written (no clone of the row file " + file_->path() + " there: " +
         std::strerror(cloned) + ")";
  return "";
}

int TableShard::SaveRecords(FILE* f, const FileHeader& h, int64_t* bytes) const {
  RecordsHeader r{};
  r.file = h;
  std::memcpy(r.file.magic, kRecordsMagic, 8);
  r.record_bytes = file_->record_bytes();
  r.init = InitializerOf(spec_);
  // The records start at a block of the checkpoint's file system (a clone shares whole blocks),
  // and are cloned first: where the file system cannot, nothing was written.
  struct statvfs fs {};
  const int64_t block = ::fstatvfs(fileno(f), &fs) == 0 ? std::max<int64_t>(4096, fs.f_bsize) : 4096;
  const std::vector<uint64_t>& written = file_->written_words();
  r.records_at = CeilDiv(sizeof(r) + static_cast<int64_t>(written.size()) * 8, block) * block;
  if (const int error = file_->CloneTo(fileno(f), r.records_at)) return error;
  t_cloned_bytes += rows_ * r.record_bytes;
  // The header and the written bits before them; the rest of their block stays a hole (zeros).
  errno = 0;
  if (std::fwrite(&r, sizeof(r), 1, f) != 1 ||
      (!written.empty() && std::fwrite(written.data(), written.size() * 8, 1, f) != 1) || std::fflush(f) != 0)
    return errno && !RowFile::CannotClone(errno) ? errno : EIO;
  *bytes = static_cast<int64_t>(sizeof(r) + written.size() * 8);
  return 0;
}

namespace {

// A saved shard file, closed however the load ends.
struct SavedShard {
  FILE* f = nullptr;
  ~SavedShard() {
    if (f) std::fclose(f);
  }
};

// Bytes read by ReadAt in this thread: what a load counts as read.
thread_local int64_t t_read_bytes = 0;

bool ReadAt(FILE* f, long at, void* p, size_t bytes) {
  t_read_bytes += static_cast<int64_t>(bytes);
  return bytes == 0 || (std::fseek(f, at, SEEK_SET) == 0 && std::fread(p, bytes, 1, f) == 1);
}

void RecodeSlot(const Recode& rc, const char* src, char* dst, std::vector<float>* wide) {
  wide->resize(rc.width);
  hetu::storage::widen_row(rc.from, src, wide->data(), rc.width);
  hetu::storage::narrow_row(rc.to, wide->data(), dst, rc.width);
}

// Copies slots [ja, jb) of one section of saved shard k (placed by `from`, `slot_bytes` per
// slot, starting at `at`) to the slots of `dest` where server `rank` under `to` keeps the same
// rows, skipping the rows it does not hold (and recoding them, with `recode`). One read when
// the slots map one to one (same stride, same type), else through a bounded buffer, so memory
// does not grow with the table.
// `base`: dest holds slots from that one on (a disk tier's chunk).
bool CopySlots(FILE* f, long at, size_t slot_bytes, const RowPlacement& from, int k, int64_t ja, int64_t jb,
               const RowPlacement& to, int rank, char* dest, const Recode* recode = nullptr, int64_t base = 0) {
  if (slot_bytes == 0 || ja >= jb) return true;
  const SlotIndex to_slot = to.Slots(rank);
  auto slot = [&](int64_t row) { return to_slot(row) - base; };
  const size_t dest_bytes = recode ? recode->width * hetu::storage::bytes(recode->to) : slot_bytes;
  if (from.Stride() == to.Stride() && !recode)
    return ReadAt(f, at + ja * slot_bytes, dest + slot(from.Row(k, ja)) * slot_bytes, (jb - ja) * slot_bytes);
  const int64_t chunk = std::max<int64_t>(1, (int64_t(4) << 20) / static_cast<int64_t>(slot_bytes));
  std::vector<char> buffer(std::min(chunk, jb - ja) * slot_bytes);
  std::vector<float> wide;  // a recoded row
  for (int64_t j0 = ja; j0 < jb; j0 += chunk) {
    const int64_t m = std::min(chunk, jb - j0);
    if (!ReadAt(f, at + j0 * slot_bytes, buffer.data(), m * slot_bytes)) return false;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t row = from.Row(k, j0 + j);
      if (!to.Holds(rank, row)) continue;
      if (recode) RecodeSlot(*recode, buffer.data() + j * slot_bytes, dest + slot(row) * dest_bytes, &wide);
      else std::memcpy(dest + slot(row) * slot_bytes, buffer.data() + j * slot_bytes, slot_bytes);
    }
  }
  return true;
}

// The step counts and versions of slots [ja, jb) of saved shard k (int64 sections at steps_at
// and versions_at) to put(slot, step, version) for the slots where server `rank` under `to`
// keeps the same rows, through bounded buffers.
template <typename Put>
bool CopyCounters(FILE* f, long steps_at, long versions_at, const RowPlacement& from, int k, int64_t ja, int64_t jb,
                  const RowPlacement& to, int rank, Put&& put) {
  const SlotIndex slot = to.Slots(rank);
  const int64_t chunk = int64_t(1) << 18;
  std::vector<int64_t> steps(std::min(chunk, std::max<int64_t>(jb - ja, 0))), versions(steps.size());
  for (int64_t j0 = ja; j0 < jb; j0 += chunk) {
    const int64_t m = std::min(chunk, jb - j0);
    if (!ReadAt(f, steps_at + j0 * 8, steps.data(), m * 8) || !ReadAt(f, versions_at + j0 * 8, versions.data(), m * 8))
      return false;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t row = from.Row(k, j0 + j);
      if (to.Holds(rank, row)) put(slot(row), steps[j], versions[j]);
    }
  }
  return true;
}

// The server count a table's saved shards were written with: every NAME.shardK-of-N.bin in
// `dir` must name the same N. 0 with `error` set when there is none or they disagree.
int SavedServerCount(const std::string& dir, const std::string& prefix, std::string* error) {
  int count = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (file.compare(0, prefix.size(), prefix) != 0) continue;
    int k = -1, n = 0, used = 0;
    const std::string rest = file.substr(prefix.size());
    if (std::sscanf(rest.c_str(), "%d-of-%d.bin%n", &k, &n, &used) != 2 || used != static_cast<int>(rest.size()) ||
        n < 1 || k < 0 || k >= n)
      continue;
    if (count && n != count) {
      *error = dir + " holds shards of " + std::to_string(count) + " and of " + std::to_string(n) + " servers";
      return 0;
    }
    count = n;
  }
  if (ec) *error = "cannot list " + dir + ": " + ec.message();
  else if (!count) *error = "no saved shard " + prefix + "K-of-N.bin in " + dir;
  return count;
}

}  // namespace

std::string TableShard::Load(const std::string& dir) {
  return Counted(false, [&](int64_t* bytes) { return LoadFiles(dir, bytes); });
}

std::string TableShard::LoadFiles(const std::string& dir, int64_t* bytes_read) {
  // The saved shards may come from another server count or placement: each file's header says
  // which rows it holds, and only the span of its slots that can hold rows of this shard is read.
  // Two passes: the first checks every file and counts the rows it gives this shard, reading
  // headers only; the second reads the rows into the shard's own arrays (no second table).
  const std::string prefix = Sanitize(name_) + ".shard";
  const std::string table = "table '" + name_ + "': ";
  std::string error;
  const int saved = SavedServerCount(dir, prefix, &error);
  if (!saved) return table + error;
  const int64_t w = width(), sw = unit_state_width_;
  const bool was_wide = counters_.wide();
  t_read_bytes = 0;
  std::pair<int64_t, int64_t> loaded_most{0, 0};  // a disk tier's greatest step and version loaded
  for (int pass = 0; pass < 2; ++pass) {
    const bool copy = pass == 1;
    int64_t covered = 0, loaded_applied = 0, dense_step = 0, dense_version = 0, dense_from = -1;
    for (int k = 0; k < saved; ++k) {
      const std::string path = FileName(dir, k, saved);
      SavedShard in;
      in.f = std::fopen(path.c_str(), "rb");
      if (!in.f) return table + "cannot read " + path + ": " + std::strerror(errno);
      RecordsHeader saved_records{};  // a records-layout shard's (a disk tier's clone)
      FileHeader& h = saved_records.file;
      bool ok = std::fread(&h, kHeaderBytesV1, 1, in.f) == 1;
      const bool v1 = ok && std::memcmp(h.magic, kMagicV1, 8) == 0;
      const bool v2 = ok && std::memcmp(h.magic, kMagicV2, 8) == 0;
      const bool records = ok && std::memcmp(h.magic, kRecordsMagic, 8) == 0;
      const size_t header_bytes = v1 ? kHeaderBytesV1 : v2 ? kHeaderBytesV2 : sizeof(FileHeader);
      if (v1) {
        h.placement = RowPlacement::kContiguous;
        h.stride = 1;
      } else {
        ok = ok && (v2 || records || std::memcmp(h.magic, kMagic, 8) == 0) &&
             std::fread(&h.placement, header_bytes - kHeaderBytesV1, 1, in.f) == 1;
      }
      if (records)
        ok = ok && std::fread(&saved_records.record_bytes, sizeof(RecordsHeader) - sizeof(FileHeader), 1, in.f) == 1;
      if (v1 || v2) h.storage = hetu::storage::kF32;
      if (!ok) return table + path + " is not a saved shard";
      std::string why;  // a failed read's line
      if (h.storage < 0 || h.storage >= hetu::storage::kNumTypes || (h.dense && h.storage != hetu::storage::kF32))
        return table + path + " names an unknown storage type " + std::to_string(h.storage);
      if (h.rows != spec_.rows() || h.width != w || h.dense != dense() || h.optim_kind != cfg_.kind)
        return table + path + " holds a table of " + std::to_string(h.rows) + " x " + std::to_string(h.width) +
               (h.dense ? " (dense)" : "") + " stepped by optimizer " + std::to_string(h.optim_kind) +
               ", this one is " + std::to_string(spec_.rows()) + " x " + std::to_string(w) +
               (dense() ? " (dense)" : "") + " stepped by optimizer " + std::to_string(cfg_.kind);
      if (h.placement != RowPlacement::kStrided && h.placement != RowPlacement::kContiguous)
        return table + path + " names an unknown row placement " + std::to_string(h.placement);
      const RowPlacement from =
          RowPlacement::Of(static_cast<RowPlacement::Kind>(h.placement), dense(), spec_.rows(), saved);
      FileHeader want{};
      SavedRows(from, k, &want);
      if (h.lo != want.lo || h.hi != want.hi || h.stride != want.stride)
        return table + path + " holds rows [" + std::to_string(h.lo) + ", " + std::to_string(h.hi) + ") by " +
               std::to_string(h.stride) + ", shard " + std::to_string(k) + " of " + std::to_string(saved) +
               " holds " + from.Describe(k) + " (" + RowPlacement::Name(from.kind()) + " placement)";
      // Where each section of the file starts (Save's order).
      const int64_t saved_rows = from.Rows(k);
      int64_t units, unit_width;
      Units(dense(), saved_rows, w, &units, &unit_width);
      const long float_bytes = sizeof(float), int_bytes = sizeof(int64_t);
      const long saved_row_bytes = w * hetu::storage::bytes(static_cast<int>(h.storage));
      const long values_at = static_cast<long>(header_bytes);
      const long state_at = values_at + saved_rows * saved_row_bytes;
      const long steps_at = state_at + units * hetu::optim::state_width(cfg_.kind, unit_width) * float_bytes;
      const long versions_at = steps_at + units * int_bytes;
      // A records-layout shard: its records (a sparse shard's, of Save's rows and state) to the end.
      const long record_bytes = saved_row_bytes + unit_state_width_ * float_bytes + 2 * int_bytes + 8;
      if (records && (h.dense || saved_records.record_bytes != record_bytes ||
                      saved_records.records_at < static_cast<long>(sizeof(RecordsHeader)) + (saved_rows + 63) / 64 * 8))
        return table + path + " has a damaged header (records of " + std::to_string(saved_records.record_bytes) +
               " bytes from byte " + std::to_string(saved_records.records_at) + ", this table's are " +
               std::to_string(record_bytes) + " bytes)";
      const long end = records ? saved_records.records_at + saved_rows * record_bytes : versions_at + units * int_bytes;
      if (std::fseek(in.f, 0, SEEK_END) != 0) return table + "cannot seek in " + path;
      const long size = std::ftell(in.f);
      if (size < end)
        return table + path + " is truncated: " + std::to_string(size) + " bytes of " + std::to_string(end);
      if (size > end) return table + path + " has bytes after the shard's data (not written by a save)";
      if (k > 0 && h.applied != loaded_applied)
        return table + "the saved shards were applied up to different iterations (" +
               std::to_string(loaded_applied) + " and " + std::to_string(h.applied) + " in " + path + ")";
      loaded_applied = h.applied;
      int64_t n = 0;
      if (dense()) {
        // Both contiguous: the overlap of two ranges. A dense shard's state is whole arrays of
        // its range's floats (element-wise kinds only, KVServer::Init): copy the overlap of each.
        const int64_t a = std::max(slot_.first, h.lo), b = std::min(slot_.first + rows_, h.hi);
        if (a >= b) continue;
        n = b - a;
        int64_t step = 0, version = 0;
        ok = ReadAt(in.f, steps_at, &step, int_bytes) && ReadAt(in.f, versions_at, &version, int_bytes);
        if (ok && dense_from >= 0 && (step != dense_step || version != dense_version))
          return table + "the saved shards of a dense table disagree on its step count (" +
                 std::to_string(dense_step) + " and " + std::to_string(step) + " in " + path + ")";
        dense_step = step;
        dense_version = version;
        dense_from = k;
        if (copy) {
          ok = ok && ReadAt(in.f, values_at + (a - h.lo) * w * float_bytes, dense_values() + (a - slot_.first) * w,
                            n * w * float_bytes);
          for (int64_t s = 0, arrays = hetu::optim::state_width(cfg_.kind, 1); s < arrays; ++s)
            ok = ok && ReadAt(in.f, state_at + (s * unit_width + (a - h.lo) * w) * float_bytes,
                              state_.data() + s * unit_width_ + (a - slot_.first) * w, n * w * float_bytes);
          counters_.Load(0, step, version);
        }
      } else {
        // Saved slots [ja, jb): those whose rows lie between this shard's first and last row.
        int64_t ja = 0, jb = 0;
        const int64_t first = from.First(k), stride = from.Stride();
        if (rows_ > 0 && saved_rows > 0) {
          const int64_t last = placement_.Row(rank_, rows_ - 1);
          ja = slot_.first <= first ? 0 : (slot_.first - first + stride - 1) / stride;
          jb = last < first ? 0 : std::min(saved_rows, (last - first) / stride + 1);
        }
        if (stride == slot_.stride) {  // slot for slot, or no row in common
          if ((first - slot_.first) % stride != 0) jb = ja;
          n = std::max<int64_t>(0, jb - ja);
        } else {
          for (int64_t j = ja; j < jb; ++j) n += placement_.Holds(rank_, from.Row(k, j));
        }
        if (n == 0) continue;
        const Recode recode{static_cast<int>(h.storage), storage_, w};
        const Recode* recoding = h.storage == storage_ ? nullptr : &recode;
        if (copy && records) {
          why = LoadRecords(in.f, path, saved_records, from, k, ja, jb, recoding, &loaded_most);
        } else if (copy && on_disk()) {
          why = LoadOnDisk(from, k, ja, jb, [&](int64_t ka, int64_t kb, int64_t s0, LineChunk* rows) {
            const bool read =
                CopySlots(in.f, values_at, saved_row_bytes, from, k, ka, kb, placement_, rank_, rows->values.data(),
                          recoding, s0) &&
                CopySlots(in.f, state_at, sw * sizeof(float), from, k, ka, kb, placement_, rank_,
                          reinterpret_cast<char*>(rows->state.data()), nullptr, s0) &&
                CopyCounters(in.f, steps_at, versions_at, from, k, ka, kb, placement_, rank_,
                             [&](int64_t slot, int64_t step, int64_t version) {
                               rows->steps[slot - s0] = step;
                               rows->versions[slot - s0] = version;
                             });
            return read ? std::string() : "reading " + path + " failed";
          }, &loaded_most);
        } else if (copy) {
          ok = CopySlots(in.f, values_at, saved_row_bytes, from, k, ja, jb, placement_, rank_, values_.data(),
                         recoding) &&
               CopySlots(in.f, state_at, sw * float_bytes, from, k, ja, jb, placement_, rank_,
                         reinterpret_cast<char*>(state_.data())) &&
               CopyCounters(in.f, steps_at, versions_at, from, k, ja, jb, placement_, rank_,
                            [&](int64_t u, int64_t step, int64_t version) { counters_.Load(u, step, version); });
        }
      }
      if (!ok || !why.empty()) {
        if (why.empty()) why = "reading " + path + " failed";
        if (!copy) return table + why;
        Reset();  // some rows may be read already: never leave a half-loaded shard
        return table + why + "; the shard is back at its initial values";
      }
      covered += n;
    }
    // The saved shards partition the table's rows, so they must add up to this shard's.
    if (covered != rows_)
      return table + "the saved shards hold " + std::to_string(covered) + " of this shard's " +
             std::to_string(rows_) + " rows";
    if (copy) {
      applied = loaded_applied;
      if (on_disk()) counters_.Raise(loaded_most.first, loaded_most.second);
      else counters_.Rebound();
      if (!was_wide && counters_.wide())
        PS_VLOG(0) << "table '" << name_ << "', server " << rank_
                   << ": step counts and versions are 64 bits from now on (the checkpoint holds counts past 2^31 - 1)";
    }
  }
  *bytes_read = t_read_bytes;
  ForgetPending();
  return "";
}

// ---- incremental checkpoints: deltas ----------------------------------------------------------

namespace {

// A saved delta of a sparse shard: this header, then `count` rows in five sections: their keys
// (int64, ascending), values (in `storage`), optimizer state (float32), step counts and versions
// (int64, or int32 when `counter_bytes` is 4: counters that fit 32 bits take 32 on disk too).
struct DeltaHeader {
  char magic[8];
  int64_t rows, width, optim_kind, unit_state_width, storage, applied;
  int64_t count, counter_bytes;
  int64_t base;  // the mark of the save it follows
};
const char kDeltaMagic[8] = {'H', 'E', 'T', 'U', 'P', 'D', '0', '1'};

// Rows of a delta moved per read or write: memory stays bounded whatever the delta's size.
constexpr int64_t kDeltaChunk = int64_t(1) << 16;

}  // namespace

void TableShard::ForgetPending() {
  pending.clear();
  arrived.clear();
  admit_iteration = -1;
  admitted_keys.clear();
}

void TableShard::MarkSaved(int64_t mark) {
  saved_versions_.Reset(units_, 0);
  if (on_disk()) {
    ForSlotChunks(false, [&](int64_t s0, int64_t m, const int64_t* lines) {
      for (int64_t j = 0; j < m; ++j) saved_versions_[s0 + j] = static_cast<uint32_t>(counters_.version(lines[j]));
    });
    saved_mark_ = mark;
    return;
  }
  for (int64_t u = 0; u < units_; ++u) saved_versions_[u] = static_cast<uint32_t>(counters_.version(u));
  saved_mark_ = mark;
}

std::string TableShard::DeltaFileName(const std::string& dir, int rank, int num_servers) const {
  return dir + "/" + Sanitize(name_) + ".delta" + std::to_string(rank) + "-of-" + std::to_string(num_servers) + ".bin";
}

std::string TableShard::SaveDelta(const std::string& dir, int rank, int num_servers, int64_t base, int64_t mark) {
  if (saved_mark_ < 0 || saved_mark_ != base)
    return "table '" + name_ + "', server " + std::to_string(rank_) + ": a delta from checkpoint mark " +
           std::to_string(base) + ", but the rows here were last saved or loaded " +
           (saved_mark_ < 0 ? std::string("with no mark (or were cleared since)")
                            : "as mark " + std::to_string(saved_mark_)) +
           ": write a full checkpoint";
  // A dense shard is one unit: its delta is the whole shard, as a full save writes it.
  const std::string error = Counted(true, [&](int64_t* bytes) {
    return dense() ? SaveFile(dir, rank, num_servers, bytes) : SaveDeltaFile(dir, rank, num_servers, bytes);
  });
  if (error.empty()) MarkSaved(mark);
  return error;
}

std::string TableShard::SaveDeltaFile(const std::string& dir, int rank, int num_servers, int64_t* bytes) const {
  std::vector<int64_t> changed;  // slots whose version moved since the marked save
  if (on_disk()) {
    ForSlotChunks(false, [&](int64_t s0, int64_t m, const int64_t* lines) {
      for (int64_t j = 0; j < m; ++j)
        if (static_cast<uint32_t>(counters_.version(lines[j])) != saved_versions_[s0 + j]) changed.push_back(s0 + j);
    });
  } else {
    for (int64_t u = 0; u < units_; ++u)
      if (static_cast<uint32_t>(counters_.version(u)) != saved_versions_[u]) changed.push_back(u);
  }
  // A disk tier's chunks are staged, so they must fit its lines.
  const int64_t chunk = on_disk() ? std::min(kDeltaChunk, asked_lines_) : kDeltaChunk;
  return WriteSynced(name_, DeltaFileName(dir, rank, num_servers), [&](FILE* f) {
    DeltaHeader h{};
    std::memcpy(h.magic, kDeltaMagic, 8);
    h.rows = spec_.rows();
    h.width = width();
    h.optim_kind = cfg_.kind;
    h.unit_state_width = unit_state_width_;
    h.storage = storage_;
    h.applied = applied;
    h.count = static_cast<int64_t>(changed.size());
    h.counter_bytes = counters_.wide() ? 8 : 4;
    h.base = saved_mark_;
    bool ok = std::fwrite(&h, sizeof(h), 1, f) == 1;
    *bytes = sizeof(h);
    const int64_t n = h.count, rb = row_bytes_, sw = unit_state_width_, cb = h.counter_bytes;
    std::vector<char> buffer(std::min(n, chunk) * std::max<int64_t>({rb, sw * 4, 8}));
    std::vector<int64_t> lines;
    // Each section through the buffer, a chunk of rows at a time, gathered in slot order;
    // fill(slot, unit: its slot in memory or its line on disk, out).
    auto section = [&](int64_t item_bytes, auto&& fill) {
      for (int64_t i0 = 0; i0 < n && ok; i0 += chunk) {
        const int64_t m = std::min(chunk, n - i0);
        const int64_t* units = changed.data() + i0;
        if (on_disk()) {
          TableShard* self = const_cast<TableShard*>(this);
          self->BeginRequest();
          self->StageSlots(units, m, false, &lines);
          units = lines.data();
        }
        for (int64_t j = 0; j < m; ++j) fill(changed[i0 + j], units[j], buffer.data() + j * item_bytes);
        ok = item_bytes == 0 || std::fwrite(buffer.data(), m * item_bytes, 1, f) == 1;
        *bytes += m * item_bytes;
      }
    };
    section(8, [&](int64_t slot, int64_t, char* out) {
      const int64_t key = placement_.Row(rank_, slot);
      std::memcpy(out, &key, 8);
    });
    section(rb, [&](int64_t, int64_t u, char* out) { std::memcpy(out, &values_[u * rb], rb); });
    section(sw * 4, [&](int64_t, int64_t u, char* out) { std::memcpy(out, &state_[u * sw], sw * 4); });
    for (int which = 0; which < 2; ++which)
      section(cb, [&](int64_t, int64_t u, char* out) {
        const int64_t c = which == 0 ? counters_.step(u) : counters_.version(u);
        const int32_t narrow = static_cast<int32_t>(c);
        std::memcpy(out, cb == 8 ? static_cast<const void*>(&c) : &narrow, cb);
      });
    return ok;
  });
}

std::string TableShard::LoadDelta(const std::string& dir) {
  return Counted(false, [&](int64_t* bytes) { return dense() ? LoadFiles(dir, bytes) : LoadDeltaFiles(dir, bytes); });
}

std::string TableShard::LoadDeltaFiles(const std::string& dir, int64_t* bytes_read) {
  // Saved by any number of servers under any placement: each file's rows are named by key, and
  // this shard takes those it holds. Every file is checked first (headers and sizes), then read.
  const std::string prefix = Sanitize(name_) + ".delta";
  const std::string table = "table '" + name_ + "': ";
  std::string error;
  const int saved = SavedServerCount(dir, prefix, &error);
  if (!saved) return table + error;
  const bool was_wide = counters_.wide();
  const int64_t w = width(), sw = unit_state_width_;
  t_read_bytes = 0;
  int64_t loaded_applied = 0;
  for (int pass = 0; pass < 2; ++pass) {
    for (int k = 0; k < saved; ++k) {
      const std::string path = DeltaFileName(dir, k, saved);
      SavedShard in;
      in.f = std::fopen(path.c_str(), "rb");
      if (!in.f) return table + "cannot read " + path + ": " + std::strerror(errno);
      DeltaHeader h{};
      if (std::fread(&h, sizeof(h), 1, in.f) != 1 || std::memcmp(h.magic, kDeltaMagic, 8) != 0)
        return table + path + " is not a saved delta";
      if (h.rows != spec_.rows() || h.width != w || h.optim_kind != cfg_.kind || h.unit_state_width != sw)
        return table + path + " holds a delta of a table of " + std::to_string(h.rows) + " x " +
               std::to_string(h.width) + " stepped by optimizer " + std::to_string(h.optim_kind) + ", this one is " +
               std::to_string(spec_.rows()) + " x " + std::to_string(w) + " stepped by optimizer " +
               std::to_string(cfg_.kind);
      if (h.storage < 0 || h.storage >= hetu::storage::kNumTypes)
        return table + path + " names an unknown storage type " + std::to_string(h.storage);
      if (h.count < 0 || (h.counter_bytes != 4 && h.counter_bytes != 8))
        return table + path + " has a damaged header";
      const long rb = w * hetu::storage::bytes(static_cast<int>(h.storage)), cb = h.counter_bytes;
      const long keys_at = sizeof(h), values_at = keys_at + h.count * 8, state_at = values_at + h.count * rb,
                 steps_at = state_at + h.count * sw * 4, versions_at = steps_at + h.count * cb,
                 end = versions_at + h.count * cb;
      if (std::fseek(in.f, 0, SEEK_END) != 0) return table + "cannot seek in " + path;
      const long size = std::ftell(in.f);
      if (size != end)
        return table + path + " has " + std::to_string(size) + " bytes, its header says " + std::to_string(end);
      if (k > 0 && h.applied != loaded_applied)
        return table + "the saved deltas were applied up to different iterations (" +
               std::to_string(loaded_applied) + " and " + std::to_string(h.applied) + " in " + path + ")";
      loaded_applied = h.applied;
      if (pass == 0) continue;
      const Recode recode{static_cast<int>(h.storage), storage_, w};
      std::vector<int64_t> keys(std::min<int64_t>(h.count, kDeltaChunk));
      std::vector<char> values(keys.size() * rb), counts(keys.size() * cb * 2);
      std::vector<float> state(keys.size() * sw), wide;
      std::vector<int64_t> staged;  // a disk tier's line of a row
      int64_t most_step = 0, most_version = 0;
      bool ok = true;
      for (int64_t i0 = 0; i0 < h.count && ok; i0 += kDeltaChunk) {
        const int64_t m = std::min(kDeltaChunk, h.count - i0);
        ok = ReadAt(in.f, keys_at + i0 * 8, keys.data(), m * 8) &&
             ReadAt(in.f, values_at + i0 * rb, values.data(), m * rb) &&
             ReadAt(in.f, state_at + i0 * sw * 4, state.data(), m * sw * 4) &&
             ReadAt(in.f, steps_at + i0 * cb, counts.data(), m * cb) &&
             ReadAt(in.f, versions_at + i0 * cb, counts.data() + m * cb, m * cb);
        for (int64_t j = 0; j < m && ok; ++j) {
          if (keys[j] < 0 || keys[j] >= spec_.rows()) {
            Reset();
            return table + path + " names row " + std::to_string(keys[j]) + ", outside the table's rows [0, " +
                   std::to_string(spec_.rows()) + "); the shard is back at its initial values";
          }
          if (!placement_.Holds(rank_, keys[j])) continue;
          if (on_disk()) BeginRequest();
          const int64_t r = on_disk() ? *Stage(&keys[j], 1, true, &staged) : slot_(keys[j]);
          if (h.storage == storage_) std::memcpy(&values_[r * row_bytes_], values.data() + j * rb, rb);
          else RecodeSlot(recode, values.data() + j * rb, &values_[r * row_bytes_], &wide);
          if (sw) std::memcpy(&state_[r * sw], state.data() + j * sw, sw * 4);
          int64_t step = 0, version = 0;
          if (cb == 8) {
            std::memcpy(&step, counts.data() + j * 8, 8);
            std::memcpy(&version, counts.data() + (m + j) * 8, 8);
          } else {
            int32_t s32, v32;
            std::memcpy(&s32, counts.data() + j * 4, 4);
            std::memcpy(&v32, counts.data() + (m + j) * 4, 4);
            step = s32;
            version = v32;
          }
          counters_.Load(r, step, version);
          most_step = std::max(most_step, step);
          most_version = std::max(most_version, version);
        }
      }
      counters_.Raise(most_step, most_version);
      if (!ok) {
        Reset();  // some rows may be applied already: never leave a half-loaded shard
        return table + "reading " + path + " failed; the shard is back at its initial values";
      }
    }
  }
  applied = loaded_applied;
  if (!on_disk()) counters_.Rebound();  // a disk tier's bounds were raised as rows came in
  if (!was_wide && counters_.wide())
    PS_VLOG(0) << "table '" << name_ << "', server " << rank_
               << ": step counts and versions are 64 bits from now on (the delta holds counts past 2^31 - 1)";
  *bytes_read = t_read_bytes;
  ForgetPending();
  return "";
}

// ---- the disk tier: staging rows into lines ------------------------------------------------------

namespace {
std::atomic<int64_t> g_tier_hits{0}, g_tier_misses{0};
}  // namespace

TableShard::TierCounters TableShard::Tiers() {
  TierCounters c;
  c.hits = g_tier_hits.load(std::memory_order_relaxed);
  c.misses = g_tier_misses.load(std::memory_order_relaxed);
  c.file = RowFile::Totals();
  return c;
}

const int64_t* TableShard::Stage(const int64_t* keys, int64_t n, bool dirty, std::vector<int64_t>* lines) const {
  if (!on_disk()) return keys;
  std::vector<int64_t> slots(n);
  for (int64_t i = 0; i < n; ++i) slots[i] = disk_slot_(keys[i]);
  // Staging changes which rows the lines hold, never a row's content: const to the caller.
  const_cast<TableShard*>(this)->StageSlots(slots.data(), n, dirty, lines);
  return lines->data();
}

void TableShard::PackLine(int64_t line, char* out) const {
  const int64_t rb = row_bytes_, sw = unit_state_width_;
  std::memcpy(out, &values_[line * rb], rb);
  if (sw) std::memcpy(out + rb, &state_[line * sw], sw * 4);
  const int64_t counts[2] = {counters_.step(line), counters_.version(line)};
  std::memcpy(out + rb + sw * 4, counts, 16);
}

void TableShard::UnpackLine(int64_t line, const char* in) {
  const int64_t rb = row_bytes_, sw = unit_state_width_;
  std::memcpy(&values_[line * rb], in, rb);
  if (sw) std::memcpy(&state_[line * sw], in + rb, sw * 4);
  int64_t counts[2];
  std::memcpy(counts, in + rb + sw * 4, 16);
  counters_.Load(line, counts[0], counts[1]);
}

void TableShard::DrawLine(int64_t line, int64_t slot) {
  DrawRow(InitializerOf(spec_), storage_, placement_.Row(rank_, slot), width(), &values_[line * row_bytes_]);
  std::fill(&state_[line * unit_state_width_], &state_[line * unit_state_width_] + unit_state_width_, 0.0f);
  counters_.Load(line, 0, 0);
}

void TableShard::ResizeLines(int64_t lines) {
  // The arrays keep the most lines they ever held: a cache that grows for one large request
  // after another reuses them instead of mapping and faulting them in anew each time (what the
  // peak resident memory counts is the same).
  if (lines > line_capacity_) {
    HugeArray<char> values;
    HugeArray<float> state;
    values.Reset(lines * row_bytes_, 0);
    state.Reset(lines * unit_state_width_, 0.0f);
    std::memcpy(values.data(), values_.data(), lines_ * row_bytes_);
    std::memcpy(state.data(), state_.data(), lines_ * unit_state_width_ * sizeof(float));
    values_.Swap(values);
    state_.Swap(state);
    counters_.Resize(lines);
    line_capacity_ = lines;
  }
  lines_ = lines;
}

void TableShard::GrowLines(int64_t lines) {
  PS_VLOG(1) << "table '" << name_ << "', server " << rank_ << ": the disk tier's cache grows from " << lines_
             << " to " << lines << " lines for one request";
  ResizeLines(lines);
  cache_->Grow(lines);
}

std::string TableShard::WriteLines(const int64_t* lines, const int64_t* slots, int64_t n) {
  const int64_t payload = file_->payload();
  std::vector<char> buffer(n * payload);
  std::vector<char*> at(n);
  for (int64_t j = 0; j < n; ++j) {
    at[j] = buffer.data() + j * payload;
    PackLine(lines[j], at[j]);
  }
  return file_->Write(slots, n, at.data());
}

std::string TableShard::WriteBackLines(int64_t from) {
  // A chunk of lines at a time: the buffer stays bounded however large the cache.
  constexpr int64_t kChunk = int64_t(1) << 14;
  std::vector<int64_t> lines, slots;
  for (int64_t line = from; line < lines_; ++line) {
    if (cache_->slot_of(line) >= 0 && cache_->dirty(line)) {
      lines.push_back(line);
      slots.push_back(cache_->slot_of(line));
    }
    if (static_cast<int64_t>(lines.size()) < kChunk && line + 1 < lines_) continue;
    const std::string error = WriteLines(lines.data(), slots.data(), static_cast<int64_t>(lines.size()));
    if (!error.empty()) return error;
    for (int64_t written : lines) cache_->Clean(written);
    lines.clear();
    slots.clear();
  }
  return "";
}

void TableShard::ShrinkLines() {
  // The lines past the cache's size leave: dirty ones are written back first (an error leaves
  // the cache grown, and this request fails).
  const std::string error = WriteBackLines(asked_lines_);
  if (!error.empty()) throw std::runtime_error(error);
  for (int64_t line = asked_lines_; line < lines_; ++line) cache_->Drop(line);
  cache_->Shrink(asked_lines_);
  ResizeLines(asked_lines_);
}

void TableShard::BeginRequest() {
  if (!on_disk()) return;
  if (lines_ > asked_lines_) ShrinkLines();
  cache_->NextRequest();
}

void TableShard::StageSlots(const int64_t* slots, int64_t n, bool dirty, std::vector<int64_t>* lines) {
  LineCache& cache = *cache_;
  lines->resize(n);
  // First every slot gets its line: held ones are used, missing ones take a victim's. The
  // victims' rows are written back and the missing rows read in afterwards, each in one batch.
  struct Evicted {
    int64_t line, slot;
    bool dirty;
  };
  std::vector<Evicted> evicted;
  std::vector<int64_t> filled;  // lines taken for missing slots, in order
  for (int64_t i = 0; i < n; ++i) {
    int64_t line = cache.Find(slots[i]);
    if (line >= 0) {
      cache.Use(line, dirty);
      (*lines)[i] = line;
      continue;
    }
    line = cache.Victim();
    if (line < 0) {  // every line is pinned by this request
      GrowLines(std::max(2 * lines_, lines_ + (n - i)));
      line = cache.Victim();
    }
    if (cache.slot_of(line) >= 0) {
      evicted.push_back({line, cache.slot_of(line), cache.dirty(line)});
      cache.Drop(line);
    }
    cache.Hold(line, slots[i]);
    filled.push_back(line);
    (*lines)[i] = line;
  }
  g_tier_hits.fetch_add(n - static_cast<int64_t>(filled.size()), std::memory_order_relaxed);
  g_tier_misses.fetch_add(static_cast<int64_t>(filled.size()), std::memory_order_relaxed);
  // Undoes the assignment (the victims' rows are still in their lines): an I/O error leaves the
  // cache as it was and the request fails.
  // After the write-back the victims are on disk, and their lines may be drawn over: only a
  // failed write-back gives them their lines back.
  auto undo = [&](const std::string& error, bool victims_back) {
    for (int64_t line : filled) cache.Drop(line);
    for (const Evicted& e : evicted) {
      if (!victims_back) continue;
      cache.Hold(e.line, e.slot);
      if (e.dirty) cache.Use(e.line, true);
    }
    throw std::runtime_error(error);
  };
  std::vector<int64_t> ids, records;
  for (const Evicted& e : evicted) {
    if (!e.dirty) continue;
    ids.push_back(e.line);
    records.push_back(e.slot);
  }
  const std::string written = WriteLines(ids.data(), records.data(), static_cast<int64_t>(ids.size()));
  if (!written.empty()) undo(written, true);
  // Missing rows: read those ever written, draw the others.
  const int64_t payload = file_->payload();
  std::vector<char> buffer;
  std::vector<char*> at;
  ids.clear();
  records.clear();
  for (int64_t line : filled) {
    const int64_t slot = cache.slot_of(line);
    if (file_->written(slot)) {
      ids.push_back(line);
      records.push_back(slot);
    } else {
      DrawLine(line, slot);
    }
  }
  if (!ids.empty()) {
    buffer.resize(ids.size() * payload);
    at.resize(ids.size());
    for (size_t j = 0; j < ids.size(); ++j) at[j] = buffer.data() + j * payload;
    const std::string error = file_->Read(records.data(), static_cast<int64_t>(records.size()), at.data());
    if (!error.empty()) undo(error, false);
    for (size_t j = 0; j < ids.size(); ++j) UnpackLine(ids[j], at[j]);
  }
  if (dirty)
    for (int64_t line : filled) cache.Use(line, true);
}

void TableShard::CopyOutLines(const int64_t* lines, int64_t m, LineChunk* chunk) const {
  const int64_t rb = row_bytes_, sw = unit_state_width_;
  chunk->values.resize(m * rb);
  chunk->state.resize(m * sw);
  chunk->steps.resize(m);
  chunk->versions.resize(m);
  for (int64_t j = 0; j < m; ++j) {
    std::memcpy(chunk->values.data() + j * rb, &values_[lines[j] * rb], rb);
    if (sw) std::memcpy(chunk->state.data() + j * sw, &state_[lines[j] * sw], sw * 4);
    chunk->steps[j] = counters_.step(lines[j]);
    chunk->versions[j] = counters_.version(lines[j]);
  }
}

void TableShard::CopyInLines(const int64_t* lines, int64_t m, const LineChunk& chunk) {
  const int64_t rb = row_bytes_, sw = unit_state_width_;
  for (int64_t j = 0; j < m; ++j) {
    std::memcpy(&values_[lines[j] * rb], chunk.values.data() + j * rb, rb);
    if (sw) std::memcpy(&state_[lines[j] * sw], chunk.state.data() + j * sw, sw * 4);
    counters_.Load(lines[j], chunk.steps[j], chunk.versions[j]);
  }
}

template <typename Fn>
void TableShard::ForSlotChunks(bool dirty, Fn&& fn) const {
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(int64_t(1) << 16, asked_lines_));
  std::vector<int64_t> slots, lines;
  for (int64_t s0 = 0; s0 < rows_; s0 += chunk) {
    const int64_t m = std::min(chunk, rows_ - s0);
    slots.resize(m);
    for (int64_t j = 0; j < m; ++j) slots[j] = s0 + j;
    TableShard* self = const_cast<TableShard*>(this);
    self->BeginRequest();  // one chunk at a time in the cache
    self->StageSlots(slots.data(), m, dirty, &lines);
    fn(s0, m, lines.data());
  }
}

template <typename Fill>
std::string TableShard::LoadOnDisk(const RowPlacement& from, int k, int64_t ja, int64_t jb, Fill&& fill,
                                   std::pair<int64_t, int64_t>* most) {
  // Saved slots [ja, jb) of file k, a chunk of this shard's slots at a time: the chunk is staged,
  // copied out of its lines, the file's rows copied over it (fill), and copied back (dirty).
  if (ja >= jb) return "";
  const int64_t first = from.First(k), stride = from.Stride();
  const int64_t row_a = from.Row(k, ja), row_b = from.Row(k, jb - 1);
  const int64_t sa = std::max<int64_t>(0, CeilDiv(row_a - disk_slot_.first, disk_slot_.stride));
  const int64_t sb = std::min<int64_t>(rows_, FloorDiv(row_b - disk_slot_.first, disk_slot_.stride) + 1);
  const int64_t chunk = std::max<int64_t>(1, std::min<int64_t>(int64_t(1) << 16, asked_lines_));
  std::vector<int64_t> slots, lines;
  LineChunk rows;
  for (int64_t s0 = sa; s0 < sb; s0 += chunk) {
    const int64_t m = std::min(chunk, sb - s0);
    const int64_t a = placement_.Row(rank_, s0), b = placement_.Row(rank_, s0 + m - 1);
    const int64_t ka = std::max(ja, CeilDiv(a - first, stride)), kb = std::min(jb, FloorDiv(b - first, stride) + 1);
    if (ka >= kb) continue;
    slots.resize(m);
    for (int64_t j = 0; j < m; ++j) slots[j] = s0 + j;
    BeginRequest();
    StageSlots(slots.data(), m, true, &lines);
    CopyOutLines(lines.data(), m, &rows);
    const std::string error = fill(ka, kb, s0, &rows);
    if (!error.empty()) return error;
    CopyInLines(lines.data(), m, rows);
    for (int64_t j = 0; j < m; ++j) {
      most->first = std::max(most->first, rows.steps[j]);
      most->second = std::max(most->second, rows.versions[j]);
    }
  }
  return "";
}

namespace {

// A saved record's payload (`saved_row_bytes` of row, `sw` floats of state, step and version)
// into a shard's row (recoded to the table's storage type with `recode`), state and counters.
void DecodeRecord(const char* payload, int64_t saved_row_bytes, const Recode* recode, int64_t sw, char* row,
                  float* state, int64_t* step, int64_t* version, std::vector<float>* wide) {
  if (recode) RecodeSlot(*recode, payload, row, wide);
  else std::memcpy(row, payload, saved_row_bytes);
  if (sw) std::memcpy(state, payload + saved_row_bytes, sw * sizeof(float));
  std::memcpy(step, payload + saved_row_bytes + sw * sizeof(float), 8);
  std::memcpy(version, payload + saved_row_bytes + sw * sizeof(float) + 8, 8);
}

// put(row, payload) for the records of saved slots [ja, jb) of shard k (placed by `from`) whose
// rows server `rank` holds under `to`: a record written is checked by the tier's hash (RowFile::
// Sealed) and fails in one line naming the file and the record; one never written is drawn as
// the saving tier would have drawn it (with `draw`; skipped without). "" or the error.
template <typename Put>
std::string ReadRecords(FILE* f, const std::string& path, const RecordsHeader& h, const std::vector<uint64_t>& written,
                        const RowPlacement& from, int k, int64_t ja, int64_t jb, const RowPlacement& to, int rank,
                        bool draw, Put&& put) {
  const int64_t rb = h.record_bytes, payload = rb - 8;
  const int64_t chunk = std::max<int64_t>(1, (int64_t(4) << 20) / rb);
  std::vector<char> buffer(std::min(chunk, std::max<int64_t>(0, jb - ja)) * rb), drawn(payload, 0);
  for (int64_t j0 = ja; j0 < jb; j0 += chunk) {
    const int64_t m = std::min(chunk, jb - j0);
    if (!ReadAt(f, static_cast<long>(h.records_at + j0 * rb), buffer.data(), m * rb))
      return "reading records " + std::to_string(j0) + " to " + std::to_string(j0 + m - 1) + " of " + path + " failed";
    for (int64_t j = 0; j < m; ++j) {
      const int64_t slot = j0 + j, row = from.Row(k, slot);
      if (!to.Holds(rank, row)) continue;
      const char* record = buffer.data() + j * rb;
      if ((written[slot >> 6] >> (slot & 63)) & 1) {
        if (!RowFile::Sealed(record, payload, slot))
          return "record " + std::to_string(slot) + " of " + path + " is damaged: its check does not match";
        put(row, record);
      } else if (draw) {
        DrawRow(h.init, static_cast<int>(h.file.storage), row, h.file.width, drawn.data());  // the rest stays 0
        put(row, drawn.data());
      }
    }
  }
  return "";
}

}  // namespace

std::string TableShard::LoadRecords(FILE* f, const std::string& path, const RecordsHeader& h,
                                    const RowPlacement& from, int k, int64_t ja, int64_t jb, const Recode* recode,
                                    std::pair<int64_t, int64_t>* most) {
  const int64_t sw = unit_state_width_, saved_rows = from.Rows(k);
  const int64_t saved_row_bytes = h.record_bytes - 8 - 16 - sw * int64_t(sizeof(float));
  std::vector<uint64_t> written((saved_rows + 63) / 64);
  if (!ReadAt(f, sizeof(RecordsHeader), written.data(), written.size() * 8)) return "reading " + path + " failed";
  std::vector<float> wide;  // a recoded row
  const SlotIndex slot = placement_.Slots(rank_);
  std::string no_clone;
  // Onto a disk tier holding the same slots in records of the same form, drawing unwritten rows
  // the same way: the records are cloned back into the row file (no copy), then each is read
  // once to check it (a damaged one fails the load, and the caller clears the row file again).
  if (on_disk() && !recode && from.kind() == placement_.kind() && from.num_servers() == placement_.num_servers() &&
      k == rank_ && h.record_bytes == file_->record_bytes() && h.init == InitializerOf(spec_)) {
    Reset();  // the lines and the row file's records give way to the clone
    const int cloned = file_->CloneFrom(fileno(f), h.records_at, written);
    if (cloned == 0) {
      const std::string error =
          ReadRecords(f, path, h, written, from, k, 0, saved_rows, from, k, false, [&](int64_t, const char* record) {
            int64_t counts[2];  // a step and a version: the counters' bounds must cover them
            std::memcpy(counts, record + saved_row_bytes + sw * sizeof(float), 16);
            *most = {std::max(most->first, counts[0]), std::max(most->second, counts[1])};
          });
      if (!error.empty()) return error;
      t_cloned_bytes += saved_rows * h.record_bytes;
      LogLine() << "table '" << name_ << "', server " << rank_ << ": loaded " << path << " by cloning it into "
                << file_->path() << ": " << Amount(saved_rows * h.record_bytes)
                << " shared, every record read once to check it";
      return "";
    }
    if (!RowFile::CannotClone(cloned))
      return "cloning the records of " + path + " into " + file_->path() + " failed: " + std::strerror(cloned);
    LogLine() << "table '" << name_ << "', server " << rank_ << ": loading " << path
              << " by reading its records (no clone into " << file_->path() << ": " << std::strerror(cloned) << ")";
  }
  if (on_disk())
    return LoadOnDisk(from, k, ja, jb, [&](int64_t ka, int64_t kb, int64_t s0, LineChunk* rows) {
      return ReadRecords(f, path, h, written, from, k, ka, kb, placement_, rank_, true,
                         [&](int64_t row, const char* payload) {
                           const int64_t j = slot(row) - s0;
                           DecodeRecord(payload, saved_row_bytes, recode, sw, rows->values.data() + j * row_bytes_,
                                        rows->state.data() + j * sw, &rows->steps[j], &rows->versions[j], &wide);
                         });
    }, most);
  return ReadRecords(f, path, h, written, from, k, ja, jb, placement_, rank_, true,
                     [&](int64_t row, const char* payload) {
                       const int64_t u = slot(row);
                       int64_t step, version;
                       DecodeRecord(payload, saved_row_bytes, recode, sw, &values_[u * row_bytes_], &state_[u * sw],
                                    &step, &version, &wide);
                       counters_.Load(u, step, version);
                     });
}

}  // namespace ps
