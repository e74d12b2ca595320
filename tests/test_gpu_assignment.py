"""GPU workers without a GPU: the cluster file's `gpus:` and runner.py's --gpus reach the workers
as HETU_GPUS, hetu.dist.devices turns (local rank, GPUs on the host) into the worker's GPU, and
run_hetu.py --gpu on a machine without CuPy stops at once with one line."""
import importlib.util
import os
import shutil
import sys

import pytest

import jobs
from ps_helpers import needs_mpirun
from conftest import REPO
from hetu.dist import devices
from hetu.launch.cluster import ConfigError, Node, Cluster, parse_cluster
from hetu.launch.job import Job
from test_runner import py, run_runner

HAS_CUPY = importlib.util.find_spec("cupy") is not None


@pytest.fixture
def clean_env(monkeypatch):
    """No GPU count or local rank inherited from the environment the tests run in."""
    for name in (devices.GPUS_VAR, *devices.LOCAL_RANK_VARS):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


# --------------------------------------------------------------------------- the cluster file

def test_cluster_file_gpus_parse():
    cluster = parse_cluster({"nodes": [{"host": "a", "workers": 2, "chief": True, "gpus": 2},
                                       {"host": "b", "workers": 1}]}, source="c.yml")
    assert [n.gpus for n in cluster.nodes] == [2, 0]


@pytest.mark.parametrize("value,message", [
    ("-1", "c.yml: nodes[0] (host a): 'gpus' must not be negative, got -1"),
    ("two", "c.yml: nodes[0] (host a): 'gpus' must be an integer, got 'two'"),
    ("1.5", "c.yml: nodes[0] (host a): 'gpus' must be an integer, got 1.5"),
    ("true", "c.yml: nodes[0] (host a): 'gpus' must be an integer, got True"),
])
def test_bad_gpus_value_is_rejected(value, message):
    import yaml
    data = yaml.safe_load(f"nodes: [{{host: a, workers: 1, chief: true, gpus: {value}}}]\n")
    with pytest.raises(ConfigError) as err:
        parse_cluster(data, source="c.yml")
    assert str(err.value) == message


@pytest.mark.parametrize("value,message", [
    ("-1", "nodes[0] (host localhost): 'gpus' must not be negative, got -1"),
    ("two", "nodes[0] (host localhost): 'gpus' must be an integer, got 'two'"),
])
def test_runner_reports_bad_gpus_in_one_line(tmp_path, value, message):
    cfg = tmp_path / "bad.yml"
    cfg.write_text(f"nodes:\n  - host: localhost\n    workers: 1\n    chief: true\n    gpus: {value}\n")
    res = run_runner(["-c", str(cfg), "true"], tmp_path, timeout=30)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"heturun: error: {cfg}: {message}"]


@pytest.mark.parametrize("args,message", [
    (["-w", "1", "--gpus", "-1", "true"], "heturun: error: --gpus must not be negative, got -1"),
    (["-c", str(REPO / "examples/config/local.yml"), "--gpus", "2", "true"],
     "heturun: error: -w/-s/--gpus describe a local machine; do not combine them with -c "
     "(give a node 'gpus: N' in the cluster file)"),
])
def test_runner_rejects_bad_gpus_flag(tmp_path, args, message):
    res = run_runner(args, tmp_path, timeout=30)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [message]


def test_hetu_gpus_is_exported_per_host():
    """One mpirun app context per host: each carries its own host's HETU_GPUS, none without gpus."""
    cluster = Cluster(nodes=[Node("localhost", workers=2, chief=True, gpus=4),
                             Node("192.0.2.10", workers=3, gpus=1),
                             Node("192.0.2.11", workers=1)])
    job = Job(cluster, ["python", "train.py"], None, 60.0, 5.0, False)
    try:
        job.root_uri = "10.0.0.1"
        argv = job.mpirun_argv({"DMLC_NUM_WORKER": "6"})
    finally:
        shutil.rmtree(job.workdir, ignore_errors=True)
    contexts, current = [], []
    for a in argv[argv.index("-np"):] + [":"]:
        if a == ":":
            contexts.append(current)
            current = []
        else:
            current.append(a)
    gpus = [[a for a in ctx if a.startswith("HETU_GPUS=")] for ctx in contexts]
    hosts = [ctx[ctx.index("--host") + 1] for ctx in contexts]
    assert hosts == ["localhost:2", "192.0.2.10:3", "192.0.2.11:1"]
    assert gpus == [["HETU_GPUS=4"], ["HETU_GPUS=1"], []]


