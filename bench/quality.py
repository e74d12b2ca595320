"""Model quality: every model against a logistic regression on the same data (`--table`), and
hetu's DLRM against the same DLRM written independently in PyTorch (`--case`).

`--table`: each model of hetu.models (lr, wdl, dfm, dcn, ncf, dlrm, dcnv2), trained by
run_hetu.py with the same settings (Adam, batch, embedding width, epochs) on (a) MovieLens 100K
in time order, with its user and movie side features (genres are multi-hot: the models that read
bags) and on its ids alone (every model; ncf reads just these two fields) and (b) synthetic
Criteo; every model, the logistic regression (`lr`, the first-order term alone) included, trains
at each learning rate of `--rates` and is reported at its better one (the higher validation AUC,
median over the seeds): each row gives that rate, the validation AUC and logloss (median and range
over the seeds) and the gap to the logistic regression at its own better rate, on the same split.
For DLRM, the same DLRM in PyTorch started from hetu's initial parameters at DLRM's rate gives two
columns: under hetu's rule (rowwise Adam: lazy, row-wise steps on the tables) and under
`torch.optim.Adam` (every row stepped every batch).

`--case`:

Both train on the same prepared dataset folder, its train split in the folder's stored order (no
shuffle: ht.Dataloader's default), with the same batch size, optimizer, learning rate and number
of epochs, and both are scored on the validation split the folder's meta names.

* hetu: examples/ctr/run_hetu.py itself, in a subprocess (`--all --val --save-params`); its
  `summary {...}` line gives the driver's validation AUC and logloss (`final.val`).
* PyTorch (CPU, 2 threads): hetu.models.dlrm's architecture rewritten in
  bench/common/torch_dlrm.py (one shared nn.EmbeddingBag(mode="sum") table, a bag per (sample, field),
  hetu's initial distributions), mean BCE-with-logits, Adam's eps hetu's 1e-7. hetu steps a
  table's rows only where a batch names them (row by row, each row counting its own steps for
  Adam's bias correction). `--torch-table` picks the PyTorch table's optimizer under Adam:
  rowwise (default: that rule, torch_dlrm.RowwiseAdam), sparse (torch.optim.SparseAdam: rows not
  in the batch untouched too, bias correction by the global step) or dense (dense gradients,
  torch.optim.Adam over every row). SGD is plain SGD on both; AdaGrad is torch.optim.Adagrad with
  hetu's eps (a row a batch does not read keeps its value and accumulator, so stepping only the
  rows read is AdaGrad over every row). `--optimizer adam_catchup` trains
  hetu under its catch-up rule (every row takes every step: dense Adam's result) against
  torch.optim.Adam over every row.

`--torch-init hetu` starts PyTorch from the very parameters the driver starts from (hetu's
initial values are a pure function of the seed and the parameter's name: they are drawn here by
the same model function and seed), so that the gap shows what training does, without the noise of
two draws from the same distributions. From equal parameters the two take equal steps (to
float32 rounding), so what remains is that rounding, grown over the epochs.

The driver's validation covers the whole split (its last partial batch included), as the `whole`
scores do. Both are reported: on the driver's samples (hetu's own figures, and PyTorch on exactly
those samples) and over the whole split, where hetu's trained parameters (--save-params) are run
through the PyTorch forward. On the driver's samples that forward must reproduce the driver's own
AUC: the `check` column, a test that the two architectures are the same function.

    python bench/quality.py --table --seeds 1 2 3   # every model against LR
    python bench/quality.py --table --epochs 1 --rows 8000000 --rates 0.0005 0.001 0.003 --optimizer adam_catchup --no-torch
        # synthetic Criteo with 21 samples per table row, where every model passes LR (about an hour)
    python bench/quality.py --case movielens --seeds 1 2 3      # MovieLens 100K, side features, time order
    python bench/quality.py --case criteo-multihot --rows 200000 --epochs 2 --seeds 1 2 3
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch
from torch import nn

from common.stats import median_range
from common.torch_dlrm import DLRM, TABLE_OPTIMIZERS, bags_of, make_optimizers

THREADS = 2
from common.launch import ROOT
from common.summaries import last_summary
RUN_HETU = os.path.join(ROOT, "examples", "ctr", "run_hetu.py")

# What each case trains: run_hetu.py's model and data flags, and the training settings.
CASES = {
    "movielens": {"model": "dlrm_movielens", "batch": 256, "epochs": 3, "optimizer": "adam", "lr": 0.001,
                  "emb": 16},
    "criteo-multihot": {"model": "dlrm_criteo_multihot", "batch": 256, "epochs": 2, "optimizer": "adam",
                        "lr": 0.001, "emb": 16, "rows": 200000},
}
MOVIELENS_FOLDER = "ml100k-side-time"   # under $HETU_DATA_HOME
MOVIELENS_IDS_FOLDER = "ml100k-time"     # the ids-only preparation (ncf's two fields)
TABLE_MODELS = ("lr", "wdl", "dfm", "dcn", "ncf", "dlrm", "dcnv2")


def thread_env():
    t = str(THREADS)
    return {"OMP_NUM_THREADS": t, "OPENBLAS_NUM_THREADS": t, "MKL_NUM_THREADS": t, "HETU_NUM_THREADS": t}


# --- data ----------------------------------------------------------------------------------------
def data_flags(cfg):
    """run_hetu.py's flags naming the data: a prepared folder, or the synthetic set by its rows."""
    if cfg.get("data_dir"):
        return ["--data-dir", cfg["data_dir"]]
    return ["--dataset", cfg.get("dataset", "synthetic-criteo-multihot"), "--rows", str(cfg["rows"])]


