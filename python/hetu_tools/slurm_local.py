"""A one-host Slurm cluster in a folder: munged, slurmctld and slurmd started for real, with their
own key, sockets, ports, state and logs, so that a test (or a user trying the Slurm launcher)
submits through Debian's slurm-wlm without touching /etc.

    with LocalSlurm(tmp_dir, cpus=16) as slurm:
        subprocess.run(["sbatch", "--wait", "job.sh"], env=slurm.env)

    python -m hetu_tools.slurm_local DIR   # start one and print the variables a shell needs

The daemons run as root (SlurmUser=root), as on a test host; the node declares `cpus` CPUs (more
than the host has: SlurmdParameters=config_overrides) so that a job's steps fit.
"""
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue", "scancel")
START_TIMEOUT = 30.0


class SlurmUnavailable(Exception):
    """The host cannot run the daemons (not installed, not root)."""


def missing() -> str:
    """Why a local Slurm cannot start here ('' when it can)."""
    absent = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f"/usr/sbin/{d}")]
    if absent:
        return f"not installed: {', '.join(absent)} (Debian: slurm-wlm munge; scripts/install_deps.sh)"
    if os.geteuid() != 0:
        return "the daemons of a local Slurm run as root"
    return ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _daemon(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


class LocalSlurm:
    def __init__(self, folder, cpus: int = 16, memory_mb: int = 4096):
        why = missing()
        if why:
            raise SlurmUnavailable(why)
        self.dir = Path(folder).resolve()
        self.cpus, self.memory_mb = cpus, memory_mb
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.dir / "slurm.conf"
        self.munge_socket = self.dir / "munge" / "socket"
        self.pids = {}

    @property
    def env(self):
        """The environment of a Slurm client (sbatch, srun, squeue) of this cluster."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def log(self, name: str) -> str:
        path = self.dir / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _write_files(self):
        for sub in ("munge", "state", "spool", "log"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.dir / "munge", 0o711)   # munged refuses a socket folder others may write to
        key = self.dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(128))
        os.chmod(key, 0o400)
        d = self.dir
        self.conf.write_text(f"""ClusterName=hetulocal
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={self.munge_socket}
CredType=cred/munge
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/log/slurmctld.log
SlurmdLogFile={d}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
MinJobAge=30
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName=local Nodes={self.node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
""")

    def start(self):
        self._write_files()
        m = self.dir / "munge"
        subprocess.run([_daemon("munged"), "--force", f"--socket={self.munge_socket}", f"--key-file={m}/munge.key",
                        f"--log-file={self.dir}/log/munged.log", f"--pid-file={m}/munged.pid",
                        f"--seed-file={m}/munged.seed"], check=True, capture_output=True, timeout=START_TIMEOUT)
        self.pids["munged"] = m / "munged.pid"
        # -i: ignore state a previous cluster of this folder left; -c: clear it
        subprocess.run([_daemon("slurmctld"), "-c", "-i"], env=self.env, check=True, capture_output=True,
                       timeout=START_TIMEOUT)
        self.pids["slurmctld"] = self.dir / "slurmctld.pid"
        subprocess.run([_daemon("slurmd")], env=self.env, check=True, capture_output=True, timeout=START_TIMEOUT)
        self.pids["slurmd"] = self.dir / "slurmd.pid"
        self._wait_idle()
        return self

    def _wait_idle(self):
        deadline = time.monotonic() + START_TIMEOUT
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sinfo", "--noheader", "--format=%T"], env=self.env, capture_output=True,
                                 text=True, timeout=START_TIMEOUT)
            state = out.stdout.strip() or out.stderr.strip()
            if state == "idle":
                return
            time.sleep(0.3)
        self.stop()
        raise SlurmUnavailable(f"the local Slurm node is not idle after {START_TIMEOUT:g} s (sinfo: {state}); "
                               f"slurmctld log: {self.log('slurmctld')[-500:]} slurmd log: {self.log('slurmd')[-500:]}")

    def stop(self):
        for name in ("slurmd", "slurmctld", "munged"):
            path = self.pids.pop(name, None)
            try:
                pid = int(Path(path).read_text().split()[0]) if path else None
            except (OSError, ValueError, IndexError):
                pid = None
            if pid is None:
                continue
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
            else:
                os.kill(pid, signal.SIGKILL)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m hetu_tools.slurm_local DIR", file=sys.stderr)
        return 2
    try:
        slurm = LocalSlurm(argv[0]).start()
    except SlurmUnavailable as e:
        print(f"slurm_local: {e}", file=sys.stderr)
        return 1
    print(f"export SLURM_CONF={slurm.conf}   # then: sbatch, srun, squeue; stop: kill the daemons' pids in "
          f"{slurm.dir}/*.pid and {slurm.dir}/munge/munged.pid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
