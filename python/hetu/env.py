"""Every HETU_* environment variable hetu reads, in one table: its name, type, default and
meaning, and who reads it (docs/usage.md, Environment variables, is this table). The Python code
reads them through raw() and the accessors below, except hetu.threads (the launcher's worker
shim runs its source as a standalone script, before hetu can be imported). The launcher
(hetu.launch) sets most of them for the processes it starts. Those read by the C++ extension and
ps-lite are listed too (their reader says so)."""
import dataclasses
import os
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Variable:
    name: str
    type: str        # int, float, path, name or text
    default: str     # what holds while it is unset
    meaning: str
    read_by: str     # the module (or C++ file) that reads it


VARIABLES = (
    Variable("HETU_DATA_HOME", "path", "~/.cache/hetu/datasets", "the folder of prepared and synthetic datasets",
             "hetu.data.cache"),
    Variable("HETU_NUM_THREADS", "int", "the host's usable cores / its job processes",
             "threads of a process's kernels and BLAS (set by the launcher's --threads)",
             "hetu.threads, src/common/parallel.h"),
    Variable("HETU_PROCS_ON_HOST", "int", "mpirun's local size, else 1",
             "the job's processes on this host, whose share of the cores each takes (set by the launcher)",
             "hetu.threads"),
    Variable("HETU_GPUS", "int", "the CUDA devices CuPy sees",
             "GPUs on this host; --gpu's worker w takes GPU w mod N (set by the launcher from the cluster file)",
             "hetu.dist.devices"),
    Variable("HETU_PLANNER_THREADS", "int", "one per worker planned for, at most the cores",
             "threads of a Herald planner (run_laia.py --planner-threads wins over it)", "src/herald/planner.cpp"),
    Variable("HETU_PLANNER_TRADE_SHARED", "int", "4",
             "Herald's allocator leaves out of its trades the rows more than this many samples per worker read "
             "(0: trades over every row); the launcher passes it to every process alike", "src/herald/trades.cpp"),
    Variable("HETU_DYNAMIC_AHEAD", "int", "1",
             "0: a dynamic table's key directory takes each training step's decisions in its turn, not ahead "
             "on a thread while the step before trains (the same decisions; for measuring the overlap)",
             "hetu.dynamic"),
    Variable("HETU_MEMORY_AVAILABLE", "int", "MemAvailable or the cgroup limit",
             "bytes of memory this host has for dynamic tables (stands in for the host's figure)",
             "src/common/host_memory.h"),
    Variable("HETU_CHECKPOINT_STOP_AT", "name", "unset: no stop",
             "a test hook: the saving process kills itself at this point of a save (hetu.checkpoint.STOP_POINTS)",
             "hetu.checkpoint"),
    Variable("HETU_CHECKPOINT_ROOT", "path", "the command's --checkpoint and --resume",
             "the folder under which the servers may write and read checkpoints", "hetu.launch.job"),
    Variable("HETU_STALL_TIMEOUT", "float", "0: off",
             "seconds without training progress after which a worker ends the job (set by the launcher's "
             "--stall-timeout)", "hetu.launch.progress"),
    Variable("HETU_JOB", "text", "set by the launcher", "the mark of a job's processes, by which the launcher "
             "finds those left behind", "hetu.launch.job"),
    Variable("HETU_JOB_SECRET", "text", "a new random key per job (set by the launcher)",
             "the key the job's processes authenticate their messages with (ps-lite/README.md, Security)",
             "ps-lite/src/auth.cc"),
    Variable("HETU_JOB_SECRET_FILE", "path", "unset", "a file (mode 600) holding the key, where HETU_JOB_SECRET is "
             "unset", "ps-lite/src/auth.cc"),
    Variable("HETU_LOCAL_WORKERS", "int", "set by the launcher", "the workers on this host, for the processes "
             "the launcher starts there", "hetu.launch.job (sets it)"),
    Variable("HETU_PYTHON", "path", "the launcher's interpreter here, python3 elsewhere",
             "the Python a host's processes run with (the worker shim sizes the threads with it)",
             "hetu.launch.mpirun"),
    Variable("HETU_LAUNCHER", "name", "hetu.launcher", "the module each process of a job starts in",
             "hetu.launch.job"),
    Variable("HETU_NODE_HOSTS", "text", "set by the launcher under Slurm",
             "each node's host=address, from which a Slurm step's processes find their own",
             "hetu.launch.mpirun"),
)
BY_NAME = {v.name: v for v in VARIABLES}


def raw(name, environ=None):
    """The variable's text, None while unset; `environ`: another mapping than os.environ. Only a
    listed variable may be read."""
    if name not in BY_NAME:
        raise KeyError(f"{name} is not one of hetu's environment variables (hetu.env.VARIABLES)")
    return (os.environ if environ is None else environ).get(name)


def data_home():
    value = raw("HETU_DATA_HOME")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "hetu" / "datasets"


def table_markdown():
    """The table of docs/usage.md's Environment variables section."""
    lines = ["| Variable | Type | Default | Meaning | Read by |", "|---|---|---|---|---|"]
    lines += [f"| `{v.name}` | {v.type} | {v.default} | {v.meaning} | {v.read_by} |" for v in VARIABLES]
    return "\n".join(lines)
