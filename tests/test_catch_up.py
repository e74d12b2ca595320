"""Adam with catch-up (docs/design.md section 4): a table's rows take the steps they were not read
at, with zero gradient, when they are next read or stepped, so that training equals dense Adam
over the whole table while stepping only the rows a step reads.

- the rule (hetu._C.catch_up_rows) against dense steps of zero gradient, one at a time: bit for
  bit up to the horizon, past it within float32 rounding; every storage type, l2reg, AdamW;
- a single process trained with adam_catchup / adamw_catchup against the same graph whose tables
  are stepped densely (every row, every step): the same parameters, bit for bit;
- the errors: a schedule, a table on the GPU."""
import os
import subprocess
import sys

import numpy as np
import pytest

import hetu as ht
from hetu import _C
from hetu.optim import EMBEDDING_DTYPES, config
from hetu.ops.embedding import unique_sum

WIDTH = 12


def state_of(rng, rows, kind="adam_catchup"):
    """Rows in mid-training: values, moments (v > 0 where m is set) and step counts."""
    table = rng.standard_normal((rows, WIDTH)).astype(np.float32)
    m = (rng.standard_normal((rows, WIDTH)) * 0.1).astype(np.float32)
    v = (rng.random((rows, WIDTH)) * 0.01 + m.astype(np.float64) ** 2).astype(np.float32)
    return table, np.concatenate([m, v], axis=1).reshape(-1), rng.integers(1, 40, rows).astype(np.int64)


def dense_steps(c, lr, row, state_row, step, target):
    """What dense Adam does to a row it is given zero gradients for, steps step+1 .. target."""
    dense = _C.OptimConfig()
    dense.kind = ht.optim.KINDS["adamw" if c.kind == ht.optim.KINDS["adamw_catchup"]["kind"] else "adam"]["kind"]
    for h in _C.optimizer_hyperparameters():
        setattr(dense, h, getattr(c, h))
    count = np.array([step], np.int64)
    for _ in range(target - step):
        _C.apply_dense(dense, lr, row, state_row, count, np.zeros(WIDTH, np.float32))
        _C.round_to_storage(row.reshape(1, -1), c.storage)


@pytest.mark.parametrize("dtype", sorted(EMBEDDING_DTYPES))
@pytest.mark.parametrize("kind,settings", [("adam_catchup", {}), ("adam_catchup", {"l2reg": 0.01}),
                                           ("adamw_catchup", {"weight_decay": 0.02}),
                                           ("adam_catchup", {"beta1": 0.5, "beta2": 0.9})])
def test_catching_up_equals_dense_zero_gradient_steps(kind, settings, dtype):
    rng = np.random.default_rng(len(kind) + len(settings) + len(dtype))
    c = config(kind, catch_up_lr=0.01, **settings)
    c.storage = EMBEDDING_DTYPES[dtype]
    rows = 50
    table, state, steps = state_of(rng, rows)
    _C.round_to_storage(table, c.storage)
    state2 = state.reshape(rows, 2 * WIDTH)
    want = [table.copy(), state2.copy(), steps.copy()]
    target = 90   # up to 89 skipped steps: within the horizon at the defaults (213); past it at 0.5/0.9 (36)
    # repeats are caught up once; ids outside the table (an empty slot's -1) are skipped
    picked = np.array([3, 7, 7, -1, 11, 49, 0, 50, 3], np.int64)
    for r in np.unique(picked[(picked >= 0) & (picked < rows)]):
        dense_steps(c, 0.01, want[0][r], want[1][r], int(steps[r]), target)
        want[2][r] = target
    _C.catch_up_rows(c, table, state, steps, picked, target)
    if "beta1" in settings:
        # past the horizon the tail only decays the moments: the values are within rounding
        np.testing.assert_allclose(table, want[0], rtol=2e-7, atol=1e-9)
        np.testing.assert_allclose(state2, want[1], rtol=1e-5, atol=1e-30)
    else:
        np.testing.assert_array_equal(table, want[0])
        np.testing.assert_array_equal(state2, want[1])
    np.testing.assert_array_equal(steps, want[2])
    moved = np.isin(np.arange(rows), picked)
    np.testing.assert_array_equal(table[~moved], want[0][~moved])
    assert (table[moved] != state_of(np.random.default_rng(len(kind) + len(settings) + len(dtype)), rows)[0][moved]).any()


