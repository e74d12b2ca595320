"""The training loop behind run_hetu.py (HET baseline) and run_laia.py (Herald), given a run spec
(hetu.run): examples/ctr/train.py is the command line's thin driver over main().

Data path: hetu.data.load_dataset (memory-mapped arrays) -> ht.Dataloader per split ->
dataloader ops feeding the model graph -> ht.Executor (with the distribution, cache and
scheduler options) -> per-epoch loss / accuracy / AUC."""
import functools
import json
import os
import sys
import time
import warnings

import numpy as np
from tqdm import tqdm

import hetu as ht
import hetu.ps  # noqa: F401  (ht.ps: the servers' counters)
import hetu.run
from hetu.data import BadBatch, DataFormatError, load_dataset
from hetu.dist import devices
from hetu.dynamic import DynamicTable, by_key
from hetu.dist.comm import exit_at_once_if_mpi_started
from hetu.herald.options import HeraldOptions
from hetu.streaming import ProgressiveValidation, StreamFeed, stream_loaders, tensorboard_writer
from hetu.models import MODELS, SEQUENTIAL
from . import sequence_training

# --optimizer: every kind of hetu's optimizer registry (src/common/optim_rules.h).
OPTIMIZERS = {name: functools.partial(ht.optim.optimizer, name) for name in ht.optim.KINDS}


def description(herald):
    return "Train a CTR model with hetu" + (" and the Herald scheduler" if herald else "")


def build_parser(herald):
    """The command line: a flag per field of the run spec (hetu.run), --config RUN.yml and
    --print-config."""
    return hetu.run.build_parser(herald=herald, description=description(herald))


def run_spec(argv, herald):
    """The run spec of the command line (--config's file, the flags, the model's defaults; with
    --resume, the checkpoint's model), checked; SpecError names every wrong field."""
    return hetu.run.parse(argv, herald=herald, description=description(herald),
                          read_checkpoint=lambda folder: ht.Executor.checkpoint_info(folder).get("run") or {})


def load(args):
    source = args.data_dir or args.dataset
    if args.data_dir is None and (args.dataset == "synthetic" or args.dataset.startswith("synthetic-")):
        shape = MODELS[args.model].dataset
        name = f"synthetic-{shape}" if args.dataset == "synthetic" and shape else args.dataset
        params = {k: v for k, v in (("rows", args.rows), ("scale", args.scale)) if v is not None}
        return load_dataset(name, **params)
    try:
        return load_dataset(source)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"{'--data-dir' if args.data_dir else '--dataset'} {source}: {e}") from None


def dynamic_table(tables):
    """The dynamic tables' rule of the run spec's tables.capacity and its options (None without it)."""
    if tables.capacity is None:
        return None
    try:
        return DynamicTable(tables.capacity, admit_after=tables.admit_after, ttl=tables.evict_ttl,
                            buckets=tables.buckets)
    except ValueError as e:
        raise SystemExit(f"--table-capacity: {e}") from None


def readable_fields(args, meta, dynamic=None):
    """The data's fields, which the model must be able to read (one that reads one id per field
    refuses multi-hot data), read through `dynamic` tables if given (hashed ids need them)."""
    try:
        fields = meta.fields_for(dynamic)
    except ValueError as e:
        raise SystemExit(f"{args.data_dir or args.dataset}: {e}") from None
    reason = MODELS[args.model].refusal(fields)
    if reason is not None:
        readers = sorted(name for name, model in MODELS.items() if model.refusal(fields) is None)
        raise SystemExit(f"--model {args.model}: {reason}: use one of {', '.join(readers)}")
    return fields


def distribution_options(spec, herald):
    """Executor options of the run spec's mode and tables; None values are left to the executor.
    What a mode needs of the other fields is the spec's check (hetu.run.validate)."""
    mode, tables = spec.mode, spec.tables
    if mode.comm is None:
        return {}
    tier = None
    if tables.storage == "disk":
        from hetu.ps import DiskTier
        tier = DiskTier(os.path.abspath(tables.dir), tables.cache_mb or 256.0)
    opts = {"comm_mode": mode.comm, "bsp": mode.bsp, "cstable_policy": mode.cache, "cache_bound": mode.bound,
            "cache_limit_ratio": mode.cache_limit_ratio, "cache_perf": spec.output.cache_perf,
            "prefetch": mode.prefetch, "table_tier": tier, "table_prefetch": tables.prefetch == "on"}
    if herald:
        opts["herald"] = HeraldOptions(lookahead=mode.lookahead, allocator=mode.allocator, protocol=mode.protocol,
                                       planners=mode.planners, planner_threads=mode.planner_threads or 0)
    return opts


