// One server's shard of a table: the rows of a rows x width matrix that the table's
// RowPlacement gives this server, at their local slots, with the optimizer state (float32), step
// count and version of each row. An embedding table's rows are stored in its storage type
// (common/storage.h: float32, bfloat16 or half), and move in it: Gather and Assign copy rows as
// they are stored, and only a step widens them. A dense tensor is a table too, but its shard is stepped as one unit
// (one step count, one version), exactly like a local dense update of the same elements.
//
// A disk-tier shard (spec tier_dir, row_tier.h) keeps its rows in a file and its arrays as a
// cache of lines: every method first stages the rows it touches into lines (Stage), then works
// on lines exactly as an in-memory shard works on slots, so both step rows by the same code.
//
// The server handles data messages one at a time (postoffice.h), so the shard needs no locks.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/optim_rules.h"
#include "message.h"
#include "row_placement.h"
#include "row_tier.h"
#include "shard_arrays.h"

namespace ps {

// A saved shard's header, a records-layout shard's, and a recoding of saved rows (table.cc).
struct FileHeader;
struct RecordsHeader;
struct Recode;

class TableShard {
 public:
  TableShard(const std::string& name, const pb::TableSpec& spec, int server_rank, int num_servers);
  // The bytes a shard of `spec` on server `server_rank` allocates: its rows as stored, their
  // optimizer state and their step counts and versions (32 bits each until they widen).
  static int64_t Bytes(const pb::TableSpec& spec, int server_rank, int num_servers);

  const std::string& name() const { return name_; }
  const pb::TableSpec& spec() const { return spec_; }
  bool dense() const { return spec_.dense(); }
  int64_t width() const { return spec_.width(); }
  // Optimizer state floats per row (sparse tables).
  int64_t state_width() const { return hetu::optim::state_width(cfg_.kind, width()); }
  int64_t rows() const { return rows_; }  // rows held here
  int storage() const { return storage_; }  // hetu::storage::Type of the rows (float32 when dense)
  // Whether the rows' step counts are the step each was brought to (a catch-up kind).
  bool catches_up() const { return !dense() && hetu::optim::catches_up(cfg_.kind); }
  int64_t row_bytes() const { return row_bytes_; }  // bytes of a stored (and moved) row
  bool on_disk() const { return file_ != nullptr; }  // a disk-tier shard
  // This process's disk-tier shards: rows found in a line (hits) or read or drawn into one
  // (misses), and their row files' reads and writes.
  struct TierCounters {
    int64_t hits = 0, misses = 0;
    RowFile::Counters file;
  };
  static TierCounters Tiers();

  // "" if every key is a row of this shard, else an error naming the table and the key.
  std::string CheckKeys(const int64_t* keys, int64_t n) const;
  // "" if every key's version increment (`what`) is at least `least`, else an error naming the
  // table and the row: a version must never go backwards, or a cache would keep a stale row.
  std::string CheckVersionAdds(const int64_t* keys, const int64_t* adds, int64_t n, int64_t least,
                               const char* what) const;

  // One optimizer step per touched row from the pushes (in worker-rank order; one for ASP).
  // Each push: keys (sparse), values, optional per-key contribution counts. Sums run in the
  // given order, so the result does not depend on arrival order.
  struct Push {
    const int64_t* keys = nullptr;
    const float* values = nullptr;
    const int64_t* counts = nullptr;
    int64_t n = 0;  // keys (sparse) or elements (dense)
  };
  // catch_up_to: under a catch-up kind, each row is first brought to that step (CatchUp).
  void Apply(const std::vector<Push>& pushes, float lr, int64_t catch_up_to = 0);

  // Under a catch-up kind (hetu::optim::catches_up), the rows of `keys` take the steps they
  // skipped up to step `target` (hetu::optim::catch_up_row), so that what a pull returns or a
  // push steps is the row dense Adam would hold; versions do not change (every copy of a row
  // caught up to the same step is the same). Nothing for other kinds or dense tables.
  void CatchUp(const int64_t* keys, int64_t n, int64_t target);

  // Disk tier: a server request begins; the rows every method of it stages stay in the cache
  // until the next one (a cache grown for the last request shrinks back first). Nothing in memory.
  void BeginRequest();
  // Disk tier: reads these rows into the cache (kPrefetch); nothing in memory.
  void PrefetchRows(const int64_t* keys, int64_t n) const;

  // Rows as stored: row_bytes() each.
  void Gather(const int64_t* keys, int64_t n, void* out) const;
  void GatherDense(float* out) const;
  // Rows whose version is more than `bound` ahead of the worker's: positions into keys.
  std::vector<int64_t> Stale(const int64_t* keys, const int64_t* versions, int64_t n, int64_t bound) const;
  void GatherState(const int64_t* keys, int64_t n, float* state, int64_t* steps, int64_t* versions) const;
  int64_t Version(int64_t key) const;
  bool wide_counters() const { return counters_.wide(); }  // steps and versions in 64 bits
  void Assign(const int64_t* keys, int64_t n, const void* values, const float* state, const int64_t* steps,
              const int64_t* version_add);

