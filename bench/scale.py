"""Tables of real size: what a job costs in memory, time and traffic when its embedding table has
the cardinality of a real click log, per mode (plain PS, HET, Herald).

Each mode trains the same model on synthetic Criteo-shaped data of a given cardinality (W
workers, S servers on this machine, python/runner.py) for --iterations steps, writes a
checkpoint (--checkpoint), then a second job resumes it (--resume) and trains a few steps more.
While each job runs, the scheduler's, servers' and workers' peak resident memory (VmHWM of
/proc/PID/status) is sampled from outside every --sample-interval seconds. Per mode it reports:

- table bytes (rows x width x bytes per element of --dtype, the rows' storage type);
- peak RSS per role, and for the servers peak RSS / expected, where expected is the server's
  rows x (width x bytes per element + optimizer state floats x 4 + 8 bytes of step count and
  version);
- start-up (launch to the line worker 0 prints just before its first step) and samples/s of
  all workers (their epoch lines, so the checkpoint is not counted in it);
- rows and bytes moved (the workers' summaries, as --cache-perf writes them), and the max / mean
  rows served per server (the `server <i>: ...` lines);
- checkpoint write and load rates per server (the `server <i>: checkpoint saved|loaded` lines:
  each server times its own files, fsync included), the executor's save and resume seconds
  (sha256 of every file included), and the servers' peak RSS while resuming.

    python bench/scale.py                               # Criteo Kaggle cardinality, 33,762,577 rows
    python bench/scale.py --modes Herald --iterations 10
    python bench/scale.py --mlperf                      # MLPerf's 202,575,462 rows: see --mlperf

Memory: at the defaults (width 16, row-wise AdaGrad: 84 bytes a row) the servers hold 2.8 GB
together (1.03-1.04x that at peak), the workers 0.1-0.3 GB each; the checkpoint takes 2.8 GB of
disk under --work while a mode runs. The data is generated once into --data (200,000 samples:
about 20 s, 0.4 GB of memory). Every figure but the rows moved varies with the machine's load:
run it on a quiet machine, and compare modes within one run.
"""
import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common.launch import ROOT  # noqa: E402
from common.summaries import worker_summaries  # noqa: E402
from compare_modes import MODES  # noqa: E402

import hetu.ps as ps  # noqa: E402
from hetu import _ps  # noqa: E402
from hetu.launch.processes import descendants  # noqa: E402

# run_hetu.py's optimizers (hetu's registry); their state floats per row are the servers'
# (hetu::optim::state_width)
OPTIMIZER_NAMES = tuple(sorted(ps.OPTIMIZERS))
# per row on a server: a step count and a version, 32 bits each until one could pass 2^31 - 1
# (ps-lite/src/shard_arrays.h), as in every run here
META_BYTES = 8
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}   # --embedding-dtype: a server's row element
MLPERF_SCALE = 6         # --shape criteo --scale 6: 202,575,462 rows, MLPerf's Criteo 1TB tables

SERVED = re.compile(r"\] server (\d+): (\d+) requests, (\d+) rows, (\d+) bytes served, ([\d.]+) s busy$")
CKPT = re.compile(r"\[worker 0\] server (\d+): checkpoint (saved|loaded), (\d+) bytes in ([\d.]+) s")
FIRST_STEP = re.compile(r"\[worker 0\] \S+: \d+ embedding rows x \d+")
# An epoch line's rates: the job's, then this worker's (summed over the workers below).
EPOCH = re.compile(r"\[worker (\d+)\] epoch \d+: .*\([\d.]+ it/s, job \d+ samples/s = \d+ workers? x (\d+) samples/s\)")
SAVED_IN = re.compile(r"\[worker 0\] checkpoint at step \d+ written to .* in ([\d.]+) s")
RESUMED_IN = re.compile(r"\[worker 0\] resumed .* in ([\d.]+) s$")


