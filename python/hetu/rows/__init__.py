"""Row sources: where a worker's training step gets the rows of an embedding table on the parameter
server, and where their gradients go. Three implement RowSource, one per mode (docs/design.md
sections 5-7), each in front of the table's RemoteTable (servers.py), which sends its messages:

- plain.PlainRows: plain PS, every row pulled and pushed each step;
- het.CachedTable: HET's cache and its versioned protocol;
- herald.HeraldTable: a cache that follows Herald's plan.

The PS lookup op (hetu.ops.embedding), the sparse updater (hetu.updaters), the executor and
hetu.checkpoint use only what RowSource declares. counters.py holds the counters they add to."""
import abc

from ..dynamic import initial_rows


class RowSource(abc.ABC):
    """The rows of one table, as one worker reads and updates them. `remote`: the table's
    RemoteTable; `param`: its Variable (name, shape); `counters`: the worker's Counters (the
    RemoteTable's unless given), which every lookup and update adds its rows and bytes to."""

    def __init__(self, remote, counters=None):
        self.remote, self.param = remote, remote.param
        self.counters = remote.counters if counters is None else counters

    @abc.abstractmethod
    def lookup(self, uniq):
        """float32 [len(uniq), width]: the rows of a training step's distinct ids (int64,
        ascending), as synchronous training reads them at that step."""

    @abc.abstractmethod
    def update(self, uniq, summed, lr):
        """The step's gradient rows of the ids lookup read, summed per id over this worker's
        samples, at learning rate `lr`."""

    def begin_step(self, step, uniq):
        """A dynamic table's step (hetu.dynamic.KeyStep) before the lookup of its distinct slots
        `uniq`: the servers reset the rows of the keys admitted at this step that this worker reads
        (every worker reading one sends it; the servers apply it once, after the step before) to
        the keys' initial rows, which the worker draws (the same function as the servers'): the
        draws spread over the workers instead of queueing on the servers."""
        slots, keys = step.admitted_among(uniq)
        if len(slots):
            self.remote.admit(slots, keys, initial_rows(self.param, keys, self.remote.seed))

    def read(self, uniq):
        """The rows as the servers hold them, outside training (validation, after a flush);
        not counted as transmissions."""
        return self.remote.pull(uniq)

    def flush(self, lr):
        """Writes every pending local update to the servers. Every worker calls it at the same
        points (before validation, a checkpoint and the end of training); nothing is pending in
        a source that keeps no rows."""

    def state(self):
        """What a checkpoint records of this source (JSON), beside the rows the servers write:
        the table's clock, which the loaded table continues. A cache adds nothing: a checkpoint
        flushes it to the servers first, and a resumed cache starts empty."""
        return self.remote.state()

    def restore(self, state, step):
        """Continues from a checkpoint's `state()` at training step `step`, before any lookup."""
        self.remote.restore(state, step)

    def count_push(self, gradients, written_back=0, written_bytes=0):
        """Counts one push: `gradients` summed gradient rows (float32 and a key each) and
        `written_back` rows of `written_bytes` in all."""
        self.counters.add(rows_pushed=gradients + written_back,
                          bytes_pushed=gradients * (self.remote.grad_bytes + 8) + written_bytes)
