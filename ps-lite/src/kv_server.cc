#include "kv_server.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "logging.h"

namespace ps {

const char* OpName(int op) {
  switch (op) {
    case kInit: return "init";
    case kPush: return "push";
    case kPull: return "pull";
    case kPushPull: return "push_pull";
    case kPullStale: return "pull_stale";
    case kPullState: return "pull_with_state";
    case kAssign: return "assign";
    case kSave: return "save";
    case kLoad: return "load";
    case kClear: return "clear";
    case kStats: return "stats";
    default: return "unknown op";
  }
}

namespace {

// Blob i must hold exactly n elements of T; "" or the error.
template <typename T>
std::string Expect(const Message& msg, size_t i, int64_t n, const char* what, const std::string& table) {
  if (msg.data.size() <= i) return "table '" + table + "': request has no " + what;
  if (msg.data[i].size != static_cast<size_t>(n) * sizeof(T))
    return "table '" + table + "': " + what + " has " + std::to_string(msg.data[i].size / sizeof(T)) +
           " elements, expected " + std::to_string(n);
  return "";
}

// Blob i must hold n rows as the table stores them; "" or the error.
std::string RowBytes(const Message& msg, size_t i, int64_t n, const TableShard& t) {
  if (msg.data.size() <= i) return "table '" + t.name() + "': request has no rows";
  if (msg.data[i].size != static_cast<size_t>(n * t.row_bytes()))
    return "table '" + t.name() + "': rows have " + std::to_string(msg.data[i].size) + " bytes, expected " +
           std::to_string(n) + " rows of " + std::to_string(t.width()) + " " + hetu::storage::name(t.storage()) +
           " (" + std::to_string(n * t.row_bytes()) + " bytes)";
  return "";
}

int64_t DataBytes(const std::vector<Blob>& data) {
  int64_t bytes = 0;
  for (const Blob& b : data) bytes += static_cast<int64_t>(b.size);
  return bytes;
}

int64_t NumKeys(const Message& msg) { return msg.data.empty() ? 0 : static_cast<int64_t>(msg.data[0].count<int64_t>()); }

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

bool KVServer::Brief(const Message& msg) {
  switch (msg.meta.op()) {
    case kPush:
    case kPull:
    case kPushPull:
    case kPullStale:
    case kPullState:
    case kAssign: return true;
    default: return false;
  }
}

void KVServer::Handle(Message& msg) {
  const int sender = msg.meta.sender();
  // Only workers send data requests; anything else cannot even be answered.
  if (!msg.meta.request() || sender < po_->WorkerId(0) || sender >= po_->WorkerId(po_->num_workers())) {
    PS_VLOG(1) << "dropped a data message from node " << sender;
    return;
  }
  PS_VLOG(2) << "server " << po_->rank() << ": " << OpName(msg.meta.op()) << " '" << msg.meta.table() << "' from "
             << po_->Describe(sender);
  if (msg.meta.op() == kStats) return ServeStats(msg);  // not counted: it reads the counters
  const double start = NowSeconds();
  requests_.fetch_add(1, std::memory_order_relaxed);
  bytes_.fetch_add(DataBytes(msg.data), std::memory_order_relaxed);
  struct Busy {  // however the request ends
    std::atomic<double>& total;
    double start;
    ~Busy() { total.store(total.load(std::memory_order_relaxed) + NowSeconds() - start, std::memory_order_relaxed); }
  } busy{busy_seconds_, start};
  try {
    if (msg.meta.op() == kInit) {
      try {
        return ServeInit(msg);
      } catch (const std::exception& ex) {
        return Reply(msg, {}, "table '" + msg.meta.table() + "': init failed on server " +
                                  std::to_string(po_->rank()) + ": " + ex.what());
      }
    }
    auto it = tables_.find(msg.meta.table());
    if (it == tables_.end()) {
      return Reply(msg, {}, "table '" + msg.meta.table() + "' is not initialised on server " +
                                std::to_string(po_->rank()));
    }
    Entry& e = it->second;
    if (!e.shard->dense()) rows_.fetch_add(NumKeys(msg), std::memory_order_relaxed);
    Admit(e, msg);
  } catch (const std::exception& ex) {
    PS_VLOG(0) << "server " << po_->rank() << ": " << ex.what();
  }
}

KVServer::Counters KVServer::counters() const {
  Counters c;
  c.requests = requests_.load(std::memory_order_relaxed);
  c.rows = rows_.load(std::memory_order_relaxed);
  c.bytes = bytes_.load(std::memory_order_relaxed);
  c.busy_seconds = busy_seconds_.load(std::memory_order_relaxed);
  return c;
}

void KVServer::ServeStats(const Message& msg) {
  const Counters c = counters();
  double* out;
  Blob b = Blob::Alloc<double>(10, &out);
  out[0] = static_cast<double>(c.requests);
  out[1] = static_cast<double>(c.rows);
  out[2] = static_cast<double>(c.bytes);
  out[3] = c.busy_seconds;
  const TableShard::CheckpointCounters k = TableShard::Checkpoints();  // the checkpoint rates
  out[4] = static_cast<double>(k.saves);
  out[5] = static_cast<double>(k.saved_bytes);
  out[6] = k.save_seconds;
  out[7] = static_cast<double>(k.loads);
  out[8] = static_cast<double>(k.loaded_bytes);
  out[9] = k.load_seconds;
  Reply(msg, {b}, "");
}

bool KVServer::SafeProcess(Entry& e, Message& msg, bool* push_done) {
  try {
    return Process(e, msg, push_done);
  } catch (const std::exception& ex) {  // e.g. out of memory: this request fails, the server goes on
    Reply(msg, {}, "table '" + msg.meta.table() + "': server " + std::to_string(po_->rank()) + " failed on " +
                       OpName(msg.meta.op()) + ": " + ex.what());
    return true;
  }
}

bool KVServer::Process(Entry& e, Message& msg, bool* push_done) {
  TableShard& t = *e.shard;
  const int op = msg.meta.op();
  const bool sparse_op = op == kPullStale || op == kPullState || op == kAssign || msg.meta.has_write_back();
  if (sparse_op && t.dense()) {
    Reply(msg, {}, "table '" + t.name() + "' is dense; " + OpName(op) + " needs an embedding table");
    return true;
  }
  if (msg.meta.has_write_back() && op != kPush) {
    Reply(msg, {}, "table '" + t.name() + "': a write-back travels only with a push, not a " + OpName(op));
    return true;
  }
  switch (op) {
    case kPush: ServePush(e, msg); return true;
    case kPushPull: return ServePushPull(e, msg, push_done);
    case kPull: return ServePull(t, msg, msg.meta.iteration());
    case kPullStale: return ServePullStale(t, msg);
    case kPullState: return ServePullState(t, msg);
    case kAssign: Reply(msg, {}, Assign(t, msg, 0)); return true;
    case kSave:
    case kLoad:
    case kClear: ServeAdmin(t, msg); return true;
    default: Reply(msg, {}, "table '" + t.name() + "': unknown op " + std::to_string(op)); return true;
  }
}

// ---- one handler per operation ----------------------------------------------------------

void KVServer::ServeInit(Message& msg) {
  const auto& spec = msg.meta.spec();
  const std::string& name = msg.meta.table();
  if (name.empty() || spec.rows() <= 0 || spec.width() <= 0 || spec.optim_kind() < 0 ||
      spec.optim_kind() >= hetu::optim::kNumKinds || spec.init_kind() < 0 || spec.init_kind() > 3 || spec.staleness() < 0)
    return Reply(msg, {}, "table '" + name + "': invalid init spec (rows " + std::to_string(spec.rows()) +
                              ", width " + std::to_string(spec.width()) + ")");
  if (spec.placement() != RowPlacement::kStrided && spec.placement() != RowPlacement::kContiguous)
    return Reply(msg, {}, "table '" + name + "': unknown row placement " + std::to_string(spec.placement()));
  if (spec.storage() < 0 || spec.storage() >= hetu::storage::kNumTypes ||
      (spec.dense() && spec.storage() != hetu::storage::kF32))
    return Reply(msg, {}, "table '" + name + "': storage type " + std::to_string(spec.storage()) +
                              (spec.dense() ? " for a dense tensor (dense tensors are fp32)" : " is unknown"));
  if (spec.dense() && hetu::optim::rowwise(spec.optim_kind()))
    return Reply(msg, {}, "table '" + name + "': a row-wise optimizer steps embedding rows; a dense tensor takes its "
                              "element-wise dense rule");
  auto it = tables_.find(name);
  if (it != tables_.end()) {
    const auto& old = it->second.shard->spec();
    if (old.storage() != spec.storage())
      return Reply(msg, {}, "table '" + name + "' already exists with " + hetu::storage::name(old.storage()) +
                                " rows, not " + hetu::storage::name(spec.storage()));
    if (old.rows() != spec.rows() || old.width() != spec.width() || old.dense() != spec.dense())
      return Reply(msg, {}, "table '" + name + "' already exists with shape " + std::to_string(old.rows()) + "x" +
                                std::to_string(old.width()) + (old.dense() ? " (dense)" : "") + ", not " +
                                std::to_string(spec.rows()) + "x" + std::to_string(spec.width()) +
                                (spec.dense() ? " (dense)" : ""));
    if (old.placement() != spec.placement())
      return Reply(msg, {}, "table '" + name + "' already exists with " +
                                RowPlacement::Name(static_cast<RowPlacement::Kind>(old.placement())) +
                                " row placement, not " +
                                RowPlacement::Name(static_cast<RowPlacement::Kind>(spec.placement())) +
                                " (PS_ROW_PLACEMENT must be the same for every worker)");
    return Reply(msg, {}, "");  // same shape: idempotent, keeps the current values
  }
  tables_[name].shard = std::make_unique<TableShard>(name, spec, po_->rank(), po_->num_servers());
  Reply(msg, {}, "");
}

void KVServer::ServePush(Entry& e, Message& msg) {
  // The write-back goes first, as if it had come as a kAssign just before the push; a bad
  // one fails the request, but the push is still taken so the iteration can complete.
  std::string err;
  if (msg.meta.has_write_back()) err = Assign(*e.shard, msg, msg.meta.has_counts() ? 3 : 2);
  const std::string pushed = Push(e, msg);
  if (err.empty()) err = pushed;
  if (msg.meta.chunked()) {  // answered once, after the last chunk, with the first error
    const auto id = std::make_pair(msg.meta.sender(), msg.meta.timestamp());
    if (msg.meta.more()) {
      if (!err.empty()) chunk_errors_.emplace(id, err);
      return;
    }
    auto it = chunk_errors_.find(id);
    if (it != chunk_errors_.end()) {
      err = it->second;
      chunk_errors_.erase(it);
    }
  }
  Reply(msg, {}, err);
}

bool KVServer::ServePushPull(Entry& e, Message& msg, bool* push_done) {
  if (!*push_done) {  // a deferred push-pull comes back here with its push already taken
    const std::string err = Push(e, msg);
    *push_done = true;
    if (!err.empty()) {
      Reply(msg, {}, err);
      return true;
    }
  }
  return ServePull(*e.shard, msg, msg.meta.iteration() + 1);  // the rows once this push is applied
}

bool KVServer::ServePull(const TableShard& t, const Message& msg, int64_t iteration) {
  if (!Servable(t, msg, iteration)) return false;
  if (t.dense()) {
    float* out;
    Blob rows = Blob::Alloc<float>(t.rows() * t.width(), &out);
    t.GatherDense(out);
    Reply(msg, {rows}, "");
    return true;
  }
  char* out;  // rows as stored: row_bytes() each
  const int64_t n = NumKeys(msg);
  const int64_t* keys;
  if (!ReadKeys(t, msg, n, &keys)) return true;
  const int64_t chunk = msg.meta.op() == kPull ? msg.meta.chunk_rows() : 0;
  if (chunk > 0 && n > chunk) {
    // A chunk at a time: the van sends one while the next is gathered.
    for (int64_t off = 0; off < n; off += chunk) {
      const int64_t m = std::min(chunk, n - off);
      Blob rows = Blob::Alloc<char>(m * t.row_bytes(), &out);
      t.Gather(keys + off, m, out);
      Reply(msg, {rows}, "", off, off + m < n);
    }
    return true;
  }
  Blob rows = Blob::Alloc<char>(n * t.row_bytes(), &out);
  t.Gather(keys, n, out);
  Reply(msg, {rows}, "");
  return true;
}

bool KVServer::ServePullStale(const TableShard& t, const Message& msg) {
  if (!Servable(t, msg, msg.meta.iteration())) return false;
  const int64_t n = NumKeys(msg);
  const int64_t* keys;
  if (!ReadKeys(t, msg, n, &keys, Expect<int64_t>(msg, 1, n, "versions", t.name()))) return true;
  std::vector<int64_t> idx = t.Stale(keys, msg.data[1].as<int64_t>(), n, msg.meta.arg());
  const int64_t m = static_cast<int64_t>(idx.size());
  std::vector<int64_t> stale(m);
  for (int64_t i = 0; i < m; ++i) stale[i] = keys[idx[i]];
  char* rows;
  int64_t* versions;
  Blob rb = Blob::Alloc<char>(m * t.row_bytes(), &rows);
  Blob vb = Blob::Alloc<int64_t>(m, &versions);
  t.Gather(stale.data(), m, rows);
  std::vector<Blob> reply = {Blob::FromVector(std::move(idx)), rb, vb};
  if (msg.meta.with_state()) {
    float* state;
    int64_t* steps;
    reply.push_back(Blob::Alloc<float>(m * t.state_width(), &state));
    reply.push_back(Blob::Alloc<int64_t>(m, &steps));
    t.GatherState(stale.data(), m, state, steps, versions);
  } else {
    for (int64_t i = 0; i < m; ++i) versions[i] = t.Version(stale[i]);
  }
  Reply(msg, std::move(reply), "");
  return true;
}

bool KVServer::ServePullState(const TableShard& t, const Message& msg) {
  if (!Servable(t, msg, msg.meta.iteration())) return false;
  const int64_t n = NumKeys(msg);
  const bool masked = msg.meta.with_state_mask();
  const int64_t* keys;
  if (!ReadKeys(t, msg, n, &keys, masked ? Expect<uint8_t>(msg, 1, n, "state mask", t.name()) : "")) return true;
  // The keys whose optimizer state is wanted: all, or those the mask marks.
  std::vector<int64_t> marked;
  if (masked)
    for (int64_t i = 0; i < n; ++i)
      if (msg.data[1].as<uint8_t>()[i]) marked.push_back(keys[i]);
  const int64_t m = masked ? static_cast<int64_t>(marked.size()) : n;
  char* rows;
  float* state;
  int64_t *steps, *versions;
  Blob rb = Blob::Alloc<char>(n * t.row_bytes(), &rows);
  Blob sb = Blob::Alloc<float>(m * t.state_width(), &state);
  Blob stb = Blob::Alloc<int64_t>(m, &steps);
  Blob vb = Blob::Alloc<int64_t>(m, &versions);
  t.Gather(keys, n, rows);
  t.GatherState(masked ? marked.data() : keys, m, state, steps, versions);
  Reply(msg, {rb, sb, stb, vb}, "");
  return true;
}

KVServer::KVServer(Postoffice* po) : po_(po) {
  const char* roots = std::getenv("HETU_CHECKPOINT_ROOT");
  std::string all = roots ? roots : "";
  for (size_t start = 0; start <= all.size();) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    const std::string root = all.substr(start, end - start);
    std::error_code ec;
    if (!root.empty()) checkpoint_roots_.push_back(std::filesystem::weakly_canonical(root, ec).string());
    start = end + 1;
  }
}

std::string KVServer::Unconfined(const TableShard& t, const char* what, const std::string& path) const {
  namespace fs = std::filesystem;
  if (checkpoint_roots_.empty()) return "";
  std::error_code ec;
  // Symbolic links and ".." resolved first: the folder actually written or read is compared.
  const fs::path real = fs::weakly_canonical(fs::absolute(path, ec), ec);
  std::string roots;
  for (const auto& root : checkpoint_roots_) {
    const fs::path r(root);
    if (!ec && std::mismatch(r.begin(), r.end(), real.begin(), real.end()).first == r.end()) return "";
    roots += (roots.empty() ? "" : ", ") + root;
  }
  return "table '" + t.name() + "': " + what + " of " + path + " refused: it is outside the job's checkpoint " +
         "folder (HETU_CHECKPOINT_ROOT: " + roots + ")";
}

void KVServer::ServeAdmin(TableShard& t, const Message& msg) {
  switch (msg.meta.op()) {
    case kSave: {
      const std::string refused = Unconfined(t, "save", msg.meta.path());
      if (!refused.empty()) return Reply(msg, {}, refused);
      std::error_code ec;
      std::filesystem::create_directories(msg.meta.path(), ec);
      return Reply(msg, {}, t.Save(msg.meta.path(), po_->rank(), po_->num_servers()));
    }
    case kLoad: {
      const std::string refused = Unconfined(t, "load", msg.meta.path());
      return Reply(msg, {}, refused.empty() ? t.Load(msg.meta.path()) : refused);
    }
    default: t.Reset(); return Reply(msg, {}, "");  // kClear
  }
}

// ---- reading and applying a push's blobs ---------------------------------------------------

bool KVServer::ReadKeys(const TableShard& t, const Message& msg, int64_t n, const int64_t** keys,
                        std::string error) {
  *keys = n ? msg.data[0].as<int64_t>() : nullptr;
  if (error.empty()) error = t.CheckKeys(*keys, n);
  if (error.empty()) return true;
  Reply(msg, {}, error);
  return false;
}

std::string KVServer::Assign(TableShard& t, const Message& msg, size_t first) {
  const std::string& name = t.name();
  const int64_t n = msg.data.size() > first ? static_cast<int64_t>(msg.data[first].count<int64_t>()) : 0;
  std::string err = RowBytes(msg, first + 1, n, t);
  if (err.empty()) err = Expect<float>(msg, first + 2, n * t.state_width(), "optimizer state", name);
  if (err.empty()) err = Expect<int64_t>(msg, first + 3, n, "steps", name);
  if (err.empty()) err = Expect<int64_t>(msg, first + 4, n, "version increments", name);
  const int64_t* keys = n ? msg.data[first].as<int64_t>() : nullptr;
  if (err.empty()) err = t.CheckKeys(keys, n);
  if (err.empty()) err = t.CheckVersionAdds(keys, msg.data[first + 4].as<int64_t>(), n, 0, "version increment");
  if (err.empty())
    t.Assign(keys, n, msg.data[first + 1].data, msg.data[first + 2].as<float>(),
             msg.data[first + 3].as<int64_t>(), msg.data[first + 4].as<int64_t>());
  return err;
}

std::string KVServer::Push(Entry& e, Message& msg) {
  TableShard& t = *e.shard;
  const std::string err = CheckPush(t, msg);
  if (!msg.meta.has_iteration() || !t.spec().bsp()) {
    if (err.empty()) t.Apply({Gradients(t, msg)}, msg.meta.lr());
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
    // Every worker sends the same learning rate; rank 0's is the one used.
    t.Apply(pushes, it->second[0].meta.lr());
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
  if (req.meta.op() != kStats) bytes_.fetch_add(DataBytes(r.data), std::memory_order_relaxed);
  if (!po_->Send(req.meta.sender(), &r)) PS_VLOG(1) << "cannot answer " << po_->Describe(req.meta.sender());
}

}  // namespace ps