def role_of(pid):
    """'scheduler', 'server <i>', 'worker <i>' from the process's environment, else None
    (the launcher, its guard, mpirun and shells)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv0 = os.path.basename(f.read().split(b"\0")[0])
    except OSError:
        return None
    role = env.get(b"DMLC_ROLE", b"").decode()
    if not argv0.startswith(b"python"):
        return None
    if role == "scheduler":
        return role
    if role == "server" and b"DMLC_SERVER_ID" in env:
        return f"server {env[b'DMLC_SERVER_ID'].decode()}"
    if role == "worker" and b"OMPI_COMM_WORLD_RANK" in env:
        return f"worker {env[b'OMPI_COMM_WORLD_RANK'].decode()}"
    return None


class PeakRss(threading.Thread):
    """Samples the peak RSS (VmHWM, bytes) of every role below a pid until stop()."""

    def __init__(self, root, interval):
        super().__init__(daemon=True)
        self.root, self.interval, self.peak, self.roles = root, interval, {}, {}
        self._done = threading.Event()

    def run(self):
        while not self._done.is_set():
            for pid in descendants(self.root):
                # Asked again until known: a worker is a shell until it execs the interpreter.
                role = self.roles.get(pid) or role_of(pid)
                self.roles[pid] = role
                if role is None:
                    continue
                try:
                    with open(f"/proc/{pid}/status") as f:
                        hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
                except (OSError, StopIteration):
                    continue
                self.peak[role] = max(self.peak.get(role, 0), hwm)
            self._done.wait(self.interval)

    def stop(self):
        self._done.set()
        self.join()
        return self.peak


def run_job(cmd, interval, timeout, log=None):
    """Runs one job; (its output lines with seconds since launch, peak RSS per role). `log`: a
    file to write the lines to, each with its seconds since launch."""
    start = time.time()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    sampler = PeakRss(proc.pid, interval)
    sampler.start()
    lines = []
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    for line in proc.stdout:
        lines.append((time.time() - start, line.rstrip("\n")))
    proc.wait()
    timer.cancel()
    peak = sampler.stop()
    if log:
        with open(log, "w") as f:
            f.write(" ".join(cmd) + "\n" + "".join(f"{t:8.2f} {line}\n" for t, line in lines))
    if proc.returncode != 0:
        text = "\n".join(line for _, line in lines[-60:])
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{text}")
    return lines, peak


def first(pattern, lines, group=0):
    for t, line in lines:
        m = pattern.search(line)
        if m:
            return t, m.group(group)
    return None, None


def checkpoint_rates(lines, kind):
    """Per server: (bytes, seconds) from its `checkpoint saved|loaded` line."""
    out = {}
    for _, line in lines:
        m = CKPT.search(line)
        if m and m.group(2) == kind:
            out[int(m.group(1))] = (int(m.group(3)), float(m.group(4)))
    return [out[s] for s in sorted(out)]


def row_bytes(width, optimizer, dtype):
    """A row as a server or cache keeps it: values, optimizer state, step count and version."""
    return width * DTYPE_BYTES[dtype] + _ps.optim_state_width(ps.OPTIMIZERS[optimizer], width) * 4 + META_BYTES


def expected_server_bytes(tables, servers, optimizer, dtype):
    """Per server: the rows it holds of every table (strided placement: r mod S) x their row_bytes;
    `tables`: (rows, width) of each table on the servers (a model's embedding and first-order tables)."""
    return [sum(((rows - s + servers - 1) // servers) * row_bytes(width, optimizer, dtype) for rows, width in tables)
            for s in range(servers)]


def checkpoint_tables(ckpt):
    """(rows, width) of every table a checkpoint's servers hold (its meta.json)."""
    with open(os.path.join(ckpt, "meta.json")) as f:
        return [tuple(shape) for _, shape in sorted(json.load(f)["tables"].items())]


def expected_worker_bytes(mode, rows, args):
    """A worker's cache at full capacity (ceil(ratio x rows) rows, hetu.passes.bind_cache); plain
    PS keeps no rows. The interpreter, the model and the batches come on top (a few hundred MB)."""
    if mode == "PS":
        return 0
    return math.ceil(args.ratio * rows) * row_bytes(args.embedding_size, args.optimizer, args.dtype)


def prepare(args):
    """The synthetic dataset (generated once into --data); its meta.json."""
    meta_path = os.path.join(args.data, "meta.json")
    if not os.path.exists(meta_path):
        print(f"generating {args.shape} --scale {args.scale} --rows {args.rows} into {args.data}", flush=True)
        subprocess.run([sys.executable, "-m", "hetu.data.prepare", "synthetic", "--shape", args.shape, "--scale",
                        str(args.scale), "--rows", str(args.rows), "--output", args.data], check=True)
    with open(meta_path) as f:
        return json.load(f)


def mode_flags(mode, args, csv_dir):
    script, flags = MODES[mode]
    return [sys.executable, os.path.join(ROOT, "python/runner.py"), "-w", str(args.workers), "-s",
            str(args.servers), "--timeout", str(args.timeout), sys.executable,
            os.path.join(ROOT, "examples/ctr", script), *flags, "--bsp", "0", "--model", args.model,
            "--data-dir", os.path.abspath(args.data), "--batch-size", str(args.batch),
            "--embedding-size", str(args.embedding_size), "--optimizer", args.optimizer,
            "--embedding-dtype", args.dtype, "--cache-limit-ratio", str(args.ratio), "--iters-per-epoch", str(args.iterations), "--no-progress",
            "--cache-perf", "--csv-dir", csv_dir]


def measure(mode, args, rows, work):
    csv_dir, ckpt = os.path.join(work, mode, "csv"), os.path.join(work, mode, "ckpt")
    os.makedirs(csv_dir, exist_ok=True)
    base = mode_flags(mode, args, csv_dir)
    logs = {k: args.logs and os.path.join(args.logs, f"{mode}-{k}.log") for k in ("train", "resume")}
    lines, peak = run_job(base + ["--nepoch", "1", "--checkpoint", ckpt], args.sample_interval, args.timeout + 120,
                          logs["train"])
    text = [line for _, line in lines]
    # A few steps past the checkpoint: the resumed job loads it, then trains on.
    more = max(1, args.iterations // 10)
    rlines, rpeak = run_job(base + ["--nepoch", f"{1 + more / args.iterations:.6f}", "--resume", ckpt],
                            args.sample_interval, args.timeout + 120, logs["resume"])
    tables = checkpoint_tables(ckpt)
    shutil.rmtree(os.path.join(work, mode), ignore_errors=True)   # checkpoints are GBs

    summaries = worker_summaries(mode, args.workers, 0, "\n".join(text))
    counters = [s["counters"] for s in summaries]
    served = {}
    for line in text:
        m = SERVED.search(line)
        if m:
            served[int(m.group(1))] = int(m.group(3))
    served = [served[s] for s in sorted(served)]
    startup, _ = first(FIRST_STEP, lines)
    epoch = {int(m.group(1)): int(m.group(2)) for m in (EPOCH.search(line) for line in text) if m}
    expected = expected_server_bytes(tables, args.servers, args.optimizer, args.dtype)
    servers = [peak.get(f"server {s}", 0) for s in range(args.servers)]
    workers = [peak.get(f"worker {w}", 0) for w in range(args.workers)]
    return {
        "mode": mode, "dtype": args.dtype, "rows": rows, "width": args.embedding_size, "tables": tables,
        "table_bytes": rows * args.embedding_size * DTYPE_BYTES[args.dtype],
        "startup_s": startup, "samples_per_s": sum(epoch.values()),
        "rows_moved": sum(c["rows_pulled"] + c["rows_pushed"] for c in counters),
        "bytes_moved": sum(c["bytes_pulled"] + c["bytes_pushed"] for c in counters),
        "served_rows": served, "served_max_mean": max(served) / (sum(served) / len(served)) if served else None,
        "peak_rss": {"scheduler": peak.get("scheduler", 0), "servers": servers, "workers": workers},
        "server_expected_bytes": expected,
        "server_peak_over_expected": [p / e for p, e in zip(servers, expected)],
        "worker_expected_bytes": expected_worker_bytes(mode, rows, args),
        "worker_peak_over_expected": [p / expected_worker_bytes(mode, rows, args) if mode != "PS" else None
                                      for p in workers],
        "resume_peak_rss": {"servers": [rpeak.get(f"server {s}", 0) for s in range(args.servers)],
                            "workers": [rpeak.get(f"worker {w}", 0) for w in range(args.workers)]},
        "checkpoint_saved": checkpoint_rates(lines, "saved"), "checkpoint_loaded": checkpoint_rates(rlines, "loaded"),
        "save_s": float(first(SAVED_IN, lines, 1)[1] or "nan"), "resume_s": float(first(RESUMED_IN, rlines, 1)[1] or "nan"),
    }


def gib(n):
    return f"{n / 2**30:.2f}"


def rates(pairs):
    return " / ".join(f"{b / s / 1e6:.0f}" if s > 0 else "-" for b, s in pairs)


def worker_column(r):
    """A worker's expected cache bytes and its peak over them: the cache is a small part of a
    worker, whose interpreter, model and batches it does not count."""
    ratios = [x for x in r["worker_peak_over_expected"] if x is not None]
    return gib(r["worker_expected_bytes"]) + (f" ({' '.join(f'{x:.1f}x' for x in ratios)})" if ratios else "")


def table(results):
    print("\n| mode | dtype | rows | table GiB | start-up s | samples/s | rows moved | MiB moved | "
          "max/mean rows served | peak RSS GiB: scheduler / servers / workers | server peak / expected | "
          "worker cache GiB expected (peak / it) | server peak resuming GiB | ckpt write MB/s per server | ckpt load MB/s per server | "
          "save / resume s (executor) |")
    print("|---" * 16 + "|")
    for r in results:
        p, rp = r["peak_rss"], r["resume_peak_rss"]
        print(f"| {r['mode']} | {r['dtype']} | {r['rows']:,} | {gib(r['table_bytes'])} | "
              f"{r['startup_s']:.1f} | {r['samples_per_s']:,} | {r['rows_moved']:,} | {r['bytes_moved'] / 2**20:.0f} | "
              f"{r['served_max_mean']:.2f} | {gib(p['scheduler'])} / {' '.join(gib(x) for x in p['servers'])} / "
              f"{' '.join(gib(x) for x in p['workers'])} | "
              f"{' '.join(f'{x:.2f}' for x in r['server_peak_over_expected'])} | {worker_column(r)} | "
              f"{' '.join(gib(x) for x in rp['servers'])} | {rates(r['checkpoint_saved'])} | "
              f"{rates(r['checkpoint_loaded'])} | {r['save_s']:.1f} / {r['resume_s']:.1f} |", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", nargs="+", default=["PS", "HET", "Herald"], choices=["PS", "HET", "Herald"])
    p.add_argument("--shape", default="criteo", choices=["criteo", "criteo-multihot"])
    p.add_argument("--scale", type=float, default=1.0, help="table cardinality; 1: Criteo Kaggle's 33,762,577 rows")
    p.add_argument("--mlperf", action="store_true",
                   help=f"--scale {MLPERF_SCALE} (202,575,462 rows, the size of MLPerf's Criteo 1TB tables). "
                   "Memory at width 16, row-wise AdaGrad, S = 2: 84 bytes a row, 8.5 GB (7.9 GiB) a server, "
                   "17 GB for the servers (their peak was 1.03-1.04x of this at 33.8M rows), under 1 GB for "
                   "the workers: about 18-19 GB in all; SGD: 16 GB for the servers. Disk: 17 GB for the "
                   "checkpoint under --work, written at the disk's rate (about 80 s at 110 MB/s a "
                   "server). Only on a machine with that much free memory")
    p.add_argument("--rows", type=int, default=200000, help="samples of the generated data")
    p.add_argument("--data", default=None, help="folder of the generated data (default: under the temporary folder "
                   "of the system, kept for the next run)")
    p.add_argument("--work", default=None, help="folder for checkpoints and CSVs (default: a temporary one)")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--servers", type=int, default=2)
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--embedding-size", type=int, default=16)
    p.add_argument("--optimizer", default="rowwise_adagrad", choices=OPTIMIZER_NAMES)
    p.add_argument("--dtype", default="fp32", choices=sorted(DTYPE_BYTES), help="--embedding-dtype: the type rows are stored and moved in")
    p.add_argument("--ratio", type=float, default=0.01, help="--cache-limit-ratio of HET and Herald")
    p.add_argument("--sample-interval", type=float, default=0.5, help="seconds between RSS samples")
    p.add_argument("--timeout", type=int, default=1800, help="seconds a job may take")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--logs", default=None, help="a folder for each job's output, every line with its seconds "
                   "since launch")
    args = p.parse_args()
    if args.mlperf:
        args.scale = MLPERF_SCALE if args.shape == "criteo" else 1.0
    args.model = "wdl_criteo" if args.shape == "criteo" else "dlrm_criteo_multihot"
    if args.data is None:
        args.data = os.path.join(tempfile.gettempdir(), f"hetu-scale-{args.shape}-s{args.scale:g}-r{args.rows}")
    if args.logs:
        os.makedirs(args.logs, exist_ok=True)
    meta = prepare(args)
    rows = int(meta["num_embeddings"])
    work = args.work or tempfile.mkdtemp(prefix="hetu-scale-")
    print(f"{args.shape} --scale {args.scale:g}: {rows:,} rows x {args.embedding_size} ({args.dtype}), "
          f"{args.optimizer}; W = {args.workers}, S = {args.servers}, b = {args.batch}, {args.iterations} "
          f"iterations, cache ratio {args.ratio}", flush=True)
    results = []
    try:
        for mode in args.modes:
            results.append(measure(mode, args, rows, work))
            table(results[-1:])
    finally:   # a failed job leaves its checkpoint (GBs) otherwise
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)
    table(results)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": vars(args), "results": results}, f, indent=1)
        print(f"written to {args.json}")


if __name__ == "__main__":
    main()
