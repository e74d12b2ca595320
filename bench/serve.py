"""Serving (docs/design.md, "Serving"): one run, one model, the same samples, three tables.

    python bench/serve.py                     # WDL on the synthetic Criteo data

- dense: the bundle's dense part (its ONNX model) in ONNX Runtime against the same MLP in PyTorch
  eager (torch.inference_mode, the weights copied from the bundle), in process, at batch 1, 64
  and 1024, both on the same number of threads (--threads: 2, then 1). The PyTorch model is the
  ONNX graph run op by op with torch's kernels, a MatMul and its bias add as one torch.addmm (as
  nn.Linear runs them), the bias broadcasts (ONNX Shape/Expand) left to torch's broadcasting; its
  output is checked against ONNX Runtime's. Milliseconds per call: the median (and the fastest)
  over calls repeated for --repeat-s seconds. Without PyTorch its columns are left out.
- endpoint: python -m hetu.serve run on the bundle, asked by 1 and 8 concurrent clients (aiohttp,
  in this process, on the same cores) sending batches of 1 and 64 raw instances one request
  after another for --seconds, --rounds times: p50 / p99 latency, requests/s, predictions/s and
  the server's mean batch; then predictions/s at saturation (batch 64, 32 clients). With
  --baseline DIR, a second server runs the hetu package in DIR (e.g. a worktree's python/ with
  its _C and _ps) in the same rounds, and this build's predictions/s over it, paired by round.
- swap: the server follows a training job (run_hetu.py --resume, a save every --save-every steps,
  every --full-every-th full, deltas between) while 8 clients send batches of 1: requests answered
  during the job, failures, versions written and served, and per new version served the seconds
  from its arrival (its folder's change time) to its first answer.
"""
import argparse
import asyncio
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import numpy as np

from common.launch import baseline_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCHES = (1, 64, 1024)
TRAIN = ["--no-progress", "--iters-per-epoch", "30", "--batch-size", "64"]


# --- the model ------------------------------------------------------------------------------------

def train(args, work, extra):
    env = dict(os.environ, HETU_DATA_HOME=os.path.join(work, "data"), HETU_NUM_THREADS="1")
    cmd = [sys.executable, os.path.join(ROOT, "examples/ctr/run_hetu.py"), *TRAIN, "--model", args.model,
           "--rows", str(args.rows), "--embedding-size", str(args.embedding_size), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def trained_bundle(args, work):
    """(checkpoint folder, bundle path) of one epoch of training."""
    from hetu.serve.export import export
    ckpt = os.path.join(work, "ckpt")
    job = train(args, work, ["--nepoch", "1", "--checkpoint", ckpt])
    out, _ = job.communicate()
    if job.returncode:
        sys.exit(f"bench/serve.py: training failed:\n{out[-3000:]}")
    return ckpt, export(ckpt, os.path.join(work, "bundle"))


# --- dense: ONNX Runtime against PyTorch eager ---------------------------------------------------

def torch_model(onnx_model):
    """A function of the ONNX graph's inputs (torch tensors) -> its output, op by op in torch."""
    import torch
    from onnx import helper, numpy_helper
    graph = onnx_model.graph
    values = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in graph.initializer}
    shape_of = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Shape"}
    # A bias broadcast to a MatMul's output shape (Expand(bias, Shape(x))) is the bias itself.
    broadcast = {n.output[0]: n.input[0] for n in graph.node
                 if n.op_type == "Expand" and n.input[1] in shape_of and n.input[0] in values}
    consumers = {}
    for n in graph.node:
        for x in n.input:
            consumers.setdefault(x, []).append(n)
    unused_shapes = {x for x in shape_of if all(c.output[0] in broadcast for c in consumers.get(x, []))}
    fused = {}   # MatMul output -> the Add that takes it with a bias: torch.addmm
    for n in graph.node:
        users = [c for c in consumers.get(n.output[0], []) if c.output[0] not in unused_shapes]
        if n.op_type == "MatMul" and n.input[1] in values and len(users) == 1:
            add = users[0]
            other = [x for x in add.input if x != n.output[0]]
            if add.op_type == "Add" and len(other) == 1 and broadcast.get(other[0], other[0]) in values:
                fused[n.output[0]] = (add, values[broadcast.get(other[0], other[0])])
    skipped = set(broadcast) | unused_shapes | {add.output[0] for add, _ in fused.values()}
    attrs = {n.output[0]: {a.name: helper.get_attribute_value(a) for a in n.attribute} for n in graph.node}

    def run(node, x):
        op, a = node.op_type, attrs[node.output[0]]
        if op == "MatMul":
            if node.output[0] in fused:
                add, bias = fused[node.output[0]]
                return add.output[0], torch.addmm(bias, x[0], x[1])
            return node.output[0], torch.matmul(x[0], x[1])
        simple = {"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div, "Pow": torch.pow,
                  "Relu": torch.relu, "Sigmoid": torch.sigmoid, "Tanh": torch.tanh, "Exp": torch.exp,
                  "Log": torch.log, "Sqrt": torch.sqrt, "Neg": torch.neg, "Where": torch.where}
        if op in simple:
            return node.output[0], simple[op](*x)
        if op == "Identity":
            return node.output[0], x[0]
        if op == "Reshape":
            shape = [x[0].shape[i] if s == 0 else int(s) for i, s in enumerate(x[1].tolist())]
            return node.output[0], x[0].reshape(shape)
        if op == "Concat":
            return node.output[0], torch.cat(x, dim=a["axis"])
        if op == "Transpose":
            return node.output[0], x[0].permute(*a["perm"])
        if op == "Softmax":
            return node.output[0], torch.softmax(x[0], dim=a.get("axis", -1))
        if op == "LeakyRelu":
            return node.output[0], torch.nn.functional.leaky_relu(x[0], a.get("alpha", 0.01))
        if op in ("ReduceSum", "ReduceMean"):
            axes = a.get("axes") or (x[1].tolist() if len(x) > 1 else list(range(x[0].dim())))
            reduce = torch.sum if op == "ReduceSum" else torch.mean
            return node.output[0], reduce(x[0], dim=axes, keepdim=bool(a.get("keepdims", 1)))
        if op == "Sum":
            return node.output[0], sum(x[1:], x[0])
        if op == "Expand":
            return node.output[0], torch.broadcast_to(x[0], torch.broadcast_shapes(x[0].shape, tuple(x[1].tolist())))
        raise SystemExit(f"bench/serve.py: no PyTorch mapping of ONNX op {op} ({node.name})")

    output = graph.output[0].name

    def forward(feed):
        env = dict(values)
        env.update(feed)
        for node in graph.node:
            if node.output[0] in skipped:
                continue
            if node.op_type == "Shape":
                env[node.output[0]] = torch.tensor(env[node.input[0]].shape)
                continue
            name, value = run(node, [env[broadcast.get(i, i)] for i in node.input])
            env[name] = value
        return env[output]

    return forward


