// kPush and kPushPull: gradients of rows (or of a dense tensor), stepped into the table.
//   request:  keys, gradients[, counts (meta has_counts)]; dense: gradients (none: an empty push)
//             kPush only, after those blobs (sent even when empty): a write-back (meta
//             has_write_back), blobs as kAssign's, written just before the push is taken in
//   answer:   kPush: nothing; kPushPull: the rows of the keys (dense: the tensor) once this push's
//             iteration is applied
// lr and the iteration (meta has_iteration; none: applied on arrival) travel with every push.
// Under BSP every server gets a message, empty if it owns none of the keys, so it can count the
// worker in; with a write-back every server gets one too. An ASP kPush of strictly increasing
// keys goes as chunks (kv.h), answered once.
#include "ops/serving.h"
#include "py_face.h"

namespace ps {

namespace {

bool ServePush(Serving& s) {
  // The write-back goes first, as if it had come as a kAssign just before the push; a bad
  // one fails the request, but the push is still taken so the iteration can complete.
  std::string err;
  if (s.msg.meta.has_write_back()) err = AssignRows(s.table(), s.msg, s.msg.meta.has_counts() ? 3 : 2);
  const std::string pushed = s.server.TakePush(*s.entry, s.msg);
  if (err.empty()) err = pushed;
  if (s.msg.meta.chunked() && !s.server.LastChunk(s.msg, &err)) return true;
  s.Reply({}, err);
  return true;
}

bool ServePushPull(Serving& s) {
  if (!*s.push_done) {  // a deferred push-pull comes back here with its push already taken
    const std::string err = s.server.TakePush(*s.entry, s.msg);
    *s.push_done = true;
    if (!err.empty()) {
      s.Reply({}, err);
      return true;
    }
  }
  return ServePull(s, s.msg.meta.iteration() + 1);  // the rows once this push is applied
}

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

bool StrictlyIncreasing(const int64_t* keys, int64_t n) {
  for (int64_t i = 1; i < n; ++i)
    if (keys[i - 1] >= keys[i]) return false;
  return true;
}

// iteration < 0: apply on arrival (ASP).
std::shared_ptr<Request> SendPush(KVWorker& w, const TableRef& t, int op, const int64_t* keys, int64_t n,
                                  const float* grads, const int64_t* counts, int64_t iteration, float lr,
                                  const WriteBack* write_back, int64_t catch_up_to) {
  auto req = w.NewRequest(t, op);
  const bool bsp = iteration >= 0;
  if (t.dense) w.PartitionDense(t, req.get());
  else w.Partition(t, keys, n, bsp || write_back, req.get());
  Request written;  // the write-back's keys by server
  if (write_back) w.Partition(t, write_back->keys, write_back->n, true, &written);
  // An ASP push of distinct keys is taken chunk by chunk, as if each were a push of its own
  // (same steps, same versions): the server steps one chunk while the next is on its way. Only
  // a push the servers will take whole is cut (keys of the table, counts of at least 1), so that
  // a bad one is still refused whole by the server that finds it.
  int64_t chunk = op == kPush && !bsp && !write_back ? w.ChunkRows(t, t.width * 4) : 0;  // float32 gradients
  if (chunk > 0 && (n <= chunk || !StrictlyIncreasing(keys, n) || keys[0] < 0 || keys[n - 1] >= t.rows)) chunk = 0;
  for (int64_t i = 0; chunk > 0 && counts && i < n; ++i)
    if (counts[i] < 1) chunk = 0;
  w.Send(req, t.name, [&](Message& m, const Part& p) {
    m.meta.set_lr(lr);
    m.meta.set_catch_up_to(catch_up_to);
    m.meta.set_has_iteration(bsp);
    m.meta.set_iteration(iteration);
    if (t.dense) {
      if (p.size() > 0) m.data.push_back(SliceOf(p, grads, 1));
      return;
    }
    const Part* wb = nullptr;
    for (const Part& part : written.parts)
      if (part.node == p.node && part.size() > 0) wb = &part;
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

// A push's write-back: keys, rows, optimizer state, steps and version increments.
using WriteBackArrays = std::tuple<Arr<int64_t>, Arr<float>, Arr<float>, Arr<int64_t>, Arr<int64_t>>;

// A dense table's push takes no keys.
Handle Push(RemoteTable& table, std::optional<Arr<int64_t>> keys, Arr<float> grads, std::optional<Arr<int64_t>> counts,
            int64_t iteration, float lr, bool pull, std::optional<WriteBackArrays> write_back, int64_t catch_up_to) {
  const TableRef& t = table.ref();
  const std::string& name = t.name;
  const int64_t n = table.Keys(keys);
  CheckSize(name, "gradient", grads.size(), t.dense ? t.rows * t.width : n * t.width);
  if (counts) CheckSize(name, "counts", counts->size(), n);
  py::list keep;
  if (keys) keep.append(*keys);
  keep.append(grads);
  if (counts) keep.append(*counts);
  const int64_t* k = keys ? keys->data() : nullptr;
  const float* g = grads.data();
  const int64_t* c = counts ? counts->data() : nullptr;
  WriteBack wb;
  if (write_back) {
    if (t.dense || pull)
      throw py::value_error("table '" + name + "': a write-back goes with a sparse push, with rows, optimizer "
                            "state, steps and version increments");
    auto& [wb_keys, wb_values, wb_state, wb_steps, wb_version_add] = *write_back;
    wb.n = wb_keys.size();
    CheckSize(name, "write-back rows", wb_values.size(), wb.n * t.width);
    CheckSize(name, "write-back optimizer state", wb_state.size(), wb.n * t.state_width);
    CheckSize(name, "write-back steps", wb_steps.size(), wb.n);
    CheckSize(name, "write-back version increments", wb_version_add.size(), wb.n);
    for (py::object o : {py::object(wb_keys), py::object(wb_values), py::object(wb_state), py::object(wb_steps),
                         py::object(wb_version_add)})
      keep.append(o);
    wb.keys = wb_keys.data();
    py::array stored = table.Stored(wb_values);
    keep.append(stored);
    wb.values = stored.data();
    wb.state = wb_state.data();
    wb.steps = wb_steps.data();
    wb.version_add = wb_version_add.data();
  }
  const WriteBack* wbp = write_back ? &wb : nullptr;
  const int op = pull ? kPushPull : kPush;
  auto req = Send([&](KVWorker& w) { return SendPush(w, t, op, k, n, g, c, iteration, lr, wbp, catch_up_to); });
  return Handle(req, keep);
}

void Bind(PyFace& f) {
  f.table.def("push", &Push, py::kw_only(), py::arg("keys") = py::none(), py::arg("grads"),
              py::arg("counts") = py::none(), py::arg("iteration") = -1, py::arg("lr"), py::arg("pull") = false,
              py::arg("write_back") = py::none(), py::arg("catch_up_to") = 0,
              "catch_up_to: a catch-up optimizer's rows are brought to that step before they are stepped. pull=True: push-pull (result: the rows after the push's iteration). write_back: (keys, values, state, "
              "steps, version_add), written just before the push is taken in.");
}

}  // namespace

extern const OpDef kPushOp = {"push", kBrief | kWriteBack | kChangesRows, ServePush, nullptr, Bind};
extern const OpDef kPushPullOp = {"push_pull", kBrief | kChangesRows, ServePushPull, PulledRows, nullptr};

}  // namespace ps
