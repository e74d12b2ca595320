"""Dynamic tables (docs/design.md section 13) against static ones, side by side in one run.

Parts (each prints its own table; --parts picks them):

- speed: samples/s of the same model on the same data, static table (vocabulary-prepared ids)
  against a dynamic table (the same data prepared with --ids hashed, capacity above the distinct
  keys), plain PS, HET (lru, bound 0) and Herald, W workers and 1 server as real local clusters
  (python/runner.py); the modes and the two tables take turns, --repeats times, medians.
- directory: what a dynamic table adds to a worker's step: the key directory's step on a global
  batch of 1K and 16K keys (distinct, drawn from a drifting Zipf stream) and the mapping of the
  worker's keys to slots, in microseconds, beside the same step's pull of those rows from one
  server (hetu.ps over loopback). The servers' own pull and push are the static table's: a dynamic
  table is a plain table of slots there.
- quality: MovieLens 100K (u.data with u.user and u.item) in time order, dlrm_movielens, one
  process: the vocabulary-prepared folder against hashed ids with a capacity above the distinct
  keys, then capacities of 50% and 25% of the distinct keys with admission after 1 and 2 reads:
  validation AUC and rows resident.
- rows: Herald against HET on MovieLens 100K in time order with hashed ids and a capacity of half
  the distinct keys, W workers, 1 server: rows moved.
- memory: one worker and 2 servers over a drifting stream (prepare synthetic --ids hashed
  --drift) that brings --memory-multiple times the capacity in distinct keys: the counter lines
  (resident never above the capacity) and each server's peak RSS against its rows and optimizer
  state.

    python bench/dynamic.py --ml100k DIR                 # every part (DIR holds u.data, u.user, u.item)
    python bench/dynamic.py --parts directory quality --ml100k DIR
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time

import numpy as np

from common import launch
from common.launch import ROOT
from common.summaries import last_summary
PYTHON = sys.executable
MODES = {"PS": ("run_hetu.py", ["--comm", "Hybrid"]),
         "HET": ("run_hetu.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"]),
         "Herald": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"])}


def run(cmd, env=None, timeout=1800):
    return launch.run(cmd, f"{' '.join(cmd[:6])} ...", timeout, env={**os.environ, **(env or {})}).stdout


def counter_lines(stdout):
    return [line[line.index("table "):] for line in stdout.splitlines() if re.search(r"table \S+ server \d+:", line)]


def prepare(kind, out, *flags):
    if not os.path.exists(os.path.join(out, "meta.json")):
        run([PYTHON, "-m", "hetu.data.prepare", kind, "--output", out, "--quiet", *flags])
    return out


def distinct_keys(folder):
    meta = json.load(open(os.path.join(folder, "meta.json")))
    sparse = np.load(os.path.join(folder, "sparse.npy"), mmap_mode="r")[:meta["split"]["train_rows"]]
    keys = np.unique(np.asarray(sparse))
    return int(np.count_nonzero(keys != -1))


# --- speed --------------------------------------------------------------------------------------
def part_speed(args, work):
    static = prepare("synthetic", os.path.join(work, "speed-static"), "--rows", str(args.rows), "--scale", "0.01")
    hashed = prepare("synthetic", os.path.join(work, "speed-hashed"), "--rows", str(args.rows), "--scale", "0.01",
                     "--ids", "hashed")
    capacity = 1 << int(np.ceil(np.log2(distinct_keys(hashed) * 1.25)))
    tables = {"static": ["--data-dir", static], "dynamic": ["--data-dir", hashed, "--table-capacity", str(capacity)]}
    rates = {(m, t): [] for m in args.modes for t in tables}
    # --epochs: whole passes (the first admits every key, the later ones few); else the first
    # --iterations steps of the first, where nearly every key is new.
    length = ["--nepoch", str(args.epochs)] if args.epochs else ["--iters-per-epoch", str(args.iterations)]
    for _ in range(args.repeats):
        for mode in args.modes:
            script, flags = MODES[mode]
            for table, data in tables.items():
                cmd = [PYTHON, os.path.join(ROOT, "python/runner.py"), "-w", str(args.workers), "-s", "1",
                       "--timeout", "900", PYTHON, os.path.join(ROOT, "examples/ctr", script), *flags, "--bsp", "0",
                       "--model", "wdl_criteo", "--batch-size", str(args.batch), "--embedding-size", "16",
                       *length, "--no-progress", *data]
                rates[mode, table].append(last_summary(run(cmd))["samples_per_second"])
    steps = f"{args.epochs} epochs" if args.epochs else f"{args.iterations} iterations"
    print(f"\n# speed: wdl_criteo, synthetic Criteo ({args.rows} rows, --scale 0.01), W = {args.workers}, 1 server, "
          f"b = {args.batch}, {steps}; dynamic capacity {capacity}; samples/s (job), median of {args.repeats}; "
          f"the ratio of each static run and the dynamic run beside it: median (range)")
    print(f"{'mode':8} {'static':>10} {'dynamic':>10} {'dynamic/static':>15} {'paired':>20}")
    for mode in args.modes:
        s, d = statistics.median(rates[mode, "static"]), statistics.median(rates[mode, "dynamic"])
        paired = [b / a for a, b in zip(rates[mode, "static"], rates[mode, "dynamic"])]
        spread = f"{statistics.median(paired):.2f} ({min(paired):.2f}-{max(paired):.2f})"
        print(f"{mode:8} {s:10.0f} {d:10.0f} {d / s:15.2f} {spread:>20}")


# --- directory ----------------------------------------------------------------------------------
def part_directory(args, work):
    from hetu import _C
    rng = np.random.default_rng(0)
    print("\n# directory: the key directory's step and the mapping of a worker's keys against a pull of the same "
          "rows (width 16, one server over loopback); microseconds per step, median of the steps after 20")
    print(f"{'keys':>6} {'capacity':>9} {'step us':>9} {'map us':>8} {'pull us':>9} {'(step+map)/pull':>16}")
    pull_us = pull_times(args, work)
    for n in (1024, 16384):
        capacity = 1 << 20
        d = _C.KeyDirectory(capacity, capacity // 16, 1, 0)
        steps, maps = [], []
        for t in range(120):
            keys = np.unique(rng.zipf(1.2, size=n * 2).astype(np.int64) + t * 97)[:n]   # drifting
            started = time.perf_counter()
            result = d.step(t, keys)
            mid = time.perf_counter()
            batch = rng.choice(keys, size=n)
            d.lookup(batch)   # as hetu.dynamic.TableKeys maps a worker's keys
            end = time.perf_counter()
            if t >= 20:
                steps.append((mid - started) * 1e6)
                maps.append((end - mid) * 1e6)
        s, m = statistics.median(steps), statistics.median(maps)
        print(f"{n:6} {capacity:9} {s:9.0f} {m:8.0f} {pull_us[n]:9.0f} {(s + m) / pull_us[n]:16.2f}")


def pull_times(args, work):
    """Median microseconds of a pull of 1K and 16K distinct rows of width 16 from one server."""
    script = os.path.join(work, "pull_times.py")
    with open(script, "w") as f:
        f.write(PULL_SCRIPT)
    out = run([PYTHON, os.path.join(ROOT, "python/runner.py"), "-w", "1", "-s", "1", "--timeout", "300",
               PYTHON, script])
    line = next(x for x in reversed(out.splitlines()) if '"1024"' in x)
    return {int(k): v for k, v in json.loads(line[line.index("{"):]).items()}


PULL_SCRIPT = r"""
import json, statistics, time
import numpy as np
import hetu as ht
from hetu.rows.servers import start_worker
import hetu.ps as ps
start_worker()
client = ps.client()
table = client.init_table("t", 1 << 20, 16, init=ht.init.random_normal((1, 16), stddev=0.01).initializer.spec(), seed=0,
                          stream=1, optimizer=ht.optim.SGDOptimizer(0.1).rule(), bsp=False, staleness=0)
