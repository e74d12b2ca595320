"""Parameter-server throughput on loopback: sparse pull and push of 128-wide float32 rows.

Runs real jobs (scheduler + servers through ``python -m hetu.launcher``, worker processes)
for each (workers, servers) shape and batch size, and next to each a raw ZMQ round trip of
the same bytes (``hetu._ps._raw_bench_*``: the same libzmq, DEALER->ROUTER TCP sockets and
malloc setting as the van; the client sends the keys -- plus the rows for a push -- split over
the same number of server processes, which answer with a ready buffer of rows, or an empty
frame for a push; no lookup, gather or optimizer work). Prints rows/s, row-payload GB/s and the PS / raw ratio.
A third column, "raw+table", runs the same round trips with the table work no server can skip,
done the plainest way: the raw server gathers a pull's rows from a table of its own (the same
TableShard code as the PS, the same keys as the PS workers) and steps a push into an SGD or Adam
table once it has arrived whole. PS / raw+table is then the parameter server's own overhead
(protocol, threads, Python) or, above 1, what its chunks overlap; raw+table / raw is what the
table work costs on this machine (--no-table-baseline leaves the column out).
With --vans zmq ucx the parameter server runs over each van in turn (DMLC_PS_VAN_TYPE). Pushes
are measured against a table per server-side optimizer (--optimizers, SGD and Adam by default).
Each shape runs --repeat times, the PS jobs and the raw round trips in turn; a column reports the
median run (--stat best: the best), and a ratio is the median of the ratios of runs taken next
to each other. --baseline-python runs the same jobs with another build of hetu (the python of
another virtual environment) in the same rotation, as the column "base".

    python bench/ps_throughput.py                      # the default matrix
    python bench/ps_throughput.py --vans zmq ucx       # the ZMQ van and the UCX van side by side
    python bench/ps_throughput.py --shapes 1x1 --batches 16384 --seconds 2
    python bench/ps_throughput.py --baseline-python ../venv-old/bin/python   # before / after

Throughput is the sum over workers; every worker issues one request at a time.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

from hetu.ps import OPTIMIZERS, pick_root_port

WIDTH = 128
ROWS = 1 << 18  # 256K rows x 128 floats = 128 MiB per table


def timed(fn, seconds):
    for _ in range(2):
        fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        el = time.perf_counter() - start
        if el >= seconds:
            return n, el


def batch_keys(rank, batch):
    # A deduplicated batch: sorted unique ids spread over the whole table.
    rng = np.random.default_rng(rank)
    return np.sort(rng.choice(ROWS, batch, replace=False)).astype(np.int64)


def ps_worker(args):
    import hetu.ps as ps
    ps.start()
    # One table per server-side optimizer; pulls read the first (a pull does not depend on it).
    tables = {o: ps.client().init_table(f"bench_{o}", ROWS, WIDTH, init=("constant", 0.0), optimizer=o, bsp=False)
              for o in args.optimizers}
    out = {}
    for b in args.batches:
        keys = batch_keys(ps.rank(), b)
        grads = np.full((b, WIDTH), 1e-3, np.float32)
        t = tables[args.optimizers[0]]
        ps.barrier()
        out[f"pull{b}"] = timed(lambda: t.pull(keys).wait(), args.seconds)
        for o, t in tables.items():
            ps.barrier()
            out[f"push_{o}{b}"] = timed(lambda: t.push(keys, grads, lr=0.1).wait(), args.seconds)
    print("RESULT " + json.dumps(out), flush=True)
    ps.finalize()


def raw_server(args):
    from hetu import _ps
    kinds = [OPTIMIZERS[o] for o in args.optimizers] if args.table else []
    _ps._raw_bench_server(args.port, WIDTH, max(args.batches), ROWS if args.table else 0, kinds, args.rank,
                          len(args.ports))


def raw_client(args):
    from hetu import _ps
    out = {}
    for b in args.batches:
        # With tables: the PS workers' keys, and a push per server-side optimizer, as ps_worker.
        keys = batch_keys(args.rank, b).tolist() if args.table else []
        ops = [("pull", "pull", 0)] + ([(f"push_{o}", "push", i) for i, o in enumerate(args.optimizers)]
                                       if args.table else [("push", "push", 0)])
        for name, op, table in ops:
            barrier(args, f"{name}{b}")
            out[f"{name}{b}"] = _ps._raw_bench_client(args.ports, op, b, WIDTH, args.seconds, keys, ROWS, table)
    print("RESULT " + json.dumps(out), flush=True)


def barrier(args, name):
    # File barrier among the raw clients: all start a measurement together, like ps.barrier().
    open(os.path.join(args.dir, f"{name}.{args.rank}"), "w").close()
    deadline = time.time() + 60
    while sum(os.path.exists(os.path.join(args.dir, f"{name}.{r}")) for r in range(args.workers)) < args.workers:
        if time.time() > deadline:
            raise RuntimeError(f"raw barrier {name}: not all {args.workers} clients arrived")
        time.sleep(0.001)


def collect(procs, timeout):
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        line = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        if p.returncode != 0 or not line:
            raise RuntimeError(f"bench process failed (exit {p.returncode}):\n{out[-3000:]}")
        results.append(json.loads(line[0][7:]))
    return results


def bench_command(args, python=None):
    return [python or sys.executable, os.path.abspath(__file__), "--seconds", str(args.seconds), "--batches",
            *map(str, args.batches), "--optimizers", *args.optimizers]


def run_ps(workers, servers, args, van, python=None):
    """One parameter-server job over `van`; each worker's {op+batch: (requests, seconds)}."""
    python = python or sys.executable
    me = bench_command(args, python)
    port = pick_root_port("127.0.0.1")
    env = dict(os.environ, DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port), DMLC_NUM_WORKER=str(workers),
               DMLC_NUM_SERVER=str(servers), DMLC_PS_VAN_TYPE=van)
    logs = subprocess.PIPE
    nodes = [subprocess.Popen([python, "-m", "hetu.launcher"], env=dict(env, DMLC_ROLE=r), stdout=logs,
                              stderr=subprocess.STDOUT, text=True) for r in ["scheduler"] + ["server"] * servers]
    wk = [subprocess.Popen(me + ["--role", "ps-worker"], env=dict(env, DMLC_ROLE="worker"), stdout=logs,
                           stderr=subprocess.STDOUT, text=True) for _ in range(workers)]
    try:
        ps_res = collect(wk, 600)
        for n in nodes:
            n.wait(30)
    finally:
        for p in nodes + wk:
            if p.poll() is None:
                p.kill()
    return ps_res


