// hetu._C's sequence-model sampling: counter-based negatives (kernels/sample_ids.h), drawn with
// the GIL released.
#include <string>

#include "bindings/bindings.h"
#include "kernels/sample_ids.h"

namespace hetu {
namespace bindings {

namespace {

// samples [n], targets [n, length] -> [n, length, num_negatives].
Array<int64_t> draw_negatives(uint64_t seed, uint64_t step, Array<int64_t> samples, Array<int64_t> targets,
                              int64_t num_negatives, int64_t num_items, int threads) {
  if (targets.ndim() != 2) throw std::invalid_argument("draw_negatives: targets must be [samples, positions]");
  const int64_t n = targets.shape(0), length = targets.shape(1);
  if (samples.ndim() != 1 || samples.shape(0) != n)
    throw std::invalid_argument("draw_negatives: sample_index must hold one row index per sample (" +
                                std::to_string(n) + "), got " + std::to_string(samples.size()));
  if (num_negatives < 0) throw std::invalid_argument("draw_negatives: num_negatives must be at least 0");
  if (num_items < 1) throw std::invalid_argument("draw_negatives: num_items must be at least 1");
  if (threads < 0) throw std::invalid_argument("draw_negatives: threads must be 0 (the process's) or more");
  Array<int64_t> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(n), static_cast<py::ssize_t>(length),
                                              static_cast<py::ssize_t>(num_negatives)});
  int64_t* o = out.mutable_data();
  {
    py::gil_scoped_release nogil;
    hetu::kernels::draw_negatives(seed, step, samples.data(), targets.data(), n, length, num_negatives, num_items, o,
                                  threads);
  }
  return out;
}

}  // namespace

void bind_sample_ids(py::module_& m) {
  m.def("draw_negatives", &draw_negatives, py::arg("seed"), py::arg("step"), py::arg("samples"), py::arg("targets"),
        py::arg("num_negatives"), py::arg("num_items"), py::arg("threads") = 0,
        "[n, L, N] uniform items in [0, num_items), each a function of (seed, step, samples[k], p, j) only "
        "(kernels/sample_ids.h); -1 where targets[k, p] == -1. threads: 0 the process's pool, else a pool of that "
        "many (the same numbers)");
}

}  // namespace bindings
}  // namespace hetu
