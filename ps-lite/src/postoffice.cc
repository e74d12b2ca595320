#include "postoffice.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <malloc.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>

#include "logging.h"
#include "scheduler.h"

namespace ps {

double NowSeconds() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

const char* RoleName(int role) {
  switch (role) {
    case kScheduler: return "scheduler";
    case kServer: return "server";
    default: return "worker";
  }
}

namespace {

std::string Env(const char* name, const std::string& fallback = "") {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string RequireEnv(const char* name) {
  std::string v = Env(name);
  if (v.empty()) throw std::runtime_error(std::string("environment variable ") + name + " is not set");
  return v;
}

// ZMQ binds only to addresses, so names (e.g. "localhost") are resolved to IPv4 first.
std::string ResolveIPv4(const std::string& name) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_INET;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &res) != 0 || !res)
    throw std::runtime_error("cannot resolve host '" + name + "'");
  char buf[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  freeaddrinfo(res);
  return buf;
}

// IPv4 of a named interface, or of the first non-loopback one when name is empty.
std::string InterfaceIPv4(const std::string& name) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw std::runtime_error("getifaddrs failed");
  std::string found;
  for (ifaddrs* p = list; p && found.empty(); p = p->ifa_next) {
    if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(p->ifa_addr)->sin_addr, buf, sizeof(buf));
    if (name.empty() ? std::string(buf).rfind("127.", 0) != 0 : name == p->ifa_name) found = buf;
  }
  freeifaddrs(list);
  if (found.empty() && !name.empty()) throw std::runtime_error("DMLC_INTERFACE=" + name + " has no IPv4 address");
  return found.empty() ? "127.0.0.1" : found;
}

}  // namespace

// Messages are multi-megabyte buffers allocated and freed at a high rate; glibc would mmap and
// unmap each one and the kernel zero every page again. Keeping them on the heap roughly halves
// the cost of a large pull. One arena for all threads: a thread's own arena lives in heaps of
// at most 64 MiB, and a buffer that does not fit beside the others in flight gets a heap of its
// own, unmapped when freed (two workers' 32 MiB pulls from one server page-faulted every
// answer in, at 0.6x the speed). PS_MALLOC_TUNE=0 leaves malloc alone.
void TuneMalloc() {
  const char* tune = std::getenv("PS_MALLOC_TUNE");
  if (tune && std::string(tune) == "0") return;
  mallopt(M_MMAP_THRESHOLD, 1 << 30);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_ARENA_MAX, 1);
}

double WaitSpinSeconds() {
  const std::string spin = Env("PS_WAIT_SPIN_US", "0");
  char* end = nullptr;
  const double s = std::strtod(spin.c_str(), &end) * 1e-6;
  if (*end != '\0' || !(s >= 0) || s > 1)
    throw std::runtime_error("PS_WAIT_SPIN_US='" + spin + "': expected microseconds from 0 to 1000000");
  return s;
}