def test_settings_every_process_shares_reach_every_host(monkeypatch):
    """Row placement and the allocator's trades are the launcher's, on every host."""
    monkeypatch.setenv("PS_ROW_PLACEMENT", "contiguous")
    monkeypatch.setenv("HETU_PLANNER_TRADE_SHARED", "0")
    cluster = Cluster(nodes=[Node("localhost", workers=1, chief=True), Node("192.0.2.10", workers=1)])
    job = Job(cluster, ["python", "train.py"], None, 60.0, 5.0, False)
    try:
        job.root_uri = "10.0.0.1"
        env = job.base_env(9000)
    finally:
        shutil.rmtree(job.workdir, ignore_errors=True)
    assert env["PS_ROW_PLACEMENT"] == "contiguous" and env["HETU_PLANNER_TRADE_SHARED"] == "0"


# --------------------------------------------------------------------------- real jobs

REPORT_DEVICE = py("""
    import os
    from hetu.dist import devices
    gpus = os.environ.get("HETU_GPUS")
    ctx = devices.worker_context(True) if gpus else devices.worker_context(False)
    print("rank", os.environ["DMLC_WORKER_ID"], "HETU_GPUS", gpus,
          "local", devices.local_rank(), "device", ctx, flush=True)
""")


def device_lines(stdout):
    """{rank: (HETU_GPUS, local rank, device)} from the workers' REPORT_DEVICE lines."""
    found = {}
    for line in stdout.splitlines():
        if "] rank " in line:
            words = line.split("] ", 1)[1].split()
            found[int(words[1])] = (words[3], int(words[5]), words[7])
    return found


