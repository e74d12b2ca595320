"""Training on a stream (docs/design.md section 14): the dataloaders over a
hetu.data.stream.StreamSource and the progressive validation windows.

Global batch t of a stream is its samples [t*W*b, (t+1)*W*b) in stream order, as it is of a
prepared folder in stored order. Every worker reads the whole stream itself (as Herald's planners
and the dynamic tables' directories read every global batch) into one StreamFeed, which keeps each
global batch from its arrival until every loader has read it; the dense, sparse and label
StreamLoaders are views of it with the Dataloader interface that DataloaderOp, the passes and
Herald's scheduler use. A stream has no length: `batch_num` is None, and the training loop asks the
feed before each step whether the step's batch is there (`StreamFeed.all_ready`).

The end of a stream is decided collectively: before a step every worker waits for the global
batch it needs (the one to train, and the next one with Herald, whose plan of a batch depends on
the batch after it), at most `idle_exit` seconds without a new sample, and the workers then take
the minimum of "I have it" (one small allreduce a step). So they stop after the same step even
though their clocks and reads differ; samples of the incomplete last global batch are read but
not trained, and reported so."""
import csv
import os
import threading
import time

import numpy as np

from . import metrics
from .dataloader import Dataloader, WorkerSlice
from .launch import progress

# How long one read of the source waits before the feed looks at its idle clock again.
POLL_SECONDS = 0.05
# Global batches kept behind the oldest one a loader still reads (the windows read the arrival
# times of the batch just trained).
KEEP_BEHIND = 2


class StreamBatch:
    """One complete global batch of a stream: numpy arrays, one row per sample in stream order."""
    __slots__ = ("dense", "sparse", "labels", "arrival", "position")

    def __init__(self, blocks):
        for name in ("dense", "sparse", "labels", "arrival"):
            setattr(self, name, np.concatenate([getattr(b, name) for b in blocks]))
        # The stream's position after the batch's last sample (a block never crosses a batch's
        # end: the feed reads at most what the batch still lacks).
        self.position = blocks[-1].position