def load(cfg):
    from hetu.data import load_dataset
    if cfg.get("data_dir"):
        return load_dataset(cfg["data_dir"])
    return load_dataset(cfg.get("dataset", "synthetic-criteo-multihot"), rows=cfg["rows"])


class Batches:
    """Contiguous batches of one split in stored order: (dense or None, values, offsets, labels)
    as tensors. `drop_last` as ht.Dataloader's training split (its validation split keeps its tail)."""

    def __init__(self, part, meta, batch, drop_last):
        self.part, self.batch = part, batch
        self.slot_offsets = np.asarray(meta.slot_offsets, dtype=np.int64)
        n = len(part)
        self.count = n // batch if drop_last else -(-n // batch)
        self.samples = min(n, self.count * batch)

    def __iter__(self):
        for t in range(self.count):
            rows = slice(t * self.batch, min((t + 1) * self.batch, self.samples))
            values, offsets = bags_of(np.asarray(self.part.sparse[rows]), self.slot_offsets)
            # copies: the split's arrays are read-only memory maps
            dense = None if self.part.dense is None else torch.from_numpy(
                np.array(self.part.dense[rows], dtype=np.float32))
            labels = torch.from_numpy(np.array(self.part.labels[rows], dtype=np.float32).reshape(-1, 1))
            yield dense, values, offsets, labels


def predict(model, batches):
    preds, labels = [], []
    with torch.no_grad():
        for dense, values, offsets, y in batches:
            preds.append(torch.sigmoid(model(dense, values, offsets)).numpy().reshape(-1))
            labels.append(y.numpy().reshape(-1))
    return np.concatenate(preds), np.concatenate(labels)


def scores(pred, label):
    from hetu import metrics   # the driver's metric code, so both sides are scored alike
    return {"auc": metrics.auc(label, pred), "logloss": metrics.logloss(label, pred), "samples": int(pred.size)}


def evaluate(model, data, batch):
    """Scores on the driver's validation samples (the whole split) and on the whole split."""
    pred, label = predict(model, Batches(data.val, data.meta, batch, drop_last=False))
    driver_samples = len(data.val)
    return {"driver": scores(pred[:driver_samples], label[:driver_samples]), "whole": scores(pred, label)}


def hetu_initial_parameters(cfg, seed, workdir):
    """The parameters run_hetu.py --seed `seed` starts from, drawn in a child process: in a
    process where a hetu executor had started, PyTorch's training ran 4-10x slower."""
    path = os.path.join(workdir, f"hetu-initial-{seed}.npz")
    subprocess.run([sys.executable, os.path.abspath(__file__), "--write-hetu-initial",
                    json.dumps({"cfg": cfg, "seed": seed, "path": path})], env=dict(os.environ, **thread_env()),
                   check=True)
    with np.load(path) as saved:
        return dict(saved)


