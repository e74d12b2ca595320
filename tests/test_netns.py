"""Multi-host launching on one machine: network-namespace hosts with sshd, and tc shaping.

Skips with the reason when this machine cannot make namespaces (not root, no CAP_NET_ADMIN,
no netns/bridge support, missing iproute2/openssh-server).
"""
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from hetu_tools.netns import (NamespaceHosts, NetnsUnavailable, check_address_is_test_host, shape,
                              unshape)
import jobs
from ps_helpers import alive

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "python" / "runner.py"


@pytest.fixture(scope="module")
def hosts():
    if subprocess.run(["which", "mpirun"], capture_output=True).returncode != 0:
        pytest.skip("mpirun (openmpi-bin) not installed")
    try:
        with NamespaceHosts(2) as hs:
            yield hs
    except NetnsUnavailable as e:
        pytest.skip(f"network namespaces unavailable here: {e}")


def run_runner(args, out_dir, timeout=90, env=None):
    return jobs.run([sys.executable, str(RUNNER), "--timeout", "60", *args],
                    capture_output=True, text=True, timeout=timeout, cwd=out_dir,
                    env={**os.environ, **(env or {})})


def test_ssh_reaches_each_host_and_hosts_reach_each_other(hosts):
    for h in hosts:
        res = hosts.ssh(h, "hostname; ip -o -4 addr show eth0")
        assert res.returncode == 0, res.stderr
        name, addr = res.stdout.splitlines()
        assert name == h.hostname
        assert f"{h.address}/24" in addr
    res = hosts.ssh(hosts[0], f"ssh -F {hosts.ssh_config} {hosts[1].address} hostname")
    assert res.returncode == 0 and res.stdout.strip() == hosts[1].hostname, res.stderr


WORKER = textwrap.dedent("""
    import json, os, socket, sys
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    total = comm.allreduce(comm.rank)
    info = {"host": socket.gethostname(), "sum": total, "size": comm.size, **os.environ}
    with open(os.path.join(sys.argv[1], "w%s.json" % os.environ["DMLC_WORKER_ID"]), "w") as f:
        json.dump(info, f)
""")


