// hetu._ps: the node life cycle and the worker's table operations for Python. Arrays are
// NumPy (int64 keys, float32 values); every operation returns a Handle at once and
// Handle.wait() blocks with the GIL released.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

#include "common/optim_rules.h"
#include "common/rng.h"
#include "customer.h"
#include "kv_server.h"
#include "kv_worker.h"
#include "postoffice.h"
#include "step_loop.h"
#include "van.h"

namespace py = pybind11;
using namespace ps;

namespace {

template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

struct NodeState {
  std::unique_ptr<Postoffice> po;
  std::unique_ptr<Customer> customer;
  std::unique_ptr<KVServer> server;
  std::unique_ptr<KVWorker> worker;
};
std::unique_ptr<NodeState> g_node;

NodeState& Node() {
  if (!g_node) throw std::runtime_error("hetu.ps: this process has not started a node (call hetu.ps.start())");
  return *g_node;
}

KVWorker& Worker() {
  if (!Node().worker) throw std::runtime_error("hetu.ps: table operations need DMLC_ROLE=worker");
  return *g_node->worker;
}

double DefaultWaitTimeout() {
  const char* e = std::getenv("PS_WAIT_TIMEOUT");
  return e ? std::atof(e) : 600.0;
}

enum ResultKind { kNothing, kRows, kDenseRows, kStale, kStaleState, kState, kMarkedState, kServerStats };

template <typename T>
py::array WrapBlob(const Blob& b, std::vector<py::ssize_t> shape) {
  auto* holder = new Blob(b);
  py::capsule owner(holder, [](void* p) { delete static_cast<Blob*>(p); });
  return py::array_t<T>(shape, reinterpret_cast<const T*>(holder->data), owner);
}

// Copies one part's answer (blob `bi`, `per` elements per key) into out at the part's positions.
template <typename T>
void Scatter(const Part& p, size_t bi, int64_t per, T* out) {
  if (p.size() == 0 || per == 0) return;
  const T* src = p.response.data.at(bi).as<T>();
  if (p.response.data[bi].size != static_cast<size_t>(p.size() * per) * sizeof(T))
    throw std::runtime_error("server answer has the wrong size");
  if (p.contiguous) {
    std::copy(src, src + p.size() * per, out + p.begin * per);
    return;
  }
  for (int64_t i = 0; i < p.size(); ++i) std::copy(src + i * per, src + (i + 1) * per, out + p.pos[i] * per);
}

template <typename T>
py::array Gathered(Request& r, size_t bi, int64_t per, std::vector<py::ssize_t> shape) {
  // One server answered for all keys in order: hand its buffer to NumPy as is.
  if (r.parts.size() == 1 && r.parts[0].contiguous && r.parts[0].begin == 0 && r.parts[0].end == r.num_keys &&
      r.parts[0].response.data.size() > bi &&
      r.parts[0].response.data[bi].size == static_cast<size_t>(r.num_keys * per) * sizeof(T))
    return WrapBlob<T>(r.parts[0].response.data[bi], shape);
  py::array_t<T> out(shape);
  T* o = out.mutable_data();
  for (const Part& p : r.parts) Scatter<T>(p, bi, per, o);
  return out;
}

// A masked pull_with_state's state, steps and versions: each part answered for its marked keys,
// in key order; out holds the marked keys of the whole request in key order (marked_before[i]:
// how many keys before position i are marked).
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

// 16-bit rows as the table moves them -> float32 rows (widened exactly; common/storage.h). `raw`
// holds n x w elements of `storage` (gathered with Gathered<uint16_t>).
py::array Widened(const py::array& raw, int storage, py::ssize_t n, py::ssize_t w) {
  py::array_t<float> out({n, w});
  hetu::storage::widen_row(storage, raw.data(), out.mutable_data(), n * w);
  return out;
}

class Handle {
 public:
  Handle(std::shared_ptr<Request> req, py::list keep, int kind) : req_(std::move(req)), keep_(std::move(keep)), kind_(kind) {}
  // A pull_with_state that wants state for the keys `marked` (a byte per key) only.
  Handle(std::shared_ptr<Request> req, py::list keep, std::vector<uint8_t> marked)
      : req_(std::move(req)), keep_(std::move(keep)), kind_(kMarkedState), marked_(std::move(marked)) {}
  // Moved, never copied: a moved-from handle owns nothing, so its destructor must not wait
  // (pybind11 moves the returned handle into the Python object).
  Handle(Handle&& o) noexcept
      : req_(std::move(o.req_)), keep_(std::move(o.keep_)), kind_(o.kind_), marked_(std::move(o.marked_)),
        result_(std::move(o.result_)), consumed_(o.consumed_) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle() {
    // Parts of the request may still read the caller's arrays (zero-copy sends), even after
    // another part failed: let them all be answered first.
    if (req_ && !req_->settled() && g_node) {
      py::gil_scoped_release nogil;
      g_node->customer->WaitSettled(req_, DefaultWaitTimeout());
    }
  }

