"""A job inside a Slurm allocation: the scheduler, each server and all workers as job steps.

Sites that schedule with Slurm give a job its nodes (`salloc`, `sbatch`) and start its processes
with `srun`; many forbid ssh between compute nodes. Inside an allocation the runner therefore
takes the nodes from Slurm and starts every role as a step of the job:

- the scheduler: one step of one task on the allocation's first node;
- each server: a step of one task on its node (its rank and node-specific variables are its own);
- all workers: ONE step (`srun --mpi=pmix`), so that mpi4py's COMM_WORLD spans them as under
  mpirun; a worker's id is its task id (SLURM_PROCID), ranks filling the first node first, so
  worker 0 sits beside the scheduler.

Every step runs with `--overlap`: the job's processes share the allocation's CPUs (a server and
its host's workers run side by side, as with the other launchers). The job's secret travels in
srun's environment, which Slurm carries to the tasks over its authenticated RPC, never on a
command line. Supervision is the Job's: the first step that fails ends the job and is named; at
teardown the steps get the stop signal through srun, and any step still listed after the grace
is cancelled with scancel.
"""
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from typing import Dict, List, Optional

from .cluster import Cluster, ConfigError, Node
from .job import EXIT_FAILED, SECRET_VAR, Job, JobFailed
from .mpirun import worker_shim
from .processes import Proc, describe_status, emit

JOB_ID_VARS = ("SLURM_JOB_ID", "SLURM_JOBID")
SLURM_QUERY_TIMEOUT = 20.0
# The steps' names start with it, so that the job's own steps are found (and only they) at teardown.
STEP_PREFIX = "hetu-"


def _slurm_command(argv: List[str]) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=SLURM_QUERY_TIMEOUT)
    except FileNotFoundError:
        raise ConfigError(f"{argv[0]} not found on PATH (Slurm's client commands)") from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"{' '.join(argv[:3])} did not answer in {SLURM_QUERY_TIMEOUT:g} s: is slurmctld "
                          "reachable?") from None


def allocation_job_id(environ=os.environ) -> Optional[str]:
    return next((environ[v] for v in JOB_ID_VARS if environ.get(v)), None)


def confirmed_allocation(environ=os.environ) -> Optional[str]:
    """The job id when this process runs inside a live Slurm allocation (SLURM_JOB_ID set, srun on
    PATH, and the controller knows the job as running); None, with the reason printed, when the
    variables are set but no live job stands behind them (a shell that inherited them)."""
    job = allocation_job_id(environ)
    if job is None:
        return None
    if shutil.which("srun") is None or shutil.which("scontrol") is None:
        emit(sys.stderr, "heturun", f"SLURM_JOB_ID={job} is set but srun/scontrol are not on PATH: "
                                    "starting the job without Slurm (--launcher slurm to insist)")
        return None
    try:
        out = _slurm_command(["scontrol", "show", "job", "-o", job])
    except ConfigError as e:
        emit(sys.stderr, "heturun", f"SLURM_JOB_ID={job} is set but {e}: starting the job without Slurm")
        return None
    if out.returncode != 0 or "JobState=RUNNING" not in out.stdout:
        why = (out.stderr.strip().splitlines() or ["not a running job"])[-1]
        emit(sys.stderr, "heturun", f"SLURM_JOB_ID={job} is set but Slurm says: {why}; starting the job "
                                    "without Slurm (--launcher slurm to insist)")
        return None
    return job


def allocation_nodes(environ=os.environ) -> List[str]:
    """The allocation's node names, in Slurm's order (its first node first)."""
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise ConfigError("--launcher slurm: SLURM_JOB_NODELIST is not set: run inside an allocation "
                          "(salloc or an sbatch script)")
    out = _slurm_command(["scontrol", "show", "hostnames", nodelist])
    nodes = out.stdout.split()
    if out.returncode != 0 or not nodes:
        raise ConfigError(f"cannot expand the allocation's node list {nodelist!r}: {out.stderr.strip()}")
    return nodes


def allocation_cluster(nodes: List[str], workers: int, servers: int, gpus: int) -> Cluster:
    """`workers` workers and `servers` servers on every node of the allocation; the scheduler on
    the first."""
    # The launcher's Python on every node: an allocation's nodes share its file system.
    return Cluster(nodes=[Node(host=host, workers=workers, servers=servers, chief=i == 0, gpus=gpus,
                               python=sys.executable) for i, host in enumerate(nodes)])


# "srun: error: vm: task 1: Exited with exit code 3", "srun: error: vm: task 0: Killed"
SRUN_TASK_FAILED = re.compile(r"srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+)$")
SRUN_LABEL = re.compile(r"^\s*(\d+): ?(.*)$")


class SrunReport:
    """What srun's own lines say about the first task that failed."""

    def __init__(self):
        self.failed_rank: Optional[int] = None
        self.failed_status: Optional[str] = None

    def read(self, line: str):
        m = SRUN_TASK_FAILED.search(line)
        if m and self.failed_rank is None:
            self.failed_rank, status = int(m.group(2)), m.group(3).strip()
            status = re.sub(r"^Exited with exit code (\d+)$", r"exit \1", status)
            self.failed_status = status if status.startswith("exit") else f"killed ({status})"


