"""Embedding lookup and bags (multi-hot fields, pooled by sum or mean). Their gradient is sparse:
the looked-up ids and one gradient row per id (duplicates kept; the optimizer sums them), never a
table-sized dense array.

Row kernels, CPU (hetu._C) and GPU (below) side by side: gather with a bounds check, and
unique-and-sum, which sorts ids stably and sums each id's rows in the order they occur (on the
device in pieces of 32 rows, added in order), so the sum is the same from run to run whatever
the hardware's thread count."""
import time

import numpy as np

from .. import _C, cuda
from ..context import array_module_of
from ..graph import Op
from .common import ShapeError

__all__ = ["embedding_lookup_op", "embedding_bag_op", "Bags", "BagGradient", "LookupGradient", "IndexedSlices"]

_ROW_KERNELS = r"""
// out[i, :] = table[ids[i], :]; an id outside the table writes zeros and records the first bad
// position in *bad (which is -1 while every id is good).
extern "C" __global__ void hetu_gather_rows(const float* table, const long long* ids, float* out, long long n,
                                            long long width, long long rows, long long* bad) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= n * width) return;
  long long i = e / width, j = e - i * width;
  long long id = ids[i];
  if (id < 0 || id >= rows) {
    out[e] = 0.0f;
    if (j == 0) atomicCAS((unsigned long long*)bad, (unsigned long long)-1LL, (unsigned long long)i);
    return;
  }
  out[e] = table[id * width + j];
}

// sorted[k] = ids of a stable sort. head[k] = 1 where a run of equal ids starts.
extern "C" __global__ void hetu_run_heads(const long long* sorted, long long n, long long* head) {
  long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (k >= n) return;
  head[k] = (k == 0 || sorted[k] != sorted[k - 1]) ? 1 : 0;
}

// seg[k]: the run of sorted position k (inclusive scan of head, minus one). Writes each run's id
// and start, the end of the last run, and the number of runs.
extern "C" __global__ void hetu_run_starts(const long long* sorted, const long long* seg, long long n,
                                           long long* uniq, long long* start, long long* count) {
  long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (k >= n) return;
  long long s = seg[k] - 1;
  if (k == 0 || sorted[k] != sorted[k - 1]) { uniq[s] = sorted[k]; start[s] = k; }
  if (k == n - 1) { start[s + 1] = n; *count = s + 1; }
}

// Each run's rows are summed in order of occurrence (order[k]: the original position of sorted
// position k), in pieces of at most CHUNK sorted positions so that a hot id's long run does not
// serialise the whole kernel: first every chunk of sorted positions sums its pieces (a run that
// lies inside one chunk is complete and goes straight to summed[u]; otherwise the chunk keeps its
// leading piece, of a run begun before it, in partial[c][0] and its trailing piece, of a run that
// goes on after it, in partial[c][1]), then each run spread over several chunks adds its pieces
// in chunk order. The order of additions depends on the ids alone: the sums are deterministic.
#define CHUNK 32
extern "C" __global__ void hetu_sum_chunks(const float* values, const long long* order, const long long* seg,
                                           const long long* start, long long n, long long width, float* summed,
                                           float* partial) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  long long chunks = (n + CHUNK - 1) / CHUNK;
  if (e >= chunks * width) return;
  long long c = e / width, j = e - c * width;
  long long lo = c * CHUNK, hi = min(n, lo + CHUNK);
  float acc = 0.0f;
  for (long long k = lo; k < hi; ++k) {
    acc += values[order[k] * width + j];
    if (k + 1 == hi || seg[k + 1] != seg[k]) {   // the piece of run u ends here
      long long u = seg[k] - 1;
      bool began_before = start[u] < lo, goes_on = start[u + 1] > hi;
      if (began_before) partial[(c * 2 + 0) * width + j] = acc;
      else if (goes_on) partial[(c * 2 + 1) * width + j] = acc;
      else summed[u * width + j] = acc;
      acc = 0.0f;
    }
  }
}

// (A grid-stride loop over the *count runs: the launch is sized for n, most of which are not runs.)
extern "C" __global__ void hetu_sum_spread_runs(const long long* start, const long long* count, long long n,
                                                long long width, const float* partial, float* summed) {
  long long end = *count * width;
  for (long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x; e < end;
       e += (long long)gridDim.x * blockDim.x) {
    long long u = e / width, j = e - u * width;
    long long c0 = start[u] / CHUNK, c1 = (start[u + 1] - 1) / CHUNK;
    if (c0 == c1) continue;
    float acc = partial[(c0 * 2 + 1) * width + j];
    for (long long c = c0 + 1; c <= c1; ++c) acc += partial[(c * 2 + 0) * width + j];
    summed[u * width + j] = acc;
  }
}

// out[uniq[u], :] = rows[u, :] for u < *count.
extern "C" __global__ void hetu_scatter_rows(float* out, const long long* uniq, const float* rows,
                                             const long long* count, long long n, long long width) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= n * width) return;
  long long u = e / width, j = e - u * width;
  if (u >= *count) return;
  out[uniq[u] * width + j] = rows[e];
}

// Bags: out[s, k, :] = the sum of rows[ids[s, o[k]] .. ids[s, o[k + 1] - 1]] in slot order (-1: an
// empty slot), divided by the bag's length with `mean`; an empty bag gives zeros. As pool_bags on
// the CPU, bit for bit: the first row is taken as it is, the others added one after another.
// A bad id writes its flat position to *bad as hetu_gather_rows does.
extern "C" __global__ void hetu_pool_bags(const float* rows, const long long* ids, const long long* o, float* out,
                                          long long n, long long slots, long long bags, long long width,
                                          long long num_rows, int mean, long long* bad) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= n * bags * width) return;
  long long j = e % width, sk = e / width, k = sk % bags, s = sk / bags;
  float acc = 0.0f;
  long long count = 0;
  for (long long i = s * slots + o[k]; i < s * slots + o[k + 1]; ++i) {
    long long id = ids[i];
    if (id == -1) continue;
    if (id < -1 || id >= num_rows) {
      if (j == 0) atomicCAS((unsigned long long*)bad, (unsigned long long)-1LL, (unsigned long long)i);
      continue;
    }
    float v = rows[id * width + j];
    acc = count++ == 0 ? v : acc + v;
  }
  out[e] = (mean && count > 1) ? acc / (float)count : acc;
}

// The bags' gradient for every slot: values[s * slots + i, :] = g[s, k, :] (over the bag's length
// with `mean`) where slot i is in bag k; empty slots are dropped on the host side of the op.
extern "C" __global__ void hetu_bag_slot_grads(const long long* ids, const long long* o, const float* g,
                                               float* values, long long n, long long slots, long long bags,
                                               long long width, int mean) {
  long long e = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (e >= n * slots * width) return;
  long long j = e % width, si = e / width, i = si % slots, s = si / slots;
  long long k = 0;
  while (o[k + 1] <= i) ++k;
  long long count = 0;
  for (long long q = s * slots + o[k]; q < s * slots + o[k + 1]; ++q) count += ids[q] >= 0;
  float v = g[(s * bags + k) * width + j];
  values[e] = (mean && count > 1) ? v / (float)count : v;
}
"""


