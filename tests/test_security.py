"""Only the job's own processes can join it or command it (ps-lite/README.md, Security).

Outsiders on loopback aim forged messages, connections without the secret and random bytes
at the test's own job; the job must end with exactly the parameters of an undisturbed run.
"""
import json
import os
import socket
import sys
import textwrap
import time

import numpy as np
import pytest

import jobs
from ps_helpers import BATCH_CODE, VANS, cluster_fixture, free_port, needs_mpirun, zmq_curve_keys, zmq_plain_password
from test_ps_failures import RANKS   # a job that starts, says its rank, and ends

cluster = pytest.fixture(cluster_fixture)

# BSP training whose result depends on every step: the workers stop half way until the test
# says go (after the outsider has had its turn), and worker 0 writes the final table.
TRAIN = BATCH_CODE + """
t = ps.client().init_table("emb", 40, 4, init=("normal", 0.0, 0.1), seed=7)
for it in range(12):
    if it == 6:
        open(OUT + ".mid", "w").close()
        while not os.path.exists(ARGS["go"]):
            time.sleep(0.02)
    keys, grads, _ = batch(ps.rank(), it, 40, 4)
    t.push(keys, grads, iteration=it, lr=0.1).wait()
    t.pull(np.arange(40), iteration=it + 1).wait()
if ps.rank() == 0:
    np.save(OUT + ".npy", t.pull(np.arange(40), iteration=12).wait())
ps.finalize()
"""

SERVERS, WORKERS = 1, 2
SCHEDULER_ID, SERVER_ID, WORKER_IDS = 0, 1, (2, 3)


# ---- protobuf encoding of ps.pb.Meta (ps-lite/proto/meta.proto), by hand: an outsider
# needs nothing of the job to write one.
def _varint(n):
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number, value):
    if isinstance(value, bytes):
        return _varint(number << 3 | 2) + _varint(len(value)) + value
    return _varint(number << 3) + _varint(value)


def meta(control=0, sender=0, request=False, op=0, table=b"", arg=0, error=b"", path=b"", node=None):
    m = _field(1, control) + _field(2, sender) + _field(4, int(request)) + _field(5, op) + _field(10, arg)
    for number, text in ((6, table), (11, error), (12, path)):
        if text:
            m += _field(number, text)
    if node:  # Node: role 2, rank 3, host 4, port 5
        m += _field(13, _field(2, node["role"]) + _field(4, node["host"]) + _field(5, node["port"]))
    return m


def forged_messages(tmp_path):
    """(target, description, meta bytes): what the probe of issue 33 sent, and the rest of
    the list: every control command and the data commands that change or expose a table."""
    k_add, k_barrier, k_heartbeat, k_exit, k_terminate, k_dead = 1, 3, 5, 7, 9, 10
    k_save, k_load, k_clear = 8, 9, 10
    save_dir = str(tmp_path / "forged_save").encode()
    return [
        ("server", "kNodeDead", meta(k_dead, SCHEDULER_ID, error=b"forged death")),
        ("worker", "kNodeDead", meta(k_dead, SCHEDULER_ID, error=b"forged death")),
        ("scheduler", "kExit", meta(k_exit, WORKER_IDS[0])),
        ("server", "kTerminate", meta(k_terminate, SCHEDULER_ID)),
        ("server", "kSave", meta(0, WORKER_IDS[0], True, k_save, b"emb", path=save_dir)),
        ("server", "kClear", meta(0, WORKER_IDS[0], True, k_clear, b"emb")),
        ("server", "kLoad", meta(0, WORKER_IDS[0], True, k_load, b"emb", path=str(tmp_path / "none").encode())),
        ("scheduler", "kAddNode", meta(k_add, -1, node={"role": 2, "host": b"127.0.0.1", "port": 9})),
        ("scheduler", "heartbeat", meta(k_heartbeat, SERVER_ID)),
        ("scheduler", "barrier", meta(k_barrier, WORKER_IDS[0], arg=3)),
    ]


def _zmq_outsider(ports, messages, keys=None, password=None):
    """Sends every message from a DEALER without credentials (NULL mechanism), or with CURVE
    `keys` (server public, client public, client secret) or a PLAIN `password` of another secret."""
    zmq = pytest.importorskip("zmq")
    ctx = zmq.Context()
    for target, _, m in messages:
        d = ctx.socket(zmq.DEALER)
        d.setsockopt(zmq.LINGER, 500)
        # A handshake the job refuses ends the connection for good (ZMQ does not reconnect after
        # it), and a DEALER with no connection waits forever to send: if the refusal came first,
        # the message has nowhere to go, which is the refusal the test wants.
        d.setsockopt(zmq.SNDTIMEO, 500)
        if keys:
            d.curve_serverkey, d.curve_publickey, d.curve_secretkey = keys
        if password:
            d.plain_username, d.plain_password = b"hetu", password.encode()
        d.connect(f"tcp://127.0.0.1:{ports[target]}")
        try:
            d.send(m)
        except zmq.Again:
            pass
        d.close()
    ctx.term()


