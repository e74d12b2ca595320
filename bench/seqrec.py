"""Sequential recommenders: hetu's SASRec and HSTU against the same models in PyTorch
(bench/common/torch_seqrec.py: the same initial weights, the same batches and negatives), and the rows
PS and the HET cache move on user histories.

  --part speed    ms a training step on one CPU worker, hetu and PyTorch eager in alternating
                  windows (the machine idles --settle s before each), medians over --windows
  --part quality  HR@10 / NDCG@10 after each epoch, hetu and PyTorch trained side by side
  --part rows     PS, HET (bound 0) and Herald at W workers under python/runner.py: rows moved
                  and samples/s from the workers' summary lines and --cache-perf CSVs (with
                  --epochs E > 1, the last epoch's apart: the caches warm); with --rate, every worker on a
                  network-namespace host of its own and the server on another, each host's link
                  shaped to the rate (hetu_tools.netns: needs root, iproute2, sshd and mpirun)

Examples:
  python bench/seqrec.py --part speed --model sasrec hstu --dataset movielens-sequences --batch 128
  python bench/seqrec.py --part quality --model sasrec --dataset movielens-sequences --epochs 20
  python bench/seqrec.py --part rows --model sasrec --dataset synthetic-sequences --workers 2
  python bench/seqrec.py --part rows --model sasrec --dataset data/longtail --workers 2 4 --rate 1gbit
  python bench/seqrec.py --part rows --model sasrec --dataset data/longtail --kinds shared --iters 0 --epochs 5
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))

import hetu as ht  # noqa: E402
from hetu.data import load_dataset  # noqa: E402
from hetu.models.sequential import SequenceConfig, build  # noqa: E402
from hetu.run.sequence_training import RANKS, TrainingColumns, first_columns  # noqa: E402
from common.summaries import WORKER_SUMMARY, cache_perf_rows  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(__doc__.splitlines()[2:]))
    p.add_argument("--part", choices=("speed", "quality", "rows"), required=True)
    p.add_argument("--model", nargs="+", default=["sasrec"], choices=("sasrec", "hstu"))
    p.add_argument("--dataset", default="movielens-sequences")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--embedding", type=int, default=50)
    p.add_argument("--negatives", type=int, default=128)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--heads", type=int, default=1)
    p.add_argument("--dropout", type=float, default=0.2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--windows", type=int, default=5, help="speed: alternating windows per framework")
    p.add_argument("--steps", type=int, default=3, help="speed: steps a window")
    p.add_argument("--settle", type=float, default=0.5, help="speed: idle seconds before each window")
    p.add_argument("--twin-dropout", choices=("hetu", "torch"), default="hetu",
                   help="quality: the PyTorch twin's dropout masks, hetu's (the same op, step and samples: the two "
                        "trainings differ by float rounding alone) or PyTorch's own (another draw each)")
    p.add_argument("--epochs", type=int, default=None,
                   help="quality: epochs (default 10); rows: epochs a run (default 1; with more, the last epoch's rows "
                        "are shown apart: the caches warm)")
    p.add_argument("--workers", type=int, nargs="+", default=[2], help="rows: worker counts")
    p.add_argument("--iters", type=int, default=20, help="rows: iterations an epoch at most (0: whole epochs)")
    p.add_argument("--cache-ratio", type=float, default=0.1, help="rows: HET's and Herald's cache, a share of the rows")
    p.add_argument("--rate", default=None, help="rows: a tc rate (e.g. 1gbit): namespace hosts, links shaped")
    p.add_argument("--kinds", nargs="+", default=["uniform"], choices=("uniform", "shared", "in-batch"),
                   help="rows: negatives per position (uniform), per global batch (shared), or per position from the global batch's targets (in-batch)")
    return p.parse_args()


class Pair:
    """hetu's model and its PyTorch twin from the same weights, over the same batches."""

    def __init__(self, kind, data, args):
        import torch
        from common.torch_seqrec import TorchSequential, hetu_dropout_masks
        self.torch = torch
        torch.set_num_threads(ht.threads.configure(None)[0])
        self.kind, self.data, self.args = kind, data, args
        meta = data.meta
        self.config = SequenceConfig(num_items=meta.num_items, max_length=meta.max_length,
                                     num_negatives=args.negatives, embedding_size=args.embedding, blocks=args.blocks,
                                     heads=args.heads, dropout=args.dropout)
        b = args.batch
        self.columns = TrainingColumns(self.config, args.seed)

        def loader(array, columns):
            return ht.Dataloader(array, b, "train", shuffle=True, seed=args.seed, columns=columns, prefetch=0)
        self.ids = ht.dataloader_op([loader(data.train.items, self.columns.ids)])
        self.index = ht.dataloader_op([loader(data.train.items, self.columns.index)])
        self.times = ht.dataloader_op([loader(data.train.times, first_columns(meta.max_length))]) \
            if kind == "hstu" else None
        self.user_in = ht.Variable("user_ids", dtype=np.int64)
        self.times_in = ht.Variable("user_times", dtype=np.int64) if kind == "hstu" else None
        optimizer = ht.optim.optimizer("adamw_catchup", learning_rate=args.lr, beta1=0.9, beta2=0.98,
                                       weight_decay=0.0)
        self.graph = build(kind, self.ids, self.index, self.times, self.config, optimizer)
        self.executor = ht.Executor({"train": [self.graph.loss, self.graph.train_op]}, seed=args.seed)
        self.twin = TorchSequential(kind, self.config, self.executor.parameters())
        self.twin_opt = torch.optim.AdamW(self.twin.parameters(), lr=args.lr, betas=(0.9, 0.98), weight_decay=0.0,
                                          eps=optimizer.config.eps)
        self.batches = self.ids.loader("train").batches
        self.step = 0   # the twin's
        # quality: the twin drops what hetu drops (a twin of the same computation); speed: its own
        # F.dropout, PyTorch at its best.
        self.masks_of = hetu_dropout_masks if args.part == "quality" and args.twin_dropout == "hetu" else None

    def hetu_step(self):
        return float(self.executor.run("train", convert_to_numpy_ret_vals=True)[0])

    def twin_step(self):
        torch, L = self.torch, self.config.max_length
        rows = self.batches.indices(self.step)   # the step's global batch: each epoch in its own order
        stored = np.asarray(self.data.train.items[rows])
        ids = self.columns.ids(self.step, rows, stored)
        index = self.columns.index(self.step, rows, stored)
        times = torch.tensor(np.asarray(self.data.train.times[rows])[:, :L]) if self.kind == "hstu" else None
        if self.masks_of is not None:   # the masks hetu's ops draw for these samples at this step
            self.twin.dropout_masks = self.masks_of(self.args.seed, self.step, rows, 1.0 - self.args.dropout)
        self.twin.train()
        self.twin_opt.zero_grad()
        loss = self.twin.loss(torch.tensor(ids), torch.tensor(index), times)
        loss.backward()
        self.twin_opt.step()
        self.step += 1
        return loss.item()

    def evaluate(self, chunk=256):
        """(hetu's, PyTorch's) HR / NDCG at RANKS over every user's held-out item."""
        torch, val, L = self.torch, self.data.val, self.config.max_length
        user_graph = self._hetu_user_graph()
        table = self.executor.parameters()["item_embedding"]
        table = table / np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-6)
        hetu_users, torch_users = [], []
        self.twin.eval()
        for begin in range(0, len(val.items), chunk):
            items = np.asarray(val.items[begin:begin + chunk])
            ids = np.concatenate([items, np.full((len(items), self.config.id_columns - L), -1, np.int64)], axis=1)
            index = np.full((len(items), L * self.config.num_negatives), -1, np.int64)
            times = np.asarray(val.times[begin:begin + chunk])[:, :L]
            feed = {self.user_in: ids, self.index_in: index}
            if self.times_in is not None:
                feed[self.times_in] = times
            hetu_users.append(user_graph.run(feed_dict=feed, convert_to_numpy_ret_vals=True, training=False)[0])
            with torch.no_grad():
                torch_users.append(self.twin.user_vectors(torch.tensor(ids), torch.tensor(times)
                                                          if self.kind == "hstu" else None).numpy())
        return {"hetu": self._ranks(np.concatenate(hetu_users), table),
                "torch": self._ranks(np.concatenate(torch_users), self.twin.normalized_items().detach().numpy())}

    def _hetu_user_graph(self):
        """The user vectors of the trained parameters, over fed histories."""
        if not hasattr(self, "_users"):
            self.index_in = ht.Variable("user_index", dtype=np.int64)
            g = build(self.kind, self.user_in, self.index_in, self.times_in, self.config,
                      ht.optim.optimizer("sgd", learning_rate=0.0))
            self._users = ht.Executor([g.user], seed=self.args.seed)
        for name, value in self.executor.parameters().items():
            self._users.params.values[next(p.id for p in self._users.graph.parameters if p.name == name)][...] = value
        return self._users

    def _ranks(self, users, table):
        val = self.data.val
        hits, ndcg = ht.metrics.ranking_hits(users, table, np.asarray(val.target), np.asarray(val.items), RANKS)
        return ht.metrics.ranking_summary(hits, ndcg, RANKS)