def per_call_ms(call, repeat_s):
    """(median, fastest) milliseconds of call()."""
    for _ in range(10):
        call()
    times = []
    end = time.perf_counter() + repeat_s
    while time.perf_counter() < end or len(times) < 20:
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return float(np.median(times) * 1e3), float(np.min(times) * 1e3)


def dense_table(args, bundle, threads):
    """ONNX Runtime's calls first, then PyTorch's: each runtime's threads idle while the other's
    are timed (ONNX Runtime's spin after a call, which on 2 cores stalls PyTorch's OpenMP)."""
    import gc

    import onnx
    import onnxruntime as ort
    model_path = os.path.join(bundle.path, bundle.schema["onnx"]["file"])
    model = onnx.load(model_path)
    rng = np.random.default_rng(0)
    feeds = {}
    for batch in BATCHES:
        feeds[batch] = {}
        for i in model.graph.input:
            dims = [batch if d.dim_param else d.dim_value for d in i.type.tensor_type.shape.dim]
            feeds[batch][i.name] = rng.standard_normal(dims).astype(np.float32) * 0.1
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.log_severity_level = 3
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    ort_ms = {b: per_call_ms(lambda: session.run(None, feeds[b]), args.repeat_s) for b in BATCHES}
    ort_out = {b: session.run(None, feeds[b])[0].reshape(-1) for b in BATCHES}
    del session
    gc.collect()
    time.sleep(0.5)
    try:
        import torch
    except ImportError:
        torch = None
        print("# dense: PyTorch is not installed: its column is left out")
    torch_ms, diff = {}, {}
    if torch is not None:
        torch.set_num_threads(threads)
        forward = torch_model(model)
        with torch.inference_mode():
            for b in BATCHES:
                tfeed = {k: torch.from_numpy(v) for k, v in feeds[b].items()}
                torch_ms[b] = per_call_ms(lambda: forward(tfeed), args.repeat_s)
                diff[b] = float(np.abs(forward(tfeed).numpy().reshape(-1) - ort_out[b]).max())
    print(f"\n## dense part: ONNX Runtime {ort.__version__} vs PyTorch {torch.__version__ if torch else '-'} eager, "
          f"in process, {threads} thread{'s' if threads > 1 else ''} each; ms per call, median (fastest)")
    print(f"{'batch':>6} {'ONNX Runtime ms':>17} {'PyTorch ms':>17} {'ORT speedup':>15} {'max |diff|':>11}")
    rows = []
    for b in BATCHES:
        line = f"{b:>6} {f'{ort_ms[b][0]:.3f} ({ort_ms[b][1]:.3f})':>17}"
        if torch is not None:
            speedup = f"{torch_ms[b][0] / ort_ms[b][0]:.2f}x ({torch_ms[b][1] / ort_ms[b][1]:.2f}x)"
            line += f" {f'{torch_ms[b][0]:.3f} ({torch_ms[b][1]:.3f})':>17} {speedup:>15} {diff[b]:>11.1e}"
        print(line, flush=True)
        rows.append(line)
    return rows


