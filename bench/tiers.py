"""Tables on disk (--table-storage disk): samples/s against the same job with the table in memory,
the servers' memory, and the disk's own rates as the ceiling.

Parts (--part, any of them):

- disk: the disk under --work as the tier uses it: random reads and writes of one row record
  (pread/pwrite of --record bytes at random offsets of a file of --disk-gib GiB), through the page
  cache and with O_DIRECT (4 KiB, the device's own rate), and sequential writes with fdatasync.
- speed: each mode (PS, HET, Herald, and PS and Herald with the servers' prefetch off) trains the same
  job with the table in memory and on disk, its cache --cache-fraction of the table's rows
  (about 10%: most of a step's rows are read from the file), alternating the two, --repeats
  times; samples/s (the workers' summed epoch rates) and the ratio of medians, per dataset:
  synthetic Criteo (Zipf-skewed ids) and MovieLens-100K in time order (data/ml-100k, fetched
  when missing).
- checkpoint: the cost of a full save of a disk-tier shard and of loading it back, on an XFS with
  reflinks (the save clones the row file: its blocks are shared), on an XFS without them and on
  the --work folder's own file system (the save writes the shard whole): seconds, and how much
  the file system grew; one server holding --ckpt-rows rows of --embedding-size with AdaGrad,
  every record written. The XFS file systems are loop-mounted images in --work (root, xfsprogs).
- big: a table at least twice the host's memory (--big-scale 6 at width 128 in bf16 is MLPerf's
  Criteo 1TB table, 202,575,462 x 128 x 2 B = 51.9 GB), on disk with a --big-cache-mb cache per
  server, against the same job on a table of --small-scale that fits in memory; the servers'
  peak resident memory of each. The row file is sparse: only rows written take disk blocks.

    python bench/tiers.py --part disk speed
    python bench/tiers.py --part big --big-scale 6 --embedding-size 128 --dtype bf16
    python bench/tiers.py --part checkpoint --ckpt-rows 2000000 --embedding-size 64

Loopback on a shared machine measures CPU as much as the disk: compare the rows of one run.
"""
import argparse
import json
import mmap
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.launch import ROOT  # noqa: E402
from common.summaries import worker_summaries  # noqa: E402
from scale import PeakRss, row_bytes  # noqa: E402

MODES = {
    "PS": ("run_hetu.py", ["--comm", "PS"], []),
    "HET": ("run_hetu.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"], []),
    "Herald": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"], []),
    "Herald, no prefetch": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"],
                            ["--table-prefetch", "off"]),
    "PS, no prefetch": ("run_hetu.py", ["--comm", "PS"], ["--table-prefetch", "off"]),
}
TIER = re.compile(r"\] server (\d+): .*disk tier: ([\d.]+) of (\d+) rows in cache, (\d+) read")
LINE_BOOKKEEPING = 90   # bytes a cache line takes besides its row and state (ps-lite/src/table.cc)


# ---- the disk's own rates ------------------------------------------------------------------------

def disk_rates(folder, gib, record, seconds):
    path = os.path.join(folder, "tiers-disk-probe.bin")
    size = int(gib * 2 ** 30)
    rows = []
    start = time.perf_counter()
    with open(path, "wb") as f:   # sequential, synced: how fast the file can be laid down
        block = os.urandom(1 << 20)
        for _ in range(size >> 20):
            f.write(block)
        f.flush()
        os.fdatasync(f.fileno())
    rows.append(("sequential write, fdatasync", 1 << 20, size / (time.perf_counter() - start), None))
    rng = random.Random(0)
    fd = os.open(path, os.O_RDWR)
    try:
        for name, op in (("random read", "r"), ("random write", "w")):
            buf, n, t0 = os.urandom(record), 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                at = rng.randrange(size // record) * record
                if op == "r":
                    os.pread(fd, record, at)
                else:
                    os.pwrite(fd, buf, at)
                n += 1
            dt = time.perf_counter() - t0
            rows.append((f"{name} (page cache)", record, n * record / dt, n / dt))
    finally:
        os.close(fd)
    try:   # the device itself: O_DIRECT, aligned 4 KiB
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        buf, n, t0 = mmap.mmap(-1, 4096), 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            os.preadv(fd, [buf], rng.randrange(size // 4096) * 4096)
            n += 1
        dt = time.perf_counter() - t0
        os.close(fd)
        rows.append(("random read, O_DIRECT", 4096, n * 4096 / dt, n / dt))
    except OSError as e:
        rows.append((f"random read, O_DIRECT: {e.strerror}", 4096, float("nan"), None))
    os.remove(path)
    print(f"\n### The disk under {folder}\n")
    print("| access | bytes each | MB/s | per second |")
    print("|---|---|---|---|")
    for name, each, rate, ops in rows:
        print(f"| {name} | {each} | {rate / 1e6:.0f} | {'' if ops is None else f'{ops:,.0f}'} |")


# ---- jobs --------------------------------------------------------------------------------------

def prepare(kind, folder, args):
    """A prepared dataset folder; (its folder, model, rows of its embedding table)."""
    meta = os.path.join(folder, "meta.json")
    if kind == "movielens":
        if not os.path.exists(meta):
            raw = os.path.join(ROOT, "data", "ml-100k")
            if not os.path.exists(os.path.join(raw, "u.data")):
                subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "get_movielens100k.py"), "--output",
                                raw], check=True)
            subprocess.run([sys.executable, "-m", "hetu.data.prepare", "movielens", "--input",
                            os.path.join(raw, "u.data"), "--users", os.path.join(raw, "u.user"), "--items",
                            os.path.join(raw, "u.item"), "--time-order", "--output", folder, "--quiet"], check=True)
        model = "dlrm_movielens"
    else:
        scale = kind
        if not os.path.exists(meta):
            subprocess.run([sys.executable, "-m", "hetu.data.prepare", "synthetic", "--shape", "criteo", "--scale",
                            str(scale), "--rows", str(args.samples), "--output", folder], check=True)
        model = "wdl_criteo"
    with open(meta) as f:
        return folder, model, int(json.load(f)["num_embeddings"])


