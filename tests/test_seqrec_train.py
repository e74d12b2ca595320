"""The sequential models from the command line: `run_hetu.py --model sasrec_synthetic --val`
trains, ranks every item for every user's held-out one and prints HR@K and NDCG@K in its epoch
and summary lines; a run resumed from its checkpoint (within an epoch, alone or under Herald)
ends bit for bit where the uninterrupted run ends; flags it does not take yet are refused in one
line, never dropped."""
import json
import os
import sys

import numpy as np
import pytest

import jobs
from dist_harness import assert_same_parameters, run_cluster, run_single
from hetu.data.sequences import generate_synthetic_sequences
from conftest import REPO

RUN = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress", "--embedding-size", "16",
       "--num-negatives", "8", "--iters-per-epoch", "3", "--batch-size", "32"]


def run(data_home, *args):
    env = dict(os.environ, HETU_DATA_HOME=data_home, HETU_NUM_THREADS="1")
    return jobs.run([*RUN, *args], capture_output=True, text=True, env=env, timeout=300)


def test_training_with_validation_prints_ranking_metrics(data_home):
    proc = run(data_home, "--model", "hstu_synthetic", "--val", "--nepoch", "2")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    epochs = [line for line in proc.stdout.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2 and all("val hr@10" in line and "ndcg@200" in line for line in epochs), proc.stdout
    summary = json.loads(proc.stdout.split("summary ", 1)[1].splitlines()[0])
    assert summary["users"] == 2000 and summary["iterations"] == 6
    for k in (10, 50, 200):
        assert 0 <= summary[f"ndcg@{k}"] <= summary[f"hr@{k}"] <= 1
    assert summary["hr@10"] <= summary["hr@50"] <= summary["hr@200"] and summary["hr@200"] > 0


@pytest.mark.parametrize("flag", [["--save-predictions", "p.npy", "--val"], ["--rows", "1000"], ["--stream", "logs"],
                                  ["--dropout", "1.5"], ["--heads", "3"]])
def test_what_the_sequential_models_do_not_take_is_refused(data_home, tmp_path, flag):
    proc = run(data_home, "--model", "sasrec_synthetic", *flag)
    assert proc.returncode != 0
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert flag[0] in last and "Traceback" not in proc.stderr, last


def test_hashed_items_need_a_dynamic_table(data_home, tmp_path):
    folder = generate_synthetic_sequences(tmp_path / "hashed", users=100, items=300, ids="hashed")
    proc = run(data_home, "--model", "sasrec", "--data-dir", str(folder))
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "hashed item ids" in proc.stderr and "--table-capacity" in proc.stderr, proc.stderr


def assert_identical(a, b):
    assert sorted(a) == sorted(b) and len(a) > 10
    different = [k for k in a if not np.array_equal(a[k], b[k])]
    assert not different, different


def test_a_resumed_run_ends_where_the_uninterrupted_run_ends(data_home, tmp_path):
    model = ["--model", "hstu_synthetic", "--dropout", "0.3"]
    full = run(data_home, *model, "--nepoch", "2", "--save-params", str(tmp_path / "full.npz"))
    assert full.returncode == 0, full.stdout + full.stderr
    # Two of an epoch's three steps, a checkpoint within the epoch, then the rest.
    part = run(data_home, *model, "--nepoch", "0.67", "--checkpoint", str(tmp_path / "ckpt"))
    assert part.returncode == 0 and "checkpoint at step 2" in part.stdout, part.stdout + part.stderr
    rest = run(data_home, *model, "--nepoch", "2", "--resume", str(tmp_path / "ckpt"),
               "--save-params", str(tmp_path / "resumed.npz"))
    assert rest.returncode == 0 and "resumed at step 2" in rest.stdout, rest.stdout + rest.stderr
    assert_identical(dict(np.load(tmp_path / "full.npz")), dict(np.load(tmp_path / "resumed.npz")))
    other = run(data_home, *model, "--num-negatives", "4", "--nepoch", "2", "--resume", str(tmp_path / "ckpt"))
    assert other.returncode == 2 and "--num-negatives 8" in other.stderr, other.stdout + other.stderr


QUIET = ["--no-progress"]


def test_herald_resumes_a_sequential_model_exactly(data_home, tmp_path):
    # The resumed plans start from empty caches and allocate samples to workers otherwise, so the
    # dense sums are taken in another order: equal to the single process, as every mode is, each
    # row within its bounds under SGD (under Adam one row of 3,000, stepped by the sign of a
    # near-cancelled sum, moved by up to 3.4 times the adaptive bound on one BLAS kernel).
    model = ["--model", "sasrec_synthetic", "--embedding-size", "16", "--num-negatives", "8", "--iters-per-epoch", "4",
             "--optimizer", "sgd", "--learning-rate", "0.05"]
    flags = ["--comm", "Hybrid", "--cache", "lru", "--cache-limit-ratio", "0.2", "--bsp", "0", *model]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", [*model, "--nepoch", "2"], 32, common=QUIET)
    run_cluster(tmp_path, data_home, "run_laia.py", [*flags, "--nepoch", "0.75", "--checkpoint",
                                                     str(tmp_path / "ckpt")], 2, 1, 16, common=QUIET)
    resumed, log = run_cluster(tmp_path, data_home, "run_laia.py", [*flags, "--nepoch", "2", "--resume",
                                                                    str(tmp_path / "ckpt")], 2, 1, 16, common=QUIET)
    assert "resumed at step 3" in log, log[-3000:]
    assert_same_parameters(reference, resumed, exact_rows=True)
