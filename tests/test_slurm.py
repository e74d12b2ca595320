"""python/runner.py inside a Slurm allocation: the scheduler, servers and workers start as job
steps (srun) of a real local Slurm (munged, slurmctld, slurmd: hetu_tools.slurm_local), submitted
with sbatch through the documented examples/slurm/compare.sbatch."""
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import REPO
from dist_harness import COMMON, THREADS, assert_same_parameters, run_single
from hetu.launch.slurm import SrunReport
from hetu_tools.slurm_local import LocalSlurm, SlurmUnavailable, missing

pytestmark = pytest.mark.timeout(600)

SCRIPT = REPO / "examples/slurm/compare.sbatch"
HERALD = ["--cache-limit-ratio", "0.1", "--optimizer", "sgd", "--learning-rate", "0.02", "--iters-per-epoch", "10",
          "--model", "wdl_criteo"]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    why = missing()
    if why:
        pytest.skip(f"no local Slurm: {why}")
    try:
        with LocalSlurm(tmp_path_factory.mktemp("slurm")) as cluster:
            yield cluster
    except SlurmUnavailable as e:
        pytest.skip(str(e))


def submit(slurm, tmp_path, data_home, args, env=None, wait=True):
    """sbatch compare.sbatch on one node with 2 workers; (job id, the job's output file)."""
    out = tmp_path / "job.out"
    job_env = {**slurm.env, **THREADS, "HETU_DATA_HOME": data_home, "PYTHON": sys.executable,
               "PS_HEARTBEAT_TIMEOUT": "20", **(env or {})}
    cmd = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=2", f"--output={out}", f"--chdir={REPO}",
           *(["--wait"] if wait else []), str(SCRIPT), *args]
    res = subprocess.run(cmd, env=job_env, capture_output=True, text=True, timeout=400)
    job = res.stdout.strip().split(";")[0]
    return job, out, res


def test_herald_job_submitted_to_slurm_equals_the_single_process(slurm, tmp_path, data_home):
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", HERALD, global_batch=64)
    save = tmp_path / "saved"
    job, out, res = submit(slurm, tmp_path, data_home, [*COMMON, *HERALD, "--batch-size", "32"],
                           env={"MODES": "herald", "SAVE_DIR": str(save), "SERVERS_PER_NODE": "2"})
    log = out.read_text() if out.exists() else ""
    assert res.returncode == 0, res.stderr + log[-4000:]
    # Every role ran as a step of the job, the workers as one step of two tasks.
    for role in ("scheduler", "server 0", "server 1", r"workers 0-1 \(srun\)"):
        assert re.search(rf"\[heturun\]\s+{role}\s+\S+\s+exit 0", log), (role, log[-3000:])
    assert "embedding transmissions" in log
    got = dict(np.load(save / "herald.npz"))
    assert_same_parameters(reference, got, exact_rows=True)


def _step_ids(slurm, job, name):
    out = subprocess.run(["squeue", "--steps", "--noheader", f"--jobs={job}", "--format=%i %j"], env=slurm.env,
                         capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in out.splitlines() if line.split()[1:2] and line.split()[1].startswith(name)]


def test_a_killed_step_ends_the_whole_job_and_is_named(slurm, tmp_path, data_home):
    args = [*COMMON, "--model", "wdl_criteo", "--iters-per-epoch", "100000", "--batch-size", "32"]
    job, out, res = submit(slurm, tmp_path, data_home, args, env={"MODES": "ps", "SERVERS_PER_NODE": "2"}, wait=False)
    assert res.returncode == 0, res.stderr
    deadline, step = time.monotonic() + 120, []
    while time.monotonic() < deadline and not step:
        log = out.read_text() if out.exists() else ""
        if "[worker 0]" in log:   # training has started: kill server 1's step
            step = _step_ids(slurm, job, "hetu-server-1.")
        time.sleep(0.5)
    assert step, (out.read_text() if out.exists() else "no output")[-3000:]
    subprocess.run(["scancel", "--signal=KILL", step[0]], env=slurm.env, check=True, timeout=30)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline and subprocess.run(
            ["squeue", "--noheader", f"--jobs={job}"], env=slurm.env, capture_output=True, text=True).stdout.strip():
        time.sleep(0.5)
    log = out.read_text()
    error = next((line for line in log.splitlines() if "[heturun] error:" in line), "")
    assert "server 1 on" in error and "Slurm step hetu-server-1." in error, log[-3000:]
    state = subprocess.run(["scontrol", "show", "job", job], env=slurm.env, capture_output=True, text=True).stdout
    assert "JobState=FAILED" in state or "ExitCode=1:0" in state, state


@pytest.mark.parametrize("line,rank,status", [
    ("srun: error: vm: task 1: Exited with exit code 3", 1, "exit 3"),
    ("srun: error: node-7: task 0: Killed", 0, "killed (Killed)"),
    ("srun: error: vm: tasks 2-3: Terminated", 2, "killed (Terminated)")])
def test_srun_report_names_the_first_failed_task(line, rank, status):
    report = SrunReport()
    report.read("srun: launch/slurm: _step_signal: Terminating StepId=3.6")
    report.read(line)
    report.read("srun: error: vm: task 5: Exited with exit code 9")
    assert (report.failed_rank, report.failed_status) == (rank, status)


def test_launcher_slurm_outside_an_allocation_is_refused(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    res = subprocess.run([sys.executable, str(REPO / "python/runner.py"), "--launcher", "slurm", "-w", "1",
                          "true"], env=env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert "SLURM_JOB_ID is not set" in res.stderr, res.stderr
