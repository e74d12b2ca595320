"""Single-worker training throughput: hetu vs PyTorch on WDL and on DLRM
over multi-hot Criteo.

`--model wdl`: hetu.models' wdl_criteo in hetu and the same architecture in
PyTorch (one shared sparse nn.Embedding table, deep MLP 256-256-256-1 on concat(flattened
embeddings, dense), wide: a weight per id (a sparse width-1 nn.Embedding) and a linear layer on
dense), on the synthetic Criteo-shaped data.
`--model dlrm`: hetu.models' dlrm_criteo over every field's bag (26 multi-hot
fields, 214 ids a sample) in hetu, and bench/common/torch_dlrm.py's PyTorch DLRM with one shared
nn.EmbeddingBag(mode="sum", sparse=True) table, on synthetic-criteo-multihot. PyTorch is given
its best form: each batch's (values, offsets) bag input is built before the timed windows, and
SGD takes the table's sparse gradient as it is (Adam: SparseAdam on the table). Both: mean
BCE-with-logits; prints samples/s side by side.

Each framework runs in its own subprocess (thread and malloc settings must be in the
environment before start): hetu, PyTorch with glibc's default malloc, and PyTorch with
MALLOC_MMAP_MAX_=0 MALLOC_TRIM_THRESHOLD_=68719476736. All use 2 threads (torch.set_num_threads,
OMP/OPENBLAS/MKL_NUM_THREADS, HETU_NUM_THREADS) and are fed the same pre-sliced contiguous batches
of in-memory arrays (hetu through ht.dataloader_op without prefetch, whose batches are views of
those arrays); data generation, model set-up and warm-up are outside the timed windows. After
warm-up the workers take turns, one window of N steps each (hetu, torch, torch tuned, hetu, ...),
so that a loaded machine's noise falls on all three alike, each window after --settle seconds of
idling (PyTorch's threads spin-wait after its window and would share the next one's cores).

Columns: median samples/s of each; hetu/best = hetu median / the faster torch median (the
number the targets apply to: >= 1.2x at batch >= 1024, >= 1.0x at batch 128); paired = median
over rounds of hetu / best torch in the same round; best-win = best hetu window / best torch
window (the least disturbed throughput of each). With --baseline DIR, another build of hetu (the
`hetu` package in DIR, e.g. main's) takes its turn in every round too (base, base/best and its
paired ratio): before and after on the same machine at the same time.

--profile: instead of throughput, a step's time by op family (bag pooling, bag gradient,
unique-and-sum, optimizer step, GEMMs, elementwise, loss, data feed, framework overhead) for hetu
and PyTorch (tuned malloc) side by side, from the least disturbed of --windows rounds, and beside
hetu's GEMMs the same products as bare np.matmul calls (bench/step_profile.py).

    python bench/single_worker.py            # WDL, all 12 configs
    python bench/single_worker.py --quick    # WDL, batch 128 and 4096, embedding 16, SGD and Adam
    python bench/single_worker.py --model dlrm --opt sgd   # DLRM multi-hot, batch 128/1024/4096, embedding 16/64
    python bench/single_worker.py --model dlrm --opt sgd rowwise_adagrad --batch 128 1024 --baseline /path/to/main/build
    python bench/single_worker.py --profile --model dlrm --batch 1024 --emb 64 --opt sgd
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import step_profile
from common.launch import baseline_env

THREADS = 2
LR = {"sgd": 0.01, "adam": 0.001, "rowwise_adagrad": 0.01}
ADAGRAD_EPS = 1e-7   # hetu's row-wise AdaGrad default (PyTorch's Adagrad: 1e-10)
OPTIMIZERS = tuple(LR)
TUNED_MALLOC = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# each model's data, and the embedding sizes it is measured at by default
MODELS = {"wdl": {"title": "WDL criteo", "dataset": "synthetic-criteo", "embs": (16, 128)},
          "dlrm": {"title": "DLRM criteo multi-hot", "dataset": "synthetic-criteo-multihot", "embs": (16, 64)}}


def thread_env():
    t = str(THREADS)
    return {"OMP_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t, "MKL_NUM_THREADS": t, "HETU_NUM_THREADS": t}


def steps_per_window(batch):
    return max(5, 8192 // batch)


# --- data ----------------------------------------------------------------------------------------
def load_batches(cfg):
    """The first cfg["batches"] batches of the model's training data as contiguous in-memory
    arrays (dense, sparse, labels), and the data's meta."""
    import numpy as np
    from hetu.data import load_dataset
    data = load_dataset(MODELS[cfg["model"]]["dataset"], rows=cfg["rows"])
    n = min(len(data.train), cfg["batches"] * cfg["batch"])
    dense = np.ascontiguousarray(data.train.dense[:n], dtype=np.float32)
    sparse = np.ascontiguousarray(data.train.sparse[:n], dtype=np.int64)
    labels = np.ascontiguousarray(data.train.labels[:n], dtype=np.float32).reshape(n, 1)
    return dense, sparse, labels, data.meta


