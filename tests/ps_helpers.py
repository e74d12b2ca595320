"""Real ps-lite jobs on loopback for the tests: a scheduler and servers run by
``python -m hetu.launcher``, workers run a Python snippet; every process is a jobs.Job,
killed in teardown, and every wait has a timeout."""
import hashlib
import hmac
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from jobs import Job, alive  # noqa: F401 (alive: for the tests that import it from here)

WORKER_PREAMBLE = """
import json, os, sys, time
import numpy as np
import hetu.ps as ps
ARGS = json.loads(sys.argv[1])
OUT = sys.argv[2]
if not ARGS.get("no_start"):
    ps.start()
"""


def _built_vans():
    from hetu import _ps
    return _ps.van_types()


needs_ucx = pytest.mark.skipif("ucx" not in _built_vans(), reason="hetu built without UCX (libucx-dev)")
# For the tests whose jobs start their workers with mpirun (python/runner.py).
needs_mpirun = pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun (openmpi-bin) not installed")
# Parameter for tests that run over each van.
VANS = [pytest.param("zmq"), pytest.param("ucx", marks=needs_ucx)]


def free_port():
    from hetu.ps import pick_root_port
    return pick_root_port("127.0.0.1")


class Cluster:
    """One job: `servers` servers, `workers` workers, a scheduler on a free port."""

    def __init__(self, tmp_path, servers, workers, heartbeat_timeout=10.0, env=None):
        self.tmp = tmp_path
        self.servers, self.workers = servers, workers
        self.port = free_port()
        self.base_env = dict(os.environ)
        self.base_env.update({
            "DMLC_PS_ROOT_URI": "127.0.0.1",
            "DMLC_PS_ROOT_PORT": str(self.port),
            "DMLC_NUM_WORKER": str(workers),
            "DMLC_NUM_SERVER": str(servers),
            "PS_HEARTBEAT_TIMEOUT": str(heartbeat_timeout),
            "PS_START_TIMEOUT": "30",
            "PS_WAIT_TIMEOUT": "60",
            "HETU_NUM_THREADS": "1",
            # A job's own secret, as the launcher gives one to each job.
            "HETU_JOB_SECRET": secrets.token_hex(16),
        })
        self.base_env.update(env or {})
        self.procs = {}  # name -> (Popen, log path)
        self.server_ports = []

    def _spawn(self, name, cmd, env):
        log = self.tmp / f"{name}.log"
        f = open(log, "w")
        p = Job(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        f.close()
        self.procs[name] = (p, log)
        return p

    def start_scheduler(self, name="scheduler", env=None):
        env = dict(self.base_env, DMLC_ROLE="scheduler", **(env or {}))
        self._spawn(name, [sys.executable, "-m", "hetu.launcher"], env)
        return self

    def start_servers(self, fixed_ports=False, with_scheduler=True):
        if with_scheduler:
            self.start_scheduler()
        for s in range(self.servers):
            # fixed server ranks, so a test knows which process holds which key range
            env = dict(self.base_env, DMLC_ROLE="server", DMLC_SERVER_ID=str(s))
            if fixed_ports:
                port = free_port()
                self.server_ports.append(port)
                env["DMLC_NODE_PORT"] = str(port)
            self._spawn(f"server{s}", [sys.executable, "-m", "hetu.launcher"], env)
        return self

    def start_workers(self, code, args=None, env_per_worker=None):
        script = self.tmp / "worker_script.py"
        script.write_text(WORKER_PREAMBLE + textwrap.dedent(code))
        for w in range(self.workers):
            env = dict(self.base_env, DMLC_ROLE="worker")
            env.update((env_per_worker or {}).get(w, {}))
            out = self.tmp / f"worker{w}"
            self._spawn(f"worker{w}", [sys.executable, str(script), json.dumps(args or {}), str(out)], env)
        return self

    def wait(self, names, timeout):
        """Exit codes of the named processes; fails the test if one is still running."""
        deadline = time.time() + timeout
        codes = {}
        for n in names:
            p, _ = self.procs[n]
            try:
                codes[n] = p.wait(max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{n} still running after {timeout} s; logs:\n{self.logs()}")
        return codes

    def worker_names(self):
        return [f"worker{w}" for w in range(self.workers)]

    def server_names(self):
        return ["scheduler"] + [f"server{s}" for s in range(self.servers)]

    def run(self, code, args=None, timeout=60, env_per_worker=None):
        """Starts servers and workers, waits for all, asserts every process exited 0."""
        self.start_servers().start_workers(code, args, env_per_worker)
        codes = self.wait(self.worker_names() + self.server_names(), timeout)
        bad = {n: c for n, c in codes.items() if c != 0}
        assert not bad, f"non-zero exits {bad}; logs:\n{self.logs()}"
        return self

    def log(self, name):
        return self.procs[name][1].read_text()

    def logs(self):
        return "\n".join(f"--- {n} ---\n{self.log(n)[-3000:]}" for n in self.procs)

    def kill(self, name, sig=signal.SIGKILL):
        p, _ = self.procs[name]
        if p.poll() is None:
            p.stop(sig)

    def close(self):
        for n, (p, _) in self.procs.items():
            if p.poll() is None:
                p.stop()
                p.wait(10)


def zmq_curve_keys(secret, role):
    """The ZMQ van's CURVE keypair (Z85 public, secret) of `role` ("server" or "client"), derived
    from the job secret as ps-lite/src/zmq_van.cc derives it."""
    import zmq
    from zmq.utils import z85
    raw = hmac.new(secret.encode(), f"hetu ps zmq curve {role}".encode(), hashlib.sha256).digest()
    secret_z85 = z85.encode(raw)
    return zmq.curve_public(secret_z85), secret_z85


def zmq_plain_password(secret):
    """The ZMQ van's PLAIN password, derived from the job secret as ps-lite/src/zmq_van.cc does."""
    return hmac.new(secret.encode(), b"hetu ps zmq plain password", hashlib.sha256).hexdigest()


def zmq_job_dealer(ctx, port, secret, mechanism="plain"):
    """A DEALER to the van at `port` that authenticates as a member of the job with `secret`."""
    import zmq
    d = ctx.socket(zmq.DEALER)
    d.setsockopt(zmq.LINGER, 2000)
    if mechanism == "curve":
        d.curve_serverkey = zmq_curve_keys(secret, "server")[0]
        d.curve_publickey, d.curve_secretkey = zmq_curve_keys(secret, "client")
    else:
        d.plain_username, d.plain_password = b"hetu", zmq_plain_password(secret).encode()
    d.connect(f"tcp://127.0.0.1:{port}")
    return d


def cluster_fixture(tmp_path):
    """Body of the `cluster` fixture: yields a factory, kills every process afterwards."""
    made = []

    def make(servers, workers, **kw):
        c = Cluster(tmp_path, servers, workers, **kw)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


# Deterministic training data shared by the worker scripts and the NumPy model: keys are
# unsorted with repeats, and a worker may have nothing to push in an iteration.
BATCH_CODE = """
def batch(rank, t, rows, width, dense_shape=(3, 5)):
    rng = np.random.default_rng([12345, rank, t])
    n = int(rng.integers(0, 12))
    keys = rng.integers(0, rows, n).astype(np.int64)
    grads = rng.standard_normal((n, width)).astype(np.float32)
    dgrad = rng.standard_normal(dense_shape).astype(np.float32)
    return keys, grads, dgrad
"""


def optim_config(kind, **kw):
    """A hetu._C.OptimConfig for the NumPy model of a server table."""
    from hetu import _C
    from hetu.ps import OPTIMIZERS
    cfg = _C.OptimConfig()
    cfg.kind = OPTIMIZERS[kind]
    for k, v in kw.items():
        setattr(cfg, k, v)
    return cfg