Config Config::FromEnv() {
  Config c;
  std::string role = RequireEnv("DMLC_ROLE");
  if (role == "scheduler") c.role = kScheduler;
  else if (role == "server") c.role = kServer;
  else if (role == "worker") c.role = kWorker;
  else throw std::runtime_error("DMLC_ROLE='" + role + "': expected scheduler, server or worker");
  c.root_host = ResolveIPv4(RequireEnv("DMLC_PS_ROOT_URI"));
  c.root_port = std::atoi(RequireEnv("DMLC_PS_ROOT_PORT").c_str());
  c.num_workers = std::atoi(Env("DMLC_NUM_WORKER", "1").c_str());
  c.num_servers = std::atoi(Env("DMLC_NUM_SERVER", "1").c_str());
  if (c.num_workers < 1 || c.num_servers < 1) throw std::runtime_error("DMLC_NUM_WORKER and DMLC_NUM_SERVER must be >= 1");
  c.van_type = Env("DMLC_PS_VAN_TYPE", "zmq");
  c.heartbeat_timeout = std::atof(Env("PS_HEARTBEAT_TIMEOUT", "30").c_str());
  c.start_timeout = std::atof(Env("PS_START_TIMEOUT", "120").c_str());
  c.wait_spin_s = WaitSpinSeconds();
  c.row_placement = RowPlacement::KindFromEnv();  // every role, so a bad value stops the job at start
  if (c.role == kScheduler) {
    c.host = c.root_host;
    c.port = c.root_port;
  } else {
    if (!Env("DMLC_NODE_HOST").empty()) c.host = ResolveIPv4(Env("DMLC_NODE_HOST"));
    else if (!Env("DMLC_INTERFACE").empty()) c.host = InterfaceIPv4(Env("DMLC_INTERFACE"));
    else if (c.root_host.rfind("127.", 0) == 0) c.host = "127.0.0.1";
    else c.host = InterfaceIPv4("");
    c.port = std::atoi(Env("DMLC_NODE_PORT", "0").c_str());
    const char* id_var = c.role == kWorker ? "DMLC_WORKER_ID" : "DMLC_SERVER_ID";
    if (!Env(id_var).empty()) c.requested_rank = std::atoi(Env(id_var).c_str());
  }
  return c;
}

Postoffice::Postoffice(const Config& cfg) : cfg_(cfg) {}

Postoffice::~Postoffice() { Finalize(); }

void Postoffice::Start() {
  TuneMalloc();
  van_ = Van::Create(cfg_.van_type);
  // The scheduler's bookkeeping must exist before the receive thread starts: nodes that were
  // launched first connect the moment we bind, and a registration handled before it existed
  // would be taken for an ordinary node's control message and dropped.
  if (cfg_.role == kScheduler) {
    my_id_ = 0;
    my_rank_ = 0;
    scheduler_ = std::make_unique<Scheduler>(this);
  }
  const int port = van_->Bind(cfg_.host, cfg_.port);
  receiver_ = std::thread([this] { ReceiveLoop(); });
  data_thread_ = std::thread([this] { DataLoop(); });
  // Named for top -H, gdb and the tests that stop one of them.
  pthread_setname_np(receiver_.native_handle(), "ps-receive");
  pthread_setname_np(data_thread_.native_handle(), "ps-data");
  Message registration;
  if (cfg_.role == kScheduler) {
    PS_VLOG(1) << "scheduler listening on " << cfg_.host << ":" << port;
  } else {
    van_->Connect(0, cfg_.root_host, cfg_.root_port);
    registration.meta.set_control(kAddNode);
    auto* n = registration.meta.add_nodes();
    n->set_role(cfg_.role);
    n->set_host(cfg_.host);
    n->set_port(port);
    n->set_requested_rank(cfg_.requested_rank);
    Send(0, &registration);
  }
  {
    std::unique_lock<std::mutex> lk(mu_);
    using Clock = std::chrono::steady_clock;
    const Clock::time_point deadline =
        Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(cfg_.start_timeout));
    // A node repeats its registration until the node list arrives, so one lost message (or
    // list) costs a retry interval, not the job; the scheduler recognises repeats by address.
    const auto retry = std::chrono::seconds(2);
    for (;;) {
      const Clock::time_point until =
          cfg_.role == kScheduler ? deadline : std::min<Clock::time_point>(deadline, Clock::now() + retry);
      if (cv_.wait_until(lk, until, [&] { return started_ || !failure_.empty(); })) break;
      if (Clock::now() >= deadline) break;
      lk.unlock();
      const std::string refused = van_->AuthError(0);
      if (!refused.empty()) {
        Finalize();
        throw std::runtime_error(std::string(RoleName(cfg_.role)) + ": cannot join the job at " + cfg_.root_host +
                                 ":" + std::to_string(cfg_.root_port) + ": the scheduler refused this node: " +
                                 refused);
      }
      Send(0, &registration);
      lk.lock();
    }
    if (!failure_.empty()) {
      std::string why = failure_;
      lk.unlock();
      Finalize();
      throw std::runtime_error(why);
    }
    if (!started_) {
      lk.unlock();
      std::string why = cfg_.role == kScheduler
                            ? "scheduler: not all nodes registered within PS_START_TIMEOUT=" +
                                  std::to_string(cfg_.start_timeout) + " s (expected " +
                                  std::to_string(cfg_.num_servers) + " servers and " +
                                  std::to_string(cfg_.num_workers) + " workers; registered: " +
                                  scheduler_->Registered() + ")"
                            : std::string(RoleName(cfg_.role)) + ": no node list from the scheduler at " +
                                  cfg_.root_host + ":" + std::to_string(cfg_.root_port) + " within " +
                                  std::to_string(cfg_.start_timeout) + " s (it sends one once all " +
                                  std::to_string(cfg_.num_servers) + " servers and " +
                                  std::to_string(cfg_.num_workers) +
                                  " workers have registered; its own log names the missing ones)";
      Finalize();
      throw std::runtime_error(why);
    }
    last_ack_ = NowSeconds();
  }
  heartbeat_ = std::thread([this] { HeartbeatLoop(); });
  pthread_setname_np(heartbeat_.native_handle(), "ps-heartbeat");
  // Every node has connected its peers once all have reached this barrier, so no request
  // can reach a server before the server can answer it.
  if (cfg_.role != kScheduler) Barrier(kAllGroup, cfg_.start_timeout);
  PS_VLOG(1) << Describe(my_id_) << " started";
}

