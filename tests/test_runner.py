"""The launcher, end to end: real runner, real mpirun, real worker processes.

Scheduler/server behaviour is exercised with a small stand-in module (HETU_LAUNCHER) so the
supervision paths are covered before ps-lite exists; the last test uses the real hetu.launcher.
"""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import jobs
from ps_helpers import alive, needs_mpirun, needs_ucx

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "python" / "runner.py"

pytestmark = needs_mpirun

# Stand-in for hetu.launcher: records its environment and pid, then behaves per FAKE_MODE.
FAKE_LAUNCHER = textwrap.dedent("""
    import json, os, sys, time
    out = os.environ["OUT"]
    role = os.environ["DMLC_ROLE"]
    name = role if role == "scheduler" else f"server.{os.getpid()}"
    with open(os.path.join(out, f"ps.{name}.json"), "w") as f:
        json.dump({**os.environ, "pid": os.getpid()}, f)
    mode = os.environ.get("FAKE_MODE", "wait_workers")
    if mode == "server_fails" and role == "server":
        time.sleep(0.5)
        print("server gave up: disk on fire", file=sys.stderr)
        sys.exit(5)
    if mode == "hang":
        time.sleep(300)
    if mode == "exit_early":
        sys.exit(0)
    deadline = time.time() + 60
    n = int(os.environ["DMLC_NUM_WORKER"])
    while time.time() < deadline:
        if sum(p.startswith("done.") for p in os.listdir(out)) == n:
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(9)
""")


def run_runner(args, tmp_path, timeout=60, env=None, **kw):
    full_env = {**os.environ, "OUT": str(tmp_path), **(env or {})}
    return jobs.run([sys.executable, str(RUNNER), *args], capture_output=True, text=True,
                    timeout=timeout, env=full_env, cwd=tmp_path, **kw)


def py(code):
    return [sys.executable, "-c", textwrap.dedent(code)]


def fake_launcher_env(tmp_path, mode):
    (tmp_path / "fake_launcher.py").write_text(FAKE_LAUNCHER)
    return {"HETU_LAUNCHER": "fake_launcher", "FAKE_MODE": mode,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                        os.environ.get("PYTHONPATH")]))}


def wait_for_files(paths, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() and p.stat().st_size for p in paths):
            return
        time.sleep(0.05)
    missing = [str(p) for p in paths if not p.exists()]
    raise AssertionError(f"timed out after {timeout} s waiting for {what}: {missing}")


WRITE_ENV = """
    import json, os
    r = os.environ["DMLC_WORKER_ID"]
    with open(os.path.join(os.environ["OUT"], f"env.{r}.json"), "w") as f:
        json.dump(dict(os.environ), f)
"""


def test_workers_get_dmlc_env_and_rank(tmp_path):
    res = run_runner(["-w", "2", "-s", "0", *py(WRITE_ENV)], tmp_path)
    assert res.returncode == 0, res.stderr
    for rank in (0, 1):
        env = json.loads((tmp_path / f"env.{rank}.json").read_text())
        assert env["DMLC_ROLE"] == "worker"
        assert env["DMLC_WORKER_ID"] == env["OMPI_COMM_WORLD_RANK"] == str(rank)
        assert env["DMLC_NUM_WORKER"] == "2" and env["DMLC_NUM_SERVER"] == "0"
        assert env["DMLC_PS_ROOT_URI"] == "127.0.0.1"
        assert 0 < int(env["DMLC_PS_ROOT_PORT"]) < 65536
        assert env["DMLC_PS_VAN_TYPE"] == "zmq"
    assert "summary" in res.stderr


# What a machine may carry around mpirun: a resource manager's job (here Slurm's, whose
# allocation names another node) and a launcher set for one-host use. Open MPI would take its
# hosts from the allocation, find none of the job's own, and stop at once ("All nodes which are
# allocated for this job are already filled."); the runner names its hosts itself.
FOREIGN_MPI_ENV = {"SLURM_JOBID": "4242", "SLURM_JOB_ID": "4242", "SLURM_NODELIST": "elsewhere7",
                   "SLURM_JOB_NODELIST": "elsewhere7", "SLURM_TASKS_PER_NODE": "16",
                   "SLURM_JOB_CPUS_PER_NODE": "16", "SLURM_NNODES": "1", "OMPI_MCA_plm": "isolated"}


