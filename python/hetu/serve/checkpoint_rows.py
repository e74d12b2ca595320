"""A checkpoint's parameters as arrays, read from its files alone (no servers, no executor): the
local parameters (arrays.npz), the tables the servers saved (ps/NAME.shardK-of-N.bin), each
delta's changes applied in order (its arrays.npz and rows.npz; its servers' ps/NAME.deltaK-of-N.bin,
or a dense table's whole shards), and the dynamic tables' key directories (dynamic.npz).

The servers' files (ps-lite/src/table.cc): a shard is a header (FileHeader, magic HETUPS03), then
its rows lo, lo + stride, ... below hi in the table's storage type, then optimizer state, step
counts and versions; or, saved by a disk tier that cloned its row file (RecordsHeader, HETUPR01),
a header, the records' written bits and, from `records_at`, a record per row (the row, its state,
step and version, and a check), a row never written being the initializer's; a delta is a header (DeltaHeader, HETUPD01), then the changed rows' ids
(int64), their values, state and counts."""
import glob
import os
import re

import numpy as np

from .. import checkpoint

STORAGE_TYPES = ("fp32", "bf16", "fp16")   # hetu::storage::Type, by code (hetu._C.STORAGE_TYPES)
STORED_AS = {"fp32": np.float32, "bf16": np.uint16, "fp16": np.float16}   # bf16: its 16 bits

SHARD_HEADER = np.dtype([("magic", "S8")] + [(k, "<i8") for k in (
    "rows", "width", "dense", "lo", "hi", "optim_kind", "unit_state_width", "applied", "placement", "stride",
    "storage")])
DELTA_HEADER = np.dtype([("magic", "S8")] + [(k, "<i8") for k in (
    "rows", "width", "optim_kind", "unit_state_width", "storage", "applied", "count", "counter_bytes", "base")])
RECORDS_HEADER = np.dtype(SHARD_HEADER.descr + [("record_bytes", "<i8"), ("records_at", "<i8"), (
    "init_kind", "<i8"), ("init_a", "<f8"), ("init_b", "<f8"), ("seed", "<u8"), ("stream", "<u8")])
SHARD_MAGIC, DELTA_MAGIC, RECORDS_MAGIC = b"HETUPS03", b"HETUPD01", b"HETUPR01"


