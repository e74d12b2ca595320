// What hetu._ps is made of (binding.cc puts it together): the node this process runs
// (py_node.cc), the Handle of an operation in flight and the NumPy results built from its
// answers (py_handle.cc), and RemoteTable, the Python class `Table`, to which each op's file
// (ops/*.cc) adds its methods. Arrays are NumPy (int64 keys, float32 values); every operation
// returns a Handle at once and Handle.wait() blocks with the GIL released.
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "customer.h"
#include "kv.h"
#include "kv_server.h"
#include "kv_worker.h"
#include "postoffice.h"

namespace ps {

namespace py = pybind11;

template <typename T>
using Arr = py::array_t<T, py::array::c_style | py::array::forcecast>;

// ---- the node (py_node.cc) -------------------------------------------------------------------

struct NodeState {
  std::unique_ptr<Postoffice> po;
  std::unique_ptr<Customer> customer;
  std::unique_ptr<KVServer> server;
  std::unique_ptr<KVWorker> worker;
};
NodeState& Node();    // throws unless this process started a node
bool NodeRunning();   // without throwing
KVWorker& Worker();   // throws unless this node is a worker
double DefaultWaitTimeout();  // PS_WAIT_TIMEOUT
void BindNode(py::module_& m);  // start, finalize, rank, barrier, ...

// Sends one request with the GIL released.
template <typename F>
std::shared_ptr<Request> Send(F&& send) {
  KVWorker& w = Worker();
  py::gil_scoped_release nogil;
  return send(w);
}

// ---- an operation in flight (py_handle.cc) ---------------------------------------------------

// What a call asked for beyond its keys, which shapes its result (OpDef::result).
struct Asked {
  bool with_state = false;                     // the rows come with their optimizer state
  std::optional<std::vector<uint8_t>> marked;  // a byte per key: 1 = its state asked for
};

class Handle {
 public:
  // keep: the caller's arrays, alive while the van may still read them.
  Handle(std::shared_ptr<Request> req, py::list keep, Asked asked = {})
      : req_(std::move(req)), keep_(std::move(keep)), asked_(std::move(asked)) {}
  // Moved, never copied: a moved-from handle owns nothing, so its destructor must not wait
  // (pybind11 moves the returned handle into the Python object).
  Handle(Handle&& o) noexcept
      : req_(std::move(o.req_)), keep_(std::move(o.keep_)), asked_(std::move(o.asked_)),
        result_(std::move(o.result_)), consumed_(o.consumed_) {}
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle();

  bool done() { return req_->finished(); }
  py::object wait(py::object timeout);

 private:
  std::shared_ptr<Request> req_;
  py::list keep_;
  Asked asked_;
  py::object result_ = py::none();
  bool consumed_ = false;
};

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

// Blob `bi` of every part (`per` elements per key) in the caller's key order.
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

// 16-bit rows as the table moves them -> float32 rows (widened exactly; common/storage.h). `raw`
// holds n x w elements of `storage` (gathered with Gathered<uint16_t>).
py::array Widened(const py::array& raw, int storage, py::ssize_t n, py::ssize_t w);
// Blob `bi` of every part: the request's rows, as float32.
py::array Rows(Request& r, size_t bi);
// The result of a pull or push-pull: the rows (ops/pull.cc).
py::object PulledRows(Request& r, const Asked&);

// ---- the Python class Table (ops/*.cc add its methods) ---------------------------------------

void CheckSize(const std::string& table, const char* what, py::ssize_t got, int64_t want);

// hetu._ps.Table: a table on the servers as a worker names it; its operations take keywords.
class RemoteTable {
 public:
  RemoteTable(const std::string& name, int64_t rows, int64_t width, bool dense, int64_t state_width,
              const std::string& storage);
  const TableRef& ref() const { return t_; }
  // float32 rows as the table moves them: rounded to its storage type (what a 16-bit table's
  // rows already are, so nothing changes for them but the bytes).
  py::array Stored(const Arr<float>& values) const;
  // How many keys a row operation sends: an embedding table needs them, a dense one takes none.
  int64_t Keys(const std::optional<Arr<int64_t>>& keys) const;

 private:
  TableRef t_;
};

// Sends `op` on a whole table to every server (ops/admin.cc): meta path `path`, meta arg `mark`,
// and `args` as one int64 blob when there are any.
Handle Admin(RemoteTable& table, int op, const std::string& path, int64_t mark,
             const std::vector<int64_t>& args = {});

// Where an op's file adds its methods (OpDef::bind).
struct PyFace {
  py::module_& m;
  py::class_<RemoteTable>& table;
};

}  // namespace ps
