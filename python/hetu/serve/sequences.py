"""Bundles of the sequential models (SASRec, HSTU; docs/design.md section 17, "Serving").

Export writes the encoder's forward to ONNX: inputs "history" [batch, L] int64 (item indices,
oldest first, left-aligned, -1 padded), "history_rows" [batch, L, d] (the item table's rows of
those items, zeros in the padding) and for HSTU "times" [batch, L] int64 (their timestamps);
output "user" [batch, d], the L2-normalised user vector the history ends with, which training's
validation ranks by. Beside it: the item table (tables/NAME.npy) and the raw id of each item index
(items.npy); a dynamic table's key index and each item's key (item_keys.npy: the hashed key, or
the index of indexed items), through which the catalog's rows are read.

A SequenceBundle answers a raw history ({"history": [raw item ids], "timestamps": [...], "k":
K}) with its top K items: the inner products of the user vector with every L2-normalised item
row, the history's own items left out (as validation ranks), highest first, ties the lower
index first."""
import os

import numpy as np

from . import onnx_graph
from ..data.keys import find_keys
from ..models import sequential
from .bundle import Table, onnx_session
from .checkpoint_rows import to_fp32
from .encode import InstanceError

HISTORY, HISTORY_ROWS, TIMES, USER = "history", "history_rows", "times", "user"
ITEMS = "items.npy"
ITEM_KEYS = "item_keys.npy"
DEFAULT_K = 10
# What a checkpoint's run records of the model's sizes (SequenceConfig's fields of the same names).
CONFIG_FLAGS = ("embedding_size", "blocks", "heads", "dropout", "temperature", "num_negatives", "negatives")


def sequence_bundle(saved, run, where):
    """(the ONNX model, fill(folder) -> the rest of schema.json) of a sequential model's checkpoint
    (hetu.serve.export.export)."""
    import hetu as ht
    from ..data import load_dataset
    from .export import ExportError, MODEL, dynamic_of, write_table
    try:
        data = load_dataset(run["sequence_data"])
    except (KeyError, FileNotFoundError, ValueError) as e:
        raise ExportError(f"{where}: its sequences data {run.get('sequence_data')}: {e}") from None
    kind, meta = run["architecture"], data.meta
    config = sequential.SequenceConfig(num_items=meta.num_items, max_length=meta.max_length,
                                       **{k: run[k] for k in CONFIG_FLAGS if run.get(k) is not None})
    history = ht.placeholder_op(HISTORY, dtype=np.int64)
    times = ht.placeholder_op(TIMES, dtype=np.int64) if kind == "hstu" else None
    user, table = sequential.serving(kind, history, times, config, dynamic_of(saved.meta, where))
    L = config.max_length
    inputs = {onnx_graph.lookups_of(user)[0].id: (HISTORY_ROWS, np.float32, None), history.id: (HISTORY, np.int64, (L,))}
    if times is not None:
        inputs[times.id] = (TIMES, np.int64, (L,))
    try:
        model = onnx_graph.to_model(user, USER, inputs, saved.values, saved.persistent, L)
    except onnx_graph.ExportError as e:
        raise ExportError(f"{where}: {e}") from None

    def fill(folder):
        np.save(os.path.join(folder, ITEMS), np.asarray(data.item_ids, np.int64))
        keyed = {}
        if table.dynamic is not None:
            keys = data.item_keys if data.item_keys is not None else np.arange(meta.num_items, dtype=np.int64)
            np.save(os.path.join(folder, ITEM_KEYS), np.asarray(keys, np.int64))
            keyed = {"item_keys": ITEM_KEYS}
        return {**keyed, "kind": "sequences", "architecture": kind, "max_length": L, "num_items": int(meta.num_items),
                "timestamps": times is not None, "items": ITEMS, "item_table": table.name,
                "columns": [{"name": "history", "kind": "sequence"}]
                + ([{"name": "timestamps", "kind": "sequence"}] if times is not None else []),
                "onnx": {"file": MODEL, "opset": onnx_graph.OPSET, "output": USER,
                         "inputs": [HISTORY, HISTORY_ROWS] + ([TIMES] if times is not None else []),
                         "about": "history: item indices [batch, L], oldest first, -1 padded; history_rows: "
                                  "their rows of the item table, zeros in the padding; times: their timestamps; "
                                  "user: the L2-normalised user vector the history ends with"},
                "tables": {table.name: write_table(folder, table.name, table, saved, run, where)}}
    return model, fill


