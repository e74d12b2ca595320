// kAdmit: dynamic tables (docs/design.md section 13). The workers decide which key holds which slot
// (hetu._C.KeyDirectory); a key admitted into a slot starts there from its own initial row.
//   request:  slots (rows of the table), keys (the key admitted into each slot), and optionally
//             the keys' initial rows (float32, a row a slot), drawn by the worker
//   answer:   nothing; an error for a slot outside the table, or a slot given two keys at once
// Each slot's row becomes its key's initial row (dynamic::FillKeyRows with the table's
// initializer, seed and stream: hetu._C.key_rows; the worker's rows where it sent them, which
// it drew by the same function: the server then only copies, and the draws, 1.6 ms of its
// thread for 2,000 keys of width 16, spread over the workers), rounded to the table's
// storage type, with zero optimizer state and step count, and a version one ahead (never
// back: a row a worker cached before the admit is then stale).
// With an iteration (BSP) it is served once every push of the iteration before is applied,
// whatever the staleness (a late push to the slot's old key must not land on the new key's
// row), and before any push of its own iteration: every worker that reads the key sends the
// same admit, and the slot is reset once per iteration. Without one (ASP) it applies on arrival.
#include <atomic>
#include <cstring>
#include <optional>
#include <unordered_map>

#include "common/storage.h"
#include "dynamic/key_rows.h"
#include "ops/serving.h"
#include "py_face.h"