# --- the endpoint ---------------------------------------------------------------------------------

def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, args, bundle_path, work, *extra, env=None):
        self.port = free_port()
        self.log_path = os.path.join(work, f"server-{self.port}.log")
        self.log = open(self.log_path, "w")
        cmd = [sys.executable, "-m", "hetu.serve", "run", bundle_path, "--port", str(self.port),
               "--max-batch", str(args.max_batch), "--max-wait-ms", str(args.max_wait_ms),
               "--model-threads", str(args.model_threads), *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.base = f"http://127.0.0.1:{self.port}"

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as r:
            return json.load(r)

    def wait_ready(self, name):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"bench/serve.py: the server exited:\n{open(self.log_path).read()}")
            try:
                return self.get(f"/v1/models/{name}")
            except OSError:
                time.sleep(0.1)
        sys.exit(f"bench/serve.py: the server at {self.base} did not answer within 60 s")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()
        return open(self.log_path).read()


def load(url, batches, clients_count, seconds):
    from hetu_tools.serve_load import clients
    end = time.monotonic() + seconds
    t0 = time.perf_counter()
    answers = asyncio.run(clients(url, batches, clients_count, stop_when=lambda: time.monotonic() > end))
    return [a for c in answers for a in c], time.perf_counter() - t0


def endpoint_case(server, url, stats_path, batches, count, seconds):
    """(p50 ms, p99 ms, requests/s, predictions/s, mean batch, failed) of `count` clients."""
    from hetu_tools.serve_load import percentile_ms
    before = server.get(stats_path)
    answers, elapsed = load(url, batches, count, seconds)
    after = server.get(stats_path)
    ok = [a for a in answers if a.ok]
    latencies = [a.latency for a in ok]
    mean_batch = (after["instances"] - before["instances"]) / max(1, after["batches"] - before["batches"])
    return (percentile_ms(latencies, 50), percentile_ms(latencies, 99), len(ok) / elapsed,
            len(ok) * len(batches[0]) / elapsed, mean_batch, len(answers) - len(ok))


