// The transport's limit for bench/ps_throughput.py: the same libzmq, sockets (DEALER ->
// ROUTER over TCP) and malloc setting as the ZMQ van, moving the same bytes as a sparse
// pull or push, with no parameter-server work (no lookups, no gather, no optimizer).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <zmq.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

#include "postoffice.h"

namespace py = pybind11;

namespace ps {
namespace {

void NoFree(void*, void*) {}

void SendFrame(void* s, const void* p, size_t n, int flags) {
  if (n < 4096) {  // small (and possibly stack) data is copied, as the van does for the meta
    if (zmq_send(s, p, n, flags) < 0) throw std::runtime_error(std::string("raw bench send: ") + zmq_strerror(zmq_errno()));
    return;
  }
  zmq_msg_t m;
  zmq_msg_init_data(&m, const_cast<void*>(p), n, NoFree, nullptr);
  if (zmq_msg_send(&m, s, flags) < 0) throw std::runtime_error(std::string("raw bench send: ") + zmq_strerror(zmq_errno()));
}

// Receives a whole multipart message; returns the frame sizes.
std::vector<size_t> RecvAll(void* s) {
  std::vector<size_t> sizes;
  int more = 1;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, s, 0) < 0) throw std::runtime_error(std::string("raw bench recv: ") + zmq_strerror(zmq_errno()));
    sizes.push_back(zmq_msg_size(&m));
    more = zmq_msg_more(&m);
    zmq_msg_close(&m);
  }
  return sizes;
}

// Answers [op, keys(, rows)] : op 'p' with keys/8 rows of `width` floats, 'u' with an empty
// frame, 's' stops.
void RawServer(int port, int64_t width, int64_t max_rows) {
  TuneMalloc();
  std::vector<float> rows(max_rows * width, 0.0f);
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
    const char op = count > 1 && zmq_msg_size(&frames[1]) ? *static_cast<char*>(zmq_msg_data(&frames[1])) : 's';
    const size_t keys = count > 2 ? zmq_msg_size(&frames[2]) / 8 : 0;
    zmq_msg_send(&frames[0], s, ZMQ_SNDMORE);  // the peer's identity
    if (op == 'p') SendFrame(s, rows.data(), std::min<size_t>(keys, max_rows) * width * 4, 0);
    else SendFrame(s, nullptr, 0, 0);
    for (auto& f : frames) zmq_msg_close(&f);
    if (op == 's') break;
  }
  int linger = 1000;
  zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof(linger));
  zmq_close(s);
  zmq_ctx_term(ctx);
}

// Round trips of one batch split evenly over the servers: returns (count, seconds).
std::pair<long, double> RawClient(std::vector<int> ports, const std::string& op, int64_t batch, int64_t width,
                                  double seconds) {
  TuneMalloc();
  void* ctx = zmq_ctx_new();
  std::vector<void*> socks;
  for (int p : ports) {
    void* d = zmq_socket(ctx, ZMQ_DEALER);
    zmq_connect(d, ("tcp://127.0.0.1:" + std::to_string(p)).c_str());
    socks.push_back(d);
  }
  std::vector<int64_t> keys(batch);
  std::vector<float> grads(batch * width, 1e-3f);
  const size_t S = socks.size();
  auto once = [&] {
    for (size_t i = 0; i < S; ++i) {
      const int64_t b = batch * i / S, e = batch * (i + 1) / S;
      const char c = op == "pull" ? 'p' : op == "push" ? 'u' : 's';
      SendFrame(socks[i], &c, 1, ZMQ_SNDMORE);
      SendFrame(socks[i], keys.data() + b, (e - b) * 8, c == 'u' ? ZMQ_SNDMORE : 0);
      if (c == 'u') SendFrame(socks[i], grads.data() + b * width, (e - b) * width * 4, 0);
    }
    for (size_t i = 0; i < S; ++i) {
      const int64_t b = batch * i / S, e = batch * (i + 1) / S;
      std::vector<size_t> got = RecvAll(socks[i]);
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
      [](int port, int64_t width, int64_t max_rows) {
        py::gil_scoped_release nogil;
        RawServer(port, width, max_rows);
      },
      "bench only: a bare ZMQ ROUTER answering pull/push-shaped requests until told to stop");
  m.def(
      "_raw_bench_client",
      [](std::vector<int> ports, const std::string& op, int64_t batch, int64_t width, double seconds) {
        py::gil_scoped_release nogil;
        return RawClient(ports, op, batch, width, seconds);
      },
      "bench only: (round trips, seconds) of pull/push-shaped requests to raw servers; op 'stop' ends them");
}

}  // namespace ps
