"""The sequential models from the command line: `run_hetu.py --model sasrec_synthetic --val`
trains, ranks every item for every user's held-out one and prints HR@K and NDCG@K in its epoch
and summary lines; flags it does not take yet are refused in one line, never dropped."""
import json
import os
import sys

import pytest

import jobs
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


@pytest.mark.parametrize("flag", [["--checkpoint", "ckpt"], ["--table-capacity", "1000"], ["--stream", "logs"],
                                  ["--dropout", "1.5"], ["--heads", "3"]])
def test_what_the_sequential_models_do_not_take_is_refused(data_home, tmp_path, flag):
    proc = run(data_home, "--model", "sasrec_synthetic", *flag)
    assert proc.returncode != 0
    last = (proc.stdout + proc.stderr).strip().splitlines()[-1]
    assert flag[0] in last and "Traceback" not in proc.stderr, last
