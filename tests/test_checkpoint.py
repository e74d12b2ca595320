"""Checkpoints (--checkpoint / --resume): a run stopped after an epoch and resumed from its
checkpoint trains the same parameters as one run straight through (docs/design.md section 4)."""
import json
import os
import re
import shlex
import shutil
import sys

import numpy as np
import pytest

import jobs
from conftest import REPO
from dist_harness import COMMON, THREADS, assert_same_parameters, run_cluster, run_single
from hetu import checkpoint

# lr 0.001, as every equivalence test: at 0.01 this model's 60 Adam steps are chaotic, and the
# single process alone moves by 1e-1 when OpenBLAS's kernel changes (bench/exactness_envelope.py).
ADAM = ["--optimizer", "adam", "--learning-rate", "0.001", "--iters-per-epoch", "20"]
# Comparisons across a cluster's shape or a resume stop before step 20: between steps 20 and 30
# WDL's Adam run at W = 2 reaches a hidden unit of one sample within float rounding of ReLU's
# kink, which Sandybridge's OpenBLAS kernel rounds apart in the 64-row and the 32-row GEMMs (17x
# and 21x the bound at 2 x 20 and 3 x 14 steps; docs/results/exactness.md, "Rounding").
ADAM_2X10 = ["--optimizer", "adam", "--learning-rate", "0.001", "--iters-per-epoch", "10"]
ADAM_3X6 = ["--optimizer", "adam", "--learning-rate", "0.001", "--iters-per-epoch", "6"]
SGD = ["--optimizer", "sgd", "--learning-rate", "0.01", "--iters-per-epoch", "20"]
# One accumulator per embedding row; AdaGrad's per-element state for the dense tensors.
ROWWISE = ["--optimizer", "rowwise_adagrad", "--learning-rate", "0.001", "--iters-per-epoch", "20"]
HERALD = ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--cache-limit-ratio", "0.05", "--prefetch"]


@pytest.mark.parametrize("optimizer", [ADAM, ROWWISE], ids=["adam", "rowwise_adagrad"])
def test_single_process_resume_is_bit_identical(tmp_path, data_home, optimizer):
    straight, _ = run_single(tmp_path, data_home, "run_hetu.py", [*optimizer, "--nepoch", "2"], global_batch=64)
    ckpt = tmp_path / "ckpt"
    # 14 of the epoch's 20 steps, a checkpoint every 6: after steps 6, 12 and 14 (the end).
    env = dict(os.environ, HETU_DATA_HOME=data_home, **THREADS)
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *optimizer,
                     "--batch-size", "64", "--nepoch", "0.7", "--checkpoint", str(ckpt), "--checkpoint-every", "6"],
                    capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [int(line.split()[3]) for line in proc.stdout.splitlines() if line.startswith("checkpoint at step")] \
        == [6, 12, 14], proc.stdout
    assert sorted(os.listdir(ckpt)) == ["arrays.npz", "meta.json"]
    assert [p for p in os.listdir(tmp_path) if p.startswith(".tmp")] == []   # no temporary folder left
    # Resumed within the first epoch.
    resumed, summary = run_single(tmp_path, data_home, "run_hetu.py",
                                  [*optimizer, "--nepoch", "2", "--resume", str(ckpt)], global_batch=64)
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
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", [*ADAM_3X6, "--nepoch", "3"], global_batch=64)
    ckpt = tmp_path / "ckpt"
    args = [*flags, "--bsp", "0", *ADAM_3X6]
    if bitwise:
        straight, _ = run_cluster(tmp_path, data_home, script, [*args, "--nepoch", "3"], 2, servers, 32)
    run_cluster(tmp_path, data_home, script, [*args, "--nepoch", "1", "--checkpoint", str(ckpt)], 2, servers, 32)
    assert len(os.listdir(ckpt / "ps")) > 0
    # The resumed run also checkpoints as it goes on training, within epochs too (steps 7 and 14,
    # and each epoch's end): every one a flush, between prefetched steps.
    got, out = run_cluster(tmp_path, data_home, resume_script,
                           [*args, "--nepoch", "3", "--resume", str(ckpt), "--checkpoint", str(ckpt),
                            "--checkpoint-every", "7"], 2, servers, 32)
    assert "resumed at step 6" in out   # the end of the first of three epochs of 6 steps
    assert "[worker 0] checkpoint at step 14 written to" in out and "[worker 1] checkpoint at" not in out
    for s in range(servers):   # each server's own checkpoint rates, printed by worker 0
        for kind in ("loaded", "saved"):
            assert re.search(rf"\[worker 0\] server {s}: checkpoint {kind}, [1-9]\d* bytes in [\d.]+ s \(", out), out
    assert json.loads((ckpt / "meta.json").read_text())["iteration"] == 18
    assert_same_parameters(reference, got, exact_rows=False)
    if bitwise:
        for name, value in straight.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.timeout(500)
