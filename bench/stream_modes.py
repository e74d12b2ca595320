"""bench/stream.py --parts modes: PS vs HET vs Herald on a stream of MovieLens 100K in time order,
its files landing while the job runs (W workers, 1 server, on loopback): rows moved, samples/s,
the windows' AUC and the lag.

Each mode trains dlrm_movielens (side features from u.user / u.item) through a dynamic table
on the ratings sorted by timestamp, written into a fresh directory as --files files, one every
--interval seconds while the job follows the directory; the job ends --idle-exit seconds after
the last.

    python bench/stream.py --parts modes

Samples/s counts the job's time from its first step to its last (it may wait for files:
with a short interval it does not); AUC is the windows' mean over the run (progressive
validation: each sample predicted before it is trained); lag is the mean over windows from
the arrival of a window's last sample to its update."""
import os
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_modes  # noqa: E402  (aggregate)
from common.summaries import worker_summaries  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODE_FLAGS = {
    "PS": ("run_hetu.py", ["--comm", "Hybrid"]),
    "HET": ("run_hetu.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"]),
    "Herald": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"]),
}


def add_arguments(p):
    p.add_argument("--movielens", default="/tmp/quality_data/ml-100k",
                   help="modes: a folder with MovieLens 100K's u.data, u.user, u.item")
    p.add_argument("--modes-workers", type=int, default=2, help="modes: workers W (1 server)")
    p.add_argument("--modes-batch", type=int, default=128, help="modes: per-worker batch b")
    p.add_argument("--modes-files", type=int, default=10, help="modes: the stream's files")
    p.add_argument("--modes-interval", type=float, default=0.5, help="modes: seconds between two files landing")
    p.add_argument("--modes-idle-exit", type=float, default=3.0, help="modes: --stream-idle-exit of the jobs")
    p.add_argument("--modes-window", type=int, default=10000, help="modes: --window")
    p.add_argument("--modes-table-capacity", type=int, default=4096, help="modes: --table-capacity")
    p.add_argument("--modes-cache-ratio", type=float, default=0.1, help="modes: --cache-limit-ratio")
    p.add_argument("--modes-timeout", type=int, default=600, help="modes: seconds a job may take")


def time_ordered_ratings(folder):
    """u.data's lines sorted by timestamp (stable: ties keep the file's order)."""
    with open(os.path.join(folder, "u.data")) as f:
        lines = f.readlines()
    stamps = np.array([int(line.split("\t")[3]) for line in lines])
    return [lines[i] for i in np.argsort(stamps, kind="stable")]


def land_files(lines, folder, files, interval):
    """Writes `lines` into `folder` as `files` files, each under a dot name then renamed."""
    bounds = np.linspace(0, len(lines), files + 1).astype(int)
    for k in range(files):
        name = f"ratings-{k:04d}.tsv"
        tmp = os.path.join(folder, f".{name}.tmp")
        with open(tmp, "w") as f:
            f.writelines(lines[bounds[k]:bounds[k + 1]])
        os.replace(tmp, os.path.join(folder, name))
        if k + 1 < files:
            time.sleep(interval)


def run_stream_mode(mode, lines, args, work):
    """One job of `mode` following a directory its files land in: its aggregate (compare_modes)
    plus the windows' mean AUC and lag."""
    script, flags = MODE_FLAGS[mode]
    folder = os.path.join(work, mode)
    os.makedirs(folder)
    ml = args.movielens
    cmd = [sys.executable, os.path.join(ROOT, "python/runner.py"), "-w", str(args.modes_workers), "-s", "1",
           "--timeout", str(args.modes_timeout), sys.executable, os.path.join(ROOT, "examples/ctr", script), *flags,
           "--bsp", "0", "--model", "dlrm_movielens", "--batch-size", str(args.modes_batch),
           "--embedding-size", "16", "--optimizer", "adam", "--learning-rate", "0.001", "--cache-limit-ratio", str(args.modes_cache_ratio),
           "--table-capacity", str(args.modes_table_capacity), "--stream", folder, "--stream-format", "movielens",
           "--users", os.path.join(ml, "u.user"), "--items", os.path.join(ml, "u.item"),
           "--stream-idle-exit", str(args.modes_idle_exit), "--window", str(args.modes_window), "--no-progress",
           "--csv-dir", os.path.join(work, f"{mode}-csv")]
    writer = threading.Thread(target=land_files, args=(lines, folder, args.modes_files, args.modes_interval))
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer.start()
    try:
        out, err = job.communicate(timeout=args.modes_timeout + 60)
    finally:
        if job.poll() is None:
            job.kill()
        writer.join()
    summaries = worker_summaries(mode, args.modes_workers, job.returncode, out, err)
    result = compare_modes.aggregate(summaries, args.modes_batch)
    windows = summaries[0]["final"]["windows"]
    result["auc"] = float(np.nanmean([w["auc"] for w in windows])) if windows else float("nan")
    lags = [w["lag_seconds"] for w in windows if w["lag_seconds"] is not None]
    result["lag"] = float(np.mean(lags)) if lags else float("nan")
    result["samples"] = summaries[0]["final"]["samples"]
    return result


def modes_table(args):
    """Prints the table: one line per mode."""
    print("\n".join(modes_lines(args)), flush=True)


def modes_lines(args):
    if not os.path.exists(os.path.join(args.movielens, "u.data")):
        return [f"modes: no MovieLens 100K at {args.movielens} (scripts/get_movielens100k.py fetches it)"]
    lines = time_ordered_ratings(args.movielens)
    results = {}
    with tempfile.TemporaryDirectory() as work:
        for mode in MODE_FLAGS:
            results[mode] = run_stream_mode(mode, lines, args, work)
    out = [f"PS vs HET vs Herald on a stream: MovieLens 100K in time order ({len(lines)} ratings), "
           f"{args.modes_files} files landing {args.modes_interval:g} s apart, W = {args.modes_workers} x b = {args.modes_batch}, "
           f"1 server, loopback (unshaped), dlrm_movielens (adam, lr 0.001), --table-capacity {args.modes_table_capacity}",
           "| mode | samples trained | rows moved | vs HET | samples/s | window AUC (mean) | lag (mean, s) |",
           "|---|---|---|---|---|---|---|"]
    het = results["HET"]["rows"] or 1
    for mode, r in results.items():
        out.append(f"| {mode} | {r['samples']} | {r['rows']} | {r['rows'] / het:.2f} | {r['samples_per_s']:.0f} | "
                   f"{r['auc']:.4f} | {r['lag']:.2f} |")
    return out

