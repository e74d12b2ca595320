// The disk tier of a table's shard (docs/design.md, "Disk tier"): the shard's rows live in a
// file on the server's disk, one record per slot, and a bounded set of cache lines holds the
// rows in use. TableShard keeps its arrays (values, optimizer state, counters) as the lines, and
// stages every request's rows into them first; the ops then run on lines as they run on slots.
//
// Two classes, one job each:
// - RowFile: the records on disk, read and written in batches by positioned I/O on a pool of
//   threads of its own, each record checked by a hash when read.
// - LineCache: which slot each line holds, which lines are dirty, and which line to evict next
//   (CLOCK); lines a request uses are pinned until the next request.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/flat_map.h"

namespace hetu {
class Pool;
}

namespace ps {

class RowFile {
 public:
  // A record: `payload` bytes (the row, its state, step and version), then an 8-byte hash.
  // Creates `path` empty (a file of earlier server runs is replaced: checkpoints, not this file,
  // are what survives a server), sized for `records`, and holds an exclusive flock on it (a
  // second server given the same file is refused); std::runtime_error naming it otherwise.
  RowFile(const std::string& path, int64_t records, int64_t payload);
  ~RowFile();
  RowFile(const RowFile&) = delete;
  RowFile& operator=(const RowFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t payload() const { return payload_; }
  int64_t record_bytes() const { return payload_ + 8; }
  // Whether record r was ever written (records never written hold the initial row).
  bool written(int64_t r) const { return (written_[r >> 6] >> (r & 63)) & 1; }
  // Every record unwritten again; the file's blocks are given back.
  void Clear();
  // The written bits, record r's at bit r % 64 of word r / 64 (a checkpoint keeps them beside
  // a clone of the records).
  const std::vector<uint64_t>& written_words() const { return written_; }
  // Whether `record` (payload bytes, then the hash Write put after them) is record `id` as the
  // tier wrote it: Read's check, for copies of the records elsewhere (a cloned checkpoint).
  static bool Sealed(const char* record, int64_t payload, int64_t id);

  // Clones (docs/design.md, "Disk tier"): the file system shares the records' blocks between
  // the row file and a checkpoint instead of copying them. Each returns 0 or the errno;
  // CannotClone(errno) says the file system cannot clone these files (another file system, or
  // one without reflinks: ext4, tmpfs) and the caller copies the records instead.
  // The records into dest_fd from byte `at` on (a multiple of its file system's block; dest_fd
  // ends at or before `at`, and grows to hold the records), then synced to disk.
  int CloneTo(int dest_fd, int64_t at) const;
  // The records become those of src_fd from byte `at` on (to its end), with these written bits;
  // on an error the file is cleared (no record written).
  int CloneFrom(int src_fd, int64_t at, const std::vector<uint64_t>& written);
  static bool CannotClone(int error);

  // Records ids[0..n) to/from buffers[i] (payload bytes each, a record's hash added / checked).
  // "" or one line naming the file, the record and the error (a short read is a truncated file,
  // a hash that does not match a damaged record).
  std::string Write(const int64_t* ids, int64_t n, char* const* buffers);
  std::string Read(const int64_t* ids, int64_t n, char* const* buffers) const;

  // What the disk was asked for: records, bytes, and the seconds the batches took.
  struct Counters {
    int64_t reads = 0, writes = 0, read_bytes = 0, written_bytes = 0;
    double read_seconds = 0, write_seconds = 0;
  };
  // Every row file's of this process (a stats request reads them from another thread).
  static Counters Totals();

 private:
  std::string path_;
  int fd_ = -1;
  int64_t records_, payload_;
  std::vector<uint64_t> written_;
  std::unique_ptr<hetu::Pool> pool_;
};

class LineCache {
 public:
  explicit LineCache(int64_t lines) { Grow(lines); }
  int64_t lines() const { return static_cast<int64_t>(slot_of_.size()); }
  int64_t held() const { return static_cast<int64_t>(where_.size()); }
  // The line holding `slot`, or -1.
  int64_t Find(int64_t slot) const {
    const int64_t* line = where_.Find(slot);
    return line ? *line : -1;
  }
  // A new request: the lines of the last one are no longer pinned.
  void NextRequest() { ++request_; }
  void Use(int64_t line, bool dirty) {
    ref_[line] = 1;
    pinned_[line] = request_;
    dirty_[line] = dirty_[line] | dirty;
  }
  // A line no request pins now, preferring free ones, then ones not used since the hand last
  // passed (CLOCK); -1 when every line is pinned (the cache must grow).
  int64_t Victim();
  int64_t slot_of(int64_t line) const { return slot_of_[line]; }
  bool dirty(int64_t line) const { return dirty_[line]; }
  void Clean(int64_t line) { dirty_[line] = 0; }
  void Drop(int64_t line);                  // the line holds nothing now
  void Hold(int64_t line, int64_t slot);    // the line holds `slot` (pinned, clean)
  void Grow(int64_t lines);                 // more lines, all free
  void Shrink(int64_t lines);               // fewer lines: those cut must be free
  void Clear();                             // every line free

 private:
  hetu::FlatMap<int64_t> where_;  // slot -> line
  std::vector<int64_t> slot_of_;  // line -> slot, -1 free
  std::vector<uint8_t> ref_, dirty_;
  std::vector<uint64_t> pinned_;  // the request that last used the line
  uint64_t request_ = 1;
  int64_t hand_ = 0;
};

}  // namespace ps