@pytest.mark.parametrize("kind,settings", [("adam_catchup", {}), ("adamw_catchup", {"weight_decay": 0.05})])
def test_past_the_horizon_the_values_are_within_rounding(kind, settings):
    """A row 2,000 steps behind: the first 213 steps one by one, the rest decay the moments (and
    AdamW's row) at once."""
    rng = np.random.default_rng(5)
    c = config(kind, catch_up_lr=0.01, **settings)
    table, state, steps = state_of(rng, 4)
    steps[:] = 10
    want_t, want_s = table.copy(), state.reshape(4, -1).copy()
    for r in range(4):
        dense_steps(c, 0.01, want_t[r], want_s[r], 10, 2010)
    _C.catch_up_rows(c, table, state, steps, np.arange(4), 2010)
    if settings:   # 1,797 decays of (1 - 5e-4) at once against one by one, each rounded
        np.testing.assert_allclose(table, want_t, rtol=2e-5, atol=0)
        assert np.abs(want_t).max() < 0.6 * np.abs(state_of(np.random.default_rng(5), 4)[0]).max()
    else:
        np.testing.assert_allclose(table, want_t, rtol=0, atol=4 * np.spacing(np.abs(want_t).max()))
    np.testing.assert_allclose(state.reshape(4, -1), want_s, rtol=1e-4, atol=1e-37)


def test_rows_never_stepped_do_not_move():
    c = config("adam_catchup", catch_up_lr=0.1)
    table = np.ones((3, WIDTH), np.float32)
    state = np.zeros(3 * 2 * WIDTH, np.float32)
    steps = np.zeros(3, np.int64)
    _C.catch_up_rows(c, table, state, steps, np.array([0, 2], np.int64), 500)
    np.testing.assert_array_equal(table, 1)
    assert list(steps) == [500, 0, 500]


def test_a_row_ahead_of_the_target_is_left_alone():
    c = config("adam_catchup", catch_up_lr=0.1)
    table, state, steps = state_of(np.random.default_rng(2), 2)
    before = table.copy(), state.copy()
    steps[:] = 7
    _C.catch_up_rows(c, table, state, steps, np.array([0, 1], np.int64), 7)
    _C.catch_up_rows(c, table, state, steps, np.array([0, 1], np.int64), 3)
    np.testing.assert_array_equal(table, before[0])
    np.testing.assert_array_equal(state, before[1])


# --- a single process against dense Adam ------------------------------------------------------

ROWS, SAMPLES = 400, 32


class DenseTableUpdater:
    """The reference: the table stepped as a dense tensor, every row every step, by plain Adam
    (AdamW), with the rows' gradients summed as the sparse step sums them."""

    def __init__(self, optimizer):
        self.optimizer = optimizer
        self.state = self.steps = None

    def update(self, state, param, grad, lr, step):
        value = state.param_value(param)
        if self.state is None:
            self.state = np.zeros(2 * value.size, np.float32)
            self.steps = np.zeros(1, np.int64)
        uniq, summed = unique_sum(grad.indices, grad.values)
        dense = np.zeros_like(value)
        dense[uniq] = summed
        assert self.steps[0] == step - 1
        # the table's dense rule is the catch-up kind's dense kind: plain Adam / AdamW
        _C.apply_dense(self.optimizer.dense_config, lr, value.reshape(-1), self.state, self.steps, dense.reshape(-1))


def model(optimizer, dense_reference):
    """Single-id lookups and multi-hot bags over two tables, a dense layer, a logistic loss."""
    ids = ht.placeholder_op("ids", dtype=np.int64)
    bag_ids = ht.placeholder_op("bag_ids", dtype=np.int64)
    y = ht.placeholder_op("y")
    table = ht.Variable("table", value=np.random.default_rng(1).standard_normal((ROWS, 8)).astype(np.float32) * 0.1)
    bags = ht.Variable("bags", value=np.random.default_rng(2).standard_normal((ROWS, 8)).astype(np.float32) * 0.1)
    w = ht.Variable("w", value=np.random.default_rng(3).standard_normal((24, 1)).astype(np.float32) * 0.3)
    looked = ht.array_reshape_op(ht.embedding_lookup_op(table, ids), (-1, 16))
    pooled = ht.embedding_bag_op(bags, bag_ids, slots=[3], mode="sum")
    logits = ht.matmul_op(ht.concat_op(looked, ht.array_reshape_op(pooled, (-1, 8)), axis=1), w)
    loss = ht.reduce_mean_op(ht.binarycrossentropywithlogits_op(logits, y), [0])
    train = optimizer.minimize(loss)
    ex = ht.Executor({"train": [loss, train]}, seed=0)
    if dense_reference:
        ex.graph.catching_up.clear()   # every row is stepped: none has steps to catch up
        for p in (table, bags):
            train.updaters[p.id] = DenseTableUpdater(optimizer)
    return ex, (ids, bag_ids, y)