def test_workers_start_despite_a_resource_managers_allocation_around_mpirun(tmp_path):
    res = run_runner(["-w", "2", "-s", "0", *py(WRITE_ENV)], tmp_path, env=FOREIGN_MPI_ENV)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "already filled" not in res.stderr
    for rank in (0, 1):
        assert json.loads((tmp_path / f"env.{rank}.json").read_text())["DMLC_WORKER_ID"] == str(rank)


def test_mpirun_failing_before_any_worker_names_the_settings_it_read(tmp_path):
    # The cluster file's own `--mca ras` wins over the runner's, so the allocation is read again.
    cfg = tmp_path / "c.yml"
    cfg.write_text("mpirun_args: [--mca, ras, slurm]\nnodes:\n  - host: localhost\n    workers: 2\n"
                   "    chief: true\n")
    res = run_runner(["-c", str(cfg), *py(WRITE_ENV)], tmp_path, env=FOREIGN_MPI_ENV)
    assert res.returncode != 0
    line = next((x for x in res.stderr.splitlines() if "mpirun (all workers) failed" in x), "")
    assert "which Open MPI reads" in line, res.stderr
    assert all(name in line for name in ("OMPI_MCA_plm", "SLURM_JOBID", "SLURM_JOB_ID")), line
    assert "isolated" not in line and "4242" not in line   # names, not values


@needs_ucx
def test_cluster_file_env_and_van_reach_workers(tmp_path):
    cfg = tmp_path / "c.yml"
    cfg.write_text("van: ucx\nenv:\n  HETU_TEST_VAR: forty two\n"
                   "nodes:\n  - host: localhost\n    workers: 2\n    chief: true\n"
                   "    interface: lo\n")
    res = run_runner(["-c", str(cfg), *py(WRITE_ENV)], tmp_path)
    assert res.returncode == 0, res.stderr
    env = json.loads((tmp_path / "env.1.json").read_text())
    assert env["HETU_TEST_VAR"] == "forty two"
    assert env["DMLC_PS_VAN_TYPE"] == "ucx" and env["DMLC_INTERFACE"] == "lo"
    res = run_runner(["-c", str(cfg), "--van", "zmq", *py(WRITE_ENV)], tmp_path)   # the flag wins
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "env.1.json").read_text())["DMLC_PS_VAN_TYPE"] == "zmq"


def test_output_is_tagged_by_rank_even_for_partial_writes(tmp_path):
    res = run_runner(["-w", "2", "-s", "0", *py("""
        import os, sys, time
        r = os.environ["DMLC_WORKER_ID"]
        for part in ("hel", "lo ", r + "\\n"):   # one line in three writes
            sys.stdout.write(part); sys.stdout.flush(); time.sleep(0.05)
        print("oops", r, file=sys.stderr)
    """)], tmp_path)
    assert res.returncode == 0, res.stderr
    assert "[worker 0] hello 0" in res.stdout.splitlines()
    assert "[worker 1] hello 1" in res.stdout.splitlines()
    assert "[worker 1] oops 1" in res.stderr.splitlines()


def test_failing_worker_fails_job_and_stops_the_others(tmp_path):
    t0 = time.monotonic()
    res = run_runner(["-w", "3", "-s", "0", *py("""
        import os, sys, time
        r = int(os.environ["DMLC_WORKER_ID"])
        open(os.path.join(os.environ["OUT"], f"pid.{r}"), "w").write(str(os.getpid()))
        if r == 1:
            time.sleep(0.5)
            print("worker gave up: out of cheese", file=sys.stderr, flush=True)
            sys.exit(3)
        time.sleep(120)
    """)], tmp_path, timeout=60)
    assert res.returncode != 0
    assert time.monotonic() - t0 < 40, "the other workers were not stopped"
    assert "worker 1 on localhost failed (exit 3)" in res.stderr
    # The summary repeats why, since a long log's tail may no longer show it.
    assert "worker 1: worker gave up: out of cheese" in res.stderr.split("summary:")[1]
    for r in (0, 2):
        pid = int((tmp_path / f"pid.{r}").read_text())
        assert not alive(pid), f"worker {r} (pid {pid}) survived"


