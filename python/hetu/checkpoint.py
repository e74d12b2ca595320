"""Checkpoints: the files of a checkpoint folder (written beside the old one, synced, checksummed,
swapped in), and an executor's save and load, which ask each stateful part for its state and
give it back: local parameters with their optimizer state and running statistics
(hetu.parameters), the tables on the servers through their RowSources (hetu.rows), the step
and seed (RunState), the optimizer ops' step counts, the dataloaders' positions, and Herald's
scheduler.

A save writes a new folder `.tmp-NAME.XXXXXXXX` beside NAME, syncs every file, records each
file's sha256 in meta.json (written last, with the sha256 of its own content: meta_digest), then
swaps by renames:

    NAME -> NAME.previous,  .tmp-NAME.XXXXXXXX -> NAME,  remove NAME.previous

so that at every instant NAME or NAME.previous holds a complete checkpoint; locate() finds it.
Temporary folders of interrupted saves are removed by the next save. Loading checks meta.json
against its own sha256 and every file against meta.json first: a changed byte is an error naming
the file.

Incremental checkpoints (save's `full_every` K > 1): every K-th save is full, the ones between
are deltas, folders NAME/deltas/000001, 000002, ... each holding what changed since the save
before it (full or delta): the servers' rows whose version rose (an update or an admit raised
it), the local tables' rows whose step count moved or (dynamic tables) whose slot was read,
each with its optimizer state, steps and version; and whole, as in a full checkpoint, the
local dense parameters, the position (step, dataloaders, the dynamic tables' key directories)
and meta.json. A delta is written in `deltas/.tmp-NNNNNN.XXXXXXXX`, sealed as a full one is
(synced, checksummed) and renamed into place, so a delta is there whole or not at all. Each
save records a random mark (meta.json "mark"), also given to the servers, which keep every
row's version at the marked save: a delta names its base's mark ("base") and the servers refuse
one whose base is not the mark they hold, so a delta never counts its rows from another save.
Load takes the full checkpoint and applies its deltas in order; the next full save swaps the
whole chain out.

HETU_CHECKPOINT_STOP_AT=POINT kills the saving process (SIGKILL) at one of STOP_POINTS or
DELTA_STOP_POINTS, to test that every step of a save leaves a checkpoint to resume from.
"""
import fcntl
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import time
import weakref

import numpy as np

from . import cuda, env

META = "meta.json"
FORMAT = 2   # meta.json's format: 2 records the sha256 of its own content (META_DIGEST)
META_DIGEST = "meta_sha256"
PREVIOUS = ".previous"
STOP_POINTS = ("written", "old-set-aside", "new-in-place")   # a full checkpoint's swap
DELTA_STOP_POINTS = ("delta-written",)   # a delta sealed, not yet renamed into place


def _stop_point(point):
    if env.raw("HETU_CHECKPOINT_STOP_AT") == point:
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


