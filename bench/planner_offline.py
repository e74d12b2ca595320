"""Herald's planner alone, offline: rows it would move and what it costs, with no cluster.

For each configuration, W planners (hetu._C.Planner, one per rank, as with --planners worker)
plan the same global batches of the synthetic Criteo-shaped data. Rows moved are counted from
the plans as HeraldTable would move them: pulls, gradient pushes of shared rows and write-backs
(no final flush). HET at bound 0 is replayed with the same policy and capacity
(hetu_tools.het_replay): each worker pulls the rows its cache lacks or another worker updated
since it read them, and pushes every distinct row of its slice. Planner time is per plan (one
rank, one iteration), measured here with nothing else running; in a cluster the planner shares
the cores.

With --threads N [N ...] the planners plan on N threads each (hetu._C.Planner(threads=N), as
HETU_PLANNER_THREADS sets in training), one thread count after another: ms per plan at each, the
speed-up against one thread (always measured), and the work of a plan: distinct rows per global
batch and CPU ms per plan (all the planner's threads) at the largest count. A planner per thread
count plans each iteration in turn, so that other jobs on the machine slow them alike, and the
bench checks that their plans are identical.

    python bench/planner_offline.py                              # the README's grid, 40 iterations
    python bench/planner_offline.py --workers 4 --batch 1024 --ratios 0.1 --iterations 200
    python bench/planner_offline.py --dataset DIR --order stored   # a prepared dataset, as stored
    python bench/planner_offline.py --workers 2 4 8 16 --batch 256 1024 4096 --ratios 0.1 \
        --allocators colocate --iterations 3 --rows 300000 --threads 1 2 4 8
    python bench/planner_offline.py --workers 8 16 --batch 1024 --ratios 0.1 \
        --allocators colocate@0 colocate --iterations 40 --rows 700000   # trades over every row, and not

With --host-workers H, what planning costs a host of H workers (fewer if W is smaller) per
iteration: each worker running a planner of its own (H plans, CPU ms from the 1-thread planners
above) against one planner for the host (hetu._C.Planner with the host's ranks, as
`run_laia.py --planners host` runs it): its CPU ms per iteration at 1 thread, and its wall ms per
iteration at each thread count. The host planner's answers must equal the workers' own.
"""
import argparse
import contextlib
import os
import time

import numpy as np

from hetu import _C
from hetu.data import load_dataset
from hetu_tools.het_replay import het_rows


def sample_stream(dataset, rows, seed, stored_order=False):
    """The dataset (synthetic ones made with `rows` samples), its training ids and the order in
    which the global batches take them: a seeded shuffle, or the stored order (the order in
    which the examples' loaders read a dataset)."""
    data = load_dataset(dataset, rows=rows) if dataset.startswith("synthetic-") else load_dataset(dataset)
    sparse = np.asarray(data.train.sparse)
    order = np.arange(len(sparse)) if stored_order else np.random.default_rng(seed).permutation(len(sparse))
    return data, sparse, order


def check_enough_samples(sparse, global_batches, workers, batch, rows):
    if global_batches * workers * batch > len(sparse):
        raise SystemExit(f"--rows {rows} is too few for {global_batches} global batches of {workers} x {batch}")


def ps_rows(sparse, order, workers, batch, iterations):
    """Plain PS: each worker pulls and pushes every distinct row of its slice."""
    total = 0
    for t in range(iterations):
        ids = sparse[order[t * workers * batch:(t + 1) * workers * batch]]
        total += sum(2 * len(np.unique(ids[w * batch:(w + 1) * batch])) for w in range(workers))
    return total


def same_answer(a, b):
    """Two planners' answers to one advance: (samples, finished plan or None)."""
    if (a[1] is None) != (b[1] is None) or not np.array_equal(a[0], b[0]):
        return False
    return a[1] is None or all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))


def global_batches(sparse, order, workers, batch, iterations):
    # plan t is final once t+1 is allocated
    return [np.ascontiguousarray(sparse[order[t * workers * batch:(t + 1) * workers * batch]], dtype=np.int64)
            for t in range(iterations + 1)]


PROFILE_STAGES = ("ids", "scores", "trades", "readers", "workers", "masks")


@contextlib.contextmanager
def allocator_setting(spec):
    """An --allocators entry: a planner allocator, or colocate@N, colocate with the trades leaving
    out the rows more than N samples per worker read (HETU_PLANNER_TRADE_SHARED=N, read at every
    allocation; 0: trades over every row). Yields the allocator's name."""
    name, _, setting = spec.partition("@")
    if not setting:
        yield name
        return
    if name != "colocate" or not setting.isdigit():
        raise SystemExit(f"--allocators {spec}: expected colocate@N, N a count of samples per worker (0: every row)")
    before = os.environ.get("HETU_PLANNER_TRADE_SHARED")
    os.environ["HETU_PLANNER_TRADE_SHARED"] = setting
    try:
        yield name
    finally:
        if before is None:
            del os.environ["HETU_PLANNER_TRADE_SHARED"]
        else:
            os.environ["HETU_PLANNER_TRADE_SHARED"] = before


