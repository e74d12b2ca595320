// hetu._ps: the parameter server for Python. py_face.h says what it is made of; each data
// operation adds its own methods (kv.h, ops/*.cc).
#include "common/optim_rules.h"
#include "common/rng.h"
#include "py_face.h"
#include "step_loop.h"

namespace ps {
void RegisterRawBench(py::module_& m);
}

using namespace ps;

namespace {

// The servers' step loop and the names and sizes hetu's optimizers and initializers share.
void BindMisc(py::module_& m) {
  m.def("name_stream", [](const std::string& s) { return hetu::rng::name_stream(s.c_str()); });
  m.def("optim_state_width", &hetu::optim::state_width, py::arg("kind"), py::arg("width"));
  m.def(
      "simd_variants",
      [] {
        std::vector<std::pair<std::string, bool>> out;
        for (const auto& v : SimdVariants()) out.emplace_back(v, SimdRunnable(v));
        return out;
      },
      "The versions of the servers' step loop, best first, each with whether this CPU can run it.");
  m.def("simd_variant", &SimdVariant, "The version the servers run: HETU_SIMD, or the best this CPU can run.");
  m.def(
      "step_rows_with",
      [](const std::string& variant, int optim_kind, float momentum, float beta1, float beta2, float eps, float l2reg,
         float weight_decay, float lr, Arr<float> values, Arr<float> state, Arr<int64_t> steps, Arr<int64_t> versions,
         Arr<int64_t> keys, Arr<float> grads) {
        // The server's step of its rows, by a named version (tests/test_simd.py); arrays in place.
        hetu::optim::Config cfg;
        cfg.kind = optim_kind;
        cfg.momentum = momentum;
        cfg.beta1 = beta1;
        cfg.beta2 = beta2;
        cfg.eps = eps;
        cfg.l2reg = l2reg;
        cfg.weight_decay = weight_decay;
        const int64_t rows = steps.size(), width = rows ? values.size() / rows : 0;
        const int64_t state_width = hetu::optim::state_width(optim_kind, width);
        CheckSize("step_rows_with", "values", values.size(), rows * width);
        CheckSize("step_rows_with", "state", state.size(), rows * state_width);
        CheckSize("step_rows_with", "versions", versions.size(), rows);
        CheckSize("step_rows_with", "grads", grads.size(), keys.size() * width);
        for (int64_t i = 0; i < keys.size(); ++i)
          if (keys.data()[i] < 0 || keys.data()[i] >= rows || (i && keys.data()[i] <= keys.data()[i - 1]))
            throw py::value_error("step_rows_with: keys must be distinct rows in increasing order");
        const StepLoopFn step = StepLoopOf(variant);
        UnitCounters counters;
        counters.Reset(rows);
        for (int64_t r = 0; r < rows; ++r) counters.Load(r, steps.data()[r], versions.data()[r]);
        counters.Rebound();
        counters.Reserve(1, 1);
        const StepRowsView view{values.mutable_data(), hetu::storage::kF32, state.mutable_data(), &counters,
                                ps::SlotIndex{}, width, state_width};
        step(cfg, lr, view, keys.data(), 0, keys.size(), grads.data(), nullptr);
        for (int64_t r = 0; r < rows; ++r) {
          steps.mutable_data()[r] = counters.step(r);
          versions.mutable_data()[r] = counters.version(r);
        }
      });
}

}  // namespace

PYBIND11_MODULE(_ps, m) {
  m.doc() = "hetu parameter server (ps-lite): node life cycle and worker table operations";
  BindNode(m);
  BindMisc(m);
  ps::RegisterRawBench(m);

  py::class_<Handle>(m, "Handle", "An operation in flight. wait(timeout=None) returns its result or raises.")
      .def("wait", &Handle::wait, py::arg("timeout") = py::none(),
           "Blocks (GIL released) until every server answered; returns the result. Raises RuntimeError naming "
           "the table, the key or the peer on error, timeout (default PS_WAIT_TIMEOUT, 600 s) or a dead node.")
      .def("done", &Handle::done);

  py::class_<RemoteTable> table(m, "Table",
                                "A table on the servers as a worker names it. Every operation takes keywords and "
                                "returns a Handle; keys are int64, values float32; iteration -1: no synchronisation.");
  table
      .def(py::init<const std::string&, int64_t, int64_t, bool, int64_t, const std::string&>(), py::kw_only(),
           py::arg("name"), py::arg("rows"), py::arg("width"), py::arg("dense") = false, py::arg("state_width") = 0,
           py::arg("storage") = "fp32",
           "storage: the type its rows are stored and moved in (fp32, bf16, fp16); they come and go as float32")
      .def_property_readonly(
          "row_bytes", [](const RemoteTable& t) { return t.ref().row_bytes(); },
          "bytes of a row as the servers store and send it");
  PyFace face{m, table};
  ForEachOp([&](const OpDef& op) {
    if (op.bind) op.bind(face);
  });
}
