// The transport's limit for bench/ps_throughput.py: the same libzmq, sockets (DEALER ->
// ROUTER over TCP) and malloc setting as the ZMQ van, moving the same bytes as a sparse
// pull or push, with no parameter-server work (no lookups, no gather, no optimizer).
//
// With tables, the same round trips plus the table work a server cannot skip, done the
// plainest way: the answer to a pull is gathered from a TableShard, a push is stepped into
// one once it has arrived whole. What the parameter server takes beyond that is its own
// overhead (protocol, threads, Python); what it takes beyond the bare round trip is this work.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "optim_config.h"
#include "postoffice.h"
#include "table.h"

namespace py = pybind11;

namespace ps {
namespace {

const int kAnswerTimeoutMs = 60000;  // a raw client's wait for one answer

void NoFree(void*, void*) {}
void FreeRows(void* data, void*) { delete[] static_cast<float*>(data); }

void SendFrame(void* s, const void* p, size_t n, int flags) {
  if (n < 4096) {  // small (and possibly stack) data is copied, as the van does for the meta
    if (zmq_send(s, p, n, flags) < 0) throw std::runtime_error(std::string("raw bench send: ") + zmq_strerror(zmq_errno()));
    return;
  }
  zmq_msg_t m;
  zmq_msg_init_data(&m, const_cast<void*>(p), n, NoFree, nullptr);
  if (zmq_msg_send(&m, s, flags) < 0) throw std::runtime_error(std::string("raw bench send: ") + zmq_strerror(zmq_errno()));
}

// Receives a whole multipart message; returns the frame sizes. spin_s > 0: polls for the first
// frame that long before it blocks, as a PS worker with PS_WAIT_SPIN_US does (customer.h).
std::vector<size_t> RecvAll(void* s, const std::string& peer, double spin_s = 0) {
  std::vector<size_t> sizes;
  int more = 1;
  const double until = spin_s > 0 ? NowSeconds() + spin_s : 0;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    int got = -1;
    while (sizes.empty() && NowSeconds() < until) {
      if ((got = zmq_msg_recv(&m, s, ZMQ_DONTWAIT)) >= 0 || zmq_errno() != EAGAIN) break;
      std::this_thread::yield();
    }
    if (got < 0) got = zmq_msg_recv(&m, s, 0);
    if (got < 0 && zmq_errno() == EAGAIN)  // ZMQ_RCVTIMEO: the server died or never answered
      throw std::runtime_error("raw bench: no answer from " + peer + " within " + std::to_string(kAnswerTimeoutMs / 1000) +
                               " s");
    if (got < 0) throw std::runtime_error(std::string("raw bench recv: ") + zmq_strerror(zmq_errno()));
    sizes.push_back(zmq_msg_size(&m));
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  return sizes;
}

// Answers [op, keys(, rows)] : op 'p' with keys/8 rows of `width` floats, 'u' with an empty
// frame, 's' stops. With tables (one per optimizer kind, rows [lo, hi) of `table_rows` as server
// `rank` of `servers` owns them), a pull's rows are gathered from the first table and a push
// ('u' then the table's index byte) is stepped into its table before the answer.
void RawServer(int port, int64_t width, int64_t max_rows, int64_t table_rows, const std::vector<int>& optimizers,
               int rank, int servers) {
  TuneMalloc();
  std::vector<float> rows(max_rows * width, 0.0f);
  std::vector<std::unique_ptr<TableShard>> tables;
  for (int kind : optimizers) {
    pb::TableSpec spec;
    spec.set_rows(table_rows);
    spec.set_width(width);
    hetu::optim::Config optim;  // the default hyperparameters
    optim.kind = kind;
    *spec.mutable_optim() = OptimToProto(optim);
    spec.set_placement(RowPlacement::KindFromEnv());  // as the parameter server places them
    tables.push_back(std::make_unique<TableShard>("raw", spec, rank, servers));
  }
  void* ctx = zmq_ctx_new();
  void* s = zmq_socket(ctx, ZMQ_ROUTER);
  std::string addr = "tcp://127.0.0.1:" + std::to_string(port);
  if (zmq_bind(s, addr.c_str()) != 0) throw std::runtime_error("raw bench: cannot bind " + addr);
  for (;;) {
    // [identity, op, keys(, rows)]; zmq_msg_t must not be moved, so a fixed array.
    zmq_msg_t frames[4];
    for (auto& f : frames) zmq_msg_init(&f);
    size_t count = 0;
    int more = 1;
    while (more) {
      zmq_msg_t m;
      zmq_msg_init(&m);
      zmq_msg_recv(&m, s, 0);
      more = zmq_msg_more(&m);
      if (count < 4) zmq_msg_move(&frames[count++], &m);
      zmq_msg_close(&m);
    }
    const size_t op_size = count > 1 ? zmq_msg_size(&frames[1]) : 0;
    const char* op_bytes = op_size ? static_cast<char*>(zmq_msg_data(&frames[1])) : nullptr;
    const char op = op_bytes ? op_bytes[0] : 's';
    const size_t keys = count > 2 ? zmq_msg_size(&frames[2]) / 8 : 0;
    const auto* key_data = count > 2 ? static_cast<const int64_t*>(zmq_msg_data(&frames[2])) : nullptr;
    zmq_msg_send(&frames[0], s, ZMQ_SNDMORE);  // the peer's identity
    if (op == 'p' && !tables.empty()) {
      const int64_t n = static_cast<int64_t>(keys);
      const std::string bad = tables[0]->CheckKeys(key_data, n);
      if (!bad.empty()) throw std::runtime_error("raw bench: " + bad);
      auto* out = new float[std::max<int64_t>(1, n * width)];
      tables[0]->Gather(key_data, n, out);
      zmq_msg_t m;
      zmq_msg_init_data(&m, out, n * width * 4, FreeRows, nullptr);
      zmq_msg_send(&m, s, 0);
    } else if (op == 'p') {
      SendFrame(s, rows.data(), std::min<size_t>(keys, max_rows) * width * 4, 0);
    } else {
      if (op == 'u' && !tables.empty() && count > 3) {
        const size_t t = op_size > 1 ? static_cast<size_t>(op_bytes[1]) : 0;
        if (t >= tables.size()) throw std::runtime_error("raw bench: no table " + std::to_string(t));
        TableShard::Push push;
        push.keys = key_data;
        push.values = static_cast<const float*>(zmq_msg_data(&frames[3]));
        push.n = static_cast<int64_t>(keys);
        tables[t]->Apply({push}, 0.1f);
      }
      SendFrame(s, nullptr, 0, 0);
    }
    for (auto& f : frames) zmq_msg_close(&f);
    if (op == 's') break;
  }
  int linger = 1000;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_close(s);
  zmq_ctx_term(ctx);
}

// Round trips of one batch split evenly over the servers: returns (count, seconds).
// With keys (sorted, of a table of `table_rows` rows), each server gets the keys of the rows it
// owns, and a push names its table by `table` (the index byte after 'u').
std::pair<long, double> RawClient(std::vector<int> ports, const std::string& op, int64_t batch, int64_t width,
                                  double seconds, std::vector<int64_t> table_keys, int64_t table_rows, int table) {
  TuneMalloc();
  const double spin_s = WaitSpinSeconds();
  void* ctx = zmq_ctx_new();
  std::vector<void*> socks;
  for (int p : ports) {
    void* d = zmq_socket(ctx, ZMQ_DEALER);
    zmq_setsockopt(d, ZMQ_RCVTIMEO, &kAnswerTimeoutMs, sizeof(kAnswerTimeoutMs));
    zmq_connect(d, ("tcp://127.0.0.1:" + std::to_string(p)).c_str());
    socks.push_back(d);
  }
  const bool with_table = !table_keys.empty();
  std::vector<int64_t> keys = with_table ? std::move(table_keys) : std::vector<int64_t>(batch);
  batch = static_cast<int64_t>(keys.size());
  std::vector<float> grads(batch * width, 1e-3f);
  const size_t S = socks.size();
  // Server i's keys are [bounds[i], bounds[i + 1]): an even split, or the rows it holds (keys
  // grouped by server once, still sorted within each group).
  std::vector<int64_t> bounds(S + 1);
  for (size_t i = 0; i <= S; ++i) bounds[i] = batch * i / S;
  if (with_table) {
    const RowPlacement placement(RowPlacement::KindFromEnv(), table_rows, static_cast<int>(S));
    std::stable_sort(keys.begin(), keys.end(),
                     [&](int64_t a, int64_t b) { return placement.Server(a) < placement.Server(b); });
    for (size_t i = 0; i < S; ++i)
      bounds[i] = std::find_if(keys.begin(), keys.end(),
                               [&](int64_t k) { return placement.Server(k) >= static_cast<int>(i); }) -
                  keys.begin();
  }
  auto once = [&] {
    for (size_t i = 0; i < S; ++i) {
      const int64_t b = bounds[i], e = bounds[i + 1];
      const char c = op == "pull" ? 'p' : op == "push" ? 'u' : 's';
      const char head[2] = {c, static_cast<char>(table)};
      SendFrame(socks[i], head, c == 'u' && with_table ? 2 : 1, ZMQ_SNDMORE);
      SendFrame(socks[i], keys.data() + b, (e - b) * 8, c == 'u' ? ZMQ_SNDMORE : 0);
      if (c == 'u') SendFrame(socks[i], grads.data() + b * width, (e - b) * width * 4, 0);
    }
    for (size_t i = 0; i < S; ++i) {
      const int64_t b = bounds[i], e = bounds[i + 1];
      std::vector<size_t> got = RecvAll(socks[i], "the raw server on port " + std::to_string(ports[i]), spin_s);
      const size_t want = op == "pull" ? (e - b) * width * 4 : 0;
      if (got.size() != 1 || got[0] != want)
        throw std::runtime_error("raw bench: answer of " + std::to_string(got.empty() ? 0 : got[0]) +
                                 " bytes, expected " + std::to_string(want));
    }
  };
  long n = 0;
  double elapsed = 0;
  if (op == "stop") {
    once();
  } else {
    once();
    once();
    const double start = NowSeconds();
    do {
      once();
      ++n;
      elapsed = NowSeconds() - start;
    } while (elapsed < seconds);
  }
  for (void* d : socks) {
    int linger = 1000;
    zmq_setsockopt(d, ZMQ_LINGER, &linger, sizeof(linger));
    zmq_close(d);
  }
  zmq_ctx_term(ctx);
  return {n, elapsed};
}

}  // namespace

void RegisterRawBench(py::module& m) {
  m.def(
      "_raw_bench_server",
      [](int port, int64_t width, int64_t max_rows, int64_t table_rows, std::vector<int> optimizers, int rank,
         int servers) {
        py::gil_scoped_release nogil;
        RawServer(port, width, max_rows, table_rows, optimizers, rank, servers);
      },
      py::arg("port"), py::arg("width"), py::arg("max_rows"), py::arg("table_rows") = 0,
      py::arg("optimizers") = std::vector<int>{}, py::arg("rank") = 0, py::arg("servers") = 1,
      "bench only: a bare ZMQ ROUTER answering pull/push-shaped requests until told to stop; with "
      "optimizers (kinds), it gathers pulls from and steps pushes into tables of table_rows rows");
  m.def(
      "_raw_bench_client",
      [](std::vector<int> ports, const std::string& op, int64_t batch, int64_t width, double seconds,
         std::vector<int64_t> keys, int64_t table_rows, int table) {
        py::gil_scoped_release nogil;
        return RawClient(ports, op, batch, width, seconds, std::move(keys), table_rows, table);
      },
      py::arg("ports"), py::arg("op"), py::arg("batch"), py::arg("width"), py::arg("seconds"),
      py::arg("keys") = std::vector<int64_t>{}, py::arg("table_rows") = 0, py::arg("table") = 0,
      "bench only: (round trips, seconds) of pull/push-shaped requests to raw servers; op 'stop' ends them");
}

}  // namespace ps
