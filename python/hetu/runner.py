"""heturun: start a hetu job (scheduler, servers, workers) from a cluster file.

    python python/runner.py -c examples/config/local.yml python examples/ctr/run_hetu.py ...
    python python/runner.py -w 2 -s 1 python examples/ctr/run_hetu.py ...

Scheduler and servers run as ``python -m hetu.launcher`` (locally as child processes, on other
hosts over ssh); all workers run under one ``mpirun`` so that mpi4py's COMM_WORLD spans them and
the worker id equals the MPI rank. Every output line is tagged with role and rank. The first
process that fails ends the whole job, and the exit message names it.

Exit status: 0 all workers succeeded and the servers shut down; 1 a process failed (or servers
did not shut down in time); 2 bad usage or cluster file; 124 the --timeout elapsed;
128+signal when interrupted.
"""
import argparse
import ipaddress
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import yaml

NODE_KEYS = {"host", "servers", "workers", "chief", "ssh_port", "user", "python", "interface"}
TOP_KEYS = {"nodes", "env", "van", "ssh_config", "mpirun_args"}
VANS = {"zmq", "ucx"}  # ucx: RDMA verbs where the hosts have them, else shared memory / TCP
EXIT_FAILED, EXIT_USAGE, EXIT_TIMEOUT = 1, 2, 124

# The worker shim turns the MPI rank into the ps-lite worker id; `exec` keeps the worker's pid
# equal to the one mpirun tracks, so mpirun's signals and exit codes reach the real process.
# It also splits the host's cores among the workers on it: several workers each running BLAS and
# kernel threads for every core spin against each other (a 2-core host with 2 workers ran 40x
# slower). Variables the user set are kept.
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "HETU_NUM_THREADS")
WORKER_SHIM = ('export DMLC_WORKER_ID="$OMPI_COMM_WORLD_RANK"; '
               't=$(( $(nproc) / HETU_LOCAL_WORKERS )); [ "$t" -ge 1 ] || t=1; '
               f'for v in {" ".join(THREAD_VARS)}; do '
               '[ -n "$(printenv $v)" ] || export "$v=$t"; done; exec "$@"')
# Local variables that remote workers need to find the same interpreter and libraries.
PASSTHROUGH_ENV = ("PATH", "PYTHONPATH", "LD_LIBRARY_PATH", "VIRTUAL_ENV", "PYTHONUNBUFFERED")


class ConfigError(Exception):
    """A cluster file or command line that cannot describe a job."""


# --------------------------------------------------------------------------- cluster description

@dataclass
class Node:
    host: str
    servers: int = 0
    workers: int = 0
    chief: bool = False
    ssh_port: Optional[int] = None
    user: Optional[str] = None
    python: Optional[str] = None
    interface: Optional[str] = None


@dataclass
class Cluster:
    nodes: List[Node]
    env: Dict[str, str] = field(default_factory=dict)
    van: str = "zmq"
    ssh_config: Optional[str] = None
    mpirun_args: List[str] = field(default_factory=list)

    @property
    def chief(self) -> Node:
        return next(n for n in self.nodes if n.chief)

    @property
    def num_workers(self) -> int:
        return sum(n.workers for n in self.nodes)

    @property
    def num_servers(self) -> int:
        return sum(n.servers for n in self.nodes)


def _count(raw, key, where):
    value = raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{where}: '{key}' must be an integer, got {value!r}")
    if value < 0:
        raise ConfigError(f"{where}: '{key}' must not be negative, got {value}")
    return value