def speed(args, data):
    print("| model | dataset | batch | hetu ms/step | PyTorch ms/step | PyTorch / hetu |")
    print("|---|---|---|---|---|---|")
    for kind in args.model:
        pair = Pair(kind, data, args)
        runs = {"hetu": [], "torch": []}
        for step in (pair.hetu_step, pair.twin_step):
            step()   # warm-up
        for _ in range(args.windows):
            for name, step in (("hetu", pair.hetu_step), ("torch", pair.twin_step)):
                time.sleep(args.settle)
                start = time.perf_counter()
                for _ in range(args.steps):
                    step()
                runs[name].append((time.perf_counter() - start) / args.steps * 1000)
        h, t = np.median(runs["hetu"]), np.median(runs["torch"])
        ratios = np.array(runs["torch"]) / np.array(runs["hetu"])
        print(f"| {kind} | {args.dataset} | {args.batch} | {h:.0f} ({min(runs['hetu']):.0f}-{max(runs['hetu']):.0f}) "
              f"| {t:.0f} ({min(runs['torch']):.0f}-{max(runs['torch']):.0f}) | {np.median(ratios):.2f}x "
              f"({ratios.min():.2f}-{ratios.max():.2f}) |", flush=True)


def quality(args, data):
    for kind in args.model:
        pair = Pair(kind, data, args)
        per_epoch = pair.batches.batch_num
        print(f"{kind} on {args.dataset}: {per_epoch} steps an epoch, batch {args.batch}", flush=True)
        print("| epoch | hetu loss | PyTorch loss | hetu HR@10 | PyTorch HR@10 | hetu NDCG@10 | PyTorch NDCG@10 |")
        print("|---|---|---|---|---|---|---|")
        for epoch in range(args.epochs or 10):
            losses = [(pair.hetu_step(), pair.twin_step()) for _ in range(per_epoch)]
            h_loss, t_loss = np.mean(losses, axis=0)
            m = pair.evaluate()
            print(f"| {epoch + 1} | {h_loss:.4f} | {t_loss:.4f} | {m['hetu']['hr@10']:.4f} | {m['torch']['hr@10']:.4f} "
                  f"| {m['hetu']['ndcg@10']:.4f} | {m['torch']['ndcg@10']:.4f} |", flush=True)


