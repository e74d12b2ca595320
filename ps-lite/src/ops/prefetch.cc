// kPrefetch: rows a worker will read soon (the next step's, by Herald's plan or the HET cache's
// look-ahead), read from a disk tier's file into its cache now, while the workers compute.
//   request:  keys
//   answer:   nothing; an error for a key outside the table
// A hint: it changes no row and waits for no iteration. A table in memory has nothing to read.
#include "ops/serving.h"
#include "py_face.h"

namespace ps {
namespace {

bool Serve(Serving& s) {
  TableShard& t = s.table();
  const int64_t n = NumKeys(s.msg);
  const int64_t* keys;
  if (!s.server.ReadKeys(t, s.msg, n, &keys)) return true;
  t.PrefetchRows(keys, n);
  s.Reply({}, "");
  return true;
}

Handle Prefetch(RemoteTable& table, Arr<int64_t> keys) {
  const TableRef& t = table.ref();
  const int64_t n = table.Keys(keys);
  const int64_t* k = keys.data();
  auto req = Send([&](KVWorker& w) {
    auto r = w.NewRequest(t, kPrefetch);
    w.Partition(t, k, n, false, r.get());
    w.Send(r, t.name, [&](Message& m, const Part& p) { m.data.push_back(SliceOf(p, k, 1)); });
    return r;
  });
  py::list keep;
  keep.append(keys);
  return Handle(req, keep);
}

void Bind(PyFace& f) {
  f.table.def("prefetch", &Prefetch, py::arg("keys"),
              "Disk tiers: the servers read these rows into their caches now (result: None).");
}

}  // namespace

extern const OpDef kPrefetchOp = {"prefetch", kBrief | kSparseOnly, Serve, nullptr, Bind};

}  // namespace ps
