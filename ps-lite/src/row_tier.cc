#include "row_tier.h"

#include <fcntl.h>
#include <linux/fs.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>

#include "common/parallel.h"

namespace ps {
namespace {

// A record's check: a 64-bit mix of its bytes and its id, so that a record read from another
// place (a misdirected write) fails too.
uint64_t RecordHash(const char* p, int64_t n, int64_t id) {
  uint64_t h = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(id);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0xFF51AFD7ED558CCDull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 32);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Threads for a batch of records: I/O waits on the disk, not the CPU, so more threads than
// cores keep more requests in flight (PS_TABLE_IO_THREADS, default 8).
int IoThreads() {
  const char* env = std::getenv("PS_TABLE_IO_THREADS");
  const int n = env ? std::atoi(env) : 8;
  return n >= 1 ? n : 8;
}

std::atomic<int64_t> g_reads{0}, g_writes{0}, g_read_bytes{0}, g_written_bytes{0};
std::atomic<double> g_read_seconds{0}, g_write_seconds{0};

void Add(std::atomic<double>& total, double x) {
  total.store(total.load(std::memory_order_relaxed) + x, std::memory_order_relaxed);
}

// Batches under this many records run on the calling thread: a thread hand-off costs more.
constexpr int64_t kRecordsPerThread = 64;

}  // namespace

RowFile::RowFile(const std::string& path, int64_t records, int64_t payload)
    : path_(path), records_(records), payload_(payload), written_((records + 63) / 64, 0) {
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd_ < 0) throw std::runtime_error("cannot create the table's row file " + path + ": " + std::strerror(errno));
  // One server at a time: another (a second job given the same folder) would overwrite its rows.
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("the table's row file " + path + " is in use by another server (two jobs given the "
                             "same --table-dir?)");
  }
  // Emptied, then sized: its blocks are allocated as records are written.
  if (::ftruncate(fd_, 0) != 0 || ::ftruncate(fd_, static_cast<off_t>(records * record_bytes())) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd_);
    ::unlink(path.c_str());
    throw std::runtime_error("cannot size the table's row file " + path + ": " + why);
  }
  pool_ = std::make_unique<hetu::Pool>(IoThreads());
}

RowFile::~RowFile() {
  if (fd_ >= 0) {
    // The rows die with the server (its checkpoints hold them); unlinked before the lock goes,
    // so that a server starting now makes a file of its own.
    ::unlink(path_.c_str());
    ::close(fd_);
  }
}

void RowFile::Clear() {
  std::fill(written_.begin(), written_.end(), 0);
  if (::ftruncate(fd_, 0) == 0) (void)!::ftruncate(fd_, static_cast<off_t>(records_ * record_bytes()));
}

bool RowFile::Sealed(const char* record, int64_t payload, int64_t id) {
  uint64_t h;
  std::memcpy(&h, record + payload, 8);
  return h == RecordHash(record, payload, id);
}

namespace {

// FICLONERANGE of src's bytes [src_at, src_at + bytes) to dest at dest_at: 0 or the errno.
int CloneRange(int src, int64_t src_at, int64_t bytes, int dest, int64_t dest_at) {
  if (bytes == 0) return 0;
  file_clone_range range{};
  range.src_fd = src;
  range.src_offset = static_cast<uint64_t>(src_at);
  range.src_length = static_cast<uint64_t>(bytes);
  range.dest_offset = static_cast<uint64_t>(dest_at);
  return ::ioctl(dest, FICLONERANGE, &range) == 0 ? 0 : errno;
}

// 0 when the files are on one file system, else EXDEV (or fstat's errno).
int OneFileSystem(int a, int b) {
  struct stat sa, sb;
  if (::fstat(a, &sa) != 0 || ::fstat(b, &sb) != 0) return errno;
  return sa.st_dev == sb.st_dev ? 0 : EXDEV;
}

}  // namespace

int RowFile::CloneTo(int dest_fd, int64_t at) const {
  // Another file system cannot share blocks: said before the row file is synced for nothing.
  if (const int error = OneFileSystem(fd_, dest_fd)) return error;
  // The clone writes the records' dirty pages out first; the sync after it makes them durable
  // (before the caller syncs the clone): a file system that cannot clone costs no sync.
  if (const int error = CloneRange(fd_, 0, records_ * record_bytes(), dest_fd, at)) return error;
  return ::fsync(fd_) == 0 ? 0 : errno;
}

int RowFile::CloneFrom(int src_fd, int64_t at, const std::vector<uint64_t>& written) {
  Clear();
  if (const int error = OneFileSystem(src_fd, fd_)) return error;
  const int error = CloneRange(src_fd, at, records_ * record_bytes(), fd_, 0);
  if (error) {
    Clear();
    return error;
  }
  std::copy(written.begin(), written.begin() + std::min(written.size(), written_.size()), written_.begin());
  return 0;
}

bool RowFile::CannotClone(int error) {
  return error == EXDEV || error == EOPNOTSUPP || error == ENOTTY || error == EINVAL || error == ENOSYS;
}

