"""Dead peers end the job with an error that names them (never a hang); garbage on the
ports is dropped; rendezvous options (worker rank override, van type)."""
import os
import re
import signal
import socket
import sys
import time

import numpy as np
import pytest

from conftest import REPO
from ps_helpers import VANS, cluster_fixture, zmq_job_dealer

cluster = pytest.fixture(cluster_fixture)

PULL_LOOP = """
t = ps.client().init_table("emb", 100, 8)
keys = np.arange(100)
t.pull(keys).wait()
open(OUT + ".ready", "w").close()
start = time.time()
try:
    while time.time() - start < 60:
        t.pull(keys).wait()
        time.sleep(0.01)
except RuntimeError as e:
    print("ERROR:", e, flush=True)
    sys.exit(3)
sys.exit(0)
"""


def wait_for_file(path, timeout, c):
    """Waits for a worker's ready mark. `timeout` is above the cluster's PS_START_TIMEOUT, so
    a rendezvous that never completes shows up in the logs as ps-lite's own message naming
    the missing node, and a process that exits early fails the wait at once."""
    deadline = time.time() + timeout
    while not os.path.exists(path):
        exited = {n: p.returncode for n, (p, _) in c.procs.items() if p.poll() is not None}
        assert not exited, f"{path} never appeared, exited early {exited}; logs:\n{c.logs()}"
        assert time.time() < deadline, f"{path} never appeared; logs:\n{c.logs()}"
        time.sleep(0.05)


@pytest.mark.timeout(180)
def test_nodes_started_before_the_scheduler_all_register(cluster):
    """Registrations that wait in the nodes' queues reach the scheduler the moment it binds,
    before its own start-up has finished; none may be lost."""
    for _ in range(4):
        c = cluster(2, 6)
        c.start_servers(with_scheduler=False).start_workers("ps.barrier('workers')\nps.finalize()\n")
        time.sleep(1.5)
        c.start_scheduler()
        codes = c.wait(c.worker_names() + c.server_names(), 40)
        assert all(v == 0 for v in codes.values()), f"exit codes {codes}; logs:\n{c.logs()}"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("van", VANS)
def test_registrations_lost_with_a_dead_scheduler_are_repeated(cluster, van):
    """A scheduler that took the first registrations dies; the one started in its place on the
    same port hears from every node again, because nodes repeat their registration. Every node
    must also close cleanly: over UCX a connection still being set up when a node closed used
    to crash it (docs/ps-lite-notes.md)."""
    c = cluster(1, 2, env={"DMLC_PS_VAN_TYPE": van})
    c.start_scheduler("decoy", env={"DMLC_NUM_WORKER": "5"})   # waits for nodes that never come
    c.start_servers(with_scheduler=False).start_workers("ps.barrier('workers')\nps.finalize()\n")
    time.sleep(4)
    assert c.procs["decoy"][0].poll() is None, c.logs()
    c.kill("decoy")
    c.procs["decoy"][0].wait(10)
    c.start_scheduler()
    codes = c.wait(c.worker_names() + c.server_names(), 45)
    assert all(v == 0 for v in codes.values()), f"exit codes {codes}; logs:\n{c.logs()}"


@pytest.mark.timeout(90)
@pytest.mark.parametrize("van", VANS)
def test_killed_server_fails_workers_within_heartbeat_timeout(cluster, tmp_path, van):
    c = cluster(2, 2, heartbeat_timeout=3.0, env={"DMLC_PS_VAN_TYPE": van})
    c.start_servers().start_workers(PULL_LOOP)
    for w in range(2):
        wait_for_file(str(tmp_path / f"worker{w}.ready"), 45, c)
    killed_at = time.time()
    c.kill("server0")
    codes = c.wait(["worker0", "worker1", "scheduler", "server1"], timeout=20)
    elapsed = time.time() - killed_at
    assert elapsed < 3.0 + 4.0, elapsed
    for w in range(2):
        assert codes[f"worker{w}"] == 3, c.logs()
        log = c.log(f"worker{w}")
        # The heartbeats call it dead; UCX may fail the send to it first.
        assert "ERROR:" in log and "server 0" in log, log
        assert "dead" in log or (van == "ucx" and "cannot send to server 0" in log), log
    for n in ("scheduler", "server1"):
        assert codes[n] != 0
        assert "server 0" in c.log(n), c.log(n)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("van", VANS)