def mode_name(args, herald):
    if args.comm is None:
        return "single"
    if herald:
        return f"herald-{args.comm}-{args.cache}" + ("" if args.protocol == "herald" else "-hetprotocol") + \
            {"colocate": "", "greedy": "-greedy", "none": "-noalloc"}[args.allocator]
    return f"het-{args.comm}-{args.cache}-b{args.bound}" if args.cache else args.comm


def make_inputs(data, batch_size, seed):
    """Dataloader ops of the dense features (None without them), ids and labels; every batch
    read is checked for bad values, which are reported by file, row and column. Validation
    reads its whole split: its last, partial global batch is spread over the workers."""
    def op(kind):
        if getattr(data.train, kind) is None:
            return None
        return ht.dataloader_op([ht.Dataloader(getattr(part, kind), batch_size, name, seed=seed,
                                               drop_last=name == "train", check=part.checker(kind))
                                 for part, name in ((data.train, "train"), (data.val, "validate"))])
    return op("dense"), op("sparse"), op("labels")


def run_epoch(executor, name, iterations, progress, desc, after_step=None):
    """`progress`: "bar" (a terminal), seconds between progress lines (a log), or None.
    `after_step()`, if given, runs after every step."""
    losses, preds, labels = [], [], []
    bar = tqdm(range(iterations), desc=desc, disable=progress != "bar", leave=False, file=sys.stdout)
    start = last_line = time.time()
    for _ in bar:
        out = executor.run(name, convert_to_numpy_ret_vals=True)
        losses.append(float(np.asarray(out[0]).reshape(-1)[0]))
        preds.append(out[1])
        labels.append(out[2])
        if after_step is not None:
            after_step()
        if progress == "bar" and len(losses) % 20 == 0:
            bar.set_postfix(loss=f"{np.mean(losses[-20:]):.4f}")
        elif isinstance(progress, float) and time.time() - last_line >= progress and len(losses) < iterations:
            last_line = time.time()
            rate = len(losses) / (last_line - start)
            print(f"{desc}: {len(losses)}/{iterations} iterations, loss {np.mean(losses[-20:]):.4f}, "
                  f"{rate:.1f} it/s, {(iterations - len(losses)) / rate:.0f} s to go", flush=True)
    pred, label = np.concatenate(preds), np.concatenate(labels)
    # A batch's loss is its samples' mean: weighted by its samples where batches differ (the
    # last of a validation split).
    sizes = [np.asarray(p).size for p in preds]
    loss = float(np.mean(losses)) if len(set(sizes)) == 1 else \
        sum(value * n for value, n in zip(losses, sizes) if n) / max(1, sum(sizes))
    comm = executor.graph.comm
    if comm is not None and comm.size > 1:
        # The model's metrics, not this worker's: over every worker's predictions, the loss
        # weighted by each worker's samples.
        samples = comm.allreduce_mean(pred.size)
        loss = comm.allreduce_mean(loss * pred.size) / samples
        pred, label = comm.allgather_array(pred), comm.allgather_array(label)
    return {"loss": loss, "acc": ht.metrics.accuracy(label, pred), "auc": ht.metrics.auc(label, pred),
            "logloss": ht.metrics.logloss(label, pred), "samples": int(pred.size), "iterations": iterations,
            "predictions": preds}   # this worker's, batch by batch


def schedule(executor, args, why=""):
    """(iterations an epoch, workers, iterations in all) of --nepoch and --iters-per-epoch; none at
    all is an error (`why`: what the data makes, for its message)."""
    per_epoch = executor.get_batch_num("train")
    if args.iters_per_epoch and not args.all:
        per_epoch = min(per_epoch, args.iters_per_epoch)
    total = int(round(args.nepoch * per_epoch))
    if total == 0:
        raise SystemExit(f"--nepoch {args.nepoch} of {per_epoch} iterations per epoch is no iteration{why}")
    return per_epoch, executor.graph.num_workers, total