_CHUNK = 32   # CHUNK of the kernels above


def _row_kernel(name):
    return cuda.raw_kernel(name, _ROW_KERNELS)


def unique_sum(ids, values):
    """(distinct ids ascending, the sum of each id's rows in order of occurrence) on the host, or,
    for device arrays, DeviceRows of fixed size whose first `count` entries are those."""
    if not cuda.is_device_array(values):
        return _C.unique_sum(np.ascontiguousarray(ids, np.int64), np.ascontiguousarray(values, np.float32))
    return DeviceRows.sum_of(ids, values)


class DeviceRows:
    """A sparse gradient summed on the device with no host synchronisation (so a step can be
    captured as a CUDA graph): `uniq` [n], `summed` [n, width] and `count` (a device scalar) of
    which only the first `count` rows are meaningful; n is the number of ids summed."""

    def __init__(self, uniq, summed, count):
        self.uniq, self.summed, self.count = uniq, summed, count

    @classmethod
    def sum_of(cls, ids, values, out=None):
        """`out`: optional (uniq [n], summed [n, width], count [1]) device arrays to write into."""
        cp = cuda.cupy()
        ids = ids.reshape(-1)
        n = ids.size
        width = values.size // max(n, 1) if n else (values.shape[-1] if values.ndim == 2 else 0)
        values = cp.ascontiguousarray(values.reshape(n, width), dtype=np.float32)
        if out is None:
            out = (cp.empty(n, np.int64), cp.empty((n, width), np.float32), cp.zeros(1, np.int64))
        uniq, summed, count = out
        if n == 0:
            count.fill(0)
            return cls(uniq, summed, count)
        ids = cp.ascontiguousarray(ids, dtype=np.int64)
        order = cp.argsort(ids)      # stable: CuPy sorts with a stable algorithm
        sorted_ids = ids[order]
        head = cp.empty(n, np.int64)
        cuda.launch(_row_kernel("hetu_run_heads"), n, (sorted_ids, np.int64(n), head))
        seg = cp.cumsum(head)
        start = cp.empty(n + 1, np.int64)
        cuda.launch(_row_kernel("hetu_run_starts"), n, (sorted_ids, seg, np.int64(n), uniq, start, count))
        chunks = (n + _CHUNK - 1) // _CHUNK
        partial = cp.empty((chunks, 2, width), np.float32)
        cuda.launch(_row_kernel("hetu_sum_chunks"), chunks * width,
                    (values, order, seg, start, np.int64(n), np.int64(width), summed, partial))
        cuda.launch(_row_kernel("hetu_sum_spread_runs"), n * width,
                    (start, count, np.int64(n), np.int64(width), partial, summed), max_blocks=cuda.STRIDE_BLOCKS)
        return cls(uniq, summed, count)

    def exact(self):
        """(uniq, summed) cut to `count` rows: one synchronisation."""
        u = int(self.count.get()[0])
        return self.uniq[:u], self.summed[:u]

    def scatter_into(self, out):
        n, width = self.summed.shape
        cuda.launch(_row_kernel("hetu_scatter_rows"), n * width,
                    (out, self.uniq, self.summed, self.count, np.int64(n), np.int64(width)))
        return out


