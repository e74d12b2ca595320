#include "kv_worker.h"

#include <algorithm>
#include <cstdlib>

#include "row_placement.h"

namespace ps {

KVWorker::KVWorker(Postoffice* po, Customer* customer)
    : po_(po), customer_(customer), placement_(po->config().row_placement) {
  // A chunk of rows is what the van moves while the server gathers (or steps) the next one:
  // 512 KiB (1024 rows of 128 floats) keeps both busy with little per-message cost.
  const char* env = std::getenv("PS_CHUNK_BYTES");
  chunk_bytes_ = env ? std::atoll(env) : (int64_t(512) << 10);
}

int64_t KVWorker::ChunkRows(const TableRef& t, int64_t row_bytes) const {
  if (chunk_bytes_ <= 0 || t.dense || row_bytes <= 0) return 0;
  return std::max<int64_t>(1, chunk_bytes_ / row_bytes);
}

std::shared_ptr<Request> KVWorker::NewRequest(const TableRef& t, int op) {
  auto req = std::make_shared<Request>();
  req->what = std::string(OpName(op)) + " of table '" + t.name + "'";
  req->op = op;
  req->width = t.width;
  req->dense = t.dense;
  req->state_width = t.state_width;
  req->storage = t.storage;
  req->row_bytes = t.row_bytes();
  return req;
}

void KVWorker::AllServers(Request* req) {
  for (int s = 0; s < po_->num_servers(); ++s) {
    Part p;
    p.node = po_->ServerId(s);
    req->parts.push_back(std::move(p));
  }
}

void KVWorker::Partition(const TableRef& t, const int64_t* keys, int64_t n, bool all_servers, Request* req) {
  req->num_keys = n;
  const int S = po_->num_servers();
  // Keys outside the table go to some server, which rejects them with a clear error.
  const RowPlacement placement = RowPlacement::Of(placement_, t.dense, t.rows, S);
  std::vector<int> sv(n);
  bool grouped = true;
  for (int64_t i = 0; i < n; ++i) {
    sv[i] = placement.Server(keys[i]);
    if (i && sv[i] < sv[i - 1]) grouped = false;
  }
  std::vector<Part> parts(S);
  for (int s = 0; s < S; ++s) parts[s].node = po_->ServerId(s);
  if (grouped) {
    for (int64_t i = 0; i < n;) {
      int64_t j = i;
      while (j < n && sv[j] == sv[i]) ++j;
      parts[sv[i]].begin = i;
      parts[sv[i]].end = j;
      i = j;
    }
  } else {
    for (auto& p : parts) p.contiguous = false;
    for (int64_t i = 0; i < n; ++i) parts[sv[i]].pos.push_back(i);
  }
  for (auto& p : parts)
    if (all_servers || p.size() > 0) req->parts.push_back(std::move(p));
}

void KVWorker::PartitionDense(const TableRef& t, Request* req) {
  req->num_keys = t.rows * t.width;
  const RowPlacement placement = RowPlacement::Of(placement_, true, t.rows, po_->num_servers());
  for (int s = 0; s < po_->num_servers(); ++s) {
    Part p;
    p.node = po_->ServerId(s);
    p.begin = placement.First(s) * t.width;  // dense parts count elements, not rows
    p.end = (placement.First(s) + placement.Rows(s)) * t.width;
    req->parts.push_back(std::move(p));
  }
}

void KVWorker::Send(const std::shared_ptr<Request>& req, const std::string& table,
                    const std::function<void(Message&, const Part&)>& fill, int64_t chunk_rows) {
  const int64_t ts = customer_->Track(req);
  if (ts == 0) return;  // the job already failed; the request carries the error
  for (const Part& p : req->parts) {
    const bool chunked = chunk_rows > 0 && p.size() > chunk_rows;
    for (int64_t off = 0;;) {
      Message msg;
      msg.meta.set_request(true);
      msg.meta.set_timestamp(ts);
      msg.meta.set_op(req->op);
      msg.meta.set_table(table);
      const int64_t end = chunked ? std::min(p.size(), off + chunk_rows) : p.size();
      if (chunked) {
        msg.meta.set_chunked(true);
        msg.meta.set_offset(off);
        msg.meta.set_more(end < p.size());
      }
      fill(msg, chunked ? p.Piece(off, end) : p);
      if (!po_->Send(p.node, &msg)) {
        Message fail;
        fail.meta.set_timestamp(ts);
        fail.meta.set_sender(p.node);
        fail.meta.set_error("cannot send to " + po_->Describe(p.node));
        customer_->OnResponse(fail);
        break;
      }
      if (end >= p.size()) break;
      off = end;
    }
  }
}

}  // namespace ps