def epoch_text(iterations, workers, args):
    """What an epoch is: its iterations, and the samples they train (a pass over the training
    split leaves out only its last partial global batch)."""
    cap = " (--iters-per-epoch)" if args.iters_per_epoch and not args.all else ""
    return (f"an epoch: {iterations} iterations{cap} x {workers} worker{'s' * (workers != 1)} x batch "
            f"{args.batch_size} = {iterations * workers * args.batch_size} samples")


def job_rates(iterations, seconds, batch_size, workers):
    """The job's samples/s (every worker trains `iterations` batches in the same steps) and one
    worker's share."""
    worker = iterations * batch_size / seconds
    return {"samples_per_second": workers * worker, "worker_samples_per_second": worker, "workers": workers}


def rates_text(iterations, seconds, batch_size, workers):
    rates = job_rates(iterations, seconds, batch_size, workers)
    return (f"{iterations / seconds:.1f} it/s, job {rates['samples_per_second']:.0f} samples/s = {workers} "
            f"worker{'s' * (workers != 1)} x {rates['worker_samples_per_second']:.0f} samples/s")


def size_threads(cluster):
    """This process's threads (the spec's cluster.threads, else hetu.threads' default), set before
    any kernel runs; the host's first worker warns when the host has more of the job's processes
    than cores."""
    threads, warning = ht.threads.configure(cluster.threads)
    if warning and os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK", "0") == "0":
        print(warning, file=sys.stderr, flush=True)
    return threads


def refuse(message):
    """A command line this host cannot run (a folder it cannot write): exit code 2, as a wrong flag."""
    raise hetu.run.SpecError([f"error: {message}"])


def check_outputs(args):
    """The files a run writes at its end must be writable before it trains, not found out after."""
    for flag, path in (("--save-params", args.save_params), ("--checkpoint", args.checkpoint),
                       ("--save-predictions", args.save_predictions)):
        if path:
            folder = os.path.dirname(os.path.abspath(path))
            if not os.path.isdir(folder) or not os.access(folder, os.W_OK):
                refuse(f"{flag} {path}: the folder {folder} does not exist or is not writable")
    if args.cache_perf:
        try:
            os.makedirs(args.csv_dir, exist_ok=True)
        except OSError as e:
            refuse(f"--csv-dir {args.csv_dir}: cannot create it ({e.strerror})")
        if not os.access(args.csv_dir, os.W_OK):
            refuse(f"--csv-dir {args.csv_dir}: not writable")


def run_record(args):
    """What a checkpoint records of its run: the resolved run spec ("spec"; a resumed run takes its
    model from it and is compared with it: hetu.run.defaults) and, by flag name, the fields a
    resumed run must share with it (what older checkpoints hold, and export reads)."""
    spec = args.spec
    sequential = spec.model.name in SEQUENTIAL
    record = {hetu.run.BY_PATH[path].dest: spec.get(path) for path in hetu.run.resume_fields(sequential)}
    record["spec"] = hetu.run.to_dict(spec)
    return record


def checkpoint_run(args):
    """run_record and what an export rebuilds the model from besides: a sequential model's data
    and a MovieLens stream's side files."""
    run = run_record(args)
    if args.model in SEQUENTIAL:
        run.update(sequence_training.export_record(args))
    for name in ("users", "items"):
        if getattr(args, name):
            run[name] = os.path.abspath(getattr(args, name))
    return run


def checkpoint_stats(executor):
    """Worker 0 of a job with servers: their checkpoint counters (cumulative), else None."""
    return ht.ps.server_stats() if executor.graph.remote and executor.graph.rank == 0 else None


def checkpoint_rate_lines(before, after, kind):
    """One line per server on what it wrote ('saved') or read ('loaded') between two
    checkpoint_stats(), timed by the server itself from opening its files to closing them."""
    lines, verb = [], {"saved": "save", "loaded": "load"}[kind]
    for i, (b, a) in enumerate(zip(before, after)):
        size = a[f"checkpoint_{kind}_bytes"] - b[f"checkpoint_{kind}_bytes"]
        seconds = a[f"checkpoint_{verb}_seconds"] - b[f"checkpoint_{verb}_seconds"]
        rate = f"{size / seconds / 1e6:.0f} MB/s" if seconds > 0 else "-"
        lines.append(f"server {i}: checkpoint {kind}, {size} bytes in {seconds:.3f} s ({rate})")
    return lines


