// kSave, kLoad and kClear: a whole table on every server.
//   request:  no blobs; meta path: the folder (kSave, kLoad); meta arg: the checkpoint's mark
//             (> 0), recorded with every row's version for the deltas that follow (ops/delta.cc)
//   answer:   nothing; an error for a path outside the job's checkpoint folders or a failed
//             save or load (table.h says what a shard writes and reads)
// kClear puts the table back to its initializer's values, with no optimizer state, steps,
// versions or pending BSP iterations.
#include <filesystem>

#include "ops/serving.h"
#include "py_face.h"

namespace ps {

namespace {

bool ServeSave(Serving& s) {
  const std::string& path = s.msg.meta.path();
  const std::string refused = s.server.Unconfined(s.table(), "save", path);
  if (!refused.empty()) {
    s.Reply({}, refused);
    return true;
  }
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  const std::string error = s.table().Save(path, s.server.po().rank(), s.server.po().num_servers());
  if (error.empty() && s.msg.meta.arg() > 0) s.table().MarkSaved(s.msg.meta.arg());
  s.Reply({}, error);
  return true;
}

bool ServeLoad(Serving& s) {
  std::string error = s.server.Unconfined(s.table(), "load", s.msg.meta.path());
  if (error.empty()) error = s.table().Load(s.msg.meta.path());
  if (error.empty() && s.msg.meta.arg() > 0) s.table().MarkSaved(s.msg.meta.arg());
  s.Reply({}, error);
  return true;
}

bool ServeClear(Serving& s) {
  s.table().Reset();
  s.Reply({}, "");
  return true;
}

}  // namespace

Handle Admin(RemoteTable& table, int op, const std::string& path, int64_t mark, const std::vector<int64_t>& args) {
  const TableRef& t = table.ref();
  auto req = Send([&](KVWorker& w) {
    auto r = w.NewRequest(t, op);
    w.AllServers(r.get());
    w.Send(r, t.name, [&](Message& m, const Part&) {
      m.meta.set_path(path);
      m.meta.set_arg(mark);
      if (!args.empty()) m.data.push_back(Blob::FromVector(std::vector<int64_t>(args)));
    });
    return r;
  });
  return Handle(req, py::list());
}

namespace {

void Bind(PyFace& f) {
  f.table.def("save", [](RemoteTable& t, const std::string& path, int64_t mark) { return Admin(t, kSave, path, mark); },
              py::kw_only(), py::arg("path"), py::arg("mark") = 0);
  f.table.def("load", [](RemoteTable& t, const std::string& path, int64_t mark) { return Admin(t, kLoad, path, mark); },
              py::kw_only(), py::arg("path"), py::arg("mark") = 0);
  f.table.def("clear", [](RemoteTable& t) { return Admin(t, kClear, "", 0); });
}

}  // namespace

extern const OpDef kSaveOp = {"save", 0, ServeSave, nullptr, Bind};  // binds the family
extern const OpDef kLoadOp = {"load", 0, ServeLoad, nullptr, nullptr};
extern const OpDef kClearOp = {"clear", 0, ServeClear, nullptr, nullptr};

}  // namespace ps
