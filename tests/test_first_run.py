"""A first run of run_hetu.py / run_laia.py: an epoch is a full pass unless --iters-per-epoch caps
it, and the start line says how many samples it has; every rate says whose it is; each process
takes its share of the host's cores (hetu.threads); a refusal names the flag at fault."""
import importlib.util
import json
import os
import re
import sys

import pytest

import jobs
from conftest import REPO
from dist_harness import COMMON, run_cluster, run_single

sys.path.insert(0, str(REPO / "examples/ctr"))
import train  # noqa: E402

from hetu import threads  # noqa: E402
from hetu.launch.mpirun import WORKER_SHIM  # noqa: E402

TINY = ["--rows", "2000", "--embedding-size", "4", "--batch-size", "64", "--no-progress"]   # 1800 train samples


@pytest.fixture
def run(data_home, monkeypatch, capsys):
    """train.py in this process: (its summary, its output). The thread variables it sets are
    restored afterwards, so that later tests' subprocesses do not inherit them."""
    monkeypatch.setenv("HETU_DATA_HOME", data_home)
    for name in threads.THREAD_VARS:
        monkeypatch.setenv(name, "1")

    def train_run(*flags, herald=False):
        summary = train.main([*TINY, *flags], herald=herald)
        return summary, capsys.readouterr().out
    return train_run


# --------------------------------------------------------------------------- epochs

def test_an_epoch_is_a_full_pass_by_default(run):
    summary, out = run("--nepoch", "2")
    # 1800 samples in batches of 64: 28 iterations, 1792 samples (the last partial batch left out)
    assert "an epoch: 28 iterations x 1 worker x batch 64 = 1792 samples; 56 iterations" in out, out
    assert summary["iterations"] == 56 and summary["final"]["samples"] == 1792
    assert [line.split(":")[0] for line in out.splitlines() if line.startswith("epoch ")] == ["epoch 0", "epoch 1"]


def test_iters_per_epoch_caps_an_epoch_only_when_given(run):
    summary, out = run("--iters-per-epoch", "5")
    assert "an epoch: 5 iterations (--iters-per-epoch) x 1 worker x batch 64 = 320 samples; 5 iterations" in out
    assert summary["iterations"] == 5 and summary["final"]["samples"] == 320
    # --all, the old way to ask for a full pass, is still accepted and wins over the cap
    summary, out = run("--all", "--iters-per-epoch", "5")
    assert "an epoch: 28 iterations x 1 worker" in out and summary["final"]["samples"] == 1792


def test_help_says_what_an_epoch_and_the_threads_are(capsys):
    with pytest.raises(SystemExit):
        train.build_parser(herald=False).parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "each a full pass over the training split" in text
    assert "--all train on the whole training split each epoch: the default" in text
    assert "(default: no cap, a full pass)" in text
    assert "--threads N" in text and "usable cores" in text and "processes on the host" in text


@pytest.mark.parametrize("herald", [False, True])
def test_help_names_adams_semantics_on_tables(capsys, herald):
    with pytest.raises(SystemExit):
        train.build_parser(herald=herald).parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "{" + ",".join(sorted(train.ht.optim.KINDS)) + "}" in text   # the registry's kinds, as before
    assert "lazy row-wise steps" in text and "LazyAdam" in text
    assert "rows not read in a step are not stepped" in text and "its own step count" in text
    assert "dense parameters take ordinary Adam steps" in text


# --------------------------------------------------------------------------- rates

def test_rates_say_whose_they_are():
    assert train.rates_text(10, 2.0, 64, 2) == "5.0 it/s, job 640 samples/s = 2 workers x 320 samples/s"
    assert train.rates_text(10, 2.0, 64, 1) == "5.0 it/s, job 320 samples/s = 1 worker x 320 samples/s"
    assert train.job_rates(10, 2.0, 64, 3) == {"samples_per_second": 960.0, "worker_samples_per_second": 320.0,
                                               "workers": 3}


def test_bench_scale_reads_the_epoch_line():
    spec = importlib.util.spec_from_file_location("scale", REPO / "bench/scale.py")
    scale = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(scale)
    line = (f"[worker 1] epoch 0: train loss 0.5 acc 0.7 auc 0.7 logloss 0.5 "
            f"({train.rates_text(10, 2.0, 64, 2)}) | val loss 0.5 acc 0.7 auc 0.7 logloss 0.5")
    m = scale.EPOCH.search(line)
    assert m and (m.group(1), m.group(2)) == ("1", "320")   # the worker's own, summed over workers there


