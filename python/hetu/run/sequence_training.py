"""The training loop of the sequential models (sasrec, hstu; docs/design.md section 17) behind
run_hetu.py and run_laia.py: hetu.run.training hands it a run whose --model is one of them.

Data path: hetu.data.load_dataset (a sequences folder: histories, their timestamps, each user's
held-out last item) -> ht.Dataloader per split, whose ids rows get their targets and the
counter-based negatives appended (hetu.data.sequences.draw_negatives: the same for a sample in
every mode and worker count) -> hetu.models.sequential -> ht.Executor -> per-epoch loss and, with --val,
full-corpus HR@K and NDCG@K over every user's held-out item (hetu.metrics.ranking_hits), gathered
over the workers."""
import collections
import sys
import threading
import time

import numpy as np
from tqdm import tqdm

import hetu as ht
from hetu.data import load_dataset
from hetu.data.keys import find_keys
from hetu.data.sequences import PADDING, distinct_candidates, draw_negatives, in_batch_negatives, shared_negatives
from hetu.dynamic import by_key
from hetu.models.sequential import SEQUENTIAL, SequenceConfig, build

RANKS = (10, 50, 200)
# Adam's betas of the published MovieLens-1M settings (hetu.models.sequential.SEQUENCE_DEFAULTS).
ADAM_BETAS = {"beta1": 0.9, "beta2": 0.98}


def config_of(args, meta):
    """The model's settings (checked by the run spec: hetu.run.validate) and the data's sizes."""
    return SequenceConfig(num_items=meta.num_items, max_length=meta.max_length, num_negatives=args.num_negatives,
                          embedding_size=args.embedding_size, blocks=args.blocks, heads=args.heads,
                          dropout=args.dropout, temperature=args.temperature, negatives=args.negatives)


class TrainingColumns:
    """What a training batch's two id inputs read, from its stored [L + 1] history rows: the ids
    row [inputs | targets | the sample's distinct negatives] and the negatives' index into them.
    The negatives are drawn once per batch for both (each loader asks from its own thread).
    In-batch negatives read the global batch's targets through `loader` (set by make_inputs)."""

    def __init__(self, config, seed, item_keys=None):
        self.config, self.seed = config, seed
        self.item_keys = item_keys   # hashed ids: each item index's key
        self.loader = None
        self._drawn = collections.OrderedDict()
        self._lock = threading.Lock()

    def _batch_targets(self, step):
        """Every target of global batch `step`, whichever worker trains it."""
        stored = np.asarray(self.loader.data[self.loader.batches.indices(step)])
        return stored[:, 1:self.config.max_length + 1]

    def _negatives(self, step, rows, batch):
        key = (int(step), np.asarray(rows, np.int64).tobytes())
        with self._lock:
            drawn = self._drawn.get(key)
        if drawn is None:
            drawn = self._draw(step, rows, batch)
            with self._lock:
                self._drawn[key] = drawn
                while len(self._drawn) > 8:
                    self._drawn.popitem(last=False)
        return drawn

    def _draw(self, step, rows, batch):
        """(each sample's distinct candidates as ids, the negatives' index into them): drawn as
        indices into a catalog (the items, or in-batch the global batch's targets), mapped to ids."""
        c = self.config
        targets = batch[:, 1:c.max_length + 1]
        catalog, size = self.item_keys, c.num_items
        if c.negatives == "in-batch":
            drawn, catalog = in_batch_negatives(self.seed, step, rows, targets, self._batch_targets(step),
                                                c.num_negatives)
            size = max(len(catalog), 1)
        elif c.negatives == "shared":
            shared = shared_negatives(self.seed, step, c.num_negatives, c.num_items)
            drawn = np.where((targets != PADDING)[..., None], shared, PADDING)
        else:
            drawn = draw_negatives(self.seed, step, rows, targets, c.num_negatives, c.num_items)
        candidates, index = distinct_candidates(drawn, size, c.candidates)
        if catalog is not None:
            candidates = np.where(candidates != PADDING, catalog[np.maximum(candidates, 0)], PADDING)
        return candidates, index

    def ids(self, step, rows, batch):
        candidates, _ = self._negatives(step, rows, batch)
        return np.concatenate([batch[:, :self.config.max_length], batch[:, 1:], candidates], axis=1)

    def index(self, step, rows, batch):
        _, index = self._negatives(step, rows, batch)
        return index.reshape(len(batch), -1)