class IndexedSlices:
    """A sparse gradient: rows `values[i]` belong to row `indices[i]` of a dense_shape tensor."""
    __slots__ = ("indices", "values", "dense_shape")

    def __init__(self, indices, values, dense_shape):
        self.indices, self.values, self.dense_shape = indices, values, tuple(dense_shape)

    def to_dense(self):
        xp = array_module_of(self.values)
        out = xp.zeros(self.dense_shape, dtype=np.float32)
        if xp is np:
            np.add.at(out, self.indices, self.values)
        else:
            # Summed per id first (deterministic), not with atomic adds in arbitrary order.
            DeviceRows.sum_of(self.indices, self.values).scatter_into(out)
        return out


class BagGradient(IndexedSlices):
    """A bag's sparse gradient on the host, summed per id only when read: `indices` and `values`
    are Bags.gradient's (the distinct ids ascending and each one's sum). A table this process owns
    is stepped from it without them (step_into: the sums go straight into the optimizer step,
    FBGEMM's fused backward), bit for bit as unique_sum and apply_rows step the summed rows."""
    __slots__ = ("bags", "ids", "g", "_summed")

    def __init__(self, bags, ids, g, dense_shape):
        self.bags, self.ids, self.g, self._summed = bags, ids, g, None
        self.dense_shape = tuple(dense_shape)

    def _sums(self):
        if self._summed is None:
            self._summed = self.bags.gradient(self.ids, self.g, self.dense_shape[1])
        return self._summed

    @property
    def indices(self):
        return self._sums()[0]

    @property
    def values(self):
        return self._sums()[1]

    def step_into(self, op_name, config, lr, table, state, steps):
        """One optimizer step (an OptimConfig, learning rate `lr`) of the table's rows this
        gradient names, with their state and step counts, in one pass over the bags' slots."""
        _step_bags(op_name, self.ids, self.bags.offsets(self.ids.shape[1]), self.bags.mean, self.g, True,
                   config, lr, table, state, steps)


class LookupGradient(IndexedSlices):
    """A single-id lookup's sparse gradient on the host: `indices` and `values` are the
    occurrences' ids and gradient rows, as any consumer (the servers, the cache, a fan-in) reads
    them. A table this process owns is stepped from them directly (step_into: each id is a bag of
    one slot, summed and stepped in one pass, no unique_sum), bit for bit as unique_sum and
    apply_rows step them."""
    __slots__ = ()

    def step_into(self, op_name, config, lr, table, state, steps):
        """One optimizer step of the table's rows this gradient names, as BagGradient.step_into."""
        _step_bags(op_name, self.indices.reshape(-1, 1), _ONE_BAG_OF_ONE, False, self.values, False,
                   config, lr, table, state, steps)


