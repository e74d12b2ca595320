"""The servers' step loop is compiled once per vector width (ps-lite/src/step_loop.cc); every
version must step rows bit for bit like the scalar rule (src/common/optim_rules.h) and like the
worker's own step (hetu._C.apply_rows, which steps cached rows), or a HET cache's hit would differ
from the server's row on some CPUs only. HETU_SIMD forces a version."""
import os
import sys

import numpy as np
import pytest

import jobs
from hetu import _C, _ps

KINDS = {"sgd": 0, "momentum": 1, "nesterov": 2, "adagrad": 3, "adam": 4, "adamw": 5, "rowwise_adagrad": 6}
RULE = dict(momentum=0.9, beta1=0.8, beta2=0.99, eps=1e-7, l2reg=0.01, weight_decay=0.02)
VARIANTS = [name for name, _ in _ps.simd_variants()]
RUNNABLE = {name for name, ok in _ps.simd_variants() if ok}
F = np.float32


def scalar_step(kind, lr, w, state, steps, rows, grads):
    """The rule of optim_rules.h in float32 NumPy, operation by operation in the same order."""
    lr, mom, b1, b2, eps, l2, wd = (F(v) for v in (lr, RULE["momentum"], RULE["beta1"], RULE["beta2"], RULE["eps"],
                                                   RULE["l2reg"], RULE["weight_decay"]))
    width = w.shape[1]
    for i, r in enumerate(rows):
        g = grads[i]
        steps[r] += 1
        t = int(steps[r])
        x = w[r]
        s = state[r]
        if kind == "sgd":
            x -= lr * (g + l2 * x)
        elif kind in ("momentum", "nesterov"):
            gi = g + l2 * x
            s[:] = mom * s + gi
            x -= lr * (gi + mom * s if kind == "nesterov" else s)
        elif kind == "adagrad":
            gi = g + l2 * x
            s[:] = s + gi * gi
            x -= lr * gi / (np.sqrt(s) + eps)
        elif kind == "rowwise_adagrad":
            gi = g + l2 * x
            s[0] = s[0] + row_mean_square(gi)
            x -= lr * gi / (np.sqrt(s[0]) + eps)
        else:
            m, v = s[:width], s[width:]
            bc1 = F(1.0 - float(b1) ** t)   # pow in double, as the rule does
            bc2 = F(1.0 - float(b2) ** t)
            if kind == "adamw":
                x -= lr * wd * x
                gi = g
            else:
                gi = g + l2 * x
            m[:] = b1 * m + (F(1) - b1) * gi
            v[:] = b2 * v + (F(1) - b2) * gi * gi
            x -= lr * (m / bc1) / (np.sqrt(v / bc2) + eps)


def row_mean_square(g):
    """Row-wise AdaGrad's accumulator increment: the float32 sum of g * g in index order (not
    NumPy's pairwise sum, nor any vector lanes' order), divided by the width."""
    total = F(0)
    for square in g * g:
        total = F(total + square)
    return F(total / F(len(g)))


def _gradients(rng, n, width):
    """Magnitudes from 1e-9 to 1e2 (near-cancelled sums included), zeros and both signs."""
    g = rng.standard_normal((n, width)).astype(F) * F(10.0) ** rng.integers(-9, 3, (n, 1)).astype(F)
    g[rng.random((n, width)) < 0.05] = 0
    return g


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("width", [1, 13, 64])
def test_every_step_loop_version_steps_rows_bit_for_bit_like_the_scalar_rule(variant, kind, width):
    if variant not in RUNNABLE:
        pytest.skip(f"this CPU cannot run the step loop's {variant} version: not tested here")
    rng = np.random.default_rng(width * 31 + KINDS[kind])
    rows, state_width = 40, _ps.optim_state_width(KINDS[kind], width)
    lr = 0.05
    start = rng.uniform(-1, 1, (rows, width)).astype(F)
    server = (start.copy(), np.zeros((rows, state_width), F), np.zeros(rows, np.int64), np.zeros(rows, np.int64))
    worker = (start.copy(), np.zeros((rows, state_width), F), np.zeros(rows, np.int64))
    scalar = (start.copy(), np.zeros((rows, state_width), F), np.zeros(rows, np.int64))
    config = _C.OptimConfig()
    config.kind = KINDS[kind]
    for key, value in RULE.items():
        setattr(config, key, value)
    for it in range(6):
        # Rows stepped a different number of times: Adam's bias corrections differ between rows.
        keys = np.sort(rng.choice(rows, size=rows // 2 + it, replace=False)).astype(np.int64)
        grads = _gradients(rng, len(keys), width)
        _ps.step_rows_with(variant, KINDS[kind], RULE["momentum"], RULE["beta1"], RULE["beta2"], RULE["eps"],
                           RULE["l2reg"], RULE["weight_decay"], lr, *server, keys, grads)
        _C.apply_rows(config, lr, worker[0], worker[1], worker[2], keys, grads)
        scalar_step(kind, lr, *scalar, keys, grads)
    for name, got, want in (("values", server[0], scalar[0]), ("state", server[1], scalar[1]),
                            ("steps", server[2], scalar[2]), ("worker values", worker[0], scalar[0]),
                            ("worker state", worker[1], scalar[1])):
        assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), \
            f"{variant} {kind} width {width}: {name} differ from the scalar rule in " \
            f"{int(np.sum(got != want))} elements"
    np.testing.assert_array_equal(server[3], server[2])   # a version per step, without counts
    assert not np.array_equal(server[0], start)


def _chosen(env):
    code = "from hetu import _ps; print(_ps.simd_variant())"
    return jobs.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                    env={**os.environ, **env})


def test_hetu_simd_forces_a_version_and_a_bad_one_is_refused():
    best = next(name for name, ok in _ps.simd_variants() if ok)
    unset = {k: v for k, v in os.environ.items() if k != "HETU_SIMD"}
    proc = jobs.run([sys.executable, "-c", "from hetu import _ps; print(_ps.simd_variant())"],
                    capture_output=True, text=True, timeout=60, env=unset)
    assert proc.stdout.strip() == best, proc.stderr
    for variant in RUNNABLE:
        proc = _chosen({"HETU_SIMD": variant})
        assert proc.returncode == 0 and proc.stdout.strip() == variant, proc.stderr
    proc = _chosen({"HETU_SIMD": "sse9"})
    assert proc.returncode != 0 and "HETU_SIMD='sse9': expected one of avx512f, avx2, default" in proc.stderr
    for variant in set(VARIANTS) - RUNNABLE:
        proc = _chosen({"HETU_SIMD": variant})
        assert proc.returncode != 0 and f"HETU_SIMD='{variant}': this CPU cannot run it" in proc.stderr
