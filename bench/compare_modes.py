"""Plain PS vs HET (--cache lru --bound 0 --bsp 0) vs Herald, side by side in one run.

Each configuration (workers W, per-worker batch b, cache ratio) trains the same model on the
same synthetic Criteo-shaped data with every mode, each as a real local cluster
(python/runner.py: 1 server, W workers), and reports per mode: rows pulled and pushed (all
workers), transmissions relative to plain PS and to HET, cache hit rate, samples/s, scheduler
time and time waiting for the plan (as a share of the run). Ablations: "Herald greedy" (the
cache-score allocator of docs/design.md instead of the co-locating one), "plan only" (Herald with
--allocator none) and "allocator only" (Herald's allocation with the HET protocol).
Throughput is the median over --repeats runs, which take the modes in turn; transmissions are
deterministic.

    python bench/compare_modes.py --quick            # one small configuration (the demo)
    python bench/compare_modes.py                    # the full grid of the README
    python bench/compare_modes.py --plot rows.png    # also plot rows moved per iteration
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

from common.launch import ROOT
from common.summaries import cache_perf_rows, worker_summaries

MODES = {
    "PS": ("run_hetu.py", ["--comm", "Hybrid"]),
    "HET": ("run_hetu.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"]),
    "Herald": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"]),
    "Herald greedy": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--allocator", "greedy"]),
    "plan only": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--allocator", "none"]),
    "allocator only": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--protocol", "het"]),
    # Every worker plans for itself (the default is one planner per host, run by its first worker).
    "Herald own planners": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--planners", "worker"]),
    # With --prefetch, both caches send a step's pull during the step before.
    "HET prefetch": ("run_hetu.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--prefetch"]),
    "Herald prefetch": ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--prefetch"]),
}
DEFAULT_MODES = ["PS", "HET", "Herald", "Herald greedy", "plan only", "allocator only"]
# The name train.py gives each mode's --cache-perf CSV files (for --plot).
CSV_TAGS = {"PS": "Hybrid", "HET": "het-Hybrid-lru-b0", "Herald": "herald-Hybrid-lru",
            "Herald greedy": "herald-Hybrid-lru-greedy",
            "plan only": "herald-Hybrid-lru-noalloc", "allocator only": "herald-Hybrid-lru-hetprotocol"}


def mode_command(mode, workers, batch, ratio, args, csv_dir, cluster_file=None):
    """The command line of one run of `mode`: a local cluster of 1 server and `workers` workers,
    or the hosts of `cluster_file` (a runner cluster description)."""
    script, flags = MODES[mode]
    where = ["-c", cluster_file] if cluster_file else ["-w", str(workers), "-s", "1"]
    van = ["--van", args.van] if getattr(args, "van", None) else []
    return [sys.executable, os.path.join(ROOT, "python/runner.py"), *where, *van,
            "--timeout", str(args.timeout), sys.executable, os.path.join(ROOT, "examples/ctr", script),
            *flags, "--bsp", "0", "--model", args.model, "--batch-size", str(batch),
            "--embedding-size", str(args.embedding_size), "--cache-limit-ratio", str(ratio),
            "--iters-per-epoch", str(args.iterations), *data_flags(args), "--no-progress",
            "--embedding-dtype", getattr(args, "embedding_dtype", "fp32"),
            "--cache-perf", "--csv-dir", csv_dir]


def add_data_arguments(parser, rows):
    """--rows (synthetic samples, default `rows`) and --data-dir, as data_flags reads them."""
    parser.add_argument("--rows", type=int, default=rows, help="synthetic samples")
    parser.add_argument("--data-dir", default=None,
                        help="a prepared dataset instead of the synthetic one (with a --model for it)")


def data_flags(args):
    """A prepared dataset (read in its stored order), or synthetic data of --rows samples."""
    data_dir = getattr(args, "data_dir", None)
    return ["--data-dir", os.path.abspath(data_dir)] if data_dir else ["--rows", str(args.rows)]


def run_mode(mode, workers, batch, ratio, args, csv_dir, cluster_file=None):
    """One run of `mode` (see mode_command); the workers' summaries."""
    cmd = mode_command(mode, workers, batch, ratio, args, csv_dir, cluster_file)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60)
    return worker_summaries(mode, workers, proc.returncode, proc.stdout, proc.stderr)