def test_runner_spans_namespace_hosts_through_mpirun(hosts, tmp_path):
    pytest.importorskip("mpi4py")
    cfg = hosts.write_cluster_file(tmp_path / "cluster.yml", workers=[1, 2])
    res = run_runner(["-c", cfg, sys.executable, "-c", WORKER, str(tmp_path)], tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    expect_host = {0: hosts[0], 1: hosts[1], 2: hosts[1]}
    for rank, h in expect_host.items():
        info = json.loads((tmp_path / f"w{rank}.json").read_text())
        assert info["host"] == h.hostname, f"rank {rank} ran on {info['host']}"
        assert info["DMLC_WORKER_ID"] == str(rank) and info["DMLC_NUM_WORKER"] == "3"
        assert info["DMLC_NODE_HOST"] == h.address and info["DMLC_INTERFACE"] == "eth0"
        assert info["DMLC_PS_ROOT_URI"] == hosts[0].address
        assert info["sum"] == 0 + 1 + 2 and info["size"] == 3   # AllReduce across hosts
        # the hosts share this machine's cores: 3 workers split them
        assert info["OMP_NUM_THREADS"] == info["HETU_NUM_THREADS"] == str(max(1, len(os.sched_getaffinity(0)) // 3))


def test_runner_spans_namespace_hosts_despite_a_resource_managers_allocation(hosts, tmp_path):
    # Slurm's variables (an allocation of another node) and a one-host launcher in OMPI_MCA_plm:
    # Open MPI would start no daemon on the hosts of --host and stop at once with "All nodes
    # which are allocated for this job are already filled." (seen on a lent GPU machine).
    pytest.importorskip("mpi4py")
    cfg = hosts.write_cluster_file(tmp_path / "cluster.yml", workers=[1, 1])
    env = {"SLURM_JOBID": "4242", "SLURM_JOB_ID": "4242", "SLURM_NODELIST": "elsewhere7",
           "SLURM_JOB_NODELIST": "elsewhere7", "SLURM_TASKS_PER_NODE": "16", "SLURM_JOB_CPUS_PER_NODE": "16",
           "SLURM_NNODES": "1", "OMPI_MCA_plm": "isolated"}
    res = run_runner(["-c", cfg, sys.executable, "-c", WORKER, str(tmp_path)], tmp_path, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    for rank, h in enumerate(hosts):
        info = json.loads((tmp_path / f"w{rank}.json").read_text())
        assert info["host"] == h.hostname and info["size"] == 2 and info["sum"] == 1


FAKE_LAUNCHER = textwrap.dedent("""
    import json, os, socket, sys, time
    out = os.environ["OUT"]
    with open(os.path.join(out, "ps.%s.%d.json" % (os.environ["DMLC_ROLE"], os.getpid())), "w") as f:
        json.dump({**os.environ, "pid": os.getpid(), "host": socket.gethostname()}, f)
    if os.environ["FAKE_MODE"] == "hang":
        time.sleep(300)
    deadline = time.time() + 60
    while time.time() < deadline:
        if sum(p.startswith("done.") for p in os.listdir(out)) == int(os.environ["DMLC_NUM_WORKER"]):
            sys.exit(0)
        time.sleep(0.05)
    sys.exit(9)
""")
DONE = [sys.executable, "-c",
        "import os; open(os.path.join(os.environ['OUT'], 'done.' + os.environ['DMLC_WORKER_ID']),"
        " 'w').close()"]


def remote_ps_job(hosts, tmp_path, mode, extra=()):
    (tmp_path / "fake_launcher.py").write_text(FAKE_LAUNCHER)
    cfg = hosts.write_cluster_file(tmp_path / "cluster.yml", workers=[1, 1], servers=[0, 1],
                                   env={"OUT": str(tmp_path), "FAKE_MODE": mode})
    env = {"HETU_LAUNCHER": "fake_launcher",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path),
                                                       os.environ.get("PYTHONPATH")]))}
    return run_runner([*extra, "-c", cfg, *DONE], tmp_path, env=env)


def ps_records(tmp_path):
    return [json.loads(p.read_text()) for p in sorted(tmp_path.glob("ps.*.json"))]


def test_scheduler_and_servers_start_over_ssh_on_their_hosts(hosts, tmp_path):
    res = remote_ps_job(hosts, tmp_path, "wait_workers")
    assert res.returncode == 0, res.stdout + res.stderr
    by_role = {r["DMLC_ROLE"]: r for r in ps_records(tmp_path)}
    assert by_role["scheduler"]["host"] == hosts[0].hostname
    assert by_role["server"]["host"] == hosts[1].hostname
    assert by_role["server"]["DMLC_NODE_HOST"] == hosts[1].address
    for r in by_role.values():
        assert r["DMLC_PS_ROOT_URI"] == hosts[0].address and r["DMLC_NUM_SERVER"] == "1"
        assert r["DMLC_PS_ROOT_PORT"] == by_role["scheduler"]["DMLC_PS_ROOT_PORT"]


def test_remote_processes_are_killed_at_teardown(hosts, tmp_path):
    res = remote_ps_job(hosts, tmp_path, "hang", extra=["--shutdown-timeout", "2"])
    assert res.returncode == 1
    assert (f"scheduler on {hosts[0].address}, server 0 on {hosts[1].address} did not exit"
            in res.stderr), res.stderr
    pids = [r["pid"] for r in ps_records(tmp_path)]
    assert len(pids) == 2
    deadline = time.monotonic() + 10   # the remote watchdog acts when its ssh session ends
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert [p for p in pids if alive(p)] == [], "remote processes outlived the runner"


WORKER_THAT_HANGS = [sys.executable, "-c",
                     "import json, os, socket, time; "
                     "json.dump({'pid': os.getpid(), 'host': socket.gethostname()}, "
                     "open(os.path.join(os.environ['OUT'], 'worker.%d.json' % os.getpid()), 'w')); "
                     "time.sleep(300)"]


