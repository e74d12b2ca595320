// kPullStale: the rows a worker's copy is too far behind on (a cache's refresh).
//   request:  keys, the worker's versions of them; meta arg: the bound; meta with_state
//   answer:   positions into the part's keys of the rows whose version is more than `bound`
//             ahead, those rows (as stored), their versions; with_state: then their optimizer
//             state and step counts, so that a cache steps its copy as the servers step theirs
// With an iteration (BSP/SSP) it waits like a pull for that iteration.
#include "common/storage.h"
#include "ops/serving.h"
#include "py_face.h"

namespace ps {

namespace {

bool Serve(Serving& s) {
  TableShard& t = s.table();
  const Message& msg = s.msg;
  if (!s.server.Servable(t, msg, msg.meta.iteration())) return false;
  const int64_t n = NumKeys(msg);
  const int64_t* keys;
  if (!s.server.ReadKeys(t, msg, n, &keys, Expect<int64_t>(msg, 1, n, "versions", t.name()))) return true;
  std::vector<int64_t> idx = t.Stale(keys, msg.data[1].as<int64_t>(), n, msg.meta.arg());
  const int64_t m = static_cast<int64_t>(idx.size());
  std::vector<int64_t> stale(m);
  for (int64_t i = 0; i < m; ++i) stale[i] = keys[idx[i]];
  t.CatchUp(stale.data(), m, msg.meta.catch_up_to());
  char* rows;
  int64_t* versions;
  Blob rb = Blob::Alloc<char>(m * t.row_bytes(), &rows);
  Blob vb = Blob::Alloc<int64_t>(m, &versions);
  t.Gather(stale.data(), m, rows);
  std::vector<Blob> reply = {Blob::FromVector(std::move(idx)), rb, vb};
  if (msg.meta.with_state()) {
    float* state;
    int64_t* steps;
    reply.push_back(Blob::Alloc<float>(m * t.state_width(), &state));
    reply.push_back(Blob::Alloc<int64_t>(m, &steps));
    t.GatherState(stale.data(), m, state, steps, versions);
  } else {
    for (int64_t i = 0; i < m; ++i) versions[i] = t.Version(stale[i]);
  }
  s.Reply(std::move(reply), "");
  return true;
}

// (positions into the caller's keys, sorted; rows (m, width); versions (m,)), then with_state
// the rows' optimizer state (m, state_width) and steps (m,).
py::object Result(Request& r, const Asked& asked) {
  const bool with_state = asked.with_state;
  const py::ssize_t w = r.width;
  // Positions are mapped back to the caller's key array and sorted.
  std::vector<std::tuple<int64_t, const Part*, int64_t>> hits;
  for (const Part& p : r.parts) {
    const Blob& idx = p.response.data.at(0);
    for (size_t i = 0; i < idx.count<int64_t>(); ++i) {
      const int64_t local = idx.as<int64_t>()[i];
      if (local < 0 || local >= p.size()) throw std::runtime_error("server answer has a bad position");
      hits.emplace_back(p.at(local), &p, static_cast<int64_t>(i));
    }
    const size_t m = idx.count<int64_t>(), sw = r.state_width;
    if (p.response.data.at(1).size != m * r.row_bytes || p.response.data.at(2).size != m * sizeof(int64_t) ||
        (with_state && (p.response.data.at(3).size != m * sw * sizeof(float) ||
                        p.response.data.at(4).size != m * sizeof(int64_t))))
      throw std::runtime_error("server answer has the wrong size");
  }
  std::sort(hits.begin(), hits.end(), [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
  const py::ssize_t m = static_cast<py::ssize_t>(hits.size());
  const py::ssize_t sw = static_cast<py::ssize_t>(with_state ? r.state_width : 0);
  py::array_t<int64_t> pos(m), versions(m), steps(with_state ? m : 0);
  py::array_t<float> rows({m, w}), state({with_state ? m : 0, sw});
  for (py::ssize_t i = 0; i < m; ++i) {
    const auto& [g, part, j] = hits[i];
    const std::vector<Blob>& got = part->response.data;
    pos.mutable_data()[i] = g;
    versions.mutable_data()[i] = got[2].as<int64_t>()[j];
    hetu::storage::widen_row(r.storage, got[1].data + j * r.row_bytes, rows.mutable_data() + i * w, w);
    if (!with_state) continue;
    std::copy(got[3].as<float>() + j * sw, got[3].as<float>() + (j + 1) * sw, state.mutable_data() + i * sw);
    steps.mutable_data()[i] = got[4].as<int64_t>()[j];
  }
  if (with_state) return py::make_tuple(pos, rows, versions, state, steps);
  return py::make_tuple(pos, rows, versions);
}

std::shared_ptr<Request> SendPullStale(KVWorker& w, const TableRef& t, const int64_t* keys, const int64_t* versions,
                                       int64_t n, int64_t bound, int64_t iteration, bool with_state,
                                       int64_t catch_up_to) {
  auto req = w.NewRequest(t, kPullStale);
  w.Partition(t, keys, n, false, req.get());
  w.Send(req, t.name, [&](Message& m, const Part& p) {
    m.meta.set_arg(bound);
    m.meta.set_with_state(with_state);
    m.meta.set_has_iteration(iteration >= 0);
    m.meta.set_iteration(iteration);
    m.meta.set_catch_up_to(catch_up_to);
    m.data.push_back(SliceOf(p, keys, 1));
    m.data.push_back(SliceOf(p, versions, 1));
  });
  return req;
}

Handle PullStale(RemoteTable& table, Arr<int64_t> keys, Arr<int64_t> versions, int64_t bound, int64_t iteration,
                 bool with_state, int64_t catch_up_to) {
  const TableRef& t = table.ref();
  CheckSize(t.name, "versions", versions.size(), keys.size());
  py::list keep;
  keep.append(keys);
  keep.append(versions);
  const int64_t *k = keys.data(), *v = versions.data();
  const int64_t n = keys.size();
  auto req = Send([&](KVWorker& w) { return SendPullStale(w, t, k, v, n, bound, iteration, with_state, catch_up_to); });
  Asked asked;
  asked.with_state = with_state;
  return Handle(req, keep, std::move(asked));
}

void Bind(PyFace& f) {
  f.table.def("pull_stale", &PullStale, py::kw_only(), py::arg("keys"), py::arg("versions"), py::arg("bound") = 0,
              py::arg("iteration") = -1, py::arg("with_state") = false, py::arg("catch_up_to") = 0);
}

}  // namespace

extern const OpDef kPullStaleOp = {"pull_stale", kBrief | kSparseOnly, Serve, Result, Bind};

}  // namespace ps