def write_hetu_initial(spec):
    """--write-hetu-initial: hetu's model function and executor seed, as in run_hetu.py."""
    import hetu as ht
    cfg, seed = spec["cfg"], spec["seed"]
    data = load(cfg)
    from hetu.models import MODELS
    meta = data.meta

    def loader(array):
        return None if array is None else ht.dataloader_op([ht.Dataloader(array, cfg["batch"], "train")])
    loss, prediction, y_, train_op = MODELS[cfg["model"]](
        loader(data.train.dense), loader(data.train.sparse), loader(data.train.labels),
        meta.fields, embedding_size=cfg["emb"])
    executor = ht.Executor({"train": [loss, prediction, y_, train_op]}, ctx=ht.cpu(0), seed=seed)
    np.savez(spec["path"], **executor.parameters())


def train_torch(cfg, data, seed, workdir):
    if cfg["optimizer"] == "adam_catchup":   # hetu's catch-up rule is dense Adam's result
        cfg = dict(cfg, optimizer="adam", torch_table="dense")
    torch.manual_seed(seed)
    meta = data.meta
    model = DLRM(meta.num_embeddings, cfg["emb"], meta.num_fields, meta.num_dense,
                 sparse_table=cfg["torch_table"] != "dense")
    if cfg["torch_init"] == "hetu":
        model.load_hetu(hetu_initial_parameters(cfg, seed, workdir))
    optimizers = make_optimizers(model, cfg["optimizer"], cfg["lr"], cfg["torch_table"])
    lossf = nn.BCEWithLogitsLoss()   # mean over the batch, as hetu's loss
    start = time.time()
    for _ in range(cfg["epochs"]):
        for dense, values, offsets, labels in Batches(data.train, meta, cfg["batch"], drop_last=True):
            for o in optimizers:
                o.zero_grad(set_to_none=True)
            lossf(model(dense, values, offsets), labels).backward()
            for o in optimizers:
                o.step()
    result = evaluate(model, data, cfg["batch"])
    result["seconds"] = time.time() - start
    return result


# --- hetu ----------------------------------------------------------------------------------------
def run_driver(cfg, seed, params_file=None):
    """run_hetu.py trains cfg's model; (its summary's validation scores, seconds, command)."""
    command = [sys.executable, RUN_HETU, "--model", cfg["model"], *data_flags(cfg),
               "--embedding-size", str(cfg["emb"]), "--batch-size", str(cfg["batch"]),
               "--nepoch", str(cfg["epochs"]), "--all", "--val", "--optimizer", cfg["optimizer"],
               "--learning-rate", str(cfg["lr"]), "--seed", str(seed), "--no-progress"]
    if params_file:
        command += ["--save-params", params_file]
    env = dict(os.environ, **thread_env())
    start = time.time()
    run = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True)
    seconds = time.time() - start
    summary = last_summary(run.stdout)
    if run.returncode != 0 or summary is None:
        raise RuntimeError(f"run_hetu.py failed ({run.returncode}): {' '.join(command)}\n"
                           f"{run.stdout[-3000:]}{run.stderr[-3000:]}")
    return summary["final"]["val"], seconds, command


def train_hetu(cfg, data, seed, workdir):
    """run_hetu.py trains; its summary gives the driver's validation scores, and its saved
    parameters, run through the PyTorch forward, the scores over the whole split."""
    params_file = os.path.join(workdir, f"hetu-{cfg['case']}-{seed}.npz")
    val, seconds, command = run_driver(cfg, seed, params_file)
    model = DLRM(data.meta.num_embeddings, cfg["emb"], data.meta.num_fields, data.meta.num_dense)
    model.load_hetu(dict(np.load(params_file)))
    forward = evaluate(model, data, cfg["batch"])
    os.remove(params_file)
    return {"driver": {"auc": val["auc"], "logloss": val["logloss"], "samples": val["samples"]},
            "whole": forward["whole"], "check_auc": forward["driver"]["auc"] - val["auc"],
            "seconds": seconds, "command": " ".join(command[1:])}