def rows(args):
    if args.rate is None:
        return rows_table(args, lambda w: ["-w", str(w), "-s", "1"])
    from hetu_tools.netns import NamespaceHosts, NetnsUnavailable, shape
    try:
        with NamespaceHosts(max(args.workers) + 1) as hosts, tempfile.TemporaryDirectory() as d:
            for h in hosts:
                shape(h, rate=args.rate, delay=None)

            def where(w):   # host 0: the scheduler and the server; hosts 1..W: a worker each
                return ["-c", hosts.write_cluster_file(os.path.join(d, f"w{w}.yml"), workers=[0] + [1] * w,
                                                       servers=[1] + [0] * w, chief=0)]
            rows_table(args, where)
    except NetnsUnavailable as e:
        raise SystemExit(f"--rate needs network namespaces: {e}")


def rows_table(args, where):
    """The rows table, each run's cluster given by where(W) (runner.py's flags), then Herald's rows
    against HET's."""
    env = dict(os.environ, HETU_NUM_THREADS="1")
    # An absolute folder: the runs may start on other (namespace) hosts, in another folder.
    epochs = args.epochs or 1
    common = ["--no-progress", "--data-dir", str(load_dataset(args.dataset).path.resolve()), "--embedding-size", str(args.embedding), "--num-negatives",
              str(args.negatives), "--nepoch", str(epochs), "--dropout", str(args.dropout)]
    if args.iters:
        common += ["--iters-per-epoch", str(args.iters)]
    cache = ["--comm", "Hybrid", "--cache", "lru", "--cache-limit-ratio", str(args.cache_ratio)]
    modes = {"PS": (["--comm", "PS"], "run_hetu.py"), "HET": ([*cache, "--bound", "0"], "run_hetu.py"),
             "Herald": (cache, "run_laia.py")}
    warm = epochs > 1
    print("Rows moved: all workers' rows pulled and pushed, per iteration; 'run' counts every iteration and the "
          "final flush, 'last epoch' the iterations of the last epoch alone (the caches warm, no flush).")
    print(f"| model | dataset | negatives | W | link | mode | rows / iteration, run |{' last epoch |' if warm else ''} "
          "MB / iteration, run | samples/s |")
    print(f"|---|---|---|---|---|---|---|{'---|' if warm else ''}---|---|")
    moved = {}
    for kind, negatives, w in ((k, n, w) for k in args.model for n in args.kinds for w in args.workers):
        for mode, (flags, script) in modes.items():
            with tempfile.TemporaryDirectory() as csv_dir:
                cmd = [sys.executable, str(REPO / "python/runner.py"), *where(w), sys.executable,
                       str(REPO / "examples/ctr" / script), "--model", kind, *common, "--negatives", negatives, *flags,
                       "--bsp", "0", "--batch-size", str(args.batch), "--cache-perf", "--csv-dir", csv_dir]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
                per_iteration, flush = cache_perf_rows(csv_dir)
            # Every worker prints its summary: the rows of all of them.
            lines = [json.loads(s) for _, s in WORKER_SUMMARY.findall(proc.stdout)]
            row = f"| {kind} | {args.dataset} | {negatives} | {w} | {args.rate or 'loopback'} | {mode} |"
            if proc.returncode or len(lines) != w or not per_iteration:
                print(f"{row} failed: {proc.stderr.strip()[-200:]} |")
                continue
            run = (sum(per_iteration) + flush) / len(per_iteration)
            per_epoch = -(-len(per_iteration) // epochs)   # iterations an epoch
            last = per_iteration[-per_epoch:]
            moved[kind, negatives, w, mode] = run, sum(last) / len(last)
            mb = sum(x["counters"]["bytes_pulled"] + x["counters"]["bytes_pushed"] for x in lines) / len(per_iteration) / 2**20
            print(f"{row} {run:,.0f} |{f' {sum(last) / len(last):,.0f} |' if warm else ''} {mb:.1f} | "
                  f"{lines[0]['samples_per_second']:.0f} |", flush=True)
    print()
    print(f"| model | dataset | negatives | W | Herald / HET, run |{' last epoch |' if warm else ''}")
    print(f"|---|---|---|---|---|{'---|' if warm else ''}")
    for kind, negatives, w in ((k, n, w) for k in args.model for n in args.kinds for w in args.workers):
        het, herald = moved.get((kind, negatives, w, "HET")), moved.get((kind, negatives, w, "Herald"))
        if het and herald:
            print(f"| {kind} | {args.dataset} | {negatives} | {w} | {herald[0] / het[0]:.2f} |"
                  f"{f' {herald[1] / het[1]:.2f} |' if warm else ''}")


def main():
    args = parse()
    if args.part == "rows":
        return rows(args)
    data = load_dataset(args.dataset)
    (speed if args.part == "speed" else quality)(args, data)


if __name__ == "__main__":
    main()
