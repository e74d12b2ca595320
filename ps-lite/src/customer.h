// Customer: the worker's outstanding requests. A request goes out as one message per server
// ("part"); it completes when every part has been answered, fails with the servers' error
// text, or fails when a peer dies. Waits always have a deadline and name who did not answer.
#pragma once
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "message.h"

namespace ps {

struct Part {
  int node = -1;
  // Positions of this part's keys in the caller's key array: [begin, end) when contiguous,
  // else the explicit list `pos`.
  int64_t begin = 0, end = 0;
  std::vector<int64_t> pos;
  bool contiguous = true;
  int64_t size() const { return contiguous ? end - begin : static_cast<int64_t>(pos.size()); }
  int64_t at(int64_t i) const { return contiguous ? begin + i : pos[i]; }
  // Keys [b, e) of this part, as a part to the same node.
  Part Piece(int64_t b, int64_t e) const {
    Part p;
    p.node = node;
    p.contiguous = contiguous;
    if (contiguous) {
      p.begin = begin + b;
      p.end = begin + e;
    } else {
      p.pos.assign(pos.begin() + b, pos.begin() + e);
    }
    return p;
  }
  Message response;
  bool answered = false;
  bool chunked = false;  // the part's rows came in chunks, already copied into Request::rows
};

struct Request {
  std::string what;  // "pull of table 'emb'": how errors name the request
  int op = 0;
  int64_t num_keys = 0, width = 0, state_width = 0;
  bool dense = false;     // of a dense tensor: num_keys counts its elements
  int storage = 0;        // the type rows move in (hetu::storage::Type)
  int64_t row_bytes = 0;  // a row as the table stores and moves it (TableRef::row_bytes)
  std::vector<Part> parts;
  std::chrono::steady_clock::time_point sent;  // when it was tracked (Customer::InFlight)
  std::mutex mu;
  std::condition_variable cv;
  int remaining = 0;
  std::string error;
  bool abandoned = false;  // the job failed: the missing answers will never come
  // A pull whose answers may come in chunks: num_keys rows of row_bytes, filled as chunks
  // arrive (on the receive thread, while the van takes in the next), so the result needs no
  // copy once the last one is in.
  Blob rows;
  char* rows_data = nullptr;
  bool finished() {
    std::lock_guard<std::mutex> lk(mu);
    return remaining == 0 || !error.empty();
  }
  // No part can still be in flight, so the caller's arrays (sent without copying) may go.
  bool settled() {
    std::lock_guard<std::mutex> lk(mu);
    return remaining == 0 || abandoned;
  }
};

class Customer {
 public:
  // Describes a node id for error messages.
  // wait_spin_s: how long Wait polls for the answer before it sleeps. Waking a sleeping
  // thread costs a futex call and, when its core went idle, a wake-up of that core (on virtual
  // machines an interrupt through the hypervisor): tens of microseconds per request. Polling
  // (yielding the core to any other runnable thread) saves that where cores are to spare and
  // costs the other threads CPU where they are not, so it is the user's choice (PS_WAIT_SPIN_US).
  Customer(std::function<std::string(int)> describe, double wait_spin_s = 0)
      : describe_(std::move(describe)), wait_spin_s_(wait_spin_s) {}

  // Registers the request before its parts are sent; returns its timestamp.
  int64_t Track(const std::shared_ptr<Request>& req);
  void OnResponse(Message& msg);
  // Fails every outstanding and future request (a peer died).
  void FailAll(const std::string& why);
  // Throws std::runtime_error on error or timeout; the message names the missing servers.
  void Wait(const std::shared_ptr<Request>& req, double timeout_s);
  // Until every part is answered or the job failed; false on timeout. Never throws.
  bool WaitSettled(const std::shared_ptr<Request>& req, double timeout_s);
  std::string failure();

  // A request still owed answers: how errors name it, seconds since it was sent, and the
  // nodes that have not answered (described).
  struct Unanswered {
    std::string what;
    double seconds = 0;
    std::vector<std::string> owed_by;
  };
  // The requests in flight now (what a worker that stopped making progress waits on).
  std::vector<Unanswered> InFlight();

 private:
  std::function<std::string(int)> describe_;
  double wait_spin_s_;
  std::mutex mu_;
  int64_t next_ts_ = 1;
  std::map<int64_t, std::shared_ptr<Request>> pending_;
  std::string failure_;
};

}  // namespace ps