def endpoint_table(args, bundle, work):
    """Each case --rounds times, the rounds of all cases interleaved (a neighbour's burst of load
    falls on one round of a case, not on all): the median round's figures, and the p99's range.
    With --baseline, a second server runs another build of hetu on the same bundle, each case's
    round sent to both in turn (which first alternates by round), and the table adds this
    build's predictions/s over the baseline's, paired round by round."""
    from hetu_tools.serve_load import random_instances
    servers = {"this build": Server(args, bundle.path, work)}
    if args.baseline:
        servers[f"baseline ({args.baseline})"] = Server(args, bundle.path, work, env=baseline_env(args.baseline))
    for server in servers.values():
        server.wait_ready(bundle.name)
    stats_path = f"/v1/models/{bundle.name}/stats"
    cases = [(1, 1), (1, 8), (64, 1), (64, 8), (64, 32)]
    batches = {batch: [random_instances(bundle, batch, seed=1000 + k) for k in range(64)] for batch in (1, 64)}
    results = {(name, case): [] for name in servers for case in cases}
    for r in range(args.rounds):
        for batch, count in cases:
            for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
                url = f"{servers[name].base}/v1/models/{bundle.name}:predict"
                load(url, batches[batch], count, 0.3)   # warm up
                results[name, (batch, count)].append(endpoint_case(servers[name], url, stats_path, batches[batch],
                                                                   count, args.seconds))
    for server in servers.values():
        server.stop()
    rows = []
    for name in servers:
        print(f"\n## endpoint ({name}): python -m hetu.serve run, --max-batch {args.max_batch} --max-wait-ms "
              f"{args.max_wait_ms} --model-threads {args.model_threads}; aiohttp clients in one process on the same "
              f"cores; {args.rounds} rounds of {args.seconds} s a case, the median round (by p99) and the p99's range")
        print(f"{'batch':>6} {'clients':>8} {'p50 ms':>8} {'p99 ms':>8} {'p99 range':>13} {'requests/s':>11} "
              f"{'predictions/s':>14} {'mean batch':>11} {'failed':>7}")
        for batch, count in cases:
            rounds = sorted(results[name, (batch, count)], key=lambda r: r[1])
            p50, p99, rps, pps, mean_batch, _ = rounds[len(rounds) // 2]
            failed = sum(r[5] for r in rounds)
            spread = f"{rounds[0][1]:.2f}-{rounds[-1][1]:.2f}"
            line = (f"{batch:>6} {count:>8} {p50:>8.2f} {p99:>8.2f} {spread:>13} {rps:>11,.0f} {pps:>14,.0f} "
                    f"{mean_batch:>11.1f} {failed:>7}")
            print(line + ("   <- saturation" if count == 32 else ""), flush=True)
            rows.append(line)
    if args.baseline:
        this, base = servers
        print("\n## predictions/s, this build / the baseline, paired round by round: median (range)")
        for batch, count in cases:
            ratios = [a[3] / b[3] for a, b in zip(results[this, (batch, count)], results[base, (batch, count)])]
            print(f"{batch:>6} {count:>8} {np.median(ratios):>8.2f}x ({min(ratios):.2f}-{max(ratios):.2f})", flush=True)
    return rows


# --- a large body -----------------------------------------------------------------------------------

def post(url, body, timeout=120):
    request = urllib.request.Request(url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        response.read()
        return response.status


def body_table(args, bundle, work):
    """One client sends --body-instances instances in one request while another sends 4-instance
    requests back to back: how long the large one takes, and how long the small ones waited."""
    from hetu_tools.serve_load import random_instances
    large = random_instances(bundle, 500, seed=1)
    large = large * -(-args.body_instances // len(large))
    body = json.dumps({"instances": large[:args.body_instances]}).encode()
    small = json.dumps({"instances": large[:4]}).encode()
    server = Server(args, bundle.path, work, "--max-instances", str(args.body_instances),
                    "--max-body-bytes", str(len(body) + 1024))
    server.wait_ready(bundle.name)
    url = f"{server.base}/v1/models/{bundle.name}:predict"
    waits, stop = [], threading.Event()

    def prober():
        while not stop.is_set():
            started = time.perf_counter()
            post(url, small)
            waits.append(time.perf_counter() - started)

    thread = threading.Thread(target=prober)
    thread.start()
    time.sleep(1.0)
    started = time.perf_counter()
    status = post(url, body)
    large_s = time.perf_counter() - started
    time.sleep(0.5)
    stop.set()
    thread.join()
    server.stop()
    waits_ms = sorted(w * 1e3 for w in waits)
    print(f"\n## a large body: {args.body_instances:,} instances, {len(body) / 1e6:.1f} MB, beside a client sending "
          f"4 instances a request back to back; --max-batch {args.max_batch}")
    print(f"{'large status':>13} {'large s':>8} {'small requests':>15} {'small p50 ms':>13} {'small p99 ms':>13} "
          f"{'small max ms':>13}")
    print(f"{status:>13} {large_s:>8.2f} {len(waits_ms):>15,} {waits_ms[len(waits_ms) // 2]:>13.1f} "
          f"{waits_ms[int(len(waits_ms) * 0.99)]:>13.1f} {waits_ms[-1]:>13.0f}")


# --- a swap under load ----------------------------------------------------------------------------

class ArrivalWatch(threading.Thread):
    """Notes each version of the checkpoint folder as it appears: its change time, full or delta."""

    def __init__(self, ckpt):
        super().__init__(daemon=True)
        self.ckpt, self.arrivals, self.done = ckpt, {}, threading.Event()

    def run(self):
        from hetu.serve.export import checkpoint_version
        from hetu.serve.watch import appeared_at
        while not self.done.is_set():
            try:
                version = checkpoint_version(self.ckpt)
                if version not in self.arrivals:
                    deltas = os.path.join(self.ckpt, "deltas")
                    kind = "delta" if os.path.isdir(deltas) and any(
                        not n.startswith(".") for n in os.listdir(deltas)) else "full"
                    self.arrivals[version] = (appeared_at(self.ckpt), kind)
            except (OSError, ValueError):
                pass
            time.sleep(0.002)


def swap_table(args, bundle, ckpt, work):
    from hetu_tools.serve_load import clients, random_instances
    live = os.path.join(work, "live")
    shutil.copytree(ckpt, live)
    server = Server(args, bundle.path, work, "--watch", live)
    server.wait_ready(bundle.name)
    url = f"{server.base}/v1/models/{bundle.name}:predict"
    batches = [random_instances(bundle, 1, seed=2000 + k) for k in range(64)]
    arrivals = ArrivalWatch(live)
    arrivals.start()
    job = train(args, work, ["--resume", live, "--checkpoint", live, "--nepoch", str(args.swap_epochs),
                             "--checkpoint-every", str(args.save_every), "--checkpoint-full-every",
                             str(args.full_every)])
    state = {}

    def stop_when():
        # 1 s after the job ends: the server serves its last version by then.
        if job.poll() is None:
            return False
        return time.monotonic() > state.setdefault("end", time.monotonic() + 1.0)

    t0 = time.time()
    answers = asyncio.run(clients(url, batches, 8, stop_when=stop_when))
    elapsed = time.time() - t0
    job.communicate()
    arrivals.done.set()
    log = server.stop()
    flat = sorted((a for c in answers for a in c), key=lambda a: a.at)
    ok = [a for a in flat if a.ok]
    first_answer = {}
    for a in ok:
        first_answer.setdefault(a.version, a.at)
    lags = {"delta": [], "full": []}
    for version, (appeared, kind) in arrivals.arrivals.items():
        if version in first_answer and version != bundle.version:
            lags[kind].append(first_answer[version] - appeared)
    served = sorted(first_answer)
    print(f"\n## swap under load: a training job (a save every {args.save_every} steps, every "
          f"{args.full_every}th full) followed by the server, 8 clients x batch 1")
    print(f"{'requests answered':>18} {'failed':>7} {'seconds':>8} {'versions written':>17} {'versions served':>16}")
    line = (f"{len(ok):>18,} {len(flat) - len(ok):>7} {elapsed:>8.1f} {len(arrivals.arrivals):>17} "
            f"{len(served):>16}")
    print(line)
    print(f"{'arrival -> first answer':<24} {'versions':>9} {'median s':>9} {'max s':>7}")
    rows = [line]
    for kind in ("delta", "full"):
        if lags[kind]:
            row = f"{kind:<24} {len(lags[kind]):>9} {np.median(lags[kind]):>9.3f} {max(lags[kind]):>7.3f}"
            print(row)
            rows.append(row)
    rising = all([a.version for a in c if a.ok] == sorted(a.version for a in c if a.ok) for c in answers)
    print(f"versions only rising per client: {rising}; swap lines printed by the server: "
          f"{sum(1 for x in log.splitlines() if x.startswith('serving version'))}")
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="wdl_criteo")
    p.add_argument("--rows", type=int, default=20000, help="synthetic samples")
    p.add_argument("--embedding-size", type=int, default=16)
    p.add_argument("--threads", type=int, nargs="+", default=[2, 1],
                   help="ONNX Runtime's and PyTorch's threads in the dense part (a table for each)")
    p.add_argument("--repeat-s", type=float, default=1.0, help="seconds each dense case repeats")
    p.add_argument("--seconds", type=float, default=2.0, help="seconds each endpoint case sends, a round")
    p.add_argument("--rounds", type=int, default=3, help="rounds of the endpoint's cases")
    p.add_argument("--max-batch", type=int, default=256)
    p.add_argument("--max-wait-ms", type=float, default=0.0)
    p.add_argument("--model-threads", type=int, default=1, help="the server's ONNX Runtime threads")
    p.add_argument("--swap-epochs", type=int, default=12, help="epochs of 30 steps the followed job reaches")
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--full-every", type=int, default=4)
    p.add_argument("--body-instances", type=int, default=157_500, help="body: the large request's instances")
    p.add_argument("--parts", default="dense,endpoint,swap", help="of dense, endpoint, swap, body")
    p.add_argument("--baseline", default=None,
                   help="endpoint: also serve with the hetu package in this folder (another build, e.g. a worktree's "
                        "python/ with its _C and _ps), the two in turn (bench/common/launch.baseline_env)")
    args = p.parse_args()
    from hetu.serve.bundle import Bundle
    parts = args.parts.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as work:
        ckpt, path = trained_bundle(args, work)
        bundle = Bundle.open(path)
        print(f"# bench/serve.py: {args.model}, embedding {args.embedding_size}, version {bundle.version}; "
              f"{len(os.sched_getaffinity(0))} cores")
        if "dense" in parts:
            for threads in args.threads:
                dense_table(args, bundle, threads)
        if "endpoint" in parts:
            endpoint_table(args, bundle, work)
        if "swap" in parts:
            swap_table(args, bundle, ckpt, work)
        if "body" in parts:
            body_table(args, bundle, work)


if __name__ == "__main__":
    main()
