"""HET's protocol at bound 0 replayed offline on a stream of global batches: the rows each
worker would pull and push, with the real replacement policy (hetu._C.CachePolicy) and a
version per row, no servers and no training. The benches use it to count HET's transmissions
beside Herald's planner (bench/planner_offline.py, bench/rows_breakdown.py); a cluster run
moves exactly these rows (tests/test_cache.py).

Per iteration, every worker's distinct rows go through its policy; a row is pulled unless it
was resident and its local version equals the servers' (no other worker updated it since this
worker last read it); then every worker pushes every row it read, one contribution each, which
its own cached copies and the servers' versions take."""
import numpy as np

from hetu import _C

NEVER = _C.NEVER_VERSION


class HetReplay:
    """W workers' caches of one table of `rows` rows, `capacity` rows each."""

    def __init__(self, workers, rows, capacity, policy="lru", pin_threshold=8):
        self.workers = workers
        self.policies = [_C.CachePolicy(policy, int(min(capacity, rows)), pin_threshold) for _ in range(workers)]
        self.server = np.zeros(rows, np.int64)
        self.local = np.full((workers, rows), NEVER, np.int64)

    def step(self, slices):
        """One iteration: `slices[w]` is worker w's ids (any shape). Returns (pulled, pushed),
        rows per worker."""
        reads = [np.unique(np.asarray(ids, np.int64)) for ids in slices]
        pulled = np.zeros(self.workers, np.int64)
        cached = []
        for w, keys in enumerate(reads):   # every lookup sees the servers after the last iteration
            slots, hit, evicted, _ = self.policies[w].access(keys)
            local = self.local[w]
            local[evicted] = NEVER
            fresh = hit.astype(bool) & (local[keys] == self.server[keys])
            pulled[w] = len(keys) - int(np.count_nonzero(fresh))
            into = slots >= 0
            local[keys[into & ~fresh]] = self.server[keys[into & ~fresh]]
            cached.append(keys[into])
        for w, keys in enumerate(reads):
            self.local[w][cached[w]] += 1
            self.server[keys] += 1
        return pulled, np.array([len(k) for k in reads], np.int64)


def het_rows(sparse, order, workers, batch, capacity, iterations, rows, policy="lru"):
    """Rows pulled plus rows pushed by all workers over `iterations` global batches of
    `workers` x `batch` samples taken from `sparse` in `order`."""
    replay, total = HetReplay(workers, rows, capacity, policy), 0
    for t in range(iterations):
        ids = sparse[order[t * workers * batch:(t + 1) * workers * batch]]
        pulled, pushed = replay.step([ids[w * batch:(w + 1) * batch] for w in range(workers)])
        total += int(pulled.sum() + pushed.sum())
    return total
