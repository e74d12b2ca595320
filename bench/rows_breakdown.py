"""Where Herald's rows go: its planner alone, offline (as planner_offline.py), with each worker's
rows per iteration split by why they move, over the second half of the run (caches warm).

    python bench/rows_breakdown.py                       # W = 2, b = 256, ratio 0.1, 200 iterations
    python bench/rows_breakdown.py --workers 4 --dataset synthetic-avazu

Rows that several workers read in an iteration: a pull for each reader without a valid copy and
a gradient push from each reader (stepped once on the servers). Rows that one worker reads: a pull
if its cache has no valid copy, split by what happened to the row before (never read; this worker
read it last, so its cache evicted it; another worker alone read it last, so that worker writes
it back; several workers read it last), and the write-backs (dirty rows evicted or read
elsewhere next). HET at bound 0 (hetu_tools.het_replay, same policy and capacity) pulls the rows its
cache lacks or another worker updated since it read them, and pushes every distinct row of each
worker's slice.
"""
import argparse
import os
import sys

import numpy as np

from hetu import _C
from hetu_tools.het_replay import HetReplay

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from planner_offline import check_enough_samples, sample_stream  # noqa: E402

FIELDS = [("shared_pulls", "pulls of rows several workers read"),
          ("shared_grads", "gradient pushes of rows several workers read"),
          ("shared_hot", "  of which rows read by 7+ samples of the global batch"),
          ("owner_pulls", "pulls of rows one worker reads"),
          ("first", "  first read in the run"),
          ("evicted", "  this worker read it last (evicted)"),
          ("migrated", "  another worker alone read it last"),
          ("was_shared", "  several workers read it last"),
          ("writebacks", "write-backs"),
          ("het", "HET (bound 0): rows pulled and pushed")]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=256, help="per-worker batch")
    p.add_argument("--ratio", type=float, default=0.1, help="cache rows / table rows")
    p.add_argument("--allocator", default="colocate", choices=["colocate", "greedy", "none"])
    p.add_argument("--iterations", type=int, default=200)
    p.add_argument("--rows", type=int, default=400000, help="synthetic samples")
    p.add_argument("--dataset", default="synthetic-criteo")
    p.add_argument("--seed", type=int, default=0, help="sample order")
    args = p.parse_args()

    W, b = args.workers, args.batch
    data, sparse, order = sample_stream(args.dataset, args.rows, args.seed)
    check_enough_samples(sparse, args.iterations + 1, W, b, args.rows)
    capacity = int(args.ratio * data.meta.num_embeddings)
    planners = [_C.Planner(W, r, b, "lru", capacity, allocator=args.allocator) for r in range(W)]
    last_readers = np.full(data.meta.num_embeddings, -1, np.int64)   # bit mask; -1: never read
    counts = dict.fromkeys((name for name, _ in FIELDS), 0)
    batch_ids = lambda t: np.ascontiguousarray(sparse[order[t * W * b:(t + 1) * W * b]], dtype=np.int64)
    counted_from = args.iterations // 2
    het = HetReplay(W, data.meta.num_embeddings, capacity)
    for t in range(args.iterations + 1):   # plan t - 1 is final once t is allocated
        plans = [planner.advance(batch_ids(t), t)[1] for planner in planners]
        if plans[0] is None:
            continue
        ids = batch_ids(t - 1)
        het_pulled, het_pushed = het.step([ids[w * b:(w + 1) * b] for w in range(W)])
        readers = np.zeros(data.meta.num_embeddings, np.int64)
        for rank, plan in enumerate(plans):
            readers[plan[2]] |= 1 << rank
        if t - 1 >= counted_from:
            distinct, samples_reading = np.unique(ids, return_counts=True)
            for rank, plan in enumerate(plans):
                keys, pull, owner, writeback = plan[2], plan[4].astype(bool), plan[5].astype(bool), plan[7]
                shared = keys[~owner]
                counts["shared_pulls"] += int(np.count_nonzero(pull & ~owner))
                counts["shared_grads"] += len(shared)
                counts["shared_hot"] += int(np.count_nonzero(samples_reading[np.searchsorted(distinct, shared)] >= 7))
                before = last_readers[keys[pull & owner]]
                counts["owner_pulls"] += len(before)
                counts["first"] += int(np.count_nonzero(before == -1))
                counts["evicted"] += int(np.count_nonzero(before == 1 << rank))
                single = (before > 0) & ((before & (before - 1)) == 0)
                counts["migrated"] += int(np.count_nonzero(single & (before != 1 << rank)))
                counts["was_shared"] += int(np.count_nonzero((before > 0) & ~single))
                counts["writebacks"] += len(writeback)
            counts["het"] += int(het_pulled.sum() + het_pushed.sum())
        touched = np.flatnonzero(readers)
        last_readers[touched] = readers[touched]

    per = (args.iterations - counted_from) * W
    herald = counts["shared_pulls"] + counts["shared_grads"] + counts["owner_pulls"] + counts["writebacks"]
    print(f"{data.meta.name}: W = {W}, b = {b}, ratio {args.ratio}, {args.allocator}; rows per worker and "
          f"iteration over iterations {counted_from}-{args.iterations - 1}")
    for name, label in FIELDS:
        print(f"{label:<55}{counts[name] / per:>10.1f}")
    print(f"{'Herald: all its rows':<55}{herald / per:>10.1f}  ({herald / counts['het']:.3f} of HET)")


if __name__ == "__main__":
    main()
