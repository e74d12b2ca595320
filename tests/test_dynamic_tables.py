"""Dynamic tables in one process (hetu.dynamic, docs/design.md section 13): a dynamic table that never
evicts trains exactly as a static table whose rows start from the keys' own initial rows; keys
without a row read zeros and take no step; admissions reset a row and its optimizer state; the
command line, its counter lines, --save-params by key and checkpoints."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import hetu as ht
from hetu import layers
from hetu.dynamic import DynamicTable, by_key, initial_rows

import jobs

REPO = Path(__file__).resolve().parents[1]
SEED = 5
WIDTH = 4


def batches(rng, steps, batch, fields, keys):
    """Keys drawn from `keys` (any int64 values), skewed so that some repeat."""
    idx = np.minimum(rng.zipf(1.3, size=(steps * batch, fields)) - 1, len(keys) - 1)
    return keys[idx]


def train(ids, labels, table, optimizer, steps, batch):
    """A lookup of every field, summed per sample, into a logistic loss; `table` builds the
    embedding Variable. Returns (executor, table Variable)."""
    x = ht.dataloader_op([ht.Dataloader(ids, batch, "train")])
    y = ht.dataloader_op([ht.Dataloader(labels, batch, "train")])
    emb = table()
    rows = ht.embedding_lookup_op(emb, x)                              # [b, fields, width]
    logit = ht.reduce_sum_op(ht.reduce_sum_op(rows, axes=1), axes=1, keepdims=True)
    w = ht.init.ones((1, 1), name="w")
    loss = ht.reduce_mean_op(ht.binarycrossentropywithlogits_op(ht.matmul_op(logit, w), y), [0])
    opt = ht.optim.optimizer(optimizer, learning_rate=0.1)
    ex = ht.Executor({"train": [loss, opt.minimize(loss)]}, seed=SEED)
    for _ in range(steps):
        ex.run("train")
    return ex, emb


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "rowwise_adagrad"])
def test_a_table_that_never_evicts_equals_a_static_table_started_from_the_keys_rows(optimizer):
    rng = np.random.default_rng(1)
    keys = rng.integers(-2**62, 2**62, size=40)   # arbitrary int64 keys
    steps, batch = 12, 16
    ids = batches(rng, steps, batch, 3, keys)
    labels = rng.integers(0, 2, size=(steps * batch, 1)).astype(np.float32)
    dynamic = DynamicTable(64, admit_after=1)   # room for every key: nothing is evicted
    ex_d, emb_d = train(ids, labels, lambda: layers.Embedding(None, WIDTH, name="emb", dynamic=dynamic).embedding_table,
                        optimizer, steps, batch)
    got = by_key(ex_d.parameters(), ex_d.graph.dynamic_keys)
    distinct = np.unique(ids)
    np.testing.assert_array_equal(got["emb:keys"], distinct)
    assert ex_d.graph.dynamic_keys[0].counters()["evicted"] == 0

    # The static table: one row per distinct key, each the key's own initial row; ids mapped to rows.
    start = initial_rows(emb_d, distinct, SEED)
    ex_s, _ = train(np.searchsorted(distinct, ids), labels, lambda: ht.Variable("emb", value=start),
                    optimizer, steps, batch)
    want = ex_s.parameters()
    np.testing.assert_array_equal(got["emb"], want["emb"])
    np.testing.assert_array_equal(got["w"], want["w"])


def test_keys_without_a_row_read_zeros_and_take_no_step():
    rng = np.random.default_rng(2)
    keys = np.arange(100, 140, dtype=np.int64)
    ids = batches(rng, 1, 8, 2, keys)
    second = np.full((8, 2), 7777, np.int64)   # a key read once more only in the second batch
    second[0] = ids[0]
    ids = np.concatenate([ids, second])
    labels = np.ones((16, 1), np.float32)
    dynamic = DynamicTable(16, admit_after=2)
    x = ht.dataloader_op([ht.Dataloader(ids, 8, "train")])
    y = ht.dataloader_op([ht.Dataloader(labels, 8, "train")])
    emb = layers.Embedding(None, WIDTH, name="emb", dynamic=dynamic).embedding_table
    rows = ht.embedding_lookup_op(emb, x)
    loss = ht.reduce_mean_op(ht.binarycrossentropywithlogits_op(
        ht.reduce_sum_op(ht.reduce_sum_op(rows, axes=1), axes=1, keepdims=True), y), [0])
    ex = ht.Executor({"train": [rows, loss, ht.optim.SGDOptimizer(1.0).minimize(loss)]}, seed=SEED)
    before = ex.parameters()["emb"]
    out, _, _ = ex.run("train", convert_to_numpy_ret_vals=True)
    assert not out.any()   # every key read once: none has a row yet
    np.testing.assert_array_equal(ex.parameters()["emb"], before)   # and no gradient was applied
    out, _, _ = ex.run("train", convert_to_numpy_ret_vals=True)
    step = ex.graph.dynamic_keys[0].current
    admitted = set(step.admitted_keys.tolist())
    assert admitted == set(ids[0].tolist()) - {7777}   # read in both batches: admitted at the second
    want = initial_rows(emb, ids[0], SEED)
    np.testing.assert_array_equal(out[0], want)   # admitted before the lookup, from the key's own row
    assert not out[1:].any()   # 7777, read once, reads zeros


def run_hetu(*args, timeout=300):
    return jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress", *map(str, args)],
                    capture_output=True, text=True, timeout=timeout, env={"HETU_NUM_THREADS": "1"})


@pytest.fixture(scope="module")
def hashed(tmp_path_factory):
    out = tmp_path_factory.mktemp("hashed") / "data"
    subprocess.run([sys.executable, "-m", "hetu.data.prepare", "synthetic", "--output", str(out), "--rows", "3000",
                    "--ids", "hashed", "--scale", "0.001", "--quiet"], check=True, capture_output=True)
    return out


FLAGS = ("--model", "wdl_criteo", "--embedding-size", "4", "--batch-size", "128", "--optimizer", "adam")


def test_command_line_counters_and_parameters_by_key(hashed, tmp_path):
    refused = run_hetu(*FLAGS, "--data-dir", hashed)
    assert refused.returncode != 0 and "--table-capacity" in refused.stderr, refused.stderr
    refused = run_hetu(*FLAGS, "--data-dir", hashed, "--admit-after", "2")
    assert refused.returncode != 0 and "--admit-after sets a dynamic table" in refused.stderr, refused.stderr
    refused = run_hetu(*FLAGS, "--data-dir", hashed, "--table-capacity", "100", "--table-buckets", "7")
    assert refused.returncode != 0 and "multiple of the bucket count" in refused.stderr, refused.stderr

    out = tmp_path / "p.npz"
    proc = run_hetu(*FLAGS, "--data-dir", hashed, "--table-capacity", "512", "--admit-after", "2", "--save-params", out,
                    "--cache-perf", "--csv-dir", tmp_path)
    assert proc.returncode == 0, proc.stderr
    line = [x for x in proc.stdout.splitlines() if x.startswith("table embedding server 0:")]
    assert len(line) == 1, proc.stdout
    resident, capacity, admitted, evicted, missed = map(int, re.findall(r"\d+", line[0].split(":")[1]))
    assert capacity == 512 and 0 < resident <= 512 and admitted - evicted == resident and evicted > 0 and missed > 0
    assert line[0] == (f"table embedding server 0: {resident} resident of 512, {admitted} admitted, {evicted} evicted, "
                       f"{missed} reads of keys not resident")
    per_step = np.genfromtxt(tmp_path / "wdl_criteo-single-embedding-dynamic.csv", delimiter=",", names=True,
                             dtype=None, encoding="utf-8")
    assert per_step["resident"][-1] == resident and per_step["admitted"].sum() == admitted
    assert per_step["evicted"].sum() == evicted and per_step["missed"].sum() == missed
    saved = np.load(out)
    keys = saved["embedding:keys"]
    assert len(keys) == resident and np.all(np.diff(keys) > 0)
    assert saved["embedding"].shape == (resident, 4)


def test_a_checkpoint_resumes_exactly(hashed, tmp_path):
    flags = (*FLAGS, "--data-dir", hashed, "--table-capacity", "256", "--admit-after", "2", "--evict-ttl", "5")
    full, part, resumed = tmp_path / "full.npz", tmp_path / "part", tmp_path / "resumed.npz"
    assert run_hetu(*flags, "--nepoch", "2", "--save-params", full).returncode == 0
    proc = run_hetu(*flags, "--nepoch", "1", "--checkpoint", part)
    assert proc.returncode == 0, proc.stderr
    proc = run_hetu(*flags, "--nepoch", "2", "--resume", part, "--save-params", resumed)
    assert proc.returncode == 0, proc.stderr
    a, b = np.load(full), np.load(resumed)
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    other = run_hetu(*FLAGS, "--data-dir", hashed, "--table-capacity", "256", "--nepoch", "2", "--resume", part)
    assert other.returncode != 0 and "--table-capacity" in other.stderr, other.stderr


def test_steps_taken_ahead_change_nothing(hashed, tmp_path):
    """The key directory's next step, taken ahead on a thread (HETU_DYNAMIC_AHEAD, the default), is
    taken back whenever a validation, a checkpoint or the counters read the directory first:
    validation after each epoch and a checkpoint every 7 steps, with evictions, a ttl and
    admission after 2 reads, give the same validation lines, parameters, counters and checkpoint
    as every step taken in its turn."""
    flags = (*FLAGS, "--data-dir", hashed, "--table-capacity", "256", "--admit-after", "2", "--evict-ttl", "5",
             "--nepoch", "3", "--val")
    outputs = {}
    for ahead in ("1", "0"):
        out = tmp_path / ahead
        out.mkdir()
        proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress", *map(str, flags),
                         "--checkpoint", out / "ckpt", "--checkpoint-every", "7", "--save-params", out / "p.npz"],
                        capture_output=True, text=True, timeout=300,
                        env={"HETU_NUM_THREADS": "1", "HETU_DYNAMIC_AHEAD": ahead})
        assert proc.returncode == 0, proc.stderr
        lines = [re.sub(r"\(.*?samples/s\)", "", x) for x in proc.stdout.splitlines()
                 if x.startswith(("epoch ", "table "))]
        assert sum("val" in x for x in lines) == 3 and sum(x.startswith("table ") for x in lines) == 2, proc.stdout
        outputs[ahead] = lines, np.load(out / "p.npz"), np.load(out / "ckpt" / "dynamic.npz")
    (lines_a, params_a, keys_a), (lines_b, params_b, keys_b) = outputs["1"], outputs["0"]
    assert lines_a == lines_b
    for got, want in ((params_a, params_b), (keys_a, keys_b)):
        assert sorted(got.files) == sorted(want.files)
        for k in want.files:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)
