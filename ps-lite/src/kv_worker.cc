#include "kv_worker.h"

#include <algorithm>
#include <cstdlib>

#include "row_placement.h"

namespace ps {

namespace {

bool StrictlyIncreasing(const int64_t* keys, int64_t n) {
  for (int64_t i = 1; i < n; ++i)
    if (keys[i - 1] >= keys[i]) return false;
  return true;
}

}  // namespace

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

std::shared_ptr<Request> KVWorker::Init(const std::string& name, const pb::TableSpec& spec) {
  TableRef t;
  t.name = name;
  auto req = NewRequest(t, kInit);
  AllServers(req.get());
  Send(req, name, [&](Message& m, const Part&) {
    *m.meta.mutable_spec() = spec;
    m.meta.mutable_spec()->set_placement(placement_);  // the servers place rows as this worker splits keys
  });
  return req;
}

std::shared_ptr<Request> KVWorker::Push(const TableRef& t, int op, const int64_t* keys, int64_t n, const float* grads,
                                        const int64_t* counts, int64_t iteration, float lr,
                                        const WriteBack* write_back) {
  auto req = NewRequest(t, op);
  const bool bsp = iteration >= 0;
  if (t.dense) PartitionDense(t, req.get());
  else Partition(t, keys, n, bsp || write_back, req.get());
  Request written;  // the write-back's keys by server
  if (write_back) Partition(t, write_back->keys, write_back->n, true, &written);
  // An ASP push of distinct keys is taken chunk by chunk, as if each were a push of its own
  // (same steps, same versions): the server steps one chunk while the next is on its way. Only
  // a push the servers will take whole is cut (keys of the table, counts of at least 1), so that
  // a bad one is still refused whole by the server that finds it.
  int64_t chunk = op == kPush && !bsp && !write_back ? ChunkRows(t, t.width * 4) : 0;  // float32 gradients
  if (chunk > 0 && (n <= chunk || !StrictlyIncreasing(keys, n) || keys[0] < 0 || keys[n - 1] >= t.rows)) chunk = 0;
  for (int64_t i = 0; chunk > 0 && counts && i < n; ++i)
    if (counts[i] < 1) chunk = 0;
  Send(req, t.name, [&](Message& m, const Part& p) {
    m.meta.set_lr(lr);
    m.meta.set_has_iteration(bsp);
    m.meta.set_iteration(iteration);
    if (t.dense) {
      if (p.size() > 0) m.data.push_back(SliceOf(p, grads, 1));
      return;
    }
    const Part* wb = nullptr;
    for (const Part& w : written.parts)
      if (w.node == p.node && w.size() > 0) wb = &w;
    if (p.size() == 0 && !wb) return;
    m.data.push_back(SliceOf(p, keys, 1));
    m.data.push_back(SliceOf(p, grads, t.width));
    if (counts) {
      m.meta.set_has_counts(true);
      m.data.push_back(SliceOf(p, counts, 1));
    }
    if (!wb) return;
    m.meta.set_has_write_back(true);
    m.data.push_back(SliceOf(*wb, write_back->keys, 1));
    m.data.push_back(SliceOf(*wb, static_cast<const char*>(write_back->values), t.row_bytes()));
    m.data.push_back(SliceOf(*wb, write_back->state, t.state_width));
    m.data.push_back(SliceOf(*wb, write_back->steps, 1));
    m.data.push_back(SliceOf(*wb, write_back->version_add, 1));
  }, chunk);
  return req;
}

std::shared_ptr<Request> KVWorker::Pull(const TableRef& t, const int64_t* keys, int64_t n, int64_t iteration) {
  auto req = NewRequest(t, kPull);
  if (t.dense) PartitionDense(t, req.get());
  else Partition(t, keys, n, false, req.get());
  // Many rows from several servers: their answers are copied into one result anyway, so they
  // come in chunks, each copied in as it arrives while the servers gather the next ones. (From
  // one server the answer becomes the result as it is, without a copy.)
  const int64_t chunk = ChunkRows(t, t.row_bytes());
  if (chunk > 0 && n > chunk && req->parts.size() > 1) req->rows = Blob::Alloc<char>(n * t.row_bytes(), &req->rows_data);
  Send(req, t.name, [&](Message& m, const Part& p) {
    m.meta.set_has_iteration(iteration >= 0);
    m.meta.set_iteration(iteration);
    if (!t.dense) m.data.push_back(SliceOf(p, keys, 1));
    if (req->rows_data) m.meta.set_chunk_rows(chunk);
  });
  return req;
}

std::shared_ptr<Request> KVWorker::PullStale(const TableRef& t, const int64_t* keys, const int64_t* versions,
                                             int64_t n, int64_t bound, int64_t iteration, bool with_state) {
  auto req = NewRequest(t, kPullStale);
  Partition(t, keys, n, false, req.get());
  Send(req, t.name, [&](Message& m, const Part& p) {
    m.meta.set_arg(bound);
    m.meta.set_with_state(with_state);
    // Like a pull for `iteration`, it waits until the previous iteration is applied (BSP/SSP).
    m.meta.set_has_iteration(iteration >= 0);
    m.meta.set_iteration(iteration);
    m.data.push_back(SliceOf(p, keys, 1));
    m.data.push_back(SliceOf(p, versions, 1));
  });
  return req;
}

std::shared_ptr<Request> KVWorker::PullState(const TableRef& t, const int64_t* keys, int64_t n, int64_t iteration,
                                             const uint8_t* with_state) {
  auto req = NewRequest(t, kPullState);
  Partition(t, keys, n, false, req.get());
  Send(req, t.name, [&](Message& m, const Part& p) {
    m.meta.set_has_iteration(iteration >= 0);  // waits like a pull for `iteration`
    m.meta.set_iteration(iteration);
    m.data.push_back(SliceOf(p, keys, 1));
    if (with_state) {
      m.meta.set_with_state_mask(true);
      m.data.push_back(SliceOf(p, with_state, 1));
    }
  });
  return req;
}

std::shared_ptr<Request> KVWorker::Assign(const TableRef& t, const int64_t* keys, int64_t n, const void* values,
                                          const float* state, const int64_t* steps, const int64_t* version_add) {
  auto req = NewRequest(t, kAssign);
  Partition(t, keys, n, false, req.get());
  Send(req, t.name, [&](Message& m, const Part& p) {
    m.data.push_back(SliceOf(p, keys, 1));
    m.data.push_back(SliceOf(p, static_cast<const char*>(values), t.row_bytes()));
    m.data.push_back(SliceOf(p, state, t.state_width));
    m.data.push_back(SliceOf(p, steps, 1));
    m.data.push_back(SliceOf(p, version_add, 1));
  });
  return req;
}

std::shared_ptr<Request> KVWorker::Admin(const TableRef& t, int op, const std::string& path) {
  auto req = NewRequest(t, op);
  AllServers(req.get());
  Send(req, t.name, [&](Message& m, const Part&) { m.meta.set_path(path); });
  return req;
}

std::shared_ptr<Request> KVWorker::Stats() {
  auto req = std::make_shared<Request>();
  req->what = "stats of the servers";
  req->op = kStats;
  AllServers(req.get());
  Send(req, "", [](Message&, const Part&) {});
  return req;
}

}  // namespace ps