def test_scheduler_waits_for_servers_to_confirm_the_end(cluster, tmp_path, van):
    """The scheduler leaves only once the servers have confirmed the end of the job, sending
    it again until they do (a van may drop what it holds when its process exits). A server
    that never confirms (here: stopped) is given up on after half a heartbeat timeout, by
    name, and still ends when it resumes and reads the end."""
    c = cluster(3, 2, heartbeat_timeout=8.0, env={"DMLC_PS_VAN_TYPE": van})
    c.start_servers().start_workers("""
t = ps.client().init_table("emb", 100, 8)
t.pull(np.arange(100)).wait()
open(OUT + ".ready", "w").close()
while not os.path.exists(OUT + ".go"):
    time.sleep(0.02)
ps.finalize()
""")
    for w in range(2):
        wait_for_file(str(tmp_path / f"worker{w}.ready"), 45, c)
    c.kill("server0", signal.SIGSTOP)
    stopped_at = time.time()
    for w in range(2):
        (tmp_path / f"worker{w}.go").touch()
    codes = c.wait(["worker0", "worker1", "server1", "server2", "scheduler"], timeout=20)
    waited = time.time() - stopped_at
    c.kill("server0", signal.SIGCONT)
    assert set(codes.values()) == {0}, f"{codes}; logs:\n{c.logs()}"
    assert waited >= 4.0 - 0.5, f"{waited}; logs:\n{c.logs()}"  # half of the heartbeat timeout
    gave_up = [line for line in c.log("scheduler").splitlines() if "without the confirmation" in line]
    assert len(gave_up) == 1 and "server 0" in gave_up[0], c.log("scheduler")
    assert "server 1" not in gave_up[0] and "server 2" not in gave_up[0], gave_up
    assert c.wait(["server0"], timeout=20) == {"server0": 0}, c.logs()


@pytest.mark.timeout(90)
def test_killed_worker_ends_scheduler_and_servers_with_its_name(cluster, tmp_path):
    c = cluster(1, 2, heartbeat_timeout=2.0)
    c.start_servers().start_workers(PULL_LOOP, env_per_worker={w: {"DMLC_WORKER_ID": str(w)} for w in range(2)})
    wait_for_file(str(tmp_path / "worker1.ready"), 45, c)
    c.kill("worker1")
    codes = c.wait(["scheduler", "server0", "worker0"], timeout=20)
    assert codes["scheduler"] == 1 and codes["server0"] == 1
    assert codes["worker0"] == 3
    for n in ("scheduler", "server0", "worker0"):
        assert "worker 1" in c.log(n), c.log(n)


def _wait_port(port, timeout=20):
    deadline = time.time() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.time() < deadline, f"nothing listens on {port}"
            time.sleep(0.05)


