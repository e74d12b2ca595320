// The data operations a worker asks of the servers. Each is declared once, in its own file under
// ops/ (its request and answer blobs, the server's handler, the worker's result and its methods
// of hetu._ps), and registered here by one line of PS_OPS. KVServer and the worker's Handle look
// an operation up by its id; neither names one.
//
// Chunks (PS_CHUNK_BYTES, meta `chunked`/`offset`/`more`): a kPull to several servers of more
// rows than a chunk holds is answered by each server in chunks of rows, which the worker copies
// into the result as they arrive; an ASP kPush of strictly increasing keys (without a
// write-back) goes as chunks of keys and gradients, each stepped on arrival and answered once.
#pragma once
#include <pybind11/pytypes.h>

namespace ps {

struct Request;
struct Serving;  // ops/serving.h
struct Asked;    // py_face.h
struct PyFace;   // py_face.h

// X(enum name, its id in Meta.op (on the wire: never reused), its OpDef from its file under ops/)
#define PS_OPS(X)                 \
  X(kInit, 1, kInitOp)            \
  X(kPush, 2, kPushOp)            \
  X(kPull, 3, kPullOp)            \
  X(kPushPull, 4, kPushPullOp)    \
  X(kPullStale, 5, kPullStaleOp)  \
  X(kPullState, 6, kPullStateOp)  \
  X(kAssign, 7, kAssignOp)        \
  X(kSave, 8, kSaveOp)            \
  X(kLoad, 9, kLoadOp)            \
  X(kClear, 10, kClearOp)         \
  X(kStats, 11, kStatsOp)         \
  X(kAdmit, 12, kAdmitOp)         \
  X(kSaveDelta, 13, kSaveDeltaOp) \
  X(kLoadDelta, 14, kLoadDeltaOp) \
  X(kPrefetch, 15, kPrefetchOp)   \
  /* one line per op, above this one */

enum Op : int {
#define PS_OP_ENUM(op, id, def) op = id,
  PS_OPS(PS_OP_ENUM)
#undef PS_OP_ENUM
};

enum OpFlag : unsigned {
  // Its work grows only with its own size (row operations): the Postoffice may handle it on its
  // receive thread. Ops that go through a whole table (init, save, load, clear) stay off it.
  kBrief = 1,
  kNoTable = 2,     // addressed to the server, not to a table (the handler gets no entry)
  kUncounted = 4,   // left out of the server's counters (the request that reads them)
  kSparseOnly = 8,  // embedding tables only: refused for a dense tensor
  kWriteBack = 16,  // may carry a write-back (meta has_write_back); every other op refuses one
  // Changes rows (a push, an admit, an assign): failing part way (a disk tier's I/O error) may
  // leave them half changed, so the table serves nothing after it (TableShard::broken).
  kChangesRows = 32,
};

struct OpDef {
  const char* name;  // in logs and errors: "pull_with_state"
  unsigned flags;    // OpFlag
  // Server: answers the request; false: it must wait (a read whose iteration is not servable
  // yet) and comes back later.
  bool (*serve)(Serving&);
  // Worker: the result of the finished request; null: None.
  pybind11::object (*result)(Request&, const Asked&);
  // Its methods of hetu._ps (a Table method, a module function); null: none of its own.
  void (*bind)(PyFace&);
};

// The declaration of op `op`; an id no op has gets one that refuses the request.
const OpDef& OpOf(int op);
inline const char* OpName(int op) { return OpOf(op).name; }

// Every registered op, in id order.
template <typename F>
void ForEachOp(F&& f) {
#define PS_OP_VISIT(op, id, def) f(OpOf(op));
  PS_OPS(PS_OP_VISIT)
#undef PS_OP_VISIT
}

}  // namespace ps