class StreamFeed:
    """The global batches of `source` (a StreamSource) of `global_batch` samples as they arrive.
    `idle_exit`: seconds of waiting without a new sample after which a batch counts as not coming
    (None: wait until it comes or the source ends)."""

    def __init__(self, source, global_batch, idle_exit=None):
        self.source, self.size, self.idle_exit = source, int(global_batch), idle_exit
        self.fields = source.fields
        self.first = 0                 # the global batch the source's next samples belong to
        self.samples_read = 0          # samples read from the source, counted from batch `first`
        self._batches = {}             # t -> StreamBatch
        self._next = 0                 # the global batch being assembled
        self._tail, self._tail_rows = [], 0
        self._end = None               # the first global batch that will not come (all_ready said so)
        self._loaders = []
        self._lock = threading.RLock()   # the training thread and Herald's submissions

    batch_num = None   # unknown: a stream ends when its data stop (the loop asks all_ready)

    def resize(self, global_batch):
        """Global batches of `global_batch` samples (the workers are known once the executor
        distributes the graph: StreamLoader.set_worker)."""
        with self._lock:
            if int(global_batch) != self.size and (self.samples_read or self._batches):
                raise RuntimeError(f"stream: global batch {self.size} cannot become {global_batch} after reading")
            self.size = int(global_batch)

    def start_at(self, step):
        """The source's next sample is the first of global batch `step` (a run resumed from a
        checkpoint, whose source was positioned after the last trained batch)."""
        with self._lock:
            if self.samples_read or self._batches or self._tail_rows:
                raise RuntimeError(f"stream: cannot start at global batch {step} after reading samples")
            self.first = self._next = int(step)

    # --- arrival -------------------------------------------------------------------------------------
    def ready(self, t, timeout, idle=False):
        """Whether global batch t is complete, reading the source until it is, for at most
        `timeout` seconds without a new sample (None: without limit; 0: what is there now).
        `idle`: the timeout counts only while the source has no data to read (an idle limit: the
        files listed and not yet read are waited for however long they take)."""
        with self._lock:
            if t < self.first:
                raise ValueError(f"stream: global batch {t} comes before the first read, {self.first}")
            if t in self._batches or t < self._next:
                return True
            if self._end is not None and t >= self._end:
                return False
            quiet_since = time.monotonic()
            with progress.waiting("data"):   # no stall for --stall-timeout
                while self._next <= t:
                    wait = POLL_SECONDS if timeout is None else \
                        min(POLL_SECONDS, max(0.0, quiet_since + timeout - time.monotonic()))
                    block = self.source.read(self.size - self._tail_rows, wait)
                    if block is None or not len(block.labels):
                        if self._source_ended():
                            return False
                        if idle and not getattr(self.source, "idle", True):
                            quiet_since = time.monotonic()   # data is there, being read
                        elif timeout is not None and time.monotonic() - quiet_since >= timeout:
                            return False
                        continue
                    quiet_since = time.monotonic()
                    self._take(block)
            return True

    def _source_ended(self):
        # A source that can end (standard input at its end) says so; a directory never ends.
        ended = getattr(self.source, "ended", False)
        return bool(ended() if callable(ended) else ended)

    def _take(self, block):
        rows = len(block.labels)
        self.samples_read += rows
        self._tail.append(block)
        self._tail_rows += rows
        if self._tail_rows >= self.size:
            if self._tail_rows > self.size:
                raise RuntimeError(f"stream: the source returned {self._tail_rows - self.size + rows} samples "
                                   f"for a read of at most {self.size - self._tail_rows + rows}")
            self._batches[self._next] = StreamBatch(self._tail)
            self._next += 1
            self._tail, self._tail_rows = [], 0

    def all_ready(self, t, comm=None):
        """Whether every worker has global batch t (waiting up to the idle limit): the same answer
        on every worker (an allreduce over `comm`, hetu.dist's communicator). Once one is not
        there, the stream ends before it: later batches are not there either, and Herald's planner
        is handed a batch of no rows in its place (`global_rows`)."""
        have = self.ready(t, self.idle_exit, idle=True)
        if comm is not None and comm.size > 1:
            have = bool(comm.comm.allreduce(int(have), op=comm.MPI.MIN))
        if not have:
            with self._lock:
                self._end = t if self._end is None else min(self._end, t)
        return have

    @property
    def end(self):
        """The first global batch that did not come (None while the stream goes on)."""
        return self._end

    # --- reading ---------------------------------------------------------------------------------------
    def batch(self, t):
        """Global batch t, waiting for it; an error where the stream ended before it."""
        if not self.ready(t, None if self._end is None else 0):
            raise RuntimeError(f"stream: global batch {t} was read after the stream's end (batch {self._end})")
        with self._lock:
            try:
                return self._batches[t]
            except KeyError:
                raise RuntimeError(f"stream: global batch {t} is no longer kept (the loaders are at "
                                   f"{[d.position for d in self._loaders]})") from None

    def global_rows(self, t, wait=True):
        """The sparse rows (keys) of global batch t, for Herald's planner: None if `wait` is false
        and the batch has not come yet; past the stream's end, a batch of keys without rows (-1),
        which the planner plans as reading nothing: the plan of the last batch trained is then
        final (its write-backs are left to the end's flush)."""
        with self._lock:
            if self._end is not None and t >= self._end:
                return np.full((self.size, sum(self.fields.slots)), -1, np.int64)
            if not self.ready(t, None if wait else 0):
                if wait:
                    raise RuntimeError(f"stream: global batch {t} did not come")
                return None
            return self.batch(t).sparse

    def position_after(self, t):
        """The source's position after global batch t's last sample (a checkpoint after step t
        resumes there)."""
        return self.batch(t).position

    def attach(self, loader):
        self._loaders.append(loader)

    def release(self):
        """Drops the batches every loader has read (but the last KEEP_BEHIND)."""
        with self._lock:
            if not self._loaders:
                return
            oldest = min(d.position for d in self._loaders) - KEEP_BEHIND
            for t in [t for t in self._batches if t < oldest]:
                del self._batches[t]

    @property
    def pending_samples(self):
        """Samples read but in no complete batch, plus those of complete batches past the end."""
        complete_past = self._next - (self._end if self._end is not None else self._next)
        return self._tail_rows + max(0, complete_past) * self.size


