"""Where a run's CPU goes, HET vs Herald side by side: CPU seconds per role (scheduler, server,
worker) and thread (the main thread, Herald's planner "herald-plan", ZMQ's I/O thread, the
loader threads), summed over the processes of the role and taken from /proc while the run goes.

On a machine whose cores the whole cluster shares, samples/s follows the cluster's total CPU,
so this says what Herald adds (its planner) and what it saves (the server's and the workers'
work on rows that no longer move) against HET.

    python bench/cpu_split.py --workers 4 --batch 256 --iterations 200 --repeats 3

Same configuration flags as compare_modes.py; medians over --repeats runs, which take the
modes in turn. Linux only (/proc).
"""
import argparse
import collections
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_modes  # noqa: E402  (mode_command, aggregate, MODES)
from common.summaries import worker_summaries  # noqa: E402

TICK = os.sysconf("SC_CLK_TCK")


def role_of(pid):
    """DMLC_ROLE of a process, or None for one that is not part of a cluster."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            for var in f.read().split(b"\0"):
                if var.startswith(b"DMLC_ROLE="):
                    return var[len(b"DMLC_ROLE="):].decode()
    except OSError:
        pass
    return None


def thread_cpu(pid):
    """{(thread id, thread name): CPU seconds so far} of one process; the main thread is 'main'."""
    out = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = "main" if tid == pid else f.read().strip()
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[(tid, name)] = (int(fields[11]) + int(fields[12])) / TICK   # utime + stime
    except OSError:
        pass   # it exited between the listing and the reads: its last sample stands
    return out


def run_sampled(cmd, timeout, period=0.2):
    """Runs cmd; returns (returncode, stdout, {(role, thread name): CPU seconds})."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    roles, last = {}, {}
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit(f"{' '.join(cmd[:4])}...: no end after {timeout} s")
        for pid in filter(str.isdigit, os.listdir("/proc")):
            if pid not in roles:
                roles[pid] = role_of(pid)
            if roles[pid]:
                for (tid, name), seconds in thread_cpu(pid).items():
                    last[(pid, tid)] = (roles[pid], name, seconds)
        time.sleep(period)
    reader.join()
    split = collections.Counter()
    for role, name, seconds in last.values():
        split[(role, name)] += seconds
    return proc.returncode, "".join(lines), split


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--ratio", type=float, default=0.1)
    p.add_argument("--modes", nargs="+", default=["HET", "Herald"], choices=list(compare_modes.MODES))
    p.add_argument("--model", default="wdl_criteo")
    p.add_argument("--embedding-size", type=int, default=128)
    p.add_argument("--iterations", type=int, default=200)
    compare_modes.add_data_arguments(p, rows=500000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args()
    if not os.path.isdir("/proc/self/task"):
        sys.exit("cpu_split.py reads /proc: Linux only")

    splits = {mode: [] for mode in args.modes}
    speeds = {mode: [] for mode in args.modes}
    for _ in range(args.repeats):
        for mode in args.modes:
            with tempfile.TemporaryDirectory() as csv_dir:
                cmd = compare_modes.mode_command(mode, args.workers, args.batch, args.ratio, args, csv_dir)
                code, out, split = run_sampled(cmd, args.timeout + 60)
                summaries = worker_summaries(mode, args.workers, code, out)
                speeds[mode].append(compare_modes.aggregate(summaries, args.batch)["samples_per_s"])
                splits[mode].append(split)

    keys = sorted({k for runs in splits.values() for split in runs for k in split})
    keys = [k for k in keys if max(s[k] for runs in splits.values() for s in runs) >= 0.05]
    print(f"CPU seconds per role and thread, W={args.workers}, b={args.batch}, ratio {args.ratio}, "
          f"{args.iterations} iterations, the whole run (start-up included); median of {args.repeats}")
    header = f"{'role/thread':<28}" + "".join(f"{m:>14}" for m in args.modes)
    print(header)
    print("-" * len(header))
    for key in keys:
        print(f"{key[0] + '/' + key[1]:<28}" +
              "".join(f"{statistics.median(s[key] for s in splits[m]):>14.2f}" for m in args.modes))
    for role in sorted({k[0] for k in keys}):
        print(f"{role + ' (all threads)':<28}" + "".join(
            f"{statistics.median(sum(v for k, v in s.items() if k[0] == role) for s in splits[m]):>14.2f}"
            for m in args.modes))
    print(f"{'total':<28}" + "".join(f"{statistics.median(sum(s.values()) for s in splits[m]):>14.2f}"
                                     for m in args.modes))
    print(f"{'samples/s':<28}" + "".join(f"{statistics.median(speeds[m]):>14.0f}" for m in args.modes))


if __name__ == "__main__":
    main()