def test_single_process_lines_and_summary(run):
    summary, out = run("--iters-per-epoch", "5")
    [line] = [line for line in out.splitlines() if line.startswith("epoch 0: ")]
    assert re.search(r"\([\d.]+ it/s, job \d+ samples/s = 1 worker x \d+ samples/s\)$", line), line
    assert summary["samples_per_second"] == summary["worker_samples_per_second"] and summary["workers"] == 1
    for key in ("model", "mode", "iterations", "first_step", "seconds", "counters", "final"):
        assert key in summary


def test_cluster_lines_give_the_job_rate_and_the_threads(tmp_path, data_home):
    """2 workers and a server on this host: the epoch line and summary count both workers'
    samples; each process takes its share of the cores, and an oversubscribed host is named."""
    cmd = [sys.executable, str(REPO / "python/runner.py"), "-w", "2", "-s", "1", "--timeout", "280",
           sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *COMMON, "--comm", "PS", "--bsp", "0",
           "--batch-size", "32"]
    env = {k: v for k, v in os.environ.items() if k not in threads.THREAD_VARS}
    proc = jobs.run(cmd, capture_output=True, text=True, env=dict(env, HETU_DATA_HOME=data_home), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    share = threads.default_threads(threads.usable_cores(), 3)
    start = [line for line in proc.stdout.splitlines() if "] wdl_criteo: " in line]
    assert len(start) == 2 and all("an epoch: 30 iterations (--iters-per-epoch) x 2 workers x batch 32 = 1920 "
                                   f"samples; 30 iterations, {share} thread" in line for line in start), start
    epochs = [line for line in proc.stdout.splitlines() if "] epoch 0: " in line]
    assert len(epochs) == 2 and all(re.search(r"job (\d+) samples/s = 2 workers x (\d+) samples/s\)$", line)
                                    for line in epochs), epochs
    summaries = train_summaries(proc.stdout)
    assert all(abs(s["samples_per_second"] - 2 * s["worker_samples_per_second"]) < 1e-6 * s["samples_per_second"]
               and s["workers"] == 2 for s in summaries), summaries
    if threads.usable_cores() < 3:
        assert "3 processes of the job share this host's" in proc.stderr, proc.stderr[-3000:]


def train_summaries(stdout):
    return [json.loads(line.split("summary ", 1)[1]) for line in stdout.splitlines() if "summary {" in line]


# --------------------------------------------------------------------------- threads

def fake_cgroup(tmp_path, own, files):
    """A cgroup tree under tmp_path: /proc/self/cgroup's lines `own`, and `files` under it."""
    for path, text in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text)
    (tmp_path / "self").write_text(own)
    return str(tmp_path), str(tmp_path / "self")


@pytest.mark.parametrize("own,files,limit", [
    ("0::/job\n", {"job/cpu.max": "150000 100000\n"}, 1.5),                    # v2, the process's own group
    ("0::/job\n", {"job/cpu.max": "max 100000\n", "cpu.max": "100000 100000"}, None),   # its own says none
    ("0::/\n", {"cpu.max": "200000 100000\n"}, 2.0),                           # v2 at the root (a container)
    ("3:cpu,cpuacct:/job\n", {"cpu,cpuacct/job/cpu.cfs_quota_us": "300000", "cpu,cpuacct/job/cpu.cfs_period_us":
                                                                          "100000"}, 3.0),   # v1
    ("3:cpu,cpuacct:/\n", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, None),
    ("", {}, None)])                                                         # no cgroup files: no limit
def test_cgroup_cpu_limit(tmp_path, own, files, limit):
    root, self_cgroup = fake_cgroup(tmp_path, own, files)
    assert threads.cgroup_cpu_limit(root, self_cgroup) == limit


def test_usable_cores_take_the_affinity_and_the_quota():
    assert threads.usable_cores(affinity={0, 1, 2, 3}, cgroup_limit=0) == 4        # 0: no quota
    assert threads.usable_cores(affinity={0, 1, 2, 3}, cgroup_limit=1.5) == 2      # the quota, rounded up
    assert threads.usable_cores(affinity={5}, cgroup_limit=8) == 1                 # the affinity
    assert threads.usable_cores() <= len(os.sched_getaffinity(0))


def test_default_threads_share_the_host():
    assert threads.default_threads(16, 3) == 5 and threads.default_threads(2, 2) == 1
    assert threads.default_threads(2, 3) == 1 and threads.default_threads(8, 0) == 8
    assert threads.processes_on_host({}) == 1
    assert threads.processes_on_host({"OMPI_COMM_WORLD_LOCAL_SIZE": "4"}) == 4
    assert threads.processes_on_host({"OMPI_COMM_WORLD_LOCAL_SIZE": "4", "HETU_PROCS_ON_HOST": "5"}) == 5
    assert threads.processes_on_host({"HETU_PROCS_ON_HOST": "x"}) == 1


def test_oversubscribed_host_warns():
    assert threads.oversubscribed(4, 4) is None
    assert threads.oversubscribed(2, 3) == ("warning: 3 processes of the job share this host's 2 usable cores: "
                                            "each runs 1 thread, and they will wait on each other")


