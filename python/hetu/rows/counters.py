"""Per-iteration transmission counters (docs/design.md section 7): rows and bytes each way, cache
hits / misses / evictions / stale refreshes, rows whose pull was sent during the previous step
(prefetched), scheduler time, time waiting for its plan, and where the training step's wall
time goes: getting the embedding rows (pull_seconds), sending their gradients (push_seconds,
the device sum included), summing the dense gradients (dense_sync_seconds: AllReduce, or the
PS push-pull), and the whole step. Herald's plan wait lies within pull_seconds, or within
push_seconds where the next step's pull is sent with this step's push (--prefetch).

What happens between training steps (a flush before validation, the lookups of validation) is
counted in the next step's row; what comes after the last step (the final flush) in a last row
whose iteration is "end", so the rows of the CSV add up to `totals()`."""
import collections
import csv
import os

FIELDS = ("rows_pulled", "rows_pushed", "bytes_pulled", "bytes_pushed", "hits", "misses", "evictions",
          "stale_refreshes", "rows_prefetched", "scheduler_seconds", "plan_wait_seconds", "pull_seconds",
          "push_seconds", "dense_sync_seconds", "step_seconds")


class Counters:
    def __init__(self):
        self.rows = []                                    # one dict per iteration
        self.current = collections.Counter()

    def add(self, **amounts):
        self.current.update(amounts)

    def _current_row(self, iteration):
        return {"iteration": iteration, **{f: self.current.get(f, 0) for f in FIELDS}}

    def end_iteration(self, iteration):
        row = self._current_row(iteration)
        self.rows.append(row)
        self.current = collections.Counter()
        return row

    def totals(self):
        total = collections.Counter()
        for row in self.rows:
            total.update({f: row[f] for f in FIELDS})
        total.update(self.current)
        return {f: total.get(f, 0) for f in FIELDS}

    def summary_line(self, label="embedding"):
        t = self.totals()
        n = max(1, len(self.rows))
        lookups = t["hits"] + t["misses"]
        hit_rate = t["hits"] / lookups if lookups else float("nan")
        return (f"{label} transmissions: {t['rows_pulled'] + t['rows_pushed']} rows "
                f"({t['rows_pulled']} pulled, {t['rows_pushed']} pushed; "
                f"{(t['rows_pulled'] + t['rows_pushed']) / n:.1f} per iteration), "
                f"{(t['bytes_pulled'] + t['bytes_pushed']) / 2**20:.1f} MiB, hit rate {hit_rate:.3f}, "
                f"{t['evictions']} evictions, {t['stale_refreshes']} stale refreshes over {len(self.rows)} iterations")

    def write_csv(self, path):
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        tmp = path + ".tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=("iteration",) + FIELDS)
            writer.writeheader()
            writer.writerows(self.rows)
            if any(self.current.values()):
                writer.writerow(self._current_row("end"))
        os.replace(tmp, path)
