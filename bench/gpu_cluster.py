"""Herald's end-to-end speed-up where it exists: GPU workers in front of CPU parameter servers on
shaped links (docs/design.md section 12).

One machine plays the cluster: namespace hosts (hetu_tools.netns), host 0 runs the scheduler and
the servers, hosts 1..W one worker each, every host's processes pinned to cores of their own (the
affinity of the host's sshd, which every process started there inherits), every host's link
shaped (tbf) to each --rates value. The achieved TCP rate between a worker host and the server
host is measured and printed beside the rate asked for. The W workers share this machine's GPU
(`--gpu`, the default where CuPy sees one); without one they train on their cores, and the
output says so: then the figures are of CPU workers, not of the setting Herald is built for.

For every configuration (workload, W, servers, link, embedding, batch, cache ratio) PS, HET
(`--cache lru --bound 0 --bsp 0`, HET's own protocol) and Herald run in turn, --repeats times.
Per mode: rows and MB moved, hit rate, samples/s (median of the repeats), Herald/HET and
Herald/PS, and where a worker's step goes, in ms per step (the workers' mean): embedding rows
in (`in`), gradients out (`out`), the dense AllReduce (`dense`), waiting for Herald's plan
(`plan wait`, part of `in` or `out`) and the rest (`rest`: forward, backward and host work),
the share of the step spent on embeddings (`emb %`) and the planner's time per plan.

    python bench/gpu_cluster.py --quick        # W=2, 1 server, 10gbit, WDL: a few minutes
    python bench/gpu_cluster.py --workloads ncf --movielens-dir data/ml100k-time --workers 2 4

Needs root, iproute2, openssh-server and mpirun (hetu_tools.netns). Where namespace hosts cannot be
made (`--network auto`, the default, tries them) or with `--network loopback`, the same grid runs
as one local cluster over loopback: the scheduler and servers on the cores host 0 would have, each
worker on its host's cores, every link `lo` and every row labelled so; --rates does not apply
there, and no figure of such a run is at any link rate.

    python bench/gpu_cluster.py --quick --network loopback
"""
import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_modes  # noqa: E402  (MODES, aggregate)
from common.summaries import worker_summaries  # noqa: E402

from hetu.launch.mpirun import THREAD_VARS  # noqa: E402
from hetu_tools.netns import NamespaceHosts, NetnsUnavailable, shape  # noqa: E402

ROOT = compare_modes.ROOT
WORKLOADS = {"wdl": "wdl_criteo", "ncf": "ncf_movielens"}
RECEIVER = ("import socket,sys,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
            "s.bind((sys.argv[1],int(sys.argv[2])));s.listen(1);print('ready',flush=True)\nc,_=s.accept()\n"
            "t=time.perf_counter();n=0\nwhile True:\n b=c.recv(1<<20)\n if not b: break\n n+=len(b)\n"
            "print(n*8/(time.perf_counter()-t))")
# Pins a loopback worker to its host's cores (by its MPI rank), then runs the worker command.
PIN = ("import json,os,sys\ncores=json.loads(sys.argv[1])[int(os.environ['OMPI_COMM_WORLD_RANK'])]\n"
       "os.sched_setaffinity(0,cores)\nos.execvp(sys.argv[2],sys.argv[2:])")
SENDER = ("import socket,sys\nc=socket.create_connection((sys.argv[1],int(sys.argv[2])))\n"
          "b=bytes(1<<20)\nfor _ in range(int(sys.argv[3])): c.sendall(b)\nc.close()")


def gpu_name():
    """The GPU's name where CuPy sees one, else None."""
    try:
        import cupy
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return None
        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:   # no CuPy, no driver, no device
        return None


def split_cores(workers, servers):
    """Cores per host (host 0: scheduler and servers, then one host per worker), or None where
    there are fewer cores than hosts (then every process shares them all)."""
    cores = sorted(os.sched_getaffinity(0))
    hosts = workers + 1
    if len(cores) < hosts:
        return None
    server_cores = max(1, min(servers, len(cores) - workers))
    per_worker = (len(cores) - server_cores) // workers
    split = [cores[:server_cores]]
    for w in range(workers):
        split.append(cores[server_cores + w * per_worker: server_cores + (w + 1) * per_worker])
    return split


def achieved_rate(hosts, mbytes):
    """TCP bits/s from worker host 1 to the server host 0, as the shaped links let through."""
    server, worker = hosts[0], hosts[1]
    recv = subprocess.Popen(hosts.exec_argv(server, [sys.executable, "-c", RECEIVER, server.address, "5099"]),
                            stdout=subprocess.PIPE, text=True)
    try:
        recv.stdout.readline()   # listening
        subprocess.run(hosts.exec_argv(worker, [sys.executable, "-c", SENDER, server.address, "5099", str(mbytes)]),
                       check=True, timeout=120)
        return float(recv.stdout.readline())
    finally:
        recv.kill()
        recv.wait()