def run_raw(workers, servers, args, table=False):
    """The raw ZMQ round trips of the same bytes (with table: and the table work); each
    client's results, as run_ps."""
    me = bench_command(args) + (["--table"] if table else [])
    ports = [pick_root_port("127.0.0.1") for _ in range(servers)]
    rs = [subprocess.Popen(me + ["--role", "raw-server", "--port", str(p), "--rank", str(r), "--ports", *map(str, ports)])
          for r, p in enumerate(ports)]
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        rc = [subprocess.Popen(me + ["--role", "raw-client", "--rank", str(w), "--workers", str(workers), "--dir", d,
                                     "--ports", *map(str, ports)], stdout=subprocess.PIPE, text=True)
              for w in range(workers)]
        try:
            raw_res = collect(rc, 600)
        finally:
            from hetu import _ps
            _ps._raw_bench_client(ports, "stop", 1, WIDTH, 0.0)
            for p in rs + rc:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return raw_res


def rate(results, key, batch):
    rows = sum(r[key][0] * batch / r[key][1] for r in results)
    return rows, rows * WIDTH * 4 / 1e9


def pick(values, stat):
    values = sorted(values)
    return values[-1] if stat == "best" else values[len(values) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=["1x1", "1x2", "2x1", "4x2"], help="WORKERSxSERVERS")
    ap.add_argument("--batches", nargs="+", type=int, default=[1024, 4096, 16384, 65536])
    ap.add_argument("--seconds", type=float, default=0.5, help="measuring time per cell")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per shape, alternating PS and raw (shared machines)")
    ap.add_argument("--stat", default="median", choices=["median", "best"],
                    help="which of the repeated runs each column reports")
    ap.add_argument("--optimizers", nargs="+", default=["sgd", "adam"], choices=sorted(OPTIMIZERS),
                    help="server-side optimizers of the pushes (a table each); pulls use the first")
    ap.add_argument("--vans", nargs="+", default=["zmq"], choices=["zmq", "ucx"],
                    help="parameter-server transports to measure, side by side")
    ap.add_argument("--baseline-python", help="also run the PS jobs with this interpreter's hetu (column 'base')")
    ap.add_argument("--no-table-baseline", dest="table_baseline", action="store_false",
                    help="leave out the raw+table column (raw round trips plus the server's gather or step)")
    ap.add_argument("--table", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--role", default="main", help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--ports", nargs="+", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role != "main":
        return {"ps-worker": ps_worker, "raw-server": raw_server, "raw-client": raw_client}[args.role](args)
    print(f"loopback, {os.cpu_count()} cores, rows of {WIDTH} float32 ({WIDTH * 4} B), table {ROWS} rows, "
          f"{args.seconds} s per cell, {args.stat} of {args.repeat}; GB/s counts row payload only")
    ps_cols = args.vans + (["base"] if args.baseline_python else [])
    raw_cols = ["raw"] + (["raw+table"] if args.table_baseline else [])
    cols = ps_cols + raw_cols
    # Each PS column against raw; the first also against raw+table; raw+table against raw.
    pairs = [(v, "raw") for v in ps_cols] + ([(ps_cols[0], "raw+table"), ("raw+table", "raw")]
                                             if args.table_baseline else [])
    width = {c: max(12, len(c + " rows/s")) for c in cols}
    head = (f"{'W':>2} {'S':>2} {'op':>9} {'batch':>6} | "
            + " | ".join(f"{c + ' rows/s':>{width[c]}} {'GB/s':>5}" for c in cols) + " | "
            + " ".join(f"{a + '/' + b:>{max(8, len(a + b) + 1)}}" for a, b in pairs))
    print(head)
    print("-" * len(head))
    for shape in args.shapes:
        w, s = map(int, shape.split("x"))
        runs = {c: [] for c in cols}
        for _ in range(args.repeat):  # alternated, so a slow spell of the machine hits all
            for v in args.vans:
                runs[v].append(run_ps(w, s, args, v))
            if args.baseline_python:
                runs["base"].append(run_ps(w, s, args, args.vans[0], args.baseline_python))
            runs["raw"].append(run_raw(w, s, args))
            if args.table_baseline:
                runs["raw+table"].append(run_raw(w, s, args, table=True))
        for op in ["pull"] + [f"push_{o}" for o in args.optimizers]:
            for b in args.batches:
                raw_op = op.split("_")[0]
                key = {c: f"{raw_op if c == 'raw' else op}{b}" for c in cols}
                got = {c: pick([rate(r, key[c], b) for r in runs[c]], args.stat) for c in cols}
                # The ratio of the same runs' rates: each run against the one next to it.
                ratio = [pick([rate(p, key[x], b)[0] / rate(q, key[y], b)[0] for p, q in zip(runs[x], runs[y])],
                              args.stat) for x, y in pairs]
                print(f"{w:>2} {s:>2} {op.replace('_', ' '):>9} {b:>6} | "
                      + " | ".join(f"{got[c][0]:>{width[c]}.3e} {got[c][1]:>5.2f}" for c in cols) + " | "
                      + " ".join(f"{r:>{max(8, len(x + y) + 1)}.2f}" for r, (x, y) in zip(ratio, pairs)), flush=True)


if __name__ == "__main__":
    sys.exit(main())
