// kSaveDelta and kLoadDelta: incremental checkpoints of a whole table on every server
// (table.h: MarkSaved, SaveDelta, LoadDelta).
//   request:  meta path: the folder; meta arg: the delta's mark (> 0); kSaveDelta: one int64
//             blob, the mark of the save (full or delta) the delta follows
//   answer:   nothing; an error for a path outside the job's checkpoint folders, a delta whose
//             base is not the rows' last marked save, or a failed write or read
// kSaveDelta writes the rows whose version changed since the marked save; kLoadDelta applies a
// delta on top of a load of its base. Both record the delta's mark with every row's version.
#include <filesystem>

#include "ops/serving.h"
#include "py_face.h"

namespace ps {

namespace {

bool ServeSaveDelta(Serving& s) {
  TableShard& t = s.table();
  const std::string& path = s.msg.meta.path();
  if (Refused(s, "delta save")) return true;
  std::string error = Expect<int64_t>(s.msg, 0, 1, "base mark", t.name());
  if (error.empty() && s.msg.meta.arg() <= 0)
    error = "table '" + t.name() + "': a delta needs a mark above 0, got " + std::to_string(s.msg.meta.arg());
  if (error.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    error = t.SaveDelta(path, s.server.po().rank(), s.server.po().num_servers(), s.msg.data[0].as<int64_t>()[0],
                        s.msg.meta.arg());
  }
  s.Reply({}, error);
  return true;
}

bool ServeLoadDelta(Serving& s) {
  TableShard& t = s.table();
  if (Refused(s, "delta load")) return true;
  std::string error = t.LoadDelta(s.msg.meta.path());
  if (error.empty() && s.msg.meta.arg() > 0) t.MarkSaved(s.msg.meta.arg());
  s.Reply({}, error);
  return true;
}

void Bind(PyFace& f) {
  f.table.def(
      "save_delta",
      [](RemoteTable& t, const std::string& path, int64_t base, int64_t mark) {
        return Admin(t, kSaveDelta, path, mark, {base});
      },
      py::kw_only(), py::arg("path"), py::arg("base"), py::arg("mark"));
  f.table.def(
      "load_delta",
      [](RemoteTable& t, const std::string& path, int64_t mark) { return Admin(t, kLoadDelta, path, mark); },
      py::kw_only(), py::arg("path"), py::arg("mark") = 0);
}

}  // namespace

extern const OpDef kSaveDeltaOp = {"save_delta", 0, ServeSaveDelta, nullptr, Bind};  // binds the family
extern const OpDef kLoadDeltaOp = {"load_delta", 0, ServeLoadDelta, nullptr, nullptr};

}  // namespace ps
