// hetu._ps.Table as a worker holds it: a table's name and shape, and the checks and conversions
// of its operations' arrays. The operations themselves are added by their files (ops/*.cc).
#include "common/storage.h"
#include "py_face.h"

namespace ps {

void CheckSize(const std::string& table, const char* what, py::ssize_t got, int64_t want) {
  if (got != want)
    throw py::value_error("table '" + table + "': " + what + " has " + std::to_string(got) + " elements, expected " +
                          std::to_string(want));
}

RemoteTable::RemoteTable(const std::string& name, int64_t rows, int64_t width, bool dense, int64_t state_width,
                         const std::string& storage) {
  t_.name = name;
  t_.rows = rows;
  t_.width = width;
  t_.dense = dense;
  t_.state_width = state_width;
  t_.storage = hetu::storage::parse(storage);
  if (t_.storage < 0) throw py::value_error("table '" + name + "': storage '" + storage + "': expected fp32, bf16 or fp16");
  if (dense && t_.storage != hetu::storage::kF32)
    throw py::value_error("table '" + name + "': a dense tensor is stored as fp32, not " + storage);
}

py::array RemoteTable::Stored(const Arr<float>& values) const {
  if (t_.storage == hetu::storage::kF32) return values;
  py::array_t<uint16_t> out(values.size());
  hetu::storage::narrow_row(t_.storage, values.data(), out.mutable_data(), values.size());
  return out;
}

int64_t RemoteTable::Keys(const std::optional<Arr<int64_t>>& keys) const {
  if (t_.dense) return 0;
  if (!keys) throw py::value_error("table '" + t_.name + "': keys= is needed for an embedding table");
  return keys->size();
}

}  // namespace ps
