"""The heturun command line."""
import argparse
import os
import signal
import sys

from .cluster import VANS, Cluster, ConfigError, load_cluster, local_cluster
from .job import EXIT_USAGE, Job
from .slurm import SlurmJob, allocation_cluster, allocation_job_id, allocation_nodes, confirmed_allocation
from ..threads import THREAD_VARS


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="heturun", description="Start a hetu job: scheduler, servers and MPI workers.")
    ap.add_argument("-c", "--config", help="cluster YAML file (see examples/config)")
    ap.add_argument("-w", "--workers", type=int, help="workers on this machine (without -c); under Slurm: on "
                                                      "each node of the allocation (default SLURM_NTASKS_PER_NODE or 1)")
    ap.add_argument("-s", "--servers", type=int, default=None,
                    help="servers on this machine (without -c; default 1); under Slurm: on each node")
    ap.add_argument("--launcher", choices=("auto", "ssh", "slurm"), default="auto",
                    help="how processes start: slurm: as job steps (srun) on the nodes of the Slurm allocation "
                         "this runs in; ssh: on this machine, and over ssh on a cluster file's other hosts; "
                         "auto (default): slurm inside a running Slurm job unless -c names the hosts, else ssh")
    ap.add_argument("--gpus", type=int, default=None,
                    help="GPUs on this machine (without -c; the cluster file's 'gpus:'), exported "
                         "to the workers as HETU_GPUS: worker w trains --gpu on GPU (w mod N)")
    ap.add_argument("--timeout", type=float, default=None,
                    help="stop the whole job after this many seconds (exit 124)")
    ap.add_argument("--stall-timeout", type=float, default=300.0, metavar="SECONDS",
                    help="stop the job when no worker completes a step for this long, naming the worker idle "
                         "longest and what it waits on (a parameter-server request, a barrier); a worker "
                         "waiting for data is no stall; 0: off")
    ap.add_argument("--shutdown-timeout", type=float, default=60.0,
                    help="seconds servers and scheduler get to exit after the workers finish")
    ap.add_argument("--kill-grace", type=float, default=5.0,
                    help="seconds between the stop signal and SIGKILL at teardown (also when the launcher is lost)")
    ap.add_argument("--van", choices=sorted(VANS), default=None,
                    help="parameter-server transport (overrides the cluster file's 'van'; default zmq)")
    ap.add_argument("--threads", type=int, default=None, metavar="N",
                    help="threads of every process's kernels and BLAS (HETU_NUM_THREADS, OMP_NUM_THREADS, ...; "
                         "a node's server_threads still sizes its servers); default: each process takes the "
                         "host's usable cores divided by the job's processes on the host")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the commands started")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="worker command")
    return ap.parse_args(argv)


def cluster_from_args(args, slurm_nodes=None) -> Cluster:
    """The job's shape: the cluster file, -w/-s on this machine, or -w/-s on each node of a Slurm
    allocation (`slurm_nodes`)."""
    cluster = _cluster_shape(args) if slurm_nodes is None else _allocation_shape(args, slurm_nodes)
    if args.van:
        cluster.van = args.van
    if args.stall_timeout < 0:
        raise ConfigError(f"--stall-timeout must not be negative, got {args.stall_timeout:g}")
    if args.threads is not None:
        if args.threads <= 0:
            raise ConfigError(f"--threads must be at least 1, got {args.threads}")
        cluster.env.update({name: str(args.threads) for name in THREAD_VARS})
    _check_van_is_built(cluster.van)
    return cluster


def _allocation_shape(args, nodes) -> Cluster:
    if args.config:
        raise ConfigError("--launcher slurm takes its hosts from the Slurm allocation: give -w/-s (per node), "
                          "not -c (or --launcher ssh to start the cluster file's hosts over ssh)")
    tasks = os.environ.get("SLURM_NTASKS_PER_NODE", "")
    workers = args.workers if args.workers is not None else (int(tasks) if tasks.isdigit() else 1)
    servers = 1 if args.servers is None else args.servers
    gpus = 0 if args.gpus is None else args.gpus
    for flag, value, least in (("-w", workers, 1), ("-s", servers, 0), ("--gpus", gpus, 0)):
        if value < least:
            raise ConfigError(f"{flag} must be at least {least}, got {value}")
    return allocation_cluster(nodes, workers, servers, gpus)


def slurm_job_id(args):
    """The Slurm job to start steps in, or None to start processes directly and over ssh."""
    if args.launcher == "ssh" or (args.launcher == "auto" and args.config):
        return None
    if args.launcher == "auto":
        return confirmed_allocation()
    job = allocation_job_id()
    if job is None:
        raise ConfigError("--launcher slurm: SLURM_JOB_ID is not set: run inside an allocation "
                          "(salloc, or an sbatch script)")
    return job


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
        if args.workers is not None or args.servers is not None or args.gpus is not None:
            raise ConfigError("-w/-s/--gpus describe a local machine; do not combine them with -c "
                              "(give a node 'gpus: N' in the cluster file)")
        return load_cluster(args.config)
    if args.workers is None:
        raise ConfigError("give either -c CLUSTER.yml or -w N [-s M]")
    if args.workers <= 0:
        raise ConfigError(f"-w must be at least 1, got {args.workers}")
    servers = 1 if args.servers is None else args.servers
    if servers < 0:
        raise ConfigError(f"-s must not be negative, got {servers}")
    gpus = 0 if args.gpus is None else args.gpus
    if gpus < 0:
        raise ConfigError(f"--gpus must not be negative, got {gpus}")
    return local_cluster(args.workers, servers, gpus)


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
        slurm_job = slurm_job_id(args)
        cluster = cluster_from_args(args, None if slurm_job is None else allocation_nodes())
        if not command:
            raise ConfigError("no worker command given")
    except ConfigError as e:
        print(f"heturun: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    supervision = (args.timeout, args.shutdown_timeout, args.kill_grace, args.verbose, args.stall_timeout)
    job = Job(cluster, command, *supervision) if slurm_job is None else \
        SlurmJob(slurm_job, cluster, command, *supervision)
    _install_signal_handlers(job)
    try:
        return job.run()
    except ConfigError as e:
        print(f"heturun: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
