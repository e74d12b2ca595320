"""End to end: run_hetu.py trains WDL on the synthetic Criteo-shaped data to a useful AUC."""
import json
import os
import sys

import pytest

import jobs
from conftest import REPO


def run_hetu(data_home, *args, timeout=240):
    env = dict(os.environ, HETU_DATA_HOME=data_home)
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress", *args],
                    capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = [line for line in proc.stdout.splitlines() if line.startswith("summary ")]
    assert summary, proc.stdout
    return json.loads(summary[-1][len("summary "):]), proc.stdout


@pytest.mark.timeout(300)
def test_wdl_reaches_auc_on_synthetic_criteo(data_home):
    summary, out = run_hetu(data_home, "--model", "wdl_criteo", "--rows", "100000", "--embedding-size", "16",
                            "--optimizer", "adam", "--learning-rate", "0.001", "--iters-per-epoch", "600", "--val")
    assert summary["final"]["val"]["auc"] >= 0.70, out


@pytest.mark.timeout(300)
@pytest.mark.parametrize("model,rows,iterations,min_auc", [
    ("dfm_criteo", 100000, 300, 0.65), ("dcn_criteo", 100000, 300, 0.65),
    ("dcn_avazu", 50000, 200, 0.68), ("ncf_movielens", 50000, 200, 0.68)])
def test_other_models_learn(data_home, model, rows, iterations, min_auc):
    summary, out = run_hetu(data_home, "--model", model, "--rows", str(rows), "--embedding-size", "8",
                            "--optimizer", "adam", "--learning-rate", "0.001", "--iters-per-epoch", str(iterations),
                            "--val")
    assert summary["final"]["val"]["auc"] >= min_auc, out


def test_distributed_flags_without_comm_are_rejected(data_home):
    env = dict(os.environ, HETU_DATA_HOME=data_home)
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--cache", "lru", "--rows", "100000"],
                    capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0 and "--comm" in proc.stderr


def test_herald_over_allreduce_is_rejected_before_loading(tmp_path):
    env = dict(os.environ, HETU_DATA_HOME=str(tmp_path / "data"))
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_laia.py"), "--comm", "AllReduce"],
                    capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode != 0 and "--comm PS or Hybrid, not AllReduce" in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("script,flag,value", [
    ("run_hetu.py", "--batch-size", "0"), ("run_hetu.py", "--embedding-size", "-3"),
    ("run_hetu.py", "--cache-limit-ratio", "2"), ("run_hetu.py", "--learning-rate", "nan"),
    ("run_hetu.py", "--bsp", "-2"), ("run_hetu.py", "--bound", "-1"), ("run_hetu.py", "--nepoch", "0"),
    ("run_laia.py", "--lookahead", "0"), ("run_laia.py", "--iters-per-epoch", "ten")])
def test_bad_flags_are_rejected_before_anything_starts(tmp_path, script, flag, value):
    # No data home is given: a run that got past parsing would start making the synthetic data here.
    env = dict(os.environ, HETU_DATA_HOME=str(tmp_path / "data"))
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr" / script), flag, value],
                    capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"argument {flag}: " in proc.stderr and repr(value) in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "data").exists()


@pytest.mark.parametrize("flags,message", [
    (["--batch-size", "2000"], "the training split has 900 samples, fewer than one global batch of 1 worker(s) x "
                               "--batch-size 2000"),
    # The validation split is found too small before training, not by a crash after it.
    (["--batch-size", "300", "--val"], "the validation split has 100 samples, fewer than one global batch of 1 "
                                       "worker(s) x --batch-size 300"),
    (["--nepoch", "0.01"], "--nepoch 0.01 of 7 iterations per epoch is no iteration"),
    (["--dataset", "nosuch"], "--dataset nosuch: dataset not found: 'nosuch' is neither a folder nor a known name"),
    (["--data-dir", "{tmp}"], "--data-dir {tmp}: {tmp} is not a complete dataset folder (no meta.json)")])
def test_runs_that_cannot_train_are_rejected_before_training(tmp_path, data_home, flags, message):
    env = dict(os.environ, HETU_DATA_HOME=data_home)
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--rows", "1000", "--no-progress",
                     *(f.format(tmp=tmp_path) for f in flags)], capture_output=True, text=True, env=env,
                    timeout=120)
    message = message.format(tmp=tmp_path)
    assert proc.returncode == 1 and message in proc.stderr, proc.stdout + proc.stderr
    assert "epoch 0" not in proc.stdout and "Traceback" not in proc.stderr


@pytest.mark.parametrize("flags,message", [
    (["--save-params", "{tmp}/absent/params.npz"], "--save-params {tmp}/absent/params.npz: the folder {tmp}/absent "
                                                   "does not exist"),
    (["--cache-perf", "--csv-dir", "{tmp}/file/csv"], "--csv-dir {tmp}/file/csv: cannot create it")])
def test_unwritable_outputs_are_rejected_before_training(tmp_path, flags, message):
    (tmp_path / "file").write_text("a file, not a folder")
    env = dict(os.environ, HETU_DATA_HOME=str(tmp_path / "data"))
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"),
                     *(f.format(tmp=tmp_path) for f in flags)],
                    capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and message.format(tmp=tmp_path) in proc.stderr, proc.stderr
    assert not (tmp_path / "data").exists()   # nothing was loaded or trained


def test_progress_lines_when_the_output_is_a_log(data_home):
    """Under the launcher the output is no terminal: progress comes as lines, at most one per
    --log-interval seconds, none with --no-progress."""
    env = dict(os.environ, HETU_DATA_HOME=data_home)
    command = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--rows", "100000", "--embedding-size", "8",
               "--iters-per-epoch", "150", "--log-interval", "0.000001"]
    logged = jobs.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert logged.returncode == 0, logged.stderr
    lines = [line for line in logged.stdout.splitlines() if line.startswith("epoch 0: ") and "iterations, loss" in line]
    assert len(lines) == 149 and lines[0].startswith("epoch 0: 1/150 iterations, loss "), logged.stdout[-2000:]
    assert lines[-1].startswith("epoch 0: 149/150 iterations") and lines[-1].endswith(" s to go")
    quiet = jobs.run(command + ["--no-progress"], capture_output=True, text=True, env=env, timeout=240)
    assert quiet.returncode == 0 and "iterations, loss" not in quiet.stdout, quiet.stdout[-2000:]
