// kAssign: writes rows as they are (owner-computed write-back), with their optimizer state and
// step counts, and adds to their versions.
//   request:  keys, rows (as the table stores them), optimizer state, steps, version increments
//   answer:   nothing; an error for a key outside the table or a version increment below 0
// A push's write-back (ops/push.cc) has the same blobs.
#include "ops/serving.h"
#include "py_face.h"

namespace ps {

std::string RowBytes(const Message& msg, size_t i, int64_t n, const TableShard& t) {
  if (msg.data.size() <= i) return "table '" + t.name() + "': request has no rows";
  if (msg.data[i].size != static_cast<size_t>(n * t.row_bytes()))
    return "table '" + t.name() + "': rows have " + std::to_string(msg.data[i].size) + " bytes, expected " +
           std::to_string(n) + " rows of " + std::to_string(t.width()) + " " + hetu::storage::name(t.storage()) +
           " (" + std::to_string(n * t.row_bytes()) + " bytes)";
  return "";
}

std::string AssignRows(TableShard& t, const Message& msg, size_t first) {
  const std::string& name = t.name();
  const int64_t n = msg.data.size() > first ? static_cast<int64_t>(msg.data[first].count<int64_t>()) : 0;
  std::string err = RowBytes(msg, first + 1, n, t);
  if (err.empty()) err = Expect<float>(msg, first + 2, n * t.state_width(), "optimizer state", name);
  if (err.empty()) err = Expect<int64_t>(msg, first + 3, n, "steps", name);
  if (err.empty()) err = Expect<int64_t>(msg, first + 4, n, "version increments", name);
  const int64_t* keys = n ? msg.data[first].as<int64_t>() : nullptr;
  if (err.empty()) err = t.CheckKeys(keys, n);
  if (err.empty()) err = t.CheckVersionAdds(keys, msg.data[first + 4].as<int64_t>(), n, 0, "version increment");
  if (err.empty())
    t.Assign(keys, n, msg.data[first + 1].data, msg.data[first + 2].as<float>(),
             msg.data[first + 3].as<int64_t>(), msg.data[first + 4].as<int64_t>());
  return err;
}

namespace {

bool Serve(Serving& s) {
  s.Reply({}, AssignRows(s.table(), s.msg, 0));
  return true;
}

std::shared_ptr<Request> SendAssign(KVWorker& w, const TableRef& t, const int64_t* keys, int64_t n,
                                    const void* values, const float* state, const int64_t* steps,
                                    const int64_t* version_add) {
  auto req = w.NewRequest(t, kAssign);
  w.Partition(t, keys, n, false, req.get());
  w.Send(req, t.name, [&](Message& m, const Part& p) {
    m.data.push_back(SliceOf(p, keys, 1));
    m.data.push_back(SliceOf(p, static_cast<const char*>(values), t.row_bytes()));
    m.data.push_back(SliceOf(p, state, t.state_width));
    m.data.push_back(SliceOf(p, steps, 1));
    m.data.push_back(SliceOf(p, version_add, 1));
  });
  return req;
}

Handle Assign(RemoteTable& table, Arr<int64_t> keys, Arr<float> values, Arr<float> state, Arr<int64_t> steps,
              Arr<int64_t> version_add) {
  const TableRef& t = table.ref();
  const int64_t n = keys.size();
  CheckSize(t.name, "values", values.size(), n * t.width);
  CheckSize(t.name, "optimizer state", state.size(), n * t.state_width);
  CheckSize(t.name, "steps", steps.size(), n);
  CheckSize(t.name, "version_add", version_add.size(), n);
  py::list keep;
  for (py::object o : {py::object(keys), py::object(values), py::object(state), py::object(steps), py::object(version_add)})
    keep.append(o);
  const int64_t *k = keys.data(), *st = steps.data(), *va = version_add.data();
  py::array stored = table.Stored(values);
  keep.append(stored);
  const void* v = stored.data();
  const float* s = state.data();
  auto req = Send([&](KVWorker& w) { return SendAssign(w, t, k, n, v, s, st, va); });
  return Handle(req, keep);
}

void Bind(PyFace& f) {
  f.table.def("assign", &Assign, py::kw_only(), py::arg("keys"), py::arg("values"), py::arg("state"),
              py::arg("steps"), py::arg("version_add"));
}

}  // namespace

extern const OpDef kAssignOp = {"assign", kBrief | kSparseOnly | kChangesRows, Serve, nullptr, Bind};

}  // namespace ps
