"""How far float32 rounding alone moves trained parameters: the envelope an equivalence test's
bound must hold on every CPU (DESIGN.md section 4).

NumPy's OpenBLAS picks its GEMM kernel per CPU (DYNAMIC_ARCH); OPENBLAS_CORETYPE forces one. For
every kernel this CPU can run, the script trains the single-process reference (batch W*b) and the
W-worker PS run (batch b each) for the same steps, and prints, per optimizer, learning rate and
step count:
  single vs single@ref : the reference under this kernel against the reference under the kernel
                         OpenBLAS picks here: the same program, other rounding;
  W-worker vs single   : the distributed run against the reference, both under this kernel: what
                         an equivalence test measures on a CPU whose OpenBLAS picks this kernel.
Each figure is the largest relative L2 error over the parameters (the worst tensor is named).

    python bench/exactness_envelope.py --optimizers sgd adam --lrs 0.01 0.001 --steps 1 5 20 60
"""
import argparse
import ctypes
import glob
import os
import pathlib
import sys
import tempfile

import numpy as np

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from dist_harness import run_cluster, run_single  # noqa: E402

# OpenBLAS core types and the CPU flags (as /proc/cpuinfo names them) each needs, oldest first. Zen and Cooperlake use the
# kernels of Haswell and SkylakeX.
KERNELS = [("Prescott", {"pni"}), ("Nehalem", {"sse4_2"}), ("Sandybridge", {"avx"}),
           ("Haswell", {"avx2", "fma"}), ("SkylakeX", {"avx512f", "avx512bw", "avx512dq", "avx512vl"})]


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def openblas_kernel():
    """The kernel NumPy's OpenBLAS picked in this process, or None where NumPy has another BLAS."""
    libs = glob.glob(os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas*"))
    for lib in libs:
        handle = ctypes.CDLL(lib)
        for symbol in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            if hasattr(handle, symbol):
                fn = getattr(handle, symbol)
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None


def worst(a, b):
    errs = {k: float(np.linalg.norm(a[k].astype(np.float64) - b[k]) / (np.linalg.norm(b[k].astype(np.float64)) or 1))
            for k in b}
    name = max(errs, key=errs.get)
    return errs[name], name


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--optimizers", nargs="+", default=["sgd", "adam"])
    p.add_argument("--lrs", nargs="+", type=float, default=[0.01, 0.001])
    p.add_argument("--steps", nargs="+", type=int, default=[1, 5, 20, 60])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32, help="per worker; the reference runs W times that")
    p.add_argument("--kernels", nargs="+", default=None, help="OpenBLAS core types (default: every one this CPU can run)")
    p.add_argument("--data-home", default=None, help="synthetic data cache (default: a temporary folder)")
    args = p.parse_args()

    flags = cpu_flags()
    kernels = args.kernels or [name for name, need in KERNELS if need <= flags]
    skipped = [name for name, need in KERNELS if not need <= flags]
    os.environ.pop("OPENBLAS_CORETYPE", None)
    print(f"OpenBLAS picks {openblas_kernel() or '(not OpenBLAS)'} here; kernels run: {' '.join(kernels)}"
          + (f"; this CPU cannot run: {' '.join(skipped)}" if skipped else ""), flush=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="envelope-"))
    home = args.data_home or str(tmp / "data")
    W, b = args.workers, args.batch
    print(f"\n| optimizer | lr | steps | kernel | single vs single@ref | {W}-worker vs single |")
    print("|---|---|---|---|---|---|")
    for opt in args.optimizers:
        for lr in args.lrs:
            for n in args.steps:
                flags_ = ["--optimizer", opt, "--learning-rate", str(lr), "--iters-per-epoch", str(n), "--nepoch", "1"]
                os.environ.pop("OPENBLAS_CORETYPE", None)
                ref, _ = run_single(tmp, home, "run_hetu.py", flags_, global_batch=W * b)
                for kernel in kernels:
                    os.environ["OPENBLAS_CORETYPE"] = kernel
                    single, _ = run_single(tmp, home, "run_hetu.py", flags_, global_batch=W * b)
                    dist, _ = run_cluster(tmp, home, "run_hetu.py", ["--comm", "PS", "--bsp", "0", *flags_], W, 1, b)
                    e1, n1 = worst(single, ref)
                    e2, n2 = worst(dist, single)
                    print(f"| {opt} | {lr:g} | {n} | {kernel} | {e1:.1e} ({n1}) | {e2:.1e} ({n2}) |", flush=True)
    os.environ.pop("OPENBLAS_CORETYPE", None)


if __name__ == "__main__":
    main()
