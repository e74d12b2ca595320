"""A W-worker run equals the single-process run with batch W*b (docs/design.md section 4), parameter
by parameter, in every aggregation mode."""
import json

import pytest

from dist_harness import assert_same_parameters, run_cluster, run_single

pytestmark = pytest.mark.timeout(600)

# Adam's runs stop at 20 steps: between steps 20 and 30 WDL's run at W = 2 reaches a hidden unit
# of one sample within float rounding of ReLU's kink, which Sandybridge's OpenBLAS kernel rounds
# apart in the 64-row and the 32-row GEMMs (16.7x the bound at 30; docs/results/exactness.md, "Rounding").
OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--learning-rate", "0.02"],
              "adam": ["--optimizer", "adam", "--learning-rate", "0.001", "--iters-per-epoch", "20"],
              "rowwise_adagrad": ["--optimizer", "rowwise_adagrad", "--learning-rate", "0.001"]}


@pytest.mark.parametrize("model", ["wdl_criteo", "dcn_criteo"])
@pytest.mark.parametrize("workers", [2, 4])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_allreduce_equals_single_process(tmp_path, data_home, model, workers, opt):
    args = ["--model", model, *OPTIMIZERS[opt]]
    b = 64 // workers
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, _ = run_cluster(tmp_path, data_home, "run_hetu.py", ["--comm", "AllReduce", *args], workers, 0, b)
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))


@pytest.mark.parametrize("mode", ["PS", "Hybrid"])
@pytest.mark.parametrize("model", ["wdl_criteo", "dcn_criteo"])
@pytest.mark.parametrize("workers,servers", [(2, 1), (4, 2)])
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_parameter_server_modes_equal_single_process(tmp_path, data_home, mode, model, workers, servers, opt):
    args = ["--model", model, *OPTIMIZERS[opt]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, _ = run_cluster(tmp_path, data_home, "run_hetu.py", ["--comm", mode, "--bsp", "0", *args],
                         workers, servers, 64 // workers)
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))


@pytest.mark.parametrize("bsp", ["-1", "2"])
def test_asp_and_ssp_finish_and_learn(tmp_path, data_home, bsp):
    """ASP (-1) and SSP (k > 0) trade exactness for speed on purpose: they must finish without
    deadlock and still learn."""
    import re
    _, out = run_cluster(tmp_path, data_home, "run_hetu.py",
                         ["--comm", "Hybrid", "--bsp", bsp, "--model", "wdl_criteo", "--optimizer", "adam",
                          "--learning-rate", "0.001", "--iters-per-epoch", "200", "--val"], 2, 1, 64)
    aucs = [float(a) for a in re.findall(r"\[worker \d\] epoch \d+: .* val loss \S+ acc \S+ auc (\S+)", out)]
    assert len(aucs) == 2 and min(aucs) > 0.65, out[-2000:]


@pytest.mark.timeout(180)
def test_worker_killed_mid_run_ends_the_job_naming_it(tmp_path, data_home):
    import os
    import jobs
    import sys
    import time
    from conftest import REPO
    # Worker 1 SIGKILLs itself three seconds into training; the job must end, not hang.
    script = ("import os, signal, sys, threading, runpy; "
              f"sys.path.insert(0, {str(REPO / 'examples/ctr')!r}); "
              "os.environ['DMLC_WORKER_ID'] == '1' and threading.Timer(3, lambda: os.kill(os.getpid(), signal.SIGKILL)).start(); "
              "sys.argv = ['run_hetu.py'] + sys.argv[1:]; "
              f"runpy.run_path({str(REPO / 'examples/ctr/run_hetu.py')!r}, run_name='__main__')")
    env = dict(os.environ, HETU_DATA_HOME=data_home, PS_HEARTBEAT_TIMEOUT="10")
    start = time.time()
    proc = jobs.run([sys.executable, str(REPO / "python/runner.py"), "-w", "2", "-s", "1", "--timeout", "150",
                     sys.executable, "-c", script, "--comm", "Hybrid", "--model", "wdl_criteo", "--rows", "20000",
                     "--embedding-size", "8", "--all", "--nepoch", "50", "--no-progress"],
                    capture_output=True, text=True, env=env, timeout=170)
    assert proc.returncode not in (0, 124), proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "worker 1 on localhost failed (killed by signal 9" in proc.stderr, proc.stderr[-2000:]
    assert time.time() - start < 120


@pytest.mark.parametrize("script,mode", [("run_hetu.py", ["--comm", "PS"]),
                                         ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0",
                                                          "--cache-limit-ratio", "0.05"])])
def test_a_cluster_reports_the_models_metrics_not_a_workers(tmp_path, data_home, script, mode):
    """Loss, AUC and logloss, of training and of validation, are computed over every worker's
    predictions (Herald's workers included, whatever samples they were given): what the single
    process reports, to rounding."""
    args = ["--model", "wdl_criteo", *OPTIMIZERS["sgd"], "--val", "--nepoch", "2", "--iters-per-epoch", "15"]
    _, single = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    _, out = run_cluster(tmp_path, data_home, script, [*mode, "--bsp", "0", *args], 2, 1, 32)
    summaries = [json.loads(line.split("summary ", 1)[1]) for line in out.splitlines() if "] summary {" in line]
    assert len(summaries) == 2, out[-3000:]
    for got in summaries:   # every worker reports the model's figures
        for split in ("train", "val"):
            want = single["final"] if split == "train" else single["final"]["val"]
            have = got["final"] if split == "train" else got["final"]["val"]
            assert have["samples"] == want["samples"], (split, have, want)
            for metric in ("auc", "logloss", "loss", "acc"):
                assert abs(have[metric] - want[metric]) <= 1e-6, (split, metric, have[metric], want[metric])
