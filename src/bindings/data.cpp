// hetu._C's click-log encoder (hetu.data.tabular's native path).
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "data/click_log.h"

namespace hetu {
namespace bindings {

void bind_data(py::module_& m) {
  using hetu::data::ClickLogEncoder;
  auto view = [](const py::bytes& b) {
    char* data;
    py::ssize_t size;
    if (PyBytes_AsStringAndSize(b.ptr(), &data, &size) != 0) throw py::error_already_set();
    return std::string_view(data, static_cast<size_t>(size));
  };
  // How many of the first max_rows lines take(lines) took, or -1 when it refused them.
  auto taken = [view](const py::bytes& text, int64_t max_rows, auto take) -> int64_t {
    const std::string_view t = view(text);
    py::gil_scoped_release nogil;
    const std::vector<std::string_view> lines = ClickLogEncoder::Lines(t, max_rows);
    return take(lines) ? static_cast<int64_t>(lines.size()) : -1;
  };
  // (rows, labels, raw integers, ids) of the first max_rows lines by fill(lines, labels, dense, sparse), or None
  // when a line is not plainly clean.
  auto encode = [view](const ClickLogEncoder& e, const py::bytes& text, int64_t max_rows, auto fill) -> py::object {
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
      clean = fill(lines, l, d, s);
    }
    if (!clean) return py::none();
    return py::make_tuple(rows, labels, dense, sparse);
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
      .def("count_chunk", [taken](ClickLogEncoder& e, const py::bytes& text, int64_t max_rows) {
             return taken(text, max_rows,
                          [&](const std::vector<std::string_view>& lines) { return e.CountChunk(lines); });
           }, py::arg("text"), py::arg("max_rows"),
           "pass 1: counts the values of the first max_rows lines (all if < 0); how many, or -1 (nothing "
           "counted) if one is not plainly clean")
      .def("check_chunk", [taken](const ClickLogEncoder& e, const py::bytes& text, int64_t max_rows) {
             return taken(text, max_rows,
                          [&](const std::vector<std::string_view>& lines) { return e.CheckChunk(lines); });
           }, py::arg("text"), py::arg("max_rows"),
           "hashed ids' first pass: how many of the first max_rows lines (all if < 0), or -1 if one is not "
           "plainly clean")
      .def("count_values", [](ClickLogEncoder& e, int field, const std::vector<std::string>& values) {
             for (const std::string& v : values) e.CountValue(field, v);
           }, py::arg("field"), py::arg("values"), "pass 1 for values the Python parser read")
      .def("build", &ClickLogEncoder::Build, py::arg("min_count"), "builds the vocabularies; the field sizes")
      .def("encode_chunk", [encode](const ClickLogEncoder& e, const py::bytes& text, int64_t max_rows,
                                    const std::vector<int64_t>& offsets) {
             return encode(e, text, max_rows, [&](const std::vector<std::string_view>& lines, float* l, int64_t* d,
                                                  int64_t* s) { return e.EncodeChunk(lines, offsets, l, d, s); });
           }, py::arg("text"), py::arg("max_rows"), py::arg("offsets"),
           "pass 2: (rows, labels, raw integers, ids + offsets) of the first max_rows lines, or None if one is "
           "not plainly clean")
      .def("hash_chunk", [encode](const ClickLogEncoder& e, const py::bytes& text, int64_t max_rows) {
             return encode(e, text, max_rows, [&](const std::vector<std::string_view>& lines, float* l, int64_t* d,
                                                  int64_t* s) { return e.HashChunk(lines, l, d, s); });
           }, py::arg("text"), py::arg("max_rows"),
           "hashed ids, one pass: (rows, labels, raw integers, keys) of the first max_rows lines, or None if one "
           "is not plainly clean")
      .def("encode_values", [](const ClickLogEncoder& e, int field, const std::vector<std::string>& values) {
             Array<int64_t> out(static_cast<py::ssize_t>(values.size()));
             int64_t* o = out.mutable_data();
             for (size_t i = 0; i < values.size(); ++i) o[i] = e.Id(field, values[i]);
             return out;
           }, py::arg("field"), py::arg("values"), "pass 2 for values the Python parser read: local ids")
      .def("values", [](const ClickLogEncoder& e, int field) {
             py::list out;
             for (std::string_view v : e.Values(field)) out.append(py::bytes(v.data(), v.size()));
             return out;
           }, py::arg("field"), "after build: a field's kept values (bytes) in local id order, id 1 first");
}

}  // namespace bindings
}  // namespace hetu
