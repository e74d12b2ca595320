"""Plain PS (docs/design.md section 5): every row a step reads is pulled from the servers and
every gradient row pushed; the worker keeps no rows."""
from . import RowSource


class PlainRows(RowSource):
    """The plain-PS RowSource: the servers' rows, each step."""

    def lookup(self, uniq):
        self.counters.add(rows_pulled=len(uniq), bytes_pulled=len(uniq) * (self.remote.row_bytes + 8),
                          misses=len(uniq))
        return self.remote.pull(uniq)

    def update(self, uniq, summed, lr):
        self.count_push(len(uniq))
        self.remote.push(uniq, summed, lr)
