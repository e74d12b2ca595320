// hetu._C's stream line encoder (src/data/stream_lines.h; hetu.data.stream_formats' native path).
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "data/stream_lines.h"

namespace hetu {
namespace bindings {

namespace {

using hetu::data::StreamColumn;

StreamColumn::Kind column_kind(const std::string& name) {
  static const std::pair<const char*, StreamColumn::Kind> kinds[] = {
      {"ignore", StreamColumn::kIgnore},         {"click_label", StreamColumn::kClickLabel},
      {"threshold_label", StreamColumn::kThresholdLabel}, {"integer", StreamColumn::kInteger},
      {"number", StreamColumn::kNumber},         {"categorical", StreamColumn::kCategorical},
      {"bag", StreamColumn::kBag},               {"id", StreamColumn::kId}};
  for (const auto& [n, kind] : kinds)
    if (name == n) return kind;
  throw std::invalid_argument("StreamLineEncoder: unknown column kind '" + name + "'");
}

// A column from its dict: kind, and whichever of field, output, allow_empty, threshold, low,
// high, separator, slots and side it needs.
StreamColumn to_column(const py::dict& d) {
  StreamColumn c;
  c.kind = column_kind(d["kind"].cast<std::string>());
  auto take = [&d](const char* key, auto* into) {
    if (d.contains(key)) *into = d[key].cast<std::remove_pointer_t<decltype(into)>>();
  };
  take("field", &c.field);
  take("output", &c.output);
  take("allow_empty", &c.allow_empty);
  take("threshold", &c.threshold);
  take("low", &c.low);
  take("high", &c.high);
  take("separator", &c.separator);
  take("slots", &c.slots);
  take("side", &c.side);
  return c;
}

}  // namespace

void bind_stream(py::module_& m) {
  using hetu::data::StreamLineEncoder;
  py::class_<StreamLineEncoder>(m, "StreamLineEncoder",
                                "encodes the plainly clean lines of a delimited log as samples with hashed keys "
                                "(hetu.data.stream_formats)")
      .def(py::init([](const std::string& delimiter, const std::vector<py::dict>& columns, int num_dense,
                       int num_sparse) {
             hetu::data::StreamLayout layout;
             layout.delimiter = delimiter;
             for (const py::dict& d : columns) layout.columns.push_back(to_column(d));
             layout.num_dense = num_dense;
             layout.num_sparse = num_sparse;
             return new StreamLineEncoder(std::move(layout));
           }),
           py::arg("delimiter"), py::arg("columns"), py::arg("num_dense"), py::arg("num_sparse"))
      .def("set_side", [](StreamLineEncoder& e, int side, const Array<int64_t>& raw_ids, const Array<int64_t>& keys,
                          int output) {
             if (keys.ndim() != 2 || keys.shape(0) != raw_ids.size())
               throw std::invalid_argument("set_side: keys must be [len(raw_ids), width]");
             e.SetSide(side, std::vector<int64_t>(raw_ids.data(), raw_ids.data() + raw_ids.size()),
                       std::vector<int64_t>(keys.data(), keys.data() + keys.size()), static_cast<int>(keys.shape(1)),
                       output);
           }, py::arg("side"), py::arg("raw_ids"), py::arg("keys"), py::arg("output"),
           "side table `side`: the keys [ids, width] of each raw id, written from sparse column `output`")
      .def("encode", [](const StreamLineEncoder& e, const py::bytes& text, int64_t start, int64_t max_lines,
                        bool final) {
             char* data;
             py::ssize_t size;
             if (PyBytes_AsStringAndSize(text.ptr(), &data, &size) != 0) throw py::error_already_set();
             const std::string_view t(data, static_cast<size_t>(size));
             int64_t rows;
             {
               py::gil_scoped_release nogil;
               rows = StreamLineEncoder::CountLines(t, start, max_lines, final);
             }
             const auto n = static_cast<py::ssize_t>(rows);
             Array<float> labels(n);
             Array<double> dense(std::vector<py::ssize_t>{n, e.layout().num_dense});
             Array<int64_t> sparse(std::vector<py::ssize_t>{n, e.layout().num_sparse});
             Array<int64_t> ends(n);
             int64_t encoded;
             {
               float* l = labels.mutable_data();
               double* d = dense.mutable_data();
               int64_t* s = sparse.mutable_data();
               int64_t* en = ends.mutable_data();
               py::gil_scoped_release nogil;
               encoded = e.Encode(t, start, max_lines, final, l, d, s, en);
             }
             return py::make_tuple(encoded, labels, dense, sparse, ends);
           }, py::arg("text"), py::arg("start"), py::arg("max_lines"), py::arg("final"),
           "(lines encoded, labels, dense doubles, keys, line ends) of the lines of text[start:], at most max_lines, "
           "up to the first one not plainly clean; the arrays have a row for every line seen, the first `lines "
           "encoded` of them written");
}

}  // namespace bindings
}  // namespace hetu