def meta_digest(meta):
    """The sha256 of a meta.json's content without its own digest: of its JSON with sorted keys
    and no spaces, as it reads back (so a key that JSON turns into a string counts as one)."""
    content = {k: v for k, v in json.loads(json.dumps(meta)).items() if k != META_DIGEST}
    return hashlib.sha256(json.dumps(content, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def stamped(meta):
    """`meta` with the format and its own digest, as seal() writes it."""
    meta = {**meta, "format": FORMAT}
    return {**meta, META_DIGEST: meta_digest(meta)}


def seal(folder, meta):
    """Syncs every file of `folder`, then writes meta.json with their checksums and its own, last."""
    files = {}
    for rel in _files(folder):
        path = os.path.join(folder, rel)
        files[rel] = {"sha256": sha256_of(path), "bytes": os.path.getsize(path)}
        _fsync(path)
    meta = stamped({**meta, "files": files})
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
    # A meta.json of format 2 carries the sha256 of the rest of its content; one written before
    # (neither key) is read unchecked. One key without the other is damage, not an older format.
    if META_DIGEST in meta or "format" in meta:
        if meta.get(META_DIGEST) != meta_digest(meta):
            raise ValueError(f"checkpoint file {path} is corrupt: its content differs from the sha256 it records "
                             f"of itself ({META_DIGEST})")
        if meta.get("format") != FORMAT:
            raise ValueError(f"checkpoint file {path} is of format {meta.get('format')}, this version of hetu "
                             f"reads format {FORMAT} and the unversioned one before it")
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


# --- one job writes a checkpoint folder at a time ----------------------------------------------
class FolderHeld(RuntimeError):
    """Another process holds the checkpoint folder (hold)."""


_held = {}   # lock file path -> its open file, for the life of the process
HOLD_WAIT_S = 15.0   # how long hold() waits for a holder that may be ending: the launcher's --kill-grace, and more


def lock_path(directory):
    """The lock file of the checkpoint at `directory`: beside it, `.NAME.lock`, since a full save
    replaces the folder itself by renames (a lock file in it would move out with the old one)."""
    parent, name = os.path.split(os.path.abspath(directory))
    return os.path.join(parent, f".{name}.lock")


def _lock(fd, wait):
    """flock(LOCK_EX) on `fd` within `wait` seconds; BlockingIOError after."""
    deadline = time.monotonic() + wait
    while True:
        try:
            return fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.1)


def hold(directory, wait=HOLD_WAIT_S):
    """Takes an exclusive lock (flock) on the checkpoint folder `directory` for the life of this
    process: the kernel releases it when the process ends, however it ends. A holder may still be
    ending (a job just killed: its launcher gives its processes --kill-grace seconds): after
    `wait` seconds raises FolderHeld, naming the holder's pid and host."""
    path = lock_path(directory)
    if path in _held:
        return
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        _lock(fd, wait)
    except BlockingIOError:
        with os.fdopen(fd, "r") as f:
            holder = f.read().split()
        who = (f"pid {holder[0]} on {holder[1]}, since {holder[2]}" if len(holder) == 3 else "a process that has not "
               "said who it is yet")
        raise FolderHeld(f"another job is saving checkpoints into this folder ({who}; lock {path}): wait for it to "
                         f"end or give this job another folder") from None
    except BaseException:
        os.close(fd)
        raise
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()} {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}\n"
              .encode(), 0)
    _held[path] = os.fdopen(fd, "r+")


def release(directory):
    """Gives up hold()'s lock on `directory` before the process ends."""
    f = _held.pop(lock_path(directory), None)
    if f is not None:
        f.close()


# --- an executor's checkpoint: each stateful part gives its state and takes it back ------------
ARRAYS = "arrays.npz"
SERVERS = "ps"   # the servers' shards of every table on them
DYNAMIC = "dynamic.npz"   # the dynamic tables' key directories (hetu.dynamic.TableKeys.state)
DELTAS = "deltas"   # a full checkpoint's deltas, in order: deltas/000001, deltas/000002, ...
ROWS = "rows.npz"   # a delta's rows of the tables this process holds


class _Baseline:
    """What worker 0 knows of its last save or load, which a delta continues: its mark, its step,
    and the step counts of the tables this process holds (a row whose count moved changed)."""

    def __init__(self, mark, iteration, steps):
        self.mark, self.iteration, self.steps = mark, iteration, steps


_baselines = weakref.WeakKeyDictionary()   # executor -> _Baseline


def _new_mark():
    return int.from_bytes(os.urandom(8), "little") >> 2 or 1   # > 0: 0 means "no mark"


