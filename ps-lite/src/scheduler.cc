#include "scheduler.h"

#include <algorithm>

#include "logging.h"

namespace ps {

void Scheduler::Handle(Message& msg) {
  const int from = msg.meta.sender();
  switch (msg.meta.control()) {
    case kAddNode: OnAddNode(msg); return;
    case kHeartbeat: {
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!nodes_.count(from)) return;
        last_seen_[from] = NowSeconds();
      }
      SendControl({from}, kHeartbeatAck);
      return;
    }
    case kBarrier: {
      const int group = static_cast<int>(msg.meta.arg());
      std::vector<int> members;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!nodes_.count(from) || group < 1 || group > kAllGroup) return;
        for (const auto& kv : nodes_) {
          const int r = kv.second.role;
          if ((r == kWorker && (group & kWorkerGroup)) || (r == kServer && (group & kServerGroup)))
            members.push_back(kv.first);
        }
        auto& arrived = barrier_[group];
        arrived.insert(from);
        for (int id : members)
          if (!arrived.count(id)) return;
        arrived.clear();
      }
      SendControl(members, kBarrierDone, group);
      return;
    }
    case kExit: {  // a worker that has finished, or a server confirming the end of the job
      bool from_worker, all_confirmed;
      {
        std::lock_guard<std::mutex> lk(mu_);
        if (!nodes_.count(from)) return;
        exited_.insert(from);
        from_worker = nodes_.at(from).role == kWorker;
        int workers = 0;
        for (const auto& kv : nodes_)
          if (kv.second.role == kWorker && exited_.count(kv.first)) ++workers;
        if (from_worker && workers == po_->num_workers() && !terminating_) {
          terminating_ = true;
          terminate_since_ = NowSeconds();
        }
        all_confirmed = terminating_ && UnconfirmedServers().empty();
      }
      if (from_worker) {
        SendControl({from}, kExitAck);
        PS_VLOG(1) << po_->Describe(from) << " finished";
        SendTerminate();
      }
      if (all_confirmed) po_->EndJob("");
      return;
    }
    default: PS_VLOG(1) << "scheduler ignored control " << msg.meta.control() << " from node " << from;
  }
}

void Scheduler::OnAddNode(const Message& msg) {
  if (msg.meta.nodes_size() != 1) return;
  const auto& n = msg.meta.nodes(0);
  // Only a node that has no id yet registers, with an address we can connect back to.
  if (msg.meta.sender() != -1 || (n.role() != kServer && n.role() != kWorker) || n.host().empty() ||
      n.port() <= 0 || n.port() > 65535)
    return;
  NodeInfo info;
  info.role = n.role();
  info.host = n.host();
  info.port = n.port();
  info.requested_rank = n.requested_rank();
  bool complete = false;
  int resend_to = -1;
  Message list;  // the node list again, for a registered node that missed it
  {
    std::lock_guard<std::mutex> lk(mu_);
    auto same_address = [&](const NodeInfo& o) { return o.host == info.host && o.port == info.port; };
    if (nodes_.empty()) {
      if (std::any_of(pending_.begin(), pending_.end(), same_address)) return;  // a repeat
      pending_.push_back(info);
      complete = static_cast<int>(pending_.size()) == po_->num_workers() + po_->num_servers();
    } else {
      // After rendezvous only a node whose node list was lost registers again; others are late.
      auto it = std::find_if(nodes_.begin(), nodes_.end(), [&](const auto& kv) { return same_address(kv.second); });
      if (it == nodes_.end()) return;
      resend_to = it->first;
      list = node_list_;
    }
  }
  if (resend_to >= 0) {
    list.meta.set_arg(resend_to);
    po_->Send(resend_to, &list);
    return;
  }
  PS_VLOG(1) << "registered " << RoleName(info.role) << " at " << info.host << ":" << info.port;
  if (complete) AssignRanks();
}

std::string Scheduler::Registered() {
  std::lock_guard<std::mutex> lk(mu_);
  if (pending_.empty()) return "none";
  std::string out;
  for (const auto& n : pending_) {
    if (!out.empty()) out += ", ";
    out += std::string(RoleName(n.role)) + " at " + n.host + ":" + std::to_string(n.port);
    if (n.requested_rank >= 0) out += " (rank " + std::to_string(n.requested_rank) + ")";
  }
  return out;
}