  // Back to the initializer's values, zero optimizer state, steps, versions.
  void Reset();
  // One file per shard; "" on success, else the error. A disk tier's shard, where the folder is
  // on the row file's file system and it can clone files (reflinks: XFS, btrfs), is the row
  // file's records cloned after a header and their written bits (RecordsHeader): the blocks are
  // shared, not copied; elsewhere it is written whole. A line on the server says which.
  std::string Save(const std::string& dir, int rank, int num_servers) const;
  // This shard's rows from the files of a Save by any number of servers, under either placement
  // (each file read only where it may hold rows of this shard); "" on success, else the error.
  // Every file is checked before anything is read, then rows are read straight into the shard,
  // so a load needs no second copy of the table. Should a read fail after the checks (an I/O
  // error, a damaged record), the shard is reset to its initial values rather than left half
  // loaded. A records-layout shard onto a disk tier holding the same slots is cloned back into
  // the row file where the file system allows.
  std::string Load(const std::string& dir);

  // Incremental checkpoints. A save or load given a mark (>= 0) records it with every row's
  // version (MarkSaved); a delta then holds the rows whose version changed since (an update or
  // an admit raised it), their optimizer state, steps and versions, one file per shard, and
  // records its own mark. A delta whose base is not the recorded mark is refused: its rows would
  // be relative to another save. A dense shard's delta is the whole shard (Save's file).
  void MarkSaved(int64_t mark);
  int64_t saved_mark() const { return saved_mark_; }
  std::string SaveDelta(const std::string& dir, int rank, int num_servers, int64_t base, int64_t mark);
  // Applies the deltas of a SaveDelta by any number of servers on top of the rows here (a load
  // of the delta's base, or of the delta before it): the rows of this shard among them.
  std::string LoadDelta(const std::string& dir);

  // What this process's shards have written and read for checkpoints, and the seconds spent
  // (files opened to closed, the fsync included): a server's checkpoint rates.
  struct CheckpointCounters {
    int64_t saves = 0, saved_bytes = 0, loads = 0, loaded_bytes = 0;
    int64_t cloned_bytes = 0;  // shared with a row file by a clone (saves and loads), not moved
    double save_seconds = 0, load_seconds = 0;
  };
  static CheckpointCounters Checkpoints();

  // BSP bookkeeping: pushes of not yet applied iterations, kept per worker rank.
  std::map<int64_t, std::vector<Message>> pending;
  std::map<int64_t, int> arrived;
  int64_t applied = -1;
  // Why a step failed part way (a disk tier's I/O error): its rows may be half stepped, so the
  // table answers every request after it with this error, and the job resumes from a checkpoint.
  std::string broken;
  // Sets `broken`; nothing is pending any more (a read waiting on an iteration gets the error).
  void Break(const std::string& why) {
    broken = why;
    ForgetPending();
  }
  // Dynamic tables (ops/admit.cc): the slots admitted at iteration `admit_iteration`, with their
  // keys, so that the same admit sent by every worker that reads the key resets a row once.
  int64_t admit_iteration = -1;
  std::unordered_map<int64_t, int64_t> admitted_keys;