def _parse_node(raw, index, source) -> Node:
    where = f"{source}: nodes[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping with 'host', got {raw!r}")
    host = raw.get("host")
    if isinstance(host, str) and host.strip():
        where = f"{where} (host {host})"
    unknown = sorted(set(raw) - NODE_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(unknown)} "
                          f"(allowed: {', '.join(sorted(NODE_KEYS))})")
    if not isinstance(host, str) or not host.strip():
        raise ConfigError(f"{where}: missing 'host'")
    chief = raw.get("chief", False)
    if not isinstance(chief, bool):
        raise ConfigError(f"{where}: 'chief' must be true or false, got {chief!r}")
    port = raw.get("ssh_port")
    if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                             or not 0 < port < 65536):
        raise ConfigError(f"{where}: 'ssh_port' must be a port number, got {port!r}")
    for key in ("user", "python", "interface"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ConfigError(f"{where}: '{key}' must be a string, got {raw[key]!r}")
    return Node(host=host.strip(), servers=_count(raw, "servers", where),
                workers=_count(raw, "workers", where), chief=chief, ssh_port=port,
                user=raw.get("user"), python=raw.get("python"), interface=raw.get("interface"))


def _check_cluster(nodes: List[Node], source):
    chiefs = [n.host for n in nodes if n.chief]
    if not chiefs:
        raise ConfigError(f"{source}: no node has 'chief: true' (exactly one node must be the chief; "
                          "the scheduler runs there)")
    if len(chiefs) > 1:
        raise ConfigError(f"{source}: more than one chief: {', '.join(chiefs)} (exactly one node must "
                          "have 'chief: true')")
    if sum(n.workers for n in nodes) == 0:
        raise ConfigError(f"{source}: zero workers in total: at least one node needs 'workers' > 0")
    hosts = [n.host for n in nodes]
    dup = sorted({h for h in hosts if hosts.count(h) > 1})
    if dup:
        raise ConfigError(f"{source}: host listed more than once: {', '.join(dup)} "
                          "(put all its servers and workers on one node entry)")


def parse_cluster(data, source="cluster file") -> Cluster:
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping with 'nodes', got {type(data).__name__}")
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise ConfigError(f"{source}: unknown top-level key(s) {', '.join(unknown)} "
                          f"(allowed: {', '.join(sorted(TOP_KEYS))})")
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError(f"{source}: 'nodes' must be a non-empty list")
    nodes = [_parse_node(raw, i, source) for i, raw in enumerate(raw_nodes)]
    _check_cluster(nodes, source)
    env = data.get("env") or {}
    if not isinstance(env, dict):
        raise ConfigError(f"{source}: 'env' must be a mapping of NAME: value")
    van = data.get("van", "zmq")
    if van not in VANS:
        raise ConfigError(f"{source}: 'van' must be one of {', '.join(sorted(VANS))}, got {van!r}")
    mpirun_args = data.get("mpirun_args") or []
    if not isinstance(mpirun_args, list) or not all(isinstance(a, str) for a in mpirun_args):
        raise ConfigError(f"{source}: 'mpirun_args' must be a list of strings")
    ssh_config = data.get("ssh_config")
    if ssh_config is not None and not os.path.isfile(str(ssh_config)):
        raise ConfigError(f"{source}: 'ssh_config' file not found: {ssh_config}")
    return Cluster(nodes=nodes, env={str(k): str(v) for k, v in env.items()}, van=van,
                   ssh_config=os.path.abspath(ssh_config) if ssh_config else None,
                   mpirun_args=mpirun_args)


def load_cluster(path) -> Cluster:
    try:
        with open(path) as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise ConfigError(f"cannot read cluster file {path}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from None
    return parse_cluster(data, source=path)


def local_cluster(workers: int, servers: int) -> Cluster:
    return parse_cluster({"nodes": [{"host": "localhost", "workers": workers,
                                     "servers": servers, "chief": True}]}, source="-w/-s")


# --------------------------------------------------------------------------- hosts and addresses

def is_local(host: str) -> bool:
    """True when `host` names this machine (this network namespace): binding to it succeeds."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return False
    if ipaddress.ip_address(addr).is_loopback:
        return True
    with socket.socket() as s:
        try:
            s.bind((addr, 0))
            return True
        except OSError:
            return False


def resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError:
        raise ConfigError(f"cannot resolve host {host!r}") from None


def root_address(cluster: Cluster) -> str:
    """The address every node uses to reach the scheduler on the chief."""
    chief = cluster.chief
    remote = [n.host for n in cluster.nodes if not is_local(n.host)]
    addr = resolve(chief.host)
    loopback = [n.host for n in cluster.nodes if ipaddress.ip_address(resolve(n.host)).is_loopback]
    if remote and loopback:
        raise ConfigError(f"host {loopback[0]!r} is a loopback name but nodes "
                          f"{', '.join(remote)} are remote: name it by an address they can reach")
    return "127.0.0.1" if not remote and is_local(chief.host) else addr


# --------------------------------------------------------------------------- ssh

class Ssh:
    """ssh command lines for the cluster's remote hosts, through one generated config file, so
    the runner and mpirun's daemons use the same ports, users and options."""

    def __init__(self, cluster: Cluster, workdir: str):
        self.config = os.path.join(workdir, "ssh_config")
        with open(self.config, "w") as f:
            f.write(self._config_text(cluster))

    @staticmethod
    def _config_text(cluster: Cluster) -> str:
        lines = []
        for n in cluster.nodes:
            if n.ssh_port or n.user:
                lines.append(f"Host {n.host}")
                lines += [f"  Port {n.ssh_port}"] if n.ssh_port else []
                lines += [f"  User {n.user}"] if n.user else []
        # Later files only fill in what the per-node blocks above left unset.
        lines.append("Match all")
        user_config = cluster.ssh_config or os.path.expanduser("~/.ssh/config")
        if os.path.isfile(user_config):
            lines.append(f"  Include {user_config}")
        lines += ["  BatchMode yes", "  ConnectTimeout 10", "  ServerAliveInterval 5",
                  "  ServerAliveCountMax 3"]
        return "\n".join(lines) + "\n"

    def argv(self, host: str, remote_command: str) -> List[str]:
        return ["ssh", "-F", self.config, "-o", "BatchMode=yes", host, remote_command]


def remote_command(cwd: str, env: Dict[str, str], argv: List[str]) -> str:
    """A shell line that runs argv on a remote host and kills it when the local ssh goes away.

    Closing ssh does not signal a remote command without a tty, so a watchdog waits for EOF on
    the session's stdin (the runner holds the other end) and terminates the command then.
    """
    assigns = " ".join(f"{k}={shlex.quote(v)}" for k, v in env.items())
    cmd = " ".join(shlex.quote(a) for a in argv)
    # Background jobs of a non-interactive shell read /dev/null, so the watchdog gets the
    # session's stdin through fd 3 explicitly.
    return (f"cd {shlex.quote(cwd)} && exec 3<&0 && {{ env {assigns} {cmd} 3<&- & p=$!; "
            f"{{ cat <&3 >/dev/null; kill -TERM $p; sleep 5; kill -KILL $p; }} "
            f">/dev/null 2>&1 & w=$!; exec 3<&-; wait $p; rc=$?; kill $w 2>/dev/null; "
            f"exit $rc; }}")


# --------------------------------------------------------------------------- processes

_print_lock = threading.Lock()


def _emit(stream, tag: str, line: str):
    with _print_lock:
        stream.write(f"[{tag}] {line}\n")
        stream.flush()


def _pump(pipe, stream, tag: str, on_line=None):
    """Copy a child's output line by line with a tag; runs in its own thread."""
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace").rstrip("\r\n")
        _emit(stream, tag, line)
        if on_line is not None and line.strip():
            on_line(line)
    pipe.close()


def _proc_starttime(pid: int) -> Optional[str]:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _children_map() -> Dict[int, List[int]]:
    tree: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> List[int]:
    """All processes below pid. mpirun puts each worker in its own process group, so killing
    mpirun's group is not enough when mpirun itself is stuck."""
    tree, out, todo = _children_map(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


@dataclass
class Proc:
    role: str                       # scheduler | server | workers (the mpirun of all workers)
    rank: Optional[int]
    host: str
    popen: subprocess.Popen
    started: float = field(default_factory=time.monotonic)
    ended: Optional[float] = None
    returncode: Optional[int] = None
    threads: List[threading.Thread] = field(default_factory=list)
    # The summary repeats it: a long log's tail may no longer show why this process failed.
    last_stderr: str = ""

    @property
    def label(self) -> str:
        return self.role if self.rank is None else f"{self.role} {self.rank}"

    def poll(self) -> Optional[int]:
        if self.returncode is None and self.popen.poll() is not None:
            self.returncode, self.ended = self.popen.returncode, time.monotonic()
        return self.returncode

    def signal_group(self, sig):
        try:
            os.killpg(self.popen.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def start_process(role, rank, host, argv, env, out_tag) -> Proc:
    popen = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, start_new_session=True)
    proc = Proc(role=role, rank=rank, host=host, popen=popen)

    def remember(line):
        proc.last_stderr = line
    for pipe, stream, on_line in ((popen.stdout, sys.stdout, None), (popen.stderr, sys.stderr, remember)):
        t = threading.Thread(target=_pump, args=(pipe, stream, out_tag, on_line), daemon=True)
        t.start()
        proc.threads.append(t)
    return proc


def describe_status(rc: Optional[int]) -> str:
    if rc is None:
        return "running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


# --------------------------------------------------------------------------- the job

_MPI_TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr)>:")
_MPI_FAILED_RANK = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
# "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
_MPI_NOTICED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)(?: \(([^)]*)\))?")
_MPI_EXIT = re.compile(r"Exit code:\s*(-?\d+)")
_MPI_SIGNAL = re.compile(r"Signal:\s*(.+)$")