def mode_command(mode, cluster_file, cfg, args, cpus=None):
    """The run of `mode` on the namespace hosts of `cluster_file`, or (cluster_file None) as one
    local cluster over loopback, its workers pinned to `cpus[1:]` where given."""
    script, flags = compare_modes.MODES[mode]
    model = WORKLOADS[cfg["workload"]]
    if cfg["workload"] == "ncf" and args.movielens_dir:
        data = ["--data-dir", os.path.abspath(args.movielens_dir)]
    elif cfg["workload"] == "ncf":
        data = ["--dataset", "synthetic-movielens-sessions", "--rows", str(args.rows)]
    else:
        data = ["--rows", str(args.rows)]
    where = ["-c", cluster_file] if cluster_file else ["-w", str(cfg["workers"]), "-s", str(cfg["servers"])]
    pin = [] if cluster_file or cpus is None else [sys.executable, "-c", PIN, json.dumps(cpus[1:])]
    return [sys.executable, os.path.join(ROOT, "python/runner.py"), *where, "--timeout", str(args.timeout),
            *pin, sys.executable, os.path.join(ROOT, "examples/ctr", script), *flags, "--bsp", "0", "--model", model,
            "--batch-size", str(cfg["batch"]), "--embedding-size", str(cfg["embedding"]),
            "--cache-limit-ratio", str(cfg["ratio"]), "--iters-per-epoch", str(args.iterations), *data,
            "--no-progress", *(["--gpu"] if args.gpu else [])]


def breakdown(summaries):
    """ms per step, the workers' mean: rows in, gradients out, dense sync, plan wait, rest; the
    share of the step on embeddings; the planner's ms per plan."""
    def per_step(field):
        return statistics.mean(s["counters"][field] / s["iterations"] for s in summaries) * 1e3
    pull, push, dense = per_step("pull_seconds"), per_step("push_seconds"), per_step("dense_sync_seconds")
    step = per_step("step_seconds")
    return {"in_ms": pull, "out_ms": push, "dense_ms": dense, "plan_wait_ms": per_step("plan_wait_seconds"),
            "rest_ms": step - pull - push - dense, "step_ms": step, "emb_share": (pull + push) / step,
            "plan_ms": per_step("scheduler_seconds")}


def run_configuration(cluster_file, cfg, args, cpus=None):
    runs = {m: [] for m in args.modes}
    env, pin = None, None
    if cluster_file is None and cpus is not None:
        # The launcher, scheduler and servers on host 0's cores; every worker its host's share
        # of threads, as NamespaceHosts.cluster gives them.
        env = {**os.environ, **{v: str(min(len(c) for c in cpus[1:])) for v in THREAD_VARS}}
        pin = lambda: os.sched_setaffinity(0, cpus[0])   # noqa: E731
    for _ in range(args.repeats):   # the modes in turn, so a slow spell falls on all alike
        for mode in args.modes:
            cmd = mode_command(mode, cluster_file, cfg, args, cpus)
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout + 60, env=env,
                                  preexec_fn=pin)
            summaries = worker_summaries(mode, cfg["workers"], proc.returncode, proc.stdout, proc.stderr)
            runs[mode].append({**compare_modes.aggregate(summaries, cfg["batch"]), **breakdown(summaries)})
    result = {}
    for mode, rs in runs.items():
        med = lambda k: statistics.median(r[k] for r in rs)
        result[mode] = {**rs[0], **{k: med(k) for k in ("samples_per_s", "in_ms", "out_ms", "dense_ms", "plan_wait_ms",
                                                        "rest_ms", "step_ms", "emb_share", "plan_ms")}}
    return result


HEADER = (f"{'load':<4} {'W':>2} {'S':>2} {'link':>7} {'emb':>4} {'b':>5} {'ratio':>5}  {'mode':<7}{'rows':>10}{'MB':>9}"
          f"{'hit':>6}{'samples/s':>11}{'/HET':>6}{'/PS':>6}{'emb %':>7}{'in':>7}{'out':>7}{'dense':>7}"
          f"{'plan w':>7}{'rest':>7}{'plan':>7}")


