#include "kv_server.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "logging.h"
#include "ops/serving.h"

namespace ps {

namespace {

int64_t DataBytes(const std::vector<Blob>& data) {
  int64_t bytes = 0;
  for (const Blob& b : data) bytes += static_cast<int64_t>(b.size);
  return bytes;
}

// "" or why a push's blobs do not fit the table (an empty dense push is one with nothing to add).
std::string CheckPush(const TableShard& t, const Message& msg) {
  const std::string& name = t.name();
  if (t.dense()) return msg.data.empty() ? "" : Expect<float>(msg, 0, t.rows() * t.width(), "gradient", name);
  const int64_t n = NumKeys(msg);
  if (!n) return "";
  std::string err = Expect<float>(msg, 1, n * t.width(), "gradient", name);
  if (err.empty() && msg.meta.has_counts()) err = Expect<int64_t>(msg, 2, n, "counts", name);
  if (err.empty()) err = t.CheckKeys(msg.data[0].as<int64_t>(), n);
  if (err.empty() && msg.meta.has_counts())
    err = t.CheckVersionAdds(msg.data[0].as<int64_t>(), msg.data[2].as<int64_t>(), n, 1, "contribution count");
  return err;
}

// The gradients of a push that passed CheckPush, or of an empty one.
TableShard::Push Gradients(const TableShard& t, const Message& m) {
  TableShard::Push p;
  if (t.dense()) {
    p.n = m.data.empty() ? 0 : static_cast<int64_t>(m.data[0].count<float>());
    p.values = p.n ? m.data[0].as<float>() : nullptr;
  } else {
    p.n = NumKeys(m);
    if (p.n) {
      p.keys = m.data[0].as<int64_t>();
      p.values = m.data[1].as<float>();
      p.counts = m.meta.has_counts() ? m.data[2].as<int64_t>() : nullptr;
    }
  }
  return p;
}

}  // namespace

void KVServer::Handle(Message& msg) {
  const int sender = msg.meta.sender();
  // Only workers send data requests; anything else cannot even be answered.
  if (!msg.meta.request() || sender < po_->WorkerId(0) || sender >= po_->WorkerId(po_->num_workers())) {
    PS_VLOG(1) << "dropped a data message from node " << sender;
    return;
  }
  const OpDef& op = OpOf(msg.meta.op());
  PS_VLOG(2) << "server " << po_->rank() << ": " << op.name << " '" << msg.meta.table() << "' from "
             << po_->Describe(sender);
  if (op.flags & kUncounted) {
    Serving s{*this, msg, nullptr, nullptr};
    op.serve(s);
    return;
  }
  const double start = NowSeconds();
  requests_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(DataBytes(msg.data), std::memory_order_relaxed);
  struct Busy {  // however the request ends
    std::atomic<double>& total;
    double start;
    ~Busy() { total.store(total.load(std::memory_order_relaxed) + NowSeconds() - start, std::memory_order_relaxed); }
  } busy{busy_seconds_, start};
  try {
    if (op.flags & kNoTable) {
      Serving s{*this, msg, nullptr, nullptr};
      op.serve(s);
      return;
    }
    Entry* e = Find(msg.meta.table());
    if (!e) {
      return Reply(msg, {}, "table '" + msg.meta.table() + "' is not initialised on server " +
                                std::to_string(po_->rank()));
    }
    if (!e->shard->dense()) rows_.fetch_add(NumKeys(msg), std::memory_order_relaxed);
    Admit(*e, msg);
  } catch (const std::exception& ex) {
    PS_VLOG(0) << "server " << po_->rank() << ": " << ex.what();
  }
}

KVServer::Entry* KVServer::Find(const std::string& name) {
  auto it = tables_.find(name);
  return it == tables_.end() ? nullptr : &it->second;
}

KVServer::Entry& KVServer::Create(const std::string& name, const pb::TableSpec& spec) {
  Entry& e = tables_[name];
  e.shard = std::make_unique<TableShard>(name, spec, po_->rank(), po_->num_servers());
  return e;
}

KVServer::Counters KVServer::counters() const {
  Counters c;
  c.requests = requests_.load(std::memory_order_relaxed);
  c.rows = rows_.load(std::memory_order_relaxed);
  c.bytes = bytes_.load(std::memory_order_relaxed);
  c.busy_seconds = busy_seconds_.load(std::memory_order_relaxed);
  return c;
}

bool KVServer::SafeProcess(Entry& e, Message& msg, bool* push_done) {
  try {
    return Process(e, msg, push_done);
  } catch (const std::exception& ex) {  // e.g. out of memory: this request fails, the server goes on
    const std::string why = "table '" + msg.meta.table() + "': server " + std::to_string(po_->rank()) + " failed on " +
                            OpName(msg.meta.op()) + ": " + ex.what();
    if (OpOf(msg.meta.op()).flags & kChangesRows) {
      // Its rows may be half changed, and under BSP the reads of later iterations would wait for
      // ever on its iteration: every request after it gets this error (the waiting ones too).
      e.shard->Break(why + "; the table serves nothing after it: resume from a checkpoint");
    }
    Reply(msg, {}, why);
    return true;
  }
}

bool KVServer::Process(Entry& e, Message& msg, bool* push_done) {
  TableShard& t = *e.shard;
  const OpDef& op = OpOf(msg.meta.op());
  if (((op.flags & kSparseOnly) || msg.meta.has_write_back()) && t.dense()) {
    Reply(msg, {}, "table '" + t.name() + "' is dense; " + op.name + " needs an embedding table");
    return true;
  }
  if (msg.meta.has_write_back() && !(op.flags & kWriteBack)) {
    Reply(msg, {}, "table '" + t.name() + "': a write-back travels only with a push, not a " + op.name);
    return true;
  }
  if (!t.broken.empty()) {
    Reply(msg, {}, t.broken);
    return true;
  }
  t.BeginRequest();  // a disk tier keeps the request's rows in its cache until the next
  Serving s{*this, msg, &e, push_done};
  return op.serve(s);
}

KVServer::KVServer(Postoffice* po) : po_(po) {}

// ---- reading and taking a push's blobs -------------------------------------------------------

bool KVServer::LastChunk(const Message& msg, std::string* err) {
  const auto id = std::make_pair(msg.meta.sender(), msg.meta.timestamp());
  if (msg.meta.more()) {
    if (!err->empty()) chunk_errors_.emplace(id, *err);
    return false;
  }
  auto it = chunk_errors_.find(id);
  if (it != chunk_errors_.end()) {
    *err = it->second;
    chunk_errors_.erase(it);
  }
  return true;
}

bool KVServer::ReadKeys(const TableShard& t, const Message& msg, int64_t n, const int64_t** keys,
                        std::string error) {
  *keys = n ? msg.data[0].as<int64_t>() : nullptr;
  if (error.empty()) error = t.CheckKeys(*keys, n);
  if (error.empty()) return true;
  Reply(msg, {}, error);
  return false;
}

std::string KVServer::TakePush(Entry& e, Message& msg) {
  TableShard& t = *e.shard;
  const std::string err = CheckPush(t, msg);
  if (!msg.meta.has_iteration() || !t.spec().bsp()) {
    if (err.empty()) t.Apply({Gradients(t, msg)}, msg.meta.lr(), msg.meta.catch_up_to());
    return err;
  }
  const std::string late = Buffer(e, msg, err.empty());
  return late.empty() ? err : late;
}

// ---- BSP: buffered pushes, applied an iteration at a time; reads that wait for them ----------

std::string KVServer::Buffer(Entry& e, const Message& msg, bool valid) {
  TableShard& t = *e.shard;
  const int64_t it = msg.meta.iteration();
  const int rank = po_->WorkerRank(msg.meta.sender());
  if (it <= t.applied)
    return "table '" + t.name() + "': push for iteration " + std::to_string(it) + " from worker " +
           std::to_string(rank) + " arrived after that iteration was applied";
  auto& slots = t.pending[it];
  slots.resize(po_->num_workers());
  if (slots[rank].meta.op() != 0)
    return "table '" + t.name() + "': worker " + std::to_string(rank) + " pushed twice for iteration " +
           std::to_string(it);
  // A rejected push still counts as this worker's (empty) message for the iteration, so the
  // other workers are not held up by one bad request.
  slots[rank].meta = msg.meta;
  if (valid) slots[rank].data = msg.data;
  ++t.arrived[it];
  TryApply(e);
  return "";
}

void KVServer::TryApply(Entry& e) {
  TableShard& t = *e.shard;
  const int workers = po_->num_workers();
  while (!t.pending.empty()) {
    auto it = t.pending.begin();
    if (t.arrived[it->first] < workers) return;
    std::vector<TableShard::Push> pushes;
    for (const Message& m : it->second) pushes.push_back(Gradients(t, m));
    // Every worker sends the same learning rate and step; rank 0's are the ones used.
    t.Apply(pushes, it->second[0].meta.lr(), it->second[0].meta.catch_up_to());
    t.applied = it->first;
    t.arrived.erase(it->first);
    t.pending.erase(it);
  }
}

bool KVServer::Servable(const TableShard& t, const Message& msg, int64_t iteration) const {
  if (!msg.meta.has_iteration() || !t.spec().bsp() || t.pending.empty()) return true;
  return t.pending.begin()->first > iteration - 1 - t.spec().staleness();
}

void KVServer::Admit(Entry& e, Message& msg) {
  const int sender = msg.meta.sender();
  const bool queued = std::any_of(e.deferred.begin(), e.deferred.end(),
                                  [sender](const Deferred& d) { return d.msg.meta.sender() == sender; });
  bool push_done = false;
  if (queued || !SafeProcess(e, msg, &push_done)) e.deferred.push_back(Deferred{std::move(msg), push_done});
  if (!e.deferred.empty()) ServeDeferred(e);
}

void KVServer::ServeDeferred(Entry& e) {
  bool progress = true;
  while (progress && !e.deferred.empty()) {
    progress = false;
    std::set<int> blocked;  // a worker's later messages wait behind its first deferred one
    for (auto it = e.deferred.begin(); it != e.deferred.end(); ++it) {
      const int sender = it->msg.meta.sender();
      if (blocked.count(sender)) continue;
      if (SafeProcess(e, it->msg, &it->push_done)) {
        e.deferred.erase(it);
        progress = true;
        break;
      }
      blocked.insert(sender);
    }
  }
}

void KVServer::Reply(const Message& req, std::vector<Blob> data, const std::string& error, int64_t offset,
                     bool more) {
  Message r;
  r.meta.set_timestamp(req.meta.timestamp());
  r.meta.set_op(req.meta.op());
  r.meta.set_table(req.meta.table());
  r.meta.set_error(error);
  if (offset >= 0) {
    r.meta.set_chunked(true);
    r.meta.set_offset(offset);
    r.meta.set_more(more);
  }
  r.data = std::move(data);
  if (!(OpOf(req.meta.op()).flags & kUncounted)) bytes_.fetch_add(DataBytes(r.data), std::memory_order_relaxed);
  if (!po_->Send(req.meta.sender(), &r)) PS_VLOG(1) << "cannot answer " << po_->Describe(req.meta.sender());
}

}  // namespace ps