@pytest.mark.parametrize("failure,reason", [
    # an uncaught exception (sys.excepthook)
    ('raise ValueError("bad value at row 7")', "ValueError: bad value at row 7"),
    # a SystemExit, which sys.excepthook never sees, handed to exit_at_once_if_mpi_started as
    # hetu.run.training does
    ('sys.exit("this host\'s data has 10 rows")', "this host's data has 10 rows")])
def test_worker_stopping_alone_after_mpi_started_stops_the_job(tmp_path, failure, reason):
    """With MPI up, a worker that stops while the others go on must not wait in MPI_Finalize
    for a rank that waits for it in an AllReduce."""
    t0 = time.monotonic()
    res = run_runner(["-w", "2", "-s", "0", *py(f"""
        import sys
        import numpy as np
        from hetu.dist.comm import MPICommunicator, exit_at_once_if_mpi_started
        comm = MPICommunicator()
        try:
            if comm.rank == 1:
                {failure}
        except SystemExit as stop:
            exit_at_once_if_mpi_started(stop)
            raise
        comm.allreduce_sum(np.ones(4))
    """)], tmp_path, timeout=60)
    assert res.returncode != 0
    assert time.monotonic() - t0 < 40, "the job was not stopped"
    assert "worker 1 on localhost failed (exit 1)" in res.stderr, res.stderr
    assert f"worker 1: {reason}" in res.stderr.split("summary:")[1], res.stderr


def test_summary_repeats_the_failed_workers_error_not_another_workers_info_line(tmp_path):
    res = run_runner(["-w", "2", "-s", "0", *py("""
        import sys, time
        import numpy as np
        from hetu.dist.comm import MPICommunicator
        comm = MPICommunicator()
        if comm.rank == 0:
            print("Herald: worker 0 plans for this host's workers 0, 1 on 1 thread(s)", file=sys.stderr, flush=True)
        else:
            time.sleep(1)
            raise ValueError("bad value at row 7")
        comm.allreduce_sum(np.ones(4))
    """)], tmp_path, timeout=60)
    assert res.returncode != 0
    summary = res.stderr.split("summary:")[1]
    assert "worker 1: ValueError: bad value at row 7" in summary, res.stderr
    assert "Herald" not in summary, summary


def test_scheduler_and_servers_that_end_before_the_workers_fail_the_job(tmp_path):
    t0 = time.monotonic()
    res = run_runner(["-w", "2", "-s", "1", *py("import time; time.sleep(120)")], tmp_path,
                     env=fake_launcher_env(tmp_path, "exit_early"), timeout=90)
    assert res.returncode == 1, res.stderr
    assert time.monotonic() - t0 < 40, "the job was not stopped"
    error = [line for line in res.stderr.splitlines() if line.startswith("[heturun] error:")]
    assert len(error) == 1 and " on localhost ended (exit 0) before the workers, which still ran 10 s later" \
        in error[0], res.stderr
    summary = res.stderr.split("summary:")[1]
    assert "ended before the workers" in summary, summary


def test_timeout_stops_the_job(tmp_path):
    res = run_runner(["-w", "1", "-s", "0", "--timeout", "2", *py("import time; time.sleep(60)")],
                     tmp_path)
    assert res.returncode == 124
    assert "timed out after 2 s" in res.stderr


