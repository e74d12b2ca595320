// The Handle of an operation in flight, and the NumPy results built from the servers' answers
// (each op's own result is in its file under ops/, OpDef::result).
#include "py_face.h"

#include "common/storage.h"

namespace ps {

Handle::~Handle() {
  // Parts of the request may still read the caller's arrays (zero-copy sends), even after
  // another part failed: let them all be answered first.
  if (req_ && !req_->settled() && NodeRunning()) {
    py::gil_scoped_release nogil;
    Node().customer->WaitSettled(req_, DefaultWaitTimeout());
  }
}

py::object Handle::wait(py::object timeout) {
  if (!result_.is_none() || consumed_) return result_;
  const double t = timeout.is_none() ? DefaultWaitTimeout() : timeout.cast<double>();
  {
    py::gil_scoped_release nogil;
    Node().customer->Wait(req_, t);
  }
  consumed_ = true;
  keep_ = py::list();
  const OpDef& op = OpOf(req_->op);
  result_ = op.result ? op.result(*req_, asked_) : py::none();
  return result_;
}

py::array Widened(const py::array& raw, int storage, py::ssize_t n, py::ssize_t w) {
  py::array_t<float> out({n, w});
  hetu::storage::widen_row(storage, raw.data(), out.mutable_data(), n * w);
  return out;
}

py::array Rows(Request& r, size_t bi) {
  const py::ssize_t n = r.num_keys, w = r.width;
  if (r.storage == hetu::storage::kF32) return Gathered<float>(r, bi, w, {n, w});
  return Widened(Gathered<uint16_t>(r, bi, w, {n, w}), r.storage, n, w);
}

}  // namespace ps
