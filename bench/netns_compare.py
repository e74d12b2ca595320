"""Plain PS vs HET vs Herald on emulated hosts: one network namespace per worker and one for the
scheduler and server, every host's link shaped (tbf) to each --rates value, both directions.

All embedding rows and the dense AllReduce cross the shaped links, and the server's one link
carries every worker's traffic, as on a real cluster with one parameter server. The hosts share
this machine's cores, so compute is as slow as on the local runs; what changes is the network.
Each cell is the median samples/s of --repeats runs (all modes of one repeat run back to back).

Needs root, iproute2, openssh-server and mpirun (hetu_tools.netns); prints why otherwise.

    python bench/netns_compare.py                                    # W=2, 1 and 10 Gbit/s
    python bench/netns_compare.py --workers 2 4 --rates 1gbit 10gbit --repeats 3
    python bench/netns_compare.py --rates 1gbit --embedding-dtypes fp32 bf16   # rows in 32 and 16 bits
"""
import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_modes  # noqa: E402  (run_mode, aggregate: one run of a mode, and its totals)

from hetu_tools.netns import NamespaceHosts, NetnsUnavailable, shape, unshape  # noqa: E402

def run_on_hosts(hosts, workers, rate, args):
    """{mode: [aggregate per repeat]} with every link shaped to `rate` (None: unshaped veth), rows
    in args.embedding_dtype."""
    rate = None if rate == "none" else rate
    for h in hosts:
        if rate:
            shape(h, rate=rate, delay=None)
        else:
            unshape(h)
    results = {m: [] for m in args.modes}
    with tempfile.TemporaryDirectory() as d:
        cluster = hosts.write_cluster_file(os.path.join(d, "cluster.yml"), workers=[0] + [1] * workers,
                                           servers=[1] + [0] * workers, chief=0)
        for _ in range(args.repeats):
            for mode in args.modes:
                with tempfile.TemporaryDirectory() as csv_dir:
                    summaries = compare_modes.run_mode(mode, workers, args.batch, args.ratio, args, csv_dir,
                                                       cluster_file=cluster)
                    results[mode].append(compare_modes.aggregate(summaries, args.batch))
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workers", type=int, nargs="+", default=[2])
    p.add_argument("--rates", nargs="+", default=["1gbit", "10gbit"],
                   help="tc rates of every host's link; 'none' for unshaped veth")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--ratio", type=float, default=0.1, help="cache size as a share of each table's rows")
    p.add_argument("--model", default="wdl_criteo")
    p.add_argument("--embedding-size", type=int, default=128)
    p.add_argument("--embedding-dtypes", nargs="+", default=["fp32"], choices=["fp32", "bf16", "fp16"],
                   help="the types embedding rows are stored and moved in: each is a row of the table")
    p.add_argument("--iterations", type=int, default=30)
    compare_modes.add_data_arguments(p, rows=200000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--modes", nargs="+", default=["PS", "HET", "Herald"], choices=list(compare_modes.MODES),
                   help="compare_modes' modes; PS and HET are the reference columns")
    p.add_argument("--timeout", type=int, default=900)
    args = p.parse_args()

    header = (f"{'W':>2} {'link':>7} {'rows':>5}  {'mode':<19}{'rows moved':>11}{'MB moved':>9}{'samples/s':>11}{'runs (samples/s)':>28}"
              f"{'vs PS':>7}{'vs HET':>7}")
    print(f"W workers, b={args.batch}, embedding {args.embedding_size}, cache ratio {args.ratio}, "
          f"{args.iterations} iterations, median of {args.repeats}")
    print(header)
    print("-" * len(header))
    for workers in args.workers:
        try:
            with NamespaceHosts(workers + 1) as hosts:
                for rate in args.rates:
                    for dtype in args.embedding_dtypes:
                        args.embedding_dtype = dtype
                        report(workers, None if rate == "none" else rate, dtype,
                               run_on_hosts(hosts, workers, rate, args))
        except NetnsUnavailable as e:
            sys.exit(f"cannot make or shape namespace hosts here: {e}")


def report(workers, rate, dtype, res):
    speed = {m: statistics.median(r["samples_per_s"] for r in res[m]) for m in res}
    for m in res:
        runs = " ".join(f"{r['samples_per_s']:.0f}" for r in res[m])
        ratio = lambda ref: speed[m] / speed[ref] if ref in speed else float("nan")
        print(f"{workers:>2} {rate or 'veth':>7} {dtype:>5}  {m:<19}{res[m][0]['rows']:>11}{res[m][0]['bytes'] / 1e6:>9.1f}{speed[m]:>11.0f}"
              f"{runs:>28}{ratio('PS'):>7.2f}{ratio('HET'):>7.2f}", flush=True)
    if "Herald" in res and "HET" in res:
        het, herald = res["HET"][0], res["Herald"][0]
        print(f"{'':>18}Herald vs HET: {1 - herald['rows'] / het['rows']:.1%} fewer rows "
              f"({herald['bytes'] / 1e6:.1f} against {het['bytes'] / 1e6:.1f} MB), "
              f"{speed['Herald'] / speed['HET']:.2f}x samples/s", flush=True)

if __name__ == "__main__":
    main()