def checkpoint_record(executor, args):
    """run_record, and on a stream the source's position after the last trained sample: where a
    resumed job's source continues, so that every sample is trained once (exactly once)."""
    run = checkpoint_run(args)
    feed = getattr(args, "stream_feed", None)
    if feed is not None:
        step = executor.state.iteration
        # No step since the resume: the position the source was sought to still holds.
        run["stream_position"] = feed.position_after(step - 1) if step > feed.first else args.stream_start
    return run


def seek_stream(args, source, feed):
    """A resumed stream job, before anything reads the stream (Herald's look-ahead reads it as the
    executor is built): its source continues after the checkpoint's last trained sample, the
    first batch read being the checkpoint's step. Returns that step (0 for a new job)."""
    args.stream_start = None
    if not args.resume:
        return 0
    meta = ht.Executor.checkpoint_info(args.resume)   # the run spec's parse has read it: it is there
    args.stream_start = (meta.get("run") or {}).get("stream_position")
    if args.stream_start is None:
        raise SystemExit(f"--resume {args.resume}: the checkpoint records no stream position (it was not "
                         f"written by a --stream job)")
    source.seek(args.stream_start)
    feed.start_at(meta["iteration"])
    return meta["iteration"]


def save_checkpoint(executor, args):
    before, t0 = checkpoint_stats(executor), time.time()
    try:
        kind = executor.save(args.checkpoint, run=checkpoint_record(executor, args),   # every worker: a collective
                             full_every=args.checkpoint_full_every)
    except ht.ps.JobFailed:
        raise
    except (OSError, RuntimeError) as e:   # RuntimeError: a server's own write failed (its message names it)
        # The folder being written is removed (checkpoint._write); the last complete one stays.
        raise SystemExit(f"--checkpoint {args.checkpoint}: the save at step {executor.state.iteration} failed: "
                         f"{e.strerror if isinstance(e, OSError) and e.strerror else e}") from None
    if executor.graph.rank == 0:
        print(f"checkpoint at step {executor.state.iteration} written to {args.checkpoint} "
              f"in {time.time() - t0:.3f} s ({kind})", flush=True)
        if before is not None:
            print("\n".join(checkpoint_rate_lines(before, checkpoint_stats(executor), "saved")), flush=True)


def midway_checkpoints(executor, args, epoch_end):
    """run_epoch's after-step hook for --checkpoint-every (the epoch's end has its own checkpoint)."""
    if not args.checkpoint_every:
        return None

    def after_step():
        step = executor.state.iteration
        if step % args.checkpoint_every == 0 and step < epoch_end:
            save_checkpoint(executor, args)
    return after_step


def validate(executor, progress, predictions_path=None):
    """The whole validation split: its metrics and their line for the log; with
    `predictions_path`, its probabilities written there by worker 0 in the split's order."""
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        # Fewer samples left than workers: a worker's part of the last batch is empty, its mean nan.
        warnings.filterwarnings("ignore", "Mean of empty slice", RuntimeWarning)
        val = run_epoch(executor, "validate", executor.get_batch_num("validate"), progress, "validate")
    batches = val.pop("predictions")
    if predictions_path:
        # Worker w reads part w of each global batch: the batches' parts gathered in rank order are
        # the split's order.
        comm = executor.graph.comm
        gathered = [np.asarray(p, np.float32).reshape(-1) for p in batches]
        if comm is not None and comm.size > 1:
            gathered = [comm.allgather_array(p) for p in gathered]
        if executor.graph.rank == 0:
            save_predictions(predictions_path, np.concatenate(gathered))
    return val, f"val loss {val['loss']:.4f} acc {val['acc']:.4f} auc {val['auc']:.4f} logloss {val['logloss']:.4f}"


def save_predictions(path, predictions):
    tmp = path + ".tmp.npy"
    try:
        np.save(tmp, predictions)
        os.replace(tmp, path)
    except OSError as e:
        _remove_quietly(tmp)
        raise SystemExit(f"--save-predictions: cannot write {path}: {e.strerror or e}") from None


