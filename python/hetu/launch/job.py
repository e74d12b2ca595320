"""One job: starts the scheduler, the servers and the workers, supervises them, stops them."""
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

from .cluster import Cluster, Node, is_local, resolve, root_address
from .guard import MPIRUN_LABEL, LauncherGuard
from .mpirun import (WORKER_SHIM, MpiOutputDemux, MpirunReport, ambient_mpi_settings, given_mca,
                     mpi_interface_options, mpirun_options, pump_mpirun)
from .leftovers import OpenMpiFiles
from .processes import (Proc, describe_status, emit, is_running, kill_snapshot, proc_starttime,
                        processes_with_env, snapshot_tree, start_process)
from .progress import STALL_TIMEOUT_VAR
from .ssh import Ssh, remote_command
from .watchdog import StallWatch
from .. import env
from ..threads import PROCS_VAR, oversubscribed, usable_cores

EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 1, 2, 124
# The scheduler and servers end when every worker has finalized its node, which workers do as
# they exit; workers still running this long after one of them ended were left without it.
END_GRACE = 10.0
# Local variables that remote processes need to find the same interpreter and libraries: a
# relocated Open MPI (an offline bundle's wheel) finds its own files through OPAL_PREFIX, and
# mpi4py its libmpi through MPI4PY_LIBMPI; a rank without them loads another Open MPI where the
# host has one, which fails MPI_Init against this mpirun.
SECRET_VAR = "HETU_JOB_SECRET"
PASSTHROUGH_ENV = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED", "OPAL_PREFIX",
                   "MPI4PY_LIBMPI")
# Settings every process must share, on whichever host it runs: how keys split over the servers,
# and how Herald's colocating allocator trades (each planner computes the allocation on its own).
AGREED_ENV = ("PS_ROW_PLACEMENT", "HETU_PLANNER_TRADE_SHARED")


# A worker's line that reports an error (an exception, ps-lite's peer failures, a refusal).
ERROR_LINE = re.compile(r"\b(\w*Error|\w*Exception|error|failed|dead|cannot|refused|timed out|lost)\b", re.I)


CHECKPOINT_ROOT_VAR = "HETU_CHECKPOINT_ROOT"
CHECKPOINT_FLAGS = ("--checkpoint", "--resume")


def checkpoint_roots(command: List[str], cwd: str) -> List[str]:
    """The checkpoints the job's servers may save and load (ps-lite/README.md, Security):
    HETU_CHECKPOINT_ROOT if set, else the command's --checkpoint and --resume. A server writes
    only into those, their .previous and their saves' .tmp-NAME.* folders beside them; none:
    any folder."""
    if env.raw(CHECKPOINT_ROOT_VAR):
        return [env.raw(CHECKPOINT_ROOT_VAR)]
    roots = []
    for i, arg in enumerate(command):
        flag, eq, value = arg.partition("=")
        if flag not in CHECKPOINT_FLAGS:
            continue
        value = value if eq else (command[i + 1] if i + 1 < len(command) else "")
        if value:
            root = os.path.normpath(os.path.abspath(os.path.join(cwd, value)))
            if root not in roots:
                roots.append(root)
    return roots


class JobFailed(Exception):
    def __init__(self, message, code=EXIT_FAILED):
        super().__init__(message)
        self.code = code


