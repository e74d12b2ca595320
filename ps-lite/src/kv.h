// Data operations shared by KVWorker and KVServer. Blobs per op (request -> response):
//   kInit       -                                  -> -
//   kPush       keys, grads[, counts] (dense: grads)
//               [, then a write-back: keys, rows, state, steps, version_add] -> -
//   kPull       keys (dense: -)                    -> rows
//   kPushPull   as kPush                           -> rows after the push's iteration is applied
//   kPullStale  keys, versions; arg = bound        -> positions, rows, versions
//               (with_state: then the returned rows' optimizer state and steps)
//   kPullState  keys[, a byte per key: 1 = with state] -> rows, state, steps, versions
//               (with the bytes: state, steps and versions of the marked keys only)
//   kAssign     keys, rows, state, steps, version_add -> -
//   kSave/kLoad path                               -> -
//   kClear      -                                  -> -
//   kStats      - (no table)                       -> requests, rows, bytes, busy seconds (4 doubles):
//               what this server has served (KVServer::Counters)
// Chunks (PS_CHUNK_BYTES, meta `chunked`/`offset`/`more`): a kPull to several servers of more
// rows than a chunk holds is answered by each server in chunks of rows, which the worker copies
// into the result as they arrive; an ASP kPush of strictly increasing keys (without a
// write-back) goes as chunks of keys and gradients, each stepped on arrival and answered once.
#pragma once

namespace ps {

enum Op : int {
  kInit = 1,
  kPush = 2,
  kPull = 3,
  kPushPull = 4,
  kPullStale = 5,
  kPullState = 6,
  kAssign = 7,
  kSave = 8,
  kLoad = 9,
  kClear = 10,
  kStats = 11,
};

const char* OpName(int op);

}  // namespace ps