def _ucx_outsider(ports, messages, secret):
    """Sends every message as the UCX van's active message, from a process whose van has
    `secret` (None: no secret, so no hello at all)."""
    env = {k: v for k, v in os.environ.items() if k != "HETU_JOB_SECRET"}
    if secret:
        env["HETU_JOB_SECRET"] = secret
    sends = [(ports[t], (b"HPS1" + np.uint32(0).tobytes() + m).hex()) for t, _, m in messages]
    code = textwrap.dedent(f"""
        from hetu import _ps
        for port, header in {sends!r}:
            _ps._ucx_send_raw("127.0.0.1", port, bytes.fromhex(header), b"")
    """)
    jobs.run([sys.executable, "-c", code], env=env, timeout=120, check=True, capture_output=True)


def _random_bytes(ports):
    rng = np.random.default_rng(0)
    for port in set(ports.values()):
        for n in (1, 10, 64, 4096):
            with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                s.sendall(rng.integers(0, 256, n, dtype=np.uint8).tobytes())
                time.sleep(0.02)


def _wait_file(path, timeout, c):
    deadline = time.time() + timeout
    while not os.path.exists(path):
        assert time.time() < deadline, f"no {path} after {timeout} s; logs:\n{c.logs()}"
        time.sleep(0.05)


def train(cluster, tmp_path, van, outsider=None, env=None, code=TRAIN, args=None):
    """One job on fixed ports; `outsider(ports)` runs once the workers stand half way.
    van: "zmq" (PLAIN), "zmq-curve" or "ucx"; env, code (TRAIN's shape) and args: more of the job's."""
    # An earlier job's marks in tmp_path would let this one's outsider in at once, before this
    # job's nodes listen (a raw connection is then refused), or let its workers past half way.
    for mark in [*tmp_path.glob("worker*.mid"), *tmp_path.glob("worker*.npy"), *tmp_path.glob("go.*")]:
        mark.unlink()
    van, _, mechanism = van.partition("-")
    c = cluster(SERVERS, WORKERS, env={"DMLC_PS_VAN_TYPE": van, "PS_AUTH": mechanism or "plain", **(env or {})})
    c.start_servers(fixed_ports=True)
    worker_ports = [free_port() for _ in range(WORKERS)]
    go = tmp_path / f"go.{c.port}"
    c.start_workers(code, args={"go": str(go), **(args or {})},
                    env_per_worker={w: {"DMLC_NODE_PORT": str(p), "DMLC_WORKER_ID": str(w)}
                                    for w, p in enumerate(worker_ports)})
    for w in range(WORKERS):
        _wait_file(f"{tmp_path}/worker{w}.mid", 60, c)
    ports = {"scheduler": c.port, "server": c.server_ports[0], "worker": worker_ports[1]}
    if outsider:
        outsider(ports)
    go.touch()
    codes = c.wait(c.worker_names() + c.server_names(), timeout=90)
    assert all(v == 0 for v in codes.values()), (codes, c.logs())
    return np.load(tmp_path / "worker0.npy"), c


@pytest.mark.timeout(300)
@pytest.mark.parametrize("van", VANS + ["zmq-curve"])
def test_forged_messages_and_strangers_are_refused(cluster, tmp_path, van):
    reference, _ = train(cluster, tmp_path, van)
    messages = forged_messages(tmp_path)

    def outsider(ports):
        if van.startswith("zmq"):
            _zmq_outsider(ports, messages)
            other = "another job's secret"
            _zmq_outsider(ports, messages, (zmq_curve_keys(other, "server")[0], *zmq_curve_keys(other, "client")))
            _zmq_outsider(ports, messages, password=zmq_plain_password(other))
        else:
            # First, so that the one line a rate limit lets through is the refused hello's,
            # which names its address (UCX does not say where a message without one is from).
            _ucx_outsider(ports, messages, "another job's secret")
            _ucx_outsider(ports, messages, None)
        _random_bytes(ports)
        time.sleep(1)  # a forged kNodeDead or kExit would end the job within this

    got, c = train(cluster, tmp_path, van, outsider)
    np.testing.assert_array_equal(got, reference)
    assert not (tmp_path / "forged_save").exists()
    logs = c.logs()
    assert "forged death" not in logs and "libprotobuf" not in logs, logs
    for name in ("scheduler", "server0", "worker1"):
        # Every target says it refused the outsider. The address is named unless the connection
        # was gone before the van looked it up, or (UCX) the one line the rate limit let through
        # was for a message without a hello, which carries no address.
        refusals = ("refused a connection from ",) if van.startswith("zmq") else \
            ("refused a connection from ", "dropped a message without a proof of this job's secret")
        assert any(r in c.log(name) for r in refusals), c.log(name)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("van", VANS)
