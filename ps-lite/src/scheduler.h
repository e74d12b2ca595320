// The scheduler role's bookkeeping: registration and rank assignment, barrier counting,
// heartbeat monitoring, and ending the job when all workers have exited or a node died.
#pragma once
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "message.h"
#include "postoffice.h"

namespace ps {

class Scheduler {
 public:
  explicit Scheduler(Postoffice* po) : po_(po) {}
  void Handle(Message& msg);   // control messages addressed to the scheduler
  void CheckHeartbeats();      // called periodically; declares silent nodes dead
  std::string Registered();    // the nodes that have registered so far, for error messages

 private:
  void OnAddNode(const Message& msg);
  void AssignRanks();
  void Reject(const std::string& why);
  void Broadcast(int control, const std::string& error);
  void SendTerminate();  // the end of the job, to the servers that have not confirmed it
  std::vector<int> UnconfirmedServers() const;  // mu_ held
  void SendControl(const std::vector<int>& ids, int control, int64_t arg = 0, const std::string& error = "");

  Postoffice* po_;
  std::mutex mu_;
  std::vector<NodeInfo> pending_;
  std::map<int, NodeInfo> nodes_;  // by id, once assigned
  Message node_list_;              // what every node was sent, kept for repeated registrations
  std::map<int, double> last_seen_;
  std::set<int> exited_;        // workers that have finished, servers that confirmed the end
  bool terminating_ = false;    // all workers finished: the servers are being ended
  double terminate_since_ = 0;
  std::map<int, std::set<int>> barrier_;  // group -> ids arrived
};

}  // namespace ps