def feeds(rng, steps):
    """Skewed ids, so that most rows skip most steps; some bag slots empty (-1)."""
    out = []
    for _ in range(steps):
        bag_ids = (rng.zipf(1.3, (SAMPLES, 3)) % ROWS).astype(np.int64)
        bag_ids[rng.random((SAMPLES, 3)) < 0.3] = -1
        out.append(((rng.zipf(1.3, (SAMPLES, 2)) % ROWS).astype(np.int64), bag_ids,
                    rng.integers(0, 2, (SAMPLES, 1)).astype(np.float32)))
    return out


@pytest.mark.parametrize("make", [lambda: ht.optim.optimizer("adam_catchup", 0.01),
                                  lambda: ht.optim.optimizer("adam_catchup", 0.01, l2reg=0.001),
                                  lambda: ht.optim.optimizer("adamw_catchup", 0.01, weight_decay=0.05)])
def test_a_single_process_equals_dense_adam_over_the_tables_bit_for_bit(make):
    runs = {}
    for dense in (False, True):
        ex, (ids, bag_ids, y) = model(make(), dense)
        for a, b, label in feeds(np.random.default_rng(7), 25):
            ex.run("train", feed_dict={ids: a, bag_ids: b, y: label})
        runs[dense] = ex.parameters()
    for name in ("table", "bags", "w"):
        np.testing.assert_array_equal(runs[False][name], runs[True][name], err_msg=name)
    # not a vacuous comparison: lazy Adam leaves the rows elsewhere
    ex, (ids, bag_ids, y) = model(ht.optim.optimizer("adam", 0.01), False)
    for a, b, label in feeds(np.random.default_rng(7), 25):
        ex.run("train", feed_dict={ids: a, bag_ids: b, y: label})
    assert not np.array_equal(ex.parameters()["table"], runs[True]["table"])


def test_a_schedule_is_refused():
    with pytest.raises(ValueError, match="constant rate.*schedule"):
        ht.optim.optimizer("adam_catchup", ht.lr.StepScheduler(0.01, 10))
    with pytest.raises(ValueError, match="catch_up_lr is the learning rate"):
        ht.optim.optimizer("adam_catchup", 0.01, catch_up_lr=0.1)


# --- every mode against the single process ------------------------------------------------------

# 10 steps, as the other Adam equivalence tests: at step 11 WDL's run at W = 2 meets a ReLU kink
# within float rounding (the dense weights then differ by 1e-3 relative in every mode alike,
# AllReduce included; at lr 0.0011 they do not), as lazy Adam's does between steps 20 and 30.
CATCH_UP = ["--optimizer", "adam_catchup", "--learning-rate", "0.001", "--iters-per-epoch", "10"]


@pytest.mark.cluster
@pytest.mark.timeout(900)
@pytest.mark.parametrize("script,mode,workers,servers", [
    ("run_hetu.py", ["--comm", "AllReduce"], 2, 0),
    ("run_hetu.py", ["--comm", "PS", "--bsp", "0"], 2, 1),
    ("run_hetu.py", ["--comm", "Hybrid", "--bsp", "0"], 4, 2),
    ("run_hetu.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0"], 2, 1),
    ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0",
                     "--cache-limit-ratio", "0.1"], 2, 1),
    ("run_laia.py", ["--comm", "Hybrid", "--cache", "lfu", "--bound", "0", "--bsp", "0",
                     "--cache-limit-ratio", "0.01"], 4, 2),
])
@pytest.mark.parametrize("model", ["wdl_criteo", "dcn_criteo"])
def test_every_mode_catches_up_as_the_single_process(tmp_path, data_home, script, mode, workers, servers, model):
    """The rows a step skipped are applied wherever a row is read or stepped (the servers at a
    pull or push, HET's cache at a hit, Herald's at a valid copy): every mode ends with the single
    process's parameters, each row brought to the last step."""
    from dist_harness import assert_same_parameters, run_cluster, run_single
    args = ["--model", model, *CATCH_UP]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, _ = run_cluster(tmp_path, data_home, script, [*mode, *args], workers, servers, 64 // workers)
    assert_same_parameters(reference, got, exact_rows=False)


@pytest.mark.cluster
@pytest.mark.timeout(600)
@pytest.mark.parametrize("script,flags,shape", [
    ("run_hetu.py", ["--comm", "PS"], ((2, 2), (4, 1))),
    ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--cache-limit-ratio", "0.05"],
     ((4, 2), (2, 1)))], ids=["PS-2x2-to-4x1", "Herald-4x2-to-2x1"])