  bool done() { return req_->finished(); }

  py::object wait(py::object timeout) {
    if (!result_.is_none() || consumed_) return result_;
    const double t = timeout.is_none() ? DefaultWaitTimeout() : timeout.cast<double>();
    {
      py::gil_scoped_release nogil;
      Node().customer->Wait(req_, t);
    }
    consumed_ = true;
    keep_ = py::list();
    result_ = Build();
    return result_;
  }

 private:
  py::object Build() {
    Request& r = *req_;
    const py::ssize_t n = r.num_keys, w = r.width;
    switch (kind_) {
      case kRows: {
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
      case kDenseRows: return Gathered<float>(r, 0, 1, {n});
      case kServerStats: {  // one dict per server, in rank order (the parts' order)
        py::list out;
        for (const Part& p : r.parts) {
          const Blob& b = p.response.data.at(0);
          if (b.count<double>() != 10) throw std::runtime_error("server stats answer has the wrong size");
          const double* v = b.as<double>();
          py::dict d;
          d["requests"] = static_cast<int64_t>(v[0]);
          d["rows"] = static_cast<int64_t>(v[1]);
          d["bytes"] = static_cast<int64_t>(v[2]);
          d["busy_seconds"] = v[3];
          // checkpoint files written and read, seconds from open to close (fsync included)
          d["checkpoint_saves"] = static_cast<int64_t>(v[4]);
          d["checkpoint_saved_bytes"] = static_cast<int64_t>(v[5]);
          d["checkpoint_save_seconds"] = v[6];
          d["checkpoint_loads"] = static_cast<int64_t>(v[7]);
          d["checkpoint_loaded_bytes"] = static_cast<int64_t>(v[8]);
          d["checkpoint_load_seconds"] = v[9];
          out.append(d);
        }
        return out;
      }
      case kState: {
        py::array rows = Rows(r, 0);
        py::array state = Gathered<float>(r, 1, r.state_width, {n, static_cast<py::ssize_t>(r.state_width)});
        py::array steps = Gathered<int64_t>(r, 2, 1, {n});
        py::array versions = Gathered<int64_t>(r, 3, 1, {n});
        return py::make_tuple(rows, state, steps, versions);
      }
      case kMarkedState: {
        std::vector<int64_t> before(n);
        py::ssize_t m = 0;
        for (py::ssize_t i = 0; i < n; ++i) {
          before[i] = m;
          m += marked_[i] ? 1 : 0;
        }
        const py::ssize_t sw = static_cast<py::ssize_t>(r.state_width);
        py::array rows = Rows(r, 0);
        py::array_t<float> state({m, sw});
        py::array_t<int64_t> steps(m), versions(m);
        ScatterMarked<float>(r, marked_, before, 1, sw, state.mutable_data());
        ScatterMarked<int64_t>(r, marked_, before, 2, 1, steps.mutable_data());
        ScatterMarked<int64_t>(r, marked_, before, 3, 1, versions.mutable_data());
        return py::make_tuple(rows, state, steps, versions);
      }
      case kStale:
      case kStaleState: {
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
              (kind_ == kStaleState && (p.response.data.at(3).size != m * sw * sizeof(float) ||
                                        p.response.data.at(4).size != m * sizeof(int64_t))))
            throw std::runtime_error("server answer has the wrong size");
        }
        std::sort(hits.begin(), hits.end(), [](const auto& a, const auto& b) { return std::get<0>(a) < std::get<0>(b); });
        const py::ssize_t m = static_cast<py::ssize_t>(hits.size());
        const py::ssize_t sw = static_cast<py::ssize_t>(kind_ == kStaleState ? r.state_width : 0);
        py::array_t<int64_t> pos(m), versions(m), steps(kind_ == kStaleState ? m : 0);
        py::array_t<float> rows({m, w}), state({kind_ == kStaleState ? m : 0, sw});
        for (py::ssize_t i = 0; i < m; ++i) {
          const auto& [g, part, j] = hits[i];
          const std::vector<Blob>& got = part->response.data;
          pos.mutable_data()[i] = g;
          versions.mutable_data()[i] = got[2].as<int64_t>()[j];
          hetu::storage::widen_row(r.storage, got[1].data + j * r.row_bytes, rows.mutable_data() + i * w, w);
          if (kind_ != kStaleState) continue;
          std::copy(got[3].as<float>() + j * sw, got[3].as<float>() + (j + 1) * sw, state.mutable_data() + i * sw);
          steps.mutable_data()[i] = got[4].as<int64_t>()[j];
        }
        if (kind_ == kStaleState) return py::make_tuple(pos, rows, versions, state, steps);
        return py::make_tuple(pos, rows, versions);
      }
      default: return py::none();
    }
  }

