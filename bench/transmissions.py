"""Embedding rows moved per iteration: plain PS (no cache) vs the HET cache at several cache ratios.

For each number of workers W and cache ratio, every mode trains WDL on the same synthetic
Criteo-shaped data as a real local cluster (python/runner.py: 1 server, W workers; the runs of
bench/compare_modes.py, `--bsp 0`, HET is `--cache lru --bound 0`) and reports rows pulled,
rows pushed, their total relative to plain PS, the cache hit rate and evictions. Figures are per
iteration: the total over all workers divided by the number of iterations. Plain PS keeps no
cache, so it runs once per W and its row stands at every ratio. Transmission counts are
deterministic (fixed data, seed and schedule), so one run per point is enough. `--modes` takes
any mode of compare_modes.py (Herald, its ablations) beside PS and HET.

    python bench/transmissions.py                                  # the table of the README
    python bench/transmissions.py --modes PS HET Herald --ratios 0.1
    python bench/transmissions.py --workers 2 --ratios 0.1 --json rows.json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_modes  # noqa: E402  (bench/compare_modes.py: run_mode, aggregate, MODES)


def measure(mode, workers, ratio, args):
    """One cluster run of `mode`; rows, hit rate and evictions per iteration (all workers)."""
    with tempfile.TemporaryDirectory() as csv_dir:
        try:   # a failed run exits inside run_mode with the cluster's output
            summaries = compare_modes.run_mode(mode, workers, args.batch, ratio, args, csv_dir)
        except subprocess.TimeoutExpired:
            sys.exit(f"{mode} (W={workers}, ratio={ratio}) did not finish within {args.timeout + 60} s")
    iterations = {s["iterations"] for s in summaries}
    if len(iterations) != 1:
        sys.exit(f"{mode} (W={workers}, ratio={ratio}): workers ran different iteration counts {sorted(iterations)}")
    n = iterations.pop()
    agg = compare_modes.aggregate(summaries, args.batch)
    evictions = sum(s["counters"]["evictions"] for s in summaries)
    return {"iterations": n, "pulled": agg["pulled"] / n, "pushed": agg["pushed"] / n, "rows": agg["rows"] / n,
            "hit_rate": agg["hit_rate"], "evictions": evictions / n, "seconds": agg["seconds"]}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--ratios", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.2])
    p.add_argument("--modes", nargs="+", default=["PS", "HET"], choices=list(compare_modes.MODES))
    p.add_argument("--model", default="wdl_criteo")
    p.add_argument("--batch", type=int, default=256, help="per-worker batch")
    p.add_argument("--embedding-size", type=int, default=32, help="row counts do not depend on it")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--rows", type=int, default=200000, help="synthetic samples")
    p.add_argument("--timeout", type=int, default=900, help="seconds per cluster run")
    p.add_argument("--json", default=None, help="also write the results here")
    args = p.parse_args()

    print(f"{args.model}, b={args.batch}, {args.iterations} iterations; rows per iteration = total over all "
          f"workers / iterations; PS has no cache and runs once per W")
    header = (f"{'W':>2} {'ratio':>5}  {'mode':<15}{'pulled/it':>11}{'pushed/it':>11}{'total/it':>11}"
              f"{'vs PS':>8}{'hit rate':>9}{'evict/it':>10}")
    print(header)
    print("-" * len(header), flush=True)
    results = []
    for workers in args.workers:
        ps = measure("PS", workers, args.ratios[0], args) if "PS" in args.modes else None
        for ratio in args.ratios:
            for mode in args.modes:
                r = ps if mode == "PS" else measure(mode, workers, ratio, args)
                vs_ps = r["rows"] / ps["rows"] if ps else float("nan")
                print(f"{workers:>2} {ratio:>5}  {mode:<15}{r['pulled']:>11.1f}{r['pushed']:>11.1f}{r['rows']:>11.1f}"
                      f"{vs_ps:>8.3f}{r['hit_rate']:>9.3f}{r['evictions']:>10.1f}", flush=True)
                results.append({"workers": workers, "ratio": ratio, "mode": mode, "batch": args.batch, **r,
                                "vs_ps": vs_ps})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
