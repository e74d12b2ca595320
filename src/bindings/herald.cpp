// hetu._C's Herald scheduler (the rest in herald_planner.cpp and herald_plan_link.cpp, herald.h):
// bind_herald, a worker's cache under the plan (PlanCache) and the allocators as functions.
#include <string>
#include <vector>

#include "bindings/herald.h"
#include "cache/policy.h"
#include "common/optim_rules.h"
#include "herald/allocate.h"
#include "herald/plan_cache.h"

namespace hetu {
namespace bindings {

namespace {

using hetu::herald::PlanCache;
using hetu::optim::Config;

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
                           Array<float> state, Array<int64_t> steps, int64_t catch_up_to) {
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
                    reinterpret_cast<const uint8_t*>(pull.data()), v, s, st, &served, &evictions, catch_up_to);
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
  bind_plan_cache(m);
  bind_allocators(m);
  bind_planner(m);
  bind_prepared_batch(m);
  bind_batch_preparer(m);
  bind_plan_timeout(m);
  bind_plan_followers(m);
  bind_plan_listener(m);
  bind_planning_thread(m);
  bind_plan_receiver(m);
}

// PlanCache: a worker's cached rows under the plan (src/herald/plan_cache.h).
void bind_plan_cache(py::module_& m) {
  py::class_<PlanCache>(m, "PlanCache",
                        "a worker's cached embedding rows under Herald's plan: policy, values, optimizer state, "
                        "valid and dirty flags (src/herald/plan_cache.h); the training thread's only")
      .def(py::init([](const std::string& policy, int64_t capacity, int64_t width, const Config& optimizer,
                       int64_t pin_threshold) {
             return new PlanCache(hetu::cache::ParsePolicy(policy), capacity, width, optimizer, pin_threshold);
           }),
           py::arg("policy"), py::arg("capacity"), py::arg("width"), py::arg("optimizer"), py::arg("pin_threshold") = 8)
      .def("begin", &plan_cache_begin, py::arg("keys"), py::arg("hit"), py::arg("pull"), py::arg("vals"),
           py::arg("state"), py::arg("steps"), py::arg("catch_up_to") = 0,
           "the step's keys through the policy, checked against the plan's hits and pulls; the valid cached rows "
           "(a catch-up optimizer's brought to step catch_up_to) written to vals/state/steps; returns (error or '', "
           "rows served from the cache, evictions)")
      .def("finish", &plan_cache_finish, py::arg("keys"), py::arg("owner"), py::arg("summed"), py::arg("lr"),
           py::arg("vals"), py::arg("state"), py::arg("steps"), py::arg("invalidate"), py::arg("writeback"),
           "owner rows stepped and kept, shared copies dropped, invalidations; returns (error or '', the planned "
           "write-back as (keys, values, state, steps))")
      .def("forget", [](PlanCache& c, Array<int64_t> keys) { c.Forget(keys.data(), keys.size()); }, py::arg("keys"),
           "the cached copies of `keys` dropped, neither valid nor dirty, still resident (Planner.forget), "
           "between steps")
      .def("drain", [](PlanCache& c) { return rows_out(c.Drain(), c); },
           "every dirty row as (keys, values, state, steps), now clean")
      .def_property_readonly("width", &PlanCache::width)
      .def_property_readonly("state_width", &PlanCache::state_width)
      .def_property_readonly("capacity", &PlanCache::capacity);
}

// greedy_allocate, colocate_allocate and estimated_rows: the allocators on one global batch
// (src/herald/allocate.h).
void bind_allocators(py::module_& m) {
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
}

}  // namespace bindings
}  // namespace hetu
