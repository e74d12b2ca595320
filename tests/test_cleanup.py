"""Nothing of a job is left on its host however it dies: its processes, Open MPI's session
folder ($TMPDIR/ompi.HOST.UID/pid.PID) and its shared-memory segments
(/dev/shm/vader_segment.*), after the launcher's --timeout, a kill -9 of mpirun, of a worker or
of a server (the launcher alive), and a kill -9 of the launcher itself (its guard)."""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import jobs
from ps_helpers import needs_mpirun
from hetu.launch.processes import descendants

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "python" / "runner.py"

pytestmark = needs_mpirun

# A worker that has its Open MPI shared-memory segment and a parameter-server node, then waits.
WORKER = textwrap.dedent("""
    import os, time
    import hetu.ps as ps
    from mpi4py import MPI
    MPI.COMM_WORLD.allreduce(1)   # the shared-memory segments exist from here on
    ps.start()
    # Written beside and renamed: the test reads a started file only when it is whole.
    path = os.path.join(os.environ["OUT"], "started." + os.environ["DMLC_WORKER_ID"])
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.replace(path + ".tmp", path)
    time.sleep(300)
""")


def segments_of(pids):
    found = set()
    for pid in pids:
        for line in open(f"/proc/{pid}/maps"):
            fields = line.split()
            if len(fields) == 6 and fields[5].startswith("/dev/shm/vader_segment."):
                found.add(fields[5])
    return found


def process_with(launcher_pid, role):
    for pid in descendants(launcher_pid):
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except OSError:
            continue
        if (role == "mpirun" and comm == "mpirun") or \
                (role == "server" and f"DMLC_ROLE={role}".encode() in environ and comm.startswith("python")):
            return pid
    raise AssertionError(f"no {role} below the launcher")


def alive(pid):
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


WAYS = ["timeout", "mpirun", "worker", "server", "launcher"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("way", WAYS)
def test_nothing_of_the_job_is_left_however_it_dies(tmp_path, way):
    tmp = tmp_path / "tmp"   # the launcher's work folder and Open MPI's session folder go here
    tmp.mkdir()
    env = dict(os.environ, OUT=str(tmp_path), TMPDIR=str(tmp))
    timeout = ["--timeout", "12"] if way == "timeout" else []
    log = open(tmp_path / "launcher.log", "w")
    with jobs.Job([sys.executable, str(RUNNER), "-w", "2", "-s", "1", "--kill-grace", "2", *timeout,
                   sys.executable, "-c", WORKER], stdout=log, stderr=subprocess.STDOUT, env=env,
                  cwd=tmp_path) as launcher:
        log.close()
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started.[0-9]"))) < 2:
            assert launcher.poll() is None and time.monotonic() < deadline, (tmp_path / "launcher.log").read_text()
            time.sleep(0.1)
        workers = [int(p.read_text()) for p in tmp_path.glob("started.[0-9]")]
        job = descendants(launcher.pid)
        segments = segments_of(workers)
        sessions = list(tmp.glob("ompi.*/pid.*"))
        assert segments and sessions, (segments, list(tmp.rglob("*"))[:20])
        victim = {"mpirun": lambda: process_with(launcher.pid, "mpirun"), "worker": lambda: workers[1],
                  "server": lambda: process_with(launcher.pid, "server"), "launcher": lambda: launcher.pid,
                  "timeout": lambda: None}[way]()
        if victim:
            os.kill(victim, signal.SIGKILL)
        ended = time.monotonic()
        launcher.wait(timeout=60)
        # The launcher removes them before it exits; its guard, once the launcher is gone.
        limit = 15 if way == "launcher" else 0
        while time.monotonic() - ended < limit and (any(map(alive, job)) or any(map(os.path.exists, segments))
                                                     or any(s.exists() for s in sessions)):
            time.sleep(0.1)
    text = (tmp_path / "launcher.log").read_text()
    expected = {"timeout": 124, "launcher": -signal.SIGKILL}.get(way, 1)
    assert launcher.returncode == expected, text[-3000:]
    assert [p for p in job if alive(p)] == [], text[-3000:]
    assert [s for s in segments if os.path.exists(s)] == [], f"Open MPI's shared-memory segments are left\n{text[-3000:]}"
    assert [s for s in sessions if s.exists()] == [], f"Open MPI's session folder is left\n{text[-3000:]}"
    assert not list(tmp.glob("heturun-*")), "the launcher's work folder is left"
