// kStats: what a server has served, and its checkpoint files' rates.
//   request:  no table, no blobs (to every server; not itself counted)
//   answer:   one blob of ServerStats: a double per field, in the order of PS_SERVER_STATS
#include <unistd.h>

#include <cstdio>

#include "ops/serving.h"
#include "py_face.h"

namespace ps {

namespace {

// X(field, its type): the answer's fields, in order, each sent as one double.
#define PS_SERVER_STATS(X)                                                                                 \
  X(requests, int64_t) /* data requests */                                                                 \
  X(rows, int64_t)     /* embedding rows: the keys of sparse requests */                                   \
  X(bytes, int64_t)    /* data both ways */                                                                \
  X(busy_seconds, double) /* handling requests */                                                         \
  X(admitted, int64_t) /* rows of dynamic tables reset by admits */                                       \
  /* checkpoint files written and read, seconds from open to close (fsync included) */                     \
  X(checkpoint_saves, int64_t) X(checkpoint_saved_bytes, int64_t) X(checkpoint_save_seconds, double)       \
  X(checkpoint_loads, int64_t) X(checkpoint_loaded_bytes, int64_t) X(checkpoint_load_seconds, double)       \
  /* disk tiers (row_tier.h): rows found in the cache or not, records read and written, seconds */         \
  X(tier_hits, int64_t) X(tier_misses, int64_t) X(tier_reads, int64_t) X(tier_read_bytes, int64_t)         \
  X(tier_read_seconds, double) X(tier_writes, int64_t) X(tier_written_bytes, int64_t)                      \
  X(tier_write_seconds, double)                                                                           \
  /* the server process: its id, its resident memory now and at its peak (VmHWM: writing 5 to      */  \
  /* /proc/PID/clear_refs starts the peak again)                                                     */  \
  X(pid, int64_t) X(rss_bytes, int64_t) X(peak_rss_bytes, int64_t)

// VmRSS and VmHWM of /proc/self/status, in bytes (0 where the file says nothing).
void ResidentMemory(int64_t* now, int64_t* peak) {
  *now = *peak = 0;
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return;
  char line[256];
  long kib = 0;
  while (std::fgets(line, sizeof line, f)) {
    if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) *now = int64_t(kib) * 1024;
    else if (std::sscanf(line, "VmHWM: %ld kB", &kib) == 1) *peak = int64_t(kib) * 1024;
  }
  std::fclose(f);
}

struct ServerStats {
#define PS_STATS_FIELD(name, type) type name = 0;
  PS_SERVER_STATS(PS_STATS_FIELD)
#undef PS_STATS_FIELD

  static constexpr size_t kFields = 0
#define PS_STATS_COUNT(name, type) +1
      PS_SERVER_STATS(PS_STATS_COUNT)
#undef PS_STATS_COUNT
      ;

  static ServerStats Of(const KVServer& server) {
    const KVServer::Counters c = server.counters();
    const TableShard::CheckpointCounters k = TableShard::Checkpoints();
    ServerStats s;
    s.requests = c.requests;
    s.rows = c.rows;
    s.bytes = c.bytes;
    s.busy_seconds = c.busy_seconds;
    s.admitted = AdmittedRows();
    s.checkpoint_saves = k.saves;
    s.checkpoint_saved_bytes = k.saved_bytes;
    s.checkpoint_save_seconds = k.save_seconds;
    s.checkpoint_loads = k.loads;
    s.checkpoint_loaded_bytes = k.loaded_bytes;
    s.checkpoint_load_seconds = k.load_seconds;
    const TableShard::TierCounters d = TableShard::Tiers();
    s.tier_hits = d.hits;
    s.tier_misses = d.misses;
    s.tier_reads = d.file.reads;
    s.tier_read_bytes = d.file.read_bytes;
    s.tier_read_seconds = d.file.read_seconds;
    s.tier_writes = d.file.writes;
    s.tier_written_bytes = d.file.written_bytes;
    s.tier_write_seconds = d.file.write_seconds;
    s.pid = getpid();
    ResidentMemory(&s.rss_bytes, &s.peak_rss_bytes);
    return s;
  }

  Blob Encode() const {
    double* out;
    Blob b = Blob::Alloc<double>(kFields, &out);
#define PS_STATS_PUT(name, type) *out++ = static_cast<double>(name);
    PS_SERVER_STATS(PS_STATS_PUT)
#undef PS_STATS_PUT
    return b;
  }

  static ServerStats Decode(const Blob& b) {
    if (b.count<double>() != kFields) throw std::runtime_error("server stats answer has the wrong size");
    const double* v = b.as<double>();
    ServerStats s;
#define PS_STATS_GET(name, type) s.name = static_cast<type>(*v++);
    PS_SERVER_STATS(PS_STATS_GET)
#undef PS_STATS_GET
    return s;
  }

  py::dict ToDict() const {
    py::dict d;
#define PS_STATS_KEY(name, type) d[#name] = name;
    PS_SERVER_STATS(PS_STATS_KEY)
#undef PS_STATS_KEY
    return d;
  }
};

bool Serve(Serving& s) {
  s.Reply({ServerStats::Of(s.server).Encode()}, "");
  return true;
}

// One dict per server, in rank order (the parts' order).
py::object Result(Request& r, const Asked&) {
  py::list out;
  for (const Part& p : r.parts) out.append(ServerStats::Decode(p.response.data.at(0)).ToDict());
  return out;
}

void Bind(PyFace& f) {
  f.m.def(
      "server_stats",
      [] {
        auto req = Send([](KVWorker& w) {
          auto r = w.NewRequest(TableRef{}, kStats);
          r->what = "stats of the servers";
          w.AllServers(r.get());
          w.Send(r, "", [](Message&, const Part&) {});
          return r;
        });
        return Handle(req, py::list());
      },
      "Worker: what every server has served so far (a Handle of one dict per server, in rank order).");
  f.m.def(
      "own_server_stats",
      [] {
        NodeState& node = Node();
        if (!node.server) throw std::runtime_error("hetu.ps: own_server_stats() is for a server");
        return ServerStats::Of(*node.server).ToDict();
      },
      "Server: what this server has served so far (as server_stats()).");
}

}  // namespace

extern const OpDef kStatsOp = {"stats", kNoTable | kUncounted, Serve, Result, Bind};

}  // namespace ps
