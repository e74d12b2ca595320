"""Incremental checkpoints (--checkpoint-full-every K): every K-th save is full, the ones between
are deltas of the save before; a run resumed from a full checkpoint and its deltas continues
exactly as a run straight through (docs/design.md section 4), and a delta's servers' files hold
the changed rows at no more than 1.1x the bytes a full checkpoint spends on them."""
import json
import os
import re
import struct
import sys

import numpy as np
import pytest

import jobs
from conftest import REPO
from dist_harness import COMMON, THREADS, run_cluster, run_single

OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--learning-rate", "0.01"],
              "adam": ["--optimizer", "adam", "--learning-rate", "0.001"]}
# A dynamic table far smaller than the keys seen: keys are admitted, evicted and come back
# between checkpoints, so a delta must hold rows whose key changed.
DYNAMIC = ["--model", "wdl_criteo", "--table-capacity", "1024", "--admit-after", "2", "--evict-ttl", "6"]
# A save every 4 steps, every 3rd one full: 21 steps save at 4 (full), 8, 12, 16 (full), 20, 21.
INCREMENTAL = ["--checkpoint-every", "4", "--checkpoint-full-every", "3", "--nepoch", "0.7"]
KINDS = [(4, "full"), (8, "delta 1"), (12, "delta 2"), (16, "full"), (20, "delta 1"), (21, "delta 2")]

DELTA_HEADER = struct.Struct("<8s9q")   # ps-lite/src/table.cc DeltaHeader


def saves(stdout):
    """(step, kind) of every checkpoint line."""
    return [(int(m[0]), m[1]) for m in re.findall(r"checkpoint at step (\d+) written to \S+ in [\d.]+ s \(([^)]+)\)",
                                                   stdout)]


def assert_same_bits(reference, got):
    assert sorted(got) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def check_chain(ckpt):
    """The checkpoint at `ckpt` is a full one with deltas 000001 and 000002, each sealed."""
    assert sorted(os.listdir(ckpt / "deltas")) == ["000001", "000002"]
    full = json.loads((ckpt / "meta.json").read_text())
    metas = [json.loads((ckpt / "deltas" / d / "meta.json").read_text()) for d in ("000001", "000002")]
    assert [m["iteration"] for m in [full, *metas]] == [16, 20, 21]
    assert [m["base"] for m in metas] == [full["mark"], metas[0]["mark"]]


@pytest.mark.parametrize("optimizer,dynamic", [("sgd", False), ("adam", False), ("adam", True)],
                         ids=["sgd", "adam", "adam-dynamic"])
def test_single_process_full_and_deltas_resume_bit_for_bit(tmp_path, data_home, optimizer, dynamic):
    args = [*OPTIMIZERS[optimizer], *(DYNAMIC if dynamic else [])]
    straight, _ = run_single(tmp_path, data_home, "run_hetu.py", [*args, "--nepoch", "2"], global_batch=64)
    ckpt = tmp_path / "ckpt"
    env = dict(os.environ, HETU_DATA_HOME=data_home, **THREADS)
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *args, "--batch-size", "64",
                     "--checkpoint", str(ckpt), *INCREMENTAL], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert saves(proc.stdout) == KINDS, proc.stdout
    check_chain(ckpt)
    delta = ckpt / "deltas" / "000002"
    assert sorted(os.listdir(delta)) == sorted(["arrays.npz", "rows.npz", "meta.json"] +
                                               (["dynamic.npz"] if dynamic else []))
    with np.load(delta / "rows.npz") as rows:   # one step's rows, not the table's
        changed, table_rows = len(rows["rows/embedding"]), rows["param/embedding"].shape[0]
    assert 0 < changed == table_rows, (changed, table_rows)
    assert changed < straight["embedding"].shape[0] / (1 if dynamic else 4), changed
    resumed, summary = run_single(tmp_path, data_home, "run_hetu.py", [*args, "--nepoch", "2", "--resume", str(ckpt)],
                                  global_batch=64)
    assert (summary["first_step"], summary["iterations"]) == (21, 39)
    assert_same_bits(straight, resumed)