def cache_mb(rows, args, fraction):
    """--table-cache-mb for `fraction` of a server's rows (its lines' bytes, ps-lite's TierLines)."""
    per_line = row_bytes(args.embedding_size, args.optimizer, args.dtype) - 8 + LINE_BOOKKEEPING
    return max(0.01, fraction * rows / args.servers * per_line / 2 ** 20)


def run(mode, data, model, tier, args, iterations, log=None, epochs=1):
    """One job; (the job's samples/s, the servers' disk-tier figures, peak RSS per role)."""
    script, flags, extra = MODES[mode]
    cmd = [sys.executable, os.path.join(ROOT, "python/runner.py"), "-w", str(args.workers), "-s", str(args.servers),
           "--timeout", str(args.timeout), sys.executable, os.path.join(ROOT, "examples/ctr", script), *flags,
           *(extra if tier else []), "--bsp", "0", "--model", model, "--data-dir", data, "--batch-size",
           str(args.batch), "--embedding-size", str(args.embedding_size), "--optimizer", args.optimizer,
           "--learning-rate", "0.01", "--embedding-dtype", args.dtype,
           *(["--iters-per-epoch", str(iterations)] if iterations else []), "--nepoch", str(epochs), "--no-progress",
           *(tier or [])]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    sampler = PeakRss(proc.pid, 0.5)
    sampler.start()
    out, _ = proc.communicate(timeout=args.timeout + 120)
    peak = sampler.stop()
    if log:
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n" + out)
    summaries = worker_summaries(mode, args.workers, proc.returncode, out)
    tiers = [m.groups() for m in TIER.finditer(out)]
    # Each worker's summary gives the job's samples/s (all workers), the same figure within noise.
    return statistics.mean(s["samples_per_second"] for s in summaries), tiers, peak


def tier_text(tiers):
    """Hit rate and rows read from disk, over the servers."""
    if not tiers:
        return "-"
    looked = sum(int(t[2]) for t in tiers)
    hits = sum(float(t[1]) * int(t[2]) for t in tiers)
    return f"{hits / looked:.2f} hit, {sum(int(t[3]) for t in tiers):,} read"


def speed(args, work):
    for kind in args.datasets:
        folder = os.path.join(args.data, "movielens-time" if kind == "movielens" else f"criteo-s{args.scale:g}")
        data, model, rows = prepare("movielens" if kind == "movielens" else args.scale, folder, args)
        mb = cache_mb(rows, args, args.cache_fraction)
        print(f"\n### {kind}: {model}, {rows:,} rows x {args.embedding_size} {args.dtype}, {args.optimizer}; "
              f"W={args.workers} S={args.servers}, batch {args.batch}, {args.epochs} epochs"
              f"{f' of {args.iterations} iterations' if args.iterations else ''}; disk cache "
              f"{mb:.2f} MB a server ({args.cache_fraction:.0%} of its rows)\n")
        print("| mode | memory samples/s | disk samples/s | disk / memory (median) | disk tier |")
        print("|---|---|---|---|---|")
        for mode in args.modes:
            mem, disk, tiers = [], [], None
            for r in range(args.repeats):   # alternated, so that load drifts touch both alike
                mem.append(run(mode, data, model, None, args, args.iterations, epochs=args.epochs)[0])
                tier_dir = os.path.join(work, "rows")
                os.makedirs(tier_dir, exist_ok=True)
                rate, tiers, _ = run(mode, data, model, ["--table-storage", "disk", "--table-dir", tier_dir,
                                                         "--table-cache-mb", f"{mb:.4f}"], args, args.iterations,
                                     epochs=args.epochs)
                disk.append(rate)
            print(f"| {mode} | {' '.join(f'{x:,.0f}' for x in mem)} | {' '.join(f'{x:,.0f}' for x in disk)} | "
                  f"{statistics.median(disk) / statistics.median(mem):.2f} | {tier_text(tiers)} |", flush=True)