_ONE_BAG_OF_ONE = np.array([0, 1], np.int64)   # a single-id lookup's bag offsets


def _step_bags(op_name, ids, offsets, mean, g, empty_slots, config, lr, table, state, steps):
    """_C.bag_gradient_step of ids [samples, slots] and their bags' gradient g, with the error of
    a bad id naming the op, the id and the table size. empty_slots: whether -1 is an empty slot."""
    n = ids.shape[0]
    bad = _C.bag_gradient_step(np.ascontiguousarray(ids), offsets, mean,
                               np.ascontiguousarray(g, np.float32).reshape(n, len(offsets) - 1, table.shape[1]),
                               config, lr, table, state, steps, empty_slots)
    if bad is not None:
        raise IndexError(f"{op_name}: id {bad[1]} (position {bad[0]}) outside the table of {table.shape[0]} rows")


def catch_up_read(state, param, table, ids):
    """Before a table this process holds is read: under a catch-up optimizer (hetu.optim), the
    rows of `ids` (-1 and ids outside the table are left to the read's own checks) take the steps
    they skipped, up to the steps taken so far."""
    op = state.executor.graph.catching_up.get(param.id)
    if op is None:
        return
    flat = ids.reshape(-1) if not cuda.is_device_array(ids) else None
    if flat is None or cuda.is_device_array(table):
        raise NotImplementedError(f"optimizer {op.optimizer.kind!r}: table {param.name} on the GPU does not catch up "
                                  f"its rows; put the tables on the parameter server (--comm PS or Hybrid)")
    opt_state, steps = state.optimizer_state(param, op.optimizer, rowwise=True)
    op.optimizer.catch_up(table, opt_state, steps, flat, op.step_count)


def gather(op_name, table, ids, out, checks=None):
    """out = table[ids] with a bounds check that names the op, the id and the table size. On the
    device the check is recorded in `checks` (hetu.cuda.DeviceChecks) and raised after the step."""
    flat = ids.reshape(-1)
    rows, width = table.shape
    if not cuda.is_device_array(table):
        bad = _C.gather_rows(table, flat, out.reshape(flat.size, width))
        if bad is not None:
            raise IndexError(f"{op_name}: id {bad[1]} (position {bad[0]}) outside the table of {rows} rows")
        return out
    bad = checks.slot(op_name, lambda pos: IndexError(
        f"{op_name}: id {int(flat[pos].get())} (position {pos}) outside the table of {rows} rows"))
    cuda.launch(_row_kernel("hetu_gather_rows"), flat.size * width,
                (table, cuda.cupy().ascontiguousarray(flat), out, np.int64(flat.size), np.int64(width),
                 np.int64(rows), bad))
    return out


def gather_slots(op_name, table, slots, out):
    """gather() of a dynamic table's slots (hetu.dynamic), host arrays: a slot of -1 (a key
    without a row) reads zeros."""
    missing = slots.reshape(-1) < 0
    if len(table) == 0 or missing.all():
        out[...] = 0
        return out
    if not missing.any():
        return gather(op_name, table, slots, out)
    gather(op_name, table, np.where(missing, 0, slots.reshape(-1)), out)
    out.reshape(missing.size, -1)[missing] = 0
    return out


class EmbeddingLookupOp(Op):
    bags = None   # EmbeddingBagOp's pooling
    dynamic = None   # a dynamic table's hetu.dynamic.TableKeys (bind_dynamic): ids are slots, -1 reads zeros

    def __init__(self, table, ids, ctx=None):
        super().__init__(table, ids, ctx=ctx)

    def infer_shape(self, s):
        table, ids = s
        if len(table) != 2:
            raise ShapeError(f"{self.name}: table {self.inputs[0].name} must be 2-D, got {table}")
        return tuple(ids) + (table[1],)

    def compute(self, vals, state):
        table, ids = vals
        if ids.dtype != np.int64:
            raise TypeError(f"{self.name}: ids {self.inputs[1].name} are {ids.dtype}, expected int64")
        out = state.buffer(self, ids.shape + (table.shape[1],), np.float32)
        if self.dynamic is not None:
            self.dynamic.admit_locally(state, self.inputs[0])
        catch_up_read(state, self.inputs[0], table, ids)
        if self.dynamic is not None:
            return gather_slots(self.name, table, ids, out)
        return gather(self.name, table, ids, out, state.checks)

    def gradient(self, g):
        return [EmbeddingLookupGradOp(g, self.inputs[1], self.inputs[0]), None]


