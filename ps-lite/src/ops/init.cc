// kInit: creates a table on every server.
//   request:  no blobs; meta spec (TableSpec: shape, initializer, optimizer, BSP, placement,
//             storage; the worker sets the placement it splits keys by)
//   answer:   no blobs; an error for an invalid spec or a table of that name and another shape
// Idempotent for the same shape: the table keeps its values.
#include "common/host_memory.h"
#include "ops/serving.h"
#include "optim_config.h"
#include "py_face.h"

namespace ps {

namespace {

// "" or why the spec cannot make a table.
std::string Invalid(const std::string& name, const pb::TableSpec& spec) {
  const int kind = spec.optim().kind();
  if (name.empty() || spec.rows() <= 0 || spec.width() <= 0 || kind < 0 || kind >= hetu::optim::kNumKinds ||
      spec.init_kind() < 0 || spec.init_kind() > 3 || spec.staleness() < 0)
    return "table '" + name + "': invalid init spec (rows " + std::to_string(spec.rows()) + ", width " +
           std::to_string(spec.width()) + ")";
  if (spec.placement() != RowPlacement::kStrided && spec.placement() != RowPlacement::kContiguous)
    return "table '" + name + "': unknown row placement " + std::to_string(spec.placement());
  if (spec.storage() < 0 || spec.storage() >= hetu::storage::kNumTypes ||
      (spec.dense() && spec.storage() != hetu::storage::kF32))
    return "table '" + name + "': storage type " + std::to_string(spec.storage()) +
           (spec.dense() ? " for a dense tensor (dense tensors are fp32)" : " is unknown");
  if (!spec.tier_dir().empty() && (spec.dense() || spec.tier_cache_bytes() <= 0))
    return "table '" + name + "': a disk tier needs an embedding table and a cache of at least one byte (" +
           std::to_string(spec.tier_cache_bytes()) + ")";
  if (spec.dense() && hetu::optim::rowwise(kind))
    return "table '" + name + "': a row-wise optimizer steps embedding rows; a dense tensor takes its "
           "element-wise dense rule";
  return "";
}

// "" or why an existing table `old` is not the one the spec asks for.
std::string Differs(const std::string& name, const pb::TableSpec& old, const pb::TableSpec& spec) {
  if (old.storage() != spec.storage())
    return "table '" + name + "' already exists with " + hetu::storage::name(old.storage()) + " rows, not " +
           hetu::storage::name(spec.storage());
  if (old.rows() != spec.rows() || old.width() != spec.width() || old.dense() != spec.dense())
    return "table '" + name + "' already exists with shape " + std::to_string(old.rows()) + "x" +
           std::to_string(old.width()) + (old.dense() ? " (dense)" : "") + ", not " + std::to_string(spec.rows()) +
           "x" + std::to_string(spec.width()) + (spec.dense() ? " (dense)" : "");
  if (old.placement() != spec.placement())
    return "table '" + name + "' already exists with " +
           RowPlacement::Name(static_cast<RowPlacement::Kind>(old.placement())) + " row placement, not " +
           RowPlacement::Name(static_cast<RowPlacement::Kind>(spec.placement())) +
           " (PS_ROW_PLACEMENT must be the same for every worker)";
  return "";  // same shape: keeps the current values
}

// "" or why this server's host cannot hold its shard of the table (common/host_memory.h).
std::string TooLarge(Serving& s, const std::string& name, const pb::TableSpec& spec) {
  const int rank = s.server.po().rank(), servers = s.server.po().num_servers();
  const int64_t need = TableShard::Bytes(spec, rank, servers);
  const hetu::AvailableMemory available = hetu::HostAvailableMemory();
  if (need <= available.bytes) return "";
  const int64_t rows = RowPlacement::Of(static_cast<RowPlacement::Kind>(spec.placement()), spec.dense(), spec.rows(),
                                        servers).Rows(rank);
  return "table '" + name + "': server " + std::to_string(rank) + " needs " + hetu::ByteText(need) + " for its " +
         std::to_string(rows) + " of the " + std::to_string(spec.rows()) + " rows (" +
         std::to_string(rows ? need / rows : need) + " bytes a row: the row as stored, its optimizer state, step " +
         "count and version), and its host has " + hetu::ByteText(available.bytes) + " available (" +
         available.source + ")";
}

bool Serve(Serving& s) {
  const auto& spec = s.msg.meta.spec();
  const std::string& name = s.msg.meta.table();
  try {
    std::string err = Invalid(name, spec);
    if (err.empty()) {
      KVServer::Entry* e = s.server.Find(name);
      if (e) err = Differs(name, e->shard->spec(), spec);
      else if ((err = TooLarge(s, name, spec)).empty()) s.server.Create(name, spec);
    }
    s.Reply({}, err);
  } catch (const std::exception& ex) {
    s.Reply({}, "table '" + name + "': init failed on server " + std::to_string(s.server.po().rank()) + ": " +
                    ex.what());
  }
  return true;
}

// The optimizer dict of Table.init: "kind" (hetu::optim::Kind) and hyperparameters by name
// (the registry's, hetu::optim::kHyperparameters); those left out keep hetu::optim::Config's defaults.
hetu::optim::Config OptimOf(const std::string& table, const py::dict& optimizer) {
  hetu::optim::Config c;
  for (auto [key, value] : optimizer) {
    const std::string name = py::str(key);
    if (name == "kind") {
      c.kind = value.cast<int>();
      continue;
    }
    const auto* h = FindHyperparameter(name);
    if (!h) throw py::value_error("table '" + table + "': unknown optimizer setting '" + name + "'");
    c.*h->member = value.cast<float>();
  }
  return c;
}

Handle Init(RemoteTable& table, int init_kind, double init_a, double init_b, uint64_t seed, uint64_t stream,
            const py::dict& optimizer, bool bsp, int staleness, const std::string& tier_dir,
            int64_t tier_cache_bytes) {
  const TableRef& t = table.ref();
  pb::TableSpec spec;
  spec.set_rows(t.rows);
  spec.set_width(t.width);
  spec.set_dense(t.dense);
  spec.set_init_kind(init_kind);
  spec.set_init_a(init_a);
  spec.set_init_b(init_b);
  spec.set_seed(seed);
  spec.set_stream(stream);
  *spec.mutable_optim() = OptimToProto(OptimOf(t.name, optimizer));
  spec.set_bsp(bsp);
  spec.set_staleness(staleness);
  spec.set_storage(t.storage);
  spec.set_tier_dir(tier_dir);
  spec.set_tier_cache_bytes(tier_cache_bytes);
  auto req = Send([&](KVWorker& w) {
    auto r = w.NewRequest(TableRef{t.name}, kInit);
    w.AllServers(r.get());
    w.Send(r, t.name, [&](Message& m, const Part&) {
      *m.meta.mutable_spec() = spec;
      m.meta.mutable_spec()->set_placement(w.placement());  // the servers place rows as this worker splits keys
    });
    return r;
  });
  return Handle(req, py::list());
}

void Bind(PyFace& f) {
  f.table.def("init", &Init, py::kw_only(), py::arg("init_kind"), py::arg("init_a"), py::arg("init_b"),
              py::arg("seed"), py::arg("stream"), py::arg("optimizer"), py::arg("bsp"), py::arg("staleness"),
              py::arg("tier_dir") = "", py::arg("tier_cache_bytes") = 0,
              "Creates the table on every server (result: None). optimizer: {'kind': hetu::optim::Kind, "
              "hyperparameter: value, ...}; those left out take their defaults.");
}

}  // namespace

extern const OpDef kInitOp = {"init", kNoTable, Serve, nullptr, Bind};

}  // namespace ps
