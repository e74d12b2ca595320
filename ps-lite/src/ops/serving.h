// What an op's server handler (OpDef::serve) works with: the request, its table, the server's
// shared steps (KVServer), and the checks of a request's blobs.
#pragma once
#include <string>
#include <vector>

#include "kv_server.h"

namespace ps {

struct Serving {
  KVServer& server;
  Message& msg;
  KVServer::Entry* entry;  // the request's table; null for an op on no table (kNoTable)
  bool* push_done;         // a push-pull's push half is taken (it may come back deferred)

  TableShard& table() const { return *entry->shard; }
  void Reply(std::vector<Blob> data, const std::string& error) { server.Reply(msg, std::move(data), error); }
};

// Whether a save or load of the request's path (meta path) falls outside the job's checkpoints
// (ops/admin.cc, HETU_CHECKPOINT_ROOT): if so it is logged (rate-limited) and answered with the
// reason. `what`: "save", "load", "delta save" ...
bool Refused(Serving& s, const char* what);

// Blob i must hold exactly n elements of T; "" or the error.
template <typename T>
std::string Expect(const Message& msg, size_t i, int64_t n, const char* what, const std::string& table) {
  if (msg.data.size() <= i) return "table '" + table + "': request has no " + what;
  if (msg.data[i].size != static_cast<size_t>(n) * sizeof(T))
    return "table '" + table + "': " + what + " has " + std::to_string(msg.data[i].size / sizeof(T)) +
           " elements, expected " + std::to_string(n);
  return "";
}

// Blob i must hold n rows as the table stores them; "" or the error.
std::string RowBytes(const Message& msg, size_t i, int64_t n, const TableShard& t);

inline int64_t NumKeys(const Message& msg) {
  return msg.data.empty() ? 0 : static_cast<int64_t>(msg.data[0].count<int64_t>());
}

// Writes the rows of the kAssign-shaped blobs starting at data[first]; "" or the error
// (ops/assign.cc; a push's write-back has the same blobs).
std::string AssignRows(TableShard& t, const Message& msg, size_t first);

// The rows of a pull for `iteration` (ops/pull.cc), also the answer of a push-pull.
bool ServePull(Serving& s, int64_t iteration);

// Rows reset by admits in this process so far (ops/admit.cc), for the server's stats.
int64_t AdmittedRows();

}  // namespace ps
