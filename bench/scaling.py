"""Samples/s of WDL for 1, 2 and 4 workers in each aggregation mode, as local clusters.

On a 2-core machine the point is each mode's overhead per step, not speed-up: the workers share
the cores. Throughput is the median over --repeats runs of each cell.

    python bench/scaling.py
    python bench/scaling.py --workers 1 2 --modes PS Hybrid --repeats 3
"""
import argparse
import json
import os
import re
import statistics

from common import launch
from common.launch import PYTHON, ROOT


def run(mode, workers, args):
    train = [os.path.join(ROOT, "examples/ctr/run_hetu.py"), "--model", "wdl_criteo", "--batch-size", str(args.batch),
             "--embedding-size", str(args.embedding_size), "--iters-per-epoch", str(args.iterations),
             "--rows", str(args.rows), "--no-progress"]
    if mode == "single":
        cmd = [PYTHON, *train]
    else:
        cmd = launch.runner(workers, 0 if mode == "AllReduce" else 1, timeout=900) + [PYTHON, *train, "--comm", mode, "--bsp", "0"]
    proc = launch.run(cmd, f"{mode} with {workers} workers", timeout=960)
    summaries = [json.loads(m) for m in re.findall(r"summary (\{.*\})", proc.stdout)]
    seconds = max(s["seconds"] for s in summaries)
    return sum(s["iterations"] * args.batch for s in summaries) / seconds


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--modes", nargs="+", default=["PS", "AllReduce", "Hybrid"])
    p.add_argument("--batch", type=int, default=256, help="per-worker batch")
    p.add_argument("--embedding-size", type=int, default=16)
    p.add_argument("--iterations", type=int, default=100)
    p.add_argument("--rows", type=int, default=200000)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    single = statistics.median(run("single", 1, args) for _ in range(args.repeats))
    print(f"single process, batch {args.batch}: {single:.0f} samples/s")
    print(f"{'mode':<10}" + "".join(f"{f'W={w}':>12}" for w in args.workers) + "   (samples/s, all workers; x = vs single)")
    for mode in args.modes:
        cells = []
        for w in args.workers:
            sps = statistics.median(run(mode, w, args) for _ in range(args.repeats))
            cells.append(f"{sps:>7.0f} {sps / single:>3.2f}x")
        print(f"{mode:<10}" + "".join(f"{c:>12}" for c in cells), flush=True)


if __name__ == "__main__":
    main()
