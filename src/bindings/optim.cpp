// hetu._C's optimizer registry (common/optim_rules.h): the kinds, their hyperparameters and
// defaults, and the Config a step takes. Python reads the kinds from here and nowhere else.
#include <charconv>
#include <string>

#include "bindings/bindings.h"
#include "common/optim_rules.h"

namespace hetu {
namespace bindings {

namespace {

using hetu::optim::Config;

// A float32 default as the shortest decimal that reads back to it: 0.9, not 0.8999999761581421.
py::float_ declared(float v) {
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof(buf), v).ptr;
  return py::float_(py::str(std::string(buf, end)));
}

py::list optimizer_kinds() {
  py::list kinds;
  for (const auto& k : hetu::optim::kKinds) {
    py::dict hyperparameters;
    for (const auto& h : hetu::optim::kHyperparameters)
      for (const auto& s : k.settings)
        if (s.member == h.member) hyperparameters[h.name] = declared(s.value);
    kinds.append(py::dict(py::arg("name") = k.name, py::arg("kind") = static_cast<int>(k.kind),
                          py::arg("dense_kind") = static_cast<int>(k.dense_kind),
                          py::arg("rowwise") = hetu::optim::rowwise(k.kind),
                          py::arg("catches_up") = hetu::optim::catches_up(k.kind),
                          py::arg("hyperparameters") = hyperparameters));
  }
  return kinds;
}

py::dict optimizer_hyperparameters() {
  const Config defaults;
  py::dict out;
  for (const auto& h : hetu::optim::kHyperparameters) out[h.name] = declared(defaults.*h.member);
  return out;
}

std::string config_repr(const Config& c) {
  std::string s = "OptimConfig(kind=" + std::to_string(c.kind);
  for (const auto& h : hetu::optim::kHyperparameters)
    s += std::string(", ") + h.name + "=" + py::str(declared(c.*h.member)).cast<std::string>();
  return s + ", storage=" + std::to_string(c.storage) + ")";
}

}  // namespace

void bind_optim(py::module_& m) {
  py::class_<Config> config(m, "OptimConfig");
  config.def(py::init<>())
      .def_readwrite("kind", &Config::kind)
      .def_readwrite("storage", &Config::storage, "the rows' storage type: 0 fp32, 1 bf16, 2 fp16")
      .def("__repr__", &config_repr);
  for (const auto& h : hetu::optim::kHyperparameters) config.def_readwrite(h.name, h.member);
  m.def("optimizer_kinds", &optimizer_kinds,
        "the optimizer kinds in Kind order: [{name, kind, dense_kind, rowwise, catches_up, hyperparameters: "
        "{name: default}}] (a row-wise kind steps embedding rows; dense tensors take its dense_kind; a catch-up "
        "kind's rows take the steps they skipped when next read)");
  m.def("optimizer_hyperparameters", &optimizer_hyperparameters,
        "every hyperparameter of OptimConfig with OptimConfig's default, in declaration order");
  m.def("optim_state_width", &hetu::optim::state_width, "floats of optimizer state beside a row of `width` floats",
        py::arg("kind"), py::arg("width"));
}

}  // namespace bindings
}  // namespace hetu