  // Blob `bi` of every part: the request's rows, as float32.
  py::array Rows(Request& r, size_t bi) {
    const py::ssize_t n = r.num_keys, w = r.width;
    if (r.storage == hetu::storage::kF32) return Gathered<float>(r, bi, w, {n, w});
    return Widened(Gathered<uint16_t>(r, bi, w, {n, w}), r.storage, n, w);
  }

  std::shared_ptr<Request> req_;
  py::list keep_;  // the caller's arrays, alive while the van may still read them
  int kind_;
  std::vector<uint8_t> marked_;  // kMarkedState: the keys whose state was asked for
  py::object result_ = py::none();
  bool consumed_ = false;
};

void CheckSize(const std::string& table, const char* what, py::ssize_t got, int64_t want) {
  if (got != want)
    throw py::value_error("table '" + table + "': " + what + " has " + std::to_string(got) + " elements, expected " +
                          std::to_string(want));
}

// Sends one request with the GIL released.
template <typename F>
std::shared_ptr<Request> Send(F&& send) {
  KVWorker& w = Worker();
  py::gil_scoped_release nogil;
  return send(w);
}

// hetu._ps.Table: a table on the servers as a worker names it; its operations take keywords.
class RemoteTable {
 public:
  // A push's write-back: keys, rows, optimizer state, steps and version increments.
  using WriteBackArrays = std::tuple<Arr<int64_t>, Arr<float>, Arr<float>, Arr<int64_t>, Arr<int64_t>>;

  RemoteTable(const std::string& name, int64_t rows, int64_t width, bool dense, int64_t state_width,
              const std::string& storage) {
    t_.name = name;
    t_.rows = rows;
    t_.width = width;
    t_.dense = dense;
    t_.state_width = state_width;
    t_.storage = hetu::storage::parse(storage);
    if (t_.storage < 0) throw py::value_error("table '" + name + "': storage '" + storage + "': expected fp32, bf16 or fp16");
    if (dense && t_.storage != hetu::storage::kF32)
      throw py::value_error("table '" + name + "': a dense tensor is stored as fp32, not " + storage);
  }

  Handle Init(int init_kind, double init_a, double init_b, uint64_t seed, uint64_t stream, int optim_kind,
              float momentum, float beta1, float beta2, float eps, float l2reg, float weight_decay, bool bsp,
              int staleness) {
    pb::TableSpec spec;
    spec.set_rows(t_.rows);
    spec.set_width(t_.width);
    spec.set_dense(t_.dense);
    spec.set_init_kind(init_kind);
    spec.set_init_a(init_a);
    spec.set_init_b(init_b);
    spec.set_seed(seed);
    spec.set_stream(stream);
    spec.set_optim_kind(optim_kind);
    spec.set_momentum(momentum);
    spec.set_beta1(beta1);
    spec.set_beta2(beta2);
    spec.set_eps(eps);
    spec.set_l2reg(l2reg);
    spec.set_weight_decay(weight_decay);
    spec.set_bsp(bsp);
    spec.set_staleness(staleness);
    spec.set_storage(t_.storage);
    return Handle(Send([&](KVWorker& w) { return w.Init(t_.name, spec); }), py::list(), kNothing);
  }