def _raw_garbage(port):
    """Random bytes on fresh connections: not even the transport's handshake."""
    rng = np.random.default_rng(port)
    for n in (1, 17, 4096):
        with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
            s.sendall(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
            time.sleep(0.05)


def _ucx_garbage(port):
    """Well-formed UCX active messages, from an endpoint that authenticated, whose content is
    not the van's: random bytes, a header promising blobs that are not in the payload, a
    payload larger than the header says."""
    from hetu import _ps
    rng = np.random.default_rng(port)
    meta = b"\x10\x01"  # a protobuf field, not a full meta
    for header, payload in [(rng.bytes(3), b""), (rng.bytes(64), rng.bytes(100000)),
                            (b"HPS1" + np.uint32(2).tobytes() + np.uint64(8).tobytes() * 2 + meta, b"x" * 8),
                            (b"HPS1" + np.uint32(0).tobytes() + meta, rng.bytes(64)), (b"", b"")]:
        assert _ps._ucx_send_raw("127.0.0.1", port, header, payload)


def _zmq_garbage(port, secret, mechanism):
    """Valid ZMTP from a peer with the job's keys, invalid content: random frames, a meta
    promising blobs that never come, a huge frame count, an empty frame."""
    zmq = pytest.importorskip("zmq")
    rng = np.random.default_rng(port)
    ctx = zmq.Context()
    d = zmq_job_dealer(ctx, port, secret, mechanism)
    for n in (3, 64, 100000):
        d.send(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
    d.send(b"\x78\x05")  # protobuf: num_blobs = 5, no frames follow
    d.send_multipart([b""] * 50)
    d.send(b"")
    d.close()
    ctx.term()


GOOD = """
t = ps.client().init_table("emb", 64, 4, init=("constant", 1.0))
t.push(np.arange(64), np.ones((64, 4)), iteration=0, lr=0.5).wait()
got = t.pull(np.arange(64), iteration=1).wait()
assert np.all(got == 1.0 - 0.5 * ps.num_workers()), got
ps.finalize()
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("van", VANS + ["zmq-curve"])
def test_garbage_on_scheduler_and_server_ports_is_dropped(cluster, van, monkeypatch):
    van, _, mechanism = van.partition("-")
    c = cluster(2, 2, env={"PS_VERBOSE": "1", "DMLC_PS_VAN_TYPE": van, "PS_AUTH": mechanism or "plain"})
    c.start_servers(fixed_ports=True)
    secret = c.base_env["HETU_JOB_SECRET"]
    monkeypatch.setenv("HETU_JOB_SECRET", secret)  # _ucx_send_raw's van says the job's hello
    for port in [c.port] + c.server_ports:
        _wait_port(port)
        _raw_garbage(port)
        if van == "zmq":
            _zmq_garbage(port, secret, mechanism or "plain")
        else:
            _ucx_garbage(port)
    c.start_workers(GOOD)
    codes = c.wait(c.worker_names() + c.server_names(), timeout=40)
    assert all(v == 0 for v in codes.values()), (codes, c.logs())
    for n in ("scheduler", "server0", "server1"):
        assert "dropped a malformed message" in c.log(n), c.log(n)


RANKS = """
print("RANK", ps.rank(), flush=True)
ps.finalize()
"""


@pytest.mark.timeout(60)
def test_worker_rank_follows_dmlc_worker_id(cluster):
    c = cluster(1, 3)
    c.run(RANKS, env_per_worker={0: {"DMLC_WORKER_ID": "2"}, 1: {"DMLC_WORKER_ID": "0"}})
    assert "RANK 2" in c.log("worker0") and "RANK 0" in c.log("worker1") and "RANK 1" in c.log("worker2")


@pytest.mark.timeout(60)
def test_duplicate_worker_id_is_rejected(cluster):
    c = cluster(1, 2)
    c.start_servers().start_workers(RANKS, env_per_worker={0: {"DMLC_WORKER_ID": "1"}, 1: {"DMLC_WORKER_ID": "1"}})
    codes = c.wait(c.worker_names() + c.server_names(), timeout=30)
    assert all(v != 0 for v in codes.values()), codes
    assert "DMLC_WORKER_ID=1" in c.log("worker0") and "DMLC_WORKER_ID=1" in c.log("scheduler")


@pytest.mark.timeout(30)
def test_unknown_van_type_is_a_clear_error(cluster):
    c = cluster(1, 1, env={"DMLC_PS_VAN_TYPE": "pigeon"})
    c._spawn("scheduler", [__import__("sys").executable, "-m", "hetu.launcher"], dict(c.base_env, DMLC_ROLE="scheduler"))
    assert c.wait(["scheduler"], 20)["scheduler"] == 1
    assert "DMLC_PS_VAN_TYPE='pigeon'" in c.log("scheduler") and "this build has: zmq" in c.log("scheduler")


@pytest.mark.timeout(90)
def test_killed_scheduler_is_noticed_by_workers_and_servers(cluster, tmp_path):
    c = cluster(1, 1, heartbeat_timeout=2.0)
    c.start_servers().start_workers(PULL_LOOP)
    wait_for_file(str(tmp_path / "worker0.ready"), 45, c)
    c.kill("scheduler")
    codes = c.wait(["server0", "worker0"], timeout=20)
    assert codes == {"server0": 1, "worker0": 3}, c.logs()
    for n in ("server0", "worker0"):
        assert "scheduler" in c.log(n) and "dead" in c.log(n), c.log(n)


@pytest.mark.timeout(180)
def test_a_training_worker_whose_server_dies_ends_in_one_line(cluster, tmp_path):
    """A peer found dead by the heartbeats ends the training script with the line naming it, not
    a traceback through the executor."""
    c = cluster(1, 1, heartbeat_timeout=3.0)
    c.start_servers()
    c._spawn("worker0", [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress", "--rows", "20000",
                         "--embedding-size", "8", "--comm", "PS", "--nepoch", "50", "--batch-size", "32"],
             dict(c.base_env, DMLC_ROLE="worker", HETU_DATA_HOME=str(tmp_path / "data")))
    deadline = time.time() + 120
    while "epoch 0:" not in c.log("worker0"):
        assert c.procs["worker0"][0].poll() is None and time.time() < deadline, c.logs()
        time.sleep(0.2)
    c.kill("server0")
    code = c.wait(["worker0"], timeout=30)["worker0"]
    log = c.log("worker0")
    assert code == 1 and "Traceback" not in log, log[-3000:]
    last = log.strip().splitlines()[-1]
    assert last.startswith("error: ") and "server 0 (node" in last and "is dead: no heartbeat" in last, log[-3000:]


@pytest.mark.timeout(90)
def test_a_stopped_worker_names_itself_not_the_scheduler(cluster, tmp_path):
    """A worker stopped past the heartbeat timeout is counted dead; once it runs again its own
    line must say that it was stopped, not that the scheduler stopped answering."""
    c = cluster(1, 2, heartbeat_timeout=2.0)
    c.start_servers().start_workers(PULL_LOOP)
    for w in range(2):
        wait_for_file(str(tmp_path / f"worker{w}.ready"), 45, c)
    c.kill("worker0", signal.SIGSTOP)
    time.sleep(5)
    c.kill("worker0", signal.SIGCONT)
    codes = c.wait(["worker0", "worker1", "scheduler", "server0"], timeout=30)
    assert codes["worker0"] == 3, c.logs()
    log = c.log("worker0")
    assert "scheduler (node 0" not in log, log
    # Its rank is the scheduler's choice: the one the scheduler's own line calls dead.
    dead = re.search(r"(worker \d \(node \d+ at [^)]*\)) is dead", c.log("scheduler"))
    assert dead, c.log("scheduler")
    assert f"{dead.group(1)} did not run for" in log or f"{dead.group(1)} was counted dead by the scheduler" in log, log
    assert "stopped or starved" in log, log


@pytest.mark.timeout(90)
def test_a_stopped_scheduler_names_itself_not_a_node(cluster, tmp_path):
    """A scheduler stopped past the heartbeat timeout is counted dead by every node; once it runs
    again its own line must say that it was stopped, not that a worker or server died."""
    c = cluster(1, 1, heartbeat_timeout=2.0)
    c.start_servers().start_workers(PULL_LOOP)
    wait_for_file(str(tmp_path / "worker0.ready"), 45, c)
    c.kill("scheduler", signal.SIGSTOP)
    time.sleep(5)
    c.kill("scheduler", signal.SIGCONT)
    codes = c.wait(["worker0", "server0", "scheduler"], timeout=30)
    assert codes["worker0"] != 0 and codes["server0"] != 0 and codes["scheduler"] != 0, c.logs()
    for n in ("server0", "worker0"):
        assert "scheduler (node 0" in c.log(n) and "is dead" in c.log(n), c.log(n)
    log = c.log("scheduler")
    assert "scheduler (node 0" in log and "did not run for" in log and "stopped or starved" in log, log
    assert not re.search(r"(worker|server) \d \(node \d+ at [^)]*\) is dead", log), log