def export_record(args):
    """What export rebuilds the model from besides the flags a checkpoint records: its
    architecture and the sequences folder it trained on (the item ids, L)."""
    return {"architecture": SEQUENTIAL[args.model].architecture, "sequence_data": args.sequence_data}


def validation_ids(config):
    """A validation history [L] as the model's ids row: no targets, no negatives."""
    def columns(step, rows, batch):
        empty = np.full((len(batch), config.id_columns - config.max_length), -1, np.int64)
        return np.concatenate([batch, empty], axis=1)
    return columns


def no_negatives(config):
    def columns(step, rows, batch):
        return np.full((len(batch), config.max_length * config.num_negatives), -1, np.int64)
    return columns


def first_columns(length):
    def columns(step, rows, batch):
        return batch[:, :length]
    return columns


def make_inputs(data, config, args, hstu):
    """The dataloader ops of the ids, of the negatives' index, and for HSTU of the timestamps
    (None for SASRec)."""
    b = args.batch_size

    def loader(array, name, columns):
        # Training reads the users in a seeded order, anew each epoch (the same in every mode).
        return ht.Dataloader(array, b, name, drop_last=name == "train", shuffle=name == "train", seed=args.seed,
                             columns=columns)
    training = TrainingColumns(config, args.seed, data.item_keys)
    training.loader = loader(data.train.items, "train", training.ids)
    ids = ht.dataloader_op([training.loader, loader(data.val.items, "validate", validation_ids(config))])
    negatives = ht.dataloader_op([loader(data.train.items, "train", training.index),
                                  loader(data.val.items, "validate", no_negatives(config))])
    times = None
    if hstu:
        L = config.max_length
        times = ht.dataloader_op([loader(data.train.times, "train", first_columns(L)),
                                  loader(data.val.times, "validate", first_columns(L))])
    return ids, negatives, times


def load(args):
    name = args.data_dir or (SEQUENTIAL[args.model].dataset if args.dataset == "synthetic" else args.dataset)
    if name is None:
        raise SystemExit(f"--model {args.model} trains on a sequences dataset: give --dataset or --data-dir")
    try:
        data = load_dataset(name)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{'--data-dir' if args.data_dir else '--dataset'} {name}: {e}") from None
    if getattr(data.meta, "kind", None) != "sequences":
        raise SystemExit(f"--model {args.model} reads user histories, and {name} is not a sequences dataset "
                         f"(prepare one with: python -m hetu.data.prepare movielens --sequences ...)")
    return data, name


def optimizer_of(args):
    kind = args.optimizer
    settings = dict(ADAM_BETAS) if kind.startswith("adam") else {}
    if kind in ("adamw", "adamw_catchup"):
        settings["weight_decay"] = 0.0
    return ht.optim.optimizer(kind, learning_rate=args.learning_rate, embedding_dtype=args.embedding_dtype,
                              **settings)


def gather(comm, array):
    return comm.allgather_array(array) if comm is not None and comm.size > 1 else array


def catalog_rows(executor, data, graph):
    """The item table's rows in catalog order (item_ids.npy's): a dynamic table's rows of each
    item's key (or index), zeros for one that holds no row."""
    params = executor.parameters()
    if not executor.graph.dynamic_keys:
        return params[graph.item_table.name]
    rows = by_key(params, executor.graph.dynamic_keys)
    resident, trained = rows[f"{graph.item_table.name}:keys"], rows[graph.item_table.name]
    catalog = data.item_keys if data.item_keys is not None else np.arange(data.meta.num_items, dtype=np.int64)
    table = np.zeros((len(catalog), trained.shape[1]), np.float32)
    at, held = find_keys(resident, catalog)
    table[held] = trained[at[held]]
    return table


def validate(executor, data, graph, ids, progress):
    """Full-corpus HR@K and NDCG@K over every user's held-out item: this worker's users ranked
    against the whole item table, the per-user results gathered over the workers."""
    executor.flush()
    table = catalog_rows(executor, data, graph).astype(np.float32)
    table /= np.maximum(np.linalg.norm(table, axis=1, keepdims=True), 1e-6)
    loader = ids.loader("validate")
    hits, ndcg = [], []
    steps = executor.get_batch_num("validate")
    for _ in tqdm(range(steps), desc="validate", disable=progress != "bar", leave=False, file=sys.stdout):
        rows = np.asarray(loader.indices(loader.position), np.int64)
        user = executor.run("validate", convert_to_numpy_ret_vals=True)[0]
        h, n = ht.metrics.ranking_hits(user, table, data.catalog_index(data.val.target[rows]),
                                       data.catalog_index(data.val.items[rows]), RANKS)
        hits.append(h)
        ndcg.append(n)
    comm = executor.graph.comm
    width = len(RANKS)
    hits = gather(comm, np.concatenate(hits) if hits else np.zeros((0, width)))
    ndcg = gather(comm, np.concatenate(ndcg) if ndcg else np.zeros((0, width)))
    return ht.metrics.ranking_summary(hits.reshape(-1, width), ndcg.reshape(-1, width), RANKS)