  // A dense table's push and pull take no keys.
  Handle Push(std::optional<Arr<int64_t>> keys, Arr<float> grads, std::optional<Arr<int64_t>> counts,
              int64_t iteration, float lr, bool pull, std::optional<WriteBackArrays> write_back) {
    const std::string& name = t_.name;
    const int64_t n = Keys(keys);
    CheckSize(name, "gradient", grads.size(), t_.dense ? t_.rows * t_.width : n * t_.width);
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
      if (t_.dense || pull)
        throw py::value_error("table '" + name + "': a write-back goes with a sparse push, with rows, optimizer "
                              "state, steps and version increments");
      auto& [wb_keys, wb_values, wb_state, wb_steps, wb_version_add] = *write_back;
      wb.n = wb_keys.size();
      CheckSize(name, "write-back rows", wb_values.size(), wb.n * t_.width);
      CheckSize(name, "write-back optimizer state", wb_state.size(), wb.n * t_.state_width);
      CheckSize(name, "write-back steps", wb_steps.size(), wb.n);
      CheckSize(name, "write-back version increments", wb_version_add.size(), wb.n);
      for (py::object o : {py::object(wb_keys), py::object(wb_values), py::object(wb_state), py::object(wb_steps),
                           py::object(wb_version_add)})
        keep.append(o);
      wb.keys = wb_keys.data();
      py::array stored = Stored(wb_values);
      keep.append(stored);
      wb.values = stored.data();
      wb.state = wb_state.data();
      wb.steps = wb_steps.data();
      wb.version_add = wb_version_add.data();
    }
    const WriteBack* wbp = write_back ? &wb : nullptr;
    auto req = Send([&](KVWorker& w) { return w.Push(t_, pull ? kPushPull : kPush, k, n, g, c, iteration, lr, wbp); });
    return Handle(req, keep, pull ? (t_.dense ? kDenseRows : kRows) : kNothing);
  }

  Handle Pull(std::optional<Arr<int64_t>> keys, int64_t iteration) {
    const int64_t n = Keys(keys);
    py::list keep;
    if (keys) keep.append(*keys);
    const int64_t* k = keys ? keys->data() : nullptr;
    auto req = Send([&](KVWorker& w) { return w.Pull(t_, k, n, iteration); });
    return Handle(req, keep, t_.dense ? kDenseRows : kRows);
  }

  Handle PullStale(Arr<int64_t> keys, Arr<int64_t> versions, int64_t bound, int64_t iteration, bool with_state) {
    CheckSize(t_.name, "versions", versions.size(), keys.size());
    py::list keep;
    keep.append(keys);
    keep.append(versions);
    const int64_t *k = keys.data(), *v = versions.data();
    const int64_t n = keys.size();
    auto req = Send([&](KVWorker& w) { return w.PullStale(t_, k, v, n, bound, iteration, with_state); });
    return Handle(req, keep, with_state ? kStaleState : kStale);
  }

  Handle PullWithState(Arr<int64_t> keys, int64_t iteration, std::optional<Arr<uint8_t>> state_mask) {
    py::list keep;
    keep.append(keys);
    const int64_t* k = keys.data();
    const int64_t n = keys.size();
    std::vector<uint8_t> marked;
    if (state_mask) {
      CheckSize(t_.name, "state mask", state_mask->size(), n);
      keep.append(*state_mask);
      marked.assign(state_mask->data(), state_mask->data() + n);
    }
    const uint8_t* mask = state_mask ? state_mask->data() : nullptr;
    auto req = Send([&](KVWorker& w) { return w.PullState(t_, k, n, iteration, mask); });
    return state_mask ? Handle(req, keep, std::move(marked)) : Handle(req, keep, kState);
  }

  Handle Assign(Arr<int64_t> keys, Arr<float> values, Arr<float> state, Arr<int64_t> steps, Arr<int64_t> version_add) {
    const int64_t n = keys.size();
    CheckSize(t_.name, "values", values.size(), n * t_.width);
    CheckSize(t_.name, "optimizer state", state.size(), n * t_.state_width);
    CheckSize(t_.name, "steps", steps.size(), n);
    CheckSize(t_.name, "version_add", version_add.size(), n);
    py::list keep;
    for (py::object o : {py::object(keys), py::object(values), py::object(state), py::object(steps), py::object(version_add)})
      keep.append(o);
    const int64_t *k = keys.data(), *st = steps.data(), *va = version_add.data();
    py::array stored = Stored(values);
    keep.append(stored);
    const void* v = stored.data();
    const float* s = state.data();
    auto req = Send([&](KVWorker& w) { return w.Assign(t_, k, n, v, s, st, va); });
    return Handle(req, keep, kNothing);
  }

  int64_t RowBytes() const { return t_.row_bytes(); }

  // kSave, kLoad or kClear on every server.
  Handle Admin(int op, const std::string& path) {
    return Handle(Send([&](KVWorker& w) { return w.Admin(t_, op, path); }), py::list(), kNothing);
  }

 private:
  // float32 rows as the table moves them: rounded to its storage type (what a 16-bit table's rows
  // already are, so nothing changes for them but the bytes).
  py::array Stored(const Arr<float>& values) const {
    if (t_.storage == hetu::storage::kF32) return values;
    py::array_t<uint16_t> out(values.size());
    hetu::storage::narrow_row(t_.storage, values.data(), out.mutable_data(), values.size());
    return out;
  }

  // How many keys a row operation sends: an embedding table needs them, a dense one takes none.
  int64_t Keys(const std::optional<Arr<int64_t>>& keys) const {
    if (t_.dense) return 0;
    if (!keys) throw py::value_error("table '" + t_.name + "': keys= is needed for an embedding table");
    return keys->size();
  }

  TableRef t_;
};