namespace ps {

namespace {

// Rows reset by admits in this process (ServerStats::admitted); read by a stats request from
// another thread.
std::atomic<int64_t> g_admitted{0};

// "" if every slot is a row of the table held here and no slot is given two keys (in this
// request, or by an earlier admit of the same iteration), else the error. `fresh`: the
// positions of the pairs still to apply, a slot's first.
std::string FreshPairs(const TableShard& t, const int64_t* slots, const int64_t* keys, int64_t n,
                       int64_t iteration, std::vector<int64_t>* fresh) {
  const std::string& name = t.name();
  const int64_t rows = t.spec().rows();
  const bool recorded = iteration >= 0 && iteration == t.admit_iteration;
  std::unordered_map<int64_t, int64_t> taken;  // slot -> key, in this request
  for (int64_t i = 0; i < n; ++i) {
    if (slots[i] < 0 || slots[i] >= rows)
      return "table '" + name + "': admit of key " + std::to_string(keys[i]) + " into slot " +
             std::to_string(slots[i]) + ": the table's slots are [0, " + std::to_string(rows) + ")";
    int64_t before = 0;
    bool seen = false;
    auto in_request = taken.find(slots[i]);
    if (in_request != taken.end()) {
      before = in_request->second;
      seen = true;
    } else if (recorded) {
      auto admitted = t.admitted_keys.find(slots[i]);
      if (admitted != t.admitted_keys.end()) {
        before = admitted->second;
        seen = true;
      }
    }
    if (seen && before != keys[i])
      return "table '" + name + "': slot " + std::to_string(slots[i]) + " admitted for key " +
             std::to_string(before) + " and for key " + std::to_string(keys[i]) +
             (iteration >= 0 ? " at iteration " + std::to_string(iteration) : std::string(" in one request")) +
             " (the workers' key directories disagree)";
    if (seen) continue;
    taken.emplace(slots[i], keys[i]);
    fresh->push_back(i);
  }
  return t.CheckKeys(slots, n);  // sent to the server that holds them
}

// Resets the rows of the pairs at `fresh` (ServerStats::admitted counts them).
// A catch-up kind's rows start at step `start`: an admitted row has skipped nothing.
// `given`: the pairs' initial rows as the worker drew them (one a pair), or null: drawn here.
void ResetRows(TableShard& t, const int64_t* slots, const int64_t* keys, const float* given,
               const std::vector<int64_t>& fresh, int64_t start) {
  const int64_t m = static_cast<int64_t>(fresh.size()), w = t.width();
  std::vector<int64_t> at(m), admitted(m);
  for (int64_t j = 0; j < m; ++j) {
    at[j] = slots[fresh[j]];
    admitted[j] = keys[fresh[j]];
  }
  const pb::TableSpec& spec = t.spec();
  std::vector<float> initial(m * w);
  if (given != nullptr) {
    for (int64_t j = 0; j < m; ++j) std::memcpy(&initial[j * w], given + fresh[j] * w, w * sizeof(float));
  } else {
    hetu::dynamic::FillKeyRows(spec.init_kind(), spec.init_a(), spec.init_b(), spec.seed(), spec.stream(),
                               admitted.data(), m, w, initial.data());
  }
  std::vector<char> stored(m * t.row_bytes());  // as a static table's rows are rounded
  hetu::storage::narrow_row(t.storage(), initial.data(), stored.data(), m * w);
  const std::vector<float> state(m * t.state_width(), 0.0f);
  const std::vector<int64_t> steps(m, t.catches_up() ? start : 0), version_add(m, 1);
  t.Assign(at.data(), m, stored.data(), state.data(), steps.data(), version_add.data());
  g_admitted.fetch_add(m, std::memory_order_relaxed);
}

bool Serve(Serving& s) {
  TableShard& t = s.table();
  const Message& msg = s.msg;
  const int64_t iteration = msg.meta.has_iteration() && t.spec().bsp() ? msg.meta.iteration() : -1;
  // Pushes of an iteration before this one still pending: wait for them.
  if (iteration >= 0 && !t.pending.empty() && t.pending.begin()->first < iteration) return false;
  const int64_t n = NumKeys(msg);
  std::string err = Expect<int64_t>(msg, 1, n, "keys", t.name());
  const int64_t* slots = n ? msg.data[0].as<int64_t>() : nullptr;
  const int64_t* keys = err.empty() && n ? msg.data[1].as<int64_t>() : nullptr;
  const bool drawn = msg.data.size() > 2;  // the worker sent the rows
  if (err.empty() && drawn) err = Expect<float>(msg, 2, n * t.width(), "initial rows", t.name());
  const float* given = err.empty() && drawn && n ? msg.data[2].as<float>() : nullptr;
  if (err.empty() && iteration >= 0 && iteration <= t.applied)
    err = "table '" + t.name() + "': admit of iteration " + std::to_string(iteration) +
          " came after that iteration's pushes were applied (applied up to " + std::to_string(t.applied) +
          "); send it before the push of its iteration";
  std::vector<int64_t> fresh;
  if (err.empty()) err = FreshPairs(t, slots, keys, n, iteration, &fresh);
  if (err.empty()) {
    if (iteration >= 0 && iteration != t.admit_iteration) {
      t.admit_iteration = iteration;  // the record of the iterations before is done with
      t.admitted_keys.clear();
    }
    if (iteration >= 0)
      for (int64_t i : fresh) t.admitted_keys.emplace(slots[i], keys[i]);
    if (!fresh.empty()) ResetRows(t, slots, keys, given, fresh, msg.meta.catch_up_to());
  }
  s.Reply({}, err);
  return true;
}

Handle AdmitSlots(RemoteTable& table, Arr<int64_t> slots, Arr<int64_t> keys, std::optional<Arr<float>> rows,
                  int64_t iteration, int64_t catch_up_to) {
  const TableRef& t = table.ref();
  const int64_t n = slots.size();
  CheckSize(t.name, "keys", keys.size(), n);
  if (rows) CheckSize(t.name, "initial rows", rows->size(), n * t.width);
  py::list keep;
  keep.append(slots);
  keep.append(keys);
  if (rows) keep.append(*rows);
  const int64_t *sl = slots.data(), *k = keys.data();
  const float* drawn = rows ? rows->data() : nullptr;
  const int64_t width = t.width;
  auto req = Send([&](KVWorker& w) {
    auto r = w.NewRequest(t, kAdmit);
    w.Partition(t, sl, n, false, r.get());  // by slot, as a pull splits its keys
    w.Send(r, t.name, [&](Message& m, const Part& p) {
      m.meta.set_has_iteration(iteration >= 0);
      m.meta.set_iteration(iteration);
      m.meta.set_catch_up_to(catch_up_to);
      m.data.push_back(SliceOf(p, sl, 1));
      m.data.push_back(SliceOf(p, k, 1));
      if (drawn != nullptr) m.data.push_back(SliceOf(p, drawn, width));
    });
    return r;
  });
  return Handle(req, keep);
}

void Bind(PyFace& f) {
  f.table.def("admit", &AdmitSlots, py::kw_only(), py::arg("slots"), py::arg("keys"), py::arg("rows") = py::none(),
              py::arg("iteration") = -1, py::arg("catch_up_to") = 0,
              "Resets each slot's row to its key's initial row (hetu._C.key_rows; `rows`: those rows, float32 "
              "[len(keys), width], drawn by the caller), with zero optimizer state and steps and a newer "
              "version (result: None).");
}

}  // namespace

int64_t AdmittedRows() { return g_admitted.load(std::memory_order_relaxed); }

extern const OpDef kAdmitOp = {"admit", kBrief | kSparseOnly | kChangesRows, Serve, nullptr, Bind};

}  // namespace ps
