"""_C.batched_matmul, the CPU kernel behind MatMulOp's stacks of small products (DLRM's pairwise
dots): np.matmul's values in float64 to float32's precision for every transposition and odd
shapes, and the same bits for every instruction-set version and thread count."""
import os
import subprocess
import sys

import numpy as np
import pytest

import hetu as ht
from gradcheck import check_gradients
from hetu import _C

TRANSPOSES = [(False, False), (False, True), (True, False), (True, True)]
# (batch, m, n, k): DLRM's forward and backward shapes, vector tails, single rows and columns,
# an empty inner dimension, an empty stack.
SHAPES = [(64, 27, 27, 64), (16, 27, 64, 27), (5, 1, 1, 1), (3, 7, 5, 9), (4, 33, 17, 3), (2, 4, 40, 1),
          (2, 3, 4, 0), (0, 3, 4, 5)]


def operands(batch, m, n, k, trans_a, trans_b, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((batch, k, m) if trans_a else (batch, m, k)).astype(np.float32)
    b = rng.standard_normal((batch, n, k) if trans_b else (batch, k, n)).astype(np.float32)
    return a, b


def product(a, b, trans_a, trans_b, simd=""):
    m = a.shape[2] if trans_a else a.shape[1]
    n = b.shape[1] if trans_b else b.shape[2]
    out = np.full((a.shape[0], m, n), np.nan, np.float32)
    _C.batched_matmul(a, b, trans_a, trans_b, out, simd)
    return out


@pytest.mark.parametrize("trans_a,trans_b", TRANSPOSES)
@pytest.mark.parametrize("shape", SHAPES)
def test_equals_numpy_in_float64(shape, trans_a, trans_b):
    a, b = operands(*shape, trans_a, trans_b)
    want = np.matmul(a.astype(np.float64).swapaxes(1, 2) if trans_a else a.astype(np.float64),
                     b.astype(np.float64).swapaxes(1, 2) if trans_b else b.astype(np.float64))
    got = product(a, b, trans_a, trans_b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * max(1, shape[3]))


def runnable_variants():
    return [v for v in _C.MATMUL_VARIANTS if _runs(v)]


def _runs(variant):
    try:
        return _C.matmul_variant(variant) == variant
    except ValueError:
        return False


@pytest.mark.parametrize("trans_a,trans_b", TRANSPOSES)
def test_same_bits_in_every_version(trans_a, trans_b):
    variants = runnable_variants()
    assert "default" in variants
    for shape in SHAPES:
        a, b = operands(*shape, trans_a, trans_b, seed=1)
        first = product(a, b, trans_a, trans_b, variants[0])
        for variant in variants[1:]:
            assert np.array_equal(product(a, b, trans_a, trans_b, variant), first), (shape, variant)


def test_sums_in_k_order():
    """Each element is ((0 + a0 b0) + a1 b1) + a2 b2, float32 rounding at each step: 1e8 + 1 - 1e8 is 0
    in float32 taken in this order, 1 in any order that adds 1 last."""
    a = np.array([[[1e8, 1.0, -1e8]]], np.float32)
    b = np.ones((1, 3, 1), np.float32)
    assert product(a, b, False, False)[0, 0, 0] == np.float32(0.0)


def test_bad_shapes_are_named():
    a, b = operands(2, 3, 4, 5, False, False)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        _C.batched_matmul(a, b[:, :4], False, False, np.empty((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="out must be"):
        _C.batched_matmul(a, b, False, False, np.empty((2, 4, 3), np.float32))
    with pytest.raises(ValueError, match="no version 'sse9'"):
        _C.batched_matmul(a, b, False, False, np.empty((2, 3, 4), np.float32), "sse9")


_DIGEST = """
import hashlib, sys
import numpy as np
sys.path.insert(0, {tests!r})
from test_batched_matmul import SHAPES, TRANSPOSES, operands, product
h = hashlib.sha256()
for shape in SHAPES + [(257, 27, 27, 64)]:
    for trans_a, trans_b in TRANSPOSES:
        h.update(product(*operands(*shape, trans_a, trans_b, seed=2), trans_a, trans_b).tobytes())
print(h.hexdigest())
"""


def test_same_bits_on_any_thread_count():
    """hetu's thread count is read once per process: a process per count."""
    digests = {}
    for threads in (1, 2, 3):
        env = dict(os.environ, HETU_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
        run = subprocess.run([sys.executable, "-c", _DIGEST.format(tests=os.path.dirname(__file__))], env=env,
                             capture_output=True, text=True, timeout=120)
        assert run.returncode == 0, run.stderr
        digests[threads] = run.stdout.strip()
    assert len(set(digests.values())) == 1, digests


@pytest.mark.parametrize("trans_a,trans_b", TRANSPOSES)
def test_matmul_op_of_stacks(trans_a, trans_b):
    """MatMulOp's stacks on CPU: the kernel's values, and its gradients numerically."""
    a, b = operands(3, 4, 5, 6, trans_a, trans_b, seed=3)
    node = ht.matmul_op(ht.Variable("a", value=a), ht.Variable("b", value=b), trans_A=trans_a, trans_B=trans_b)
    got = ht.Executor([node]).run(convert_to_numpy_ret_vals=True)[0]
    np.testing.assert_array_equal(got, product(a, b, trans_a, trans_b))
    small_a, small_b = (x * np.float32(0.5) for x in operands(2, 3, 4, 5, trans_a, trans_b, seed=4))
    check_gradients(lambda x, y: ht.matmul_op(x, y, trans_A=trans_a, trans_B=trans_b), [small_a, small_b])



def test_hetu_simd_picks_the_version():
    """HETU_SIMD, the servers' switch, picks the version here too; a bad name is an error naming it."""
    script = ("from hetu import _C\ntry:\n    print(_C.matmul_variant(''))\nexcept ValueError as e:\n"
              "    print('error', e)")
    for value, want in (("default", "default"), ("sse9", "error HETU_SIMD: no version 'sse9'")):
        run = subprocess.run([sys.executable, "-c", script], env=dict(os.environ, HETU_SIMD=value),
                             capture_output=True, text=True, timeout=60)
        assert run.stdout.strip().startswith(want), run.stdout + run.stderr