namespace {

// Runs io(i, record) for every i in [0, n) on `pool`, each chunk of records with a buffer of
// `record_bytes`; io returns "" or its error, and the batch stops at the first. The I/O threads
// rest afterwards: requests come a step apart, and they sleep rather than spin between them.
template <typename Io>
std::string RunBatch(hetu::Pool& pool, int64_t n, int64_t record_bytes, Io&& io) {
  std::mutex mu;
  std::string first;  // the first error, under mu
  std::atomic<bool> failed{false};
  pool.parallel_for(n, kRecordsPerThread, [&](int64_t b, int64_t e) {
    std::vector<char> record(record_bytes);
    for (int64_t i = b; i < e && !failed.load(std::memory_order_relaxed); ++i) {
      std::string error = io(i, record.data());
      if (error.empty()) continue;
      std::lock_guard<std::mutex> lock(mu);
      if (first.empty()) first = std::move(error);
      failed.store(true);
      return;
    }
  });
  pool.Rest();
  return first;
}

}  // namespace

std::string RowFile::Write(const int64_t* ids, int64_t n, char* const* buffers) {
  if (n == 0) return "";
  const double start = Now();
  const int64_t rb = record_bytes();
  const std::string error = RunBatch(*pool_, n, rb, [&](int64_t i, char* record) -> std::string {
    std::memcpy(record, buffers[i], payload_);
    const uint64_t h = RecordHash(record, payload_, ids[i]);
    std::memcpy(record + payload_, &h, 8);
    const off_t at = static_cast<off_t>(ids[i] * rb);
    for (int64_t done = 0; done < rb;) {
      const ssize_t k = ::pwrite(fd_, record + done, rb - done, at + done);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0)
        return "writing record " + std::to_string(ids[i]) + " of " + path_ + " failed: " +
               std::strerror(k < 0 ? errno : ENOSPC);
      done += k;
    }
    return "";
  });
  Add(g_write_seconds, Now() - start);
  if (!error.empty()) return error;
  for (int64_t i = 0; i < n; ++i) written_[ids[i] >> 6] |= uint64_t(1) << (ids[i] & 63);
  g_writes.fetch_add(n, std::memory_order_relaxed);
  g_written_bytes.fetch_add(n * rb, std::memory_order_relaxed);
  return "";
}

std::string RowFile::Read(const int64_t* ids, int64_t n, char* const* buffers) const {
  if (n == 0) return "";
  const double start = Now();
  const int64_t rb = record_bytes();
  const std::string error = RunBatch(*pool_, n, rb, [&](int64_t i, char* record) -> std::string {
    const off_t at = static_cast<off_t>(ids[i] * rb);
    std::string why;
    for (int64_t done = 0; done < rb && why.empty();) {
      const ssize_t k = ::pread(fd_, record + done, rb - done, at + done);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) why = std::strerror(errno);
      else if (k == 0) why = "the file ends at byte " + std::to_string(at + done) + " (truncated)";
      else done += k;
    }
    if (why.empty() && !Sealed(record, payload_, ids[i])) why = "its check does not match (a damaged record)";
    if (!why.empty()) return "reading record " + std::to_string(ids[i]) + " of " + path_ + " failed: " + why;
    std::memcpy(buffers[i], record, payload_);
    return "";
  });
  Add(g_read_seconds, Now() - start);
  if (!error.empty()) return error;
  g_reads.fetch_add(n, std::memory_order_relaxed);
  g_read_bytes.fetch_add(n * rb, std::memory_order_relaxed);
  return "";
}

RowFile::Counters RowFile::Totals() {
  Counters c;
  c.reads = g_reads.load(std::memory_order_relaxed);
  c.writes = g_writes.load(std::memory_order_relaxed);
  c.read_bytes = g_read_bytes.load(std::memory_order_relaxed);
  c.written_bytes = g_written_bytes.load(std::memory_order_relaxed);
  c.read_seconds = g_read_seconds.load(std::memory_order_relaxed);
  c.write_seconds = g_write_seconds.load(std::memory_order_relaxed);
  return c;
}

int64_t LineCache::Victim() {
  const int64_t n = lines();
  // Two turns of the hand: the first may only clear reference bits.
  for (int64_t tried = 0; tried < 2 * n; ++tried) {
    const int64_t line = hand_;
    hand_ = hand_ + 1 == n ? 0 : hand_ + 1;
    if (pinned_[line] == request_) continue;
    if (slot_of_[line] < 0) return line;
    if (ref_[line]) {
      ref_[line] = 0;
      continue;
    }
    return line;
  }
  return -1;
}

void LineCache::Drop(int64_t line) {
  if (slot_of_[line] >= 0) where_.Erase(slot_of_[line]);
  slot_of_[line] = -1;
  dirty_[line] = ref_[line] = 0;
}

void LineCache::Hold(int64_t line, int64_t slot) {
  slot_of_[line] = slot;
  where_.Insert(slot, line);
  ref_[line] = 1;
  dirty_[line] = 0;
  pinned_[line] = request_;
}

void LineCache::Grow(int64_t lines) {
  const int64_t had = this->lines();
  if (lines <= had) return;
  slot_of_.resize(lines, -1);
  ref_.resize(lines, 0);
  dirty_.resize(lines, 0);
  pinned_.resize(lines, 0);
  where_.reserve(static_cast<size_t>(lines));
  hand_ = had;  // the new, free lines first
}

void LineCache::Shrink(int64_t lines) {
  slot_of_.resize(lines);
  ref_.resize(lines);
  dirty_.resize(lines);
  pinned_.resize(lines);
  hand_ = 0;
}

void LineCache::Clear() {
  for (int64_t line = 0; line < lines(); ++line)
    if (slot_of_[line] >= 0) Drop(line);
}

}  // namespace ps