rng = np.random.default_rng(0)
out = {}
for n in (1024, 16384):
    times = []
    for i in range(120):
        keys = np.unique(rng.integers(0, 1 << 20, size=n * 2))[:n]
        started = time.perf_counter()
        table.pull(keys).wait()
        if i >= 20:
            times.append((time.perf_counter() - started) * 1e6)
    out[n] = statistics.median(times)
print(json.dumps(out))
"""


# --- quality ------------------------------------------------------------------------------------
def part_quality(args, work):
    if not args.ml100k:
        print("\n# quality: skipped (give --ml100k DIR with u.data, u.user, u.item)")
        return
    src = ["--input", os.path.join(args.ml100k, "u.data"), "--users", os.path.join(args.ml100k, "u.user"),
           "--items", os.path.join(args.ml100k, "u.item"), "--time-order"]
    indexed = prepare("movielens", os.path.join(work, "ml-indexed"), *src)
    hashed = prepare("movielens", os.path.join(work, "ml-hashed"), *src, "--ids", "hashed")
    keys = distinct_keys(hashed)
    common = ["--model", "dlrm_movielens", "--optimizer", "adam", "--learning-rate", "0.001", "--batch-size", "256",
              "--embedding-size", "16", "--nepoch", "1", "--val", "--no-progress"]
    rows = [("vocabulary (static)", ["--data-dir", indexed])]
    # Keys hash into buckets of 16 ways: at 4x the distinct keys no bucket overflows in practice.
    full = 1 << int(np.ceil(np.log2(keys * 4)))
    rows.append((f"hashed, capacity {full}", ["--data-dir", hashed, "--table-capacity", str(full)]))
    for share in (0.5, 0.25):
        capacity = int(keys * share) // 16 * 16
        for admit in (1, 2):
            rows.append((f"hashed, capacity {capacity} ({share:.0%}), admit {admit}",
                         ["--data-dir", hashed, "--table-capacity", str(capacity), "--admit-after", str(admit)]))
    seeds = range(1, args.seeds + 1)
    print(f"\n# quality: MovieLens 100K in time order, dlrm_movielens, Adam 0.001, b 256, e 16, 1 epoch, one process; "
          f"{keys} distinct keys in the training split; validation AUC, mean (min-max) over seeds "
          f"{', '.join(map(str, seeds))}; counters of the first seed")
    print(f"{'table':45} {'val AUC':>8} {'range':>15} {'resident':>9} {'admitted':>9} {'evicted':>8}")
    for name, flags in rows:
        aucs, counts = [], ("-", "-", "-")
        for seed in seeds:
            out = run([PYTHON, os.path.join(ROOT, "examples/ctr/run_hetu.py"), *common, *flags, "--seed", str(seed)])
            aucs.append(last_summary(out)["final"]["val"]["auc"])
            nums = [list(map(int, re.findall(r"\d+", line.split(":", 1)[1]))) for line in counter_lines(out)]
            if nums and seed == seeds[0]:
                counts = (nums[0][0], nums[0][2], nums[0][3])
        print(f"{name:45} {statistics.mean(aucs):8.4f} {min(aucs):7.4f}-{max(aucs):.4f} {counts[0]!s:>9} "
              f"{counts[1]!s:>9} {counts[2]!s:>8}")


# --- rows moved: Herald vs HET on hashed MovieLens -------------------------------------------------
def part_rows(args, work):
    if not args.ml100k:
        print("\n# rows: skipped (give --ml100k DIR with u.data, u.user, u.item)")
        return
    hashed = prepare("movielens", os.path.join(work, "ml-hashed"), "--input", os.path.join(args.ml100k, "u.data"),
                     "--users", os.path.join(args.ml100k, "u.user"), "--items", os.path.join(args.ml100k, "u.item"),
                     "--time-order", "--ids", "hashed")
    keys = distinct_keys(hashed)
    capacity = keys // 2 // 16 * 16
    print(f"\n# rows: dlrm_movielens on MovieLens 100K in time order, hashed ids, capacity {capacity} (half of the "
          f"{keys} distinct keys), W = {args.workers}, 1 server, b = 256, --cache-limit-ratio 0.2, one epoch; rows "
          "pulled + pushed by all workers (loopback)")
    print(f"{'mode':8} {'rows':>10} {'/HET':>6} {'samples/s':>10}")
    moved = {}
    for mode in ("HET", "Herald"):
        script, flags = MODES[mode]
        cmd = [PYTHON, os.path.join(ROOT, "python/runner.py"), "-w", str(args.workers), "-s", "1", "--timeout", "900",
               PYTHON, os.path.join(ROOT, "examples/ctr", script), *flags, "--bsp", "0", "--model", "dlrm_movielens",
               "--data-dir", hashed, "--table-capacity", str(capacity), "--batch-size", "256", "--embedding-size", "16",
               "--cache-limit-ratio", "0.2", "--no-progress"]
        out = last_summary(run(cmd))
        c = out["counters"]
        moved[mode] = c["rows_pulled"] + c["rows_pushed"]
        print(f"{mode:8} {moved[mode]:10d} {moved[mode] / moved['HET']:6.2f} {out['samples_per_second']:10.0f}")


# --- memory -------------------------------------------------------------------------------------
def part_memory(args, work):
    capacity, width = args.memory_capacity, 16
    # Distinct keys grow by about drift x (sum of field sizes) per million rows: rows for the multiple.
    data = prepare("synthetic", os.path.join(work, f"memory-{args.memory_rows}"), "--rows", str(args.memory_rows),
                   "--ids", "hashed", "--drift", str(args.memory_drift), "--val-fraction", "0.001")
    keys = distinct_keys(data)
    cmd = [PYTHON, os.path.join(ROOT, "python/runner.py"), "-w", "1", "-s", "2", "--timeout", "3000",
           PYTHON, os.path.join(ROOT, "examples/ctr/run_hetu.py"), "--comm", "PS", "--bsp", "0",
           "--model", "wdl_criteo", "--data-dir", data, "--table-capacity", str(capacity), "--embedding-size",
           str(width), "--batch-size", "4096", "--optimizer", "sgd", "--no-progress"]
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from scale import run_job   # its peak-RSS sampler of every role of a job (VmHWM)
    lines, peak = run_job(cmd, 0.2, 3600)
    out = "\n".join(line for _, line in lines)
    print(f"\n# memory: 1 worker, 2 servers, wdl_criteo over a drifting stream ({args.memory_rows} rows, --drift "
          f"{args.memory_drift}): {keys} distinct keys = {keys / capacity:.1f}x the capacity of {capacity} rows of "
          f"width {width} (SGD: no optimizer state)")
    for line in counter_lines(out):
        print(line)
    rows_mib = capacity // 2 * width * 4 / 2**20
    for role in sorted(peak):
        note = f" ({peak[role] / 2**20 / rows_mib:.2f}x its {rows_mib:.0f} MiB of rows)" if role.startswith("server") else ""
        print(f"peak RSS {role}: {peak[role] / 2**20:.0f} MiB{note}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--parts", nargs="+", default=["speed", "directory", "quality", "rows", "memory"],
                   choices=["speed", "directory", "quality", "rows", "memory"])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--rows", type=int, default=200000)
    p.add_argument("--iterations", type=int, default=60)
    p.add_argument("--epochs", type=int, default=0, help="speed: whole epochs instead of --iterations")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seeds", type=int, default=3, help="quality: seeds per table")
    p.add_argument("--ml100k", default=None, help="folder with MovieLens 100K's u.data, u.user, u.item")
    p.add_argument("--memory-capacity", type=int, default=2_000_000)
    p.add_argument("--memory-rows", type=int, default=4_000_000)
    p.add_argument("--memory-drift", type=float, default=1.0)
    p.add_argument("--work", default=None, help="folder for prepared data (default: a temporary one)")
    args = p.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="hetu-dynamic-")
    os.makedirs(work, exist_ok=True)
    print(f"# bench/dynamic.py, {os.cpu_count()} cores, data in {work}")
    for part in args.parts:
        globals()[f"part_{part}"](args, work)


if __name__ == "__main__":
    main()