@pytest.mark.parametrize("script,flags,optimizer,shape", [
    # Dense tables on the servers too (--comm PS): their shards re-split (each slot of Adam's
    # state), and a 1-row bias on 2 servers leaves one shard empty (its clock still loaded).
    ("run_hetu.py", ["--comm", "PS"], ADAM_2X10, ((2, 2), (4, 1))),
    # Row-wise AdaGrad: one float of state per row in the embedding shards, AdaGrad's in the dense ones.
    ("run_hetu.py", ["--comm", "PS"], ROWWISE, ((2, 2), (4, 1))),
    ("run_hetu.py", ["--comm", "PS", "--cache", "lru", "--bound", "0", "--cache-limit-ratio", "0.05"], SGD,
     ((4, 1), (2, 2))),
    ("run_laia.py", HERALD, SGD, ((2, 1), (4, 2))),
    ("run_laia.py", HERALD, ADAM, ((4, 2), (2, 1))),
    ("run_laia.py", HERALD, ROWWISE, ((2, 1), (4, 2)))],
    ids=["PS-adam-2x2-to-4x1", "PS-rowwise_adagrad-2x2-to-4x1", "HET-sgd-4x1-to-2x2", "Herald-sgd-2x1-to-4x2",
         "Herald-adam-4x2-to-2x1", "Herald-rowwise_adagrad-2x1-to-4x2"])
