"""How far float32 rounding alone moves trained parameters: the envelope an equivalence test's
bound must hold on every CPU (docs/design.md section 4).

NumPy's OpenBLAS picks its GEMM kernel per CPU (DYNAMIC_ARCH); OPENBLAS_CORETYPE forces one. For
every kernel this CPU can run, the script trains the single-process reference (batch W*b) and the
W-worker PS run (batch b each) for the same steps, and prints, per optimizer, learning rate and
step count:
  single vs single@ref : the reference under this kernel against the reference under the kernel
                         OpenBLAS picks here: the same program, other rounding;
  W-worker vs single   : the distributed run against the reference, both under this kernel: what
                         an equivalence test measures on a CPU whose OpenBLAS picks this kernel.
Each figure is the largest relative L2 error over the parameters (the worst tensor is named).
With --first-step it shows where a run first departs: the elements that differ after one step,
and their gradients. With --suite it runs the equivalence tests themselves under every kernel and prints, per test,
its largest error as a fraction of its bound (tests/dist_harness.py).

    python bench/exactness_envelope.py --optimizers sgd adam --lrs 0.01 0.001 --steps 1 5 20 60
    python bench/exactness_envelope.py --suite
    python bench/exactness_envelope.py --first-step --lrs 0.01 --kernels Haswell SkylakeX
"""
import argparse
import collections
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from blas_kernels import KERNELS, openblas_kernel, runnable  # noqa: E402
from dist_harness import run_cluster, run_single  # noqa: E402

# The suites whose tests compare trained parameters with the single-process reference.
EQUIVALENCE_SUITES = ["test_dist_equivalence.py", "test_cache.py", "test_herald.py", "test_checkpoint.py",
                      "test_planner_threads.py", "test_catch_up.py"]

def worst(a, b):
    errs = {k: float(np.linalg.norm(a[k].astype(np.float64) - b[k]) / (np.linalg.norm(b[k].astype(np.float64)) or 1))
            for k in b}
    name = max(errs, key=errs.get)
    return errs[name], name


def steps_table(args, kernels):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="envelope-"))
    home = args.data_home or str(tmp / "data")
    W, b = args.workers, args.batch
    print(f"\n| optimizer | lr | steps | kernel | single vs single@ref | {W}-worker vs single |")
    print("|---|---|---|---|---|---|")
    for opt in args.optimizers:
        for lr in args.lrs:
            for n in args.steps:
                flags = ["--optimizer", opt, "--learning-rate", str(lr), "--iters-per-epoch", str(n), "--nepoch", "1"]
                os.environ.pop("OPENBLAS_CORETYPE", None)
                ref, _ = run_single(tmp, home, "run_hetu.py", flags, global_batch=W * b)
                for kernel in kernels:
                    os.environ["OPENBLAS_CORETYPE"] = kernel
                    single, _ = run_single(tmp, home, "run_hetu.py", flags, global_batch=W * b)
                    dist, _ = run_cluster(tmp, home, "run_hetu.py", ["--comm", "PS", "--bsp", "0", *flags], W, 1, b)
                    e1, n1 = worst(single, ref)
                    e2, n2 = worst(dist, single)
                    print(f"| {opt} | {lr:g} | {n} | {kernel} | {e1:.1e} ({n1}) | {e2:.1e} ({n2}) |", flush=True)
    os.environ.pop("OPENBLAS_CORETYPE", None)