# --- every model against LR ----------------------------------------------------------------------
def movielens_folder(data_dir, folder, side):
    home = os.environ.get("HETU_DATA_HOME", os.path.expanduser("~/.hetu/data"))
    path = data_dir or os.path.join(home, folder)
    if not os.path.isdir(path):
        users = " --users RAW/u.user --items RAW/u.item" if side else ""
        raise SystemExit(f"no prepared MovieLens folder at {path}: python scripts/get_movielens100k.py --output RAW, "
                         f"then python -m hetu.data.prepare movielens --input RAW/u.data{users} --time-order "
                         f"--output {path}")
    return path


def table_datasets(args):
    """(label, run_hetu.py's data settings): MovieLens with side features and on ids alone, and
    synthetic Criteo."""
    side = movielens_folder(args.data_dir, MOVIELENS_FOLDER, side=True)
    ids = movielens_folder(args.ids_data_dir, MOVIELENS_IDS_FOLDER, side=False)
    rows = args.rows or 100000
    return [("MovieLens 100K, side features, time order", {"data_dir": side}),
            ("MovieLens 100K, ids only, time order", {"data_dir": ids}),
            (f"synthetic Criteo, {rows} rows", {"dataset": "synthetic-criteo", "rows": rows})]


def table_models(fields):
    """TABLE_MODELS that read `fields` (lr first), and those that cannot, with why."""
    from hetu.models import MODELS
    reads = [m for m in TABLE_MODELS if MODELS[m].refusal(fields) is None]
    return reads, {m: MODELS[m].refusal(fields) for m in TABLE_MODELS if m not in reads}


def at_better_rate(cfg, rates, seeds):
    """cfg's model trained at each rate and seed: (rate, AUC median/min/max, logloss median, s/run,
    the first run's command) at the rate with the higher median validation AUC."""
    best = None
    for rate in rates:
        runs = [run_driver(dict(cfg, lr=rate), seed) for seed in seeds]
        auc, lo, hi = median_range([v["auc"] for v, _, _ in runs])
        result = (rate, auc, lo, hi, statistics.median([v["logloss"] for v, _, _ in runs]),
                  statistics.median([s for _, s, _ in runs]), runs[0][2])
        if best is None or auc > best[1]:
            best = result
    return best


