#include "herald/plan_link.h"

#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace hetu {
namespace herald {

namespace {

using Clock = std::chrono::steady_clock;

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }

Clock::time_point Deadline(double timeout_s) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
}

// Milliseconds to poll before looking at the clock and the stop flag again.
int PollSlice(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 200));
}

std::string RankList(const std::vector<int>& ranks) {
  std::string out;
  for (const int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

sockaddr_un AbstractAddress(const std::string& name, socklen_t* length) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof(a.sun_path)) throw std::invalid_argument("plan socket name too long: " + name);
  a.sun_path[0] = '\0';  // the abstract namespace
  std::memcpy(a.sun_path + 1, name.data(), name.size());
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return a;
}

// Writes all of [data, data + n); false if the peer is gone. Gives up (throws `late`) once the
// deadline passes with nothing written, or when `stop` is set.
bool WriteAll(int fd, const char* data, size_t n, double timeout_s, const std::atomic<bool>& stop,
              const std::string& late) {
  auto deadline = Deadline(timeout_s);
  while (n > 0) {
    const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w > 0) {
      data += w;
      n -= static_cast<size_t>(w);
      deadline = Deadline(timeout_s);  // the reader is alive
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (stop.load()) throw std::runtime_error("Herald host planner stopped while sending");
    if (Clock::now() >= deadline) throw PlanTimeout(late);
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, PollSlice(deadline));
  }
  return true;
}

// Reads exactly n bytes; false at end of stream before the first byte (throws if it ends later).
bool ReadAll(int fd, char* data, size_t n) {
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, data + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r == 0 && got == 0) return false;
    if (r == 0) throw std::runtime_error("the plan connection ended inside a message");
    throw std::runtime_error(Errno("receiving plans"));
  }
  return true;
}

// A message: a byte count, then the fields one after another; vectors as a count and elements.
class Writer {
 public:
  Writer() { bytes_.resize(sizeof(uint64_t)); }
  template <typename T>
  void Put(T v) {
    bytes_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  template <typename T>
  void Put(const std::vector<T>& v) {
    Put<uint64_t>(v.size());
    bytes_.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
  }
  const std::string& Finish() {
    const uint64_t n = bytes_.size() - sizeof(uint64_t);
    std::memcpy(bytes_.data(), &n, sizeof n);
    return bytes_;
  }

 private:
  std::string bytes_;
};

class Reader {
 public:
  explicit Reader(const std::string& bytes) : at_(bytes.data()), end_(bytes.data() + bytes.size()) {}
  template <typename T>
  T Get() {
    T v;
    Take(&v, sizeof(T));
    return v;
  }
  template <typename T>
  std::vector<T> GetVector() {
    const uint64_t n = Get<uint64_t>();
    if (n > static_cast<uint64_t>(end_ - at_) / sizeof(T)) throw std::runtime_error("a plan message is cut short");
    std::vector<T> v(n);
    Take(v.data(), n * sizeof(T));
    return v;
  }
  bool done() const { return at_ == end_; }

 private:
  void Take(void* out, size_t n) {
    if (n > static_cast<size_t>(end_ - at_)) throw std::runtime_error("a plan message is cut short");
    std::memcpy(out, at_, n);
    at_ += n;
  }
  const char* at_;
  const char* end_;
};

constexpr uint32_t kMagic = 0x484c504e;  // a message of this protocol

}  // namespace

Socket::~Socket() {
  if (fd_ >= 0) ::close(fd_);
}

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

PlanListener::PlanListener() : socket_(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
  if (socket_.fd() < 0) throw std::runtime_error(Errno("Herald host planner: socket"));
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  // Binding no more than the family asks the kernel for a free abstract address of its own.
  if (::bind(socket_.fd(), reinterpret_cast<sockaddr*>(&a), sizeof(sa_family_t)) != 0)
    throw std::runtime_error(Errno("Herald host planner: bind"));
  socklen_t length = sizeof a;
  if (::getsockname(socket_.fd(), reinterpret_cast<sockaddr*>(&a), &length) != 0)
    throw std::runtime_error(Errno("Herald host planner: getsockname"));
  const size_t offset = offsetof(sockaddr_un, sun_path) + 1;
  if (length <= offset || a.sun_path[0] != '\0') throw std::runtime_error("Herald host planner: no abstract address");
  name_.assign(a.sun_path + 1, length - offset);
  if (::listen(socket_.fd(), 64) != 0) throw std::runtime_error(Errno("Herald host planner: listen"));
}

std::vector<Socket> PlanListener::Accept(const std::vector<int>& ranks, double timeout_s) {
  std::vector<Socket> out(ranks.size());
  std::vector<int> missing = ranks;
  const auto deadline = Deadline(timeout_s);
  while (!missing.empty()) {
    if (Clock::now() >= deadline)
      throw PlanTimeout("Herald host planner: no plan connection from worker rank(s) " + RankList(missing) +
                        " of this host in " + std::to_string(static_cast<int64_t>(timeout_s)) + " s");
    pollfd p{socket_.fd(), POLLIN, 0};
    if (::poll(&p, 1, PollSlice(deadline)) <= 0) continue;
    Socket peer(::accept4(socket_.fd(), nullptr, nullptr, SOCK_CLOEXEC));
    if (peer.fd() < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      throw std::runtime_error(Errno("Herald host planner: accept"));
    }
    // The worker says its rank first (a few bytes, sent right after connecting).
    pollfd q{peer.fd(), POLLIN, 0};
    int64_t rank = -1;
    if (::poll(&q, 1, std::max(PollSlice(deadline), 1000)) <= 0 || !ReadAll(peer.fd(), reinterpret_cast<char*>(&rank), sizeof rank))
      throw std::runtime_error("Herald host planner: a worker connected without saying its rank");
    const auto at = std::find(ranks.begin(), ranks.end(), rank);
    const auto left = std::find(missing.begin(), missing.end(), rank);
    if (at == ranks.end() || left == missing.end())
      throw std::runtime_error("Herald host planner: unexpected plan connection from worker rank " +
                               std::to_string(rank) + " (expected " + RankList(ranks) + ")");
    out[at - ranks.begin()] = std::move(peer);
    missing.erase(left);
  }
  return out;
}