def test_configure_keeps_the_environment_unless_told():
    env = {"HETU_PROCS_ON_HOST": "2"}
    assert threads.configure(environ=env, cores=8) == (4, None)
    assert all(env[name] == "4" for name in threads.THREAD_VARS)
    env = {"HETU_PROCS_ON_HOST": "3", "HETU_NUM_THREADS": "6", "OMP_NUM_THREADS": "2"}
    count, warning = threads.configure(environ=env, cores=2)
    assert count == 6 and env["OMP_NUM_THREADS"] == "2" and env["OPENBLAS_NUM_THREADS"] == "6"
    assert warning.startswith("warning: 3 processes")
    assert threads.configure(3, environ=env, cores=2)[0] == 3 and all(env[n] == "3" for n in threads.THREAD_VARS)


def test_worker_shim_gives_each_worker_its_share():
    env = {k: v for k, v in os.environ.items() if k not in threads.THREAD_VARS}
    env.update(HETU_PROCS_ON_HOST="3", HETU_PYTHON=sys.executable, OMPI_COMM_WORLD_RANK="1")
    out = jobs.run(["/bin/sh", "-c", WORKER_SHIM, "hetu-worker", "sh", "-c",
                          "echo $DMLC_WORKER_ID $OMP_NUM_THREADS $HETU_NUM_THREADS"],
                         env=env, capture_output=True, text=True, timeout=60).stdout.split()
    share = str(threads.default_threads(threads.usable_cores(), 3))
    assert out == ["1", share, share]
    env["OMP_NUM_THREADS"] = "7"   # the user's own setting is kept
    out = jobs.run(["/bin/sh", "-c", WORKER_SHIM, "hetu-worker", "sh", "-c", "echo $OMP_NUM_THREADS"],
                         env=env, capture_output=True, text=True, timeout=60).stdout.split()
    assert out == ["7"]


def test_threads_flag_sets_the_count(run):
    _, out = run("--iters-per-epoch", "2", "--threads", "3")
    assert ", 3 threads per process" in out and os.environ["OPENBLAS_NUM_THREADS"] == "3"


# --------------------------------------------------------------------------- refusals name their flag

@pytest.mark.parametrize("flags,herald,message,not_in", [
    (["--cache", "lru"], False, "--cache lru needs --comm PS or Hybrid", "Herald"),
    ([], True, "the Herald scheduler needs --comm PS or Hybrid", "--cache"),
    (["--comm", "AllReduce"], True, "--comm PS or Hybrid, not AllReduce", None),
    (["--comm", "PS", "--bsp", "-1"], True, "it needs --bsp 0 and --bound 0 (got --bsp -1 --bound 0)", None)])
def test_refusals_name_the_flag(run, flags, herald, message, not_in):
    with pytest.raises(SystemExit) as stop:
        run(*flags, herald=herald)
    assert message in str(stop.value) and (not_in is None or not_in not in str(stop.value)), stop.value


# --------------------------------------------------------------------------- validation

@pytest.mark.parametrize("script,mode", [
    ("run_hetu.py", ["--comm", "PS"]),
    ("run_hetu.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0"]),
    ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru"])])
def test_validation_scores_the_whole_split_in_every_mode(tmp_path, data_home, script, mode):
    """201 validation samples, 2 workers x 25: 4 full global batches, then 1 sample left, which
    worker 1 scores alone (worker 0's part is empty): every worker reports the single process's
    scores over all 201."""
    args = ["--rows", "2010", "--model", "wdl_criteo", "--val", "--iters-per-epoch", "10"]
    _, single = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=50)
    _, out = run_cluster(tmp_path, data_home, script, [*mode, "--bsp", "0", *args], 2, 1, 25)
    assert single["final"]["val"]["samples"] == 201
    summaries = train_summaries(out)
    assert len(summaries) == 2, out[-3000:]
    for got in summaries:
        have, want = got["final"]["val"], single["final"]["val"]
        assert have["samples"] == 201, have
        for metric in ("auc", "logloss", "loss", "acc"):
            assert abs(have[metric] - want[metric]) <= 1e-6, (metric, have[metric], want[metric])


def test_runner_threads_flag_sizes_every_process():
    from hetu.launch.cli import cluster_from_args, parse_args
    from hetu.launch.cluster import ConfigError
    cluster = cluster_from_args(parse_args(["-w", "2", "--threads", "3", "python", "x.py"]))
    assert all(cluster.env[name] == "3" for name in threads.THREAD_VARS)
    with pytest.raises(ConfigError, match="--threads must be at least 1, got 0"):
        cluster_from_args(parse_args(["-w", "2", "--threads", "0", "python", "x.py"]))
