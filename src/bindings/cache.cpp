// hetu._C's HET cache: the replacement policy alone (CachePolicy) and a worker's cached rows
// (RowCache).
#include <optional>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "cache/policy.h"
#include "cache/row_cache.h"
#include "common/optim_rules.h"

namespace hetu {
namespace bindings {

namespace {

using hetu::cache::RowCache;
using hetu::optim::Config;

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

py::tuple push_rows(const hetu::cache::PushRows& p, int64_t width) {
  return py::make_tuple(to_array(p.keys), to_rows(p.grads, width), to_array(p.counts));
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
                            std::optional<Array<int64_t>> steps, int64_t catch_up_to) {
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
                     steps ? steps->data() : nullptr, m, o, catch_up_to);
  }
  if (missing >= 0)
    throw std::runtime_error("RowCache.fill: row " + std::to_string(keys.data()[missing]) +
                             " was neither returned by the pull nor valid in the cache");
  return out;
}

}  // namespace

void bind_cache(py::module_& m) {
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
           py::arg("state") = py::none(), py::arg("steps") = py::none(), py::arg("catch_up_to") = 0,
           "keys, pos, rows, versions (and optimizer state, steps) of a versioned pull -> every key's row "
           "[len(keys), width]; a catch-up optimizer's cached rows brought to step catch_up_to first")
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
  m.attr("NEVER_VERSION") = hetu::cache::kNeverVersion;
}

}  // namespace bindings
}  // namespace hetu