def validate_only(executor, args, step, progress, herald):
    """--resume of a checkpoint with nothing left to train, with --val: the checkpoint's metrics."""
    val, line = validate(executor, progress, args.save_predictions)
    print(f"checkpoint {args.resume} at step {step}: {line}", flush=True)
    summary = {"model": args.model, "mode": mode_name(args, herald), "gpu": args.gpu,
               "device": str(executor.config.ctx), "iterations": 0, "first_step": step, "final": {"val": val}}
    print("summary " + json.dumps(summary), flush=True)
    return summary


def resume(executor, args):
    """Worker 0 holds the --checkpoint folder for the job's life (one job saves into a folder at a
    time: hetu.checkpoint.hold); then loads --resume into the executor; the step it continues
    from."""
    if args.checkpoint and executor.graph.rank == 0:
        try:
            ht.checkpoint.hold(args.checkpoint)
        except ht.checkpoint.FolderHeld as e:
            raise SystemExit(f"--checkpoint {args.checkpoint}: {e}") from None
    if not args.resume:
        return 0
    try:
        folder, note = ht.checkpoint.locate(args.resume)
        if note and executor.graph.rank == 0:
            print(f"--resume {args.resume}: {note}", flush=True)
        check_global_batch(executor, args, ht.Executor.checkpoint_info(folder))
        before, t0 = checkpoint_stats(executor), time.time()
        executor.load(folder)
        seconds = time.time() - t0
    except (FileNotFoundError, KeyError, ValueError, RuntimeError) as e:   # RuntimeError: a server's load
        raise SystemExit(f"--resume {args.resume}: {str(e).strip(chr(39))}") from None
    args.resumed_from = folder
    if executor.graph.rank == 0:
        print(executor.resumed_from(folder) + f" in {seconds:.3f} s", flush=True)
        if before is not None:
            print("\n".join(checkpoint_rate_lines(before, checkpoint_stats(executor), "loaded")), flush=True)
    return executor.state.iteration


def check_global_batch(executor, args, meta):
    """A checkpoint continues on another number of workers only with the same global batch."""
    saved_batch = (meta.get("run") or {}).get("batch_size")
    saved_workers, workers = meta.get("workers", 1), executor.graph.num_workers
    if saved_batch is not None and saved_batch * saved_workers != args.batch_size * workers:
        raise ValueError(f"the checkpoint was trained with a global batch of {saved_workers} worker(s) x "
                         f"--batch-size {saved_batch} = {saved_batch * saved_workers}, this run has {workers} "
                         f"worker(s) x --batch-size {args.batch_size} = {args.batch_size * workers}: workers x "
                         f"--batch-size must stay the same, or the training would differ")


def check_batches(executor, data, args):
    """Each split the run reads must hold one global batch; found before training, not after it."""
    workers = executor.graph.num_workers
    splits = [("training", "train", len(data.train))] + ([("validation", "validate", len(data.val))] if args.val else [])
    for what, name, samples in splits:
        if samples < workers * args.batch_size:
            raise SystemExit(f"the {what} split has {samples} samples, fewer than one global batch of {workers} "
                             f"worker(s) x --batch-size {args.batch_size}: lower --batch-size or use more data")


def device_of(cluster):
    """The worker's device; with --gpu, a missing CuPy or GPU ends the run here, in one line."""
    try:
        ctx = devices.worker_context(cluster.gpu)
        if cluster.gpu:
            ctx.array_module()   # CuPy imports and this GPU exists
    except (RuntimeError, ValueError) as e:
        message = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise SystemExit(message if message.startswith("--gpu") else f"--gpu: {message}") from None
    return ctx


# Errors whose message says all there is to say: a bad entry in the data (a stream's bad line), a dead or
# lost peer, a table a server refused or a dynamic table this host has not the memory for.
ONE_LINE_ERRORS = (BadBatch, DataFormatError, ht.ps.JobFailed, ht.ps.TableRefused, ht.dynamic.NotEnoughMemory)


def main(argv=None, herald=False):
    try:
        try:
            return train(argv, herald)
        except ONE_LINE_ERRORS as e:
            raise SystemExit(f"error: {e}") from None
        except hetu.run.SpecError as e:
            print(e, file=sys.stderr, flush=True)   # every wrong field, then exit code 2
            raise
    except SystemExit as stop:
        exit_at_once_if_mpi_started(stop)
        raise


