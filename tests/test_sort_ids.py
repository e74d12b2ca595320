"""The sums behind unique_sum and the bag gradient (kernels/sort.cpp's sort_ids, then the runs of
equal ids summed on HETU_NUM_THREADS threads): whatever the thread count, each distinct id's rows
must be summed in their order of occurrence, as np.add.at sums them, bit for bit."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from hetu import _C

# (ids, id range): radix sorts of one to three digits, a range past three digits (the comparison
# sort), and few distinct ids (long runs crossing the parts' bounds)
CASES = ((200_000, 400_000), (131_072, 1 << 30), (100_000, 1 << 40), (70_000, 50))


def in_order_sums(ids, rows):
    """Distinct ids ascending and each one's rows summed in order of occurrence (float32)."""
    uniq = np.unique(ids)
    sums = np.zeros((len(uniq), rows.shape[1]), np.float32)
    np.add.at(sums, np.searchsorted(uniq, ids), rows)   # unbuffered: one row at a time, in order
    return uniq, sums


def case(seed, n, high):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, high, n).astype(np.int64)
    ids[::5] = ids[1]   # a hot id in every part
    return ids, rng.standard_normal((n, 3)).astype(np.float32)


def digest(seed):
    """unique_sum's and bag_gradient's answers on CASES, as lists (run in a subprocess)."""
    out = []
    for n, high in CASES:
        ids, rows = case(seed, n, high)
        uniq, sums = _C.unique_sum(ids, rows)
        out.append([uniq.tolist(), sums.view(np.uint32).tolist()])
    ids, _ = case(seed, 2048 * 40, 300_000)
    ids = ids.reshape(2048, 40)
    ids[::3, 5] = -1   # empty slots
    offsets = np.array([0, 1, 5, 17, 40], np.int64)
    grads = np.random.default_rng(seed).standard_normal((2048, 4, 8)).astype(np.float32)
    uniq, sums = _C.bag_gradient(ids, offsets, False, grads)
    out.append([uniq.tolist(), sums.view(np.uint32).tolist()])
    return out


@pytest.mark.parametrize("n,high", CASES)
def test_unique_sum_adds_each_ids_rows_in_order_of_occurrence(n, high):
    ids, rows = case(3, n, high)
    uniq, sums = _C.unique_sum(ids, rows)
    want_ids, want_sums = in_order_sums(ids, rows)
    np.testing.assert_array_equal(uniq, want_ids)
    np.testing.assert_array_equal(sums, want_sums)


def test_the_same_bits_on_one_two_and_three_threads():
    code = f"import json, sys; sys.path.insert(0, {os.path.dirname(__file__)!r}); " \
           f"from test_sort_ids import digest; print(json.dumps(digest(7)))"
    answers = {}
    for threads in (1, 2, 3):
        env = dict(os.environ, HETU_NUM_THREADS=str(threads), OMP_NUM_THREADS="1")
        run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
        assert run.returncode == 0, run.stderr[-2000:]
        answers[threads] = json.loads(run.stdout)
    assert answers[2] == answers[1]
    assert answers[3] == answers[1]
    # and the one-thread answer is the in-order sum
    for (n, high), (uniq, bits) in zip(CASES, answers[1]):
        want_ids, want_sums = in_order_sums(*case(7, n, high))
        assert uniq == want_ids.tolist()
        assert bits == want_sums.view(np.uint32).tolist()
