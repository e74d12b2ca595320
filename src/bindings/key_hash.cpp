// hetu._C's key hash of hashed datasets (src/common/key_hash.h): for hetu.data's Python readers
// and the tests, so that every key comes from the one C++ definition.
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "common/key_hash.h"

namespace hetu {
namespace bindings {

void bind_key_hash(py::module_& m) {
  m.attr("KEY_HASH_NAME") = kKeyHashName;
  m.def("key_hash", [](uint32_t field, const std::string& value) { return KeyHash(field, value); },
        py::arg("field"), py::arg("value"),
        "the int64 key of one value (bytes, or str as UTF-8) of field `field`: XXH64, seed 0, of the field as 4 "
        "little-endian bytes then the value's bytes; -1 becomes -2");
  m.def("key_hash_values", [](uint32_t field, const std::vector<std::string>& values) {
          Array<int64_t> out(static_cast<py::ssize_t>(values.size()));
          int64_t* o = out.mutable_data();
          for (size_t i = 0; i < values.size(); ++i) o[i] = KeyHash(field, values[i]);
          return out;
        }, py::arg("field"), py::arg("values"), "key_hash of each value (bytes, or str as UTF-8)");
  m.def("key_hash_ids", [](uint32_t field, const Array<int64_t>& ids) {
          Array<int64_t> out(std::vector<py::ssize_t>(ids.shape(), ids.shape() + ids.ndim()));
          const int64_t* in = ids.data();
          int64_t* o = out.mutable_data();
          {
            py::gil_scoped_release nogil;
            for (py::ssize_t i = 0; i < ids.size(); ++i) o[i] = KeyHash(field, in[i]);
          }
          return out;
        }, py::arg("field"), py::arg("ids"), "key_hash of integer ids, each hashed as its 8 little-endian bytes");
}

}  // namespace bindings
}  // namespace hetu
