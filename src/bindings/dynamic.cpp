// hetu._C's dynamic tables: the key directory (which keys hold rows) and keys' initial rows.
#include <initializer_list>
#include <string>
#include <utility>

#include "bindings/bindings.h"
#include "common/host_memory.h"
#include "dynamic/key_directory.h"
#include "dynamic/key_rows.h"

namespace hetu {
namespace bindings {

namespace {

using dynamic::DirectoryState;
using dynamic::KeyDirectory;

using Columns = std::initializer_list<std::pair<const char*, const std::vector<int64_t>*>>;

py::dict WithColumns(py::dict d, Columns columns) {
  for (const auto& [name, v] : columns) d[name] = to_array(*v);
  return d;
}

py::dict CountersDict(const dynamic::DirectoryCounters& c) {
  py::dict d;
  d["resident"] = c.resident;
  d["capacity"] = c.capacity;
  d["admitted"] = c.admitted;
  d["evicted"] = c.evicted;
  d["missed"] = c.missed;
  return d;
}

py::dict StepDict(const dynamic::StepResult& r, const dynamic::DirectoryCounters& c) {
  return WithColumns(CountersDict(c), {{"keys", &r.keys},
                                       {"slots", &r.slots},
                                       {"admitted_keys", &r.admitted_keys},
                                       {"admitted_slots", &r.admitted_slots},
                                       {"evicted_keys", &r.evicted_keys},
                                       {"evicted_slots", &r.evicted_slots}});
}

py::dict StateDict(const DirectoryState& s) {
  py::dict d;
  d["step"] = s.step;
  d["stepped"] = s.stepped;
  d["admitted"] = s.admitted;
  d["evicted"] = s.evicted;
  d["missed"] = s.missed;
  return WithColumns(d, {{"keys", &s.keys},
                         {"slots", &s.slots},
                         {"counts", &s.counts},
                         {"last_read", &s.last_read},
                         {"probation_keys", &s.probation_keys},
                         {"probation_index", &s.probation_index},
                         {"probation_counts", &s.probation_counts},
                         {"probation_last_read", &s.probation_last_read}});
}

std::vector<int64_t> Column(const py::dict& d, const char* name) {
  Array<int64_t> a = py::cast<Array<int64_t>>(d[name]);
  return std::vector<int64_t>(a.data(), a.data() + a.size());
}

DirectoryState StateFrom(const py::dict& d) {
  DirectoryState s;
  s.step = py::cast<int64_t>(d["step"]);
  s.stepped = py::cast<bool>(d["stepped"]);
  s.keys = Column(d, "keys");
  s.slots = Column(d, "slots");
  s.counts = Column(d, "counts");
  s.last_read = Column(d, "last_read");
  s.probation_keys = Column(d, "probation_keys");
  s.probation_index = Column(d, "probation_index");
  s.probation_counts = Column(d, "probation_counts");
  s.probation_last_read = Column(d, "probation_last_read");
  s.admitted = py::cast<int64_t>(d["admitted"]);
  s.evicted = py::cast<int64_t>(d["evicted"]);
  s.missed = py::cast<int64_t>(d["missed"]);
  return s;
}

}  // namespace

void bind_dynamic(py::module_& m) {
  py::class_<KeyDirectory>(m, "KeyDirectory",
                           "which int64 keys of a dynamic table hold a row: admission and eviction by the batch "
                           "sequence alone (src/dynamic/key_directory.h)")
      .def(py::init([](int64_t capacity, int64_t buckets, int64_t admit_after, int64_t ttl, int64_t probation_ways) {
             return new KeyDirectory(dynamic::DirectoryConfig{capacity, buckets, admit_after, ttl, probation_ways});
           }),
           py::arg("capacity"), py::arg("buckets"), py::arg("admit_after") = 1, py::arg("ttl") = 0,
           py::arg("probation_ways") = -1)
      .def_property_readonly("capacity", [](const KeyDirectory& d) { return d.config().capacity; })
      .def_property_readonly("buckets", [](const KeyDirectory& d) { return d.config().buckets; })
      .def_property_readonly("ways", &KeyDirectory::ways)
      .def_property_readonly("admit_after", [](const KeyDirectory& d) { return d.config().admit_after; })
      .def_property_readonly("ttl", [](const KeyDirectory& d) { return d.config().ttl; })
      .def_property_readonly("probation_ways", [](const KeyDirectory& d) { return d.config().probation_ways; })
      .def("step", [](KeyDirectory& d, int64_t t, const Array<int64_t>& keys, bool revocable) {
             dynamic::StepResult r;
             {
               py::gil_scoped_release nogil;
               r = d.Step(t, keys.data(), keys.size(), revocable);
             }
             return StepDict(r, d.counters());
           }, py::arg("t"), py::arg("keys"), py::arg("revocable") = false,
           "applies step t to its global batch's keys: dict of keys (distinct, ascending), slots (-1: not "
           "resident), admitted_keys/slots, evicted_keys/slots, and the running counters; `revocable`: "
           "pending until keep() or take_back()")
      .def_property_readonly("pending", &KeyDirectory::pending, "a revocable step neither kept nor taken back")
      .def("keep", &KeyDirectory::Keep, "makes the pending revocable step final")
      .def("take_back", &KeyDirectory::TakeBack, "restores the directory as it was before the pending step")
      .def("lookup", [](const KeyDirectory& d, const Array<int64_t>& keys) {
             Array<int64_t> slots(keys.size());
             d.Lookup(keys.data(), keys.size(), slots.mutable_data());
             return slots;
           }, py::arg("keys"), "the slot of each key now, or -1")
      .def("bucket_of", [](const KeyDirectory& d, const Array<int64_t>& keys) {
             Array<int64_t> buckets(keys.size());
             for (py::ssize_t i = 0; i < keys.size(); ++i) buckets.mutable_data()[i] = d.BucketOf(keys.data()[i]);
             return buckets;
           }, py::arg("keys"))
      .def("counters", [](const KeyDirectory& d) { return CountersDict(d.counters()); })
      .def("state", [](const KeyDirectory& d) { return StateDict(d.Save()); }, "the whole state as arrays")
      .def("restore", [](KeyDirectory& d, const py::dict& state) { d.Load(StateFrom(state)); }, py::arg("state"),
           "continues from a state() of a directory of the same capacity, buckets and probation ways");
  m.def("available_memory", [] {
          const AvailableMemory a = HostAvailableMemory();
          return py::make_tuple(a.bytes, a.source);
        }, "(bytes, where the figure comes from): the memory a process of this host may still take "
           "(common/host_memory.h)");
  m.def("byte_text", &ByteText, py::arg("bytes"), "'12.3 GB': bytes as the refusals write them");
  m.def("bucket_hash", [](const Array<int64_t>& keys) {
          Array<uint64_t> out(keys.size());
          for (py::ssize_t i = 0; i < keys.size(); ++i) out.mutable_data()[i] = dynamic::BucketHash(keys.data()[i]);
          return out;
        }, py::arg("keys"), "the bucket hash of each key: splitmix64 of its bits");
  m.def("key_stream", &dynamic::KeyStream, py::arg("stream"), py::arg("key"),
        "the counter-based stream of a key's initial row in the table of stream `stream`");
  m.def("key_rows", [](int kind, double a, double b, uint64_t seed, uint64_t stream, const Array<int64_t>& keys,
                       Array<float> out) {
          const int64_t n = keys.size();
          const int64_t width = n ? out.size() / n : 0;
          check_rows(out, n, width, "key_rows");
          float* o = mutable_data(out, "out");
          py::gil_scoped_release nogil;
          dynamic::FillKeyRows(kind, a, b, seed, stream, keys.data(), n, width, o);
        }, py::arg("kind"), py::arg("a"), py::arg("b"), py::arg("seed"), py::arg("stream"), py::arg("keys"),
        py::arg("out"), "out[i]: the initial row of keys[i] (init_fill's initializer, seeded by the key)");
}

}  // namespace bindings
}  // namespace hetu