def delta_ratio(folder):
    """(rows, bytes on disk / (rows x the bytes a full checkpoint spends on a row)) over the
    servers' delta files of the embedding table in `folder`."""
    rows = size = full_row = 0
    for name in os.listdir(folder):
        if not name.startswith("embedding.delta"):
            continue
        with open(folder / name, "rb") as f:
            magic, _, width, _, state_width, storage, _, count, _, _ = DELTA_HEADER.unpack(f.read(DELTA_HEADER.size))
        assert magic == b"HETUPD01"
        full_row = width * {0: 4, 1: 2, 2: 2}[storage] + state_width * 4 + 16   # values, state, step, version
        rows += count
        size += os.path.getsize(folder / name)
    return rows, size / (rows * full_row)


@pytest.mark.cluster
@pytest.mark.timeout(500)
@pytest.mark.parametrize("optimizer,dynamic", [("sgd", True), ("adam", False)], ids=["sgd-dynamic", "adam"])
def test_cluster_full_and_deltas_resume_bit_for_bit(tmp_path, data_home, optimizer, dynamic):
    """2 workers, 2 servers: the servers write and apply the deltas of their shards."""
    args = ["--comm", "PS", "--bsp", "0", *OPTIMIZERS[optimizer], *(DYNAMIC if dynamic else [])]
    straight, _ = run_cluster(tmp_path, data_home, "run_hetu.py", [*args, "--nepoch", "2"], 2, 2, 32)
    ckpt = tmp_path / "ckpt"
    _, out = run_cluster(tmp_path, data_home, "run_hetu.py", [*args, "--checkpoint", str(ckpt), *INCREMENTAL],
                         2, 2, 32)
    assert [(s, k) for s, k in saves(out)] == KINDS, out
    check_chain(ckpt)
    for d in ("000001", "000002"):
        rows, ratio = delta_ratio(ckpt / "deltas" / d / "ps")
        assert rows > 0 and ratio <= 1.1, (d, rows, ratio)
    full_bytes = sum(os.path.getsize(ckpt / "ps" / f) for f in os.listdir(ckpt / "ps") if "embedding" in f)
    delta_bytes = sum(os.path.getsize(ckpt / "deltas/000002/ps" / f) for f in os.listdir(ckpt / "deltas/000002/ps")
                      if "embedding" in f)
    assert delta_bytes < full_bytes / (1 if dynamic else 4), (delta_bytes, full_bytes)   # one step of 1024 rows
    got, out = run_cluster(tmp_path, data_home, "run_hetu.py", [*args, "--nepoch", "2", "--resume", str(ckpt)],
                           2, 2, 32)
    assert "resumed at step 21" in out and "a full checkpoint and 2 deltas" in out, out
    assert_same_bits(straight, got)


def test_a_delta_interrupted_before_its_rename_leaves_the_chain_before_it(tmp_path, data_home):
    """Killed after a delta is sealed but before it is renamed into place: the chain resumes
    from the save before, and the next save removes the unfinished folder."""
    args = OPTIMIZERS["adam"]
    straight, _ = run_single(tmp_path, data_home, "run_hetu.py", [*args, "--nepoch", "1"], global_batch=64)
    ckpt = tmp_path / "ckpt"
    env = dict(os.environ, HETU_DATA_HOME=data_home, **THREADS)
    base = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *args, "--batch-size", "64",
            "--checkpoint", str(ckpt), "--checkpoint-every", "4", "--checkpoint-full-every", "3"]
    killed = jobs.run([*base, "--nepoch", "0.3"], capture_output=True, text=True, timeout=300,
                      env=dict(env, HETU_CHECKPOINT_STOP_AT="delta-written"))
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert saves(killed.stdout) == [(4, "full")], killed.stdout
    assert [e for e in os.listdir(ckpt / "deltas") if e.startswith(".tmp-000001.")]
    resumed = jobs.run([*base, "--nepoch", "1", "--resume", str(ckpt), "--save-params", str(tmp_path / "p.npz")],
                       capture_output=True, text=True, timeout=300, env=env)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "resumed" in resumed.stdout and "at step 4:" in resumed.stdout, resumed.stdout
    assert not [e for e in os.listdir(ckpt / "deltas") if e.startswith(".tmp-")]
    with np.load(tmp_path / "p.npz") as got:
        assert_same_bits(straight, {k: got[k] for k in got.files})