def serve_windows(step, warmup, n):
    """Warm up, say READY, then time one window of n steps per line read from stdin."""
    for _ in range(warmup):
        step()
    print("READY", flush=True)
    for line in sys.stdin:
        if line.strip() != "window":
            break
        t0 = time.perf_counter()
        for _ in range(n):
            step()
        print(f"WINDOW {time.perf_counter() - t0!r}", flush=True)


def print_profile(profile):
    print("PROFILE " + json.dumps(profile), flush=True)


# --- hetu ----------------------------------------------------------------------------------------
def run_hetu(cfg):
    import hetu as ht
    from hetu.models import MODELS
    batch, emb, opt = cfg["batch"], cfg["emb"], cfg["opt"]
    dense, sparse, labels, meta = load_batches(cfg)

    def loader(a):
        return ht.dataloader_op([ht.Dataloader(a, batch, "train", prefetch=0)])

    optimizer = {"sgd": lambda: ht.optim.SGDOptimizer(learning_rate=LR["sgd"]),
                 "adam": lambda: ht.optim.AdamOptimizer(learning_rate=LR["adam"]),
                 "rowwise_adagrad": lambda: ht.optim.RowwiseAdaGradOptimizer(learning_rate=LR["rowwise_adagrad"]),
                 }[opt]()
    loss, prediction, y_, train_op = MODELS[cfg["model"]](
        loader(dense), loader(sparse), loader(labels), meta.fields, embedding_size=emb, optimizer=optimizer)
    executor = ht.Executor({"train": [loss, prediction, y_, train_op]}, ctx=ht.cpu(0), seed=123)

    def step():
        executor.run("train")

    if cfg.get("profile"):
        return print_profile(step_profile.quietest(
            cfg["windows"], lambda: step_profile.hetu_profile(executor, cfg["steps"], cfg["warmup"])))
    return serve_windows(step, cfg["warmup"], cfg["steps"])