@needs_mpirun
def test_cluster_file_gpus_reach_the_workers(tmp_path, clean_env):
    cfg = tmp_path / "c.yml"
    cfg.write_text("nodes:\n  - host: localhost\n    workers: 3\n    chief: true\n    gpus: 2\n")
    res = run_runner(["-c", str(cfg), "--timeout", "60", *REPORT_DEVICE], tmp_path, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    assert device_lines(res.stdout) == {0: ("2", 0, "gpu(0)"), 1: ("2", 1, "gpu(1)"),
                                        2: ("2", 2, "gpu(0)")}, res.stdout


@needs_mpirun
def test_gpus_flag_reaches_the_workers(tmp_path, clean_env):
    res = run_runner(["-w", "2", "-s", "0", "--gpus", "3", "--timeout", "60", *REPORT_DEVICE],
                     tmp_path, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    assert device_lines(res.stdout) == {0: ("3", 0, "gpu(0)"), 1: ("3", 1, "gpu(1)")}, res.stdout


@needs_mpirun
def test_no_gpus_declared_exports_nothing(tmp_path, clean_env):
    for gpus in ([], ["--gpus", "0"]):
        res = run_runner(["-w", "2", "-s", "0", *gpus, "--timeout", "60", *REPORT_DEVICE],
                         tmp_path, timeout=90)
        assert res.returncode == 0, res.stdout + res.stderr
        assert device_lines(res.stdout) == {0: ("None", 0, "cpu(0)"), 1: ("None", 1, "cpu(0)")}, res.stdout


# --------------------------------------------------------------------------- hetu.dist.devices

def test_pick_gpu_round_robin():
    assert [devices.pick_gpu(r, 2) for r in range(6)] == [0, 1, 0, 1, 0, 1]
    assert [devices.pick_gpu(r, 4) for r in range(6)] == [0, 1, 2, 3, 0, 1]
    assert [devices.pick_gpu(r, 1) for r in range(3)] == [0, 0, 0]


@pytest.mark.parametrize("gpus", [0, -2])
def test_pick_gpu_needs_a_gpu(gpus):
    with pytest.raises(ValueError, match="at least 1 GPU"):
        devices.pick_gpu(0, gpus)


def test_local_rank_from_environment(clean_env):
    assert devices.local_rank() == 0
    clean_env.setenv("SLURM_LOCALID", "5")
    assert devices.local_rank() == 5
    clean_env.setenv("PMI_LOCAL_RANK", "4")
    assert devices.local_rank() == 4
    clean_env.setenv("MPI_LOCALRANKID", "3")
    assert devices.local_rank() == 3
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "2")   # OpenMPI's wins
    assert devices.local_rank() == 2


@pytest.mark.parametrize("value", ["x", "-1", "1.0"])
def test_local_rank_malformed(clean_env, value):
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_RANK", value)
    with pytest.raises(ValueError, match="OMPI_COMM_WORLD_LOCAL_RANK"):
        devices.local_rank()


def test_gpus_on_host_from_hetu_gpus(clean_env):
    clean_env.setenv("HETU_GPUS", "4")
    assert devices.gpus_on_host() == 4
    clean_env.setenv("HETU_GPUS", " 8 ")
    assert devices.gpus_on_host() == 8


@pytest.mark.parametrize("value", ["two", "0", "-1", "", "2.5"])
def test_gpus_on_host_malformed(clean_env, value):
    clean_env.setenv("HETU_GPUS", value)
    with pytest.raises(ValueError, match=f"HETU_GPUS must be a positive integer.*got {value!r}"):
        devices.gpus_on_host()


@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed: the no-CuPy error cannot happen here")
def test_gpus_on_host_without_cupy(clean_env):
    with pytest.raises(RuntimeError, match="--gpu needs CuPy and a GPU") as err:
        devices.gpus_on_host()
    assert "\n" not in str(err.value)
    with pytest.raises(RuntimeError, match="--gpu needs CuPy and a GPU"):
        devices.worker_context(True)


def test_worker_context(clean_env):
    assert str(devices.worker_context(False)) == "cpu(0)"
    clean_env.setenv("HETU_GPUS", "2")
    clean_env.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    ctx = devices.worker_context(True)
    assert ctx.is_gpu and str(ctx) == "gpu(1)"
    assert str(devices.worker_context(False)) == "cpu(0)"   # without --gpu, HETU_GPUS changes nothing


# --------------------------------------------------------------------------- run_hetu.py --gpu

@pytest.mark.skipif(HAS_CUPY, reason="CuPy is installed: run_hetu.py --gpu would train")
@pytest.mark.parametrize("gpus", [None, "2"], ids=["cupy-counts", "HETU_GPUS"])
def test_run_hetu_gpu_without_cupy_stops_in_one_line(tmp_path, gpus):
    env = {k: v for k, v in os.environ.items() if k not in (devices.GPUS_VAR, *devices.LOCAL_RANK_VARS)}
    env["HETU_DATA_HOME"] = str(tmp_path / "data")
    if gpus:
        env["HETU_GPUS"] = gpus
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--gpu", "--no-progress",
                     "--rows", "1000", "--embedding-size", "4"],
                    capture_output=True, text=True, env=env, timeout=120, cwd=tmp_path)
    assert proc.returncode in (1, 2), proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert "CuPy" in lines[0] and "--gpu" in lines[0], lines[0]
    assert proc.stdout == "", proc.stdout                      # nothing trained or printed
    data = tmp_path / "data"
    assert not data.exists() or not any(data.iterdir()), "data was loaded before the check"


def test_cuda_graph_without_gpu_is_refused_before_anything_starts(tmp_path):
    env = dict(os.environ, HETU_DATA_HOME=str(tmp_path / "data"))
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--cuda-graph"],
                    capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2 and "--cuda-graph needs --gpu" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "data").exists()


def test_cuda_graph_on_a_cpu_executor_is_refused():
    import hetu as ht
    x = ht.Variable("x", value=[[1.0]])
    with pytest.raises(ValueError, match="cuda_graph=True needs a GPU context"):
        ht.Executor([x * 2.0], cuda_graph=True)