def test_a_resumed_run_catches_up_as_one_run_straight_through(tmp_path, data_home, script, flags, shape):
    """A checkpoint holds each row's step: rows the first run left behind are caught up by the
    resumed run, on another cluster shape, as the single process catches them up."""
    from dist_harness import assert_same_parameters, run_cluster, run_single
    (w0, s0), (w1, s1) = shape
    optimizer = [*CATCH_UP[:-1], "5"]   # 2 epochs of 5 steps
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", [*optimizer, "--nepoch", "2"], global_batch=64)
    ckpt = tmp_path / "ckpt"
    args = [*flags, "--bsp", "0", *optimizer]
    run_cluster(tmp_path, data_home, script, [*args, "--nepoch", "1", "--checkpoint", str(ckpt)], w0, s0, 64 // w0)
    got, out = run_cluster(tmp_path, data_home, script, [*args, "--nepoch", "2", "--resume", str(ckpt)],
                           w1, s1, 64 // w1)
    assert "resumed" in out and "at step 5" in out
    assert_same_parameters(reference, got, exact_rows=False)


def test_a_single_process_resume_catches_up_bit_for_bit(tmp_path, data_home):
    from dist_harness import run_single
    optimizer = [*CATCH_UP[:-1], "8"]
    straight, _ = run_single(tmp_path, data_home, "run_hetu.py", [*optimizer, "--nepoch", "2"], global_batch=64)
    ckpt = tmp_path / "ckpt"
    run_single(tmp_path, data_home, "run_hetu.py", [*optimizer, "--nepoch", "1", "--checkpoint", str(ckpt)],
               global_batch=64)
    resumed, summary = run_single(tmp_path, data_home, "run_hetu.py",
                                  [*optimizer, "--nepoch", "2", "--resume", str(ckpt)], global_batch=64)
    assert summary["first_step"] == 8
    for name, value in straight.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


@pytest.mark.cluster
@pytest.mark.timeout(600)
@pytest.mark.parametrize("script,mode", [
    ("run_hetu.py", ["--comm", "PS"]),
    ("run_hetu.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"]),
    ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--cache-limit-ratio", "0.1"])])
def test_dynamic_tables_catch_up_as_the_single_process(tmp_path, data_home, script, mode):
    """Keys admitted, evicted and admitted again: an admitted row starts at the steps taken (it
    skipped none), on the servers as in the single process; AdamW's default decay included."""
    from dist_harness import assert_same_parameters, run_cluster, run_single
    args = ["--model", "wdl_criteo", "--table-capacity", "1024", "--admit-after", "2", "--evict-ttl", "4",
            "--optimizer", "adamw_catchup", "--learning-rate", "0.001", "--iters-per-epoch", "10"]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=60)
    got, out = run_cluster(tmp_path, data_home, script, [*mode, "--bsp", "0", *args], 3, 2, 20)
    assert "table embedding server" in out
    assert_same_parameters(reference, got, exact_rows=False)


def test_many_repeated_rows_in_any_order_are_caught_up_once_on_any_thread_count(tmp_path):
    """Threads take rows by row number: a batch's ids, repeated and unsorted, give the same rows
    in processes of 1 and 3 threads as one id at a time."""
    rng = np.random.default_rng(11)
    table, state, steps = state_of(rng, 3000)
    ids = (rng.zipf(1.2, 20000) % 3000).astype(np.int64)
    np.savez(tmp_path / "start.npz", table=table, state=state, steps=steps, ids=ids)
    c = config("adam_catchup", catch_up_lr=0.01)
    for r in ids:   # one row at a time
        _C.catch_up_rows(c, table, state, steps, np.array([r]), 60)
    code = ("import sys, numpy as np; from hetu import _C; from hetu.optim import config; "
            "d = dict(np.load(sys.argv[1])); "
            "_C.catch_up_rows(config('adam_catchup', catch_up_lr=0.01), d['table'], d['state'], d['steps'], d['ids'], 60); "
            "np.savez(sys.argv[2], **d)")
    for threads in ("1", "3"):
        out = tmp_path / f"got{threads}.npz"
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "start.npz"), str(out)], check=True,
                       env={**os.environ, "HETU_NUM_THREADS": threads})
        got = np.load(out)
        for name, want in (("table", table), ("state", state), ("steps", steps)):
            np.testing.assert_array_equal(got[name], want, err_msg=f"{threads} threads: {name}")