def herald_rows(sparse, order, workers, batch, capacity, allocator, iterations, threads=(1,), keep_ranks=0,
                pipeline=False):
    """Rows moved by all workers over `iterations`; per thread count, seconds and CPU seconds (all
    of the process's threads) per plan; distinct rows per global batch; the answers of ranks
    below `keep_ranks`, per rank; per thread count, the planners' PlanProfile, seconds per plan by
    stage; with `pipeline`, per thread count, seconds per plan of a pipelined planner (else {}).
    The ranks' planners run one rank after another, as each worker
    runs one. With several thread counts, a planner per count plans each iteration in turn (so
    that a busy machine slows them alike), and their answers must be identical.

    A pipelined planner's batches are prepared by a BatchPreparer of its own (as PlanningThread
    does in training): batch t + 1 is queued as batch t is planned. Its time per iteration runs
    from that until both are done (the longer of the two stages; nothing spills into the other
    planners' turns), and the first batch's preparation alone is counted in its first iteration.
    Each rank's pipelined planners run after its plain ones, in the same way (one per thread
    count, each iteration in turn), so that they do not change the plain planners' times (the
    turns of more planners leave less of each one's state in the CPU's caches)."""
    batches = global_batches(sparse, order, workers, batch, iterations)
    distinct = sum(len(np.unique(ids)) for ids in batches) / len(batches)
    rows, seconds, cpu = 0, dict.fromkeys(threads, 0.0), dict.fromkeys(threads, 0.0)
    piped = dict.fromkeys(threads, 0.0) if pipeline else {}
    kept = {rank: [] for rank in range(min(keep_ranks, workers))}
    profile = {n: dict.fromkeys(PROFILE_STAGES + ("total",), 0.0) for n in threads}
    for rank in range(workers):
        planners = {n: _C.Planner(workers, rank, batch, "lru", capacity, allocator=allocator, threads=n)
                    for n in threads}
        plain = []  # the rank's answers on threads[0]
        for t, ids in enumerate(batches):
            answers = {}
            for n, planner in planners.items():
                start, start_cpu = time.perf_counter(), time.process_time()
                answers[n] = planner.advance(ids, t)
                seconds[n] += time.perf_counter() - start
                cpu[n] += time.process_time() - start_cpu
            _, finished = answer = answers[threads[0]]
            plain.append(answer)
            if rank in kept:
                kept[rank].append(answer)
            for n in threads[1:]:
                if not same_answer(answers[n], answer):
                    raise SystemExit(f"W={workers} b={batch} {allocator}: rank {rank}'s plan of iteration {t} on "
                                     f"{n} threads differs from the one on {threads[0]}")
            if finished is not None:
                _, _, _, _, pull, owner, _, writeback = finished
                rows += int(np.count_nonzero(pull)) + int(np.count_nonzero(~owner.astype(bool))) + len(writeback)
        for n, planner in planners.items():
            for stage, s in planner.profile().items():
                if stage in profile[n]:
                    profile[n][stage] += s
        del planners
        if pipeline:
            took, profiles = pipelined_seconds(workers, rank, batch, capacity, allocator, threads, batches, plain)
            for n, spent in took.items():
                piped[n] += spent
                mine = profile.setdefault(f"{n}+p", dict.fromkeys(PROFILE_STAGES + ("total",), 0.0))
                for stage, stage_seconds in profiles[n].items():
                    if stage in mine:
                        mine[stage] += stage_seconds
    plans = workers * len(batches)
    return (rows, {n: s / plans for n, s in seconds.items()}, {n: c / plans for n, c in cpu.items()}, distinct, kept,
            {n: {stage: s / plans for stage, s in by_stage.items()} for n, by_stage in profile.items()},
            {n: s / plans for n, s in piped.items()})


