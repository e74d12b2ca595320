"""How hetu sets OpenBLAS's threads (hetu/threads.py): a small product on one thread, a large
one on OPENBLAS_NUM_THREADS; idle threads told to sleep, not spin, unless the user said otherwise.
Each case in a fresh interpreter: OpenBLAS reads its environment when it loads."""
import os
import subprocess
import sys

PROBE = r"""
import os
import numpy as np
import hetu
from hetu import threads
from hetu.ops.math import matmul_op

def blas_threads():
    return {threads.openblas_function(lib, "get_num_threads")() for lib in threads.openblas_libraries()}


def run(m, k, n):
    a, b = hetu.Variable("a", value=np.ones((m, k), np.float32)), hetu.Variable("b", value=np.ones((k, n), np.float32))
    out = hetu.Executor([matmul_op(a, b)]).run(convert_to_numpy_ret_vals=True)[0]
    assert (out == k).all()
    return blas_threads()

print(os.environ.get("OPENBLAS_THREAD_TIMEOUT"), sorted(run(8, 8, 8)), sorted(run(256, 256, 256)))
"""


def probe(**env):
    full = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    full.update(env)
    out = subprocess.run([sys.executable, "-c", PROBE], env=full, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.split(maxsplit=1)


def test_small_products_take_one_blas_thread_and_large_ones_all():
    timeout, counts = probe(OPENBLAS_NUM_THREADS="2")
    assert timeout == "4"
    assert counts.strip() == "[1] [2]"


def test_a_users_blas_wait_is_kept():
    timeout, _ = probe(OPENBLAS_NUM_THREADS="2", OPENBLAS_THREAD_TIMEOUT="20")
    assert timeout == "20"