void Start() {
  if (g_node) throw std::runtime_error("hetu.ps: a node is already running in this process");
  auto node = std::make_unique<NodeState>();
  const Config cfg = Config::FromEnv();
  SimdVariant();  // a bad HETU_SIMD is an error at start, not at a server's first step
  node->po = std::make_unique<Postoffice>(cfg);
  Postoffice* po = node->po.get();
  node->customer = std::make_unique<Customer>([po](int id) { return po->Describe(id); }, cfg.wait_spin_s);
  Customer* customer = node->customer.get();
  if (po->role() == kServer) {
    node->server = std::make_unique<KVServer>(po);
    KVServer* server = node->server.get();
    po->SetDataHandler([server](Message& m) { server->Handle(m); }, KVServer::Brief);
  } else if (po->role() == kWorker) {
    node->worker = std::make_unique<KVWorker>(po, customer);
    po->SetDataHandler(
        [customer](Message& m) {
          if (!m.meta.request()) customer->OnResponse(m);
        },
        [](const Message&) { return true; });
    po->SetDeathHandler([customer](const std::string& why) { customer->FailAll(why); });
  }
  {
    py::gil_scoped_release nogil;
    po->Start();
  }
  g_node = std::move(node);
}

void Finalize() {
  if (!g_node) return;
  {
    py::gil_scoped_release nogil;
    g_node->po->Finalize();
  }
  g_node.reset();
}

}  // namespace

namespace ps {
void RegisterRawBench(py::module& m);
}

