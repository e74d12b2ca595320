"""Checkpoints: the files of a checkpoint folder (written beside the old one, synced, checksummed,
swapped in), and an executor's save and load, which ask each stateful part for its state and
give it back: local parameters with their optimizer state and running statistics
(hetu.parameters), the tables on the servers through their RowSources (hetu.rows), the step
and seed (RunState), the optimizer ops' step counts, the dataloaders' positions, and Herald's
scheduler.

A save writes a new folder `.tmp-NAME.XXXXXXXX` beside NAME, syncs every file, records each
file's sha256 in meta.json (written last), then swaps by renames:

    NAME -> NAME.previous,  .tmp-NAME.XXXXXXXX -> NAME,  remove NAME.previous

so that at every instant NAME or NAME.previous holds a complete checkpoint; locate() finds it.
Temporary folders of interrupted saves are removed by the next save. Loading checks every
file against meta.json first: a changed byte is an error naming the file.

HETU_CHECKPOINT_STOP_AT=POINT kills the saving process (SIGKILL) at one of STOP_POINTS, to
test that every step of the swap leaves a checkpoint to resume from.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile

import numpy as np

META = "meta.json"
PREVIOUS = ".previous"
STOP_POINTS = ("written", "old-set-aside", "new-in-place")


def _stop_point(point):
    if os.environ.get("HETU_CHECKPOINT_STOP_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _fsync(path, folder=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if folder else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder):
    """Relative paths of the files under `folder`, meta.json aside."""
    out = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder)
            if rel != META:
                out.append(rel)
    return sorted(out)


def _temporaries(directory):
    parent, name = os.path.split(directory)
    # mkdtemp's suffix: 8 characters of [a-z0-9_], so NAME's temporaries are told from NAME2's.
    pattern = re.compile(r"\.tmp-" + re.escape(name) + r"\.[a-z0-9_]{8}")
    return [os.path.join(parent, e) for e in os.listdir(parent) if pattern.fullmatch(e)]


def new_folder(directory):
    """An empty folder beside `directory` for a new checkpoint; interrupted saves' are removed."""
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    for stale in _temporaries(directory):
        shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(directory) + ".", dir=parent)


def seal(folder, meta):
    """Syncs every file of `folder`, then writes meta.json with their checksums, last."""
    files = {}
    for rel in _files(folder):
        path = os.path.join(folder, rel)
        files[rel] = {"sha256": sha256_of(path), "bytes": os.path.getsize(path)}
        _fsync(path)
    meta = {**meta, "files": files}
    with open(os.path.join(folder, META), "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    for root, _, _ in os.walk(folder):
        _fsync(root, folder=True)


def swap_in(folder, directory):
    """Makes the sealed `folder` the checkpoint at `directory`, keeping a complete checkpoint at
    `directory` or `directory.previous` at every instant."""
    parent = os.path.dirname(directory)
    previous = directory + PREVIOUS
    _stop_point("written")
    if os.path.isdir(directory):
        shutil.rmtree(previous, ignore_errors=True)   # `directory` is complete: the older one goes
        os.rename(directory, previous)
        _fsync(parent, folder=True)
        _stop_point("old-set-aside")
    # Without `directory`, `previous` (if any) is the only complete checkpoint until this rename.
    os.rename(folder, directory)
    _fsync(parent, folder=True)
    _stop_point("new-in-place")
    shutil.rmtree(previous, ignore_errors=True)


def locate(directory):
    """(folder, note): the folder holding the checkpoint saved at `directory`; `note` says why it
    is not `directory` itself (an interrupted save), else it is None."""
    directory = os.path.abspath(directory)
    if os.path.exists(os.path.join(directory, META)):
        return directory, None
    previous = directory + PREVIOUS
    if not os.path.exists(directory) and os.path.exists(os.path.join(previous, META)):
        return previous, (f"{directory} is missing (a save was interrupted while replacing it): "
                          f"using the checkpoint before it, {previous}")
    if not os.path.exists(directory) and not os.path.exists(previous):
        # A first save killed before its swap leaves only its temporary folder, which is incomplete.
        unfinished = sorted(_temporaries(directory)) if os.path.isdir(os.path.dirname(directory)) else []
        if unfinished:
            raise FileNotFoundError(f"{directory} is not a hetu checkpoint: its first save was interrupted before "
                                    f"it was complete, leaving only {unfinished[-1]} (unusable; the next save "
                                    f"removes it)")
    raise FileNotFoundError(f"{directory} is not a hetu checkpoint (no {META})")


def read_meta(folder):
    path = os.path.join(folder, META)
    try:
        with open(path) as f:
            meta = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}): the checkpoint is damaged") from None
    files = meta.get("files", {}) if isinstance(meta, dict) else None
    if not isinstance(files, dict) or not all(isinstance(f, dict) and {"sha256", "bytes"} <= set(f)
                                              for f in files.values()):
        raise ValueError(f"{path} is not a checkpoint's meta.json: the checkpoint is damaged")
    return meta


