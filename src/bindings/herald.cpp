// hetu._C's Herald scheduler: the allocators, the planner, its planning thread and the link
// that carries a host's plans, and a worker's cache under the plan (PlanCache).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "cache/policy.h"
#include "common/optim_rules.h"
#include "herald/allocate.h"
#include "herald/batch_preparer.h"
#include "herald/plan_cache.h"
#include "herald/planner.h"
#include "herald/planning_thread.h"

namespace hetu {
namespace bindings {

namespace {

using hetu::herald::PlanCache;
using hetu::optim::Config;

// A worker's plan as the fields of hetu.herald.Plan, in order:
// [iteration, samples, keys, hit, pull, owner, invalidate, writeback].
py::list plan_fields(const hetu::herald::WorkerPlan& p) {
  py::list out;
  out.append(p.iteration);
  out.append(to_array(p.samples));
  out.append(to_array(p.keys));
  out.append(to_bool_array(p.hit));
  out.append(to_bool_array(p.pull));
  out.append(to_bool_array(p.owner));
  out.append(to_array(p.invalidate));
  out.append(to_array(p.writeback));
  return out;
}

// Kept rank i's (samples of iteration t, plan of t-1 as a tuple of plan_fields or None).
py::tuple advanced_to_python(const hetu::herald::Advanced& r, size_t i) {
  py::object finished = py::none();
  if (r.has_finished) finished = py::tuple(plan_fields(r.finished[i]));
  return py::make_tuple(to_array(r.samples[i]), finished);
}

hetu::herald::Advanced planner_advance(hetu::herald::Planner& planner, Array<int64_t> ids, int64_t iteration) {
  if (ids.ndim() != 2) throw std::invalid_argument("Planner.advance: ids must be [samples, fields]");
  py::gil_scoped_release nogil;
  return planner.Advance(ids.data(), ids.shape(1), iteration);
}

// A batch queued on a BatchPreparer, with its ids kept alive until the preparer has read them,
// and the preparer until it has prepared it.
struct PreparedHandle {
  py::object preparer, ids;
  std::future<hetu::herald::PreparedBatch> batch;
  PreparedHandle() = default;
  PreparedHandle(const PreparedHandle&) = delete;
  ~PreparedHandle() {
    if (batch.valid()) batch.wait();  // the preparer may still be reading ids
  }
};

// A Planner's `rank` argument: one rank, or the ranks of a host's planner.
std::vector<int> planner_ranks(const py::object& rank) {
  if (py::isinstance<py::int_>(rank)) return {rank.cast<int>()};
  return rank.cast<std::vector<int>>();
}

// The id table and the planning thread that reads it: the table is kept alive for as long as the
// thread runs (members are destroyed last to first).
struct PlanningThreadHandle {
  Array<int64_t> table;
  std::unique_ptr<hetu::herald::PlanningThread> thread;
  hetu::herald::PlanBook& book() { return thread->book(); }
  void stop() { thread->Stop(); }
};

// What a host's planner sends this worker (src/herald/plan_link.h), taken like a PlanningThread's.
struct PlanReceiverHandle {
  std::unique_ptr<hetu::herald::PlanReceiver> receiver;
  hetu::herald::PlanBook& book() { return receiver->book(); }
  void stop() { receiver->Stop(); }
};

// The connections a host's planner accepted, until a PlanningThread takes them.
struct PlanFollowers {
  std::vector<hetu::herald::Socket> sockets;
};

// The planning thread's answer: taken at once if ready, else waited for with the GIL released.
// Released only to wait: on a busy machine getting the GIL back costs more than an answer that
// is already there.
template <typename T, typename Try, typename Wait>
T take_or_wait(const Try& try_take, const Wait& wait) {
  T out;
  if (try_take(&out)) return out;
  py::gil_scoped_release nogil;
  return wait();
}

// plan_fields, then the planner's seconds.
py::tuple plan_to_python(const hetu::herald::FinishedPlan& f) {
  py::list fields = plan_fields(f.plan);
  fields.append(f.planner_seconds);
  return py::tuple(fields);
}

// samples, plan and close of a PlanningThread or a PlanReceiver: what this worker takes.
template <typename Handle>
void def_plan_source(py::class_<Handle>& cls) {
  cls.def("samples", [](Handle& h, int64_t iteration, double timeout) {
           return to_array(take_or_wait<std::vector<int64_t>>(
               [&](std::vector<int64_t>* v) { return h.book().TrySamples(iteration, v); },
               [&] { return h.book().Samples(iteration, timeout); }));
         }, py::arg("iteration"), py::arg("timeout"),
         "this worker's samples of `iteration` (positions within the global batch); waits for them")
      .def("plan", [](Handle& h, int64_t iteration, double timeout) {
           return plan_to_python(take_or_wait<hetu::herald::FinishedPlan>(
               [&](hetu::herald::FinishedPlan* f) { return h.book().TryPlan(iteration, f); },
               [&] { return h.book().Plan(iteration, timeout); }));
         }, py::arg("iteration"), py::arg("timeout"),
         "(iteration, samples, keys, hit, pull, owner, invalidate, writeback, planner seconds): the final plan "
         "of `iteration`; waits for it")
      .def("close", [](Handle& h) {
           py::gil_scoped_release nogil;
           h.stop();
         }, "stops; waits not yet answered fail");
}

py::tuple rows_out(const hetu::herald::RowsOut& r, const PlanCache& c) {
  const py::ssize_t n = static_cast<py::ssize_t>(r.keys.size());
  Array<float> state(std::vector<py::ssize_t>{n, static_cast<py::ssize_t>(c.state_width())});
  std::copy(r.state.begin(), r.state.end(), state.mutable_data());
  return py::make_tuple(to_array(r.keys), to_rows(r.values, c.width()), state, to_array(r.steps));
}

// The working arrays of one step: vals [n, width], state [n, state_width], steps [n].
void check_step_arrays(const PlanCache& c, int64_t n, const Array<float>& vals, const Array<float>& state,
                       const Array<int64_t>& steps, const char* what) {
  check_rows(vals, n, c.width(), what);
  if (state.size() != n * c.state_width() || steps.size() != n)
    throw std::invalid_argument(std::string(what) + ": state and steps must have one row per key");
}

py::tuple plan_cache_begin(PlanCache& c, Array<int64_t> keys, Array<bool> hit, Array<bool> pull, Array<float> vals,
                           Array<float> state, Array<int64_t> steps) {
  const int64_t n = keys.size();
  if (hit.size() != n || pull.size() != n) throw std::invalid_argument("PlanCache.begin: one hit and pull flag per key");
  check_step_arrays(c, n, vals, state, steps, "PlanCache.begin");
  float* v = mutable_data(vals, "vals");
  float* s = mutable_data(state, "state");
  int64_t* st = mutable_data(steps, "steps");
  int64_t served = 0, evictions = 0;
  std::string error;
  {
    py::gil_scoped_release nogil;
    error = c.Begin(keys.data(), n, reinterpret_cast<const uint8_t*>(hit.data()),
                    reinterpret_cast<const uint8_t*>(pull.data()), v, s, st, &served, &evictions);
  }
  return py::make_tuple(error, served, evictions);
}

py::tuple plan_cache_finish(PlanCache& c, Array<int64_t> keys, Array<bool> owner, Array<float> summed, float lr,
                            Array<float> vals, Array<float> state, Array<int64_t> steps, Array<int64_t> invalidate,
                            Array<int64_t> writeback) {
  const int64_t n = keys.size();
  if (owner.size() != n) throw std::invalid_argument("PlanCache.finish: one owner flag per key");
  check_rows(summed, n, c.width(), "PlanCache.finish (gradients)");
  check_step_arrays(c, n, vals, state, steps, "PlanCache.finish");
  float* v = mutable_data(vals, "vals");
  float* s = mutable_data(state, "state");
  int64_t* st = mutable_data(steps, "steps");
  hetu::herald::RowsOut out;
  std::string error;
  {
    py::gil_scoped_release nogil;
    error = c.Finish(keys.data(), n, reinterpret_cast<const uint8_t*>(owner.data()), summed.data(), lr, v, s, st,
                     invalidate.data(), invalidate.size(), writeback.data(), writeback.size(), &out);
  }
  return py::make_tuple(error, rows_out(out, c));
}

}  // namespace

void bind_herald(py::module_& m) {
  py::class_<PlanCache>(m, "PlanCache",
                        "a worker's cached embedding rows under Herald's plan: policy, values, optimizer state, "
                        "valid and dirty flags (src/herald/plan_cache.h); the training thread's only")
      .def(py::init([](const std::string& policy, int64_t capacity, int64_t width, const Config& optimizer,
                       int64_t pin_threshold) {
             return new PlanCache(hetu::cache::ParsePolicy(policy), capacity, width, optimizer, pin_threshold);
           }),
           py::arg("policy"), py::arg("capacity"), py::arg("width"), py::arg("optimizer"), py::arg("pin_threshold") = 8)
      .def("begin", &plan_cache_begin, py::arg("keys"), py::arg("hit"), py::arg("pull"), py::arg("vals"),
           py::arg("state"), py::arg("steps"),
           "the step's keys through the policy, checked against the plan's hits and pulls; the valid cached rows "
           "written to vals/state/steps; returns (error or '', rows served from the cache, evictions)")
      .def("finish", &plan_cache_finish, py::arg("keys"), py::arg("owner"), py::arg("summed"), py::arg("lr"),
           py::arg("vals"), py::arg("state"), py::arg("steps"), py::arg("invalidate"), py::arg("writeback"),
           "owner rows stepped and kept, shared copies dropped, invalidations; returns (error or '', the planned "
           "write-back as (keys, values, state, steps))")
      .def("drain", [](PlanCache& c) { return rows_out(c.Drain(), c); },
           "every dirty row as (keys, values, state, steps), now clean")
      .def_property_readonly("width", &PlanCache::width)
      .def_property_readonly("state_width", &PlanCache::state_width)
      .def_property_readonly("capacity", &PlanCache::capacity);

  m.def("greedy_allocate", [](Array<int32_t> scores, int64_t per_worker, int64_t iteration) {
    if (scores.ndim() != 2) throw std::invalid_argument("greedy_allocate: scores must be [samples, workers]");
    const int64_t n = scores.shape(0);
    const int workers = static_cast<int>(scores.shape(1));
    if (n != workers * per_worker)
      throw std::invalid_argument("greedy_allocate: " + std::to_string(n) + " samples cannot give " +
                                  std::to_string(workers) + " workers " + std::to_string(per_worker) + " each");
    Array<int32_t> out(n);
    int32_t* o = out.mutable_data();
    const int32_t* sc = scores.data();
    py::gil_scoped_release nogil;
    hetu::herald::GreedyAllocate(sc, n, workers, per_worker, iteration, o);
    return out;
  }, "Herald's allocation of a global batch: worker of each sample");
  // rows: [samples, slots] indices into the batch's distinct rows, -1 in an empty slot; valid: per
  // distinct row, one bit per worker whose cache holds a valid copy.
  auto check_colocate = [](const Array<int32_t>& rows, const Array<uint64_t>& valid, int workers) {
    if (rows.ndim() != 2) throw std::invalid_argument("colocate: rows must be [samples, slots]");
    if (workers < 1 || workers > 64) throw std::invalid_argument("colocate: 1 to 64 workers");
    const int32_t* r = rows.data();
    for (py::ssize_t i = 0; i < rows.size(); ++i)
      if (r[i] < -1 || r[i] >= valid.size())
        throw std::invalid_argument("colocate: row index " + std::to_string(r[i]) + " outside the " +
                                    std::to_string(valid.size()) + " distinct rows");
  };
  m.def("colocate_allocate", [check_colocate](Array<int32_t> rows, Array<uint64_t> valid, int workers,
                                               int64_t per_worker, int64_t iteration) {
    check_colocate(rows, valid, workers);
    const int64_t n = rows.shape(0);
    if (n != workers * per_worker)
      throw std::invalid_argument("colocate_allocate: " + std::to_string(n) + " samples cannot give " +
                                  std::to_string(workers) + " workers " + std::to_string(per_worker) + " each");
    Array<int32_t> out(n);
    int32_t* o = out.mutable_data();
    py::gil_scoped_release nogil;
    const auto samples = hetu::herald::SampleRows::FromSlots(rows.data(), n, rows.shape(1), valid.size());
    hetu::herald::ColocateAllocate(samples, valid.data(), valid.size(), workers, per_worker, iteration, o);
    return out;
  }, py::arg("rows"), py::arg("valid"), py::arg("workers"), py::arg("per_worker"), py::arg("iteration"),
     "Herald's co-locating allocation of a global batch: worker of each sample");
  m.def("estimated_rows", [check_colocate](Array<int32_t> rows, Array<uint64_t> valid, int workers,
                                            Array<int32_t> assignment) {
    check_colocate(rows, valid, workers);
    if (assignment.size() != rows.shape(0)) throw std::invalid_argument("estimated_rows: one worker per sample");
    for (py::ssize_t s = 0; s < assignment.size(); ++s)
      if (assignment.data()[s] < 0 || assignment.data()[s] >= workers)
        throw std::invalid_argument("estimated_rows: worker out of range");
    const auto samples = hetu::herald::SampleRows::FromSlots(rows.data(), rows.shape(0), rows.shape(1), valid.size());
    return hetu::herald::EstimatedRows(samples, valid.data(), valid.size(), assignment.data());
  }, py::arg("rows"), py::arg("valid"), py::arg("workers"), py::arg("assignment"),
     "the row transmissions colocate_allocate estimates for an assignment");
  m.def("planner_threads", &hetu::herald::PlannerThreads, py::arg("threads"), py::arg("ranks"),
        "the thread count of a planner for `ranks` workers asked for `threads`: threads if positive, else "
        "HETU_PLANNER_THREADS if set, else one per worker planned for, at most the cores");
  py::class_<hetu::herald::Planner>(m, "Planner", "Herald's allocation and exact plan, one iteration at a time")
      .def(py::init([](int workers, py::object rank, int64_t per_worker, const std::string& policy, int64_t capacity,
                       int64_t pin_threshold, const std::string& allocator, int threads) {
             if (threads < 0) throw std::invalid_argument("Planner: threads must be >= 0 (0: HETU_PLANNER_THREADS, else 1)");
             return new hetu::herald::Planner(workers, planner_ranks(rank), per_worker, hetu::cache::ParsePolicy(policy),
                                              capacity, pin_threshold, hetu::herald::ParseAllocator(allocator), threads);
           }),
           py::arg("workers"), py::arg("rank"), py::arg("per_worker"), py::arg("policy"), py::arg("capacity"),
           py::arg("pin_threshold") = 8, py::arg("allocator") = "colocate", py::arg("threads") = 0,
           "rank: the worker whose plans are kept, or a list of them (a host's planner: every rank of the host, "
           "the planning worker's first); threads: the planner's own thread count (0: planner_threads(0, "
           "ranks)); plans are the same whatever it is")
      .def_property_readonly("threads", &hetu::herald::Planner::threads)
      .def_property_readonly("ranks", &hetu::herald::Planner::ranks)
      .def("profile", [](const hetu::herald::Planner& p) {
             const hetu::herald::PlanProfile& f = p.profile();
             py::dict d;
             d["plans"] = f.plans;
             d["ids"] = f.ids;
             d["scores"] = f.scores;
             d["trades"] = f.trades;
             d["readers"] = f.readers;
             d["workers"] = f.workers;
             d["masks"] = f.masks;
             d["total"] = f.total;
             return d;
           }, "seconds spent per stage over all plans so far: ids (distinct rows, each sample's rows and those the "
              "allocation scores unless a BatchPreparer prepared them, valid masks), scores "
              "(allocation: scores and placement), trades (allocation: pairwise trades), readers, workers "
              "(every worker's cache model and plan), masks (valid masks updated), total; and plans")
      .def("advance", [](hetu::herald::Planner& p, Array<int64_t> ids, int64_t iteration) {
             return advanced_to_python(planner_advance(p, ids, iteration), 0);
           }, py::arg("ids"), py::arg("iteration"),
           "allocates global batch `iteration` (ids [samples, fields]); returns (the first rank's samples, "
           "its now final plan of the previous iteration or None)")
      .def("advance_all", [](hetu::herald::Planner& p, Array<int64_t> ids, int64_t iteration) {
             const hetu::herald::Advanced r = planner_advance(p, ids, iteration);
             py::list out;
             for (size_t i = 0; i < r.samples.size(); ++i) out.append(advanced_to_python(r, i));
             return out;
           }, py::arg("ids"), py::arg("iteration"), "advance's answer for each rank, in the order of `ranks`")
      .def("advance", [](hetu::herald::Planner& p, PreparedHandle& h, int64_t iteration) {
             if (!h.batch.valid()) throw std::invalid_argument("Planner.advance: this prepared batch was planned already");
             hetu::herald::Advanced r;
             {
               py::gil_scoped_release nogil;
               r = p.Advance(h.batch.get(), iteration);
             }
             return advanced_to_python(r, 0);
           }, py::arg("prepared"), py::arg("iteration"),
           "advance, for a batch a BatchPreparer of this planner prepared")
      .def("valid_masks", [](const hetu::herald::Planner& p, Array<int64_t> keys) {
             Array<uint64_t> out(keys.size());
             uint64_t* o = out.mutable_data();
             for (py::ssize_t i = 0; i < keys.size(); ++i) o[i] = p.ValidMask(keys.data()[i]);
             return out;
           }, py::arg("keys"), "per key, one bit per worker whose modelled cached copy is valid now");
  py::class_<PreparedHandle>(m, "PreparedBatch", "a global batch being prepared, for Planner.advance")
      .def("wait", [](PreparedHandle& h) {
             if (!h.batch.valid()) throw std::invalid_argument("PreparedBatch.wait: this batch was planned already");
             py::gil_scoped_release nogil;
             h.batch.wait();
           }, "waits until the batch is prepared (or its preparation failed: Planner.advance then raises)");
  py::class_<hetu::herald::BatchPreparer>(m, "BatchPreparer",
                                          "prepares a planner's global batches on a thread of its own, in the order "
                                          "given, while the planner plans earlier ones (a pipeline)")
      .def(py::init<const hetu::herald::Planner&>(), py::arg("planner"), py::keep_alive<1, 2>())
      .def("prepare", [](py::object self, Array<int64_t> ids) {
             if (ids.ndim() != 2) throw std::invalid_argument("BatchPreparer.prepare: ids must be [samples, fields]");
             auto& b = self.cast<hetu::herald::BatchPreparer&>();
             auto h = std::make_unique<PreparedHandle>();
             h->preparer = self;
             h->ids = ids;
             const int64_t* data = ids.data();
             const size_t size = static_cast<size_t>(ids.size());
             h->batch = b.Submit([data, size] { return std::vector<int64_t>(data, data + size); }, ids.shape(1));
             return h;
           }, py::arg("ids"), "queues global batch ids [samples, fields]; returns it, for Planner.advance");
  py::register_exception<hetu::herald::PlanTimeout>(m, "PlanTimeout", PyExc_TimeoutError);
  py::class_<PlanFollowers>(m, "PlanFollowers", "connections from a host's other workers, for a PlanningThread");
  py::class_<hetu::herald::PlanListener>(m, "PlanListener",
                                         "where a host's planner takes connections from the host's other workers "
                                         "(an abstract Unix socket of the kernel's choosing, src/herald/plan_link.h)")
      .def(py::init<>())
      .def_property_readonly("name", [](const hetu::herald::PlanListener& l) { return py::bytes(l.name()); })
      .def("accept", [](hetu::herald::PlanListener& l, std::vector<int> ranks, double timeout) {
             auto f = std::make_unique<PlanFollowers>();
             py::gil_scoped_release nogil;
             f->sockets = l.Accept(ranks, timeout);
             return f;
           }, py::arg("ranks"), py::arg("timeout"),
           "one connection from each of `ranks`, in that order; waits up to `timeout` s");
  py::class_<PlanningThreadHandle> planning_thread(m, "PlanningThread",
                                                   "Herald's planner on a thread of its own that never takes the GIL "
                                                   "(src/herald/planning_thread.h)");
  planning_thread
      .def(py::init([](hetu::herald::Planner planner, Array<int64_t> table, int64_t history, PlanFollowers* followers,
                       double send_timeout) {
             if (table.ndim() != 2) throw std::invalid_argument("PlanningThread: table must be [samples, fields]");
             auto h = std::make_unique<PlanningThreadHandle>();
             h->table = table;
             std::vector<hetu::herald::Socket> sockets;
             if (followers) sockets = std::move(followers->sockets);
             h->thread = std::make_unique<hetu::herald::PlanningThread>(std::move(planner), table.data(), table.shape(0),
                                                                        table.shape(1), history, std::move(sockets),
                                                                        send_timeout);
             return h;
           }),
           py::arg("planner"), py::arg("table"), py::arg("history"), py::arg("followers") = nullptr,
           py::arg("send_timeout") = 600.0,
           "plans with (a copy of) `planner` the global batches submitted, gathering their ids from `table` "
           "(every sample's ids [N, fields], typically memory-mapped); allocations stay available `history` "
           "iterations back. A host's planner (ranks [this worker, others...]) sends the others their samples and "
           "plans over `followers` (PlanListener.accept), giving up on one that takes nothing for `send_timeout` s")
      .def("submit", [](PlanningThreadHandle& h, int64_t iteration, Array<int64_t> samples) {
             std::vector<int64_t> v(samples.data(), samples.data() + samples.size());
             h.thread->Submit(iteration, std::move(v));
           }, py::arg("iteration"), py::arg("samples"),
           "queues global batch `iteration` (its samples' positions in the table); iterations in order");
  def_plan_source(planning_thread);
  py::class_<PlanReceiverHandle> plan_receiver(m, "PlanReceiver",
                                               "this worker's samples and plans as its host's planner sends them "
                                               "(src/herald/plan_link.h)");
  plan_receiver.def(py::init([](py::bytes name, int rank, int planner_rank, int64_t history, double timeout) {
                      auto h = std::make_unique<PlanReceiverHandle>();
                      std::string address = name;
                      py::gil_scoped_release nogil;
                      h->receiver = std::make_unique<hetu::herald::PlanReceiver>(address, rank, planner_rank, history,
                                                                                 timeout);
                      return h;
                    }),
                    py::arg("name"), py::arg("rank"), py::arg("planner_rank"), py::arg("history"), py::arg("timeout"),
                    "connects to the planner of worker `planner_rank` (PlanListener.name) as worker `rank`, "
                    "trying for up to `timeout` s");
  def_plan_source(plan_receiver);
}

}  // namespace bindings
}  // namespace hetu