def to_fp32(rows, storage):
    """fp32 rows of `rows` stored as `storage` (bf16: the upper half of an fp32)."""
    if storage == "bf16":
        return (np.asarray(rows, np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.asarray(rows, np.float32)


def sanitized(name):
    """A table's file name stem, as the servers write it (Sanitize in table.cc)."""
    return re.sub(r"[^A-Za-z0-9_.\-]", "_", name)


def _files(folder, name, kind):
    """{k: path} of NAME.<kind>K-of-N.bin in folder, all of one N."""
    pattern = re.compile(re.escape(sanitized(name)) + kind + r"(\d+)-of-(\d+)\.bin")
    found = {}
    for path in glob.glob(os.path.join(glob.escape(folder), sanitized(name) + kind + "*.bin")):
        m = pattern.fullmatch(os.path.basename(path))
        if m:
            found.setdefault(int(m.group(2)), {})[int(m.group(1))] = path
    if len(found) > 1:
        raise ValueError(f"{folder}: table {name} has shards of {sorted(found)} servers")
    if not found:
        return {}
    (count, files), = found.items()
    if sorted(files) != list(range(count)):
        raise ValueError(f"{folder}: table {name} is missing shards {sorted(set(range(count)) - set(files))} of {count}")
    return files


def read_shards(folder, name, with_state=False):
    """(rows [rows, width] in the storage type, storage name) of a table's full shards; with_state,
    then (optimizer state [rows, state width] float32, step counts [rows] int64)."""
    table, storage, state, steps = None, None, None, None
    for k, path in sorted(_files(folder, name, ".shard").items()):
        header = np.fromfile(path, SHARD_HEADER, count=1)
        records = len(header) == 1 and header["magic"][0] == RECORDS_MAGIC
        if len(header) != 1 or header["magic"][0] not in (SHARD_MAGIC, RECORDS_MAGIC):
            raise ValueError(f"{path} is not a saved shard of this version (magic {SHARD_MAGIC.decode()} or "
                             f"{RECORDS_MAGIC.decode()})")
        if records:
            header = np.fromfile(path, RECORDS_HEADER, count=1)
        h = {key: header[key][0].item() for key in header.dtype.names[1:]}
        storage = STORAGE_TYPES[h["storage"]]
        if table is None:
            table = np.zeros((h["rows"], h["width"]), STORED_AS[storage])
            if with_state:
                state = np.zeros((h["rows"], h["unit_state_width"]), np.float32)
                steps = np.zeros(h["rows"], np.int64)
        at = np.arange(h["lo"], h["hi"], h["stride"])
        read = _read_records if records else _read_sections
        values, saved_state, saved_steps = read(path, h, at, table.dtype, storage, with_state)
        table[at] = values
        if with_state:
            state[at], steps[at] = saved_state, saved_steps
    if table is None:
        raise ValueError(f"{folder}: no saved shard of table {name}")
    if with_state:
        return table, storage, state, steps
    return table, storage


def _read_sections(path, h, at, dtype, storage, with_state):
    """(values, state, steps) of the rows `at` of a HETUPS03 shard (state, steps: with_state)."""
    values = np.fromfile(path, dtype, count=len(at) * h["width"], offset=SHARD_HEADER.itemsize)
    if values.size != len(at) * h["width"]:
        raise ValueError(f"{path} is truncated: {values.size} of {len(at) * h['width']} values")
    if not with_state:
        return values.reshape(len(at), h["width"]), None, None
    sw = h["unit_state_width"]
    offset = SHARD_HEADER.itemsize + values.nbytes
    state = np.fromfile(path, np.float32, count=len(at) * sw, offset=offset)
    steps = np.fromfile(path, np.int64, count=len(at), offset=offset + state.nbytes)
    if state.size != len(at) * sw or steps.size != len(at):
        raise ValueError(f"{path} is truncated: its optimizer state or step counts are missing")
    return values.reshape(len(at), h["width"]), state.reshape(len(at), sw), steps


def _read_records(path, h, at, dtype, storage, with_state):
    """(values, state, steps) of the rows `at` of a HETUPR01 shard: its records, and the rows never
    written drawn by the saved initializer and rounded to the storage type, as the tier draws them."""
    from .. import _C
    n, width, sw = len(at), h["width"], h["unit_state_width"]
    row_bytes = width * np.dtype(dtype).itemsize
    if h["record_bytes"] != row_bytes + sw * 4 + 24:
        raise ValueError(f"{path} has a damaged header: records of {h['record_bytes']} bytes")
    words = np.fromfile(path, "<u8", count=(n + 63) // 64, offset=RECORDS_HEADER.itemsize)
    written = np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)
    raw = np.fromfile(path, np.uint8, count=n * h["record_bytes"], offset=h["records_at"])
    if raw.size != n * h["record_bytes"] or written.size != n:
        raise ValueError(f"{path} is truncated: {raw.size} of {n * h['record_bytes']} bytes of records")
    raw = raw.reshape(n, h["record_bytes"])
    values = raw[:, :row_bytes].copy().view(dtype)
    drawn = np.empty((int((~written).sum()), width), np.float32)
    _C.init_fill_rows(h["init_kind"], h["init_a"], h["init_b"], h["seed"], h["stream"],
                      at[~written].astype(np.int64), drawn)
    _C.round_to_storage(drawn, STORAGE_TYPES.index(storage))
    values[~written] = (drawn.view(np.uint32) >> 16).astype(np.uint16) if storage == "bf16" else drawn.astype(dtype)
    if not with_state:
        return values, None, None
    state = raw[:, row_bytes:row_bytes + sw * 4].copy().view(np.float32)
    steps = raw[:, row_bytes + sw * 4:row_bytes + sw * 4 + 8].copy().view(np.int64).ravel()
    state[~written], steps[~written] = 0, 0
    return values, state, steps


def apply_delta(folder, name, table, state=None):
    """Writes a delta's rows of table `name` (its .delta files, or a dense table's whole .shard
    files) into `table`, and with `state` (optimizer state, step counts) theirs into it; returns
    the table (a new array when the shards replace it)."""
    if _files(folder, name, ".shard"):
        if state is None:
            return read_shards(folder, name)[0]
        table, _, state[0], state[1] = read_shards(folder, name, with_state=True)
        return table
    for k, path in sorted(_files(folder, name, ".delta").items()):
        header = np.fromfile(path, DELTA_HEADER, count=1)
        if len(header) != 1 or header["magic"][0] != DELTA_MAGIC:
            raise ValueError(f"{path} is not a saved delta of this version (magic {DELTA_MAGIC.decode()})")
        count, width = int(header["count"][0]), int(header["width"][0])
        ids = np.fromfile(path, np.int64, count=count, offset=DELTA_HEADER.itemsize)
        values = np.fromfile(path, table.dtype, count=count * width, offset=DELTA_HEADER.itemsize + 8 * count)
        if len(ids) != count or values.size != count * width:
            raise ValueError(f"{path} is truncated")
        table[ids] = values.reshape(count, width)
        if state is not None:
            sw, cb = int(header["unit_state_width"][0]), int(header["counter_bytes"][0])
            offset = DELTA_HEADER.itemsize + 8 * count + values.nbytes
            saved_state = np.fromfile(path, np.float32, count=count * sw, offset=offset)
            saved_steps = np.fromfile(path, np.int64 if cb == 8 else np.int32, count=count,
                                      offset=offset + saved_state.nbytes)
            if saved_state.size != count * sw or saved_steps.size != count:
                raise ValueError(f"{path} is truncated")
            state[0][ids], state[1][ids] = saved_state.reshape(count, sw), saved_steps
    return table


def catch_up_rule(meta):
    """name -> (OptimConfig, steps taken) of each table a catch-up optimizer steps (hetu.optim:
    adam_catchup), from the checkpoint's meta.json; empty for other optimizers and for
    checkpoints that do not record their rules."""
    from .. import optim
    out = {}
    rules, steps = meta.get("optimizers", {}), meta.get("optimizer_steps", {})
    for table, op in meta.get("table_optimizers", {}).items():
        rule = dict(rules.get(op, {}))
        kind = rule.pop("kind", None)
        if kind is None or not optim.KINDS[kind]["catches_up"]:
            continue
        config = optim.config(kind, **{k: v for k, v in rule.items() if k in optim.KINDS[kind]["hyperparameters"]})
        out[table] = (config, int(steps[op]))
    return out


class CheckpointChanged(RuntimeError):
    """The checkpoint was replaced (a newer full save swapped in) while it was read."""


class CheckpointRows:
    """Everything of a checkpoint that a prediction reads: `meta` (its last save's meta.json),
    `values` (name -> array: fp32 for local parameters, the storage type for the servers'
    tables), `storage` (name -> storage type of the servers' tables), `persistent` (running
    statistics) and `dynamic` (per key directory: (resident keys ascending, their slots))."""

    def __init__(self, directory, consistent=False):
        """`consistent`: where the chain of deltas breaks, read it up to the break (`broken` says
        where) rather than fail."""
        folder, _ = checkpoint.locate(directory)
        full = checkpoint.read_meta(folder)
        if not os.path.exists(os.path.join(folder, checkpoint.ARRAYS)):
            raise FileNotFoundError(f"{folder} is not a hetu checkpoint (no {checkpoint.ARRAYS})")
        checkpoint.verify(folder, full)
        chain, self.broken = checkpoint.consistent_chain(folder)
        if self.broken is not None and not consistent:
            raise ValueError(self.broken)
        for path, meta in chain:
            checkpoint.verify(path, meta)
        self.folder, self.meta = folder, chain[-1][1] if chain else full
        self.deltas = len(chain)
        arrays = self._local_arrays(folder, chain)
        self.values = {k[len("param/"):]: v for k, v in arrays.items() if k.startswith("param/")}
        self.persistent = {k[len("persistent/"):]: v for k, v in arrays.items() if k.startswith("persistent/")}
        # A catch-up optimizer's tables: (config, steps taken) and their optimizer state and
        # step counts (name -> [state, steps]), so that export brings every row to that step.
        self.catch_up = catch_up_rule(self.meta)
        self.state = {}
        self.storage = {}
        for name in self.meta.get("tables", {}):
            stated = self.catch_up.get(name) is not None
            table, self.storage[name], *state = read_shards(os.path.join(folder, checkpoint.SERVERS), name,
                                                            with_state=stated)
            for path, _ in chain:
                table = apply_delta(os.path.join(path, checkpoint.SERVERS), name, table, state if stated else None)
            self.values[name] = table
            if stated:
                self.state[name] = state
        for name in self.catch_up:
            if name not in self.state and f"optstate/{name}" in arrays:   # a table the process held
                self.state[name] = [arrays[f"optstate/{name}"], arrays[f"optsteps/{name}"]]
        for name, (config, steps_taken) in self.catch_up.items():
            self.values[name] = self._caught_up(name, config, steps_taken)
        self.dynamic = self._key_directories(chain[-1][0] if chain else folder)
        # A job may swap a new full checkpoint in while its files are read here (the checksums
        # above were of the files before it): the save read must still be the one in place.
        try:
            unchanged = checkpoint.read_meta(folder) == full
        except (OSError, ValueError):
            unchanged = False
        if not unchanged:
            raise CheckpointChanged(f"{folder} was replaced by a newer save while it was read")

    def _caught_up(self, name, config, steps_taken):
        """Table `name`'s rows, each brought to the steps taken (hetu._C.catch_up_rows), in the
        type they are stored in: what training's reads and --save-params see."""
        from .. import _C
        if name not in self.state:
            raise KeyError(f"{self.folder}: table {name} is stepped by a catch-up optimizer and the checkpoint "
                           f"holds no optimizer state for it")
        stored, storage = self.values[name], self.storage.get(name, "fp32")
        rows = np.array(to_fp32(stored, storage), np.float32)
        # each skipped step rounds to the type the rows are stepped in: a local table's fp32 rows
        # are rounded to the run's embedding type
        stepped_as = storage if name in self.storage else (self.meta.get("run") or {}).get("embedding_dtype") or "fp32"
        config.storage = STORAGE_TYPES.index(stepped_as)
        state, steps = (np.ascontiguousarray(a) for a in self.state[name])
        _C.catch_up_rows(config, rows, state.reshape(-1), steps.astype(np.int64), np.arange(len(rows)), steps_taken)
        if storage == "bf16":
            return (rows.view(np.uint32) >> 16).astype(np.uint16)   # exact: the rule rounds to bf16
        return rows.astype(stored.dtype)

    @staticmethod
    def _local_arrays(folder, chain):
        with np.load(os.path.join(folder, checkpoint.ARRAYS)) as data:
            arrays = {key: data[key] for key in data.files}
        for path, _ in chain:
            with np.load(os.path.join(path, checkpoint.ARRAYS)) as data:
                arrays.update({key: data[key] for key in data.files})
            rows_file = os.path.join(path, checkpoint.ROWS)
            if os.path.exists(rows_file):
                with np.load(rows_file) as rows:
                    for key in rows.files:
                        if key.startswith("rows/"):
                            name = key[len("rows/"):]
                            for kind in ("param", "optstate", "optsteps"):   # a catch-up export reads the state
                                if f"{kind}/{name}" in rows.files and f"{kind}/{name}" in arrays:
                                    arrays[f"{kind}/{name}"][rows[key]] = rows[f"{kind}/{name}"]
        return arrays

    def _key_directories(self, folder):
        saved = self.meta.get("dynamic", [])
        if not saved:
            return []
        out = []
        with np.load(os.path.join(folder, checkpoint.DYNAMIC)) as data:
            for i in range(len(saved)):
                keys, slots = data[f"{i}/directory/keys"], data[f"{i}/directory/slots"]
                resident = slots >= 0
                order = np.argsort(keys[resident], kind="stable")
                out.append((keys[resident][order].astype(np.int64), slots[resident][order].astype(np.int64)))
        return out