class EmbeddingLookupGradOp(Op):
    """Reads only the table's shape, never its value (the table may live on the servers); a fed
    table of unknown static shape is an input so its shape is known at run time."""
    produces_sparse = True

    def __init__(self, g, ids, table, ctx=None):
        extra = (table,) if getattr(table, "shape", None) is None else ()
        super().__init__(g, ids, *extra, ctx=ctx)
        self.table = table

    def infer_shape(self, s):
        return s[2] if len(s) > 2 else self.table.shape

    def compute(self, vals, state):
        g, ids = vals[:2]
        shape = vals[2].shape if len(vals) > 2 else self.table.shape
        ids, g = ids.reshape(-1), g.reshape(-1, shape[1])
        if getattr(self.table, "dynamic", None) is not None:   # a slot of -1 has no row: its gradient is dropped
            kept = ids >= 0
            if not kept.all():
                ids, g = ids[kept], g[kept]
        if not cuda.is_device_array(g):
            return LookupGradient(ids, g, shape)   # read as occurrences, or fused into the step
        return IndexedSlices(ids, g, shape)


class SparseSumOp(Op):
    """Fan-in of sparse gradients (a table looked up more than once): concatenates the rows."""
    produces_sparse = True

    def infer_shape(self, s):
        return s[0]

    def compute(self, vals, state):
        xp = array_module_of(vals[0].values)
        return IndexedSlices(xp.concatenate([v.indices for v in vals]), xp.concatenate([v.values for v in vals]),
                             vals[0].dense_shape)