def test_hand_started_job_with_the_secret_works_and_another_secret_is_refused(cluster, van):
    c = cluster(1, 2, env={"DMLC_PS_VAN_TYPE": van})
    c.start_servers()
    c.start_workers(RANKS, env_per_worker={1: {"HETU_JOB_SECRET": "not this job's"}})
    codes = c.wait(["worker1"], timeout=60)
    assert codes["worker1"] != 0
    assert "the scheduler refused this node" in c.log("worker1"), c.log("worker1")
    assert "job secret (HETU_JOB_SECRET) differs" in c.log("worker1"), c.log("worker1")
    assert "refused a connection from 127.0.0.1" in c.log("scheduler"), c.log("scheduler")
    # The rest of the job, with its own secret, is unharmed: a worker that has it joins.
    c._spawn("worker1b", c.procs["worker0"][0].args, dict(c.base_env, DMLC_ROLE="worker"))
    codes = c.wait(["worker0", "worker1b"] + c.server_names(), timeout=60)
    assert all(v == 0 for v in codes.values()), (codes, c.logs())
    assert "RANK" in c.log("worker0") and "RANK" in c.log("worker1b")


@pytest.mark.timeout(120)
def test_secret_file_must_be_private(cluster, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("from a file\n")
    secret.chmod(0o644)
    c = cluster(1, 1, env={"HETU_JOB_SECRET": "", "HETU_JOB_SECRET_FILE": str(secret)})
    c.start_scheduler()
    assert c.wait(["scheduler"], timeout=30)["scheduler"] != 0
    assert "may be read by others" in c.log("scheduler"), c.log("scheduler")
    secret.chmod(0o600)
    c = cluster(1, 1, env={"HETU_JOB_SECRET": "", "HETU_JOB_SECRET_FILE": str(secret)})
    c.run(RANKS)
    assert "warning: no HETU_JOB_SECRET" not in c.logs()


@pytest.mark.timeout(120)
def test_without_a_secret_a_hand_started_job_runs_and_warns_once(cluster):
    c = cluster(1, 1, env={"HETU_JOB_SECRET": ""})
    c.run(RANKS)
    for name in ("scheduler", "server0", "worker0"):
        assert c.log(name).count("warning: no HETU_JOB_SECRET") == 1, c.log(name)


# Run by worker 0 while every process of the job stands at a barrier: where the secret is
# (each process's environment, never a command line) and what the job's processes listen on.
PROBE = """
import json, os, re, subprocess
import hetu.ps as ps
ps.start()
if ps.rank() == 0:
    secret = os.environ["HETU_JOB_SECRET"]
    job, in_argv, mpirun = [], [], ""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().split(b"\\0")
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read()
        except OSError:
            continue
        if secret.encode() in argv:
            in_argv.append(pid)
        if b"HETU_JOB_SECRET=" + secret.encode() in env:
            job.append(int(pid))
            if argv.startswith(b"mpirun"):
                mpirun = argv.replace(b"\\0", b" ").decode(errors="replace")
    listen = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True).stdout.splitlines()
    mine = [l for l in listen if any(f"pid={p}," in l for p in job)]
    with open(os.path.join(os.environ["OUT"], "probe.json"), "w") as f:
        json.dump({"secret": secret, "job": job, "in_argv": in_argv, "listen": mine, "mpirun": mpirun}, f)
ps.client()  # every process still runs until all workers finish
ps.finalize()
"""


@pytest.mark.timeout(180)
@needs_mpirun
def test_launcher_secret_stays_off_command_lines_and_the_job_listens_on_loopback(tmp_path):
    runner = os.path.join(os.path.dirname(__file__), "..", "python", "runner.py")
    env = {k: v for k, v in os.environ.items() if k != "HETU_JOB_SECRET"}
    env["OUT"] = str(tmp_path)
    runs = []
    for _ in range(2):
        res = jobs.run([sys.executable, runner, "-w", "2", "-s", "1", "--timeout", "120",
                        sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=170,
                       env=env, cwd=tmp_path)
        assert res.returncode == 0, res.stdout + res.stderr
        assert "warning: no HETU_JOB_SECRET" not in res.stderr
        runs.append(json.loads((tmp_path / "probe.json").read_text()))
    probe = runs[0]
    assert len(probe["secret"]) == 64 and runs[1]["secret"] != probe["secret"]   # one per job
    # scheduler, server, mpirun and both workers at least
    assert len(probe["job"]) >= 5, probe
    assert probe["in_argv"] == [], probe
    assert "--mca btl_tcp_if_include lo" in probe["mpirun"] and "--mca oob_tcp_if_include lo" in probe["mpirun"]
    ps_lite = [l for l in probe["listen"] if '(("mpirun"' not in l]
    assert len(ps_lite) >= 3, probe   # scheduler, server, workers
    for line in ps_lite:
        assert line.split()[3].startswith("127.0.0.1:"), (line, probe["listen"])
    # mpirun: Open MPI's out-of-band channel on loopback; the only other listeners are PMIx's
    # tool rendezvous (one IPv4, one IPv6), which Open MPI 4.1 opens on every address.
    wildcard = [l for l in probe["listen"] if not l.split()[3].startswith(("127.", "[::1]"))]
    assert len(wildcard) <= 2 and all('(("mpirun"' in l for l in wildcard), probe["listen"]


CONFINED = """
t = ps.client().init_table("emb", 40, 4, init=("normal", 0.0, 0.1), seed=7)
results = {}
for name in ("inside", "outside", "dotdot", "link", "load_outside", "load_inside"):
    op = t.load if name.startswith("load") else t.save
    try:
        op(ARGS[name]).wait()
        results[name] = "ok"
    except RuntimeError as e:
        results[name] = str(e)
json.dump(results, open(OUT + ".json", "w"))
ps.finalize()
"""


def test_servers_save_and_load_only_inside_the_jobs_checkpoint_folder(cluster, tmp_path):
    root, outside = tmp_path / "checkpoints", tmp_path / "elsewhere"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside)   # a way out through a symbolic link
    paths = {"inside": root / "ckpt" / "ps", "outside": outside / "ps", "dotdot": root / ".." / "elsewhere" / "x",
             "link": root / "link" / "ps", "load_outside": outside / "ps", "load_inside": root / "ckpt" / "ps"}
    c = cluster(1, 1, env={"HETU_CHECKPOINT_ROOT": str(root)})
    c.run(CONFINED, args={k: str(v) for k, v in paths.items()})
    results = json.loads((tmp_path / "worker0.json").read_text())
    assert results["inside"] == "ok" and results["load_inside"] == "ok", results
    for name, verb in (("outside", "save"), ("dotdot", "save"), ("link", "save"), ("load_outside", "load")):
        assert f"table 'emb': {verb} of {os.path.abspath(paths[name])} refused: it is outside the job's checkpoint folder " \
               f"(HETU_CHECKPOINT_ROOT: {root})" in results[name], (name, results[name])
    assert os.listdir(outside) == [], "a refused save wrote into the folder"

    # A job started by hand without the variable: any folder, as before.
    c2 = cluster(1, 1)
    c2.tmp = tmp_path / "free"
    c2.tmp.mkdir()
    c2.run(CONFINED, args={k: str(v) for k, v in paths.items()})
    results = json.loads((c2.tmp / "worker0.json").read_text())
    assert all(results[name] == "ok" for name in ("inside", "outside", "dotdot", "link", "load_inside")), results


def test_the_launcher_gives_its_servers_the_folders_of_the_commands_checkpoints(tmp_path):
    from test_runner import fake_launcher_env, run_runner
    cmd = [sys.executable, "-c", "import os; open(os.path.join(os.environ['OUT'], 'done.' + "
           "os.environ['DMLC_WORKER_ID']), 'w').close()", "--checkpoint", "runs/ckpt", "--resume=/data/old/ckpt"]
    res = run_runner(["-w", "1", "-s", "1", *cmd], tmp_path, env=fake_launcher_env(tmp_path, "wait_workers"))
    assert res.returncode == 0, res.stderr
    [server] = [json.loads(p.read_text()) for p in tmp_path.glob("ps.server.*.json")]
    assert server["HETU_CHECKPOINT_ROOT"] == f"{tmp_path}/runs/ckpt:/data/old/ckpt", server.get("HETU_CHECKPOINT_ROOT")
    res = run_runner(["-w", "1", "-s", "1", *cmd], tmp_path, env={**fake_launcher_env(tmp_path, "wait_workers"),
                                                                  "HETU_CHECKPOINT_ROOT": "/srv/ckpts"})
    assert res.returncode == 0, res.stderr
    servers = [json.loads(p.read_text()) for p in tmp_path.glob("ps.server.*.json")]
    assert {s["HETU_CHECKPOINT_ROOT"] for s in servers} >= {"/srv/ckpts"}, servers