void SendAdvanced(const Socket& socket, int rank, int64_t iteration, const std::vector<int64_t>& samples,
                  bool has_finished, const FinishedPlan& finished, double timeout_s, const std::atomic<bool>& stop) {
  Writer w;
  w.Put(kMagic);
  w.Put(iteration);
  w.Put(samples);
  w.Put<uint8_t>(has_finished);
  if (has_finished) {
    const WorkerPlan& p = finished.plan;
    w.Put(p.iteration);
    w.Put(p.samples);
    w.Put(p.keys);
    w.Put(p.hit);
    w.Put(p.pull);
    w.Put(p.owner);
    w.Put(p.invalidate);
    w.Put(p.writeback);
    w.Put(finished.planner_seconds);
  }
  const std::string& bytes = w.Finish();
  const std::string late = "Herald host planner: worker rank " + std::to_string(rank) + " took no plan data for " +
                           std::to_string(static_cast<int64_t>(timeout_s)) + " s";
  if (!WriteAll(socket.fd(), bytes.data(), bytes.size(), timeout_s, stop, late))
    throw std::runtime_error("Herald host planner: worker rank " + std::to_string(rank) +
                             " closed its plan connection (" + std::strerror(errno) + "); did it exit?");
}

PlanReceiver::PlanReceiver(const std::string& name, int rank, int planner_rank, int64_t history, double timeout_s)
    : planner_rank_(planner_rank),
      book_(history, "the Herald planner of worker rank " + std::to_string(planner_rank) + " (this host's first worker)",
            false) {
  socklen_t length;
  const sockaddr_un a = AbstractAddress(name, &length);
  const auto deadline = Deadline(timeout_s);
  for (;;) {
    socket_ = Socket(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (socket_.fd() < 0) throw std::runtime_error(Errno("Herald plan receiver: socket"));
    if (::connect(socket_.fd(), reinterpret_cast<const sockaddr*>(&a), length) == 0) break;
    // The listener exists before its name is handed out; a full backlog clears as it accepts.
    if ((errno != ECONNREFUSED && errno != EAGAIN && errno != EINTR) || Clock::now() >= deadline)
      throw std::runtime_error(Errno(("Herald plan receiver: cannot reach the planner of worker rank " +
                                      std::to_string(planner_rank) + " on this host").c_str()));
    ::usleep(10000);
  }
  const int64_t me = rank;
  std::atomic<bool> never{false};
  if (!WriteAll(socket_.fd(), reinterpret_cast<const char*>(&me), sizeof me, timeout_s, never,
                "Herald plan receiver: the planner of worker rank " + std::to_string(planner_rank) +
                    " does not accept this worker's connection"))
    throw std::runtime_error(Errno("Herald plan receiver: saying this worker's rank"));
  thread_ = std::thread([this] { Run(); });
}

PlanReceiver::~PlanReceiver() { Stop(); }

void PlanReceiver::Stop() {
  stop_ = true;
  book_.Stop();
  if (socket_.fd() >= 0) ::shutdown(socket_.fd(), SHUT_RDWR);  // wakes the thread's receive
  if (thread_.joinable()) thread_.join();
}

void PlanReceiver::Run() {
  pthread_setname_np(pthread_self(), "herald-recv");
  try {
    for (;;) {
      uint64_t n = 0;
      if (!ReadAll(socket_.fd(), reinterpret_cast<char*>(&n), sizeof n)) {
        if (stop_) return;
        throw std::runtime_error("the Herald planner of worker rank " + std::to_string(planner_rank_) +
                                 " on this host closed its plan connection; did it exit?");
      }
      std::string bytes(n, '\0');
      if (!ReadAll(socket_.fd(), bytes.data(), n)) throw std::runtime_error("the plan connection ended inside a message");
      Reader r(bytes);
      if (r.Get<uint32_t>() != kMagic) throw std::runtime_error("a plan message of another protocol");
      const int64_t iteration = r.Get<int64_t>();
      std::vector<int64_t> samples = r.GetVector<int64_t>();
      const bool has_finished = r.Get<uint8_t>() != 0;
      FinishedPlan finished;
      if (has_finished) {
        WorkerPlan& p = finished.plan;
        p.iteration = r.Get<int64_t>();
        p.samples = r.GetVector<int64_t>();
        p.keys = r.GetVector<int64_t>();
        p.hit = r.GetVector<uint8_t>();
        p.pull = r.GetVector<uint8_t>();
        p.owner = r.GetVector<uint8_t>();
        p.invalidate = r.GetVector<int64_t>();
        p.writeback = r.GetVector<int64_t>();
        finished.planner_seconds = r.Get<double>();
      }
      if (!r.done()) throw std::runtime_error("a plan message longer than its fields");
      book_.Put(iteration, std::move(samples), has_finished, std::move(finished));
    }
  } catch (...) {
    if (stop_) return;
    book_.Fail(std::current_exception());
  }
}

}  // namespace herald
}  // namespace hetu