def train(argv, herald):
    spec = run_spec(argv, herald)
    # What is not yet written against the spec reads it through the flags' names (args.batch_size:
    # --batch-size's field); args.spec is the spec itself.
    args = hetu.run.namespace(spec)
    threads = size_threads(spec.cluster)
    check_outputs(args)
    make_tensorboard_dir(args)
    options = distribution_options(spec, herald)
    ctx = device_of(spec.cluster)
    dynamic = dynamic_table(spec.tables)
    if args.model in SEQUENTIAL:
        return sequence_training.train(args, herald, options, ctx, threads, dynamic)
    if args.stream:
        return train_stream(args, herald, options, ctx, dynamic, threads)
    data = load(args)
    meta = data.meta
    dense_input, sparse_input, y_ = make_inputs(data, args.batch_size, args.seed)
    loss, prediction, y_, train_op = MODELS[args.model](
        dense_input, sparse_input, y_, readable_fields(args, meta, dynamic), embedding_size=args.embedding_size,
        optimizer=OPTIMIZERS[args.optimizer](learning_rate=args.learning_rate, embedding_dtype=args.embedding_dtype))
    executor = ht.Executor({"train": [loss, prediction, y_, train_op], "validate": [loss, prediction, y_]},
                           ctx=ctx, seed=args.seed, cuda_graph=args.cuda_graph, **options)
    check_batches(executor, data, args)
    per_epoch, workers, total = schedule(executor, args)
    first = resume(executor, args)
    progress = None if args.no_progress else "bar" if sys.stdout.isatty() else args.log_interval
    if first >= total:
        if args.val:
            return validate_only(executor, args, first, progress, herald)
        raise SystemExit(f"--resume {args.resume}: the checkpoint is at step {first}, and --nepoch {args.nepoch:g} "
                         f"of {per_epoch} iterations per epoch is {total} steps: nothing is left to train "
                         f"(with --val: validate it only)")
    table_text = f"{meta.num_embeddings} embedding rows x {args.embedding_size}" if dynamic is None else \
        f"embedding rows x {args.embedding_size} in tables {dynamic.describe()}"
    print(f"{args.model}: {table_text}, "
          f"{len(data.train)} train / {len(data.val)} val samples; " + epoch_text(per_epoch, workers, args) +
          f"; {total} iterations" + (f" on {ctx}" if ctx.is_gpu else "") +
          f", {threads} thread{'s' * (threads != 1)} per process" +
          (f", resumed at step {first} from {args.resumed_from}" if first else ""), flush=True)
    start, done, epoch, history = time.time(), first, first // per_epoch, []
    while done < total:
        n = min(per_epoch * (epoch + 1), total) - done   # a resumed run may start within an epoch
        t0 = time.time()
        stats = run_epoch(executor, "train", n, progress, f"epoch {epoch}",
                          after_step=midway_checkpoints(executor, args, done + n))
        del stats["predictions"]
        stats["seconds"] = time.time() - t0
        line = (f"epoch {epoch}: train loss {stats['loss']:.4f} acc {stats['acc']:.4f} auc {stats['auc']:.4f} "
                f"logloss {stats['logloss']:.4f} ({rates_text(n, stats['seconds'], args.batch_size, workers)})")
        if args.val:
            stats["val"], val_line = validate(executor, progress, args.save_predictions)
            line += " | " + val_line
        print(line, flush=True)
        history.append(stats)
        done += n
        epoch += 1
        if args.checkpoint:
            save_checkpoint(executor, args)
    executor.flush()   # every worker: pending cached updates reach the servers
    elapsed = time.time() - start
    summary = {"model": args.model, "mode": mode_name(args, herald), "gpu": args.gpu, "device": str(ctx),
               "iterations": total - first, "first_step": first, "seconds": elapsed,
               "counters": executor.counters.totals(),
               **job_rates(total - first, elapsed, args.batch_size, workers), "final": history[-1]}
    return report_end(executor, args, herald, summary)