class Bags:
    """How a sample's id slots form bags (multi-hot fields): bag k is slots [offsets[k],
    offsets[k + 1]) of the ids' last axis, whose ids are pooled by `mode` ("sum" or "mean"); -1
    marks an empty slot (a bag holds its ids first, then -1s). `slots`: the slot count of each
    bag, or None for one bag of all the slots, pooled to [samples, width] instead of [samples,
    bags, width]."""

    MODES = ("sum", "mean")

    def __init__(self, slots=None, mode="sum"):
        if mode not in self.MODES:
            raise ValueError(f"bag mode {mode!r}: expected one of {', '.join(self.MODES)}")
        if slots is not None and (len(slots) == 0 or any(int(k) < 0 for k in slots)):
            raise ValueError(f"bag slots {slots}: expected one count >= 0 per bag")
        self.slots = None if slots is None else tuple(int(k) for k in slots)
        self.mode = mode
        self._on_device = {}   # slot count -> the offsets on the device, copied once (before any capture)

    @property
    def mean(self):
        return self.mode == "mean"

    def offsets(self, total_slots):
        slots = (total_slots,) if self.slots is None else self.slots
        return np.concatenate([[0], np.cumsum(slots)]).astype(np.int64)

    def device_offsets(self, total_slots):
        if total_slots not in self._on_device:
            self._on_device[total_slots] = cuda.cupy().asarray(self.offsets(total_slots))
        return self._on_device[total_slots]

    def out_shape(self, ids_shape, width):
        """[samples, bags, width] (or [samples, width] for one bag of all slots) for ids
        [samples, slots]."""
        if len(ids_shape) != 2:
            raise ShapeError(f"bag ids must be [samples, slots], got {tuple(ids_shape)}")
        if self.slots is None:
            return (ids_shape[0], width)
        if sum(self.slots) != ids_shape[1]:
            raise ShapeError(f"bags of {list(self.slots)} slots need {sum(self.slots)} id columns, got {ids_shape[1]}")
        return (ids_shape[0], len(self.slots), width)

    def pool(self, op_name, rows, ids, out, checks=None):
        """out = the bags of `ids` pooled over `rows` (a table, or a batch's distinct rows with ids
        as positions among them); a bad id is an error naming the op, the id and the table size."""
        n, slots = ids.shape
        offsets = self.offsets(slots)
        num_rows, width = rows.shape
        if not cuda.is_device_array(rows):
            bad = _C.pool_bags(rows, ids, offsets, self.mean, out.reshape(n, len(offsets) - 1, width))  # n may be 0
            if bad is not None:
                raise IndexError(f"{op_name}: id {bad[1]} (position {bad[0]}) outside the table of {num_rows} rows")
            return out
        cp = cuda.cupy()
        bags = len(offsets) - 1
        bad = checks.slot(op_name, lambda pos: IndexError(
            f"{op_name}: id {int(ids.reshape(-1)[pos].get())} (position {pos}) outside the table of {num_rows} rows"))
        cuda.launch(_row_kernel("hetu_pool_bags"), n * bags * width,
                    (rows, cp.ascontiguousarray(ids), self.device_offsets(slots), out, np.int64(n), np.int64(slots),
                     np.int64(bags), np.int64(width), np.int64(num_rows), np.int32(self.mean), bad))
        return out

    def gradient(self, ids, g, width):
        """(ids, rows) for g [samples, bags, width], the pooled rows' gradient. On the host: the
        distinct ids and each one's sum, in one pass that never writes a row per slot (a
        multi-hot batch has hundreds of slots a sample); on the device: one row per filled slot,
        in sample and slot order, which the consumer sums (DeviceRows) like a lookup's."""
        n, slots = ids.shape
        offsets = self.offsets(slots)
        if not cuda.is_device_array(g):
            return _C.bag_gradient(np.ascontiguousarray(ids), offsets, self.mean,
                                   np.ascontiguousarray(g, np.float32).reshape(n, len(offsets) - 1, width))
        cp = cuda.cupy()
        bags = len(offsets) - 1
        values = cp.empty((n * slots, width), np.float32)
        cuda.launch(_row_kernel("hetu_bag_slot_grads"), n * slots * width,
                    (cp.ascontiguousarray(ids), self.device_offsets(slots), cp.ascontiguousarray(g, dtype=np.float32),
                     values, np.int64(n), np.int64(slots), np.int64(bags), np.int64(width), np.int32(self.mean)))
        filled = cp.flatnonzero(ids.reshape(-1) >= 0)   # a synchronisation: the count decides the shapes
        return ids.reshape(-1)[filled], values[filled]


class EmbeddingBagOp(EmbeddingLookupOp):
    """table rows pooled per bag (Bags): [samples, bags, width], or [samples, width] for one bag of
    all the slots. A lookup like its parent for the passes (a table on the servers is read through
    a PS lookup that pools the same way)."""

    def __init__(self, table, ids, bags, ctx=None):
        super().__init__(table, ids, ctx=ctx)
        self.bags = bags

    def infer_shape(self, s):
        table, ids = s
        if len(table) != 2:
            raise ShapeError(f"{self.name}: table {self.inputs[0].name} must be 2-D, got {table}")
        try:
            return self.bags.out_shape(ids, table[1])
        except ShapeError as e:
            raise ShapeError(f"{self.name}: {e}") from None

    def compute(self, vals, state):
        table, ids = vals
        if ids.dtype != np.int64:
            raise TypeError(f"{self.name}: ids {self.inputs[1].name} are {ids.dtype}, expected int64")
        out = state.buffer(self, self.bags.out_shape(ids.shape, table.shape[1]), np.float32)
        if self.dynamic is not None:
            self.dynamic.admit_locally(state, self.inputs[0])
        catch_up_read(state, self.inputs[0], table, ids)
        return self.bags.pool(self.name, table, ids, out, state.checks)

    def gradient(self, g):
        return [EmbeddingBagGradOp(g, self.inputs[1], self.inputs[0], self.bags), None]


class EmbeddingBagGradOp(EmbeddingLookupGradOp):
    capturable = False   # the filled slots' count decides the gradient's shape

    def __init__(self, g, ids, table, bags, ctx=None):
        super().__init__(g, ids, table, ctx=ctx)
        self.bags = bags

    def compute(self, vals, state):
        g, ids = vals[:2]
        shape = vals[2].shape if len(vals) > 2 else self.table.shape
        if not cuda.is_device_array(g):
            return BagGradient(self.bags, ids, g, shape)   # summed when read, or fused into the step
        indices, values = self.bags.gradient(ids, g, shape[1])
        return IndexedSlices(indices, values, shape)