class SequenceBundle:
    """`name`, `version`, `schema`, `columns`; `predict(instances)` -> one {"items": [raw ids],
    "scores": [...]} per instance (its top K), `user_vectors(history, times)` -> [N, d]."""

    def __init__(self, path, schema, threads=None):
        self.path, self.schema = path, schema
        self.name, self.version = schema["model"], int(schema["version"])
        self.columns = {c["name"]: c["kind"] for c in schema["columns"]}
        self.length, self.timestamps = int(schema["max_length"]), bool(schema["timestamps"])
        name = schema["item_table"]
        table = Table(path, name, schema["tables"][name])
        if table.keys is None:
            self.rows = to_fp32(table.rows, table.storage)
        else:   # a dynamic table: each item's row through its key, zeros where it holds none
            slots = table.rows_of(np.load(os.path.join(path, schema["item_keys"])))
            held = slots >= 0
            self.rows = np.zeros((len(slots), table.rows.shape[1]), np.float32)
            self.rows[held] = to_fp32(table.rows[slots[held]], table.storage)
        norms = np.maximum(np.linalg.norm(self.rows, axis=1, keepdims=True), np.float32(1e-6))
        self.normalized = np.ascontiguousarray(self.rows / norms, np.float32)   # what validation ranks against
        self.item_ids = np.load(os.path.join(path, schema["items"]))
        self._by_raw = np.argsort(self.item_ids, kind="stable")
        self.session = onnx_session(os.path.join(path, schema["onnx"]["file"]), threads)

    def __repr__(self):
        return f"SequenceBundle({self.name!r}, version {self.version}, {self.path})"

    def indices(self, raw, i):
        """Item indices of raw item ids; an id the model has no item for is an InstanceError."""
        raw = np.asarray(raw, np.int64)
        index, found = find_keys(self.item_ids, raw, self._by_raw)
        unknown = np.flatnonzero(~found)
        if len(unknown):
            raise InstanceError(f"instance {i}: column 'history': item {int(raw[unknown[0]])} is not an item of the "
                                f"model")
        return index

    def encode(self, instances):
        """(history [N, L] of item indices, their times [N, L], each instance's K): an instance's last
        L items, oldest first, left-aligned and -1 padded, as training's folders hold them."""
        n, L = len(instances), self.length
        history, times, ks = np.full((n, L), -1, np.int64), np.zeros((n, L), np.int64), []
        for i, instance in enumerate(instances):
            unknown = sorted(set(instance) - {"history", "timestamps", "k"})
            if unknown:
                raise InstanceError(f"instance {i}: unknown column {unknown[0]!r} (a history takes 'history', "
                                    f"'timestamps' and 'k')")
            items = _integers(instance.get("history"), i, "history")
            if not len(items):
                raise InstanceError(f"instance {i}: column 'history': a list of at least one raw item id")
            stamps = instance.get("timestamps")
            if self.timestamps and stamps is None:
                raise InstanceError(f"instance {i}: column 'timestamps': {self.schema['architecture']} reads each "
                                    f"item's timestamp, a list as long as 'history'")
            if stamps is not None:
                stamps = _integers(stamps, i, "timestamps")
                if len(stamps) != len(items):
                    raise InstanceError(f"instance {i}: column 'timestamps': {len(stamps)} timestamps for "
                                        f"{len(items)} items")
                times[i, :min(len(stamps), L)] = stamps[-L:]
            history[i, :min(len(items), L)] = self.indices(items[-L:], i)
            k = instance.get("k", DEFAULT_K)
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(self.item_ids):
                raise InstanceError(f"instance {i}: column 'k': an integer from 1 to {len(self.item_ids)}, not {k!r}")
            ks.append(k)
        return history, times, ks

    def user_vectors(self, history, times=None):
        """The model's user vectors [N, d] of histories of item indices [N, L] (and times)."""
        history = np.ascontiguousarray(history, np.int64)
        rows = np.where((history >= 0)[..., None], self.rows[np.maximum(history, 0)], np.float32(0))
        feed = {HISTORY: history, HISTORY_ROWS: np.ascontiguousarray(rows, np.float32)}
        if self.timestamps:
            feed[TIMES] = np.ascontiguousarray(times, np.int64)
        return self.session.run([USER], feed)[0]

    def top(self, user, history, k):
        """(item indices [N, k], scores [N, k]): the highest inner products, the history's items left out."""
        scores = user @ self.normalized.T
        filled = history >= 0
        scores[np.nonzero(filled)[0], history[filled]] = -np.inf
        k = min(k, scores.shape[1])
        best = np.argpartition(-scores, k - 1, axis=1)[:, :k]
        picked = np.take_along_axis(scores, best, axis=1)
        order = np.lexsort((best, -picked), axis=1)
        best, picked = np.take_along_axis(best, order, axis=1), np.take_along_axis(picked, order, axis=1)
        return best, picked

    def predict(self, instances):
        if len(instances) == 0:
            return []
        history, times, ks = self.encode(instances)
        best, scores = self.top(self.user_vectors(history, times), history, max(ks))
        return [{"items": self.item_ids[best[i, :k]].tolist(),
                 "scores": [float(s) if np.isfinite(s) else None for s in scores[i, :k]]}
                for i, k in enumerate(ks)]


def _integers(values, i, column):
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise InstanceError(f"instance {i}: column {column!r}: a list of integers")
    try:
        return np.asarray(values, np.int64)
    except OverflowError:
        raise InstanceError(f"instance {i}: column {column!r}: a value outside int64") from None
