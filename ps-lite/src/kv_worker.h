// KVWorker: turns one table operation into one message per server (keys split by the table's
// RowPlacement), tracked as one Request by the Customer. Arrays are sent without copying when
// a server's keys are a contiguous run of the caller's arrays; the caller keeps them alive
// until the request finishes.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "common/storage.h"
#include "customer.h"
#include "kv.h"
#include "postoffice.h"
#include "row_placement.h"

namespace ps {

// Rows a worker writes back to the servers (values in the table's storage type, optimizer
// state, step counts, version increments), sent with its push (Herald's owner-computed rows).
struct WriteBack {
  const int64_t* keys = nullptr;
  int64_t n = 0;
  const void* values = nullptr;
  const float* state = nullptr;
  const int64_t* steps = nullptr;
  const int64_t* version_add = nullptr;
};

struct TableRef {
  std::string name;
  int64_t rows = 0, width = 0, state_width = 0;  // state_width: optimizer state floats per row
  bool dense = false;
  int storage = hetu::storage::kF32;  // the type rows are stored and moved in (gradients: float32)
  int64_t row_bytes() const { return width * hetu::storage::bytes(storage); }
};

class KVWorker {
 public:
  KVWorker(Postoffice* po, Customer* customer);

  std::shared_ptr<Request> Init(const std::string& name, const pb::TableSpec& spec);
  // op: kPush or kPushPull. iteration < 0: apply on arrival (ASP). Under BSP every server
  // gets a message, empty if it owns none of the keys, so it can count this worker in. With a
  // write-back (kPush only) every server gets one too; each applies its rows of the write-back,
  // then takes the push, so one message does what kAssign followed by kPush do.
  std::shared_ptr<Request> Push(const TableRef& t, int op, const int64_t* keys, int64_t n, const float* grads,
                                const int64_t* counts, int64_t iteration, float lr,
                                const WriteBack* write_back = nullptr);
  std::shared_ptr<Request> Pull(const TableRef& t, const int64_t* keys, int64_t n, int64_t iteration);
  // with_state: the rows that come back bring their optimizer state and steps.
  std::shared_ptr<Request> PullStale(const TableRef& t, const int64_t* keys, const int64_t* versions, int64_t n,
                                     int64_t bound, int64_t iteration = -1, bool with_state = false);
  // with_state (optional, a byte per key): state, steps and versions only for the keys marked 1.
  std::shared_ptr<Request> PullState(const TableRef& t, const int64_t* keys, int64_t n, int64_t iteration = -1,
                                     const uint8_t* with_state = nullptr);
  std::shared_ptr<Request> Assign(const TableRef& t, const int64_t* keys, int64_t n, const void* values,
                                  const float* state, const int64_t* steps, const int64_t* version_add);
  // kSave, kLoad (path) or kClear, on every server.
  std::shared_ptr<Request> Admin(const TableRef& t, int op, const std::string& path);
  // kStats of every server: what each has served (KVServer::Counters), one part per server.
  std::shared_ptr<Request> Stats();

 private:
  std::shared_ptr<Request> NewRequest(const TableRef& t, int op);
  void Partition(const TableRef& t, const int64_t* keys, int64_t n, bool all_servers, Request* req);
  void PartitionDense(const TableRef& t, Request* req);
  void AllServers(Request* req);
  // Sends one message per part; fill() adds the part's meta fields and blobs. chunk_rows > 0:
  // a part of more keys goes as several messages of at most that many (kv.h).
  void Send(const std::shared_ptr<Request>& req, const std::string& table,
            const std::function<void(Message&, const Part&)>& fill, int64_t chunk_rows = 0);
  // Rows per chunk of a sparse pull's answer or push of table t, `row_bytes` a row (0: no chunks).
  int64_t ChunkRows(const TableRef& t, int64_t row_bytes) const;

  Postoffice* po_;
  Customer* customer_;
  int64_t chunk_bytes_;  // PS_CHUNK_BYTES
  RowPlacement::Kind placement_;  // PS_ROW_PLACEMENT: how embedding tables' rows are spread
};

// The part's rows of an array with `per` elements per key: a view when contiguous, else a copy.
template <typename T>
Blob SliceOf(const Part& p, const T* data, int64_t per) {
  if (p.contiguous) return Blob::View(data + p.begin * per, (p.end - p.begin) * per * sizeof(T));
  T* out;
  Blob b = Blob::Alloc<T>(p.pos.size() * per, &out);
  for (size_t i = 0; i < p.pos.size(); ++i)
    std::copy(data + p.pos[i] * per, data + (p.pos[i] + 1) * per, out + i * per);
  return b;
}

}  // namespace ps