class PSEmbeddingLookupOp(Op):
    """table[ids] for a table on the servers, or, with `bags` (Bags), the table's rows pooled per
    bag (-1: an empty slot, which reads nothing): the lookup that the bind_ps pass puts in place
    of an EmbeddingLookupOp. Each distinct id is fetched once from `source`, the table's
    RowSource (hetu.rows): the servers, or the worker's cache in front of them. On a GPU the ids
    are read on the host and the distinct rows, with each id's position among them, reach the
    device in one pinned copy; the device expands them to the batch's rows or pools them."""
    capturable = False
    host_inputs = True
    dynamic = None   # a dynamic table's hetu.dynamic.TableKeys: ids are slots, -1 reads zeros

    def __init__(self, ids, source, bags=None, ctx=None):
        super().__init__(ids, ctx=ctx, name=None)
        self.source = source
        self.bags = bags
        self._to_device = None   # hetu.cuda.HostToDevice, on a GPU

    def infer_shape(self, s):
        return self._out_shape(tuple(s[0]))

    def _out_shape(self, ids_shape):
        width = self.source.param.shape[1]
        return self.bags.out_shape(ids_shape, width) if self.bags is not None else ids_shape + (width,)

    def compute(self, vals, state):
        ids = cuda.to_host(vals[0])
        if ids.dtype != np.int64:
            raise TypeError(f"{self.name}: ids are {ids.dtype}, expected int64")
        flat = ids.reshape(-1)
        rows = self.source.param.shape[0]
        keyed = self.bags is not None or self.dynamic is not None   # -1: an empty slot, or a key without a row
        lowest = -1 if keyed else 0
        if flat.size and (flat.min() < lowest or flat.max() >= rows):
            bad = int(flat.max() if flat.max() >= rows else flat.min())
            raise IndexError(f"{self.name}: id {bad} outside the table {self.source.param.name} of {rows} rows")
        if keyed:
            filled = flat >= 0
            uniq, inverse = np.unique(flat[filled], return_inverse=True)
            positions = np.full(ids.shape, -1, np.int64)
            positions.reshape(-1)[filled] = inverse
        else:
            uniq, positions = np.unique(flat, return_inverse=True)
        # Reads outside training (validation) go straight to the servers, after the executor
        # flushed every cache, and are not counted as training transmissions.
        if state.training:
            started = time.perf_counter()
            if self.dynamic is not None:
                self.source.begin_step(self.dynamic.current, uniq)
            pulled = self.source.lookup(uniq)
            self.source.counters.add(pull_seconds=time.perf_counter() - started)
        else:
            pulled = self.source.read(uniq)
        width = pulled.shape[1]
        out = state.buffer(self, self._out_shape(ids.shape), np.float32)
        if state.xp is np:
            if self.bags is not None:
                return self.bags.pool(self.name, pulled, positions, out)
            if self.dynamic is not None:
                return gather_slots(self.name, pulled, positions.reshape(ids.shape), out)
            np.take(pulled, positions, axis=0, out=out.reshape(flat.size, width))
            return out
        if self._to_device is None:
            self._to_device = cuda.HostToDevice()
        rows, positions = self._to_device.send([np.ascontiguousarray(pulled, np.float32),
                                                positions.reshape(ids.shape).astype(np.int64, copy=False)])
        if self.bags is not None:
            return self.bags.pool(self.name, rows, positions, out, state.checks)
        return gather(self.name, rows, positions.reshape(-1), out, state.checks)


def embedding_lookup_op(table, ids, ctx=None):
    return EmbeddingLookupOp(table, ids, ctx=ctx)


def embedding_bag_op(table, ids, slots=None, mode="sum", ctx=None):
    """The rows of `table` named by ids [samples, slots] pooled per bag by `mode`: bags of
    `slots` slots each -> [samples, bags, width], or one bag of all the slots (slots=None) ->
    [samples, width]. -1 marks an empty slot."""
    return EmbeddingBagOp(table, ids, Bags(slots, mode), ctx=ctx)
