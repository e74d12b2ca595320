"""Checkpoints (--checkpoint / --resume): a run stopped after an epoch and resumed from its
checkpoint trains the same parameters as one run straight through (DESIGN.md section 4)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from dist_harness import COMMON, assert_same_parameters, run_cluster, run_single

ADAM = ["--optimizer", "adam", "--learning-rate", "0.01", "--iters-per-epoch", "20"]
HERALD = ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--cache-limit-ratio", "0.05", "--prefetch"]


def test_single_process_resume_is_bit_identical(tmp_path, data_home):
    straight, _ = run_single(tmp_path, data_home, "run_hetu.py", [*ADAM, "--nepoch", "2"], global_batch=64)
    ckpt = tmp_path / "ckpt"
    # 14 of the epoch's 20 steps, a checkpoint every 6: after steps 6, 12 and 14 (the end).
    env = dict(os.environ, HETU_DATA_HOME=data_home)
    proc = subprocess.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *ADAM, "--batch-size", "64",
                           "--nepoch", "0.7", "--checkpoint", str(ckpt), "--checkpoint-every", "6"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [int(line.split()[3]) for line in proc.stdout.splitlines() if line.startswith("checkpoint at step")] \
        == [6, 12, 14], proc.stdout
    assert sorted(os.listdir(ckpt)) == ["arrays.npz", "meta.json"]
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp")] == []   # no temporary folder left
    # Resumed within the first epoch.
    resumed, summary = run_single(tmp_path, data_home, "run_hetu.py",
                                  [*ADAM, "--nepoch", "2", "--resume", str(ckpt)], global_batch=64)
    assert (summary["first_step"], summary["iterations"]) == (14, 26)
    assert sorted(resumed) == sorted(straight)
    for name, value in straight.items():
        np.testing.assert_array_equal(resumed[name], value, err_msg=name)


@pytest.mark.timeout(400)
@pytest.mark.parametrize("script,resume_script,flags,servers,bitwise", [
    # Dense and sparse on 2 servers, HET cache with prefetch: shards of every table, the clocks.
    # The allocation is the plain slices, so the resumed run repeats the straight one bit for bit.
    ("run_hetu.py", "run_hetu.py", ["--comm", "PS", "--cache", "lru", "--bound", "0", "--prefetch"], 2, True),
    # Herald: dirty rows flushed into the checkpoint; the resumed plans start from empty caches
    # and allocate differently, so float sums are taken in another order.
    ("run_laia.py", "run_laia.py", HERALD, 1, False),
    # Everything is on the servers at a checkpoint, so a HET run can go on as Herald.
    ("run_hetu.py", "run_laia.py", HERALD, 1, False)])
def test_resumed_cluster_run_equals_the_single_process_reference(tmp_path, data_home, script, resume_script, flags,
                                                                  servers, bitwise):
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", [*ADAM, "--nepoch", "3"], global_batch=64)
    ckpt = tmp_path / "ckpt"
    args = [*flags, "--bsp", "0", *ADAM]
    if bitwise:
        straight, _ = run_cluster(tmp_path, data_home, script, [*args, "--nepoch", "3"], 2, servers, 32)
    run_cluster(tmp_path, data_home, script, [*args, "--nepoch", "1", "--checkpoint", str(ckpt)], 2, servers, 32)
    assert len(os.listdir(ckpt / "ps")) > 0
    # The resumed run also checkpoints as it goes on training, within epochs too (steps 21, 28,
    # 35, 40, 42, 49, 56, 60): every one a flush, between prefetched steps.
    got, out = run_cluster(tmp_path, data_home, resume_script,
                           [*args, "--nepoch", "3", "--resume", str(ckpt), "--checkpoint", str(ckpt),
                            "--checkpoint-every", "7"], 2, servers, 32)
    assert "resumed at step 20" in out
    assert "[worker 0] checkpoint at step 49 written to" in out and "[worker 1] checkpoint at" not in out
    assert json.loads((ckpt / "meta.json").read_text())["iteration"] == 60
    assert_same_parameters(reference, got, exact_rows=False)
    if bitwise:
        for name, value in straight.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)


def _run(data_home, script, *args, launcher=()):
    env = dict(os.environ, HETU_DATA_HOME=data_home)
    cmd = [*launcher, sys.executable, str(REPO / "examples/ctr" / script), *COMMON, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=200)


@pytest.mark.timeout(300)
def test_resume_refuses_a_checkpoint_of_another_run(tmp_path, data_home):
    ckpt = tmp_path / "ckpt"
    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--checkpoint", str(ckpt), "--val")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    validated = [line.split(" | ")[1] for line in proc.stdout.splitlines() if line.startswith("epoch 0:")]
    assert len(validated) == 1 and validated[0].startswith("val loss"), proc.stdout

    cases = [
        (["--batch-size", "32", "--resume", str(ckpt)],
         f"--resume {ckpt}: the checkpoint was trained with --batch-size 64, this run has --batch-size 32"),
        (["--batch-size", "64", "--embedding-size", "4", "--resume", str(ckpt)],
         "the checkpoint was trained with --embedding-size 8, this run has --embedding-size 4"),
        (["--batch-size", "64", "--resume", str(tmp_path)], f"{tmp_path} is not a hetu checkpoint"),
        (["--batch-size", "64", "--checkpoint", str(tmp_path / "no" / "ckpt")],
         f"the folder {tmp_path / 'no'} does not exist or is not writable"),
        (["--batch-size", "64", "--checkpoint-every", "5"], "--checkpoint-every needs --checkpoint DIR"),
    ]
    for args, message in cases:
        proc = _run(data_home, "run_hetu.py", *ADAM, *args)
        assert proc.returncode == 2 and message in proc.stderr, (args, proc.stderr)
        assert "Traceback" not in proc.stderr

    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--resume", str(ckpt))
    assert proc.returncode == 1 and "the checkpoint is at step 20, and --nepoch 1 of 20 iterations per epoch is " \
                                   "20 steps: nothing is left to train (with --val: validate it only)" in proc.stderr, \
        proc.stderr
    # With --val, a finished checkpoint is validated: the metrics the run printed after its epoch.
    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--resume", str(ckpt), "--val")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"checkpoint {ckpt} at step 20: {validated[0]}" in proc.stdout, (validated, proc.stdout)

    # A checkpoint of one worker resumed by two: the global batch would differ.
    def cluster(workers):
        return sys.executable, str(REPO / "python/runner.py"), "-w", str(workers), "-s", "1", "--timeout", "150"
    hybrid = tmp_path / "hybrid"
    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--comm", "Hybrid", "--checkpoint", str(hybrid),
                launcher=cluster(1))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--comm", "Hybrid", "--nepoch", "2",
                "--resume", str(hybrid), launcher=cluster(2))
    assert proc.returncode != 0
    assert "was written by 1 worker(s), this run has 2: the global batch, and so the training, would differ" \
        in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]

    # A damaged shard is named, in one line, before anything is loaded.
    damaged = tmp_path / "damaged"
    shutil.copytree(hybrid, damaged)
    shard = damaged / "ps" / "embedding.shard0-of-1.bin"
    os.truncate(shard, 1000)
    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--comm", "Hybrid", "--nepoch", "2",
                "--resume", str(damaged), launcher=cluster(1))
    assert proc.returncode != 0 and "Traceback" not in proc.stdout + proc.stderr
    assert f"--resume {damaged}: checkpoint file {shard} is truncated: 1000 bytes" \
        in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]