def report_end(executor, args, herald, summary):
    """After the last step and the flush: the parameters (--save-params), the counters and the
    run's summary line, which it returns."""
    # The trained model first: a report that fails afterwards must not lose it.
    if args.save_params and executor.graph.rank == 0:
        save_params(executor, args.save_params)
    executor.barrier()   # no worker's failing report ends the job before they are written
    print(executor.counters.summary_line(), flush=True)
    if executor.graph.rank == 0:
        for keys in executor.graph.dynamic_keys:
            for table in keys.tables.values():
                print("\n".join(keys.counter_lines(table.name)), flush=True)
    failed_report = write_counters(executor, args, herald) if args.cache_perf else None
    scheduler = executor.graph.scheduler
    if scheduler is not None:
        summary["planner"] = {"rank": executor.graph.rank, "host_ranks": scheduler.host_ranks,
                              "plans_here": scheduler.plans_here, "threads": scheduler.planner_threads}
    print("summary " + json.dumps(summary), flush=True)
    if failed_report:
        raise SystemExit(failed_report)
    return summary


# --- training on a stream (docs/design.md section 14; hetu.streaming) ----------------------------------

def make_tensorboard_dir(args):
    if args.stream and args.tensorboard:
        try:
            os.makedirs(args.tensorboard, exist_ok=True)
        except OSError as e:
            refuse(f"--tensorboard {args.tensorboard}: cannot create it ({e.strerror})")


def open_stream(args):
    """--stream's source (hetu.data.stream.StreamSource)."""
    from hetu.data.stream import StreamSource
    try:
        return StreamSource(args.stream, args.stream_format, users=args.users, items=args.items,
                            skip_bad_lines=args.skip_bad_lines)
    except (OSError, ValueError) as e:
        raise SystemExit(f"--stream {args.stream}: {e}") from None


def train_stream(args, herald, options, ctx, dynamic, threads):
    """Trains on --stream until it ends (standard input closed) or --stream-idle-exit: global
    batch t is the stream's samples [t*W*b, (t+1)*W*b); every --window samples, a progressive
    validation line."""
    source = open_stream(args)
    feed = StreamFeed(source, args.batch_size, idle_exit=args.stream_idle_exit)
    loaders = stream_loaders(feed, args.batch_size)
    dense_input, sparse_input, y_ = (None if d is None else ht.dataloader_op([d]) for d in loaders)
    fields = source.fields.with_dynamic(dynamic)
    reason = MODELS[args.model].refusal(fields)
    if reason is not None:
        raise SystemExit(f"--model {args.model}: {reason}")
    loss, prediction, y_, train_op = MODELS[args.model](
        dense_input, sparse_input, y_, fields, embedding_size=args.embedding_size,
        optimizer=OPTIMIZERS[args.optimizer](learning_rate=args.learning_rate, embedding_dtype=args.embedding_dtype))
    sought = seek_stream(args, source, feed)
    executor = ht.Executor({"train": [loss, prediction, y_, train_op]}, ctx=ctx, seed=args.seed,
                           cuda_graph=args.cuda_graph, **options)
    graph, workers = executor.graph, executor.graph.num_workers
    source.report = graph.rank == 0   # every worker reads the stream: the first says what it skips and waits for
    first = resume(executor, args)
    if first != sought:
        raise SystemExit(f"--resume {args.resume}: the checkpoint changed while the job started (step "
                         f"{sought}, then {first})")
    args.stream_feed = feed   # its position goes into each checkpoint
    rank = graph.rank
    csv_path = None
    if args.csv_dir and rank == 0:
        os.makedirs(args.csv_dir, exist_ok=True)
        csv_path = os.path.join(args.csv_dir, f"{args.model}-{mode_name(args, herald)}-windows.csv")
    writer = tensorboard_writer(args.tensorboard) if args.tensorboard and rank == 0 else None
    windows = ProgressiveValidation(args.window, feed, comm=graph.comm, rank=rank, csv_path=csv_path,
                                    tensorboard=writer, first_sample=first * feed.size)
    if rank == 0:
        print(f"{args.model}: embedding rows x {args.embedding_size} in tables {dynamic.describe()}; stream "
              f"{args.stream} ({args.stream_format}), global batch {workers} worker{'s' * (workers != 1)} x batch "
              f"{args.batch_size} = {feed.size} samples; windows of {args.window} samples" +
              (f"; ends after {args.stream_idle_exit:g} s without a new sample" if args.stream_idle_exit else "") +
              f", {threads} thread{'s' * (threads != 1)} per process" +
              (f", resumed at step {first} from {args.resumed_from}" if first else ""), flush=True)
    progress = None if args.no_progress else args.log_interval
    start = time.time()
    steps, losses = follow_stream(executor, feed, windows, loaders[1], args, first,
                                  ahead=1 if graph.scheduler is not None else 0, progress=progress)
    windows.finish()
    executor.flush()
    elapsed = time.time() - start
    if writer is not None:
        writer.close()
    trained = (first + steps) * feed.size
    if rank == 0:
        bad, waiting = source.bad_lines, source.waiting_for
        print(f"stream: {steps} global batches trained, samples {first * feed.size}-{trained - 1}; "
              f"{feed.pending_samples} samples read after them not trained (an incomplete global batch)" +
              (f"; {bad} bad lines skipped" if bad else "") +
              (f"; the reader was waiting for {waiting}" if waiting else ""), flush=True)
    if args.checkpoint:
        save_checkpoint(executor, args)
    source.close()
    final = {"loss": float(np.mean(losses)) if losses else float("nan"), "samples": steps * feed.size,
             "not_trained": feed.pending_samples, "bad_lines": source.bad_lines,
             "bad_lines_by_file": dict(source.bad_lines_by_file), "windows": windows.rows}
    summary = {"model": args.model, "mode": mode_name(args, herald), "gpu": args.gpu, "device": str(ctx),
               "iterations": steps, "first_step": first, "seconds": elapsed, "counters": executor.counters.totals(),
               **job_rates(steps, elapsed, args.batch_size, workers), "final": final}
    return report_end(executor, args, herald, summary)