class StreamLoader(Dataloader):
    """One kind of a stream's arrays ("dense", "sparse" or "labels"), with the Dataloader
    interface: batch t is this worker's samples of global batch t (its slice, or the samples
    Herald's scheduler allocates to it)."""

    def __init__(self, feed, kind, batch_size, name="train"):
        super().__init__(None, batch_size, name=name, prefetch=0)
        if kind not in ("dense", "sparse", "labels"):
            raise ValueError(f"StreamLoader: kind {kind!r} is none of dense, sparse, labels")
        self.feed, self.kind = feed, kind
        feed.attach(self)

    def set_worker(self, rank, num_workers):
        super().set_worker(rank, num_workers)
        self.feed.resize(self.global_batch)

    @property
    def batches(self):
        return self.feed

    @property
    def batch_num(self):
        return None

    @property
    def sample_shape(self):
        f = self.feed.fields
        return {"dense": (f.num_dense,), "sparse": (sum(f.slots),), "labels": (1,)}[self.kind]

    @property
    def dtype(self):
        return np.dtype(np.int64 if self.kind == "sparse" else np.float32)

    def epoch_order(self, epoch):
        return None

    def indices(self, step):
        """Positions within global batch `step` of this worker's samples."""
        positions = self.plan.samples(step)
        if isinstance(positions, slice):
            return np.arange(self.global_batch, dtype=np.int64)[positions]
        return np.asarray(positions, np.int64)

    def sample_indices(self, step):
        """The stream indices (samples since the stream's start) of this worker's samples of step."""
        return step * self.global_batch + self.indices(step)

    def global_rows(self, step):
        return self.feed.batch(step).sparse

    def global_rows_ready(self, step):
        """The sparse rows of global batch `step` if the stream already holds them, else None."""
        return self.feed.batch(step).sparse if self.feed.ready(step, 0) else None

    def load(self, step):
        values = getattr(self.feed.batch(step), self.kind)
        positions = self.plan.samples(step) if isinstance(self.plan, WorkerSlice) else self.indices(step)
        part = values[positions]
        out = self._host_batch(step, len(part))
        if out is None:
            return np.ascontiguousarray(part)
        out[...] = part
        return out

    def next_batch(self):
        batch = self.load(self._cursor)
        self._cursor += 1
        self.feed.release()
        return batch

    def peek(self):
        return self.load(self._cursor)

    def peek_ready(self):
        """The next batch if the stream already holds it (reading what has landed, never waiting),
        else None."""
        return self.load(self._cursor) if self.feed.ready(self._cursor, 0) else None

    def seek(self, step):
        super().seek(step)
        if not self.feed.samples_read:
            self.feed.start_at(step)


def stream_loaders(feed, batch_size):
    """Dense (None without dense features), sparse and label loaders of the training subgraph."""
    dense = StreamLoader(feed, "dense", batch_size) if feed.fields.num_dense else None
    return dense, StreamLoader(feed, "sparse", batch_size), StreamLoader(feed, "labels", batch_size)


