"""All workers under one mpirun: the worker shim and the reading of mpirun's tagged output."""
import inspect
import ipaddress
import os
import re
import shlex
import subprocess
from typing import Dict, List, Optional

from .. import threads
from ..threads import THREAD_VARS

# The worker shim turns the launcher's rank (MPI's under mpirun, the task id under srun) into the
# ps-lite worker id; `exec` keeps the worker's pid equal to the one mpirun or slurmstepd tracks, so
# their signals and exit codes reach the real process. It also gives each worker its share of the
# host's cores (hetu.threads, whose source it runs on the host's Python before BLAS starts: the
# host's cores, not the launcher's): several workers each running BLAS and kernel threads for
# every core spin against each other (a 2-core host with 2 workers ran 40x slower). Variables the
# user set are kept. Under Slurm, one step cannot give each node its own variables: HETU_NODE_HOSTS
# ("node=address ...") gives the shim its node's address.
def worker_shim(rank_var: str) -> str:
    return (f'export DMLC_WORKER_ID="${rank_var}"; '
            'for p in $HETU_NODE_HOSTS; do case "$p" in "$SLURMD_NODENAME="*) '
            'export DMLC_NODE_HOST="${p#*=}";; esac; done; '
            f't=$("${{HETU_PYTHON:-python3}}" -S -c {shlex.quote(inspect.getsource(threads))} 2>/dev/null); '
            '[ "$t" -ge 1 ] 2>/dev/null || t=1; '
            f'for v in {" ".join(THREAD_VARS)}; do '
            '[ -n "$(printenv $v)" ] || export "$v=$t"; done; exec "$@"')


WORKER_SHIM = worker_shim("OMPI_COMM_WORLD_RANK")


# Open MPI also takes where it may run and how it starts its daemons from what it finds around
# it: a resource manager's allocation (SLURM_JOBID, a Grid Engine PE_HOSTFILE, a PBS or LSF job)
# read by its `ras` components, or a launcher chosen in OMPI_MCA_plm or an MCA parameter file
# (`isolated`, meant for one host). Either way the hosts the job names with --host get no daemon
# and mpirun stops at once, before any ssh: "All nodes which are allocated for this job are
# already filled." The runner names every host and its slots itself and reaches remote hosts
# over its own ssh, so it turns both off; a cluster file's own `--mca ras`/`--mca plm` win.
FOREIGN_ALLOCATIONS = "^slurm,gridengine,tm,lsf,alps,simulator"   # names absent in a build are fine


def given_mca(args: List[str]) -> set:
    """The MCA parameters that `args` (mpirun options) set."""
    return {name for flag, name in zip(args, args[1:]) if flag in ("--mca", "-mca")}


def mpirun_options(ssh_config: Optional[str], given=()) -> List[str]:
    """mpirun's options for a hetu job; `ssh_config` when some hosts are remote; `given`: the
    MCA parameters the cluster file sets itself (mpirun refuses a parameter given twice)."""
    # yield_when_idle: oversubscribed ranks waiting in a collective must not spin on a core
    # that the parameter server or another rank needs.
    argv = ["mpirun", "--oversubscribe", "--bind-to", "none", "--tag-output",
            "--mca", "mpi_yield_when_idle", "1"]
    if os.geteuid() == 0:
        argv.append("--allow-run-as-root")
    if "ras" not in given:
        argv += ["--mca", "ras", FOREIGN_ALLOCATIONS]
    if ssh_config:
        if "plm" not in given:
            argv += ["--mca", "plm", "rsh"]
        argv += ["--mca", "plm_rsh_agent", "ssh", "--mca", "plm_rsh_args", f"-F {ssh_config}"]
    return argv


def mpi_interface_options(cluster, root_uri: str, remote: bool, log=None) -> List[str]:
    """Open MPI's transports and TCP listeners on the job's own interfaces, not on every
    address of every host. A one-host job's ranks talk through shared memory alone (`btl
    self,vader`: the TCP BTL, which listens on every address whatever `btl_tcp_if_include`
    says, is not even opened; ranks of one host never used it) and the runtime's out-of-band
    channel is on loopback. A multi-host job's TCP channels use the interfaces the cluster
    file names, or the network of the chief's address."""
    given = given_mca(cluster.mpirun_args)   # the cluster file's own settings win: mpirun
    if not remote:                           # refuses a parameter given twice
        nets = ["lo"]
    else:
        nets = sorted({n.interface for n in cluster.nodes if n.interface})
        if not nets:
            net = local_network(root_uri)
            nets = [net] if net else []
    argv = ["--mca", "btl", "self,vader"] if not remote and "btl" not in given else []
    if not nets:
        if log:
            log(f"no interface of this host has {root_uri}: Open MPI listens on all of them "
                "(set 'interface' on the cluster's nodes)")
        return argv
    value = ",".join(nets)
    return argv + [x for name in ("btl_tcp_if_include", "oob_tcp_if_include") if name not in given
                   for x in ("--mca", name, value)]


def local_network(address: str) -> Optional[str]:
    """The network (CIDR) of this host's interface that has `address`, as `ip` reports it."""
    try:
        out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    for line in out.splitlines():
        m = re.search(r"\binet (\d+\.\d+\.\d+\.\d+/\d+)", line)
        if m and m.group(1).split("/")[0] == address:
            return str(ipaddress.ip_interface(m.group(1)).network)
    return None


# Variables that change where Open MPI's mpirun places processes or how it starts them; their
# names (never their values) go into the summary when mpirun fails without naming a worker.
AMBIENT_MPI_VARS = re.compile(r"^(OMPI_MCA_\w+|PMIX_MCA_\w+|SLURM_JOB_?ID|PBS_JOBID|LSB_JOBID|PE_HOSTFILE)$")


def ambient_mpi_settings() -> List[str]:
    """The names of this environment's variables that AMBIENT_MPI_VARS matches, sorted."""
    return sorted(k for k in os.environ if AMBIENT_MPI_VARS.match(k))


MPI_TAG = re.compile(r"\[\d+,(\d+)\]<(stdout|stderr)>:")
MPI_FAILED_RANK = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]")
# "mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
MPI_NOTICED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)(?: \(([^)]*)\))?")
MPI_EXIT = re.compile(r"Exit code:\s*(-?\d+)")
MPI_SIGNAL = re.compile(r"Signal:\s*(.+)$")


class MpirunReport:
    """What mpirun's own lines say about the worker that failed: its rank and how it ended."""

    def __init__(self):
        self.failed_rank: Optional[int] = None
        self.failed_status: Optional[str] = None

    def read(self, line: str):
        m = MPI_FAILED_RANK.search(line)
        if m and self.failed_rank is None:
            self.failed_rank = int(m.group(1))
        m = MPI_NOTICED.search(line)
        if m and self.failed_rank is None:
            self.failed_rank = int(m.group(1))
            self.failed_status = f"killed by signal {m.group(2)}" + (f" ({m.group(3)})" if m.group(3) else "")
        for pattern, fmt in ((MPI_EXIT, "exit {}"), (MPI_SIGNAL, "killed by {}")):
            m = pattern.search(line)
            if m and self.failed_status is None:
                self.failed_status = fmt.format(m.group(1).strip())


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
        m = MPI_TAG.match(self.pending)
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
        tag = MPI_TAG.search(self.pending)
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


def pump_mpirun(pipe, demux: MpiOutputDemux):
    """Reads raw chunks: a tagged fragment may wait long for its newline."""
    fd = pipe.fileno()
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        demux.feed(data.decode(errors="replace"))
    demux.close()
    pipe.close()