def aggregate(summaries, batch):
    c = [s["counters"] for s in summaries]
    total = lambda f: sum(x[f] for x in c)
    seconds = max(s["seconds"] for s in summaries)
    lookups = total("hits") + total("misses")
    return {"pulled": total("rows_pulled"), "pushed": total("rows_pushed"),
            "rows": total("rows_pulled") + total("rows_pushed"),
            "bytes": total("bytes_pulled") + total("bytes_pushed"),
            "hit_rate": total("hits") / lookups if lookups else 0.0,
            "samples_per_s": sum(s["iterations"] * batch for s in summaries) / seconds,
            "sched_s": total("scheduler_seconds") / len(c), "wait_share": total("plan_wait_seconds") / len(c) / seconds,
            "seconds": seconds}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="one configuration: W=2, b=256, ratio 0.1, embedding 32")
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--batch", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--ratios", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    p.add_argument("--modes", nargs="+", default=DEFAULT_MODES, choices=list(MODES))
    p.add_argument("--model", default="wdl_criteo")
    p.add_argument("--embedding-size", type=int, default=128)
    p.add_argument("--embedding-dtype", default="fp32", choices=["fp32", "bf16", "fp16"],
                   help="the type embedding rows are stored and moved in")
    p.add_argument("--iterations", type=int, default=40)
    add_data_arguments(p, rows=500000)
    p.add_argument("--repeats", type=int, default=1, help="runs per mode; samples/s is the median")
    p.add_argument("--van", choices=["zmq", "ucx"], default=None, help="parameter-server transport (runner --van)")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--plot", default=None, help="PNG of rows moved per iteration (first configuration)")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()
    if args.quick:
        args.workers, args.batch, args.ratios, args.embedding_size = [2], [256], [0.1], 32
        args.iterations, args.rows = min(args.iterations, 30), min(args.rows, 200000)

    results = []
    header = (f"{'W':>2} {'b':>5} {'ratio':>5}  {'mode':<19}{'pulled':>10}{'pushed':>10}{'vs PS':>8}{'vs HET':>8}"
              f"{'hit rate':>9}{'samples/s':>11}{'sched s':>9}{'wait %':>7}")
    print(header)
    print("-" * len(header))
    plot_series = {}
    for workers, batch, ratio in itertools.product(args.workers, args.batch, args.ratios):
        # The repeats go round the modes in turn, so that a slow spell of this shared machine
        # falls on every mode alike.
        runs = {mode: [] for mode in args.modes}
        for r in range(args.repeats):
            for mode in args.modes:
                with tempfile.TemporaryDirectory() as csv_dir:
                    runs[mode].append(aggregate(run_mode(mode, workers, batch, ratio, args, csv_dir), batch))
                    if args.plot and mode in CSV_TAGS and not plot_series.get(mode) and r == 0:
                        plot_series[mode] = cache_perf_rows(csv_dir, f"*-{CSV_TAGS[mode]}")[0]
        base = {}
        for mode in args.modes:
            agg = dict(runs[mode][0], samples_per_s=statistics.median(x["samples_per_s"] for x in runs[mode]))
            base[mode] = agg
            vs_ps = agg["rows"] / base["PS"]["rows"] if "PS" in base else float("nan")
            vs_het = agg["rows"] / base["HET"]["rows"] if "HET" in base else float("nan")
            print(f"{workers:>2} {batch:>5} {ratio:>5}  {mode:<19}{agg['pulled']:>10}{agg['pushed']:>10}"
                  f"{vs_ps:>8.3f}{vs_het:>8.3f}{agg['hit_rate']:>9.3f}{agg['samples_per_s']:>11.0f}"
                  f"{agg['sched_s']:>9.2f}{100 * agg['wait_share']:>7.2f}", flush=True)
            results.append({"workers": workers, "batch": batch, "ratio": ratio, "mode": mode, **agg,
                            "vs_ps": vs_ps, "vs_het": vs_het})
        if "Herald" in base and "HET" in base:
            saved = 1 - base["Herald"]["rows"] / base["HET"]["rows"]
            speed = base["Herald"]["samples_per_s"] / base["HET"]["samples_per_s"]
            print(f"{'':>15}Herald vs HET: {100 * saved:.1f}% fewer rows, {speed:.2f}x samples/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.plot and plot_series:
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            print("matplotlib is not installed: no plot (pip install matplotlib)")
            return
        fig, ax = plt.subplots(figsize=(7, 4))
        for mode, series in plot_series.items():
            ax.plot(range(len(series)), series, label=mode)
        ax.set_xlabel("iteration")
        ax.set_ylabel("embedding rows moved (all workers)")
        ax.set_title(f"W={args.workers[0]}, b={args.batch[0]}, cache ratio {args.ratios[0]}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot written to {args.plot}")


if __name__ == "__main__":
    main()