def pipelined_seconds(workers, rank, batch, capacity, allocator, threads, batches, expected):
    """Per thread count, seconds a pipelined planner of `rank` takes over `batches` (herald_rows),
    and its PlanProfile; its answers must be `expected`, iteration by iteration."""
    planners = {n: _C.Planner(workers, rank, batch, "lru", capacity, allocator=allocator, threads=n)
                for n in threads}
    preparers = {n: _C.BatchPreparer(planner) for n, planner in planners.items()}
    seconds, queued = dict.fromkeys(threads, 0.0), {}
    for t, ids in enumerate(batches):
        for n, planner in planners.items():
            start = time.perf_counter()
            if t == 0:
                queued[n] = preparers[n].prepare(ids)
                queued[n].wait()
            now = queued.pop(n)
            if t + 1 < len(batches):
                queued[n] = preparers[n].prepare(batches[t + 1])
            answer = planner.advance(now, t)
            if n in queued:
                queued[n].wait()
            seconds[n] += time.perf_counter() - start
            if not same_answer(answer, expected[t]):
                raise SystemExit(f"W={workers} b={batch} {allocator}: rank {rank}'s pipelined plan of iteration {t} "
                                 f"on {n} threads differs from the plain one")
    return seconds, {n: planner.profile() for n, planner in planners.items()}