 private:
  // A load's rows replace everything: the BSP pushes and admits of no iteration are pending.
  void ForgetPending();
  std::string FileName(const std::string& dir, int rank, int num_servers) const;
  std::string SaveFile(const std::string& dir, int rank, int num_servers, int64_t* bytes) const;
  std::string LoadFiles(const std::string& dir, int64_t* bytes);
  std::string DeltaFileName(const std::string& dir, int rank, int num_servers) const;
  std::string SaveDeltaFile(const std::string& dir, int rank, int num_servers, int64_t* bytes) const;
  std::string LoadDeltaFiles(const std::string& dir, int64_t* bytes);
  int64_t Unit(int64_t key) const { return dense() ? 0 : slot_(key); }
  // Disk tier: the lines holding keys[0..n) (read from the file, or drawn, where missing),
  // marked dirty with `dirty`; returns them (keys itself in memory, where a key is its slot's
  // index). Lines of earlier requests (BeginRequest) may be evicted, written back first if dirty.
  // std::runtime_error naming the file on an I/O error, the cache as it was.
  const int64_t* Stage(const int64_t* keys, int64_t n, bool dirty, std::vector<int64_t>* lines) const;
  void StageSlots(const int64_t* slots, int64_t n, bool dirty, std::vector<int64_t>* lines);
  // The arrays and the cache at `lines` lines (ResizeLines), grown for a request larger than
  // the cache, shrunk back (its rows written back) once the next one comes (ShrinkLines).
  void ResizeLines(int64_t lines);
  void GrowLines(int64_t lines);
  void ShrinkLines();
  // A record's payload <-> a line: the row as stored, its state, step and version.
  void PackLine(int64_t line, char* out) const;
  void UnpackLine(int64_t line, const char* in);
  void DrawLine(int64_t line, int64_t slot);  // a row never written: its initial values
  // Slots [0, rows) in chunks the cache holds, each staged: fn(first slot, count, lines).
  // A chunk of lines' contents in the order given (a disk tier's save and load), and back.
  struct LineChunk {
    std::vector<char> values;
    std::vector<float> state;
    std::vector<int64_t> steps, versions;
  };
  void CopyOutLines(const int64_t* lines, int64_t m, LineChunk* chunk) const;
  void CopyInLines(const int64_t* lines, int64_t m, const LineChunk& chunk);
  template <typename Fn>
  void ForSlotChunks(bool dirty, Fn&& fn) const;
  // A disk tier's save after header h: every dirty line written back, then the row file cloned
  // (SaveRecords) or, where it cannot be, Save's layout written whole; `how` says which.
  std::string SaveFileOnDisk(FILE* f, const FileHeader& h, int64_t* bytes, std::string* how) const;
  int SaveRecords(FILE* f, const FileHeader& h, int64_t* bytes) const;  // 0 or the errno
  // Disk tier: lines[0..n) written as records slots[0..n); every dirty line from `from` on
  // written back (clean after). "" or the error.
  std::string WriteLines(const int64_t* lines, const int64_t* slots, int64_t n);
  std::string WriteBackLines(int64_t from = 0);
  void CatchUpUnits(const int64_t* units, int64_t n, int64_t target, bool distinct);
  // LoadFiles' copy of saved slots [ja, jb) of file k on a disk tier: a chunk of this shard's
  // slots at a time, fill(ka, kb, first slot, chunk) puts the file's slots [ka, kb) among them
  // ("" or the error); `most` grows to the greatest step and version loaded.
  template <typename Fill>
  std::string LoadOnDisk(const RowPlacement& from, int k, int64_t ja, int64_t jb, Fill&& fill,
                         std::pair<int64_t, int64_t>* most);
  // LoadFiles' copy of saved slots [ja, jb) of records-layout file k (recode: null when the
  // storage types match): cloned into a disk tier's row file where it can be, else read.
  std::string LoadRecords(FILE* f, const std::string& path, const RecordsHeader& h, const RowPlacement& from, int k,
                          int64_t ja, int64_t jb, const Recode* recode, std::pair<int64_t, int64_t>* most);
  // Rows are visited in key order but scattered in memory: start loading a few ahead.
  static constexpr int64_t kAhead = 8;
  static constexpr int64_t kParallelRows = 4096;  // below this a thread costs more than it saves
  void Prefetch(int64_t r) const {
    const char* row = values_.data() + r * row_bytes_;
    for (int64_t b = 0; b < row_bytes_; b += 64) __builtin_prefetch(row + b);
  }
  // One optimizer step of the rows keys[b..e) (distinct, of this shard) with grads[i * width].
  void StepRows(const int64_t* keys, int64_t b, int64_t e, const float* grads, const int64_t* counts, float lr);
  // Before an update adding at most `version_add` to a version and `steps` to a step count (with
  // `set_steps`: setting them to at most that): 64-bit counters if a count could pass 2^31 - 1.
  void ReserveCounters(int64_t version_add, int64_t steps = 1, bool set_steps = false);

  std::string name_;
  pb::TableSpec spec_;
  hetu::optim::Config cfg_;
  RowPlacement placement_;
  int rank_;
  SlotIndex slot_;  // where each of this shard's rows sits
  int64_t rows_, unit_width_, units_;
  int64_t unit_state_width_;  // optimizer state floats per unit
  int storage_;                // hetu::storage::Type of values_
  int64_t row_bytes_;          // width() elements of that type
  float* dense_values() { return reinterpret_cast<float*>(values_.data()); }  // a dense shard's float32
  // Disk tier: the row file, which line holds which slot, the table's slots (slot_ is then
  // the identity over lines), the lines asked for, and what the cache did.
  std::unique_ptr<RowFile> file_;
  std::unique_ptr<LineCache> cache_;
  SlotIndex disk_slot_;
  int64_t asked_lines_ = 0, line_capacity_ = 0;  // the lines asked for, and the most allocated
  int64_t lines_;              // units in the arrays below: units_, or a disk tier's lines
  HugeArray<char> values_;     // rows in slot (line) order, row_bytes_ each
  HugeArray<float> state_;
  UnitCounters counters_;      // every unit's step count and version
  // Incremental checkpoints: every unit's version at the marked save (its low 32 bits: a
  // version only rises, and never by 2^32 between two saves), and that save's mark (-1: none).
  HugeArray<uint32_t> saved_versions_;
  int64_t saved_mark_ = -1;
};

}  // namespace ps