def table(args):
    """Every model's validation AUC and logloss, each at its better learning rate, against the
    logistic regression's at its own, per dataset."""
    settings = {"batch": 256, "epochs": 2, "optimizer": "adam", "emb": 16}
    for key in ("batch", "epochs", "optimizer", "emb"):
        if getattr(args, key) is not None:
            settings[key] = getattr(args, key)
    rates = [args.lr] if args.lr is not None else args.rates
    print(f"every model against LR: {settings['optimizer']}, each model at its better rate of "
          f"{' '.join(map(str, rates))}, batch {settings['batch']}, embedding {settings['emb']}, "
          f"{settings['epochs']} epoch(s), seeds {' '.join(map(str, args.seeds))}, {THREADS} threads; "
          f"AUC and logloss: median [min, max] over the seeds", flush=True)
    header = (f"{'data':<42} {'model':<6} {'rate':>6} {'val AUC':>8} {'range':>15} {'- LR':>8} {'logloss':>8} "
              f"{'- LR':>8} {'torch AUC':>9} {'torch.optim.Adam':>16} {'s/run':>6}")
    print(header + "\n" + "-" * len(header), flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="hetu-quality-") as workdir:
        for label, where in table_datasets(args):
            lr = None
            models, refused = table_models(load(dict(settings, **where)).meta.fields)
            for name in models:
                cfg = dict(settings, model=name, case="table", torch_table="rowwise", torch_init="hetu", **where)
                rate, auc, lo, hi, loss, seconds, command = at_better_rate(cfg, rates, args.seeds)
                cfg["lr"] = rate
                torch_auc = dense_adam_auc = None
                if name == "dlrm" and not args.no_torch:
                    data = load(cfg)
                    torch_auc = statistics.median([train_torch(cfg, data, seed, workdir)["driver"]["auc"]
                                                   for seed in args.seeds])
                    if cfg["optimizer"] == "adam":
                        dense_cfg = dict(cfg, torch_table="dense")
                        dense_adam_auc = statistics.median([train_torch(dense_cfg, data, seed, workdir)["driver"]["auc"]
                                                            for seed in args.seeds])
                if name == "lr":   # the baseline: TABLE_MODELS lists it first
                    lr = (auc, loss)
                row = {"data": label, "model": name, "rate": rate, "auc": auc, "auc_range": (lo, hi),
                       "logloss": loss, "auc_minus_lr": auc - lr[0], "logloss_minus_lr": loss - lr[1],
                       "torch_auc": torch_auc, "torch_dense_adam_auc": dense_adam_auc, "seconds": seconds,
                       "command": " ".join(command[1:]).replace(ROOT + os.sep, "")}
                results.append(row)
                below = " BELOW LR" if auc < lr[0] else ""
                torch_cell = f"{torch_auc:>9.4f}" if torch_auc is not None else f"{'':>9}"
                torch_cell += f" {dense_adam_auc:>16.4f}" if dense_adam_auc is not None else f" {'':>16}"
                gaps = ((f"{'':>8}",) * 2 if name == "lr"   # the baseline itself
                        else (f"{auc - lr[0]:>+8.4f}", f"{loss - lr[1]:>+8.4f}"))
                print(f"{label:<42} {name:<6} {rate:>6g} {auc:>8.4f} {f'[{lo:.4f}, {hi:.4f}]':>15} {gaps[0]} "
                      f"{loss:>8.4f} {gaps[1]} {torch_cell} {seconds:>6.0f}{below}", flush=True)
            for name, why in refused.items():
                print(f"{label:<42} {name:<6} not run: {why}", flush=True)
    print("-" * len(header))
    print("hetu's command (per model, rate and seed): python " + results[0]["command"], flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"settings": settings, "rates": rates, "argv": sys.argv[1:], "rows": results}, f, indent=1)


