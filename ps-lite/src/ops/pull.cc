// kPull: rows of an embedding table, or a whole dense tensor.
//   request:  keys (dense: none); meta chunk_rows > 0: the server may answer in chunks of at most
//             that many rows
//   answer:   rows as the table stores them (dense: the tensor's elements, float32), or chunks
//             of them (meta chunked, offset, more)
// With an iteration (BSP/SSP) it waits until the table is as after the iteration before.
#include "common/storage.h"
#include "ops/serving.h"
#include "py_face.h"

namespace ps {

bool ServePull(Serving& s, int64_t iteration) {
  TableShard& t = s.table();
  const Message& msg = s.msg;
  if (!s.server.Servable(t, msg, iteration)) return false;
  if (t.dense()) {
    float* out;
    Blob rows = Blob::Alloc<float>(t.rows() * t.width(), &out);
    t.GatherDense(out);
    s.Reply({rows}, "");
    return true;
  }
  char* out;  // rows as stored: row_bytes() each
  const int64_t n = NumKeys(msg);
  const int64_t* keys;
  if (!s.server.ReadKeys(t, msg, n, &keys)) return true;
  t.CatchUp(keys, n, msg.meta.catch_up_to());
  const int64_t chunk = msg.meta.op() == kPull ? msg.meta.chunk_rows() : 0;
  if (chunk > 0 && n > chunk) {
    // A chunk at a time: the van sends one while the next is gathered.
    for (int64_t off = 0; off < n; off += chunk) {
      const int64_t m = std::min(chunk, n - off);
      Blob rows = Blob::Alloc<char>(m * t.row_bytes(), &out);
      t.Gather(keys + off, m, out);
      s.server.Reply(msg, {rows}, "", off, off + m < n);
    }
    return true;
  }
  Blob rows = Blob::Alloc<char>(n * t.row_bytes(), &out);
  t.Gather(keys, n, out);
  s.Reply({rows}, "");
  return true;
}

py::object PulledRows(Request& r, const Asked&) {
  const py::ssize_t n = r.num_keys, w = r.width;
  if (r.dense) return Gathered<float>(r, 0, 1, {n});
  bool chunked = false;
  for (const Part& p : r.parts) chunked = chunked || p.chunked;
  if (!chunked) return Rows(r, 0);
  // Chunked parts are in r.rows already; the others are copied in.
  if (r.storage == hetu::storage::kF32) {
    for (const Part& p : r.parts)
      if (!p.chunked) Scatter<float>(p, 0, w, reinterpret_cast<float*>(r.rows_data));
    return WrapBlob<float>(r.rows, {n, w});
  }
  for (const Part& p : r.parts)
    if (!p.chunked) Scatter<uint16_t>(p, 0, w, reinterpret_cast<uint16_t*>(r.rows_data));
  return Widened(WrapBlob<uint16_t>(r.rows, {n, w}), r.storage, n, w);
}

namespace {

bool Serve(Serving& s) { return ServePull(s, s.msg.meta.iteration()); }

std::shared_ptr<Request> SendPull(KVWorker& w, const TableRef& t, const int64_t* keys, int64_t n, int64_t iteration,
                                  int64_t catch_up_to) {
  auto req = w.NewRequest(t, kPull);
  if (t.dense) w.PartitionDense(t, req.get());
  else w.Partition(t, keys, n, false, req.get());
  // Many rows from several servers: their answers are copied into one result anyway, so they
  // come in chunks, each copied in as it arrives while the servers gather the next ones. (From
  // one server the answer becomes the result as it is, without a copy.)
  const int64_t chunk = w.ChunkRows(t, t.row_bytes());
  if (chunk > 0 && n > chunk && req->parts.size() > 1) req->rows = Blob::Alloc<char>(n * t.row_bytes(), &req->rows_data);
  w.Send(req, t.name, [&](Message& m, const Part& p) {
    m.meta.set_has_iteration(iteration >= 0);
    m.meta.set_iteration(iteration);
    m.meta.set_catch_up_to(catch_up_to);
    if (!t.dense) m.data.push_back(SliceOf(p, keys, 1));
    if (req->rows_data) m.meta.set_chunk_rows(chunk);
  });
  return req;
}

// A dense table's pull takes no keys.
Handle Pull(RemoteTable& table, std::optional<Arr<int64_t>> keys, int64_t iteration, int64_t catch_up_to) {
  const int64_t n = table.Keys(keys);
  py::list keep;
  if (keys) keep.append(*keys);
  const int64_t* k = keys ? keys->data() : nullptr;
  auto req = Send([&](KVWorker& w) { return SendPull(w, table.ref(), k, n, iteration, catch_up_to); });
  return Handle(req, keep);
}

void Bind(PyFace& f) {
  f.table.def("pull", &Pull, py::kw_only(), py::arg("keys") = py::none(), py::arg("iteration") = -1,
              py::arg("catch_up_to") = 0, "catch_up_to: a catch-up optimizer's rows come brought to that step");
}

}  // namespace

extern const OpDef kPullOp = {"pull", kBrief, Serve, PulledRows, Bind};

}  // namespace ps
