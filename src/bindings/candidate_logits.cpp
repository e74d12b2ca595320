// hetu._C's sampled logits over each sample's candidate rows (kernels/candidate_logits.h), with
// the GIL released.
#include <string>

#include "bindings/bindings.h"
#include "kernels/candidate_logits.h"

namespace hetu {
namespace bindings {

namespace {

std::string dims(const py::array& a) {
  std::string s = "[";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + "]";
}

// The shape of user [S, L, d], rows [S, M, d] (candidates: columns first..M) and index [S, L, N],
// checked against each other.
hetu::kernels::CandidateShape shape_of(const char* what, const Array<float>& user, const Array<float>& rows,
                                       int64_t first, const Array<int64_t>& index) {
  if (user.ndim() != 3 || rows.ndim() != 3 || index.ndim() != 3 || rows.shape(0) != user.shape(0) ||
      rows.shape(2) != user.shape(2) || index.shape(0) != user.shape(0) || index.shape(1) != user.shape(1))
    throw std::invalid_argument(std::string(what) + ": takes user [S, L, d], rows [S, M, d] and index [S, L, N], got " +
                                dims(user) + ", " + dims(rows) + " and " + dims(index));
  if (first < 0 || first > rows.shape(1))
    throw std::invalid_argument(std::string(what) + ": first candidate column " + std::to_string(first) +
                                " outside rows " + dims(rows));
  return {user.shape(0), user.shape(1), index.shape(2), rows.shape(1), first, user.shape(2)};
}

void require(const char* what, const char* name, const py::array& a, const std::string& want_dims) {
  if (dims(a) != want_dims)
    throw std::invalid_argument(std::string(what) + ": " + name + " must be " + want_dims + ", got " + dims(a));
}

void candidate_logits(Array<float> user, Array<float> rows, int64_t first, Array<int64_t> index, Array<float> out) {
  const auto shape = shape_of("candidate_logits", user, rows, first, index);
  require("candidate_logits", "out", out, dims(index));
  float* o = mutable_data(out, "out");
  int64_t bad;
  {
    py::gil_scoped_release nogil;
    bad = hetu::kernels::candidate_logits(shape, user.data(), rows.data(), index.data(), o);
  }
  if (bad >= 0)
    throw py::value_error("candidate_logits: index " + std::to_string(index.data()[bad]) + " at flat position " +
                          std::to_string(bad) + " is outside [-1, " + std::to_string(shape.candidates()) + ")");
}

void candidate_logits_grad(Array<float> dlogits, Array<float> user, Array<float> rows, int64_t first,
                           Array<int64_t> index, Array<float> duser, Array<float> drows) {
  const auto shape = shape_of("candidate_logits_grad", user, rows, first, index);
  require("candidate_logits_grad", "dlogits", dlogits, dims(index));
  require("candidate_logits_grad", "duser", duser, dims(user));
  require("candidate_logits_grad", "drows", drows, dims(rows));
  float* du = mutable_data(duser, "duser");
  float* dr = mutable_data(drows, "drows");
  py::gil_scoped_release nogil;
  hetu::kernels::candidate_logits_grad(shape, dlogits.data(), user.data(), rows.data(), index.data(), du, dr);
}

}  // namespace

void bind_candidate_logits(py::module_& m) {
  m.def("candidate_logits", &candidate_logits, py::arg("user"), py::arg("rows"), py::arg("first"), py::arg("index"),
        py::arg("out"),
        "out[s, p, j] = user[s, p] . normalised(rows[s, first + index[s, p, j]]) (0 where index is -1); "
        "ValueError for an index outside [-1, candidates)");
  m.def("candidate_logits_grad", &candidate_logits_grad, py::arg("dlogits"), py::arg("user"), py::arg("rows"),
        py::arg("first"), py::arg("index"), py::arg("duser"), py::arg("drows"),
        "candidate_logits' gradients into duser [S, L, d] and drows' candidate columns (a candidate no position "
        "reads: 0; the columns before `first` untouched)");
}

}  // namespace bindings
}  // namespace hetu