class MpiOutputDemux:
    """Turns one mpirun pipe written with --tag-output into whole lines per worker.

    mpirun tags each chunk a worker writes, not each line, so a line written in pieces arrives
    as several tagged fragments, possibly interleaved with other ranks' output; fragments are
    joined per (rank, stream) until their newline arrives. Text with no tag is mpirun's own.
    """

    def __init__(self, on_worker_line, on_plain_line):
        self.on_worker_line, self.on_plain_line = on_worker_line, on_plain_line
        self.pending = ""
        self.current = None          # (rank, stream) of the fragment being read
        self.partial: Dict[tuple, str] = {}

    def feed(self, text: str):
        self.pending += text
        while self.pending and self._step():
            pass

    def _step(self) -> bool:
        if self.current is None:
            return self._step_line_start()
        return self._step_fragment()

    def _step_line_start(self) -> bool:
        m = _MPI_TAG.match(self.pending)
        if m:
            self.current = (int(m.group(1)), m.group(2))
            self.pending = self.pending[m.end():]
            return True
        if self._may_become_tag(self.pending):
            return False
        nl = self.pending.find("\n")
        if nl < 0:
            return False
        self.on_plain_line(self.pending[:nl].rstrip("\r"))
        self.pending = self.pending[nl + 1:]
        return True

    def _step_fragment(self) -> bool:
        nl = self.pending.find("\n")
        tag = _MPI_TAG.search(self.pending)
        if tag and (nl < 0 or tag.start() < nl):
            self._append(self.pending[:tag.start()])
            self.pending, self.current = self.pending[tag.start():], None
            return True
        if nl >= 0:
            line = self.partial.pop(self.current, "") + self.pending[:nl]
            self.on_worker_line(self.current[0], self.current[1], line.rstrip("\r"))
            self.pending, self.current = self.pending[nl + 1:], None
            return True
        # Keep a trailing '[' back: it may be the start of the next tag.
        cut = self.pending.rfind("[")
        cut = len(self.pending) if cut < 0 else cut
        self._append(self.pending[:cut])
        self.pending = self.pending[cut:]
        return False

    def _append(self, text: str):
        if text:
            self.partial[self.current] = self.partial.get(self.current, "") + text

    @staticmethod
    def _may_become_tag(text: str) -> bool:
        m = re.fullmatch(r"\[\d*(?:,\d*(?:\](.*))?)?", text, re.S)
        if m is None:
            return False
        rest = m.group(1)
        return rest is None or "<stdout>:".startswith(rest) or "<stderr>:".startswith(rest)

    def close(self):
        if self.pending:
            if self.current is None:
                self.on_plain_line(self.pending)
            else:
                self._append(self.pending)
        self.pending, self.current = "", None
        for (rank, stream), text in sorted(self.partial.items()):
            self.on_worker_line(rank, stream, text)
        self.partial.clear()


