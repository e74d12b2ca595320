// One Herald planner per host (docs/design.md section 7). The host's first worker plans for every
// worker of the host (Planner with all their ranks) and sends each of the others its samples and
// plan of every iteration over a Unix stream socket; they receive them on a thread of their own
// into a PlanBook, so that a host plans once per iteration, not once per worker.
//
// The sockets live in the abstract namespace, which belongs to the network namespace: hosts
// never see each other's, namespace hosts included. The listener's address is picked by the
// kernel (autobind) and handed to the host's other workers by the caller (over MPI).
#pragma once
#include <atomic>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "herald/plan_book.h"

namespace hetu {
namespace herald {

// A socket descriptor, closed when dropped.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

class PlanListener {
 public:
  PlanListener();  // bound and listening on an address of the kernel's choosing
  // The address, for the host's other workers to connect to.
  const std::string& name() const { return name_; }
  // One connection from each of `ranks` (each sends its rank first), in the order of `ranks`.
  // Throws, naming the ranks that did not connect, after timeout_s.
  std::vector<Socket> Accept(const std::vector<int>& ranks, double timeout_s);

 private:
  Socket socket_;
  std::string name_;
};

// Worker `rank`'s part of one iteration, as the host's planner sends it: its samples of
// `iteration` and, if has_finished, its final plan of iteration - 1. Throws, naming the rank, if
// the worker's socket fails or takes no data for timeout_s, or once `stop` is set.
void SendAdvanced(const Socket& socket, int rank, int64_t iteration, const std::vector<int64_t>& samples,
                  bool has_finished, const FinishedPlan& finished, double timeout_s, const std::atomic<bool>& stop);

// A worker's end: connects to its host's planner (the worker of rank `planner_rank`, listening at
// `name`) and puts what it sends into book(), on a thread of its own.
class PlanReceiver {
 public:
  PlanReceiver(const std::string& name, int rank, int planner_rank, int64_t history, double timeout_s);
  ~PlanReceiver();
  PlanReceiver(const PlanReceiver&) = delete;
  PlanReceiver& operator=(const PlanReceiver&) = delete;
  PlanBook& book() { return book_; }
  // Stops receiving; waits not yet answered then fail.
  void Stop();

 private:
  void Run();

  const int planner_rank_;
  Socket socket_;
  PlanBook book_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: it starts once everything above is set
};

}  // namespace herald
}  // namespace hetu