def follow_stream(executor, feed, windows, sparse_loader, args, first, ahead, progress):
    """Steps from global batch `first` while every worker has the batch (StreamFeed.all_ready:
    the same decision everywhere), `ahead` batches more in hand (Herald plans batch t once t+1 is
    allocated). Returns (steps, losses)."""
    comm = executor.graph.comm
    after_step = midway_checkpoints(executor, args, float("inf"))
    losses, t, ready_through = [], first, first - 1
    start = last_line = time.time()
    while True:
        while ready_through < t + ahead and feed.all_ready(ready_through + 1, comm):
            ready_through += 1
        if ready_through < t:
            break
        out = executor.run("train", convert_to_numpy_ret_vals=True)
        losses.append(float(np.asarray(out[0]).reshape(-1)[0]))
        windows.add(t, sparse_loader.sample_indices(t), out[1], out[2])
        if after_step is not None:
            after_step()
        t += 1
        if progress is not None and time.time() - last_line >= progress and executor.graph.rank == 0:
            last_line = time.time()
            print(f"stream: step {t}, {(t - first) * feed.size} samples trained, loss {np.mean(losses[-20:]):.4f}, "
                  f"{(t - first) / (last_line - start):.1f} it/s", flush=True)
    return t - first, losses


def save_params(executor, path):
    tmp = path + ".tmp.npz"
    try:
        np.savez(tmp, **by_key(executor.parameters(), executor.graph.dynamic_keys))
        os.replace(tmp, path)
    except OSError as e:
        _remove_quietly(tmp)
        raise SystemExit(f"--save-params: cannot write {path}: {e.strerror or e}") from None


def write_counters(executor, args, herald):
    """--cache-perf's CSVs: this worker's per-iteration counters and, from worker 0, what each
    server has served; on failure the partial file is removed and the error returned."""
    prefix = os.path.join(args.csv_dir, f"{args.model}-{mode_name(args, herald)}")
    path = f"{prefix}-worker{executor.graph.rank}.csv"
    try:
        executor.counters.write_csv(path)
        print(f"per-iteration counters written to {path}", flush=True)
        if executor.graph.rank == 0:
            for keys in executor.graph.dynamic_keys:
                for table in keys.tables.values():
                    path = f"{prefix}-{table.name}-dynamic.csv"
                    keys.write_csv(path, table.name)
                    print(f"per-iteration counters of dynamic table {table.name} written to {path}", flush=True)
        if executor.graph.remote and executor.graph.rank == 0:
            path = f"{prefix}-servers.csv"
            ht.ps.write_server_stats(path, ht.ps.server_stats())
            print(f"per-server counters written to {path}", flush=True)
    except OSError as e:
        _remove_quietly(path + ".tmp")   # the partial file
        return f"--cache-perf: cannot write {path}: {e.strerror or e}"
    return None


def _remove_quietly(path):
    try:
        os.remove(path)
    except OSError:
        pass
