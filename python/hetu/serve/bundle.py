"""A bundle opened for predictions (hetu.serve.export writes it): raw instances are encoded as
training encoded them (hetu.serve.encode), each embedding lookup's rows read from the
memory-mapped tables (a dynamic table through its key index: a key not resident reads zeros,
as training's lookup of slot -1 does) and pooled by hetu's own kernels, and the dense part run
in ONNX Runtime. Opening is cheap (the tables are mapped, not read) and a Bundle may be called
from several threads at once (it holds no per-call state)."""
import json
import os

import numpy as np

from ..data.keys import find_keys
from ..data.store import BAG_PADDING
from ..ops.embedding import Bags, gather_slots
from .checkpoint_rows import STORED_AS, to_fp32
from .encode import InstanceEncoder, InstanceError, Vocabulary
from .export import MODEL, SCHEMA, VOCABULARY

__all__ = ["Bundle", "InstanceError", "BundleError"]


class BundleError(ValueError):
    """A folder that is not a readable bundle; the message names it."""


def read_schema(path):
    try:
        with open(os.path.join(path, SCHEMA)) as f:
            return json.load(f)
    except FileNotFoundError:
        raise BundleError(f"{path} is not a bundle (no {SCHEMA}): write one with python -m hetu.serve export") from None
    except json.JSONDecodeError as e:
        raise BundleError(f"{os.path.join(path, SCHEMA)} is not valid JSON ({e})") from None