# --- driver --------------------------------------------------------------------------------------
def spread(values):
    return (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else 0.0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--case", choices=sorted(CASES))
    mode.add_argument("--table", action="store_true", help="every model against the logistic regression")
    ap.add_argument("--data-dir", default=None,
                    help=f"movielens: the prepared folder (default $HETU_DATA_HOME/{MOVIELENS_FOLDER})")
    ap.add_argument("--ids-data-dir", default=None,
                    help=f"--table: MovieLens prepared on ids alone (default $HETU_DATA_HOME/{MOVIELENS_IDS_FOLDER})")
    ap.add_argument("--no-torch", action="store_true", help="--table: no PyTorch DLRM column")
    ap.add_argument("--rates", type=float, nargs="+", default=[0.001, 0.01],
                    help="--table: each model trains at each of these learning rates, reported at its better one "
                         "(--lr: that rate alone)")
    ap.add_argument("--rows", type=int, default=None, help="criteo-multihot, --table's synthetic Criteo: rows")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument("--optimizer", choices=["adam", "adam_catchup", "adagrad", "sgd"], default=None,
                    help="adam_catchup: hetu's catch-up rule, against torch.optim.Adam over every row; "
                         "adagrad: against torch.optim.Adagrad (rows not read keep their state: lazy is dense)")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--emb", type=int, default=None)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1])
    ap.add_argument("--torch-table", choices=TABLE_OPTIMIZERS, default="rowwise",
                    help="Adam on the PyTorch table: rowwise (hetu's rule, default), sparse (SparseAdam) or "
                         "dense (Adam on every row)")
    ap.add_argument("--torch-init", choices=["own", "hetu"], default="own",
                    help="own: PyTorch draws its initial parameters (same distributions); hetu: it starts from "
                         "the driver's initial parameters")
    ap.add_argument("--json", default=None, help="also write the results here")
    ap.add_argument("--write-hetu-initial", default=None, help=argparse.SUPPRESS)
    if "--write-hetu-initial" in sys.argv:   # the child of hetu_initial_parameters
        return write_hetu_initial(json.loads(sys.argv[sys.argv.index("--write-hetu-initial") + 1]))
    args = ap.parse_args()
    torch.set_num_threads(THREADS)
    if args.table:
        return table(args)
    cfg = dict(CASES[args.case], case=args.case, torch_table=args.torch_table, torch_init=args.torch_init)
    for key in ("rows", "batch", "epochs", "optimizer", "lr", "emb"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.case == "movielens":
        cfg["data_dir"] = movielens_folder(args.data_dir, MOVIELENS_FOLDER, side=True)
    data = load(cfg)
    meta = data.meta
    print(f"{args.case}: {cfg['model']}, {len(data.train)} train / {len(data.val)} val samples, fields "
          f"{meta.num_fields} (bags: {', '.join(meta.bag_fields) or 'none'}), {meta.num_embeddings} rows x "
          f"{cfg['emb']}, batch {cfg['batch']}, {cfg['optimizer']} lr {cfg['lr']}, {cfg['epochs']} epochs, "
          f"torch table {cfg['torch_table']}, torch init {cfg['torch_init']}, {THREADS} threads", flush=True)
    header = (f"{'seed':>4} | {'driver samples':>14}{'hetu AUC':>10}{'torch AUC':>10}{'dAUC':>9}"
              f"{'hetu LL':>9}{'torch LL':>9} | {'whole split':>11}{'hetu AUC':>10}{'torch AUC':>10}{'dAUC':>9}"
              f"{'hetu LL':>9}{'torch LL':>9} | {'check':>8}{'hetu s':>8}{'torch s':>8}")
    print(header + "\n" + "-" * len(header), flush=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="hetu-quality-") as workdir:
        for seed in args.seeds:
            hetu = train_hetu(cfg, data, seed, workdir)
            torch_ = train_torch(cfg, data, seed, workdir)
            runs.append({"seed": seed, "hetu": hetu, "torch": torch_})
            d, w = (hetu["driver"], torch_["driver"]), (hetu["whole"], torch_["whole"])
            print(f"{seed:>4} | {d[0]['samples']:>14}{d[0]['auc']:>10.4f}{d[1]['auc']:>10.4f}"
                  f"{d[0]['auc'] - d[1]['auc']:>+9.4f}{d[0]['logloss']:>9.4f}{d[1]['logloss']:>9.4f} | "
                  f"{w[0]['samples']:>11}{w[0]['auc']:>10.4f}{w[1]['auc']:>10.4f}{w[0]['auc'] - w[1]['auc']:>+9.4f}"
                  f"{w[0]['logloss']:>9.4f}{w[1]['logloss']:>9.4f} | {hetu['check_auc']:>8.1e}"
                  f"{hetu['seconds']:>8.0f}{torch_['seconds']:>8.0f}", flush=True)
    summary = {}
    for where in ("driver", "whole"):
        for metric in ("auc", "logloss"):
            for side in ("hetu", "torch"):
                summary[f"{where}_{metric}_{side}"] = spread([r[side][where][metric] for r in runs])
            summary[f"{where}_{metric}_gap"] = spread([r["hetu"][where][metric] - r["torch"][where][metric]
                                                       for r in runs])
    print("-" * len(header))
    for where in ("driver", "whole"):
        s = summary
        print(f"{where:>6}: AUC hetu {s[f'{where}_auc_hetu'][0]:.4f} +- {s[f'{where}_auc_hetu'][1]:.4f}, torch "
              f"{s[f'{where}_auc_torch'][0]:.4f} +- {s[f'{where}_auc_torch'][1]:.4f}, hetu - torch "
              f"{s[f'{where}_auc_gap'][0]:+.4f} +- {s[f'{where}_auc_gap'][1]:.4f} (target |gap| <= 0.002); logloss "
              f"hetu {s[f'{where}_logloss_hetu'][0]:.4f}, torch {s[f'{where}_logloss_torch'][0]:.4f}", flush=True)
    print("hetu's command: python " + runs[0]["hetu"]["command"].replace(ROOT + os.sep, ""), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"config": cfg, "argv": sys.argv[1:], "runs": runs, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    main()
