// Postoffice: this process's place in the job. Reads the DMLC_* environment, owns the van and
// its receive thread, knows every node (role, rank, address), does rendezvous and barriers
// through the scheduler, sends heartbeats, and turns a dead peer into an error that names it.
// Data messages are handed to one handler (the KVServer on servers, the Customer on workers).
#pragma once
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "message.h"
#include "row_placement.h"
#include "van.h"

namespace ps {

enum Role : int { kScheduler = 0, kServer = 1, kWorker = 2 };
enum Control : int {
  kData = 0,
  kAddNode = 1,
  kNodeList = 2,
  kBarrier = 3,
  kBarrierDone = 4,
  kHeartbeat = 5,
  kHeartbeatAck = 6,
  kExit = 7,
  kExitAck = 8,
  kTerminate = 9,
  kNodeDead = 10,
  kRejected = 11,
};
enum Group : int { kWorkerGroup = 1, kServerGroup = 2, kAllGroup = 3 };

struct NodeInfo {
  int id = -1, role = -1, rank = -1, port = 0, requested_rank = -1;
  std::string host;
};

const char* RoleName(int role);

struct Config {
  int role = kWorker;
  std::string root_host = "127.0.0.1";
  int root_port = 0;
  int num_workers = 1, num_servers = 1;
  std::string host;  // address this node binds and advertises
  int port = 0;
  int requested_rank = -1;
  std::string van_type = "zmq";
  double heartbeat_timeout = 30;
  double start_timeout = 120;
  double wait_spin_s = 0;  // PS_WAIT_SPIN_US: how long a worker polls for an answer (customer.h)
  RowPlacement::Kind row_placement = RowPlacement::kStrided;  // PS_ROW_PLACEMENT
  static Config FromEnv();
};

class Scheduler;

class Postoffice {
 public:
  explicit Postoffice(const Config& cfg);
  ~Postoffice();

  // Binds, registers with the scheduler and returns once every node is connected.
  void Start();
  // Worker: tells the scheduler it is done (servers end when all workers are). All roles: stops.
  void Finalize();
  // Scheduler/server: blocks until the job ends (false on timeout; timeout_s <= 0: no limit).
  // *why: "" on a clean end, else why it failed.
  bool WaitForEnd(double timeout_s, std::string* why);

  void Barrier(int group, double timeout_s);
  bool Send(int id, Message* msg);

  // Data messages go to a thread of their own, so that long operations (a save, a load, a
  // large table's init) never delay heartbeats. Those for which here(msg) is true are handled
  // on the receive thread instead, saving two thread switches per request, whenever nothing is
  // queued for or running on the data thread: data messages are still handled one at a time,
  // in arrival order. The worker's Customer only hands answers on, so all of its go there.
  void SetDataHandler(std::function<void(Message&)> h, std::function<bool(const Message&)> here = nullptr) {
    data_handler_ = std::move(h);
    data_here_ = std::move(here);
  }
  void SetDeathHandler(std::function<void(const std::string&)> h) { death_handler_ = std::move(h); }

  int role() const { return cfg_.role; }
  int my_id() const { return my_id_; }
  int rank() const { return my_rank_; }
  int num_workers() const { return cfg_.num_workers; }
  int num_servers() const { return cfg_.num_servers; }
  int ServerId(int rank) const { return 1 + rank; }
  int WorkerId(int rank) const { return 1 + cfg_.num_servers + rank; }
  int WorkerRank(int id) const { return id - 1 - cfg_.num_servers; }
  // "server 1 (node 2 at 127.0.0.1:4000)": how errors name a peer.
  std::string Describe(int id) const;
  // Non-empty once the job failed (dead peer); every later wait reports it.
  std::string failure() const;
  const Config& config() const { return cfg_; }
  long dropped_messages() const { return van_ ? van_->dropped() : 0; }

 private:
  friend class Scheduler;
  void ReceiveLoop();
  void DataLoop();
  void HeartbeatLoop();
  void HandleControl(Message& msg);
  void OnNodeList(const Message& msg);
  void Fail(const std::string& why);
  void EndJob(const std::string& why);
  void ConnectPeers();

  Config cfg_;
  std::unique_ptr<Van> van_;
  std::unique_ptr<Scheduler> scheduler_;
  // Data messages are handled on their own thread, in arrival order, so a long operation
  // (a big save, a BSP apply) never delays heartbeat answers and other control traffic.
  std::thread receiver_, heartbeat_, data_thread_;
  std::mutex data_mu_;
  std::condition_variable data_cv_;
  std::deque<Message> data_queue_;
  bool data_stop_ = false;
  bool data_busy_ = false;  // the data thread is handling a message
  std::function<void(Message&)> data_handler_;
  std::function<bool(const Message&)> data_here_;
  std::function<void(const std::string&)> death_handler_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, NodeInfo> nodes_;
  int my_id_ = -1, my_rank_ = -1;
  std::atomic<bool> started_{false};
  bool ended_ = false, exit_acked_ = false;
  std::string failure_, end_reason_;
  std::map<int, long> barrier_gen_;
  double last_ack_ = 0;
  std::atomic<bool> stopping_{false};
};

double NowSeconds();
void TuneMalloc();
// PS_WAIT_SPIN_US in seconds (0 when unset); throws on anything but 0 to 1e6 microseconds.
double WaitSpinSeconds();

}  // namespace ps