class Job:
    WORKERS_LAUNCHER = "mpirun"   # what starts the workers, as the summary names it
    REMOTE = "over ssh"           # how a command reaches another host, as errors say it
    def __init__(self, cluster: Cluster, command: List[str], timeout: Optional[float],
                 shutdown_timeout: float, kill_grace: float, verbose: bool, stall_timeout: float = 0.0):
        self.cluster, self.command = cluster, command
        self.timeout, self.shutdown_timeout, self.kill_grace = timeout, shutdown_timeout, kill_grace
        self.stall_watch = StallWatch(stall_timeout)
        self.verbose = verbose
        self.procs: List[Proc] = []
        self.workdir = tempfile.mkdtemp(prefix="heturun-")
        self.ssh = Ssh(cluster, self.workdir)
        self.local = {n.host: is_local(n.host) for n in cluster.nodes}
        self.rank_host: Dict[int, str] = {}
        self.mpirun_report = MpirunReport()
        self.worker_last_stderr: Dict[int, str] = {}
        self.interrupted: Optional[int] = None
        self.guard: Optional[LauncherGuard] = None
        # In every process's environment: the guard finds what the job started by it.
        self.job_mark = f"{os.getpid()}-{secrets.token_hex(4)}"
        # The job's secret (ps-lite/README.md, Security): in the environment of the processes
        # started here, written to remote ones' stdin; never on a command line.
        self.secret = secrets.token_hex(32)
        self.t0 = time.monotonic()

    def log(self, message: str):
        emit(sys.stderr, "heturun", message)

    # ---- environment

    def base_env(self, port: int) -> Dict[str, str]:
        env = dict(self.cluster.env)
        env.update(DMLC_PS_ROOT_URI=self.root_uri, DMLC_PS_ROOT_PORT=str(port),
                   DMLC_NUM_WORKER=str(self.cluster.num_workers),
                   DMLC_NUM_SERVER=str(self.cluster.num_servers),
                   DMLC_PS_VAN_TYPE=self.cluster.van,
                   PS_VERBOSE=os.environ.get("PS_VERBOSE", "0"), PYTHONUNBUFFERED="1",
                   HETU_JOB=self.job_mark)
        env.update({k: os.environ[k] for k in AGREED_ENV if k in os.environ})
        return env

    def node_env(self, node: Node) -> Dict[str, str]:
        env = {}
        if node.interface:
            env["DMLC_INTERFACE"] = node.interface
        if len(self.cluster.nodes) > 1:
            # ps-lite would otherwise guess its own address from the first interface it finds.
            env["DMLC_NODE_HOST"] = "127.0.0.1" if self.local[node.host] and \
                self.root_uri == "127.0.0.1" else resolve(node.host)
        return env

    def procs_on_host(self, node: Node) -> int:
        """The job's workers and servers on `node`'s host (a host may be named by several nodes)."""
        return sum(n.workers + n.servers for n in self.cluster.nodes if n.host == node.host)

    def worker_env(self, node: Node) -> Dict[str, str]:
        """Variables for the workers of `node` alone: how many share the host, the Python the
        shim sizes their threads with, and the host's GPUs."""
        env = {"HETU_LOCAL_WORKERS": str(node.workers), PROCS_VAR: str(self.procs_on_host(node)),
               "HETU_PYTHON": node.python or (sys.executable if self.local[node.host] else "python3")}
        if node.gpus > 0:
            env["HETU_GPUS"] = str(node.gpus)   # hetu.dist.devices: worker w takes GPU w mod N
        return env

    def warn_oversubscribed(self):
        """One line per local host with more of the job's processes than usable cores (a remote
        host's cores are its workers' to count: their start line says so)."""
        for host in dict.fromkeys(n.host for n in self.cluster.nodes if self.local[n.host]):
            node = next(n for n in self.cluster.nodes if n.host == host)
            warning = oversubscribed(usable_cores(), self.procs_on_host(node))
            if warning:
                self.log(f"{host}: {warning}")

    # ---- ports

    def free_port(self) -> int:
        chief = self.cluster.chief
        if self.local[chief.host]:
            from hetu.ps import pick_root_port
            return pick_root_port()
        probe = "from hetu.ps import pick_root_port; print(pick_root_port())"
        try:
            out = subprocess.run(self.remote_python(chief, probe), capture_output=True, timeout=30, check=True,
                                 text=True)
            return int(out.stdout.strip())
        except subprocess.TimeoutExpired:
            raise JobFailed(f"timed out (30 s) asking {chief.host} for a free port {self.REMOTE}")
        except (subprocess.CalledProcessError, ValueError) as e:
            err = getattr(e, "stderr", "") or ""
            raise JobFailed(f"cannot get a free port on chief {chief.host} {self.REMOTE}: "
                            f"{err.strip() or e}")

    def remote_python(self, node: Node, code: str) -> List[str]:
        """A command that runs Python `code` on `node`'s host (over ssh)."""
        python = node.python or sys.executable
        return self.ssh.argv(node.host, f"{shlex.quote(python)} -c {shlex.quote(code)}")

    # ---- scheduler and servers

    def launcher_argv(self, node: Node) -> List[str]:
        # HETU_LAUNCHER swaps in another scheduler/server module (tests, other PS builds).
        module = env.raw("HETU_LAUNCHER") or "hetu.launcher"
        return [node.python or sys.executable, "-m", module]

    def start_ps_process(self, node: Node, role: str, rank: Optional[int], env: Dict[str, str]):
        env = {**env, **self.node_env(node), "DMLC_ROLE": role, PROCS_VAR: str(self.procs_on_host(node))}
        if role == "server":
            env["DMLC_SERVER_ID"] = str(rank)   # the rank its output is tagged with is its rank in the job
            roots = checkpoint_roots(self.command, os.getcwd())
            if roots:
                env[CHECKPOINT_ROOT_VAR] = os.pathsep.join(roots)
            if node.server_threads:
                env["HETU_NUM_THREADS"] = str(node.server_threads)   # the node's count wins over env:
        tag = role if rank is None else f"{role} {rank}"
        argv, full_env, over_ssh = self.ps_command(node, role, rank, env)
        if self.verbose:
            self.log(f"starting {tag} on {node.host}: {' '.join(map(shlex.quote, argv))}")
        proc = start_process(role, rank, node.host, argv, full_env, tag)
        if over_ssh:
            proc.popen.stdin.write((self.secret + "\n").encode())   # the remote line's first read
            proc.popen.stdin.flush()
        else:
            self._close_stdin(proc)   # only remote watchdogs need the pipe held open
        self.add_process(proc)

    def ps_command(self, node: Node, role: str, rank: Optional[int], env: Dict[str, str]):
        """(argv, its environment, whether it goes over ssh) of a scheduler or server: the
        launcher module itself on this host, an ssh line elsewhere."""
        if self.local[node.host]:
            return self.launcher_argv(node), {**os.environ, **env, SECRET_VAR: self.secret}, False
        passthrough = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
        line = remote_command(os.getcwd(), {**passthrough, **env}, self.launcher_argv(node), secret_var=SECRET_VAR)
        return self.ssh.argv(node.host, line), dict(os.environ), True

    def start_parameter_servers(self, env):
        if self.cluster.num_servers == 0:
            return
        self.start_ps_process(self.cluster.chief, "scheduler", None, env)
        rank = 0
        for node in self.cluster.nodes:
            for _ in range(node.servers):
                self.start_ps_process(node, "server", rank, env)
                rank += 1

    # ---- workers

    def worker_nodes(self) -> List[Node]:
        """Nodes with workers, chief first, so rank 0 sits next to the scheduler."""
        nodes = [n for n in self.cluster.nodes if n.workers]
        return sorted(nodes, key=lambda n: not n.chief)

    def mpirun_argv(self, env: Dict[str, str]) -> List[str]:
        remote = any(not self.local[n.host] for n in self.cluster.nodes)
        argv = mpirun_options(self.ssh.config if remote else None, given_mca(self.cluster.mpirun_args)) + \
            mpi_interface_options(self.cluster, self.root_uri, remote, self.log) + self.cluster.mpirun_args
        shared = {**{k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ},
                  **env, "DMLC_ROLE": "worker", **self.stall_env()}
        contexts = []
        for node in self.worker_nodes():
            # One MPI app context per node: the ranks of a context are contiguous, and each can
            # carry its own node-specific variables.
            assigns = [f"{k}={v}" for k, v in {**shared, **self.node_env(node),
                                                **self.worker_env(node)}.items()]
            host = "localhost" if self.local[node.host] else node.host
            # -x: the secret's name only, its value is in mpirun's environment; given in every
            # context, since Open MPI applies a -x before the first one to that context alone.
            contexts.append(["-np", str(node.workers), "--host", f"{host}:{node.workers}", "-x", SECRET_VAR,
                             "env", *assigns, "/bin/sh", "-c", WORKER_SHIM, "hetu-worker",
                             *self.command])
            first = len(self.rank_host)
            for r in range(first, first + node.workers):
                self.rank_host[r] = node.host
        for i, ctx in enumerate(contexts):
            argv += ([":"] if i else []) + ctx
        return argv

    def stall_env(self) -> Dict[str, str]:
        """The workers' side of the stall watch: how often to report (hetu.launch.progress)."""
        return {STALL_TIMEOUT_VAR: f"{self.stall_watch.timeout:g}"}

    def on_worker_line(self, rank: int, stream: str, line: str):
        if stream == "stderr" and self.stall_watch.is_report(line):
            self.stall_watch.read(rank, line)
            return
        emit(sys.stdout if stream == "stdout" else sys.stderr, f"worker {rank}", line)
        if stream == "stderr" and line.strip():
            self.worker_last_stderr[rank] = line

    def on_mpirun_line(self, line: str, stream):
        self.mpirun_report.read(line)
        emit(stream, "mpirun", line)

    def start_workers(self, env):
        argv = self.mpirun_argv(env)
        if self.verbose:
            self.log("starting workers: " + " ".join(map(shlex.quote, argv)))
        if shutil.which("mpirun") is None:
            raise JobFailed("mpirun not found on PATH (install openmpi-bin)")
        popen = subprocess.Popen(argv, env={**os.environ, **env, SECRET_VAR: self.secret}, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
        proc = Proc(role="workers", rank=None, host=socket.gethostname(), popen=popen)
        for pipe, stream in ((popen.stdout, sys.stdout), (popen.stderr, sys.stderr)):
            demux = MpiOutputDemux(self.on_worker_line,
                                   lambda line, s=stream: self.on_mpirun_line(line, s))
            t = threading.Thread(target=pump_mpirun, args=(pipe, demux), daemon=True)
            t.start()
            proc.threads.append(t)
        self.add_process(proc)
        return proc

    # ---- supervision

    def add_process(self, proc: Proc):
        self.procs.append(proc)
        if self.guard is not None:
            self.guard.started(proc.popen.pid, proc.label if proc.role != "workers" else MPIRUN_LABEL)

    def describe_failure(self, proc: Proc) -> str:
        rc = proc.returncode
        if proc.role != "workers":
            hint = ""
            if rc == 255 and not self.local.get(proc.host, True):
                hint = "; 255 is also ssh's own status when it cannot reach or log in to the host"
            return f"{proc.label} on {proc.host} failed ({describe_status(rc)}{hint})"
        for t in proc.threads:   # mpirun's own report names the rank; let it be read
            t.join(timeout=5)
        r = self.mpirun_report.failed_rank
        if r is not None:
            return (f"worker {r} on {self.rank_host.get(r, '?')} failed "
                    f"({self.mpirun_report.failed_status or describe_status(rc)})")
        ambient = ambient_mpi_settings()
        hint = f"; this environment sets {', '.join(ambient)}, which Open MPI reads" if ambient else ""
        return f"mpirun (all workers) failed ({describe_status(rc)}{hint})"

    def check_guard(self):
        if self.guard is not None and not self.guard.lost and self.guard.popen.poll() is not None:
            self.guard.lost = True
            self.log(f"warning: the launcher's guard (pid {self.guard.popen.pid}) ended "
                     f"({describe_status(self.guard.popen.returncode)}): if this launcher dies now, "
                     "its job runs on")

    def check_deadline(self):
        self.check_guard()
        if self.timeout is not None and time.monotonic() - self.t0 > self.timeout:
            running = ", ".join(p.label for p in self.procs if p.poll() is None)
            raise JobFailed(f"job timed out after {self.timeout:g} s (--timeout); still "
                            f"running: {running or 'none'}", EXIT_TIMEOUT)
        if self.interrupted is not None:
            name = signal.Signals(self.interrupted).name
            raise JobFailed(f"interrupted by {name}; stopping all processes",
                            128 + self.interrupted)

    def wait_workers(self, mpirun: Proc):
        while True:
            self.check_deadline()
            for p in self.procs:
                rc = p.poll()
                if rc is not None and rc != 0:
                    raise JobFailed(self.describe_failure(p))
            if mpirun.poll() == 0:
                return
            self.check_ended_early(mpirun)
            self.check_progress()
            time.sleep(0.05)

    def check_progress(self):
        paused = self.stall_watch.paused()
        if paused is not None and self.stall_watch.timeout > 0:
            self.log(f"this launcher was paused for {paused:.0f} s (SIGSTOP, or its terminal or machine suspended) "
                     f"while the workers' reports waited in its pipes: its stall watch (--stall-timeout) starts "
                     f"again now")
        stall = self.stall_watch.stalled(self.rank_host)
        if stall:
            raise JobFailed(f"no training progress for {self.stall_watch.timeout:g} s (--stall-timeout): {stall}")

    def check_ended_early(self, mpirun: Proc):
        """A scheduler or server that ended (even with 0) while the workers go on fails the job."""
        for p in self.procs:
            if p is not mpirun and p.returncode is not None and mpirun.poll() is None \
                    and time.monotonic() - p.ended > END_GRACE:
                p.ended_early = True
                raise JobFailed(f"{p.label} on {p.host} ended ({describe_status(p.returncode)}) before the "
                                f"workers, which still ran {END_GRACE:g} s later")

    def wait_shutdown(self):
        deadline = time.monotonic() + self.shutdown_timeout
        while time.monotonic() < deadline:
            self.check_deadline()
            pending = [p for p in self.procs if p.poll() is None]
            failed = [p for p in self.procs if p.returncode not in (None, 0)]
            if failed:
                raise JobFailed(self.describe_failure(failed[0]))
            if not pending:
                return
            time.sleep(0.05)
        names = ", ".join(f"{p.label} on {p.host}" for p in self.procs if p.poll() is None)
        raise JobFailed(f"workers finished but {names} did not exit within "
                        f"{self.shutdown_timeout:g} s (--shutdown-timeout); killed")

    def teardown(self):
        """Stop everything still running: the signal first, SIGKILL after a grace period, and
        SIGKILL for any descendant left behind (mpirun's workers have their own groups) and any
        local process with the job's mark (a worker whose mpirun was killed has left the tree).
        Then remove Open MPI's files of the job (leftovers.py), which stay when mpirun or a rank
        died by a signal."""
        live = [p for p in self.procs if p.poll() is None]
        marked = [pid for pid in processes_with_env(f"HETU_JOB={self.job_mark}") if pid != os.getpid()]
        tree = {pid: proc_starttime(pid) for pid in marked}
        tree.update(snapshot_tree([p.popen.pid for p in live] + marked))
        mpi_files = OpenMpiFiles(p.popen.pid for p in self.procs if p.role == "workers")
        mpi_files.note(tree)
        sig = self.interrupted or signal.SIGTERM
        for p in live:
            self._close_stdin(p)   # remote watchdogs stop their command on EOF
            p.signal_group(sig)
        kill_snapshot({pid: tree[pid] for pid in marked}, sig)
        deadline = time.monotonic() + self.kill_grace
        while time.monotonic() < deadline and (any(p.poll() is None for p in live)
                                               or any(is_running(pid, tree[pid]) for pid in marked)):
            time.sleep(0.05)
        for p in live:
            if p.poll() is None:
                p.signal_group(signal.SIGKILL)
        kill_snapshot(tree, signal.SIGKILL)
        for p in live:
            try:
                p.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.log(f"{p.label} (pid {p.popen.pid}) did not die after SIGKILL")
            p.poll()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(is_running(pid, start) for pid, start in tree.items()):
            time.sleep(0.05)   # a file is removed once no process of the job writes it again
        mpi_files.remove()

    @staticmethod
    def _close_stdin(p: Proc):
        if p.popen.stdin is None:
            return
        try:
            p.popen.stdin.close()
        except (OSError, ValueError):
            pass

    def blames(self, rank: int, line: str) -> bool:
        """Whether a worker's last stderr line is worth repeating as its error: the line of the
        worker that failed first (unless a signal ended it: then it wrote no error), and any
        line that reads as an error. Ranks stopped because another failed may have last written
        an info line, which is no error of theirs."""
        first = self.mpirun_report.failed_rank
        if rank == first and not (self.mpirun_report.failed_status or "").startswith("killed"):
            return True
        return first is None or ERROR_LINE.search(line) is not None

    def summary(self):
        self.log("summary:")
        for p in self.procs:
            end = p.ended if p.ended is not None else time.monotonic()
            n = self.cluster.num_workers
            label = p.label if p.role != "workers" else \
                (f"worker 0 ({self.WORKERS_LAUNCHER})" if n == 1 else f"workers 0-{n - 1} ({self.WORKERS_LAUNCHER})")
            self.log(f"  {label:<24} {p.host:<16} {describe_status(p.returncode):<20} "
                     f"{end - p.started:8.2f} s")
            if p.ended_early:
                self.log("      ended before the workers")
            if p.returncode in (None, 0):
                continue
            if p.role != "workers":
                if p.last_stderr:
                    self.log(f"      {p.last_stderr.strip()}")
                continue
            by_line: Dict[str, List[int]] = {}
            for rank, line in sorted(self.worker_last_stderr.items()):
                if self.blames(rank, line):
                    by_line.setdefault(line.strip(), []).append(rank)
            for line, ranks in by_line.items():
                self.log(f"      worker {','.join(map(str, ranks))}: {line}")

    def run(self) -> int:
        try:
            # First: from now on, a launcher that dies takes its job with it.
            self.guard = LauncherGuard(self.kill_grace, socket.gethostname(), f"HETU_JOB={self.job_mark}")
            self.guard.owns(self.workdir)
            self.root_uri = root_address(self.cluster)
            env = self.base_env(self.free_port())
            self.warn_oversubscribed()
            self.start_parameter_servers(env)
            mpirun = self.start_workers(env)
            self.wait_workers(mpirun)
            self.wait_shutdown()
            code = 0
        except JobFailed as e:
            self.log(f"error: {e}")
            code = e.code
        finally:
            self.teardown()
            for p in self.procs:
                for t in p.threads:
                    t.join(timeout=5)
            shutil.rmtree(self.workdir, ignore_errors=True)
            if self.guard is not None:
                self.guard.close()
        self.summary()
        return code


