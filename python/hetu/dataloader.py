"""Dataloaders: batches of a (memory-mapped) array, prefetched in a background thread.

Iteration t of an epoch reads global batch B_t = samples [t*W*b, (t+1)*W*b) of the epoch's
order (seeded shuffle or the stored order): GlobalBatches. Which samples of B_t this worker
takes is its SamplePlan's answer: slice w of it for worker w of W (WorkerSlice, docs/design.md
section 4), or the samples Herald's scheduler allocates (hetu.herald.Scheduler, which reads the
GlobalBatches and hands the loader its plans: `set_plan`). With drop_last=False (validation) an
epoch ends with the partial global batch of what is left, spread over the workers."""
import collections
import concurrent.futures
import functools

import numpy as np

from .dynamic import STEP_AHEAD
from .graph import Op


@functools.lru_cache(maxsize=2)
def _epoch_order(seed, epoch, n):
    """The shuffled order of an epoch, computed once: every batch of the epoch, the dense,
    sparse and label loaders that share a seed, and Herald's scheduler thread read it. Drawn
    anew per batch it cost 1.9 ms per loader at 180,000 samples, and grows with the data. Two
    epochs are kept, as a scheduler looking ahead reads the next epoch while training finishes
    this one."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    order.flags.writeable = False
    return order


class GlobalBatches:
    """The sample indices of every global batch, counted over all epochs: what every worker,
    and Herald's scheduler, read alike."""

    def __init__(self, samples, size, shuffle, seed, partial_last):
        self.samples, self.size, self.shuffle, self.seed = samples, size, shuffle, seed
        # A last, partial batch (drop_last=False).
        self.batch_num = samples // size + (1 if partial_last and samples % size else 0)

    def epoch_order(self, epoch):
        return _epoch_order(self.seed, epoch, self.samples) if self.shuffle else None

    def indices(self, step):
        epoch, t = divmod(step, self.batch_num)
        begin = t * self.size
        idx = np.arange(begin, min(begin + self.size, self.samples), dtype=np.int64)
        order = self.epoch_order(epoch)
        return idx if order is None else order[idx]


class SamplePlan:
    """Which samples of each global batch this worker trains."""
    # Whether samples() are always ascending and adjacent positions (a batch is then read as one
    # block where the order is the stored one).
    in_order = False

    def samples(self, step):
        """Positions within global batch `step` (an index array or a slice)."""
        raise NotImplementedError


class WorkerSlice(SamplePlan):
    """Without a scheduler: worker `rank` takes slice `rank` of every global batch."""
    in_order = True

    def __init__(self, rank, batch_size):
        self.slice = slice(rank * batch_size, (rank + 1) * batch_size)

    def samples(self, step):
        return self.slice


