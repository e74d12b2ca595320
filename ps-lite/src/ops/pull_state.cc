// kPullState: rows with their optimizer state, steps and versions (Herald's owner-computed rows).
//   request:  keys[, a byte per key (meta with_state_mask): 1 = its state wanted]
//   answer:   every key's row (as stored), then the optimizer state, steps and versions of all
//             keys, or with the bytes of the marked keys only, in key order
// With an iteration (BSP/SSP) it waits like a pull for that iteration.
#include "ops/serving.h"
#include "py_face.h"

namespace ps {

namespace {

bool Serve(Serving& s) {
  TableShard& t = s.table();
  const Message& msg = s.msg;
  if (!s.server.Servable(t, msg, msg.meta.iteration())) return false;
  const int64_t n = NumKeys(msg);
  const bool masked = msg.meta.with_state_mask();
  const int64_t* keys;
  if (!s.server.ReadKeys(t, msg, n, &keys, masked ? Expect<uint8_t>(msg, 1, n, "state mask", t.name()) : ""))
    return true;
  // The keys whose optimizer state is wanted: all, or those the mask marks.
  std::vector<int64_t> marked;
  if (masked)
    for (int64_t i = 0; i < n; ++i)
      if (msg.data[1].as<uint8_t>()[i]) marked.push_back(keys[i]);
  const int64_t m = masked ? static_cast<int64_t>(marked.size()) : n;
  char* rows;
  float* state;
  int64_t *steps, *versions;
  Blob rb = Blob::Alloc<char>(n * t.row_bytes(), &rows);
  Blob sb = Blob::Alloc<float>(m * t.state_width(), &state);
  Blob stb = Blob::Alloc<int64_t>(m, &steps);
  Blob vb = Blob::Alloc<int64_t>(m, &versions);
  t.CatchUp(keys, n, msg.meta.catch_up_to());
  t.Gather(keys, n, rows);
  t.GatherState(masked ? marked.data() : keys, m, state, steps, versions);
  s.Reply({rb, sb, stb, vb}, "");
  return true;
}

// A masked answer's state, steps and versions: each part answered for its marked keys, in key
// order; out holds the marked keys of the whole request in key order (marked_before[i]: how
// many keys before position i are marked).
template <typename T>
void ScatterMarked(const Request& r, const std::vector<uint8_t>& marked, const std::vector<int64_t>& marked_before,
                   size_t bi, int64_t per, T* out) {
  if (per == 0) return;
  for (const Part& p : r.parts) {
    const Blob& b = p.response.data.at(bi);
    int64_t j = 0;
    for (int64_t i = 0; i < p.size(); ++i) {
      const int64_t pos = p.at(i);
      if (!marked[pos]) continue;
      if (static_cast<size_t>((j + 1) * per) * sizeof(T) > b.size) throw std::runtime_error("server answer has the wrong size");
      std::copy(b.as<T>() + j * per, b.as<T>() + (j + 1) * per, out + marked_before[pos] * per);
      ++j;
    }
    if (static_cast<size_t>(j * per) * sizeof(T) != b.size) throw std::runtime_error("server answer has the wrong size");
  }
}

// (rows (n, width), optimizer state (m, state_width), steps (m,), versions (m,)): m = n, or the
// marked keys.
py::object Result(Request& r, const Asked& asked) {
  const py::ssize_t n = r.num_keys, sw = static_cast<py::ssize_t>(r.state_width);
  py::array rows = Rows(r, 0);
  if (!asked.marked) {
    py::array state = Gathered<float>(r, 1, r.state_width, {n, sw});
    py::array steps = Gathered<int64_t>(r, 2, 1, {n});
    py::array versions = Gathered<int64_t>(r, 3, 1, {n});
    return py::make_tuple(rows, state, steps, versions);
  }
  const std::vector<uint8_t>& marked = *asked.marked;
  std::vector<int64_t> before(n);
  py::ssize_t m = 0;
  for (py::ssize_t i = 0; i < n; ++i) {
    before[i] = m;
    m += marked[i] ? 1 : 0;
  }
  py::array_t<float> state({m, sw});
  py::array_t<int64_t> steps(m), versions(m);
  ScatterMarked<float>(r, marked, before, 1, sw, state.mutable_data());
  ScatterMarked<int64_t>(r, marked, before, 2, 1, steps.mutable_data());
  ScatterMarked<int64_t>(r, marked, before, 3, 1, versions.mutable_data());
  return py::make_tuple(rows, state, steps, versions);
}

std::shared_ptr<Request> SendPullState(KVWorker& w, const TableRef& t, const int64_t* keys, int64_t n,
                                       int64_t iteration, const uint8_t* with_state, int64_t catch_up_to) {
  auto req = w.NewRequest(t, kPullState);
  w.Partition(t, keys, n, false, req.get());
  w.Send(req, t.name, [&](Message& m, const Part& p) {
    m.meta.set_has_iteration(iteration >= 0);
    m.meta.set_iteration(iteration);
    m.meta.set_catch_up_to(catch_up_to);
    m.data.push_back(SliceOf(p, keys, 1));
    if (with_state) {
      m.meta.set_with_state_mask(true);
      m.data.push_back(SliceOf(p, with_state, 1));
    }
  });
  return req;
}

Handle PullWithState(RemoteTable& table, Arr<int64_t> keys, int64_t iteration, std::optional<Arr<uint8_t>> state_mask,
                     int64_t catch_up_to) {
  const TableRef& t = table.ref();
  py::list keep;
  keep.append(keys);
  const int64_t* k = keys.data();
  const int64_t n = keys.size();
  Asked asked;
  if (state_mask) {
    CheckSize(t.name, "state mask", state_mask->size(), n);
    keep.append(*state_mask);
    asked.marked.emplace(state_mask->data(), state_mask->data() + n);
  }
  const uint8_t* mask = state_mask ? state_mask->data() : nullptr;
  auto req = Send([&](KVWorker& w) { return SendPullState(w, t, k, n, iteration, mask, catch_up_to); });
  return Handle(req, keep, std::move(asked));
}

void Bind(PyFace& f) {
  f.table.def("pull_with_state", &PullWithState, py::kw_only(), py::arg("keys"), py::arg("iteration") = -1,
              py::arg("state_mask") = py::none(), py::arg("catch_up_to") = 0);
}

}  // namespace

extern const OpDef kPullStateOp = {"pull_with_state", kBrief | kSparseOnly, Serve, Result, Bind};

}  // namespace ps
