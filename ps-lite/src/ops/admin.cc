// kSave, kLoad and kClear: a whole table on every server.
//   request:  no blobs; meta path: the folder (kSave, kLoad); meta arg: the checkpoint's mark
//             (> 0), recorded with every row's version for the deltas that follow (ops/delta.cc)
//   answer:   nothing; an error for a path outside the job's checkpoints or a failed save or
//             load (table.h says what a shard writes and reads)
// kClear puts the table back to its initializer's values, with no optimizer state, steps,
// versions or pending BSP iterations.
//
// Where a server may save and load (ps-lite/README.md, Security): HETU_CHECKPOINT_ROOT lists
// the job's checkpoints (`:`-separated; the launcher gives the command's --checkpoint and
// --resume). A checkpoint NAME allows NAME itself, NAME.previous and the temporary folders of
// its saves, .tmp-NAME.XXXXXXXX beside it (hetu/checkpoint.py writes a save there and swaps it
// in), and nothing else of the folder that holds them. Without the variable (a job started by
// hand) any folder is allowed. A refused save or load and every clear leave a line on the
// server, at most one per 5 s of each kind (with the count of those held back).
#include <algorithm>
#include <filesystem>

#include "auth.h"
#include "logging.h"
#include "ops/serving.h"
#include "py_face.h"

namespace ps {

namespace {

namespace fs = std::filesystem;

// The checkpoints of HETU_CHECKPOINT_ROOT, canonical; empty: any folder.
const std::vector<fs::path>& JobCheckpoints() {
  static const std::vector<fs::path> checkpoints = [] {
    std::vector<fs::path> out;
    const char* env = std::getenv("HETU_CHECKPOINT_ROOT");
    const std::string all = env ? env : "";
    for (size_t start = 0; start <= all.size();) {
      size_t end = all.find(':', start);
      if (end == std::string::npos) end = all.size();
      const std::string entry = all.substr(start, end - start);
      std::error_code ec;
      fs::path checkpoint = fs::weakly_canonical(fs::absolute(entry, ec), ec);
      if (checkpoint.filename().empty()) checkpoint = checkpoint.parent_path();   // "NAME/"
      if (!entry.empty()) out.push_back(checkpoint);
      start = end + 1;
    }
    return out;
  }();
  return checkpoints;
}

// Whether `name`, an entry of the checkpoint's folder, is the checkpoint, its .previous or one
// of its saves' temporaries (mkdtemp's suffix: 8 characters of [a-z0-9_]).
bool OfCheckpoint(const std::string& name, const std::string& checkpoint) {
  if (name == checkpoint || name == checkpoint + ".previous") return true;
  const std::string prefix = ".tmp-" + checkpoint + ".";
  return name.size() == prefix.size() + 8 && name.compare(0, prefix.size(), prefix) == 0 &&
         std::all_of(name.begin() + prefix.size(), name.end(),
                     [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_'; });
}

// Why a save or load of `path` is refused; empty where allowed.
std::string Unconfined(const TableShard& t, const char* what, const std::string& path) {
  const auto& checkpoints = JobCheckpoints();
  if (checkpoints.empty()) return "";
  std::error_code ec;
  // Symbolic links and ".." resolved first: the folder actually written or read is compared.
  const fs::path real = fs::weakly_canonical(fs::absolute(path, ec), ec);
  std::string listed;
  for (const auto& c : checkpoints) {
    const fs::path folder = c.parent_path();
    auto [in_folder, in_real] = std::mismatch(folder.begin(), folder.end(), real.begin(), real.end());
    if (!ec && in_folder == folder.end() && in_real != real.end() && OfCheckpoint(in_real->string(), c.filename().string()))
      return "";
    listed += (listed.empty() ? "" : ", ") + c.string();
  }
  return "table '" + t.name() + "': " + what + " of " + path + " refused: it is outside the job's checkpoint " +
         "folder (HETU_CHECKPOINT_ROOT: " + listed + "): a server writes only into a checkpoint listed there, " +
         "its .previous and its saves' .tmp-* folders";
}

// One line on the server's stderr, rate-limited per kind of event.
void Note(auth::RateLimit& limit, Serving& s, const std::string& what) {
  long held = 0;
  if (Verbosity() >= 1 || limit.Allow(&held))
    LogLine() << "server " << s.server.po().rank() << ": " << what << " (asked by "
              << s.server.po().Describe(s.msg.meta.sender()) << ")"
              << (held ? " (and " + std::to_string(held) + " more not shown)" : "");
}

auth::RateLimit refusals, clears;

}  // namespace

// Whether the request's path is refused: then the refusal is noted on the server and answered.
bool Refused(Serving& s, const char* what) {
  const std::string refused = Unconfined(s.table(), what, s.msg.meta.path());
  if (refused.empty()) return false;
  Note(refusals, s, refused);
  s.Reply({}, refused);
  return true;
}

namespace {

bool ServeSave(Serving& s) {
  if (Refused(s, "save")) return true;
  const std::string& path = s.msg.meta.path();
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  const std::string error = s.table().Save(path, s.server.po().rank(), s.server.po().num_servers());
  if (error.empty() && s.msg.meta.arg() > 0) s.table().MarkSaved(s.msg.meta.arg());
  s.Reply({}, error);
  return true;
}

bool ServeLoad(Serving& s) {
  if (Refused(s, "load")) return true;
  const std::string error = s.table().Load(s.msg.meta.path());
  if (error.empty() && s.msg.meta.arg() > 0) s.table().MarkSaved(s.msg.meta.arg());
  s.Reply({}, error);
  return true;
}

bool ServeClear(Serving& s) {
  // A clear puts every row back to its initial value: an operator must be able to tell.
  Note(clears, s, "table '" + s.table().name() + "' cleared");
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