# --- PyTorch -------------------------------------------------------------------------------------
def run_torch(cfg):
    import torch
    torch.set_num_threads(THREADS)
    torch.manual_seed(123)
    batch = cfg["batch"]
    dense, sparse, labels, meta = load_batches(cfg)
    rows = [slice(i * batch, (i + 1) * batch) for i in range(len(dense) // batch)]
    model, optimizers, batches = (torch_dlrm if cfg["model"] == "dlrm" else torch_wdl)(cfg, meta, rows, dense,
                                                                                       sparse, labels)
    step = torch_train_step(model, optimizers, batches)
    if cfg.get("profile"):
        return print_profile(step_profile.quietest(
            cfg["windows"], lambda: step_profile.torch_profile(step, cfg["steps"], cfg["warmup"])))
    return serve_windows(step, cfg["warmup"], cfg["steps"])


def torch_wdl(cfg, meta, batch_rows, dense, sparse, labels):
    """WDL, its optimizers, and batches (dense, ids, labels) of tensors."""
    import torch
    from torch import nn

    class WDL(nn.Module):
        def __init__(self, num_embeddings, embedding_size, num_fields=26, num_dense=13, hidden=(256, 256, 256)):
            super().__init__()
            self.embedding = nn.Embedding(num_embeddings, embedding_size, sparse=True)
            nn.init.normal_(self.embedding.weight, std=0.01)
            layers, width = [], num_fields * embedding_size + num_dense
            for h in hidden:
                layers += [nn.Linear(width, h), nn.ReLU()]
                width = h
            layers.append(nn.Linear(width, 1))
            self.deep = nn.Sequential(*layers)
            self.wide = nn.Linear(num_dense, 1)
            self.wide_ids = nn.Embedding(num_embeddings, 1, sparse=True)
            nn.init.normal_(self.wide_ids.weight, std=0.01)
            self.flat = num_fields * embedding_size

        def forward(self, dense_x, sparse_x):
            e = self.embedding(sparse_x).reshape(-1, self.flat)
            wide = self.wide(dense_x) + self.wide_ids(sparse_x).sum(dim=1)
            return self.deep(torch.cat([e, dense_x], dim=1)) + wide

    model = WDL(int(meta.num_embeddings), cfg["emb"])
    table = [model.embedding.weight, model.wide_ids.weight]
    others = [p for n, p in model.named_parameters() if not n.startswith(("embedding.", "wide_ids."))]
    if cfg["opt"] == "adam":
        optimizers = [torch.optim.SparseAdam(table, lr=LR["adam"]), torch.optim.Adam(others, lr=LR["adam"])]
    else:
        optimizers = torch_optimizers(model, cfg["opt"])
    batches = [(torch.from_numpy(dense[r]), torch.from_numpy(sparse[r]), torch.from_numpy(labels[r]))
               for r in batch_rows]
    return model, optimizers, batches


def torch_dlrm(cfg, meta, batch_rows, dense, sparse, labels):
    """bench/common/torch_dlrm.py's DLRM with a sparse table (SGD as it is, Adam: SparseAdam on the table),
    and batches (dense, bag values, bag offsets, labels) of tensors, the bags built here, outside
    the timed windows."""
    import torch
    from common.torch_dlrm import DLRM, bags_of, make_optimizers
    model = DLRM(int(meta.num_embeddings), cfg["emb"], meta.num_fields, meta.num_dense, sparse_table=True)
    optimizers = (make_optimizers(model, cfg["opt"], LR[cfg["opt"]], table="sparse") if cfg["opt"] in ("sgd", "adam")
                  else torch_optimizers(model, cfg["opt"]))
    batches = [(torch.from_numpy(dense[r]), *bags_of(sparse[r], meta.slot_offsets), torch.from_numpy(labels[r]))
               for r in batch_rows]
    return model, optimizers, batches


def torch_optimizers(model, opt):
    """SGD on every parameter (it takes the sparse table's gradient as it is), or for row-wise
    AdaGrad, which PyTorch does not have, torch.optim.Adagrad (its sparse path on the table, one
    accumulator per element where hetu keeps one per row) with hetu's eps."""
    import torch
    if opt == "sgd":
        return [torch.optim.SGD(model.parameters(), lr=LR["sgd"])]
    return [torch.optim.Adagrad(model.parameters(), lr=LR[opt], eps=ADAGRAD_EPS)]


def torch_train_step(model, optimizers, batches):
    """One training step per call, over `batches` (model inputs..., labels) in turn."""
    import torch
    from torch import nn
    lossf = nn.BCEWithLogitsLoss()
    it = [0]

    def step():
        *inputs, y = batches[it[0] % len(batches)]
        it[0] += 1
        for o in optimizers:
            o.zero_grad(set_to_none=True)
        logit = model(*inputs)
        loss = lossf(logit, y)
        loss.backward()
        for o in optimizers:
            o.step()
        # what hetu's executor hands back each step: loss and prediction
        loss.item()
        torch.sigmoid(logit.detach())

    return step


# --- driver --------------------------------------------------------------------------------------
def worker(argv):
    cfg = json.loads(argv)
    (run_hetu if cfg["framework"] == "hetu" else run_torch)(cfg)


class Worker:
    """One framework in its own process (thread and malloc settings in its environment)."""

    def __init__(self, framework, cfg, tuned_malloc=False, hetu_from=None):
        env = dict(os.environ)
        env.update(thread_env())
        for k in TUNED_MALLOC:
            env.pop(k, None)
        if tuned_malloc:
            env.update(TUNED_MALLOC)
        if hetu_from:   # another build of hetu: the folder that holds its package
            env = baseline_env(hetu_from, env)
        self.name = framework + (" (tuned malloc)" if tuned_malloc else "") + (f" from {hetu_from}" if hetu_from else "")
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--worker",
                                      json.dumps(dict(cfg, framework=framework))],
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
        self.times = []

    def _expect(self, prefix):
        line = self.proc.stdout.readline()
        if not line.startswith(prefix):
            self.proc.kill()
            raise RuntimeError(f"{self.name} worker failed: {line}{self.proc.stdout.read()[-2000:]}"
                               f"{self.proc.stderr.read()[-4000:]}")
        return line[len(prefix):].strip()

    def ready(self):
        self._expect("READY")

    def window(self):
        self.proc.stdin.write("window\n")
        self.proc.stdin.flush()
        self.times.append(float(self._expect("WINDOW ")))

    def close(self):
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
        except OSError:
            pass
        self.proc.wait()


def start_worker(key, cfg):
    """The worker of a framework key: hetu, hetu-base (cfg["baseline"]'s build of hetu), torch or
    torch-tuned."""
    return Worker("hetu" if key.startswith("hetu") else "torch", cfg, tuned_malloc=key == "torch-tuned",
                  hetu_from=cfg["baseline"] if key == "hetu-base" else None)


def profile(cfg, frameworks):
    """Each framework's step split by op family (bench/step_profile.py), one worker at a time."""
    out = {}
    for key in frameworks:
        w = start_worker(key, dict(cfg, profile=True))
        try:
            out[key] = json.loads(w._expect("PROFILE "))
        finally:
            w.close()
    return out


def measure(cfg, frameworks):
    """Median samples/s of each framework; their windows are interleaved (hetu, torch, torch
    tuned, hetu, ...) so that the machine's noise falls on all of them alike. The workers set
    up and warm up one after another, and only one runs a window at a time. Before each window
    the machine is left idle for cfg["settle"] seconds: a framework's threads spin-wait for a
    while after its window (OpenMP's and OpenBLAS's idle threads), and on a small host the
    window that follows would share its cores with them (measured on 2 cores: the framework
    run right after PyTorch lost 5-6% of its samples/s)."""
    workers = {}
    try:
        for key in frameworks:
            w = workers[key] = start_worker(key, cfg)
            w.ready()
        for _ in range(cfg["windows"]):
            for w in workers.values():
                time.sleep(cfg["settle"])
                w.window()
    finally:
        for w in workers.values():
            w.close()
    out = {}
    for key, w in workers.items():
        rates = [cfg["batch"] * cfg["steps"] / t for t in w.times]
        out[key] = (statistics.median(rates), rates)
    return out


def config(args, batch, emb, opt):
    """One configuration's settings, as the workers read them."""
    n = steps_per_window(batch)
    return {"model": args.model, "batch": batch, "emb": emb, "opt": opt, "rows": args.rows, "steps": n,
            "warmup": max(3, n // 3), "windows": args.windows, "settle": args.settle, "baseline": args.baseline,
            "batches": min(args.rows * 9 // 10 // batch, max(8, n))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="wdl")
    ap.add_argument("--quick", action="store_true", help="batch 128 and 4096, embedding 16 only")
    ap.add_argument("--batch", type=int, nargs="*", default=None)
    ap.add_argument("--emb", type=int, nargs="*", default=None)
    ap.add_argument("--opt", nargs="*", default=None, choices=OPTIMIZERS)
    ap.add_argument("--windows", type=int, default=5)
    ap.add_argument("--settle", type=float, default=0.5,
                    help="seconds the machine idles before each window, so that the previous framework's "
                         "spinning threads have stopped (default 0.5)")
    ap.add_argument("--rows", type=int, default=200000)
    ap.add_argument("--frameworks", default="hetu,torch,torch-tuned")
    ap.add_argument("--profile", action="store_true",
                    help="instead of throughput: a step's time by op family, hetu beside PyTorch (tuned malloc)")
    ap.add_argument("--baseline", default=None,
                    help="also measure the hetu package in this folder (another build, e.g. main's) as hetu-base")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker)
    batches = args.batch or ([128, 4096] if args.quick else [128, 1024, 4096])
    embs = args.emb or ([16] if args.quick else list(MODELS[args.model]["embs"]))
    opts = args.opt or ["sgd", "adam"]
    frameworks = args.frameworks.split(",")
    if args.baseline:
        frameworks.insert(frameworks.index("hetu") + 1 if "hetu" in frameworks else 0, "hetu-base")
    if args.profile:
        return print_profiles(args, batches, embs, opts, [f for f in frameworks if f != "torch"])
    print(f"{MODELS[args.model]['title']}, {MODELS[args.model]['dataset']} rows={args.rows}, {THREADS} threads, "
          f"median of {args.windows} windows", flush=True)
    base = "hetu-base" in frameworks
    header = (f"{'config':<26}{'hetu':>9}" + (f"{'base':>9}" if base else "") + f"{'torch':>9}{'torch-tuned':>13}"
              f"{'hetu/best':>11}{'paired':>8}{'best-win':>9}" + (f"{'base/best':>11}{'paired':>8}" if base else "")
              + "  target")
    print(header + "\n" + "-" * len(header), flush=True)
    results = []
    for batch in batches:
        for emb in embs:
            for opt in opts:
                cfg = config(args, batch, emb, opt)
                r = {"config": f"b{batch} e{emb} {opt}",
                     **{k: cfg[k] for k in ("model", "batch", "emb", "opt", "steps")}}
                for key, (median, rates) in measure(cfg, frameworks).items():
                    key = key.replace("-", "_")
                    r[key], r[key + "_windows"] = median, rates
                torches = [k for k in ("torch", "torch_tuned") if k in r]
                best = max((r[k] for k in torches), default=0)
                for key in ("hetu", "hetu_base"):
                    if key in r and best:
                        # against the best torch within each round of interleaved windows: less noise-prone
                        rounds = zip(r[key + "_windows"], *[r[k + "_windows"] for k in torches])
                        r[key + "_ratio"] = r[key] / best
                        r[key + "_paired_ratio"] = statistics.median(h / max(ts) for h, *ts in rounds)
                        # best window of each: the throughput with the least interference
                        r[key + "_best_window_ratio"] = max(r[key + "_windows"]) / max(
                            max(r[k + "_windows"]) for k in torches)
                target = 1.2 if batch >= 1024 else 1.0
                ratio = r.get("hetu_ratio", float("nan"))
                r["target"] = target
                results.append(r)
                nan = float("nan")
                print(f"{r['config']:<26}{r.get('hetu', 0):>9.0f}" + (f"{r.get('hetu_base', 0):>9.0f}" if base else "")
                      + f"{r.get('torch', 0):>9.0f}{r.get('torch_tuned', 0):>13.0f}{ratio:>10.2f}x"
                      f"{r.get('hetu_paired_ratio', nan):>7.2f}x{r.get('hetu_best_window_ratio', nan):>8.2f}x"
                      + (f"{r.get('hetu_base_ratio', nan):>10.2f}x{r.get('hetu_base_paired_ratio', nan):>7.2f}x"
                         if base else "")
                      + f"  >={target}x {'ok' if ratio >= target else 'BELOW'}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


def print_profiles(args, batches, embs, opts, frameworks):
    """--profile: a table per config, ms per step by op family for each framework."""
    results = []
    for batch in batches:
        for emb in embs:
            for opt in opts:
                cfg = config(args, batch, emb, opt)
                profiles = profile(cfg, frameworks)
                title = f"{MODELS[args.model]['title']} b{batch} e{emb} {opt}"
                print(step_profile.table(title, list(profiles.items())) + "\n", flush=True)
                results.append({"config": title, **profiles})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