# --- progressive validation ---------------------------------------------------------------------------
class ProgressiveValidation:
    """Windows of `window` samples of the stream: the AUC and logloss of the predictions the
    samples got in the forward pass that trained them (before the update), over every worker's
    samples, and the lag from the arrival of the window's last sample to the end of the step that
    trained it. Every worker calls add() after each step and finish() at the end; worker 0 prints
    `window <k>: samples <a>-<b>, auc <x>, logloss <y>, lag <s> s` and writes the rows to `csv_path`
    and, given a writer (tensorboard_writer), as TensorBoard scalars."""

    def __init__(self, window, feed, comm=None, rank=0, csv_path=None, tensorboard=None, first_sample=0):
        if window < 1:
            raise ValueError(f"progressive validation: a window of {window} samples")
        self.window, self.feed, self.comm, self.rank = int(window), feed, comm, rank
        self.csv_path, self.tensorboard = csv_path, tensorboard
        self.rows = []
        self._next_window = first_sample // self.window
        self._first = first_sample     # samples before it were trained by an earlier run
        self._index, self._pred, self._label = [], [], []
        self._last_lag = None
        if csv_path and rank == 0:
            with open(csv_path + ".tmp", "w", newline="") as f:
                csv.writer(f).writerow(["window", "first_sample", "last_sample", "samples", "auc", "logloss",
                                        "lag_seconds"])
            os.replace(csv_path + ".tmp", csv_path)

    def add(self, step, sample_indices, predictions, labels):
        """After training step `step`: this worker's samples (stream indices) and their predictions.
        Every worker calls it after every step: a window closes at the same step on all of them."""
        self._index.append(np.asarray(sample_indices, np.int64).reshape(-1))
        self._pred.append(np.asarray(predictions, np.float64).reshape(-1))
        self._label.append(np.asarray(labels, np.float64).reshape(-1))
        begin, end = step * self.feed.size, (step + 1) * self.feed.size
        done, arrival = time.time(), self.feed.batch(step).arrival
        self._last_lag = done - float(arrival[-1])
        closing = []
        # A window closes with the batch that holds its last sample.
        while (self._next_window + 1) * self.window <= end:
            last = (self._next_window + 1) * self.window - 1
            closing.append((self._next_window, last, done - float(arrival[last - begin])))
            self._next_window += 1
        if closing:
            self._close(closing)

    def finish(self):
        """At the end (every worker): the last, partial window of the samples trained, if any."""
        trained = self._gather(self._local()[0])
        if len(trained):
            self._close([(self._next_window, int(trained.max()), self._last_lag)])

    def _local(self):
        if not self._index:
            return np.empty(0, np.int64), np.empty(0), np.empty(0)
        return tuple(np.concatenate(x) for x in (self._index, self._pred, self._label))

    def _gather(self, array):
        if self.comm is not None and self.comm.size > 1:
            return self.comm.allgather_array(array)
        return array

    def _close(self, closing):
        index, pred, label = (self._gather(x) for x in self._local())
        for k, last, lag in closing:
            first = max(k * self.window, self._first)
            mask = (index >= first) & (index <= last)
            # In stream order: the metrics do not depend on which worker trained a sample.
            order = np.argsort(index[mask], kind="stable")
            p, y = pred[mask][order], label[mask][order]
            row = {"window": k, "first_sample": first, "last_sample": int(last), "samples": int(mask.sum()),
                   "auc": metrics.auc(y, p), "logloss": metrics.logloss(y, p), "lag_seconds": lag}
            self.rows.append(row)
            if self.rank == 0:
                self._report(row)
        # This worker keeps its samples of the windows not closed yet.
        index, pred, label = self._local()
        keep = index >= self._next_window * self.window
        self._index, self._pred, self._label = [index[keep]], [pred[keep]], [label[keep]]

    def _report(self, row):
        lag = "-" if row["lag_seconds"] is None else f"{row['lag_seconds']:.3f}"
        print(f"window {row['window']}: samples {row['first_sample']}-{row['last_sample']}, auc {row['auc']:.4f}, "
              f"logloss {row['logloss']:.4f}, lag {lag} s", flush=True)
        if self.csv_path:
            with open(self.csv_path, "a", newline="") as f:
                csv.writer(f).writerow([row[k] if row[k] is not None else "" for k in
                                        ("window", "first_sample", "last_sample", "samples", "auc", "logloss",
                                         "lag_seconds")])
        if self.tensorboard is not None:
            step = row["last_sample"] + 1   # samples trained through the window
            self.tensorboard.add_scalar("stream/auc", row["auc"], step)
            self.tensorboard.add_scalar("stream/logloss", row["logloss"], step)
            if row["lag_seconds"] is not None:
                self.tensorboard.add_scalar("stream/lag_seconds", row["lag_seconds"], step)
            self.tensorboard.flush()


def tensorboard_writer(logdir):
    """A TensorBoard event writer of `logdir` (tensorboardX, else torch.utils.tensorboard)."""
    try:
        from tensorboardX import SummaryWriter
    except ImportError:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise RuntimeError("--tensorboard needs tensorboardX (pip install tensorboardX; "
                               "scripts/install_deps.sh installs it) or PyTorch") from None
    return SummaryWriter(logdir)
