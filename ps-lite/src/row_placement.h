// Which server holds each row of a table, and where among that server's rows: the one rule that
// workers (splitting keys), servers (indexing, initial values, loading checkpoints saved by
// another server count) and counters share.
//
// Ids are numbered most frequent first within each field, so contiguous ranges put the hot heads
// of the first fields on one server. Strided placement (row r on server r mod S, at local slot
// r div S) deals every run of ids out over all servers. Either way a server's rows are an
// arithmetic progression, First(s) + i * Stride() for i < Rows(s), in increasing row order.
//
// Dense tensors stay in contiguous ranges whatever the choice: they are pulled and pushed whole,
// so every server serves its share of each request anyway.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>

namespace ps {

// A server's local slot of one of its rows, (row - first) / stride, without the division when
// the rows are contiguous: it runs once per row in the gather and step loops.
struct SlotIndex {
  int64_t first = 0, stride = 1;
  int64_t operator()(int64_t row) const { return stride == 1 ? row - first : (row - first) / stride; }
};

class RowPlacement {
 public:
  enum Kind : int32_t { kStrided = 0, kContiguous = 1 };
  // PS_ROW_PLACEMENT: "strided" (the default) or "contiguous"; std::runtime_error naming the
  // variable otherwise.
  static Kind KindFromEnv();
  static const char* Name(Kind kind);
  // The placement of a table's rows: `kind` for embedding tables, contiguous for dense ones.
  static RowPlacement Of(Kind kind, bool dense, int64_t rows, int num_servers) {
    return RowPlacement(dense ? kContiguous : kind, rows, num_servers);
  }

  RowPlacement(Kind kind, int64_t rows, int num_servers);

  Kind kind() const { return kind_; }
  int64_t rows() const { return rows_; }
  int num_servers() const { return servers_; }
  // The server of any key; keys outside [0, rows) go to a server that rejects them.
  int Server(int64_t row) const {
    if (row < 0 || servers_ == 1) return 0;
    if (kind_ == kStrided) return static_cast<int>(row % servers_);
    return static_cast<int>(std::min<int64_t>(servers_ - 1, row / per_));
  }
  // The first row of `server` (contiguous: rows when it holds none).
  int64_t First(int server) const { return kind_ == kStrided ? server : std::min(rows_, server * per_); }
  int64_t Stride() const { return kind_ == kStrided ? servers_ : 1; }
  int64_t Rows(int server) const;  // how many rows `server` holds
  // Where `server` keeps its rows: row r of it at slot Slots(server)(r).
  SlotIndex Slots(int server) const { return SlotIndex{First(server), Stride()}; }
  int64_t Row(int server, int64_t slot) const { return First(server) + slot * Stride(); }
  bool Holds(int server, int64_t row) const { return row >= 0 && row < rows_ && Server(row) == server; }
  // "rows [4, 8)" or "rows r < 14 with r mod 4 == 3": for error messages.
  std::string Describe(int server) const;

 private:
  Kind kind_;
  int64_t rows_;
  int servers_;
  int64_t per_;  // contiguous: rows per server, ceil(rows / servers)
};

}  // namespace ps
