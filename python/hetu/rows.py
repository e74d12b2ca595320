"""RowSource: where a worker's training step gets the rows of an embedding table on the parameter
server, and where their gradients go. Three implement it, one per mode (docs/design.md sections 5-7):

- hetu.dist.ps.RemoteTable: plain PS, every row pulled and pushed each step;
- hetu.cache.CachedTable: HET's cache and its versioned protocol;
- hetu.herald.HeraldTable: a cache that follows Herald's plan.

The PS lookup op and sparse updater (hetu.dist.ps), the executor and hetu.checkpoint use only
what is declared here."""
import abc


class RowSource(abc.ABC):
    """The rows of one table, as one worker reads and updates them. `param`: the table's
    Variable (name, shape); `counters`: the worker's hetu.cache.counters.Counters, which every
    lookup and update adds its rows and bytes to."""
    param = None
    counters = None

    @abc.abstractmethod
    def lookup(self, uniq):
        """float32 [len(uniq), width]: the rows of a training step's distinct ids (int64,
        ascending), as synchronous training reads them at that step."""

    @abc.abstractmethod
    def update(self, uniq, summed, lr):
        """The step's gradient rows of the ids lookup read, summed per id over this worker's
        samples, at learning rate `lr`."""

    @abc.abstractmethod
    def read(self, uniq):
        """The rows as the servers hold them, outside training (validation, after a flush);
        not counted as transmissions."""

    def flush(self, lr):
        """Writes every pending local update to the servers. Every worker calls it at the same
        points (before validation, a checkpoint and the end of training); nothing is pending in
        a source that keeps no rows."""

    def state(self):
        """What a checkpoint records of this source (JSON), beside the rows the servers write:
        nothing, for a cache, which a checkpoint flushes to the servers first."""
        return None

    def restore(self, state, step):
        """Continues from a checkpoint's `state()` at training step `step`, before any lookup."""