void Postoffice::OnNodeList(const Message& msg) {
  std::lock_guard<std::mutex> lk(mu_);
  if (started_) return;  // a repeat, answering a repeated registration
  for (const auto& n : msg.meta.nodes()) {
    NodeInfo info;
    info.id = n.id();
    info.role = n.role();
    info.rank = n.rank();
    info.host = n.host();
    info.port = n.port();
    nodes_[info.id] = info;
  }
  my_id_ = static_cast<int>(msg.meta.arg());
  my_rank_ = nodes_[my_id_].rank;
  // Workers talk to servers and servers answer workers; everyone talks to the scheduler.
  for (const auto& kv : nodes_) {
    const NodeInfo& n = kv.second;
    if (n.role != kScheduler && n.role != cfg_.role) van_->Connect(n.id, n.host, n.port);
  }
  started_ = true;
  cv_.notify_all();
}

void Postoffice::ReceiveLoop() {
  Message msg;
  while (van_->Recv(&msg)) {
    try {
      if (msg.meta.control() != kData) {
        HandleControl(msg);
      } else if (data_handler_ && started_) {
        // Only this thread queues data, so once the queue is empty and the data thread idle,
        // nothing can start there while this message is handled here.
        std::unique_lock<std::mutex> lk(data_mu_);
        if (data_here_ && data_queue_.empty() && !data_busy_ && data_here_(msg)) {
          lk.unlock();
          data_handler_(msg);
        } else {
          data_queue_.push_back(std::move(msg));
          data_cv_.notify_one();
        }
      }
    } catch (const std::exception& e) {
      PS_VLOG(0) << "error while handling a message from node " << msg.meta.sender() << ": " << e.what();
    }
  }
}

void Postoffice::DataLoop() {
  for (;;) {
    Message msg;
    {
      std::unique_lock<std::mutex> lk(data_mu_);
      data_cv_.wait(lk, [&] { return data_stop_ || !data_queue_.empty(); });
      if (data_queue_.empty()) return;
      msg = std::move(data_queue_.front());
      data_queue_.pop_front();
      data_busy_ = true;
    }
    try {
      data_handler_(msg);
    } catch (const std::exception& e) {
      PS_VLOG(0) << "error while handling data from node " << msg.meta.sender() << ": " << e.what();
    }
    std::lock_guard<std::mutex> lk(data_mu_);
    data_busy_ = false;
  }
}