def suite_table(args, kernels):
    """Every equivalence test under every kernel: its largest error as a fraction of its bounds."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="envelope-"))
    worst_of = collections.defaultdict(dict)   # test -> kernel -> (of_bound, rows_of_bound)
    for kernel in kernels:
        log = tmp / f"{kernel}.jsonl"
        env = dict(os.environ, OPENBLAS_CORETYPE=kernel, HETU_EXACTNESS_LOG=str(log))
        select = ["-k", args.select] if args.select else []
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *select, *args.suites],
                              cwd=REPO / "tests", env=env, capture_output=True, text=True)
        print(f"{kernel}: {proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-500:]}",
              flush=True)
        for line in log.read_text().splitlines() if log.exists() else []:
            r = json.loads(line)
            a, b = worst_of[r["test"]].get(kernel, (0.0, 0.0))
            worst_of[r["test"]][kernel] = (max(a, r["of_bound"]), max(b, r["rows_of_bound"]))
    print("\nLargest error over a test's tensors as a fraction of its bound: tensor (relative L2 / 1e-5), "
          "rows (worst row against its row bound)\n")
    print("| test | " + " | ".join(kernels) + " |")
    print("|---|" + "---|" * len(kernels))
    for test in sorted(worst_of):
        cells = [f"{worst_of[test][k][0]:.3f} / {worst_of[test][k][1]:.3f}" if k in worst_of[test] else "-"
                 for k in kernels]
        print(f"| {test.split('::', 1)[1]} | " + " | ".join(cells) + " |")
    overall = [v for t in worst_of.values() for v in t.values()]
    if overall:
        print(f"\nlargest over all: tensor {max(v[0] for v in overall):.3f} of its bound, "
              f"rows {max(v[1] for v in overall):.3f} of theirs")


def first_step(args, kernels):
    """Where a run first departs: after one step, the elements of each tensor that differ between
    the W-worker run and the reference under `kernel`, with their gradient (from two one-step SGD
    runs of the reference at lr 1 and 2: g = w(1) - w(2), resolved to about 1e-8)."""
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="envelope-"))
    home = args.data_home or str(tmp / "data")
    W, b = args.workers, args.batch
    one = ["--iters-per-epoch", "1", "--nepoch", "1"]
    for kernel in kernels:
        os.environ["OPENBLAS_CORETYPE"] = kernel
        sgd = [run_single(tmp, home, "run_hetu.py", ["--optimizer", "sgd", "--learning-rate", str(lr), *one],
                          global_batch=W * b)[0] for lr in (1.0, 2.0)]
        opt = ["--optimizer", "adam", "--learning-rate", str(args.lrs[0]), *one]
        single, _ = run_single(tmp, home, "run_hetu.py", opt, global_batch=W * b)
        dist, _ = run_cluster(tmp, home, "run_hetu.py", ["--comm", "PS", "--bsp", "0", *opt], W, 1, b)
        print(f"\n{kernel}: one Adam step (lr {args.lrs[0]:g}), {W}-worker run against the reference\n")
        print("| tensor | elements differing | relative L2 | largest difference | its gradient | median abs gradient |")
        print("|---|---|---|---|---|---|")
        for name in single:
            g = sgd[0][name].astype(np.float64) - sgd[1][name]
            d = np.abs(dist[name].astype(np.float64) - single[name]).ravel()
            i = int(np.argmax(d))
            rel = np.linalg.norm(d) / (np.linalg.norm(single[name].astype(np.float64)) or 1)
            print(f"| {name} | {int(np.count_nonzero(d))} of {d.size} | {rel:.1e} | {d[i]:.1e} | {g.ravel()[i]:.1e} | "
                  f"{np.median(np.abs(g)):.1e} |", flush=True)
    os.environ.pop("OPENBLAS_CORETYPE", None)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", action="store_true",
                   help="run the equivalence tests under every kernel instead, and tabulate error / bound per test")
    p.add_argument("--first-step", action="store_true",
                   help="instead: after one Adam step, which elements differ and what their gradient was")
    p.add_argument("--suites", nargs="+", default=EQUIVALENCE_SUITES, help="with --suite: test files or node ids")
    p.add_argument("--select", default=None, metavar="EXPR", help="with --suite: only the tests pytest -k EXPR selects")
    p.add_argument("--optimizers", nargs="+", default=["sgd", "adam"])
    p.add_argument("--lrs", nargs="+", type=float, default=[0.01, 0.001])
    p.add_argument("--steps", nargs="+", type=int, default=[1, 5, 20, 60])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="per worker; the reference runs W times that")
    p.add_argument("--kernels", nargs="+", default=None, help="OpenBLAS core types (default: every one this CPU can run)")
    p.add_argument("--data-home", default=None, help="synthetic data cache (default: a temporary folder)")
    args = p.parse_args()

    kernels = args.kernels or [name for name, _ in KERNELS if runnable(name)]
    skipped = [name for name, _ in KERNELS if not runnable(name)]
    os.environ.pop("OPENBLAS_CORETYPE", None)
    print(f"OpenBLAS picks {openblas_kernel() or '(not OpenBLAS)'} here; kernels run: {' '.join(kernels)}"
          + (f"; this CPU cannot run: {' '.join(skipped)}" if skipped else ""), flush=True)
    (suite_table if args.suite else first_step if args.first_step else steps_table)(args, kernels)


if __name__ == "__main__":
    main()