def verify(folder, meta, only=None):
    """Every file meta.json lists (or those under `only`, a relative prefix) is as saved."""
    for rel, saved in sorted(meta.get("files", {}).items()):
        if only is not None and not rel.startswith(only):
            continue
        path = os.path.join(folder, rel)
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint file {path} is missing")
        size = os.path.getsize(path)
        if size < saved["bytes"]:
            raise ValueError(f"checkpoint file {path} is truncated: {size} bytes, {saved['bytes']} when saved")
        if size > saved["bytes"]:
            raise ValueError(f"checkpoint file {path} has {size - saved['bytes']} bytes appended since it was saved")
        if sha256_of(path) != saved["sha256"]:
            raise ValueError(f"checkpoint file {path} is corrupt: its content differs from its sha256 in "
                             f"{os.path.join(folder, META)}")


# --- an executor's checkpoint: each stateful part gives its state and takes it back ------------
ARRAYS = "arrays.npz"
SERVERS = "ps"   # the servers' shards of every table on them
DYNAMIC = "dynamic.npz"   # the dynamic tables' key directories (hetu.dynamic.TableKeys.state)


def save(executor, directory, run=None):
    """Executor.save: every worker calls it at the same step. Pending cached updates are
    flushed first (a collective push); then worker 0 has the servers write their shards and
    writes the rest itself (local parameters are the same on every worker)."""
    executor.flush()
    executor.barrier()   # every worker's pushes are in, so the servers have applied them all
    if executor.graph.rank == 0:
        _write(executor, os.path.abspath(directory), run)
    executor.barrier()   # no worker pushes again before the servers have written


def _on_servers(graph):
    """(parameter, what it is read through: its cache, else its RemoteTable) of every parameter
    on the servers."""
    return [(p, graph.caches.get(p.id, graph.remote[p.id])) for p in graph.parameters if p.id in graph.remote]