void Postoffice::HandleControl(Message& msg) {
  if (scheduler_) {
    scheduler_->Handle(msg);
    return;
  }
  // Every command a server or worker obeys comes from the scheduler (node 0), on a connection
  // that the van has seen speak for node 0 alone.
  if (msg.meta.sender() != 0) {
    PS_VLOG(1) << "ignored control " << msg.meta.control() << " from node " << msg.meta.sender();
    return;
  }
  switch (msg.meta.control()) {
    case kNodeList: OnNodeList(msg); break;
    case kRejected: Fail(msg.meta.error()); EndJob(msg.meta.error()); break;
    case kBarrierDone: {
      std::lock_guard<std::mutex> lk(mu_);
      ++barrier_gen_[static_cast<int>(msg.meta.arg())];
      cv_.notify_all();
      break;
    }
    case kHeartbeatAck: {
      std::lock_guard<std::mutex> lk(mu_);
      last_ack_ = NowSeconds();
      break;
    }
    case kExitAck: {
      std::lock_guard<std::mutex> lk(mu_);
      exit_acked_ = true;
      cv_.notify_all();
      break;
    }
    case kTerminate: {  // confirmed, so that the scheduler knows it may leave (scheduler.cc)
      Message bye;
      bye.meta.set_control(kExit);
      Send(0, &bye);
      EndJob("");
      break;
    }
    case kNodeDead: {
      std::string why = msg.meta.error();
      // The scheduler names this very node: it was silent, so it was stopped or starved; its
      // own heartbeat check would otherwise blame the scheduler, whose answers it did not read.
      const std::string self = Describe(my_id_) + " is dead: ";
      if (why.compare(0, self.size(), self) == 0)
        why = Describe(my_id_) + " was counted dead by the scheduler (" + why.substr(self.size()) +
              "): this process did not run (stopped or starved) and sent no heartbeat";
      Fail(why);
      EndJob(why);
      break;
    }
    default: PS_VLOG(1) << "ignored control " << msg.meta.control() << " from node " << msg.meta.sender();
  }
}

bool Postoffice::Send(int id, Message* msg) {
  msg->meta.set_sender(my_id_);
  const bool sent = van_ && van_->Send(id, *msg);
  // Data goes only to started peers, so a van that cannot even send it has lost the peer.
  // Failing the job here, as a missed heartbeat would, keeps a worker from reporting a clean
  // exit to the scheduler while its server is gone.
  if (!sent && started_ && !stopping_ && msg->meta.control() == kData)
    Fail("cannot send to " + Describe(id) + ": its connection is lost");
  return sent;
}

void Postoffice::Barrier(int group, double timeout_s) {
  long gen;
  {
    std::lock_guard<std::mutex> lk(mu_);
    gen = barrier_gen_[group];
  }
  Message msg;
  msg.meta.set_control(kBarrier);
  msg.meta.set_arg(group);
  if (!Send(0, &msg)) throw std::runtime_error("barrier: cannot reach the scheduler");
  std::unique_lock<std::mutex> lk(mu_);
  const bool ok = cv_.wait_for(lk, std::chrono::duration<double>(timeout_s),
                               [&] { return barrier_gen_[group] != gen || !failure_.empty(); });
  if (!failure_.empty()) throw std::runtime_error(failure_);
  if (!ok)
    throw std::runtime_error(Describe(my_id_) + ": barrier timed out after " + std::to_string(timeout_s) +
                             " s waiting for the scheduler (" + Describe(0) + ") to see all group members");
}