class Dataloader:
    def __init__(self, data, batch_size, name="default", drop_last=True, shuffle=False, seed=0, prefetch=2,
                 check=None, columns=None):
        """`check(batch, rows)`, if given, sees every batch read and the rows of `data` it holds,
        and raises on bad values (hetu.data.DatasetPart.checker). `columns(step, rows, batch)`, if
        given, returns the batch with columns appended that are computed from the global step and
        the samples' rows of `data` (a sequence model's negatives, hetu.data.sequences): a pure
        function of them, so every worker and every mode reads the same values for a sample."""
        if batch_size <= 0:
            raise ValueError(f"Dataloader {name!r}: batch_size must be positive, got {batch_size}")
        self.data = data
        self.batch_size = int(batch_size)
        self.name = name
        self.drop_last = drop_last
        self.shuffle = shuffle
        self.seed = seed
        self.prefetch = max(0, int(prefetch))
        self.check = check
        self.columns = columns
        self._columns_shape = None
        self.rank, self.num_workers = 0, 1
        self.plan = WorkerSlice(0, self.batch_size)
        self.host_allocator = None   # set_host_allocator
        self._ring = {}
        self._cursor = 0
        self._pending = collections.deque()
        self._pool = None

    # --- configuration by the executor and its passes ----------------------------------------
    def set_worker(self, rank, num_workers):
        """This process is worker `rank` of `num_workers`: it reads its slice of each global batch."""
        self.rank, self.num_workers = int(rank), int(num_workers)
        if isinstance(self.plan, WorkerSlice):   # a scheduler's plan stays
            self.plan = WorkerSlice(self.rank, self.batch_size)
        self._reset()

    def set_host_allocator(self, allocate):
        """Batches are read into host memory from allocate(nbytes) -> uint8 array (a GPU executor
        gives page-locked memory, from which the device copies them without another host copy):
        a ring of buffers, one per batch that can be alive at once (prefetched, current, and the
        one whose copy to the device may still run)."""
        self.host_allocator = allocate
        self._ring = {}

    def _host_batch(self, step, rows):
        if self.host_allocator is None:
            return None
        shape = (rows,) + self.sample_shape
        nbytes = int(np.prod(shape)) * self.dtype.itemsize
        slot = step % (self.prefetch + 3)
        buf = self._ring.get(slot)
        if buf is None or buf.size < nbytes:
            buf = self._ring[slot] = self.host_allocator(max(nbytes, 1))
        return buf[:nbytes].view(self.dtype).reshape(shape)

    def set_plan(self, plan):
        """The SamplePlan that says which samples of each global batch this worker takes."""
        self.plan = plan
        self._reset()

    # --- shape and length --------------------------------------------------------------------
    @property
    def global_batch(self):
        return self.batch_size * self.num_workers

    @property
    def batches(self):
        return GlobalBatches(len(self.data), self.global_batch, self.shuffle, self.seed,
                             partial_last=not self.drop_last)

    @property
    def batch_num(self):
        return self.batches.batch_num

    @property
    def sample_shape(self):
        if self.columns is None:
            return tuple(self.data.shape[1:])
        if self._columns_shape is None:   # asked for every batch on a GPU: a sample's columns drawn once
            self._columns_shape = tuple(self.columns(0, np.zeros(1, np.int64), np.asarray(self.data[:1])).shape[1:])
        return self._columns_shape

    @property
    def dtype(self):
        return np.dtype(self.data.dtype)

    # --- batches -------------------------------------------------------------------------------
    def epoch_order(self, epoch):
        return self.batches.epoch_order(epoch)

    def indices(self, step):
        batch = self.batches.indices(step)
        if len(batch) < self.global_batch and isinstance(self.plan, WorkerSlice):
            # The partial last batch: worker w of W takes part w of W as even parts (a scheduler
            # plans full batches only: it reads the training split, which drops its tail).
            n, w, workers = len(batch), self.rank, self.num_workers
            return batch[n * w // workers:n * (w + 1) // workers]
        return batch[self.plan.samples(step)]

    def global_rows(self, step):
        """The rows of every worker's samples of global batch `step` (a dynamic table's directory
        takes the whole global batch's keys)."""
        idx = self.batches.indices(step)
        batch = self.data[idx]
        return batch if self.columns is None else self.columns(step, idx, batch)

    def load(self, step):
        idx = self.indices(step)
        if self.columns is not None:
            return self._with_columns(step, idx)
        out = self._host_batch(step, len(idx))
        contiguous = not self.shuffle and self.plan.in_order and len(idx) and idx[-1] - idx[0] + 1 == len(idx)
        if out is not None:
            if contiguous:
                out[...] = self.data[idx[0]:idx[-1] + 1]
            else:
                np.take(self.data, idx, axis=0, out=out)
            batch = out
        elif contiguous:
            batch = np.ascontiguousarray(self.data[idx[0]:idx[-1] + 1])
        else:
            batch = np.ascontiguousarray(self.data[idx])
        if self.check is not None:
            self.check(batch, idx)
        return batch

    def _with_columns(self, step, idx):
        batch = self.columns(step, idx, np.asarray(self.data[idx]))
        if self.check is not None:
            self.check(batch, idx)
        out = self._host_batch(step, len(idx))
        if out is None:
            return np.ascontiguousarray(batch)
        out[...] = batch
        return out

    @property
    def position(self):
        """Batches read so far (counted over all epochs): where a checkpoint resumes."""
        return self._cursor

    def seek(self, step):
        """The next batch read is global batch `step` (a run resumed from a checkpoint)."""
        if step < 0:
            raise ValueError(f"Dataloader {self.name!r}: cannot seek to batch {step}")
        self._reset()
        self._cursor = int(step)

    def _reset(self):
        # Batches already submitted to the prefetch thread are dropped unread.
        self._cursor = 0
        self._pending.clear()

    def next_batch(self):
        batch = self.peek()
        if self._pending:
            self._pending.popleft()
        self._cursor += 1
        return batch

    def peek(self):
        """The batch that the next call of next_batch returns (an embedding cache prefetches its
        rows while the current step runs)."""
        if self.batch_num == 0:
            raise ValueError(f"Dataloader {self.name!r}: {len(self.data)} samples make no global batch of "
                             f"{self.global_batch} ({self.num_workers} workers x {self.batch_size})")
        if self.prefetch == 0:
            return self.load(self._cursor)
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"prefetch-{self.name}")
        while len(self._pending) <= self.prefetch:
            step = self._cursor + len(self._pending)
            self._pending.append(self._pool.submit(self.load, step))
        return self._pending[0].result()

    def peek_ready(self):
        """The next batch if it can be had without waiting on data (a hint's look-ahead must never
        hold training up); an in-memory split always can."""
        return self.peek()

    def global_rows_ready(self, step):
        """global_rows(step) if it can be had without waiting on data, else None."""
        return self.global_rows(step)


