// What hetu._C's binding files share: NumPy conversions, and each area's bind_* (called by
// module.cpp). Every binding file includes this header, so all of them see the same type casters
// (pybind11/stl.h included everywhere or nowhere).
#pragma once
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hetu {
namespace bindings {

namespace py = pybind11;

// Arrays come in as C-contiguous NumPy arrays.
template <typename T>
using Array = py::array_t<T, py::array::c_style>;

template <typename T>
T* mutable_data(Array<T>& a, const char* what) {
  if (!a.writeable()) throw std::invalid_argument(std::string(what) + " must be writeable");
  return a.mutable_data();
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

// rows [size / width, width] of a vector of floats.
inline Array<float> to_rows(const std::vector<float>& v, int64_t width) {
  Array<float> out(std::vector<py::ssize_t>{static_cast<py::ssize_t>(v.size() / width), static_cast<py::ssize_t>(width)});
  std::copy(v.begin(), v.end(), out.mutable_data());
  return out;
}

inline void check_rows(const Array<float>& rows, int64_t n, int64_t width, const char* what) {
  if (rows.size() != n * width)
    throw std::invalid_argument(std::string(what) + ": expected " + std::to_string(n) + " rows of " +
                                std::to_string(width) + " floats, got " + std::to_string(rows.size()) + " floats");
}

// Each area's classes and functions, added to the module in this order.
void bind_optim(py::module_& m);
void bind_kernels(py::module_& m);
void bind_cache(py::module_& m);
void bind_herald(py::module_& m);
void bind_data(py::module_& m);
void bind_key_hash(py::module_& m);
void bind_dynamic(py::module_& m);
void bind_stream(py::module_& m);
void bind_sample_ids(py::module_& m);
void bind_candidate_logits(py::module_& m);

}  // namespace bindings
}  // namespace hetu