def save(executor, directory, run=None, full_every=1):
    """Executor.save: every worker calls it at the same step. Pending cached updates are
    flushed first (a collective push); then worker 0 has the servers write their shards and
    writes the rest itself (local parameters are the same on every worker). With `full_every`
    K > 1, the saves between two full ones (every K-th) are deltas of the one before. Returns
    what worker 0 wrote, "full" or "delta N"; None on the other workers."""
    if full_every < 1:
        raise ValueError(f"checkpoint {directory}: a full checkpoint every {full_every} saves: it must be 1 or more")
    executor.flush()
    executor.barrier()   # every worker's pushes are in, so the servers have applied them all
    written = None
    if executor.graph.rank == 0:
        directory = os.path.abspath(directory)
        chain = _continued_chain(executor, directory)
        if chain is not None and len(chain) + 1 < full_every:
            _write_delta(executor, directory, run, len(chain) + 1)
            written = f"delta {len(chain) + 1}"
        else:
            _write(executor, directory, run)
            written = "full"
    executor.barrier()   # no worker pushes again before the servers have written
    return written


def _continued_chain(executor, directory):
    """The deltas of the checkpoint at `directory` when its last save (full or delta) is this
    executor's last save or load, so that a delta can follow it; else None."""
    baseline = _baselines.get(executor)
    if baseline is None or not os.path.exists(os.path.join(directory, META)):
        return None
    try:
        metas = [read_meta(directory)] + [m for _, m in _chain(directory)]
    except ValueError:
        return None   # a damaged chain: a full checkpoint starts a new one
    return metas[1:] if metas[-1].get("mark") == baseline.mark else None


def _on_servers(graph):
    """(parameter, what it is read through: its cache, else its RemoteTable) of every parameter
    on the servers."""
    return [(p, graph.caches.get(p.id, graph.remote[p.id])) for p in graph.parameters if p.id in graph.remote]


def _local_tables(graph):
    """The embedding tables this process holds and steps row by row."""
    return [p for p in graph.parameters if p.id in graph.row_stepped and p.id not in graph.remote]


def _meta(executor, run, mark):
    graph = executor.graph
    return {**executor.state.state(),
            "optimizer_steps": {op.name: op.step_count for op in graph.optimizer_ops},
            # the tables' rules (kind and hyperparameters), and which op steps each table: what an
            # export needs to bring a catch-up optimizer's rows to the last step
            "optimizers": {op.name: op.optimizer.rule() for op in graph.optimizer_ops},
            "table_optimizers": {p.name: op.name for op in graph.optimizer_ops
                                 for p, g in zip(op.params, op.inputs[1:]) if getattr(g, "produces_sparse", False)},
            "workers": graph.num_workers, "servers": executor.num_servers(),
            "clocks": {p.name: source.state() for p, source in _on_servers(graph)},
            "tables": {p.name: list(p.shape) for p, _ in _on_servers(graph)},
            "loaders": [op.state() for op in graph.dataloaders],
            "dynamic": [{"name": keys.name, **vars(keys.table)} for keys in graph.dynamic_keys],
            "global_batches": [op.global_batches() for op in graph.dataloaders],
            "mark": mark, "run": run}


def _write_dynamic(graph, folder):
    if graph.dynamic_keys:   # every worker's replica is the same: worker 0's is saved
        np.savez(os.path.join(folder, DYNAMIC), **{f"{i}/{k}": v for i, keys in enumerate(graph.dynamic_keys)
                                                   for k, v in keys.state().items()})


def _set_baseline(executor, mark):
    """Worker 0's record of the save or load just done (mark), which the next delta continues."""
    params = executor.params
    steps = {p.id: np.array(cuda.to_host(params.opt_states[p.id][1]), copy=True)
             for p in _local_tables(executor.graph) if p.id in params.opt_states}
    _baselines[executor] = _Baseline(mark, executor.state.iteration, steps)