void Postoffice::HeartbeatLoop() {
  const double interval = std::min(1.0, std::max(0.05, cfg_.heartbeat_timeout / 5));
  double last_tick = NowSeconds();
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, std::chrono::duration<double>(interval));
    if (stopping_ || ended_) break;
    lk.unlock();
    const double now = NowSeconds(), paused = now - last_tick;
    last_tick = now;
    if (paused > cfg_.heartbeat_timeout) {
      // This loop itself did not run (SIGSTOP, a starved host): the peers' heartbeats or answers
      // were not missing, this node's were. A node is counted dead by the scheduler; the
      // scheduler by every node, and its own check would now blame the first node it looks at.
      std::string why = Describe(my_id_) + " did not run for " + std::to_string(paused) +
                        " s (stopped or starved) and " + (scheduler_ ? "answered" : "sent") +
                        " no heartbeat, past PS_HEARTBEAT_TIMEOUT=" + std::to_string(cfg_.heartbeat_timeout) +
                        (scheduler_ ? ": the nodes count it dead" : ": the scheduler counts it dead");
      Fail(why);
      EndJob(why);
    } else if (scheduler_) {
      scheduler_->CheckHeartbeats();
    } else {
      Message msg;
      msg.meta.set_control(kHeartbeat);
      Send(0, &msg);
      double silent;
      {
        std::lock_guard<std::mutex> g(mu_);
        silent = NowSeconds() - last_ack_;
      }
      if (silent > cfg_.heartbeat_timeout) {
        std::string why = Describe(0) + " is dead: no heartbeat answer for " + std::to_string(silent) + " s";
        Fail(why);
        EndJob(why);
      }
    }
    lk.lock();
  }
}

void Postoffice::Fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!failure_.empty()) return;
    failure_ = why;
    cv_.notify_all();
  }
  PS_VLOG(0) << (my_id_ >= 0 ? Describe(my_id_) : std::string(RoleName(cfg_.role))) << ": " << why;
  if (death_handler_) death_handler_(why);
}

void Postoffice::EndJob(const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (ended_) return;
  ended_ = true;
  end_reason_ = why;
  cv_.notify_all();
}

bool Postoffice::WaitForEnd(double timeout_s, std::string* why) {
  std::unique_lock<std::mutex> lk(mu_);
  if (timeout_s > 0) {
    if (!cv_.wait_for(lk, std::chrono::duration<double>(timeout_s), [&] { return ended_; })) return false;
  } else {
    cv_.wait(lk, [&] { return ended_; });
  }
  *why = end_reason_;
  return true;
}

void Postoffice::Finalize() {
  if (!van_) return;
  if (cfg_.role == kWorker && started_ && failure().empty()) {
    // Repeated until acknowledged, as a registration is: a lost kExit would leave the
    // scheduler waiting for this worker until its heartbeats stop, and then fail the job.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::unique_lock<std::mutex> lk(mu_);
    while (!exit_acked_ && failure_.empty() && std::chrono::steady_clock::now() < deadline) {
      lk.unlock();
      Message msg;
      msg.meta.set_control(kExit);
      const bool sent = Send(0, &msg);
      lk.lock();
      if (!sent) break;
      cv_.wait_for(lk, std::chrono::seconds(1), [&] { return exit_acked_ || !failure_.empty(); });
    }
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (heartbeat_.joinable()) heartbeat_.join();
  van_->Stop();
  if (receiver_.joinable()) receiver_.join();
  {
    std::lock_guard<std::mutex> lk(data_mu_);
    data_stop_ = true;
    data_queue_.clear();  // the job is over: nobody waits for these answers
    data_cv_.notify_all();
  }
  if (data_thread_.joinable()) data_thread_.join();
  van_.reset();
}

std::string Postoffice::failure() const {
  std::lock_guard<std::mutex> lk(mu_);
  return failure_;
}

std::string Postoffice::Describe(int id) const {
  auto it = nodes_.find(id);
  if (id == 0) {
    return "scheduler (node 0 at " + cfg_.root_host + ":" + std::to_string(cfg_.root_port) + ")";
  }
  if (it == nodes_.end()) return "node " + std::to_string(id);
  const NodeInfo& n = it->second;
  return std::string(RoleName(n.role)) + " " + std::to_string(n.rank) + " (node " + std::to_string(n.id) + " at " +
         n.host + ":" + std::to_string(n.port) + ")";
}

}  // namespace ps
