"""NumPy's OpenBLAS picks its GEMM kernel per CPU (DYNAMIC_ARCH), and each kernel sums a product
in its own order: OPENBLAS_CORETYPE forces one, so one machine can run the kernels of others."""
import ctypes
import glob
import os

import numpy as np

# OpenBLAS core types and the CPU flags (as /proc/cpuinfo names them) each needs, oldest first.
# AMD's Zen and Intel's Cooperlake run the kernels of Haswell and SkylakeX.
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


def runnable(kernel):
    """Whether this CPU can run the OpenBLAS kernel (forcing one it cannot is an illegal instruction)."""
    return dict(KERNELS)[kernel] <= cpu_flags()


def openblas_kernel():
    """The kernel NumPy's OpenBLAS runs in this process, or None where NumPy has another BLAS."""
    pattern = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs", "libscipy_openblas*")
    for lib in glob.glob(pattern):
        handle = ctypes.CDLL(lib)
        for symbol in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            if hasattr(handle, symbol):
                fn = getattr(handle, symbol)
                fn.restype = ctypes.c_char_p
                return fn().decode()
    return None
