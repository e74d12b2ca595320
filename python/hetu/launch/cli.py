"""The heturun command line."""
import argparse
import signal
import sys

from .cluster import VANS, Cluster, ConfigError, load_cluster, local_cluster
from .job import EXIT_USAGE, Job
from ..threads import THREAD_VARS


def parse_args(argv):
    ap = argparse.ArgumentParser(
        prog="heturun", description="Start a hetu job: scheduler, servers and MPI workers.")
    ap.add_argument("-c", "--config", help="cluster YAML file (see examples/config)")
    ap.add_argument("-w", "--workers", type=int, help="workers on this machine (without -c)")
    ap.add_argument("-s", "--servers", type=int, default=None,
                    help="servers on this machine (without -c; default 1)")
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


def cluster_from_args(args) -> Cluster:
    cluster = _cluster_shape(args)
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
        cluster = cluster_from_args(args)
        if not command:
            raise ConfigError("no worker command given")
    except ConfigError as e:
        print(f"heturun: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    job = Job(cluster, command, args.timeout, args.shutdown_timeout, args.kill_grace,
              args.verbose, args.stall_timeout)
    _install_signal_handlers(job)
    try:
        return job.run()
    except ConfigError as e:
        print(f"heturun: error: {e}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