BAD_CONFIGS = [
    ("nodes: [{host: a, workers: 1, chief: true}]\nfoo: 1\n", "unknown top-level key(s) foo"),
    ("nodes: [{host: a, workers: 1, chief: true, cores: 2}]\n", "nodes[0] (host a): unknown key(s) cores"),
    ("nodes: [{host: a, workers: 1, chief: true, gpus: -1}]\n", "'gpus' must not be negative"),
    ("nodes: [{host: a, workers: 1, servers: 1, chief: true, server_threads: 0}]\n",
     "'server_threads' must be at least 1, got 0"),
    ("nodes: [{host: a, workers: 1, servers: 1, chief: true, server_threads: many}]\n",
     "'server_threads' must be an integer"),
    ("nodes: [{host: a, workers: 1}]\n", "no node has 'chief: true'"),
    ("nodes: [{host: a, workers: 1, chief: true}, {host: b, workers: 1, chief: true}]\n",
     "more than one chief: a, b"),
    ("nodes: [{host: a, workers: 0, servers: 1, chief: true}]\n", "zero workers in total"),
    ("nodes: [{host: a, workers: -1, chief: true}]\n", "'workers' must not be negative"),
    ("nodes: [{host: a, workers: 1, servers: -2, chief: true}]\n", "'servers' must not be negative"),
    ("nodes: [{workers: 1, chief: true}]\n", "nodes[0]: missing 'host'"),
    ("nodes: [{host: a, workers: two, chief: true}]\n", "'workers' must be an integer"),
    ("nodes: []\n", "'nodes' must be a non-empty list"),
    ("nodes: [{host: a, workers: 1, chief: true}]\nvan: carrier-pigeon\n", "'van' must be one of"),
    ("nodes: [{host: a, workers: 1, chief: true}, {host: a, workers: 1}]\n",
     "host listed more than once: a"),
    ("nodes: [\n", "not valid YAML"),
]


@pytest.mark.parametrize("text,message", BAD_CONFIGS, ids=[m for _, m in BAD_CONFIGS])
def test_bad_cluster_file_is_rejected(tmp_path, text, message):
    cfg = tmp_path / "bad.yml"
    cfg.write_text(text)
    res = run_runner(["-c", str(cfg), "true"], tmp_path, timeout=30)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr


@pytest.mark.parametrize("args,message", [
    (["true"], "give either -c CLUSTER.yml or -w N"),
    (["-w", "0", "true"], "-w must be at least 1"),
    (["-w", "1", "-s", "-1", "true"], "-s must not be negative"),
    (["-w", "1"], "no worker command given"),
    (["-c", "/nonexistent.yml", "true"], "cannot read cluster file"),
])
def test_bad_command_line_is_rejected(tmp_path, args, message):
    res = run_runner(args, tmp_path, timeout=30)
    assert res.returncode == 2 and message in res.stderr, res.stderr


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_tears_down_every_process(tmp_path, sig):
    env = fake_launcher_env(tmp_path, "hang")
    proc = jobs.Job(
        [sys.executable, str(RUNNER), "-w", "2", "-s", "1", *py("""
            import os, time
            r = os.environ["DMLC_WORKER_ID"]
            open(os.path.join(os.environ["OUT"], f"pid.{r}"), "w").write(str(os.getpid()))
            time.sleep(120)
        """)], env={**os.environ, "OUT": str(tmp_path), **env}, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_files([tmp_path / "pid.0", tmp_path / "pid.1", tmp_path / "ps.scheduler.json"],
                       30, "workers and scheduler to start")
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("ps.server.*.json")):
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        pids = [int((tmp_path / f"pid.{r}").read_text()) for r in (0, 1)]
        pids += [json.loads(p.read_text())["pid"] for p in tmp_path.glob("ps.*.json")]
        assert len(pids) == 4 and all(alive(p) for p in pids)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 128 + sig, err
    assert f"interrupted by {sig.name}" in err
    deadline = time.monotonic() + 5
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [p for p in pids if alive(p)] == []


DONE = py("""
    import os
    open(os.path.join(os.environ["OUT"], "done." + os.environ["DMLC_WORKER_ID"]), "w").close()
""")