def test_resume_on_another_cluster_shape_equals_the_single_process_reference(tmp_path, data_home, script, flags,
                                                                             optimizer, shape):
    """W workers x b and S servers write the checkpoint; W' x b' (W b = W' b') and S' go on."""
    (w0, s0), (w1, s1) = shape
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", [*optimizer, "--nepoch", "2"], global_batch=64)
    ckpt = tmp_path / "ckpt"
    args = [*flags, "--bsp", "0", *optimizer]
    run_cluster(tmp_path, data_home, script, [*args, "--nepoch", "1", "--checkpoint", str(ckpt)], w0, s0, 64 // w0)
    assert len([f for f in os.listdir(ckpt / "ps") if f.startswith("embedding.")]) == s0
    got, out = run_cluster(tmp_path, data_home, script, [*args, "--nepoch", "2", "--resume", str(ckpt)],
                           w1, s1, 64 // w1)
    epoch = int(optimizer[optimizer.index("--iters-per-epoch") + 1])
    assert f"[worker 0] resumed {ckpt} at step {epoch}: written by {w0} worker(s) and {s0} server(s), continued by " \
           f"{w1} and {s1}; every file's sha256 checked, the servers' rows of " in out, out[-3000:]
    assert_same_parameters(reference, got, exact_rows=optimizer is SGD)


@pytest.mark.timeout(300)
def test_a_resume_whose_saved_shards_do_not_add_up_is_refused(tmp_path, data_home):
    """A server reads its rows from the saved shards that hold them: one missing is named, not
    filled with zeros, and the global batch must stay."""
    ckpt = tmp_path / "ckpt"
    args = ["--comm", "Hybrid", "--bsp", "0", *SGD]
    run_cluster(tmp_path, data_home, "run_hetu.py", [*args, "--nepoch", "1", "--checkpoint", str(ckpt)], 2, 2, 32)
    env = dict(os.environ, HETU_DATA_HOME=data_home, PS_HEARTBEAT_TIMEOUT="20", **THREADS)

    def resume(folder, workers, servers, batch):
        cmd = [sys.executable, str(REPO / "python/runner.py"), "-w", str(workers), "-s", str(servers), "--timeout",
               "150", sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *args, "--nepoch", "2",
               "--batch-size", str(batch), "--resume", str(folder)]
        proc = jobs.run(cmd, capture_output=True, text=True, env=env, timeout=200)
        return proc.returncode, proc.stdout + proc.stderr

    code, out = resume(ckpt, 4, 1, 32)
    assert code != 0 and "Traceback" not in out
    assert "global batch of 2 worker(s) x --batch-size 32 = 64, this run has 4 worker(s) x --batch-size 32 = 128" \
        in out, out[-3000:]
    # A shard file gone, and meta.json no longer listing it (else its sha256 check names it first),
    # its own sha256 recomputed (else that check names meta.json first).
    broken = tmp_path / "broken"
    shutil.copytree(ckpt, broken)
    os.remove(broken / "ps" / "embedding.shard1-of-2.bin")
    meta = json.loads((broken / "meta.json").read_text())
    del meta["files"]["ps/embedding.shard1-of-2.bin"]
    (broken / "meta.json").write_text(json.dumps(checkpoint.stamped(meta)))
    code, out = resume(broken, 4, 1, 16)
    assert code != 0 and "Traceback" not in out
    assert f"table 'embedding': cannot read {broken}/ps/embedding.shard1-of-2.bin" in out, out[-3000:]


def _run(data_home, script, *args, launcher=()):
    env = dict(os.environ, HETU_DATA_HOME=data_home, **THREADS)
    cmd = [*launcher, sys.executable, str(REPO / "examples/ctr" / script), *COMMON, *args]
    return jobs.run(cmd, capture_output=True, text=True, env=env, timeout=200)


@pytest.mark.timeout(300)
def test_resume_refuses_a_checkpoint_of_another_run(tmp_path, data_home):
    ckpt = tmp_path / "ckpt"
    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--checkpoint", str(ckpt), "--val")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    validated = [line.split(" | ")[1] for line in proc.stdout.splitlines() if line.startswith("epoch 0:")]
    assert len(validated) == 1 and validated[0].startswith("val loss"), proc.stdout

    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "32", "--resume", str(ckpt))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"--resume {ckpt}: the checkpoint was trained with a global batch of 1 worker(s) x --batch-size 64 = 64, " \
           f"this run has 1 worker(s) x --batch-size 32 = 32: workers x --batch-size must stay the same" in proc.stderr
    cases = [
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
        if "--resume" in args:   # the reason alone, without argparse's usage text before it
            assert len(proc.stderr.strip().splitlines()) == 1 and "usage:" not in proc.stderr, proc.stderr

    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--resume", str(ckpt))
    assert proc.returncode == 1 and "the checkpoint is at step 20, and --nepoch 1 of 20 iterations per epoch is " \
                                   "20 steps: nothing is left to train (with --val: validate it only)" in proc.stderr, \
        proc.stderr
    # With --val, a finished checkpoint is validated: the metrics the run printed after its epoch.
    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--resume", str(ckpt), "--val")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"checkpoint {ckpt} at step 20: {validated[0]}" in proc.stdout, (validated, proc.stdout)

    # A checkpoint of one worker resumed by two with the same --batch-size: the global batch would differ.
    def cluster(workers):
        return sys.executable, str(REPO / "python/runner.py"), "-w", str(workers), "-s", "1", "--timeout", "150"
    hybrid = tmp_path / "hybrid"
    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--comm", "Hybrid", "--checkpoint", str(hybrid),
                launcher=cluster(1))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = _run(data_home, "run_hetu.py", *ADAM, "--batch-size", "64", "--comm", "Hybrid", "--nepoch", "2",
                "--resume", str(hybrid), launcher=cluster(2))
    assert proc.returncode != 0
    assert "the checkpoint was trained with a global batch of 1 worker(s) x --batch-size 64 = 64, this run has " \
           "2 worker(s) x --batch-size 64 = 128" in proc.stdout + proc.stderr, proc.stdout[-3000:] + proc.stderr[-3000:]

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


def test_resume_of_an_interrupted_first_save_names_its_temporary_folder(tmp_path, data_home):
    ckpt = tmp_path / "ckpt"
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *SGD, "--batch-size", "64",
                     "--iters-per-epoch", "2", "--checkpoint", str(ckpt)], capture_output=True, text=True,
                    env=dict(os.environ, HETU_DATA_HOME=data_home, HETU_CHECKPOINT_STOP_AT="written", **THREADS),
                    timeout=200)
    assert proc.returncode == -9, proc.stdout + proc.stderr   # killed after writing, before the swap
    [unfinished] = [p for p in os.listdir(tmp_path) if p.startswith(".tmp-ckpt.")]
    proc = _run(data_home, "run_hetu.py", *SGD, "--batch-size", "64", "--resume", str(ckpt))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert f"--resume {ckpt}: {ckpt} is not a hetu checkpoint: its first save was interrupted before it was complete, " \
           f"leaving only {tmp_path / unfinished}" in proc.stderr, proc.stderr


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="mounts a small tmpfs: needs root")
def test_a_save_that_runs_out_of_space_ends_in_one_line_and_leaves_nothing(tmp_path, data_home):
    small = tmp_path / "small"
    small.mkdir()
    # A 512 KiB file system in a mount namespace of the run's own: the checkpoint (a few MB) cannot fit.
    run = " ".join(map(shlex.quote, [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, *SGD,
                                     "--batch-size", "64", "--iters-per-epoch", "3", "--checkpoint", str(small / "ckpt")]))
    proc = jobs.run(["unshare", "-m", "sh", "-c", f"mount -t tmpfs -o size=512k tmpfs {shlex.quote(str(small))} "
                     f"&& {{ {run}; rc=$?; ls -A {shlex.quote(str(small))}; exit $rc; }}"],
                    capture_output=True, text=True, env=dict(os.environ, HETU_DATA_HOME=data_home, **THREADS), timeout=200)
    if "mount" in proc.stderr and "epoch 0" not in proc.stdout:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert proc.stderr.strip() == f"--checkpoint {small / 'ckpt'}: the save at step 3 failed: No space left on device", \
        proc.stderr
    # `ls -A`: nothing was left behind but the folder's lock file, which stays by design (checkpoint.hold)
    lines = proc.stdout.splitlines()
    assert lines[-2].startswith("epoch 0:") and lines[-1] == ".ckpt.lock", proc.stdout