class SlurmJob(Job):
    """A Job whose processes are steps of the Slurm job `job_id`."""
    WORKERS_LAUNCHER = "srun"
    REMOTE = "through srun"

    def __init__(self, job_id: str, cluster: Cluster, *args, **kwargs):
        super().__init__(cluster, *args, **kwargs)
        self.job_id = job_id
        self.srun_report = SrunReport()

    def step_name(self, name: str) -> str:
        """hetu-server-1.<job mark>: the role for a reader of squeue, the mark for teardown."""
        return f"{STEP_PREFIX}{name}.{self.job_mark}"

    def srun(self, name: str, hosts: List[str], tasks: int, extra=()) -> List[str]:
        # --kill-on-bad-exit: one failing worker ends its step, as mpirun ends the others.
        return ["srun", f"--jobid={self.job_id}", "--overlap", f"--job-name={self.step_name(name)}",
                f"--nodes={len(hosts)}", f"--ntasks={tasks}", f"--nodelist={','.join(hosts)}",
                "--kill-on-bad-exit=1", "--export=ALL", "--input=none", *extra]

    def remote_python(self, node: Node, code: str) -> List[str]:
        return self.srun("probe", [node.host], 1) + [node.python or sys.executable, "-c", code]

    # ---- scheduler and servers: a step each

    def ps_command(self, node: Node, role: str, rank: Optional[int], env: Dict[str, str]):
        name = role if rank is None else f"{role}-{rank}"
        argv = self.srun(name, [node.host], 1) + self.launcher_argv(node)
        return argv, {**os.environ, **env, SECRET_VAR: self.secret}, False

    # ---- workers: one step

    def worker_step(self, env: Dict[str, str]):
        """(argv, environment) of the workers' step."""
        nodes = self.worker_nodes()
        per_node = {n.workers for n in nodes}
        if len(per_node) != 1:
            raise JobFailed("under Slurm every node runs the same number of workers", EXIT_FAILED)
        shared = {**env, "DMLC_ROLE": "worker", **self.worker_env(nodes[0]), **self.stall_env()}
        if len(self.cluster.nodes) > 1:
            # One step cannot give each node its own variables: the shim picks its node's address.
            shared["HETU_NODE_HOSTS"] = " ".join(f"{n.host}={self.node_env(n)['DMLC_NODE_HOST']}" for n in nodes)
        rank = 0
        for node in nodes:
            for _ in range(node.workers):
                self.rank_host[rank] = node.host
                rank += 1
        argv = self.srun("workers", [n.host for n in nodes], rank,
                         ["--mpi=pmix", f"--ntasks-per-node={nodes[0].workers}", "--distribution=block",
                          "--label"])
        return argv + ["/bin/sh", "-c", worker_shim("SLURM_PROCID"), "hetu-worker", *self.command], shared

    def start_workers(self, env):
        argv, worker_env = self.worker_step(env)
        if self.verbose:
            self.log("starting workers: " + " ".join(map(shlex.quote, argv)))
        popen = subprocess.Popen(argv, env={**os.environ, **worker_env, SECRET_VAR: self.secret},
                                 stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True)
        proc = Proc(role="workers", rank=None, host=self.cluster.chief.host, popen=popen)
        for pipe, stream in ((popen.stdout, "stdout"), (popen.stderr, "stderr")):
            t = threading.Thread(target=self.pump_labelled, args=(pipe, stream), daemon=True)
            t.start()
            proc.threads.append(t)
        self.add_process(proc)
        return proc

    def pump_labelled(self, pipe, stream: str):
        """srun --label prefixes each task's line with its task id: a worker's rank."""
        for raw in iter(pipe.readline, b""):
            line = raw.decode(errors="replace").rstrip("\r\n")
            m = SRUN_LABEL.match(line)
            if m:
                self.on_worker_line(int(m.group(1)), stream, m.group(2))
            else:
                self.srun_report.read(line)
                emit(sys.stdout if stream == "stdout" else sys.stderr, "srun", line)
        pipe.close()

    def describe_failure(self, proc: Proc) -> str:
        if proc.role != "workers":
            step = self.step_name(proc.label.replace(" ", "-"))
            return f"{proc.label} on {proc.host} (Slurm step {step}) failed ({describe_status(proc.returncode)})"
        for t in proc.threads:
            t.join(timeout=5)
        r = self.srun_report.failed_rank
        if r is not None:
            return f"worker {r} on {self.rank_host.get(r, '?')} failed ({self.srun_report.failed_status})"
        return f"the workers' Slurm step failed ({describe_status(proc.returncode)})"

    # ---- teardown: steps srun could not stop

    def teardown(self):
        super().teardown()
        steps = self.own_steps()
        if steps:
            try:
                subprocess.run(["scancel", "--quiet", *steps], capture_output=True, timeout=SLURM_QUERY_TIMEOUT)
                self.log(f"cancelled step(s) {', '.join(steps)} that outlived their srun")
            except (OSError, subprocess.TimeoutExpired) as e:
                self.log(f"could not cancel step(s) {', '.join(steps)}, which outlived their srun: {e}")

    def own_steps(self) -> List[str]:
        try:
            out = subprocess.run(["squeue", "--steps", "--noheader", f"--jobs={self.job_id}", "--format=%i %j"],
                                 capture_output=True, text=True, timeout=SLURM_QUERY_TIMEOUT)
        except (OSError, subprocess.TimeoutExpired):
            return []
        listed = [line.split() for line in out.stdout.splitlines()]
        return [step for step, name in (f for f in listed if len(f) == 2) if name.endswith(f".{self.job_mark}")]