def host_planner_cost(sparse, order, workers, batch, capacity, allocator, iterations, threads, expected):
    """One planner for the ranks of `expected` (a host's workers; their own planners' answers per
    iteration): per thread count, wall seconds per iteration, and CPU seconds per iteration at 1
    thread. Its answers must be the workers' own."""
    ranks = sorted(expected)
    batches = global_batches(sparse, order, workers, batch, iterations)
    seconds, cpu = dict.fromkeys(threads, 0.0), 0.0
    planners = {n: _C.Planner(workers, ranks, batch, "lru", capacity, allocator=allocator, threads=n)
                for n in threads}
    for t, ids in enumerate(batches):
        for n, planner in planners.items():
            start, start_cpu = time.perf_counter(), time.process_time()
            answers = planner.advance_all(ids, t)
            seconds[n] += time.perf_counter() - start
            if n == 1:
                cpu += time.process_time() - start_cpu
            for rank, answer in zip(ranks, answers):
                if not same_answer(answer, expected[rank][t]):
                    raise SystemExit(f"W={workers} b={batch} {allocator}: the host planner's plan of iteration {t} "
                                     f"for rank {rank} ({n} threads) differs from the worker's own")
    return {n: s / len(batches) for n, s in seconds.items()}, cpu / len(batches)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--batch", type=int, nargs="+", default=[256, 1024], help="per-worker batch")
    p.add_argument("--ratios", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    p.add_argument("--allocators", nargs="+", default=["none", "greedy", "colocate"],
                   help="none, greedy, colocate, or colocate@N: colocate with its trades leaving out rows read by "
                        "more than N samples per worker (default 4; colocate@0 trades over every row, as before)")
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--rows", type=int, default=200000, help="synthetic samples")
    p.add_argument("--seed", type=int, default=0, help="sample order (the shuffle's seed)")
    p.add_argument("--order", choices=["shuffled", "stored"], default="shuffled",
                   help="global batches from a seeded shuffle of the training rows (default) or in the "
                        "dataset's stored order, as training reads them (e.g. time order)")
    p.add_argument("--threads", type=int, nargs="+", default=None,
                   help="planner thread counts to time side by side (the speed-up columns are against 1 "
                        "thread, which is always measured); default: one thread, the plain table")
    p.add_argument("--pipeline", action="store_true",
                   help="also time pipelined planners (a BatchPreparer each, as in training: the next batch's "
                        "distinct ids and row lists made on a thread of their own while a batch is planned): "
                        "ms per plan at each thread count, with one thread more in use")
    p.add_argument("--profile", action="store_true",
                   help="also print where a plan's time goes (the planner's PlanProfile): ms per plan by stage, "
                        "a line per configuration, allocator and thread count")
    p.add_argument("--host-workers", type=int, default=0, metavar="H",
                   help="also time one planner for a host of H workers against H planners of their own")
    p.add_argument("--dataset", default="synthetic-criteo",
                   help="synthetic-criteo, synthetic-avazu, synthetic-movielens (each also with -sessions, "
                        "e.g. synthetic-criteo-sessions with --order stored) or a prepared dataset's name")
    args = p.parse_args()

    data, sparse, order = sample_stream(args.dataset, args.rows, args.seed, args.order == "stored")
    table_rows = data.meta.num_embeddings
    if args.threads and min(args.threads) < 1:
        raise SystemExit("--threads: thread counts must be positive")
    if args.host_workers < 0:
        raise SystemExit("--host-workers: a host has at least 1 worker (0: no host columns)")
    threads = sorted(set([1] + args.threads)) if args.threads else [1]
    many = len(threads) > 1
    host = args.host_workers

    pipeline = args.pipeline

    def allocator_columns(a):
        if not many:
            out = f"{a + ' vs HET':>18}{'ms/plan':>9}" + (f"{'ms pipe':>9}" if pipeline else "")
        else:
            out = f"{a + ' vs HET':>18}" + "".join(
                f"{f'ms {t}t':>9}" + (f"{f'x {t}t':>7}" if t > 1 else "") + (f"{f'{t}t+p':>9}" if pipeline else "")
                for t in threads) + f"{f'cpu {threads[-1]}t':>9}"
        if host:
            out += f"{'H':>3}{'H cpu/it':>9}{'1 cpu/it':>9}" + "".join(f"{f'1 ms {t}t':>9}" for t in threads)
        return out

    header = f"{'W':>2} {'b':>5} {'ratio':>5} {'PS rows/it':>11} {'HET rows/it':>12} {'HET vs PS':>9}" + (
        f"{'rows/plan':>10}" if many else "") + "".join(allocator_columns(a) for a in args.allocators)
    print(f"{data.meta.name}: {args.iterations} iterations, {table_rows:,}-row table, {args.order} order, LRU; "
          f"rows moved by all workers" + (f"; planner threads {', '.join(map(str, threads))}: ms per plan, "
                                          f"speed-up against 1 thread, CPU ms per plan at {threads[-1]}" if many else "")
          + ("; pipelined planners: ms per plan, batches prepared on one more thread (ms pipe, Nt+p)"
             if pipeline else "")
          + (f"; a host of H workers (at most {host}) per iteration: CPU ms of H planners of their own (1 thread), "
             f"CPU ms of one planner for the host (1 thread), its ms at each thread count" if host else ""))
    print(header)
    print("-" * len(header), flush=True)
    profiles = []  # (W, b, ratio, allocator, {threads: seconds per plan by stage})
    for workers in args.workers:
        for batch in args.batch:
            check_enough_samples(sparse, args.iterations + 1, workers, batch, args.rows)
            ps = ps_rows(sparse, order, workers, batch, args.iterations)
            for ratio in args.ratios:
                het = het_rows(sparse, order, workers, batch, int(ratio * table_rows), args.iterations, table_rows)
                line = (f"{workers:>2} {batch:>5} {ratio:>5} {ps / args.iterations:>11,.0f} "
                        f"{het / args.iterations:>12,.0f} {het / ps:>9.3f}")
                columns = ""
                for allocator in args.allocators:
                    capacity = int(ratio * table_rows)
                    with allocator_setting(allocator) as name:
                        rows, per_plan, cpu, distinct, kept, profile, piped = herald_rows(
                            sparse, order, workers, batch, capacity, name, args.iterations, threads, keep_ranks=host,
                            pipeline=pipeline)
                        if host:
                            host_seconds, host_cpu = host_planner_cost(sparse, order, workers, batch, capacity, name,
                                                                       args.iterations, threads, kept)
                    profiles.append((workers, batch, ratio, allocator, profile))
                    columns += f"{rows / het:>18.3f}"
                    if not many:
                        columns += f"{1e3 * per_plan[1]:>9.2f}" + (f"{1e3 * piped[1]:>9.2f}" if pipeline else "")
                    else:
                        for t in threads:
                            columns += f"{1e3 * per_plan[t]:>9.2f}" + (
                                f"{per_plan[1] / per_plan[t]:>6.2f}x" if t > 1 else "") + (
                                f"{1e3 * piped[t]:>9.2f}" if pipeline else "")
                        columns += f"{1e3 * cpu[threads[-1]]:>9.2f}"
                    if host:
                        columns += (f"{len(kept):>3}{1e3 * len(kept) * cpu[1]:>9.2f}{1e3 * host_cpu:>9.2f}"
                                    + "".join(f"{1e3 * host_seconds[t]:>9.2f}" for t in threads))
                print(line + (f"{distinct:>10,.0f}" if many else "") + columns, flush=True)
    if args.profile:
        print_profiles(profiles)


def print_profiles(profiles):
    """Where a plan's time goes, at each thread count: ms per plan by PlanProfile stage (ids:
    distinct rows, each sample's rows and those colocate scores, and valid masks; scores: allocation
    scores and placement; trades: colocate's pairwise trades; readers: who reads each row, outside
    colocate; workers: every worker's cache model and plan; masks: the valid masks updated) and in
    all. With --pipeline, `N+p` lines: a pipelined planner's own thread (its ids: the directory
    lookups alone, the rest being prepared)."""
    header = f"{'W':>2} {'b':>5} {'ratio':>5} {'allocator':>11} {'threads':>7}" + "".join(
        f"{s:>9}" for s in PROFILE_STAGES + ("total",))
    print(f"\nms per plan by stage (PlanProfile)")
    print(header)
    print("-" * len(header))
    for workers, batch, ratio, allocator, by_threads in profiles:
        for n, profile in by_threads.items():
            print(f"{workers:>2} {batch:>5} {ratio:>5} {allocator:>11} {n:>7}" + "".join(
                f"{1e3 * profile[s]:>9.2f}" for s in PROFILE_STAGES + ("total",)), flush=True)


if __name__ == "__main__":
    main()