def test_killed_launcher_ends_the_processes_on_every_host(hosts, tmp_path):
    (tmp_path / "fake_launcher.py").write_text(FAKE_LAUNCHER)
    cfg = hosts.write_cluster_file(tmp_path / "cluster.yml", workers=[1, 1], servers=[0, 1],
                                   env={"OUT": str(tmp_path), "FAKE_MODE": "hang"})
    env = {**os.environ, "HETU_LAUNCHER": "fake_launcher",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    with open(tmp_path / "launcher.log", "w") as log:
        launcher = jobs.Job([sys.executable, str(RUNNER), "--kill-grace", "2", "-c", cfg, *WORKER_THAT_HANGS],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("ps.*.json"))) + len(list(tmp_path.glob("worker.*.json"))) < 4:
            assert launcher.poll() is None and time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()
            time.sleep(0.1)
        records = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
        assert {r["host"] for r in records} == {hosts[0].hostname, hosts[1].hostname}
        launcher.kill()
        killed = time.monotonic()
        pids = [r["pid"] for r in records]
        while any(alive(p) for p in pids) and time.monotonic() - killed < 10:
            time.sleep(0.1)
        assert [p for p in pids if alive(p)] == [], "processes outlived their launcher by 10 s"
        assert f"the launcher (pid {launcher.pid} on " in (tmp_path / "launcher.log").read_text()
    finally:
        if launcher.poll() is None:
            launcher.kill()
        launcher.wait()


RECEIVER = textwrap.dedent("""
    import socket, sys, time
    srv = socket.create_server((sys.argv[1], 0))
    print(srv.getsockname()[1], flush=True)
    conn, _ = srv.accept()
    n, first = 0, None
    while True:
        data = conn.recv(1 << 16)
        if not data:
            break
        first = first or time.perf_counter()
        n += len(data)
    print(n, time.perf_counter() - first, flush=True)
""")
SENDER = "import socket, sys; s = socket.create_connection((sys.argv[1], int(sys.argv[2]))); " \
         "s.sendall(b'x' * int(sys.argv[3])); s.close()"


def transfer_seconds(hosts, src, dst, nbytes):
    check_address_is_test_host(hosts, dst.address)
    recv = jobs.Job(hosts.exec_argv(dst, [sys.executable, "-c", RECEIVER, dst.address]),
                    stdout=subprocess.PIPE, text=True)
    try:
        port = recv.stdout.readline().strip()
        assert port, "receiver did not start"
        jobs.run(hosts.exec_argv(src, [sys.executable, "-c", SENDER, dst.address, port,
                                       str(nbytes)]), check=True, timeout=60)
        out, _ = recv.communicate(timeout=60)
    finally:
        if recv.poll() is None:
            recv.kill()
            recv.wait(timeout=10)
    got, seconds = out.split()
    assert int(got) == nbytes
    return float(seconds)


def test_shaped_link_is_slower(hosts):
    nbytes = 3 << 20
    fast = min(transfer_seconds(hosts, hosts[0], hosts[1], nbytes) for _ in range(2))
    shape(hosts[1], rate="50mbit", delay=None)
    try:
        slow = transfer_seconds(hosts, hosts[0], hosts[1], nbytes)
    finally:
        unshape(hosts[1])
    # 3 MiB at 50 Mbit/s is about 0.5 s; unshaped veth moves it in milliseconds.
    assert slow > 5 * fast, f"shaped {slow:.3f} s vs unshaped {fast:.3f} s"


def test_delay_shaping(hosts):
    try:
        shape(hosts[1], rate=None, delay="20ms")
    except NetnsUnavailable as e:
        pytest.skip(f"netem delay unavailable here: {e}")
    try:
        t0 = time.perf_counter()
        res = hosts.ssh(hosts[0], f"{sys.executable} -c \"import socket; "
                        f"socket.create_connection(('{hosts[1].address}', 22)).close()\"")
        connect = time.perf_counter() - t0
    finally:
        unshape(hosts[1])
    assert res.returncode == 0, res.stderr
    # A TCP handshake crosses the shaped link both ways: at least 2 x 20 ms.
    assert connect > 0.04


