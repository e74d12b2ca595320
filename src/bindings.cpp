// hetu._C: Python binding of the CPU kernels. Arrays come in as C-contiguous NumPy arrays;
// every call releases the GIL while it computes.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cache/policy.h"
#include "cache/row_cache.h"
#include "common/parallel.h"
#include "data/click_log.h"
#include "herald/allocate.h"
#include "herald/plan_cache.h"
#include "herald/planner.h"
#include "herald/planning_thread.h"
#include "kernels/kernels.h"

namespace py = pybind11;
using hetu::optim::Config;

namespace {

template <typename T>
using Array = py::array_t<T, py::array::c_style>;

template <typename T>
T* mutable_data(Array<T>& a, const char* what) {
  if (!a.writeable()) throw std::invalid_argument(std::string(what) + " must be writeable");
  return a.mutable_data();
}

py::object gather_rows(Array<float> table, Array<int64_t> ids, Array<float> out) {
  if (table.ndim() != 2) throw std::invalid_argument("gather_rows: table must be 2-D");
  const int64_t rows = table.shape(0), width = table.shape(1), n = ids.size();
  if (out.size() != n * width) throw std::invalid_argument("gather_rows: out has the wrong size");
  int64_t bad;
  {
    py::gil_scoped_release nogil;
    bad = hetu::kernels::gather_rows(table.data(), rows, width, ids.data(), n, mutable_data(out, "out"));
  }
  if (bad >= 0) return py::make_tuple(bad, ids.data()[bad]);
  return py::none();
}

// (ids [n], rows [n, width]) as NumPy arrays: a sparse gradient's two halves.
py::tuple ids_and_rows(const std::vector<int64_t>& ids, const std::vector<float>& rows, int64_t width) {
  const auto n = static_cast<py::ssize_t>(ids.size());
  Array<int64_t> out_ids(n);
  Array<float> out_rows(std::vector<py::ssize_t>{n, static_cast<py::ssize_t>(width)});
  std::copy(ids.begin(), ids.end(), out_ids.mutable_data());
  std::copy(rows.begin(), rows.end(), out_rows.mutable_data());
  return py::make_tuple(out_ids, out_rows);
}

// ids: [samples, slots]; bag_offsets: the bags' first slots and the end (kernels::pool_bags).
void check_bags(const char* what, const Array<int64_t>& ids, const Array<int64_t>& bag_offsets) {
  const int64_t slots = ids.ndim() == 2 ? ids.shape(1) : -1;
  const int64_t* o = bag_offsets.data();
  const int64_t bags = bag_offsets.size() - 1;
  bool ok = slots >= 0 && bags >= 1 && o[0] == 0 && o[bags] == slots;
  for (int64_t k = 0; ok && k < bags; ++k) ok = o[k] <= o[k + 1];
  if (!ok)
    throw std::invalid_argument(std::string(what) + ": ids must be [samples, slots] and bag_offsets ascend from 0 "
                                "to the slot count");
}

py::object pool_bags(Array<float> table, Array<int64_t> ids, Array<int64_t> bag_offsets, bool mean, Array<float> out) {
  if (table.ndim() != 2) throw std::invalid_argument("pool_bags: table must be 2-D");
  check_bags("pool_bags", ids, bag_offsets);
  const int64_t rows = table.shape(0), width = table.shape(1), n = ids.shape(0), bags = bag_offsets.size() - 1;
  if (out.size() != n * bags * width) throw std::invalid_argument("pool_bags: out must be [samples, bags, width]");
  int64_t bad;
  {
    py::gil_scoped_release nogil;
    bad = hetu::kernels::pool_bags(table.data(), rows, width, ids.data(), n, ids.shape(1), bag_offsets.data(), bags,
                                   mean, mutable_data(out, "out"));
  }
  if (bad >= 0) return py::make_tuple(bad, ids.data()[bad]);
  return py::none();
}

py::tuple bag_gradient(Array<int64_t> ids, Array<int64_t> bag_offsets, bool mean, Array<float> grads) {
  check_bags("bag_gradient", ids, bag_offsets);
  const int64_t n = ids.shape(0), bags = bag_offsets.size() - 1;
  if (grads.ndim() != 3 || grads.shape(0) != n || grads.shape(1) != bags)
    throw std::invalid_argument("bag_gradient: grads must be [samples, bags, width]");
  const int64_t width = grads.shape(2);
  std::vector<int64_t> uniq;
  std::vector<float> summed;
  {
    py::gil_scoped_release nogil;
    hetu::kernels::bag_gradient(ids.data(), n, ids.shape(1), bag_offsets.data(), bags, mean, grads.data(), width,
                                &uniq, &summed);
  }
  return ids_and_rows(uniq, summed, width);
}

py::tuple unique_sum(Array<int64_t> ids, Array<float> grads) {
  const int64_t n = ids.size();
  if (n == 0) return py::make_tuple(Array<int64_t>(0), Array<float>(std::vector<py::ssize_t>{0, grads.ndim() == 2 ? grads.shape(1) : 0}));
  const int64_t width = grads.size() / n;
  if (grads.size() != n * width) throw std::invalid_argument("unique_sum: grads rows do not match ids");
  std::vector<int64_t> uniq;
  std::vector<float> summed;
  {
    py::gil_scoped_release nogil;
    hetu::kernels::unique_sum(ids.data(), grads.data(), n, width, &uniq, &summed);
  }
  return ids_and_rows(uniq, summed, width);
}

void apply_rows(const Config& cfg, float lr, Array<float> table, Array<float> state, Array<int64_t> steps,
                Array<int64_t> rows, Array<float> grads) {
  if (table.ndim() != 2) throw std::invalid_argument("apply_rows: table must be 2-D");
  const int64_t num_rows = table.shape(0), width = table.shape(1), n = rows.size();
  if (grads.size() != n * width) throw std::invalid_argument("apply_rows: grads do not match rows x width");
  if (state.size() != num_rows * hetu::optim::state_width(cfg.kind, width))
    throw std::invalid_argument("apply_rows: state has the wrong size for this optimizer");
  if (steps.size() != num_rows) throw std::invalid_argument("apply_rows: steps must have one entry per row");
  const int64_t* r = rows.data();
  for (int64_t i = 0; i < n; ++i)
    if (r[i] < 0 || r[i] >= num_rows) throw std::out_of_range("apply_rows: row " + std::to_string(r[i]) + " outside table of " + std::to_string(num_rows) + " rows");
  float* t = mutable_data(table, "table");
  float* s = mutable_data(state, "state");
  int64_t* st = mutable_data(steps, "steps");
  py::gil_scoped_release nogil;
  hetu::kernels::apply_rows(cfg, lr, t, s, st, width, r, grads.data(), n);
}

void apply_dense(const Config& cfg, float lr, Array<float> w, Array<float> state, Array<int64_t> step,
                 Array<float> grad) {
  const int64_t size = w.size();
  if (grad.size() != size) throw std::invalid_argument("apply_dense: gradient size differs from parameter");
  if (hetu::optim::rowwise(cfg.kind))
    throw std::invalid_argument("apply_dense: a row-wise optimizer steps embedding rows; a dense tensor takes its "
                                "element-wise dense rule (Optimizer.dense_config)");
  if (state.size() != hetu::optim::state_width(cfg.kind, size))
    throw std::invalid_argument("apply_dense: state has the wrong size for this optimizer");
  if (step.size() != 1) throw std::invalid_argument("apply_dense: step must hold one count");
  float* wp = mutable_data(w, "parameter");
  float* sp = mutable_data(state, "state");
  int64_t* tp = mutable_data(step, "step");
  py::gil_scoped_release nogil;
  hetu::kernels::apply_dense(cfg, lr, wp, sp, tp, grad.data(), size);
}

void init_fill(int kind, double a, double b, uint64_t seed, uint64_t stream, int64_t row_begin,
               Array<float> out) {
  const int64_t rows = out.ndim() >= 1 ? out.shape(0) : 1;
  const int64_t width = rows ? out.size() / rows : 0;
  float* o = mutable_data(out, "out");
  py::gil_scoped_release nogil;
  hetu::kernels::init_fill(kind, a, b, seed, stream, row_begin, row_begin + rows, width, o);
}

template <typename T>
Array<T> to_array(const std::vector<T>& v) {
  Array<T> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

template <typename T>
Array<bool> to_bool_array(const std::vector<T>& v) {
  Array<bool> out(static_cast<py::ssize_t>(v.size()));
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

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

py::tuple policy_access(hetu::cache::CachePolicy& p, Array<int64_t> keys) {
  hetu::cache::AccessResult r;
  {
    py::gil_scoped_release nogil;
    r = p.Access(keys.data(), keys.size());
  }
  return py::make_tuple(to_array(r.slot), to_bool_array(r.hit), to_array(r.evicted_keys), to_array(r.evicted_slots));
}

Array<int64_t> policy_slots(const hetu::cache::CachePolicy& p, Array<int64_t> keys) {
  Array<int64_t> out(keys.size());
  int64_t* o = out.mutable_data();
  const int64_t* k = keys.data();
  const py::ssize_t n = keys.size();
  // Every row of a step is looked up: let the loader threads run meanwhile.
  py::gil_scoped_release nogil;
  for (py::ssize_t i = 0; i < n; ++i) o[i] = p.SlotOf(k[i]);
  return out;
}

using hetu::cache::RowCache;

Array<float> to_rows(const std::vector<float>& v, int64_t width) {
  Array<float> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(v.size() / width), static_cast<py::ssize_t>(width)});
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

py::tuple push_rows(const hetu::cache::PushRows& p, int64_t width) {
  return py::make_tuple(to_array(p.keys), to_rows(p.grads, width), to_array(p.counts));
}

void check_rows(const Array<float>& rows, int64_t n, int64_t width, const char* what) {
  if (rows.size() != n * width)
    throw std::invalid_argument(std::string(what) + ": expected " + std::to_string(n) + " rows of " +
                                std::to_string(width) + " floats, got " + std::to_string(rows.size()) + " floats");
}

py::tuple row_cache_prepare(RowCache& c, Array<int64_t> keys) {
  hetu::cache::Prepared p;
  {
    py::gil_scoped_release nogil;
    p = c.Prepare(keys.data(), keys.size());
  }
  return py::make_tuple(to_bool_array(p.hit), to_array(p.local_version),
                        push_rows(p.evicted, c.width()), p.evictions);
}

Array<float> row_cache_fill(RowCache& c, Array<int64_t> keys, Array<int64_t> pos, Array<float> rows,
                            Array<int64_t> versions, std::optional<Array<float>> state,
                            std::optional<Array<int64_t>> steps) {
  const int64_t n = keys.size(), m = pos.size();
  check_rows(rows, m, c.width(), "RowCache.fill");
  if (versions.size() != m) throw std::invalid_argument("RowCache.fill: one version per returned row");
  if (state.has_value() != steps.has_value())
    throw std::invalid_argument("RowCache.fill: optimizer state and steps come together");
  if (state) {
    check_rows(*state, m, c.state_width(), "RowCache.fill (optimizer state)");
    if (steps->size() != m) throw std::invalid_argument("RowCache.fill: one step count per returned row");
  }
  Array<float> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(c.width())});
  int64_t missing;
  {
    float* o = out.mutable_data();
    py::gil_scoped_release nogil;
    missing = c.Fill(keys.data(), n, pos.data(), rows.data(), versions.data(), state ? state->data() : nullptr,
                     steps ? steps->data() : nullptr, m, o);
  }
  if (missing >= 0)
    throw std::runtime_error("RowCache.fill: row " + std::to_string(keys.data()[missing]) +
                             " was neither returned by the pull nor valid in the cache");
  return out;
}

