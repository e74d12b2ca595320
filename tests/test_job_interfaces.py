"""A job listens only on its own interfaces: in a one-host job the workers' MPI runs on shared
memory (`btl self,vader`, no TCP listener) and every listener of the job's processes is on
loopback, but for what README and ps-lite/README.md (Security) name: mpirun's PMIx tool
rendezvous, which Open MPI 4.1 opens on every address."""
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import jobs
from ps_helpers import needs_mpirun
from hetu.launch.cluster import local_cluster
from hetu.launch.mpirun import mpi_interface_options
from hetu.launch.processes import descendants

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ROOT / "python" / "runner.py"

# A worker with everything that listens: MPI initialized and used, a parameter-server node.
WORKER = textwrap.dedent("""
    import os, time
    import hetu.ps as ps
    from mpi4py import MPI
    MPI.COMM_WORLD.allreduce(1)
    ps.start()
    rank = os.environ["DMLC_WORKER_ID"]
    open(os.path.join(os.environ["OUT"], "started." + rank), "w").write(str(os.getpid()))
    while not os.path.exists(os.path.join(os.environ["OUT"], "go")):
        time.sleep(0.05)
    MPI.COMM_WORLD.allreduce(1)
    ps.finalize()
""")


def listening_sockets():
    """inode -> "ADDRESS:PORT" of every TCP socket listening in this network namespace."""
    out = {}
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A":   # TCP_LISTEN
                continue
            hex_addr, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_addr)
            # /proc writes the address as 32-bit words in host (little-endian) order.
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            addr = socket.inet_ntop(family, raw)
            out[int(fields[9])] = (f"[{addr}]" if family == socket.AF_INET6 else addr) + f":{int(hex_port, 16)}"
    return out


def listeners_of(pids):
    """(process name, pid, "ADDRESS:PORT") of the sockets these processes listen on."""
    listening, found = listening_sockets(), []
    for pid in pids:
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in listening:
                found.append((name, pid, listening[int(target[8:-1])]))
    return sorted(set(found))


def test_a_one_host_job_runs_mpi_on_shared_memory_and_loopback():
    options = mpi_interface_options(local_cluster(2, 1), "127.0.0.1", remote=False)
    pairs = dict(zip(options[1::3], options[2::3]))
    assert pairs == {"btl": "self,vader", "btl_tcp_if_include": "lo", "oob_tcp_if_include": "lo"}, options
    cluster = local_cluster(2, 1)
    cluster.mpirun_args = ["--mca", "btl", "self,tcp"]   # the cluster file's own choice wins
    assert "self,vader" not in mpi_interface_options(cluster, "127.0.0.1", remote=False)


@pytest.mark.timeout(120)
@needs_mpirun
def test_the_jobs_listeners_are_on_loopback_but_mpiruns_pmix_rendezvous(tmp_path):
    env = dict(os.environ, OUT=str(tmp_path))
    with jobs.Job([sys.executable, str(RUNNER), "-w", "2", "-s", "1", "--timeout", "90", sys.executable, "-c",
                   WORKER], env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                  text=True) as job:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("started.*"))) < 2:
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.1)
        workers = {int(p.read_text()) for p in tmp_path.glob("started.*")}
        listeners = listeners_of(descendants(job.pid))
        (tmp_path / "go").touch()
        out, err = job.communicate(timeout=60)
    assert job.returncode == 0, err[-3000:]
    assert {pid for _, pid, _ in listeners} >= workers, listeners   # each worker's ps-lite node
    wildcard = [entry for entry in listeners if entry[2].startswith(("0.0.0.0:", "[::]:"))]
    # README, ps-lite/README.md (Security): mpirun's PMIx tool rendezvous, one IPv4 and one IPv6
    # port, which no option of Open MPI 4.1 restricts.
    assert all(name == "mpirun" for name, _, _ in wildcard) and len(wildcard) <= 2, listeners
    others = [entry for entry in listeners if entry not in wildcard]
    assert all(addr.startswith(("127.", "[::1]:")) for _, _, addr in others), listeners