def _write(executor, directory, run):
    graph = executor.graph
    tmp = new_folder(directory)
    mark = _new_mark()
    try:
        for p, _ in _on_servers(graph):
            graph.remote[p.id].save(os.path.join(tmp, SERVERS), mark)
        np.savez(os.path.join(tmp, ARRAYS), **executor.params.state())
        _write_dynamic(graph, tmp)
        seal(tmp, _meta(executor, run, mark))
        swap_in(tmp, directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _set_baseline(executor, mark)


def _changed_rows(executor, p, baseline):
    """Rows of local table `p` changed since the baseline: those whose step count moved (an
    update), and in a dynamic table those whose slot was read since (an admission resets a row
    and its step count; its key was read at that step)."""
    params, n = executor.params, p.shape[0]
    changed = np.zeros(n, bool)
    if p.id in params.opt_states:
        steps = cuda.to_host(params.opt_states[p.id][1])
        changed |= steps != baseline.steps.get(p.id, 0)
    for keys in executor.graph.dynamic_keys:
        if p.id in keys.tables:
            state = keys.directory.state()
            changed[np.asarray(state["slots"])[np.asarray(state["last_read"]) >= baseline.iteration]] = True
    return np.flatnonzero(changed)


def _write_delta(executor, directory, run, number):
    graph, params = executor.graph, executor.params
    baseline = _baselines[executor]
    deltas = os.path.join(directory, DELTAS)
    os.makedirs(deltas, exist_ok=True)
    final = os.path.join(deltas, f"{number:06d}")
    tmp = new_folder(final)
    mark = _new_mark()
    try:
        for p, _ in _on_servers(graph):
            graph.remote[p.id].save_delta(os.path.join(tmp, SERVERS), baseline.mark, mark)
        tables = _local_tables(graph)
        rows = {}
        for p in tables:
            at = _changed_rows(executor, p, baseline)
            rows[f"rows/{p.name}"] = at
            rows[f"param/{p.name}"] = cuda.to_host(params.values[p.id][at])
            if p.id in params.opt_states:
                state, steps = params.opt_states[p.id]
                rows[f"optstate/{p.name}"] = cuda.to_host(state[at])
                rows[f"optsteps/{p.name}"] = cuda.to_host(steps[at])
        if rows:
            np.savez(os.path.join(tmp, ROWS), **rows)
        whole = {f"{kind}/{p.name}" for p in tables for kind in ("param", "optstate", "optsteps")}
        np.savez(os.path.join(tmp, ARRAYS), **{k: v for k, v in params.state().items() if k not in whole})
        _write_dynamic(graph, tmp)
        seal(tmp, {**_meta(executor, run, mark), "delta": number, "base": baseline.mark})
        _stop_point("delta-written")
        os.rename(tmp, final)
        _fsync(deltas, folder=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _set_baseline(executor, mark)


def _chain(folder):
    """[(delta folder, its meta)] of the full checkpoint in `folder`, in order, each checked to
    follow the one before (its number and base mark). Interrupted deltas (.tmp-) are not in it."""
    chain, problem = consistent_chain(folder)
    if problem is not None:
        raise ValueError(problem)
    return chain


def consistent_chain(folder):
    """(chain, problem): the deltas of the full checkpoint in `folder` that follow it without a
    break, in order, and None, or the line that says where the chain breaks (a delta missing, one
    following another save, one damaged) when deltas after the break are left out."""
    deltas = os.path.join(folder, DELTAS)
    if not os.path.isdir(deltas):
        return [], None
    names = sorted(e for e in os.listdir(deltas) if re.fullmatch(r"\d{6}", e))
    chain, mark = [], read_meta(folder).get("mark")
    for number, name in enumerate(names, 1):
        path = os.path.join(deltas, name)
        try:
            meta = read_meta(path)
        except ValueError as e:   # damaged (a file gone is a checkpoint being replaced: raised)
            return chain, f"checkpoint {folder}: delta {path} cannot be read ({e})"
        if int(name) != number or meta.get("delta") != number:
            return chain, (f"checkpoint {folder}: delta {path} is number {meta.get('delta')} of the chain, "
                           f"where number {number} belongs (a delta is missing)")
        if meta.get("base") != mark or mark is None:
            return chain, (f"checkpoint {folder}: delta {path} follows the save marked {meta.get('base')}, the "
                           f"one before it is marked {mark}: the chain is broken")
        chain.append((path, meta))
        mark = meta.get("mark")
    return chain, None


def _full_meta(folder):
    if not os.path.exists(os.path.join(folder, ARRAYS)):
        raise FileNotFoundError(f"{folder} is not a hetu checkpoint (no {ARRAYS})")
    return read_meta(folder)


def info(directory):
    """Executor.checkpoint_info: the meta.json of `directory` (of its last delta, if it has
    any), or of the checkpoint before it where a save was interrupted while replacing it
    (locate)."""
    folder, _ = locate(directory)
    full = _full_meta(folder)
    chain = _chain(folder)
    return chain[-1][1] if chain else full


def load(executor, directory):
    """Executor.load: every file and the shape of the run are checked before anything changes;
    a full checkpoint's deltas are applied in order."""
    graph = executor.graph
    directory, _ = locate(directory)
    full = _full_meta(directory)
    chain = _chain(directory)
    meta = chain[-1][1] if chain else full
    # The servers' shards are checked by worker 0, the one that has the servers load them.
    verify(directory, full, only=None if graph.rank == 0 else ARRAYS)
    for path, delta in chain:
        verify(path, delta, only=None if graph.rank == 0 else (ARRAYS, ROWS))
    if executor.state.iteration:
        raise RuntimeError(f"load {directory}: this executor has trained {executor.state.iteration} steps; "
                           f"load a checkpoint into a new one")
    _check_shape(graph, directory, meta)
    arrays = _load_arrays(graph, directory, chain)
    for p, _ in _on_servers(graph):
        if p.name not in meta.get("clocks", {}):
            raise KeyError(f"checkpoint {directory} has no parameter {p.name} on the servers")
    executor.params.check(arrays, f"checkpoint {directory}")
    dynamic = _dynamic_arrays(graph, chain[-1][0] if chain else directory, meta)

    if graph.rank == 0:
        for p, _ in _on_servers(graph):
            graph.remote[p.id].load(os.path.join(directory, SERVERS), full.get("mark", 0))
            for path, delta in chain:
                graph.remote[p.id].load_delta(os.path.join(path, SERVERS), delta["mark"])
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
    if graph.rank == 0 and meta.get("mark"):
        _set_baseline(executor, meta["mark"])


def _load_arrays(graph, directory, chain):
    """The local arrays of the full checkpoint with its deltas applied: each delta's dense
    arrays replace the ones before, its rows are written into the tables'."""
    with np.load(os.path.join(directory, ARRAYS)) as data:
        arrays = {key: data[key] for key in data.files}
    for path, _ in chain:
        with np.load(os.path.join(path, ARRAYS)) as data:
            arrays.update({key: data[key] for key in data.files})
        if not os.path.exists(os.path.join(path, ROWS)):
            continue
        with np.load(os.path.join(path, ROWS)) as data:
            rows = {key: data[key] for key in data.files}
        for p in _local_tables(graph):
            at = rows.get(f"rows/{p.name}")
            if at is None:
                raise KeyError(f"checkpoint delta {path} has no rows of table {p.name}")
            for kind in ("param", "optstate", "optsteps"):
                if f"{kind}/{p.name}" not in rows:
                    continue
                part = rows[f"{kind}/{p.name}"]
                if f"{kind}/{p.name}" not in arrays:   # no optimizer state before this delta
                    arrays[f"{kind}/{p.name}"] = np.zeros((p.shape[0], *part.shape[1:]), part.dtype)
                arrays[f"{kind}/{p.name}"][at] = part
    return arrays


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
    deltas = meta.get("delta", 0)
    chain = f" (a full checkpoint and {deltas} delta{'s' * (deltas != 1)})" if deltas else ""
    return (f"resumed {directory} at step {meta['iteration']}{chain}: written by {meta.get('workers', 1)} worker(s) "
            f"and {meta.get('servers', 0)} server(s), continued by {executor.graph.num_workers} and "
            f"{executor.num_servers()}; every file's sha256 checked"
            + ("" if META_DIGEST in meta else f" ({META} unchecked: written before it recorded its own)")
            + (f", the servers' rows of {tables} table(s) counted as loaded" if tables else ""))