def _step_and_rows(loader, step):
    return step, np.asarray(loader.indices(step), np.int64)


class DataloaderOp(Op):
    """Feeds itself: in subgraph `name` it yields the next batch of that subgraph's dataloader
    (a host array; on a GPU the executor copies it to the device, hetu.device_step)."""
    capturable = False

    def __init__(self, dataloaders):
        super().__init__()
        self.dataloaders = {}
        for d in dataloaders:
            if not isinstance(d, Dataloader):
                array, batch_size, name = d[:3]
                d = Dataloader(array, batch_size, name)
            self.dataloaders[d.name] = d

    def loader(self, subgraph):
        try:
            return self.dataloaders[subgraph]
        except KeyError:
            raise KeyError(f"{self.name} has no dataloader for subgraph {subgraph!r} "
                           f"(it has {sorted(self.dataloaders)})") from None

    def shape_for(self, subgraph):
        d = self.loader(subgraph)
        return (d.batch_size,) + d.sample_shape

    def dtype_for(self, subgraph):
        return self.loader(subgraph).dtype

    def infer_shape(self, s):
        return None

    keys = None   # hetu.dynamic.TableKeys where the batches are a dynamic table's keys (bind_dynamic)

    def compute(self, vals, state):
        loader = self.loader(state.subgraph)
        # The step's global batch and this worker's samples in it (rows of the data), read when
        # asked: what per-sample random draws (dropout masks, DropoutOp) are keyed by, so that
        # they do not depend on the worker count or on which worker trains a sample.
        state.batch_samples = functools.partial(_step_and_rows, loader, loader.position)
        if self.keys is None:
            return loader.next_batch()
        # A dynamic table's keys become slots: in training, after the directory takes the step's
        # whole global batch (every worker reads it, so every replica decides alike).
        step = loader.position
        batch = loader.next_batch()
        if not state.training:
            return self.keys.lookup(batch)
        slots = self.keys.train(step, functools.partial(loader.global_rows, step), batch)
        # The next step's decisions, taken on a thread while this one trains (taken back if a
        # validation or a checkpoint reads the directory first): when its batch is at hand.
        if STEP_AHEAD:
            following = loader.global_rows_ready(step + 1)
            if following is not None:
                self.keys.step_ahead(step + 1, following)
        return slots

    # Checkpoints: the batch each subgraph's loader reads next, and the global batches, which a
    # resumed run must keep.
    def state(self):
        return {name: d.position for name, d in self.dataloaders.items()}

    def restore(self, positions):
        for name, position in positions.items():
            self.dataloaders[name].seek(position)

    def global_batches(self):
        return {name: d.global_batch for name, d in self.dataloaders.items()}

    def gradient(self, g):
        return []


def dataloader_op(dataloaders):
    """Hetu's form: ht.dataloader_op([[array, batch_size, 'train'], [array, batch_size, 'validate']])."""
    return DataloaderOp(dataloaders)
