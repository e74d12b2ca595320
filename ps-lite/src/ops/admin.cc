// kSave, kLoad and kClear: a whole table on every server.
//   request:  no blobs; meta path: the folder (kSave, kLoad)
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
  s.Reply({}, s.table().Save(path, s.server.po().rank(), s.server.po().num_servers()));
  return true;
}

bool ServeLoad(Serving& s) {
  const std::string refused = s.server.Unconfined(s.table(), "load", s.msg.meta.path());
  s.Reply({}, refused.empty() ? s.table().Load(s.msg.meta.path()) : refused);
  return true;
}

bool ServeClear(Serving& s) {
  s.table().Reset();
  s.Reply({}, "");
  return true;
}

Handle Admin(RemoteTable& table, int op, const std::string& path) {
  const TableRef& t = table.ref();
  auto req = Send([&](KVWorker& w) {
    auto r = w.NewRequest(t, op);
    w.AllServers(r.get());
    w.Send(r, t.name, [&](Message& m, const Part&) { m.meta.set_path(path); });
    return r;
  });
  return Handle(req, py::list());
}

void Bind(PyFace& f) {
  f.table.def("save", [](RemoteTable& t, const std::string& path) { return Admin(t, kSave, path); }, py::kw_only(),
              py::arg("path"));
  f.table.def("load", [](RemoteTable& t, const std::string& path) { return Admin(t, kLoad, path); }, py::kw_only(),
              py::arg("path"));
  f.table.def("clear", [](RemoteTable& t) { return Admin(t, kClear, ""); });
}

}  // namespace

extern const OpDef kSaveOp = {"save", 0, ServeSave, nullptr, Bind};  // binds the family
extern const OpDef kLoadOp = {"load", 0, ServeLoad, nullptr, nullptr};
extern const OpDef kClearOp = {"clear", 0, ServeClear, nullptr, nullptr};

}  // namespace ps