def big(args, work):
    host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    print(f"\n### A table beyond memory (host: {host / 2 ** 30:.1f} GiB)\n")
    print("| table | rows | table GB (rows x width x bytes) | x host memory | where | samples/s | server peak RSS GiB | "
          "disk tier |")
    print("|---|---|---|---|---|---|---|---|")
    for scale, on_disk in ((args.small_scale, False), (args.big_scale, True)):
        folder = os.path.join(args.data, f"criteo-s{scale:g}-r{args.samples}")
        data, model, rows = prepare(scale, folder, args)
        tier = None
        if on_disk:
            tier_dir = os.path.join(work, "rows")
            os.makedirs(tier_dir, exist_ok=True)
            tier = ["--table-storage", "disk", "--table-dir", tier_dir, "--table-cache-mb", str(args.big_cache_mb)]
        rate, tiers, peak = run("PS", data, model, tier, args, args.big_iterations,
                                log=args.logs and os.path.join(args.logs, f"big-s{scale:g}.log"))
        table = rows * args.embedding_size * {"fp32": 4, "bf16": 2, "fp16": 2}[args.dtype]
        servers = " ".join(f"{peak.get(f'server {s}', 0) / 2 ** 30:.2f}" for s in range(args.servers))
        print(f"| criteo --scale {scale:g} | {rows:,} | {table / 1e9:.1f} | {table / host:.2f} | "
              f"{'disk, cache ' + str(args.big_cache_mb) + ' MB a server' if on_disk else 'memory'} | {rate:,.0f} | "
              f"{servers} | {tier_text(tiers)} |", flush=True)


# ---- a checkpoint's cost: cloned or written ------------------------------------------------------

CHECKPOINT_SCRIPT = r"""
import json, os, sys, time
import numpy as np
from hetu.rows.servers import start_worker
import hetu.ps as ps
start_worker()
A = json.loads(sys.argv[1])
R, W = A["rows"], A["width"]
t = ps.client().init_table("emb", R, W, init=("normal", 0.0, 0.1), seed=7, optimizer=("adagrad", {}), bsp=False,
                           tier=ps.DiskTier(A["tier"], A["cache_mb"]))
for b in range(0, R, 65536):   # every record written once
    keys = np.arange(b, min(R, b + 65536), dtype=np.int64)
    t.push(keys, np.full((len(keys), W), 0.5, np.float32), lr=0.01).wait()

def used():
    os.sync()
    s = os.statvfs(A["tier"])
    return (s.f_blocks - s.f_bfree) * s.f_frsize

def row_file_blocks():   # the save writes the cache's dirty rows back first: they grow the row file
    return sum(e.stat().st_blocks * 512 for e in os.scandir(A["tier"]) if e.is_file())

before, rows_before = used(), row_file_blocks()
start = time.perf_counter()
t.save(A["ckpt"]).wait()
save = time.perf_counter() - start
grown = used() - before - (row_file_blocks() - rows_before)
t.clear().wait()
start = time.perf_counter()
t.load(A["ckpt"]).wait()
load = time.perf_counter() - start
print("CHECKPOINT " + json.dumps({"save": save, "load": load, "grown": grown}), flush=True)
ps.finalize()
"""


def loop_xfs(work, name, reflink, size):
    """An XFS (reflink=1 or 0) on a loop-mounted image of `size` bytes in `work`; its mount point."""
    image, folder = os.path.join(work, f"{name}.img"), os.path.join(work, name)
    with open(image, "wb") as f:
        f.truncate(size)
    subprocess.run(["mkfs.xfs", "-q", "-f", "-m", f"reflink={int(reflink)}", image], check=True)
    os.makedirs(folder, exist_ok=True)
    subprocess.run(["mount", "-o", "loop", image, folder], check=True)
    return folder


