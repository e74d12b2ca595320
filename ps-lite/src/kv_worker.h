// KVWorker: what turns one table operation (ops/*.cc) into one message per server (keys split
// by the table's RowPlacement), tracked as one Request by the Customer. Arrays are sent without
// copying when a server's keys are a contiguous run of the caller's arrays; the caller keeps
// them alive until the request finishes.
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

  // What an op's request is made of (each op's file under ops/ sends its own): a request for
  // table t, its parts (one per server), and their messages.
  std::shared_ptr<Request> NewRequest(const TableRef& t, int op);
  // Parts by the servers that own the keys; all_servers: also an empty part for every other.
  void Partition(const TableRef& t, const int64_t* keys, int64_t n, bool all_servers, Request* req);
  void PartitionDense(const TableRef& t, Request* req);
  void AllServers(Request* req);
  // Sends one message per part; fill() adds the part's meta fields and blobs. chunk_rows > 0:
  // a part of more keys goes as several messages of at most that many (kv.h).
  void Send(const std::shared_ptr<Request>& req, const std::string& table,
            const std::function<void(Message&, const Part&)>& fill, int64_t chunk_rows = 0);
  // Rows per chunk of a sparse pull's answer or push of table t, `row_bytes` a row (0: no chunks).
  int64_t ChunkRows(const TableRef& t, int64_t row_bytes) const;
  RowPlacement::Kind placement() const { return placement_; }  // PS_ROW_PLACEMENT

 private:
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