def ranking_text(metrics):
    return " ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.startswith(("hr@", "ndcg@")))


def train(args, herald, options, ctx, threads, dynamic=None):
    """The run of a sequential --model; returns its summary (train.report_end prints it)."""
    from . import training as driver   # the CTR loop's shared pieces (it imports this module first)
    data, name = load(args)
    if data.item_keys is not None and dynamic is None:
        raise SystemExit(f"{name} holds hashed item ids: train it on a dynamic table (--table-capacity ROWS)")
    args.sequence_data = str(data.path)
    config = config_of(args, data.meta)
    kind = SEQUENTIAL[args.model].architecture
    ids, negatives, times = make_inputs(data, config, args, hstu=kind == "hstu")
    graph = build(kind, ids, negatives, times, config, optimizer_of(args), dynamic)
    executor = ht.Executor({"train": [graph.loss, graph.train_op], "validate": [graph.user]}, ctx=ctx,
                           seed=args.seed, **options)
    per_epoch, workers, total = driver.schedule(
        executor, args, f": {len(data.train.items)} histories make {executor.get_batch_num('train')} global batches "
                        f"of {executor.graph.num_workers} x {args.batch_size}")
    first = driver.resume(executor, args)
    if first >= total:
        raise SystemExit(f"--resume {args.resume}: the checkpoint is at step {first}, and --nepoch {args.nepoch:g} "
                         f"of {per_epoch} iterations per epoch is {total} steps: nothing is left to train")
    progress = None if args.no_progress else "bar" if sys.stdout.isatty() else args.log_interval
    print(f"{args.model}: {config.num_items} items x {config.embedding_size}, histories of up to "
          f"{config.max_length} from {name}, {config.num_negatives} negatives a position; "
          f"{len(data.train.items)} train / {len(data.val.items)} val users; "
          + driver.epoch_text(per_epoch, workers, args) + f"; {total} iterations, {threads} thread"
          + "s" * (threads != 1) + " per process"
          + (f", resumed at step {first} from {args.resumed_from}" if first else ""), flush=True)
    comm = executor.graph.comm
    start, done, epoch, history = time.time(), first, first // per_epoch, []
    while done < total:
        n = min(per_epoch * (epoch + 1), total) - done   # a resumed run may start within an epoch
        t0 = time.time()
        losses = []
        after_step = driver.midway_checkpoints(executor, args, done + n)
        bar = tqdm(range(n), desc=f"epoch {epoch}", disable=progress != "bar", leave=False, file=sys.stdout)
        for _ in bar:
            losses.append(float(np.asarray(executor.run("train", convert_to_numpy_ret_vals=True)[0]).reshape(-1)[0]))
            if after_step is not None:
                after_step()
        loss = float(np.mean(losses))
        if comm is not None and comm.size > 1:
            loss = comm.allreduce_mean(loss)   # each worker's loss is its part of the global batch's
        stats = {"loss": loss,
                 "seconds": time.time() - t0, "iterations": n}
        line = f"epoch {epoch}: train loss {stats['loss']:.4f} ({driver.rates_text(n, stats['seconds'], args.batch_size, workers)})"
        if args.val:
            stats["val"] = validate(executor, data, graph, ids, progress)
            line += " | val " + ranking_text(stats["val"])
        print(line, flush=True)
        history.append(stats)
        done += n
        epoch += 1
        if args.checkpoint:
            driver.save_checkpoint(executor, args)
    executor.flush()
    elapsed = time.time() - start
    summary = {"model": args.model, "mode": driver.mode_name(args, herald), "gpu": args.gpu, "device": str(ctx),
               "iterations": total - first, "first_step": first, "seconds": elapsed, "counters": executor.counters.totals(),
               **driver.job_rates(total - first, elapsed, args.batch_size, workers), "final": history[-1]}
    if args.val:
        summary.update(history[-1]["val"])
    return driver.report_end(executor, args, herald, summary)