def _pump_mpirun(pipe, demux: MpiOutputDemux):
    """Reads raw chunks: a tagged fragment may wait long for its newline."""
    fd = pipe.fileno()
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        demux.feed(data.decode(errors="replace"))
    demux.close()
    pipe.close()


class JobFailed(Exception):
    def __init__(self, message, code=EXIT_FAILED):
        super().__init__(message)
        self.code = code


class Job:
    def __init__(self, cluster: Cluster, command: List[str], timeout: Optional[float],
                 shutdown_timeout: float, kill_grace: float, verbose: bool):
        self.cluster, self.command = cluster, command
        self.timeout, self.shutdown_timeout, self.kill_grace = timeout, shutdown_timeout, kill_grace
        self.verbose = verbose
        self.procs: List[Proc] = []
        self.workdir = tempfile.mkdtemp(prefix="heturun-")
        self.ssh = Ssh(cluster, self.workdir)
        self.local = {n.host: is_local(n.host) for n in cluster.nodes}
        self.rank_host: Dict[int, str] = {}
        self.mpi_failed_rank: Optional[int] = None
        self.worker_last_stderr: Dict[int, str] = {}
        self.mpi_failed_status: Optional[str] = None
        self.interrupted: Optional[int] = None
        self.t0 = time.monotonic()

    def log(self, message: str):
        _emit(sys.stderr, "heturun", message)

    # ---- environment

    def base_env(self, port: int) -> Dict[str, str]:
        env = dict(self.cluster.env)
        env.update(DMLC_PS_ROOT_URI=self.root_uri, DMLC_PS_ROOT_PORT=str(port),
                   DMLC_NUM_WORKER=str(self.cluster.num_workers),
                   DMLC_NUM_SERVER=str(self.cluster.num_servers),
                   DMLC_PS_VAN_TYPE=self.cluster.van,
                   PS_VERBOSE=os.environ.get("PS_VERBOSE", "0"), PYTHONUNBUFFERED="1")
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

    # ---- ports

    def free_port(self) -> int:
        chief = self.cluster.chief
        probe = "from hetu.ps import pick_root_port; print(pick_root_port())"
        if self.local[chief.host]:
            from hetu.ps import pick_root_port
            return pick_root_port()
        python = chief.python or sys.executable
        argv = self.ssh.argv(chief.host, f"{shlex.quote(python)} -c {shlex.quote(probe)}")
        try:
            out = subprocess.run(argv, capture_output=True, timeout=30, check=True, text=True)
            return int(out.stdout.strip())
        except subprocess.TimeoutExpired:
            raise JobFailed(f"timed out (30 s) asking {chief.host} for a free port over ssh")
        except (subprocess.CalledProcessError, ValueError) as e:
            err = getattr(e, "stderr", "") or ""
            raise JobFailed(f"cannot get a free port on chief {chief.host} over ssh: "
                            f"{err.strip() or e}")

    # ---- scheduler and servers

    def launcher_argv(self, node: Node) -> List[str]:
        # HETU_LAUNCHER swaps in another scheduler/server module (tests, other PS builds).
        module = os.environ.get("HETU_LAUNCHER", "hetu.launcher")
        return [node.python or sys.executable, "-m", module]

    def start_ps_process(self, node: Node, role: str, rank: Optional[int], env: Dict[str, str]):
        env = {**env, **self.node_env(node), "DMLC_ROLE": role}
        tag = role if rank is None else f"{role} {rank}"
        if self.local[node.host]:
            argv, full_env = self.launcher_argv(node), {**os.environ, **env}
        else:
            passthrough = {k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ}
            line = remote_command(os.getcwd(), {**passthrough, **env}, self.launcher_argv(node))
            argv, full_env = self.ssh.argv(node.host, line), dict(os.environ)
        if self.verbose:
            self.log(f"starting {tag} on {node.host}: {' '.join(map(shlex.quote, argv))}")
        proc = start_process(role, rank, node.host, argv, full_env, tag)
        if self.local[node.host]:
            self._close_stdin(proc)   # only remote watchdogs need the pipe held open
        self.procs.append(proc)

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
        # yield_when_idle: oversubscribed ranks waiting in a collective must not spin on a core
        # that the parameter server or another rank needs.
        argv = ["mpirun", "--oversubscribe", "--bind-to", "none", "--tag-output",
                "--mca", "mpi_yield_when_idle", "1"]
        if os.geteuid() == 0:
            argv.append("--allow-run-as-root")
        if any(not self.local[n.host] for n in self.cluster.nodes):
            argv += ["--mca", "plm_rsh_agent", "ssh",
                     "--mca", "plm_rsh_args", f"-F {self.ssh.config}"]
        argv += self.cluster.mpirun_args
        shared = {**{k: os.environ[k] for k in PASSTHROUGH_ENV if k in os.environ},
                  **env, "DMLC_ROLE": "worker"}
        contexts = []
        for node in self.worker_nodes():
            # One MPI app context per node: the ranks of a context are contiguous, and each can
            # carry its own node-specific variables.
            assigns = [f"{k}={v}" for k, v in {**shared, **self.node_env(node),
                                                "HETU_LOCAL_WORKERS": str(node.workers)}.items()]
            host = "localhost" if self.local[node.host] else node.host
            contexts.append(["-np", str(node.workers), "--host", f"{host}:{node.workers}",
                             "env", *assigns, "/bin/sh", "-c", WORKER_SHIM, "hetu-worker",
                             *self.command])
            first = len(self.rank_host)
            for r in range(first, first + node.workers):
                self.rank_host[r] = node.host
        for i, ctx in enumerate(contexts):
            argv += ([":"] if i else []) + ctx
        return argv

    def on_worker_line(self, rank: int, stream: str, line: str):
        _emit(sys.stdout if stream == "stdout" else sys.stderr, f"worker {rank}", line)
        if stream == "stderr" and line.strip():
            self.worker_last_stderr[rank] = line

    def on_mpirun_line(self, line: str, stream):
        m = _MPI_FAILED_RANK.search(line)
        if m and self.mpi_failed_rank is None:
            self.mpi_failed_rank = int(m.group(1))
        m = _MPI_NOTICED.search(line)
        if m and self.mpi_failed_rank is None:
            self.mpi_failed_rank = int(m.group(1))
            self.mpi_failed_status = f"killed by signal {m.group(2)}" + (f" ({m.group(3)})" if m.group(3) else "")
        for pattern, fmt in ((_MPI_EXIT, "exit {}"), (_MPI_SIGNAL, "killed by {}")):
            m = pattern.search(line)
            if m and self.mpi_failed_status is None:
                self.mpi_failed_status = fmt.format(m.group(1).strip())
        _emit(stream, "mpirun", line)

    def start_workers(self, env):
        argv = self.mpirun_argv(env)
        if self.verbose:
            self.log("starting workers: " + " ".join(map(shlex.quote, argv)))
        if shutil.which("mpirun") is None:
            raise JobFailed("mpirun not found on PATH (install openmpi-bin)")
        popen = subprocess.Popen(argv, env={**os.environ, **env}, stdin=subprocess.DEVNULL,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
        proc = Proc(role="workers", rank=None, host=socket.gethostname(), popen=popen)
        for pipe, stream in ((popen.stdout, sys.stdout), (popen.stderr, sys.stderr)):
            demux = MpiOutputDemux(self.on_worker_line,
                                   lambda line, s=stream: self.on_mpirun_line(line, s))
            t = threading.Thread(target=_pump_mpirun, args=(pipe, demux), daemon=True)
            t.start()
            proc.threads.append(t)
        self.procs.append(proc)
        return proc

    # ---- supervision

    def describe_failure(self, proc: Proc) -> str:
        rc = proc.returncode
        if proc.role != "workers":
            hint = ""
            if rc == 255 and not self.local.get(proc.host, True):
                hint = "; 255 is also ssh's own status when it cannot reach or log in to the host"
            return f"{proc.label} on {proc.host} failed ({describe_status(rc)}{hint})"
        for t in proc.threads:   # mpirun's own report names the rank; let it be read
            t.join(timeout=5)
        if self.mpi_failed_rank is not None:
            r = self.mpi_failed_rank
            return (f"worker {r} on {self.rank_host.get(r, '?')} failed "
                    f"({self.mpi_failed_status or describe_status(rc)})")
        return f"mpirun (all workers) failed ({describe_status(rc)})"

    def check_deadline(self):
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
            if mpirun.returncode == 0:
                return
            time.sleep(0.05)

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
        SIGKILL for any descendant left behind (mpirun's workers have their own groups)."""
        live = [p for p in self.procs if p.poll() is None]
        tree = {}
        for p in live:
            tree.update({pid: _proc_starttime(pid) for pid in descendants(p.popen.pid)})
        sig = self.interrupted or signal.SIGTERM
        for p in live:
            self._close_stdin(p)   # remote watchdogs stop their command on EOF
            p.signal_group(sig)
        deadline = time.monotonic() + self.kill_grace
        while time.monotonic() < deadline and any(p.poll() is None for p in live):
            time.sleep(0.05)
        for p in live:
            if p.poll() is None:
                p.signal_group(signal.SIGKILL)
        for pid, start in tree.items():
            if start is not None and _proc_starttime(pid) == start:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in live:
            try:
                p.popen.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.log(f"{p.label} (pid {p.popen.pid}) did not die after SIGKILL")
            p.poll()

    @staticmethod
    def _close_stdin(p: Proc):
        if p.popen.stdin is None:
            return
        try:
            p.popen.stdin.close()
        except (OSError, ValueError):
            pass

    def summary(self):
        self.log("summary:")
        for p in self.procs:
            end = p.ended if p.ended is not None else time.monotonic()
            n = self.cluster.num_workers
            label = p.label if p.role != "workers" else \
                ("worker 0 (mpirun)" if n == 1 else f"workers 0-{n - 1} (mpirun)")
            self.log(f"  {label:<24} {p.host:<16} {describe_status(p.returncode):<20} "
                     f"{end - p.started:8.2f} s")
            if p.returncode in (None, 0):
                continue
            if p.role != "workers":
                if p.last_stderr:
                    self.log(f"      {p.last_stderr.strip()}")
                continue
            by_line: Dict[str, List[int]] = {}
            for rank, line in sorted(self.worker_last_stderr.items()):
                by_line.setdefault(line.strip(), []).append(rank)
            for line, ranks in by_line.items():
                self.log(f"      worker {','.join(map(str, ranks))}: {line}")

    def run(self) -> int:
        try:
            self.root_uri = root_address(self.cluster)
            env = self.base_env(self.free_port())
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
        self.summary()
        return code


# --------------------------------------------------------------------------- command line

def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="heturun", description="Start a hetu job: scheduler, servers and MPI workers.")
    ap.add_argument("-c", "--config", help="cluster YAML file (see examples/config)")
    ap.add_argument("-w", "--workers", type=int, help="workers on this machine (without -c)")
    ap.add_argument("-s", "--servers", type=int, default=None,
                    help="servers on this machine (without -c; default 1)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="stop the whole job after this many seconds (exit 124)")
    ap.add_argument("--shutdown-timeout", type=float, default=60.0,
                    help="seconds servers and scheduler get to exit after the workers finish")
    ap.add_argument("--kill-grace", type=float, default=5.0,
                    help="seconds between the stop signal and SIGKILL at teardown")
    ap.add_argument("--van", choices=sorted(VANS), default=None,
                    help="parameter-server transport (overrides the cluster file's 'van'; default zmq)")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the commands started")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="worker command")
    return ap.parse_args(argv)


def cluster_from_args(args) -> Cluster:
    cluster = _cluster_shape(args)
    if args.van:
        cluster.van = args.van
    _check_van_is_built(cluster.van)
    return cluster


def _check_van_is_built(van: str):
    try:
        from hetu import _ps
    except ImportError:
        return  # no local build to ask: the nodes report it
    if van not in _ps.van_types():
        raise ConfigError(f"van {van!r} is not in this build of hetu (it has: {', '.join(_ps.van_types())}); "
                          "the ucx van needs libucx-dev when hetu is built (scripts/install_deps.sh)")


def _cluster_shape(args) -> Cluster:
    if args.config:
        if args.workers is not None or args.servers is not None:
            raise ConfigError("-w/-s describe a local machine; do not combine them with -c")
        return load_cluster(args.config)
    if args.workers is None:
        raise ConfigError("give either -c CLUSTER.yml or -w N [-s M]")
    if args.workers <= 0:
        raise ConfigError(f"-w must be at least 1, got {args.workers}")
    servers = 1 if args.servers is None else args.servers
    if servers < 0:
        raise ConfigError(f"-s must not be negative, got {servers}")
    return local_cluster(args.workers, servers)


def _install_signal_handlers(job: Job):
    def handler(signum, _frame):
        if job.interrupted is None:
            job.interrupted = signum
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, handler)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        cluster = cluster_from_args(args)
        if not command:
            raise ConfigError("no worker command given")
    except ConfigError as e:
        print(f"heturun: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    job = Job(cluster, command, args.timeout, args.shutdown_timeout, args.kill_grace,
              args.verbose)
    _install_signal_handlers(job)
    try:
        return job.run()
    except ConfigError as e:
        print(f"heturun: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