PYBIND11_MODULE(_ps, m) {
  m.doc() = "hetu parameter server (ps-lite): node life cycle and worker table operations";

  m.def("start", &Start, "Starts this process's node; role and peers from DMLC_* variables. Returns once all nodes are connected.");
  m.def("finalize", &Finalize, "Worker: tells the scheduler it is done. All roles: stops the node.");
  m.def(
      "wait_for_end",
      [](double timeout) {
        Postoffice* po = Node().po.get();
        std::string why;
        bool ended;
        {
          py::gil_scoped_release nogil;
          ended = po->WaitForEnd(timeout, &why);
        }
        return ended ? py::object(py::str(why)) : py::object(py::none());
      },
      py::arg("timeout") = 0.0,
      "Scheduler/server: blocks until the job ends: '' if it ended cleanly, else why it failed; None on timeout.");
  m.def("rank", [] { return Node().po->rank(); });
  m.def("role", [] { return std::string(RoleName(Node().po->role())); });
  m.def("num_workers", [] { return Node().po->num_workers(); });
  m.def("num_servers", [] { return Node().po->num_servers(); });
  m.def("describe", [](int id) { return Node().po->Describe(id); });
  m.def("failure", [] { return Node().po->failure(); });
  m.def("dropped_messages", [] { return Node().po->dropped_messages(); });
  m.def("van_types", [] { return Van::Types(); }, "The DMLC_PS_VAN_TYPE values this build accepts.");
#ifdef PS_WITH_UCX
  m.def("_ucx_send_raw", [](const std::string& host, int port, const std::string& header, const std::string& payload) {
    return SendRawUcxMessage(host, port, header, payload);
  }, py::call_guard<py::gil_scoped_release>());
#endif
  m.def(
      "barrier",
      [](int group, double timeout) {
        Postoffice* po = Node().po.get();
        py::gil_scoped_release nogil;
        po->Barrier(group, timeout);
      },
      py::arg("group"), py::arg("timeout"));
  m.attr("WORKERS") = static_cast<int>(kWorkerGroup);
  m.attr("SERVERS") = static_cast<int>(kServerGroup);
  m.attr("ALL") = static_cast<int>(kAllGroup);
  m.def("name_stream", [](const std::string& s) { return hetu::rng::name_stream(s.c_str()); });
  m.def("optim_state_width", &hetu::optim::state_width, py::arg("kind"), py::arg("width"));
  m.def(
      "simd_variants",
      [] {
        std::vector<std::pair<std::string, bool>> out;
        for (const auto& v : SimdVariants()) out.emplace_back(v, SimdRunnable(v));
        return out;
      },
      "The versions of the servers' step loop, best first, each with whether this CPU can run it.");
  m.def("simd_variant", &SimdVariant, "The version the servers run: HETU_SIMD, or the best this CPU can run.");
  m.def(
      "step_rows_with",
      [](const std::string& variant, int optim_kind, float momentum, float beta1, float beta2, float eps, float l2reg,
         float weight_decay, float lr, Arr<float> values, Arr<float> state, Arr<int64_t> steps, Arr<int64_t> versions,
         Arr<int64_t> keys, Arr<float> grads) {
        // The server's step of its rows, by a named version (tests/test_simd.py); arrays in place.
        hetu::optim::Config cfg;
        cfg.kind = optim_kind;
        cfg.momentum = momentum;
        cfg.beta1 = beta1;
        cfg.beta2 = beta2;
        cfg.eps = eps;
        cfg.l2reg = l2reg;
        cfg.weight_decay = weight_decay;
        const int64_t rows = steps.size(), width = rows ? values.size() / rows : 0;
        const int64_t state_width = hetu::optim::state_width(optim_kind, width);
        CheckSize("step_rows_with", "values", values.size(), rows * width);
        CheckSize("step_rows_with", "state", state.size(), rows * state_width);
        CheckSize("step_rows_with", "versions", versions.size(), rows);
        CheckSize("step_rows_with", "grads", grads.size(), keys.size() * width);
        for (int64_t i = 0; i < keys.size(); ++i)
          if (keys.data()[i] < 0 || keys.data()[i] >= rows || (i && keys.data()[i] <= keys.data()[i - 1]))
            throw py::value_error("step_rows_with: keys must be distinct rows in increasing order");
        const StepLoopFn step = StepLoopOf(variant);
        UnitCounters counters;
        counters.Reset(rows);
        for (int64_t r = 0; r < rows; ++r) counters.Load(r, steps.data()[r], versions.data()[r]);
        counters.Rebound();
        counters.Reserve(1, 1);
        const StepRowsView view{values.mutable_data(), hetu::storage::kF32, state.mutable_data(), &counters,
                                ps::SlotIndex{}, width, state_width};
        step(cfg, lr, view, keys.data(), 0, keys.size(), grads.data(), nullptr);
        for (int64_t r = 0; r < rows; ++r) {
          steps.mutable_data()[r] = counters.step(r);
          versions.mutable_data()[r] = counters.version(r);
        }
      });
  ps::RegisterRawBench(m);

  py::class_<Handle>(m, "Handle", "An operation in flight. wait(timeout=None) returns its result or raises.")
      .def("wait", &Handle::wait, py::arg("timeout") = py::none(),
           "Blocks (GIL released) until every server answered; returns the result. Raises RuntimeError naming "
           "the table, the key or the peer on error, timeout (default PS_WAIT_TIMEOUT, 600 s) or a dead node.")
      .def("done", &Handle::done);

  py::class_<RemoteTable>(m, "Table",
                          "A table on the servers as a worker names it. Every operation takes keywords and returns a "
                          "Handle; keys are int64, values float32; iteration -1: no synchronisation.")
      .def(py::init<const std::string&, int64_t, int64_t, bool, int64_t, const std::string&>(), py::kw_only(),
           py::arg("name"), py::arg("rows"), py::arg("width"), py::arg("dense") = false, py::arg("state_width") = 0,
           py::arg("storage") = "fp32",
           "storage: the type its rows are stored and moved in (fp32, bf16, fp16); they come and go as float32")
      .def_property_readonly("row_bytes", &RemoteTable::RowBytes, "bytes of a row as the servers store and send it")
      .def("init", &RemoteTable::Init, py::kw_only(), py::arg("init_kind"), py::arg("init_a"), py::arg("init_b"),
           py::arg("seed"), py::arg("stream"), py::arg("optim_kind"), py::arg("momentum"), py::arg("beta1"),
           py::arg("beta2"), py::arg("eps"), py::arg("l2reg"), py::arg("weight_decay"), py::arg("bsp"),
           py::arg("staleness"), "Creates the table on every server (result: None).")
      .def("push", &RemoteTable::Push, py::kw_only(), py::arg("keys") = py::none(), py::arg("grads"),
           py::arg("counts") = py::none(), py::arg("iteration") = -1, py::arg("lr"), py::arg("pull") = false,
           py::arg("write_back") = py::none(),
           "pull=True: push-pull (result: the rows after the push's iteration). write_back: (keys, values, state, "
           "steps, version_add), written just before the push is taken in.")
      .def("pull", &RemoteTable::Pull, py::kw_only(), py::arg("keys") = py::none(), py::arg("iteration") = -1)
      .def("pull_stale", &RemoteTable::PullStale, py::kw_only(), py::arg("keys"), py::arg("versions"),
           py::arg("bound") = 0, py::arg("iteration") = -1, py::arg("with_state") = false)
      .def("pull_with_state", &RemoteTable::PullWithState, py::kw_only(), py::arg("keys"), py::arg("iteration") = -1,
           py::arg("state_mask") = py::none())
      .def("assign", &RemoteTable::Assign, py::kw_only(), py::arg("keys"), py::arg("values"), py::arg("state"),
           py::arg("steps"), py::arg("version_add"))
      .def("save", [](RemoteTable& t, const std::string& path) { return t.Admin(kSave, path); }, py::kw_only(),
           py::arg("path"))
      .def("load", [](RemoteTable& t, const std::string& path) { return t.Admin(kLoad, path); }, py::kw_only(),
           py::arg("path"))
      .def("clear", [](RemoteTable& t) { return t.Admin(kClear, ""); });

  m.def("server_stats", [] { return Handle(Send([](KVWorker& w) { return w.Stats(); }), py::list(), kServerStats); }, "Worker: what every server has served so far (a Handle of one dict per server, in rank order).");
  m.def("own_server_stats", [] {
    NodeState& node = Node();
    if (!node.server) throw std::runtime_error("hetu.ps: own_server_stats() is for a server");
    const KVServer::Counters c = node.server->counters();
    py::dict d;
    d["requests"] = c.requests;
    d["rows"] = c.rows;
    d["bytes"] = c.bytes;
    d["busy_seconds"] = c.busy_seconds;
    return d;
  }, "Server: what this server has served so far.");
}