using hetu::herald::PlanCache;

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

PYBIND11_MODULE(_C, m) {
  m.doc() = "hetu CPU kernels";

  py::class_<Config>(m, "OptimConfig")
      .def(py::init<>())
      .def_readwrite("kind", &Config::kind)
      .def_readwrite("momentum", &Config::momentum)
      .def_readwrite("beta1", &Config::beta1)
      .def_readwrite("beta2", &Config::beta2)
      .def_readwrite("eps", &Config::eps)
      .def_readwrite("l2reg", &Config::l2reg)
      .def_readwrite("weight_decay", &Config::weight_decay);
  m.def("optim_state_width", &hetu::optim::state_width, "floats of optimizer state beside a row of `width` floats",
        py::arg("kind"), py::arg("width"));

  m.def("gather_rows", &gather_rows, "out[i] = table[ids[i]]; returns None or (position, id) of a bad id");
  m.def("pool_bags", &pool_bags, py::arg("table"), py::arg("ids"), py::arg("bag_offsets"), py::arg("mean"),
        py::arg("out"), "out[s, k] = sum (mean) of table rows of bag k of sample s (-1: empty slot); None or "
        "(position, id) of a bad id");
  m.def("bag_gradient", &bag_gradient, py::arg("ids"), py::arg("bag_offsets"), py::arg("mean"), py::arg("grads"),
        "(distinct ids ascending, rows): pool_bags' sparse gradient summed per id");
  m.def("unique_sum", &unique_sum, "sorted unique ids and the summed rows of each");
  m.def("apply_rows", &apply_rows, "one optimizer step of the given unique rows of a table");
  m.def("apply_dense", &apply_dense, "one optimizer step of a dense tensor");
  m.def("init_fill", &init_fill, "rows [row_begin, row_begin + len(out)) of a counter-based initializer");
  m.def("name_stream", [](const std::string& s) { return hetu::rng::name_stream(s.c_str()); });
  m.def("num_threads", &hetu::num_threads);

  using hetu::cache::CachePolicy;
  py::class_<CachePolicy>(m, "CachePolicy", "which rows a cache holds (LRU, LFU, LFU-opt); no values")
      .def(py::init([](const std::string& kind, int64_t capacity, int64_t pin_threshold) {
             return new CachePolicy(hetu::cache::ParsePolicy(kind), capacity, pin_threshold);
           }),
           py::arg("kind"), py::arg("capacity"), py::arg("pin_threshold") = 8)
      .def("access", &policy_access,
           "one iteration's distinct ascending keys -> (slots (-1: bypass), hit, evicted_keys, evicted_slots)")
      .def("slots", &policy_slots, "slot of each key, -1 where absent")
      .def("erase", [](CachePolicy& p, Array<int64_t> keys) {
        for (py::ssize_t i = 0; i < keys.size(); ++i) p.Erase(keys.data()[i]);
      })
      .def("keys", [](const CachePolicy& p) { return to_array(p.Keys()); })
      .def_property_readonly("size", &CachePolicy::size)
      .def_property_readonly("capacity", &CachePolicy::capacity);

  py::class_<RowCache>(m, "RowCache",
                       "a worker's cached embedding rows: policy, values, versions, pending updates, "
                       "optimizer state; every method is one batch and thread-safe")
      .def(py::init([](const std::string& policy, int64_t capacity, int64_t width, int64_t bound,
                       const Config& optimizer, int64_t pin_threshold) {
             return new RowCache(hetu::cache::ParsePolicy(policy), capacity, width, bound, optimizer, pin_threshold);
           }),
           py::arg("policy"), py::arg("capacity"), py::arg("width"), py::arg("bound"), py::arg("optimizer"),
           py::arg("pin_threshold") = 8)
      .def("prepare", &row_cache_prepare,
           "one step's distinct ascending keys -> (hit, local_version, (evicted keys, grads, counts), evictions)")
      .def("fill", &row_cache_fill, py::arg("keys"), py::arg("pos"), py::arg("rows"), py::arg("versions"),
           py::arg("state") = py::none(), py::arg("steps") = py::none(),
           "keys, pos, rows, versions (and optimizer state, steps) of a versioned pull -> every key's row "
           "[len(keys), width]")
      .def("step", [](RowCache& c, Array<int64_t> keys, Array<float> summed, float lr) {
             check_rows(summed, keys.size(), c.width(), "RowCache.step");
             hetu::cache::PushRows p;
             {
               py::gil_scoped_release nogil;
               p = c.Step(keys.data(), summed.data(), keys.size(), lr);
             }
             return push_rows(p, c.width());
           },
           "local step of the cached rows -> (keys, grads, counts) due for a push (bound 0: nothing; every "
           "row is pushed as summed)")
      .def("drain", [](RowCache& c) {
             hetu::cache::PushRows p;
             {
               py::gil_scoped_release nogil;
               p = c.Drain();
             }
             return push_rows(p, c.width());
           },
           "every pending update -> (keys, grads, counts), keys ascending")
      .def("keys", [](const RowCache& c) { return to_array(c.Keys()); })
      .def("row", [](const RowCache& c, int64_t key) -> py::object {
             Array<float> values(c.width()), state(c.state_width());
             int64_t version, pending, steps;
             if (!c.Row(key, values.mutable_data(), state.mutable_data(), &steps, &version, &pending))
               return py::none();
             return py::make_tuple(values, version, pending, state, steps);
           },
           "(values, local version, pending updates, optimizer state, steps) of a resident row, or None")
      .def_property_readonly("size", &RowCache::size)
      .def_property_readonly("capacity", &RowCache::capacity)
      .def_property_readonly("width", &RowCache::width)
      .def_property_readonly("bound", &RowCache::bound)
      .def_property_readonly("state_width", &RowCache::state_width);

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
  m.attr("NEVER_VERSION") = hetu::cache::kNeverVersion;

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
           }, "seconds spent per stage over all plans so far: ids (distinct rows, valid masks), scores "
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
      .def("valid_masks", [](const hetu::herald::Planner& p, Array<int64_t> keys) {
             Array<uint64_t> out(keys.size());
             uint64_t* o = out.mutable_data();
             for (py::ssize_t i = 0; i < keys.size(); ++i) o[i] = p.ValidMask(keys.data()[i]);
             return out;
           }, py::arg("keys"), "per key, one bit per worker whose modelled cached copy is valid now");
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

  using hetu::data::ClickLogEncoder;
  auto view = [](const py::bytes& b) {
    char* data;
    py::ssize_t size;
    if (PyBytes_AsStringAndSize(b.ptr(), &data, &size) != 0) throw py::error_already_set();
    return std::string_view(data, static_cast<size_t>(size));
  };
  py::class_<ClickLogEncoder>(m, "ClickLogEncoder",
                              "counts and encodes the plainly clean chunks of a click log (hetu.data.tabular)")
      .def(py::init([](const std::string& delimiter, int num_columns, int label_column, std::vector<int> dense_columns,
                       std::vector<int> categorical_columns) {
             if (delimiter.size() != 1) throw std::invalid_argument("ClickLogEncoder: the delimiter must be one byte");
             hetu::data::ClickLogLayout layout;
             layout.delimiter = delimiter[0];
             layout.num_columns = num_columns;
             layout.label_column = label_column;
             layout.dense_columns = std::move(dense_columns);
             layout.categorical_columns = std::move(categorical_columns);
             return new ClickLogEncoder(std::move(layout));
           }),
           py::arg("delimiter"), py::arg("num_columns"), py::arg("label_column"), py::arg("dense_columns"),
           py::arg("categorical_columns"))
      .def("count_chunk", [view](ClickLogEncoder& e, const py::bytes& text, int64_t max_rows) -> int64_t {
             const std::string_view t = view(text);
             py::gil_scoped_release nogil;
             const std::vector<std::string_view> lines = ClickLogEncoder::Lines(t, max_rows);
             return e.CountChunk(lines) ? static_cast<int64_t>(lines.size()) : -1;
           }, py::arg("text"), py::arg("max_rows"),
           "pass 1: counts the values of the first max_rows lines (all if < 0); how many, or -1 (nothing "
           "counted) if one is not plainly clean")
      .def("count_values", [](ClickLogEncoder& e, int field, const std::vector<std::string>& values) {
             for (const std::string& v : values) e.CountValue(field, v);
           }, py::arg("field"), py::arg("values"), "pass 1 for values the Python parser read")
      .def("build", &ClickLogEncoder::Build, py::arg("min_count"), "builds the vocabularies; the field sizes")
      .def("encode_chunk", [view](const ClickLogEncoder& e, const py::bytes& text, int64_t max_rows,
                                  const std::vector<int64_t>& offsets) -> py::object {
             const std::string_view t = view(text);
             std::vector<std::string_view> lines;
             {
               py::gil_scoped_release nogil;
               lines = ClickLogEncoder::Lines(t, max_rows);
             }
             const auto rows = static_cast<py::ssize_t>(lines.size());
             const auto nd = static_cast<py::ssize_t>(e.layout().dense_columns.size());
             Array<float> labels(rows);
             Array<int64_t> dense(std::vector<py::ssize_t>{rows, nd});
             Array<int64_t> sparse(std::vector<py::ssize_t>{rows, e.num_fields()});
             bool clean;
             {
               float* l = labels.mutable_data();
               int64_t* d = dense.mutable_data();
               int64_t* s = sparse.mutable_data();
               py::gil_scoped_release nogil;
               clean = e.EncodeChunk(lines, offsets, l, d, s);
             }
             if (!clean) return py::none();
             return py::make_tuple(rows, labels, dense, sparse);
           }, py::arg("text"), py::arg("max_rows"), py::arg("offsets"),
           "pass 2: (rows, labels, raw integers, ids + offsets) of the first max_rows lines, or None if one is "
           "not plainly clean")
      .def("encode_values", [](const ClickLogEncoder& e, int field, const std::vector<std::string>& values) {
             Array<int64_t> out(static_cast<py::ssize_t>(values.size()));
             int64_t* o = out.mutable_data();
             for (size_t i = 0; i < values.size(); ++i) o[i] = e.Id(field, values[i]);
             return out;
           }, py::arg("field"), py::arg("values"), "pass 2 for values the Python parser read: local ids");
}