def _write(executor, directory, run):
    graph = executor.graph
    tmp = new_folder(directory)
    try:
        for p, _ in _on_servers(graph):
            graph.remote[p.id].save(os.path.join(tmp, SERVERS))
        np.savez(os.path.join(tmp, ARRAYS), **executor.params.state())
        if graph.dynamic_keys:   # every worker's replica is the same: worker 0's is saved
            np.savez(os.path.join(tmp, DYNAMIC), **{f"{i}/{k}": v for i, keys in enumerate(graph.dynamic_keys)
                                                    for k, v in keys.state().items()})
        meta = {**executor.state.state(),
                "optimizer_steps": {op.name: op.step_count for op in graph.optimizer_ops},
                "workers": graph.num_workers, "servers": executor.num_servers(),
                "clocks": {p.name: source.state() for p, source in _on_servers(graph)},
                "tables": {p.name: list(p.shape) for p, _ in _on_servers(graph)},
                "loaders": [op.state() for op in graph.dataloaders],
                "dynamic": [{"name": keys.name, **vars(keys.table)} for keys in graph.dynamic_keys],
                "global_batches": [op.global_batches() for op in graph.dataloaders],
                "run": run}
        seal(tmp, meta)
        swap_in(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def info(directory):
    """Executor.checkpoint_info: the meta.json of `directory`, or of the checkpoint before it
    where a save was interrupted while replacing it (locate)."""
    folder, _ = locate(directory)
    if not os.path.exists(os.path.join(folder, ARRAYS)):
        raise FileNotFoundError(f"{folder} is not a hetu checkpoint (no {ARRAYS})")
    return read_meta(folder)


def load(executor, directory):
    """Executor.load: every file and the shape of the run are checked before anything changes."""
    graph = executor.graph
    directory, _ = locate(directory)
    meta = info(directory)
    # The servers' shards are checked by worker 0, the one that has the servers load them.
    verify(directory, meta, only=None if graph.rank == 0 else ARRAYS)
    if executor.state.iteration:
        raise RuntimeError(f"load {directory}: this executor has trained {executor.state.iteration} steps; "
                           f"load a checkpoint into a new one")
    _check_shape(graph, directory, meta)
    with np.load(os.path.join(directory, ARRAYS)) as data:
        arrays = {key: data[key] for key in data.files}
    for p, _ in _on_servers(graph):
        if p.name not in meta.get("clocks", {}):
            raise KeyError(f"checkpoint {directory} has no parameter {p.name} on the servers")
    executor.params.check(arrays, f"checkpoint {directory}")
    dynamic = _dynamic_arrays(graph, directory, meta)

    if graph.rank == 0:
        for p, _ in _on_servers(graph):
            graph.remote[p.id].load(os.path.join(directory, SERVERS))
    executor.barrier()   # every table is loaded before any worker reads one
    step = meta["iteration"]
    for p, source in _on_servers(graph):
        source.restore(meta["clocks"][p.name], step)
    executor.params.restore(arrays)
    executor.state.restore(meta)
    for op in graph.optimizer_ops:
        op.step_count = meta["optimizer_steps"].get(op.name, op.step_count)
    for op, positions in zip(graph.dataloaders, meta.get("loaders", [])):
        op.restore(positions)
    for keys, arrays in zip(graph.dynamic_keys, dynamic):
        keys.restore(arrays, step)
    if graph.scheduler is not None:
        graph.scheduler.start_at(step)   # Herald's plans restart with the caches at the step reached


def _dynamic_arrays(graph, directory, meta):
    """Each dynamic table's saved key directory (hetu.dynamic.TableKeys.state), checked against
    the graph's tables and their rules."""
    saved = meta.get("dynamic", [])
    have = [{"name": keys.name, **vars(keys.table)} for keys in graph.dynamic_keys]
    if saved != have:
        raise ValueError(f"checkpoint {directory}: its dynamic tables are {saved or 'none'}, this run's "
                         f"{have or 'none'}: resume with the same --table-capacity and rule options")
    if not have:
        return []
    with np.load(os.path.join(directory, DYNAMIC)) as data:
        return [{k.split("/", 1)[1]: data[k] for k in data.files if k.split("/", 1)[0] == str(i)}
                for i in range(len(have))]


def _check_shape(graph, directory, meta):
    """The data path a checkpoint continues must be the one it was written by, with the same
    global batches (docs/design.md section 4), and its tables the graph's."""
    loaders = meta.get("loaders", [])
    names = [sorted(op.dataloaders) for op in graph.dataloaders]
    if loaders and [sorted(p) for p in loaders] != names:
        raise ValueError(f"checkpoint {directory} holds dataloaders {[sorted(p) for p in loaders]}, "
                         f"the graph has {names}")
    workers, saved_batches = meta.get("workers", 1), meta.get("global_batches")
    if workers != graph.num_workers and saved_batches is None:
        raise ValueError(f"checkpoint {directory} was written by {workers} worker(s), this run has "
                         f"{graph.num_workers}, and it does not record its global batch: the training "
                         f"could differ")
    for op, saved in zip(graph.dataloaders, saved_batches or []):
        for name, d in op.dataloaders.items():
            if saved.get(name, d.global_batch) != d.global_batch:
                raise ValueError(
                    f"checkpoint {directory} was trained with a global batch of {saved[name]} ({workers} "
                    f"worker(s) x {saved[name] // workers}) in dataloader {name!r}, this run's is "
                    f"{d.global_batch} ({d.num_workers} worker(s) x {d.batch_size}): workers x batch size "
                    f"must stay the same, or the training would differ")
    for p, _ in _on_servers(graph):
        saved = meta.get("tables", {}).get(p.name)
        if saved is not None and tuple(saved) != tuple(p.shape):
            raise ValueError(f"checkpoint {directory}: table {p.name} has shape {tuple(saved)}, the graph's "
                             f"is {tuple(p.shape)}")


def resumed_from(executor, directory):
    """Executor.resumed_from: the step, and the cluster that wrote the checkpoint against this one."""
    meta = info(directory)
    tables = len(meta.get("tables", meta.get("clocks", {})))
    return (f"resumed {directory} at step {meta['iteration']}: written by {meta.get('workers', 1)} worker(s) and "
            f"{meta.get('servers', 0)} server(s), continued by {executor.graph.num_workers} and "
            f"{executor.num_servers()}; every file's sha256 checked"
            + (f", the servers' rows of {tables} table(s) counted as loaded" if tables else ""))
