// KVServer: answers data requests against this server's table shards, one at a time in arrival
// order (so messages from one worker are handled in the order that worker sent them). It looks
// each request's op up (kv.h) and hands it to the op's handler (ops/*.cc), with what every op
// shares: the counters, the table lookup, BSP buffering and deferral, checks, and the reply.
//
// BSP: a push that carries iteration t is buffered per worker rank; when all workers' pushes
// for the oldest pending iteration are in, they are summed in rank order and applied once. A
// pull for iteration t waits (is deferred, with the later messages of the same worker for the
// same table queued behind it) while an iteration <= t-1-staleness is still pending.
#pragma once
#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kv.h"
#include "message.h"
#include "postoffice.h"
#include "table.h"

namespace ps {

class KVServer {
 public:
  explicit KVServer(Postoffice* po);
  void Handle(Message& msg);
  // Whether the Postoffice may handle the request on its receive thread (OpFlag kBrief).
  static bool Brief(const Message& msg) { return OpOf(msg.meta.op()).flags & kBrief; }

  // What this server has served: data requests, embedding rows (the keys of sparse requests),
  // bytes of data both ways, and seconds spent handling requests.
  struct Counters {
    int64_t requests = 0, rows = 0, bytes = 0;
    double busy_seconds = 0;
  };
  Counters counters() const;

  struct Deferred {
    Message msg;
    bool push_done = false;  // push-pull whose push half is already buffered
  };
  struct Entry {
    std::unique_ptr<TableShard> shard;
    std::deque<Deferred> deferred;
  };

  // ---- what the ops' handlers (ops/*.cc) share ----------------------------------------------
  Postoffice& po() const { return *po_; }
  // The table named `name` on this server; null if it has none of that name.
  Entry* Find(const std::string& name);
  Entry& Create(const std::string& name, const pb::TableSpec& spec);

  // offset >= 0: the answer is one chunk of the part, its first key at `offset` (kv.h).
  void Reply(const Message& req, std::vector<Blob> data, const std::string& error, int64_t offset = -1,
             bool more = false);
  // A sparse read's keys (data[0]), checked against the shard once `error` (an earlier check
  // of the message) is empty; false after answering the request with the error.
  bool ReadKeys(const TableShard& t, const Message& msg, int64_t n, const int64_t** keys, std::string error = "");
  // Whether a read for `iteration` may be served now (BSP/SSP); else it waits.
  bool Servable(const TableShard& t, const Message& msg, int64_t iteration) const;
  // Takes a push's gradients in (applied now, or buffered under BSP); "" or the error.
  std::string TakePush(Entry& e, Message& msg);
  // A chunked push is answered once, after its last chunk, with the first error of its chunks:
  // false while more chunks are to come (the chunk's error `err` kept), true at the last (`err`
  // then the push's first error).
  bool LastChunk(const Message& msg, std::string* err);

 private:
  // Hands the request to its op's handler; false: the request must wait (a read whose
  // iteration is not servable yet).
  bool Process(Entry& e, Message& msg, bool* push_done);
  bool SafeProcess(Entry& e, Message& msg, bool* push_done);  // errors become the reply

  // BSP. Buffer keeps a push (its gradients only when `valid`) as its worker's message for its
  // iteration; "" or why it cannot (late, or a second one).
  std::string Buffer(Entry& e, const Message& msg, bool valid);
  void TryApply(Entry& e);
  // Processes the request now, or defers it behind its sender's deferred ones.
  void Admit(Entry& e, Message& msg);
  void ServeDeferred(Entry& e);

  Postoffice* po_;
  std::map<std::string, Entry> tables_;
  // Written by the one thread handling data at a time (postoffice.h), read from others.
  std::atomic<int64_t> requests_{0}, rows_{0}, bytes_{0};
  std::atomic<double> busy_seconds_{0};
  // The first error of a chunked push whose last chunk has not come yet, by (sender, timestamp).
  std::map<std::pair<int, int64_t>, std::string> chunk_errors_;
};

}  // namespace ps