def checkpoint_cost(args, work):
    record = args.embedding_size * 4 * 2 + 16 + 8   # the row, AdaGrad's state, step, version, check
    table = args.ckpt_rows * record
    script = os.path.join(work, "checkpoint_cost.py")
    with open(script, "w") as f:
        f.write(CHECKPOINT_SCRIPT)
    print(f"\n### A full checkpoint of a disk-tier shard (what the file system grew by, less the row file's own "
          f"growth from the dirty rows written back first): {args.ckpt_rows:,} rows x {args.embedding_size} fp32 "
          f"with AdaGrad, {table / 2 ** 20:,.0f} MiB of records, one server, a {args.ckpt_cache_mb:g} MB cache\n")
    print("| file system | the save | save s | load s | file system grew MiB | grew / records |")
    print("|---|---|---|---|---|---|")
    mounts = []
    try:
        places = []
        if shutil.which("mkfs.xfs"):
            for name, reflink in (("xfs-reflink", True), ("xfs-no-reflink", False)):
                mounts.append(loop_xfs(work, name, reflink, 3 * table + (512 << 20)))
                places.append((f"XFS, reflink={int(reflink)} (loop)", mounts[-1]))
        kind = subprocess.run(["stat", "-f", "-c", "%T", work], capture_output=True, text=True).stdout.strip()
        places.append((f"{kind or '?'} (--work's own)", os.path.join(work, "own")))
        for label, folder in places:
            tier, ckpt = os.path.join(folder, "rows"), os.path.join(folder, "ckpt")
            os.makedirs(tier, exist_ok=True)
            cfg = json.dumps({"rows": args.ckpt_rows, "width": args.embedding_size, "tier": tier, "ckpt": ckpt,
                              "cache_mb": args.ckpt_cache_mb})
            proc = subprocess.run([sys.executable, os.path.join(ROOT, "python/runner.py"), "-w", "1", "-s", "1",
                                   "--timeout", str(args.timeout), sys.executable, script, cfg],
                                  capture_output=True, text=True, timeout=args.timeout + 60)
            found = re.search(r"CHECKPOINT (\{.*\})", proc.stdout)
            how = re.search(r"saved \S+ (by cloning the row file|whole)", proc.stdout + proc.stderr)
            if proc.returncode or not found:
                sys.exit(f"checkpoint on {label} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            r = json.loads(found.group(1))
            print(f"| {label} | {how.group(1) if how else '?'} | {r['save']:.2f} | {r['load']:.2f} | "
                  f"{r['grown'] / 2 ** 20:,.1f} | {r['grown'] / table:.3f} |", flush=True)
    finally:
        for folder in mounts:
            subprocess.run(["umount", folder], check=False)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", nargs="+", default=["disk", "speed"], choices=["disk", "speed", "big", "checkpoint"])
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    p.add_argument("--datasets", nargs="+", default=["criteo", "movielens"], choices=["criteo", "movielens"])
    p.add_argument("--scale", type=float, default=0.05, help="speed: synthetic Criteo's cardinality (1: 33.8M rows)")
    p.add_argument("--samples", type=int, default=200000, help="samples of the generated data")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--iterations", type=int, default=0, help="speed: iterations an epoch (0: the whole split)")
    p.add_argument("--epochs", type=int, default=2, help="speed: epochs (the second reads back rows the first "
                   "evicted)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--embedding-size", type=int, default=16)
    p.add_argument("--optimizer", default="adam")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"])
    p.add_argument("--cache-fraction", type=float, default=0.1, help="speed: the disk cache, a fraction of the rows")
    p.add_argument("--big-scale", type=float, default=6.0)
    p.add_argument("--small-scale", type=float, default=0.5)
    p.add_argument("--big-cache-mb", type=float, default=1024.0)
    p.add_argument("--big-iterations", type=int, default=50)
    p.add_argument("--ckpt-rows", type=int, default=1_000_000, help="checkpoint: the table's rows")
    p.add_argument("--ckpt-cache-mb", type=float, default=64.0, help="checkpoint: the server's cache")
    p.add_argument("--record", type=int, default=176, help="disk: bytes of a record (a row of 16 fp32 with Adam)")
    p.add_argument("--disk-gib", type=float, default=2.0)
    p.add_argument("--disk-seconds", type=float, default=3.0)
    p.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "hetu-tiers-data"))
    p.add_argument("--work", default=None, help="folder for the row files (default: a temporary one on the "
                   "disk of the temporary folder)")
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--logs", default=None)
    args = p.parse_args()
    os.makedirs(args.data, exist_ok=True)
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    work = args.work or tempfile.mkdtemp(prefix="hetu-tiers-")
    os.makedirs(work, exist_ok=True)
    try:
        if "disk" in args.part:
            disk_rates(work, args.disk_gib, args.record, args.disk_seconds)
        if "speed" in args.part:
            speed(args, work)
        if "big" in args.part:
            big(args, work)
        if "checkpoint" in args.part:
            checkpoint_cost(args, work)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