def test_each_host_runs_on_its_own_cores():
    """NamespaceHosts(cpus=...): every process a host starts (through its sshd) inherits the
    host's cores, so hosts do not compete for the same ones."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores")
    try:
        with NamespaceHosts(2, cpus=[[cores[0]], cores[1:]]) as hosts:
            got = [hosts.ssh(h, "grep Cpus_allowed_list /proc/self/status").stdout.split()[-1] for h in hosts]
            cluster = hosts.cluster(workers=[0, 1], servers=[1, 0])
    except NetnsUnavailable as e:
        pytest.skip(f"network namespaces unavailable here: {e}")
    expected_rest = str(cores[1]) if len(cores) == 2 else f"{cores[1]}-{cores[-1]}"
    assert got == [str(cores[0]), expected_rest]
    # The worker's thread count is its own host's cores, not the machine's.
    assert cluster["env"]["HETU_NUM_THREADS"] == str(len(cores) - 1)
    with pytest.raises(ValueError, match="one non-empty list of cores per host"):
        NamespaceHosts(2, cpus=[[cores[0]]])


@pytest.mark.timeout(600)
def test_herald_with_one_planner_per_host_on_two_hosts_stays_exact(hosts, tmp_path, data_home):
    """Two hosts of two workers: on each, its first worker plans for both (over its own host's
    Unix socket: the abstract namespace is per network namespace) and the run equals the
    single-process reference."""
    pytest.importorskip("mpi4py")
    from dist_harness import COMMON, assert_same_parameters, run_single
    args = ["--model", "wdl_criteo", "--optimizer", "adam", "--learning-rate", "0.001", "--iters-per-epoch", "30"]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    cfg = hosts.write_cluster_file(tmp_path / "cluster.yml", workers=[2, 2], servers=[1, 1],
                                   env={"HETU_DATA_HOME": data_home, "PS_HEARTBEAT_TIMEOUT": "20"})
    out = tmp_path / "herald.npz"
    res = jobs.run([sys.executable, str(RUNNER), "--timeout", "240", "-c", cfg, sys.executable,
                    str(ROOT / "examples/ctr/run_laia.py"), *COMMON, *args, "--comm", "Hybrid", "--cache", "lru",
                    "--bound", "0", "--bsp", "0", "--cache-limit-ratio", "0.05", "--batch-size", "16",
                    "--save-params", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    planners = {}
    for line in res.stdout.splitlines():
        if "] summary {" in line:
            p = json.loads(line.split("summary ", 1)[1])["planner"]
            planners[p["rank"]] = (p["host_ranks"], p["plans_here"])
    assert planners == {0: ([0, 1], True), 1: ([0, 1], False), 2: ([2, 3], True), 3: ([2, 3], False)}
    assert_same_parameters(reference, dict(np.load(out)), exact_rows=False)


def test_ssh_sessions_get_the_callers_paths(monkeypatch):
    # sshd would start them with its compiled-in PATH: an offline bundle's mpirun, orted and
    # sshd are found only through the caller's PATH and OPAL_PREFIX
    monkeypatch.setenv("OPAL_PREFIX", "/opt/hetu-test-opal")
    monkeypatch.setenv("PATH", os.environ["PATH"] + ":/opt/hetu-test-bin")
    try:
        with NamespaceHosts(1) as hs:
            res = hs.ssh(hs[0], 'echo "$OPAL_PREFIX"; echo "$PATH"')
    except NetnsUnavailable as e:
        pytest.skip(f"network namespaces unavailable here: {e}")
    assert res.returncode == 0, res.stderr
    opal, path = res.stdout.splitlines()
    assert opal == "/opt/hetu-test-opal"
    assert "/opt/hetu-test-bin" in path.split(":")   # (the remote login shell may prepend its own)