def test_job_with_servers_succeeds_and_servers_get_their_env(tmp_path):
    res = run_runner(["-w", "2", "-s", "2", *DONE], tmp_path,
                     env=fake_launcher_env(tmp_path, "wait_workers"))
    assert res.returncode == 0, res.stderr
    sched = json.loads((tmp_path / "ps.scheduler.json").read_text())
    servers = [json.loads(p.read_text()) for p in tmp_path.glob("ps.server.*.json")]
    assert len(servers) == 2
    for env in [sched, *servers]:
        assert env["DMLC_NUM_WORKER"] == "2" and env["DMLC_NUM_SERVER"] == "2"
        assert env["DMLC_PS_ROOT_URI"] == "127.0.0.1"
        assert env["DMLC_PS_ROOT_PORT"] == sched["DMLC_PS_ROOT_PORT"]
    assert {s["DMLC_ROLE"] for s in servers} == {"server"}
    for label in ("scheduler", "server 0", "server 1", "workers 0-1 (mpirun)"):
        assert f"[heturun]   {label}" in res.stderr


def test_server_threads_of_the_cluster_file_reach_the_servers_alone(tmp_path):
    cfg = tmp_path / "cluster.yml"
    cfg.write_text("env: {HETU_NUM_THREADS: '5'}\n"
                   "nodes: [{host: localhost, workers: 1, servers: 2, chief: true, server_threads: 3}]\n")
    res = run_runner(["-c", str(cfg), *DONE], tmp_path, env=fake_launcher_env(tmp_path, "wait_workers"))
    assert res.returncode == 0, res.stderr
    servers = [json.loads(p.read_text()) for p in tmp_path.glob("ps.server.*.json")]
    assert [s["HETU_NUM_THREADS"] for s in servers] == ["3", "3"]
    # the scheduler keeps the job's env: value
    assert json.loads((tmp_path / "ps.scheduler.json").read_text())["HETU_NUM_THREADS"] == "5"


def test_failing_server_is_named(tmp_path):
    res = run_runner(["-w", "2", "-s", "1", *py("import time; time.sleep(60)")], tmp_path,
                     env=fake_launcher_env(tmp_path, "server_fails"))
    assert res.returncode == 1
    assert "server 0 on localhost failed (exit 5)" in res.stderr
    assert "server gave up: disk on fire" in res.stderr.split("summary:")[1]


def test_servers_that_do_not_exit_after_workers_are_killed_and_named(tmp_path):
    res = run_runner(["-w", "1", "-s", "1", "--shutdown-timeout", "1", *DONE], tmp_path,
                     env=fake_launcher_env(tmp_path, "hang"))
    assert res.returncode == 1
    assert "scheduler on localhost, server 0 on localhost did not exit within 1 s" in res.stderr
    pids = [json.loads(p.read_text())["pid"] for p in tmp_path.glob("ps.*.json")]
    assert len(pids) == 2 and not any(alive(p) for p in pids)


def test_real_parameter_server_start_finalize(tmp_path):
    res = run_runner(["-w", "2", "-s", "1", "--timeout", "60", *py("""
        import hetu.ps as ps
        ps.start()
        ps.finalize()
        print("finalized")
    """)], tmp_path, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[worker 0] finalized" in res.stdout and "[worker 1] finalized" in res.stdout


def test_allreduce_job_with_servers_ends_with_its_workers(tmp_path):
    """A graph with nothing on the servers, launched with servers (e.g. AllReduce under a
    cluster file that lists some): the workers join the job, so the scheduler and the servers
    end with them instead of waiting to the shutdown timeout for workers that never connect."""
    pytest.importorskip("hetu._ps", reason="hetu._ps (ps-lite bindings) not built yet")
    res = run_runner(["-w", "2", "-s", "1", "--timeout", "60", "--shutdown-timeout", "20", *py("""
        import numpy as np
        import hetu as ht
        x = ht.placeholder_op("x")
        w = ht.Variable("w", value=np.ones((3, 1), np.float32))
        loss = ht.reduce_mean_op(ht.matmul_op(x, w), [0, 1])
        ex = ht.Executor([loss, ht.optim.SGDOptimizer(0.1).minimize(loss)], comm_mode="AllReduce")
        ex.run(feed_dict={x: np.ones((4, 3), np.float32)})
        print("trained", ex.parameters()["w"].ravel().tolist())
    """)], tmp_path, timeout=90)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[worker 0] trained" in res.stdout and "[worker 1] trained" in res.stdout, res.stdout
    assert "did not exit" not in res.stdout + res.stderr