def onnx_session(model_file, threads=None):
    """An ONNX Runtime session on the CPU; `threads` its threads per run (default: one per core)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.log_severity_level = 3
    # Threads that spin between runs take the cores other requests need: at batch 64 on 2 cores
    # the 99th percentile of a run falls from about 4 ms to 0.2 ms without spinning.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if threads:
        options.intra_op_num_threads = int(threads)
    return ort.InferenceSession(model_file, options, providers=["CPUExecutionProvider"])


class Table:
    """A table's rows, memory-mapped in their storage type, and a dynamic table's key index."""

    def __init__(self, folder, name, info):
        self.name, self.storage = name, info["storage"]
        self.rows = np.load(os.path.join(folder, info["file"]), mmap_mode="r")
        if self.rows.dtype != STORED_AS[self.storage]:
            raise BundleError(f"{folder}: table {name} holds {self.rows.dtype}, its schema says {self.storage}")
        self.keys = self.slots = None
        if "keys" in info:
            self.keys = np.load(os.path.join(folder, info["keys"]), mmap_mode="r")
            self.slots = np.load(os.path.join(folder, info["slots"]), mmap_mode="r")

    def rows_of(self, ids):
        """Row numbers of `ids` (a dynamic table's keys: their slots, -1 where not resident)."""
        if self.keys is None:
            return ids
        at, found = find_keys(self.keys, ids)
        return np.where(found, self.slots[at] if len(self.slots) else -1, -1).astype(np.int64)

    def distinct(self, rows):
        """(fp32 rows of the distinct row numbers >= 0 of `rows`, each entry's position among them, -1
        where there is none)."""
        filled = rows >= 0
        uniq, inverse = np.unique(rows[filled], return_inverse=True)
        if len(uniq) and (uniq[-1] >= len(self.rows)):
            raise IndexError(f"table {self.name}: id {int(uniq[-1])} outside its {len(self.rows)} rows")
        positions = np.full(rows.shape, -1, np.int64)
        positions[filled] = inverse.reshape(-1)
        return np.ascontiguousarray(to_fp32(self.rows[uniq], self.storage)), positions


class Bundle:
    """`name` (the model), `version`, `schema` (schema.json), `columns` ({raw column: its kind,
    dense, categorical or bag}, the columns an instance must have); `predict(instances)` and
    `predict_arrays(dense, sparse)` -> float32 probabilities [N]."""

    def __init__(self, path, threads=None, schema=None):
        self.path = os.path.abspath(path)
        self.schema = read_schema(self.path) if schema is None else schema
        self.name, self.version = self.schema["model"], int(self.schema["version"])
        self.columns = {c["name"]: c["kind"] for c in self.schema["columns"]}
        self.tables = {name: Table(self.path, name, info) for name, info in self.schema["tables"].items()}
        self.inputs = [(x["name"], self.tables[x["table"]],
                        None if x["bags"] is None else Bags(x["bags"]["slots"], x["bags"]["mode"]))
                       for x in self.schema["onnx"]["inputs"]]
        vocabulary = None
        if os.path.exists(os.path.join(self.path, VOCABULARY)):
            with np.load(os.path.join(self.path, VOCABULARY)) as data:
                vocabulary = Vocabulary({k: data[k] for k in data.files})
        self.encoder = InstanceEncoder(self.schema, vocabulary)
        self.session = onnx_session(os.path.join(self.path, MODEL), threads)
        self.num_slots = int(sum(f["slots"] for f in self.schema["fields"]))
        # Each slot's raw column (a field no column fills: "field K"), for counting unknown ids.
        named = {int(c["field"]): c["name"] for c in self.schema["columns"] if c["kind"] != "dense"}
        self.field_names = [named.get(k, f"field {k}") for k in range(len(self.schema["fields"]))]
        self.slot_fields = np.repeat(np.arange(len(self.field_names)), [f["slots"] for f in self.schema["fields"]])

    @classmethod
    def open(cls, path, threads=None):
        """The bundle at `path`: a Bundle, or a sequential model's hetu.serve.sequences.SequenceBundle.
        `threads`: ONNX Runtime's threads per run (default: its own, one per core)."""
        path = os.path.abspath(path)
        schema = read_schema(path)
        if schema.get("kind") == "sequences":
            from .sequences import SequenceBundle
            return SequenceBundle(path, schema, threads)
        return cls(path, threads, schema)

    def __repr__(self):
        return f"Bundle({self.name!r}, version {self.version}, {self.path})"

    counts_unknown = True   # predict takes `unknown` (the batcher's test of a bundle)

    def predict(self, instances, unknown=None):
        """Probabilities of raw instances (dicts of raw columns); a bad one raises InstanceError.
        `unknown`: a Counter into which the ids the model never saw are counted, per (raw column,
        where: "vocabulary" for a value outside an indexed field's vocabulary, which reads its
        bucket 0, or a dynamic table's name for a key not resident in it, which reads zeros)."""
        if len(instances) == 0:
            return np.zeros(0, np.float32)
        dense, sparse = self.encoder.encode(instances, unknown)
        return self.predict_arrays(dense, sparse, unknown)

    def predict_arrays(self, dense, sparse, unknown=None):
        """Probabilities of samples already encoded as training reads them: dense float32 [N, D]
        (None without dense features) and ids int64 [N, slots]; `unknown` as predict's."""
        sparse = np.ascontiguousarray(sparse, np.int64)
        if sparse.ndim != 2 or sparse.shape[1] != self.num_slots:
            raise ValueError(f"ids of shape {sparse.shape}: the model reads [N, {self.num_slots}]")
        feed = {}
        if self.schema["num_dense"]:
            feed["dense"] = np.ascontiguousarray(dense, np.float32).reshape(len(sparse), self.schema["num_dense"])
        counted = set()
        for name, table, bags in self.inputs:
            slots = table.rows_of(sparse)
            if unknown is not None and table.keys is not None and table.name not in counted:
                counted.add(table.name)
                self.count_unknown(unknown, table.name, (slots < 0) & (sparse != BAG_PADDING))
            rows, positions = table.distinct(slots)
            width = table.rows.shape[1]
            if bags is not None:
                out = np.empty(bags.out_shape(sparse.shape, width), np.float32)
                bags.pool(name, rows, positions, out)
            else:
                out = np.empty(sparse.shape + (width,), np.float32)
                gather_slots(name, rows, positions, out)
            feed[name] = out
        return self.session.run(["probability"], feed)[0]

    def count_unknown(self, unknown, where, missing):
        """`missing` (bool [N, slots]) counted into `unknown` per (raw column, where)."""
        per_slot = np.count_nonzero(missing, axis=0)
        if not per_slot.any():
            return
        per_field = np.bincount(self.slot_fields, weights=per_slot, minlength=len(self.field_names))
        for field in np.flatnonzero(per_field):
            unknown[self.field_names[field], where] += int(per_field[field])
