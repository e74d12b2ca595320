"""Plain PS (docs/design.md section 5): every row a step reads is pulled from the servers and
every gradient row pushed; the worker keeps no rows."""
import numpy as np

from . import RowSource


class PlainRows(RowSource):
    """The plain-PS RowSource: the servers' rows, each step. `next_ids` (set by bind_ps where a
    table on disk takes hints and the next batch is known: a dataloader's or a stream's look-ahead)
    gives the next step's rows, or None while they are not known yet; after each push they go to
    the servers as a prefetch hint, which reads them into the servers' caches and changes no row."""
    next_ids = None

    def lookup(self, uniq):
        self.counters.add(rows_pulled=len(uniq), bytes_pulled=len(uniq) * (self.remote.row_bytes + 8),
                          misses=len(uniq))
        return self.remote.pull(uniq)

    def update(self, uniq, summed, lr):
        self.count_push(len(uniq))
        self.remote.push(uniq, summed, lr)
        if self.next_ids is not None:
            ids = self.next_ids()
            if ids is not None:
                ids = np.unique(ids)
                self.remote.prefetch(ids[ids >= 0])