def report(cfg, link, result):
    speed = {m: r["samples_per_s"] for m, r in result.items()}
    for mode, r in result.items():
        vs = lambda ref: speed[mode] / speed[ref] if ref in speed else float("nan")
        print(f"{cfg['workload']:<4} {cfg['workers']:>2} {cfg['servers']:>2} {link:>7} {cfg['embedding']:>4} "
              f"{cfg['batch']:>5} {cfg['ratio']:>5}  {mode:<7}{r['rows']:>10}{r['bytes'] / 1e6:>9.1f}{r['hit_rate']:>6.2f}"
              f"{r['samples_per_s']:>11.0f}{vs('HET'):>6.2f}{vs('PS'):>6.2f}{100 * r['emb_share']:>7.1f}"
              f"{r['in_ms']:>7.2f}{r['out_ms']:>7.2f}{r['dense_ms']:>7.2f}{r['plan_wait_ms']:>7.2f}{r['rest_ms']:>7.2f}"
              f"{r['plan_ms']:>7.2f}", flush=True)
    if "Herald" in result and "HET" in result:
        het, herald = result["HET"], result["Herald"]
        print(f"{'':>10}Herald vs HET: {1 - herald['rows'] / het['rows']:.1%} fewer rows, "
              f"{speed['Herald'] / speed['HET']:.2f}x samples/s; plan wait {herald['plan_wait_ms']:.2f} ms "
              f"of a {herald['step_ms']:.2f} ms step ({100 * herald['plan_wait_ms'] / herald['step_ms']:.1f}%)",
              flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="W=2, 1 server, 10gbit, WDL, embedding 128, b=256, "
                                                        "ratio 0.1, 1 repeat, 20 iterations")
    p.add_argument("--workloads", nargs="+", default=["wdl", "ncf"], choices=sorted(WORKLOADS))
    p.add_argument("--movielens-dir", default=None,
                   help="NCF's data: a prepared MovieLens folder (prepare movielens --time-order); "
                        "default: synthetic-movielens-sessions")
    p.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    p.add_argument("--servers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--rates", nargs="+", default=["10gbit", "25gbit"], help="tc rates of every host's link")
    p.add_argument("--embedding", type=int, nargs="+", default=[128, 512])
    p.add_argument("--batch", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--ratios", type=float, nargs="+", default=[0.1, 0.2])
    p.add_argument("--modes", nargs="+", default=["PS", "HET", "Herald"], choices=["PS", "HET", "Herald"])
    p.add_argument("--iterations", type=int, default=40)
    p.add_argument("--rows", type=int, default=200000, help="synthetic samples")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--gpu", dest="gpu", action="store_true", default=None, help="workers on the GPU (default: if any)")
    p.add_argument("--cpu", dest="gpu", action="store_false", help="workers on their CPU cores")
    p.add_argument("--rate-probe-mb", type=int, default=200, help="MB sent to measure the achieved link rate")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--network", choices=["auto", "netns", "loopback"], default="auto",
                   help="namespace hosts on shaped links, or one local cluster over loopback (auto: namespace "
                        "hosts where they can be made)")
    args = p.parse_args()
    if args.quick:
        args.workloads, args.workers, args.servers, args.rates = ["wdl"], [2], [1], ["10gbit"]
        args.embedding, args.batch, args.ratios, args.repeats, args.iterations = [128], [256], [0.1], 1, 20
    gpu = gpu_name()
    if args.gpu is None:
        args.gpu = gpu is not None
    if args.gpu and gpu is None:
        sys.exit("--gpu: CuPy sees no GPU here (use --cpu)")
    cores = len(os.sched_getaffinity(0))
    print(f"# {cores} cores; workers on " + (f"the GPU, shared: {gpu}" if args.gpu else
                                             "their CPU cores (no GPU here: not the setting Herald is built for)"))
    print(f"# {args.iterations} iterations per run, samples/s the median of {args.repeats}; ms per step, the "
          f"workers' mean")
    network = args.network
    if network == "auto":
        try:
            with NamespaceHosts(2):
                network = "netns"
        except (NetnsUnavailable, RuntimeError) as e:
            network = "loopback"
            print(f"# namespace hosts cannot be made here: {e}")
    if network == "loopback":
        print(f"# network: LOOPBACK, one local cluster on 127.0.0.1, no shaped link (link column 'lo'): no figure "
              f"below is at a link rate; --rates ({' '.join(args.rates)}) not applied")
    print(HEADER)
    print("-" * len(HEADER))
    for workers, servers in itertools.product(args.workers, args.servers):
        cpus = split_cores(workers, servers)
        if cpus is None:
            print(f"# W={workers}, S={servers}: fewer cores ({cores}) than hosts ({workers + 1}): every process "
                  f"shares all of them")
        if network == "loopback":
            for workload, emb, batch, ratio in itertools.product(args.workloads, args.embedding, args.batch,
                                                                 args.ratios):
                cfg = {"workload": workload, "workers": workers, "servers": servers, "embedding": emb,
                       "batch": batch, "ratio": ratio}
                report(cfg, "lo", run_configuration(None, cfg, args, cpus))
            continue
        try:
            with NamespaceHosts(workers + 1, cpus=cpus) as hosts, tempfile.TemporaryDirectory() as d:
                cluster_file = hosts.write_cluster_file(os.path.join(d, "cluster.yml"), workers=[0] + [1] * workers,
                                                        servers=[servers] + [0] * workers, chief=0)
                for rate in args.rates:
                    for h in hosts:
                        shape(h, rate=rate, delay=None)
                    got = achieved_rate(hosts, args.rate_probe_mb)
                    print(f"# link {rate}: {got / 1e9:.2f} Gbit/s achieved (TCP, one stream, worker host to server "
                          f"host)", flush=True)
                    for workload, emb, batch, ratio in itertools.product(args.workloads, args.embedding, args.batch,
                                                                         args.ratios):
                        cfg = {"workload": workload, "workers": workers, "servers": servers, "embedding": emb,
                               "batch": batch, "ratio": ratio}
                        report(cfg, rate, run_configuration(cluster_file, cfg, args))
        except NetnsUnavailable as e:
            sys.exit(f"cannot make or shape namespace hosts here: {e}")


if __name__ == "__main__":
    main()
