// hetu._C's Herald planning thread and plan link (src/herald/planning_thread.h, plan_link.h): a
// worker takes its samples and plans from a PlanningThread of its own or, on a host with one
// planner, from a PlanReceiver.
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "bindings/herald.h"
#include "herald/plan_link.h"
#include "herald/planner.h"
#include "herald/planning_thread.h"

namespace hetu {
namespace bindings {

namespace {

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

}  // namespace

// PlanTimeout: a wait for samples or a plan that ran out of time (a TimeoutError).
void bind_plan_timeout(py::module_& m) {
  py::register_exception<hetu::herald::PlanTimeout>(m, "PlanTimeout", PyExc_TimeoutError);
}

// PlanFollowers: the connections PlanListener.accept took.
void bind_plan_followers(py::module_& m) {
  py::class_<PlanFollowers>(m, "PlanFollowers", "connections from a host's other workers, for a PlanningThread");
}

// PlanListener: where a host's planner takes its followers' connections.
void bind_plan_listener(py::module_& m) {
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
}

// PlanningThread: the planner on a thread of its own.
void bind_planning_thread(py::module_& m) {
  py::class_<PlanningThreadHandle> planning_thread(m, "PlanningThread",
                                                   "Herald's planner on a thread of its own that never takes the GIL "
                                                   "(src/herald/planning_thread.h)");
  planning_thread
      .def(py::init([](hetu::herald::Planner planner, std::optional<Array<int64_t>> table, int64_t history,
                       PlanFollowers* followers, double send_timeout) {
             if (table && table->ndim() != 2) throw std::invalid_argument("PlanningThread: table must be [samples, fields]");
             auto h = std::make_unique<PlanningThreadHandle>();
             if (table) h->table = *table;
             std::vector<hetu::herald::Socket> sockets;
             if (followers) sockets = std::move(followers->sockets);
             h->thread = std::make_unique<hetu::herald::PlanningThread>(
                 std::move(planner), table ? table->data() : nullptr, table ? table->shape(0) : 0,
                 table ? table->shape(1) : 0, history, std::move(sockets), send_timeout);
             return h;
           }),
           py::arg("planner"), py::arg("table"), py::arg("history"), py::arg("followers") = nullptr,
           py::arg("send_timeout") = 600.0,
           "plans with (a copy of) `planner` the global batches submitted, gathering their ids from `table` "
           "(every sample's ids [N, fields], typically memory-mapped; None: each batch is submitted with its ids, "
           "submit_ids); allocations stay available `history` "
           "iterations back. A host's planner (ranks [this worker, others...]) sends the others their samples and "
           "plans over `followers` (PlanListener.accept), giving up on one that takes nothing for `send_timeout` s")
      .def("submit", [](PlanningThreadHandle& h, int64_t iteration, Array<int64_t> samples) {
             std::vector<int64_t> v(samples.data(), samples.data() + samples.size());
             h.thread->Submit(iteration, std::move(v));
           }, py::arg("iteration"), py::arg("samples"),
           "queues global batch `iteration` (its samples' positions in the table); iterations in order")
      .def("submit_ids", [](PlanningThreadHandle& h, int64_t iteration, Array<int64_t> ids, Array<int64_t> forget) {
             if (ids.ndim() != 2) throw std::invalid_argument("PlanningThread.submit_ids: ids must be [samples, fields]");
             h.thread->SubmitIds(iteration, std::vector<int64_t>(ids.data(), ids.data() + ids.size()), ids.shape(1),
                                 std::vector<int64_t>(forget.data(), forget.data() + forget.size()));
           }, py::arg("iteration"), py::arg("ids"), py::arg("forget"),
           "queues global batch `iteration` by its ids [samples, fields] (-1: no row), every worker's cached copies "
           "of the rows `forget` dropped before it is planned (Planner.forget); iterations in order");
  def_plan_source(planning_thread);
}

// PlanReceiver: the plans a host's planner sends this worker.
void bind_plan_receiver(py::module_& m) {
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
