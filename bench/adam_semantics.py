"""Lazy row-wise Adam against dense Adam: what the table's optimizer semantics cost in quality.

hetu steps an embedding table's rows under Adam lazily: a row not read in a step is not stepped
(its moments do not decay, it does not move), and each row counts its own steps for the bias
correction (FBGEMM's and TF's LazyAdam). torch.optim.Adam with dense gradients steps every row
every step: rows not read decay their moments and keep moving on their momentum.

The same DLRM (bench/common/torch_dlrm.py) trains once under each table rule, from the same initial
parameters (the seed's draw) and in the same data order (the train split in stored order, as
ht.Dataloader), and is scored on the whole validation split by hetu.metrics. Dense parameters
take torch.optim.Adam under every rule. Rules (`--rules`):

* rowwise: hetu's rule written in PyTorch (torch_dlrm.RowwiseAdam: each row's own step count);
* sparse: torch.optim.SparseAdam (lazy too, bias correction by the global step);
* dense: torch.optim.Adam over every row.

`--hetu [OPTIMIZER ...]` adds hetu's own runs of the same model and settings
(examples/ctr/run_hetu.py, one process, bench/quality.py's train_hetu), from hetu's own initial
draw of the seed: under `adam` (lazy, the default) and/or `adam_catchup` (every row takes every
step, its skipped ones applied when it is next read: dense Adam's result; design.md section 4).

    python bench/adam_semantics.py --dataset synthetic-movielens --rows 100000 --seeds 1 2 3 --hetu
    python bench/adam_semantics.py --dataset synthetic-criteo-multihot --rows 50000 --seeds 1 2 3 --hetu
    python bench/adam_semantics.py --dataset $HETU_DATA_HOME/ml100k-side-time --epochs 3 --seeds 1 2 3
    python bench/adam_semantics.py --dataset synthetic-movielens --rows 100000 --hetu adam adam_catchup --rules dense
"""
import argparse
import json
import os
import sys
import tempfile

import torch

from quality import THREADS, train_hetu, train_torch
from common.stats import median_range
from common.torch_dlrm import TABLE_OPTIMIZERS

# the model named for each synthetic shape (hetu.models: <arch>_<dataset>)
MODELS = {"synthetic-movielens": "dlrm_movielens", "synthetic-criteo-multihot": "dlrm_criteo_multihot"}
# hetu's optimizers, and the column each is reported as
HETU_OPTIMIZERS = {"adam": "hetu", "adam_catchup": "hetu-catchup"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", required=True,
                    help=f"{', '.join(sorted(MODELS))}, or a prepared folder (trained as the bare dlrm)")
    ap.add_argument("--rows", type=int, default=None, help="synthetic samples (train and validation)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--emb", type=int, default=16)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--rules", nargs="+", choices=TABLE_OPTIMIZERS, default=["rowwise", "dense"],
                    help="the PyTorch table's Adam rules to train (default: rowwise dense)")
    ap.add_argument("--hetu", nargs="*", choices=HETU_OPTIMIZERS, default=None,
                    help="also train hetu itself (run_hetu.py, one process) under these optimizers (no value: adam)")
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    from hetu.data import load_dataset
    from hetu.data.dataset import resolve_dataset_dir
    synthetic = {} if args.rows is None else {"rows": args.rows}
    folder = str(resolve_dataset_dir(args.dataset, **synthetic))
    data = load_dataset(folder)
    # bench/quality.py's case settings, so that its train_hetu runs the driver on this folder
    cfg = {"case": os.path.basename(folder), "model": MODELS.get(args.dataset, "dlrm"), "data_dir": folder, "batch": args.batch,
           "epochs": args.epochs, "optimizer": "adam", "lr": args.lr, "emb": args.emb}
    meta = data.meta
    print(f"{args.dataset}: {cfg['model']}, {len(data.train)} train / {len(data.val)} val samples, "
          f"{meta.num_fields} fields, {meta.num_embeddings} rows x {args.emb}, batch {args.batch}, adam lr {args.lr}, "
          f"{args.epochs} epochs, {THREADS} threads", flush=True)
    hetu_runs = [] if args.hetu is None else [HETU_OPTIMIZERS[o] for o in args.hetu or ["adam"]]
    by_side = {side: opt for opt, side in HETU_OPTIMIZERS.items()}
    sides = hetu_runs + list(args.rules)
    header = f"{'seed':>4}" + "".join(f" | {side + ' AUC':>12}{'logloss':>9}{'s':>6}" for side in sides)
    print(header + "\n" + "-" * len(header), flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="hetu-adam-") as workdir:
        for seed in args.seeds:
            run = {"seed": seed}
            for side in hetu_runs:
                hetu = train_hetu(dict(cfg, optimizer=by_side[side]), data, seed, workdir)
                run[side] = dict(hetu["whole"], seconds=hetu["seconds"], command=hetu["command"])
            for rule in args.rules:   # the seed's own draw (the same under every rule)
                trained = train_torch(dict(cfg, torch_table=rule, torch_init="own"), data, seed, workdir)
                run[rule] = dict(trained["whole"], seconds=trained["seconds"])
            runs.append(run)
            print(f"{seed:>4}" + "".join(f" | {run[s]['auc']:>12.4f}{run[s]['logloss']:>9.4f}{run[s]['seconds']:>6.0f}"
                                         for s in sides), flush=True)
    print("-" * len(header))
    summary = {s: {m: median_range([r[s][m] for r in runs]) for m in ("auc", "logloss")} for s in sides}
    for s in sides:
        a, ll = summary[s]["auc"], summary[s]["logloss"]
        print(f"{s:>8}: AUC median {a[0]:.4f} ({a[1]:.4f} to {a[2]:.4f}), logloss median {ll[0]:.4f} "
              f"({ll[1]:.4f} to {ll[2]:.4f})")
    lazy = [r for r in args.rules if r != "dense"]
    if "dense" in args.rules:
        for rule in lazy + hetu_runs:
            gaps = {m: median_range([r["dense"][m] - r[rule][m] for r in runs]) for m in ("auc", "logloss")}
            summary[f"dense-{rule}"] = gaps
            print(f"dense - {rule}: AUC median {gaps['auc'][0]:+.4f} ({gaps['auc'][1]:+.4f} to {gaps['auc'][2]:+.4f}), "
                  f"logloss median {gaps['logloss'][0]:+.4f} ({gaps['logloss'][1]:+.4f} to {gaps['logloss'][2]:+.4f})")
    for side in hetu_runs:
        print(f"{side}'s command: python " + runs[0][side]["command"].replace(
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep, ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "argv": sys.argv[1:], "runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
