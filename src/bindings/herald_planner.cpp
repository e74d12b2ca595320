// hetu._C's Herald planner (src/herald/planner.h): Planner, planner_threads, and the batches a
// BatchPreparer prepares for it (PreparedBatch).
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "bindings/herald.h"
#include "cache/policy.h"
#include "herald/batch_preparer.h"
#include "herald/planner.h"

namespace hetu {
namespace bindings {

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

namespace {

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

}  // namespace

// Planner, with planner_threads (the thread count it takes).
void bind_planner(py::module_& m) {
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
      .def("forget", [](hetu::herald::Planner& p, Array<int64_t> rows) { p.Forget(rows.data(), rows.size()); },
           py::arg("rows"),
           "every worker's cached copy of `rows` dropped, neither valid nor dirty, still resident: rows whose "
           "contents are discarded (a dynamic table's re-assigned slots), before the next advance")
      .def("valid_masks", [](const hetu::herald::Planner& p, Array<int64_t> keys) {
             Array<uint64_t> out(keys.size());
             uint64_t* o = out.mutable_data();
             for (py::ssize_t i = 0; i < keys.size(); ++i) o[i] = p.ValidMask(keys.data()[i]);
             return out;
           }, py::arg("keys"), "per key, one bit per worker whose modelled cached copy is valid now");
}

// PreparedBatch: a batch a BatchPreparer is preparing.
void bind_prepared_batch(py::module_& m) {
  py::class_<PreparedHandle>(m, "PreparedBatch", "a global batch being prepared, for Planner.advance")
      .def("wait", [](PreparedHandle& h) {
             if (!h.batch.valid()) throw std::invalid_argument("PreparedBatch.wait: this batch was planned already");
             py::gil_scoped_release nogil;
             h.batch.wait();
           }, "waits until the batch is prepared (or its preparation failed: Planner.advance then raises)");
}

// BatchPreparer: a planner's batches prepared on a thread of their own
// (src/herald/batch_preparer.h).
void bind_batch_preparer(py::module_& m) {
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
}

}  // namespace bindings
}  // namespace hetu
