"""How far Herald's co-locating allocation is from the best allocation of one global batch.

The planner (hetu._C.Planner, as every worker runs it) plans `--warm` iterations of the
synthetic Criteo-shaped data, so that the caches hold what they would hold by then. For the next
global batch, the rows its allocation would move in that iteration (hetu._C.estimated_rows: the
allocator's own count of pulls, gradient pushes and write-backs of section 7's plan) are compared
for plain slices, the co-locating allocation, and the best allocation that simulated annealing
finds in `--seconds` seconds, starting from the co-locating one and swapping samples between
workers (loads stay b each).

    python bench/allocator_search.py                       # W = 2 and 4, b = 256, 60 s each
    python bench/allocator_search.py --workers 2 --batch 1024 --seconds 120

This is one iteration's count: it says nothing of what an allocation leaves in the caches for
the next iterations.
"""
import argparse
import math
import time

import numpy as np

from hetu import _C
from planner_offline import check_enough_samples, sample_stream


def row_cost(readers, valid):
    """RowCost of src/herald/row_cost.h, for one row."""
    n = bin(readers).count("1")
    if n == 0:
        return 0
    cost = bin(readers & ~valid).count("1") + (n if n >= 2 else 0)
    if valid != readers and valid != 0 and valid & (valid - 1) == 0:
        cost += 1
    return cost


class Annealer:
    """Swaps two samples of different workers; keeps the swap if it moves fewer rows, or with
    probability exp(-increase / temperature)."""

    def __init__(self, rows, valid, workers, assignment, seed):
        self.rows, self.valid, self.W = rows, [int(v) for v in valid], workers
        self.assign = assignment.copy()
        self.count = np.zeros((len(valid), workers), np.int32)  # samples of each worker per row
        for s, worker in enumerate(self.assign):
            np.add.at(self.count[:, worker], rows[s], 1)
        self.rng = np.random.default_rng(seed)

    def _cost(self, affected):
        total = 0
        for r in affected:
            readers = sum(1 << w for w in range(self.W) if self.count[r, w] > 0)
            total += row_cost(readers, self.valid[r])
        return total

    def _move(self, s, src, dst):
        for r in self.rows[s]:
            self.count[r, src] -= 1
            self.count[r, dst] += 1

    def run(self, seconds, start_cost):
        cost = best = start_cost
        best_assign, temperature, tried = self.assign.copy(), 0.6, 0
        deadline = time.monotonic() + seconds
        n = len(self.assign)
        while time.monotonic() < deadline:
            s, t = self.rng.integers(0, n, 2)
            a, b = self.assign[s], self.assign[t]
            if a == b:
                continue
            tried += 1
            affected = set(self.rows[s]) | set(self.rows[t])
            before = self._cost(affected)
            self._move(s, a, b)
            self._move(t, b, a)
            change = self._cost(affected) - before
            if change <= 0 or self.rng.random() < math.exp(-change / temperature):
                self.assign[s], self.assign[t] = b, a
                cost += change
                if cost < best:
                    best, best_assign = cost, self.assign.copy()
            else:
                self._move(s, b, a)
                self._move(t, a, b)
            temperature = max(0.05, temperature * 0.99997)
        return best, best_assign, tried


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--batch", type=int, nargs="+", default=[256], help="per-worker batch")
    p.add_argument("--ratio", type=float, default=0.1, help="cache rows / table rows")
    p.add_argument("--warm", type=int, default=60, help="iterations planned before the one searched")
    p.add_argument("--seconds", type=float, default=60, help="search time per configuration")
    p.add_argument("--rows", type=int, default=200000, help="synthetic samples")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    data, sparse, order = sample_stream("synthetic-criteo", args.rows, args.seed)
    capacity = int(args.ratio * data.meta.num_embeddings)
    print(f"{data.meta.name}: cache ratio {args.ratio}, iteration {args.warm} after {args.warm} planned; "
          "rows that iteration moves, all workers")
    header = f"{'W':>2} {'b':>5} {'plain slices':>13} {'colocate':>9} {'annealed':>9} {'annealed/colocate':>18} {'swaps tried':>12}"
    print(header)
    print("-" * len(header), flush=True)
    for workers in args.workers:
        for batch in args.batch:
            check_enough_samples(sparse, args.warm + 1, workers, batch, args.rows)
            planner = _C.Planner(workers, 0, batch, "lru", capacity, allocator="colocate")
            for t in range(args.warm + 1):
                ids = np.ascontiguousarray(sparse[order[t * workers * batch:(t + 1) * workers * batch]], np.int64)
                if t < args.warm:
                    planner.advance(ids, t)
            distinct, rows = np.unique(ids, return_inverse=True)
            rows = np.ascontiguousarray(rows.reshape(ids.shape), np.int32)
            valid = planner.valid_masks(distinct)
            colocate = _C.colocate_allocate(rows, valid, workers, batch, args.warm)
            plain = np.repeat(np.arange(workers, dtype=np.int32), batch)
            colocate_rows = _C.estimated_rows(rows, valid, workers, colocate)
            best, best_assign, tried = Annealer(rows, valid, workers, colocate, args.seed).run(args.seconds, colocate_rows)
            assert _C.estimated_rows(rows, valid, workers, np.asarray(best_assign, np.int32)) == best
            print(f"{workers:>2} {batch:>5} {_C.estimated_rows(rows, valid, workers, plain):>13,} {colocate_rows:>9,} "
                  f"{best:>9,} {best / colocate_rows:>18.3f} {tried:>12,}", flush=True)


if __name__ == "__main__":
    main()