// Requested ranks (DMLC_WORKER_ID, e.g. the MPI rank) are honoured; the others fill the free
// ranks in registration order.
void Scheduler::AssignRanks() {
  std::vector<NodeInfo> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    all = pending_;
  }
  for (int role : {kServer, kWorker}) {
    const int count = role == kServer ? po_->num_servers() : po_->num_workers();
    std::vector<bool> taken(count, false);
    for (auto& n : all) {
      if (n.role != role || n.requested_rank < 0) continue;
      const char* var = role == kServer ? "DMLC_SERVER_ID" : "DMLC_WORKER_ID";
      if (n.requested_rank >= count || taken[n.requested_rank]) {
        Reject(std::string(RoleName(role)) + " at " + n.host + ":" + std::to_string(n.port) + " asked for " + var +
               "=" + std::to_string(n.requested_rank) +
               (n.requested_rank >= count ? " but there are only " + std::to_string(count)
                                          : std::string(", which another node already has")));
        return;
      }
      taken[n.requested_rank] = true;
      n.rank = n.requested_rank;
    }
    int next = 0;
    for (auto& n : all) {
      if (n.role != role || n.rank >= 0) continue;
      while (taken[next]) ++next;
      taken[next] = true;
      n.rank = next;
    }
  }
  Message list;
  list.meta.set_control(kNodeList);
  auto* self = list.meta.add_nodes();
  self->set_id(0);
  self->set_role(kScheduler);
  self->set_host(po_->config().host);
  self->set_port(po_->config().port);
  for (auto& n : all) {
    n.id = n.role == kServer ? po_->ServerId(n.rank) : po_->WorkerId(n.rank);
    auto* p = list.meta.add_nodes();
    p->set_id(n.id);
    p->set_role(n.role);
    p->set_rank(n.rank);
    p->set_host(n.host);
    p->set_port(n.port);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& n : all) {
      nodes_[n.id] = n;
      last_seen_[n.id] = NowSeconds();
    }
    node_list_ = list;
  }
  {
    std::lock_guard<std::mutex> lk(po_->mu_);
    NodeInfo s;
    s.id = 0;
    s.role = kScheduler;
    s.rank = 0;
    s.host = po_->config().host;
    s.port = po_->config().port;
    po_->nodes_[0] = s;
    for (const auto& n : all) po_->nodes_[n.id] = n;
  }
  for (const auto& n : all) {
    po_->van_->Connect(n.id, n.host, n.port);
    list.meta.set_arg(n.id);
    po_->Send(n.id, &list);
  }
  std::lock_guard<std::mutex> lk(po_->mu_);
  po_->started_ = true;
  po_->cv_.notify_all();
}

void Scheduler::Reject(const std::string& why) {
  std::vector<NodeInfo> all;
  {
    std::lock_guard<std::mutex> lk(mu_);
    all = pending_;
  }
  int temp = -1;
  for (const auto& n : all) {
    po_->van_->Connect(temp, n.host, n.port);
    SendControl({temp--}, kRejected, 0, "rendezvous rejected: " + why);
  }
  po_->Fail("rendezvous rejected: " + why);
  po_->EndJob("rendezvous rejected: " + why);
}

// The scheduler leaves only once every server has confirmed the end of the job (a kExit): a
// van may drop what it still holds when its process exits, and a server that missed the end
// would wait out its heartbeat timeout and fail. Unconfirmed servers are sent the end again
// on every heartbeat tick.
void Scheduler::SendTerminate() {
  std::vector<int> ids;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (terminating_) ids = UnconfirmedServers();
  }
  SendControl(ids, kTerminate);
}

std::vector<int> Scheduler::UnconfirmedServers() const {
  std::vector<int> ids;
  for (const auto& kv : nodes_)
    if (kv.second.role == kServer && !exited_.count(kv.first)) ids.push_back(kv.first);
  return ids;
}

void Scheduler::SendControl(const std::vector<int>& ids, int control, int64_t arg, const std::string& error) {
  for (int id : ids) {
    Message msg;
    msg.meta.set_control(control);
    msg.meta.set_arg(arg);
    msg.meta.set_error(error);
    po_->Send(id, &msg);
  }
}

void Scheduler::CheckHeartbeats() {
  std::string why;
  int dead = -1;
  bool ending = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const double now = NowSeconds();
    if (terminating_) {
      // Ending servers stop heartbeating, so none is declared dead now. One whose confirmation
      // was lost would be waited for forever: after half a heartbeat timeout the job ends
      // without it (a server that really missed the end fails on its own heartbeat timeout).
      const std::vector<int> unconfirmed = UnconfirmedServers();
      const bool overdue = now - terminate_since_ > po_->config().heartbeat_timeout / 2;
      if (!unconfirmed.empty() && overdue) {
        std::string missing;
        for (int id : unconfirmed) missing += " " + po_->Describe(id);
        PS_VLOG(0) << "scheduler: ending the job without the confirmation of" << missing;
      }
      ending = unconfirmed.empty() || overdue;
    } else {
      for (const auto& kv : last_seen_) {
        if (exited_.count(kv.first)) continue;
        if (now - kv.second > po_->config().heartbeat_timeout) {
          dead = kv.first;
          why = po_->Describe(dead) + " is dead: no heartbeat for " + std::to_string(now - kv.second) +
                " s (PS_HEARTBEAT_TIMEOUT=" + std::to_string(po_->config().heartbeat_timeout) + ")";
          break;
        }
      }
    }
  }
  if (ending) {
    po_->EndJob("");
    return;
  }
  SendTerminate();  // again, to servers that have not confirmed (none before the workers finish)
  if (dead < 0) return;
  Broadcast(kNodeDead, why);
  po_->Fail(why);
  po_->EndJob(why);
}

void Scheduler::Broadcast(int control, const std::string& error) {
  std::vector<int> ids;
  {
    std::lock_guard<std::mutex> lk(mu_);
    for (const auto& kv : nodes_)
      if (!exited_.count(kv.first)) ids.push_back(kv.first);
  }
  SendControl(ids, control, 0, error);
}

}  // namespace ps
