"""Loading a dataset folder for training: memory-mapped arrays split into train and val views."""
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import sequences, store
from .cache import data_home, ensure_movielens_sequences, ensure_synthetic, ensure_synthetic_sequences
from .schema import Fields
from .synthetic import parse_synthetic_name

PREPARED_NAMES = ("criteo", "avazu", "movielens")


HASHED_REFUSAL = ("the data was prepared with --ids hashed (keys, not table rows): training on it "
                  "needs dynamic tables: give --table-capacity ROWS")


class BadBatch(ValueError):
    """A batch holds an entry its dataset cannot have (DatasetPart.checker): the message names the
    file, row, column and value, which is all a user needs; no traceback adds to it."""


@dataclass(frozen=True)
class DatasetMeta:
    name: str
    num_rows: int
    num_dense: int
    num_fields: int
    field_names: tuple
    field_sizes: tuple
    field_offsets: tuple
    num_embeddings: int
    train_rows: int
    val_rows: int
    info: dict  # the whole meta.json
    field_slots: tuple = None  # sparse.npy columns of each field; None: one each
    bag_fields: tuple = ()     # names of the multi-hot fields (ids left-aligned, -1 padded)
    ids: str = "indexed"       # or "hashed": sparse.npy holds keys (keys.py), no vocabulary

    def __post_init__(self):
        if self.field_slots is None:
            object.__setattr__(self, "field_slots", (1,) * self.num_fields)

    @classmethod
    def from_dict(cls, meta):
        slots = meta.get("field_slots")
        return cls(
            name=meta["name"], num_rows=meta["num_rows"], num_dense=meta["num_dense"],
            num_fields=meta["num_fields"], field_names=tuple(meta["field_names"]),
            field_sizes=tuple(meta["field_sizes"]), field_offsets=tuple(meta["field_offsets"]),
            num_embeddings=meta["num_embeddings"], train_rows=meta["split"]["train_rows"],
            val_rows=meta["split"]["val_rows"], info=meta,
            field_slots=None if slots is None else tuple(slots),
            bag_fields=tuple(meta.get("bag_fields", ())), ids=meta.get("ids", "indexed"))

    def fields_for(self, dynamic=None):
        """``fields``, read through dynamic tables (hetu.dynamic.DynamicTable) if given: of their
        capacity, keyed by the ids, hashed or not."""
        if dynamic is None:
            return self.fields
        return Fields.from_meta(self).with_dynamic(dynamic)

    @property
    def fields(self):
        """What a model reads of this dataset (hetu.data.Fields). Hashed ids have no table
        rows to size a model by: a ValueError says so."""
        if self.ids == "hashed":
            raise ValueError(HASHED_REFUSAL)
        return Fields.from_meta(self)

    @property
    def slot_offsets(self):
        """Column start of each field in sparse.npy, plus the end (``num_slots``)."""
        return store.slot_offsets(self.field_slots)

    @property
    def num_slots(self):
        return sum(self.field_slots)

    def column_fields(self):
        """The field of each sparse.npy column."""
        return np.repeat(np.arange(self.num_fields), self.field_slots)

    def bag_columns(self):
        """True for each sparse.npy column that belongs to a bag field."""
        is_bag = np.isin(np.asarray(self.field_names, dtype=object), list(self.bag_fields))
        return np.repeat(is_bag, self.field_slots)


class DatasetPart:
    """Rows of one split. ``dense`` is None for datasets without dense features. ``path`` and
    ``first_row`` (this part's first row in the folder's files) name a bad value's place."""

    def __init__(self, dense, sparse, labels, meta, path=None, first_row=0):
        self.dense = dense if dense is not None and dense.shape[1] > 0 else None
        self.sparse = sparse
        self.labels = labels
        self.meta = meta
        self.path = path
        self.first_row = first_row

    def __len__(self):
        return len(self.labels)

    def slice(self, start, stop):
        dense = None if self.dense is None else self.dense[start:stop]
        return DatasetPart(dense, self.sparse[start:stop], self.labels[start:stop], self.meta, self.path,
                           self.first_row + start)

    def bag(self, field_name):
        """(values int64, offsets int64 [n + 1]) of one field over this part: sample i's ids are
        ``values[offsets[i]:offsets[i + 1]]``, a bag's padding dropped (a single-id field gives
        bags of one). The layout of nn.EmbeddingBag's input and offsets."""
        meta = self.meta
        if field_name not in meta.field_names:
            raise KeyError(f"no field {field_name!r}; fields: {list(meta.field_names)}")
        field = meta.field_names.index(field_name)
        start, stop = meta.slot_offsets[field:field + 2]
        slots = np.asarray(self.sparse[:, start:stop])
        present = slots != store.BAG_PADDING
        offsets = np.zeros(len(slots) + 1, dtype=np.int64)
        np.cumsum(present.sum(axis=1), out=offsets[1:])
        # row-major selection keeps each sample's ids together and in slot order
        return slots[present].astype(np.int64, copy=False), offsets

    def checker(self, kind):
        """A check for ht.Dataloader(check=...) on this part's `kind` array ('dense', 'sparse' or
        'labels'): it raises ValueError naming the file, row, column and value of the first bad
        entry of a batch (a feature or label that is not finite, a label outside the dataset's
        label values, an id outside its field's rows, a bag's padding (-1) before one of its
        ids). The files are too large to scan when loaded; each batch is checked as it is read,
        for a few microseconds."""
        meta = self.meta

        def describe(value, column):   # what a bad entry is; the sparse check says more
            return wanted

        if kind == "sparse":
            column_field = meta.column_fields()
            low = np.asarray(meta.field_offsets, np.int64)[column_field]
            high = low + np.asarray(meta.field_sizes, np.int64)[column_field]
            bag_column = meta.bag_columns()
            # a bag column after the field's first slot: padding in the slot before it must go on
            follows_slot = bag_column & (np.arange(meta.num_slots) != np.asarray(
                meta.slot_offsets[:-1])[column_field])
            names = [meta.field_names[f] + (f" slot {c - meta.slot_offsets[f]}"
                                            if meta.field_slots[f] > 1 else "")
                     for c, f in enumerate(column_field)]
            wanted = "an id outside its field's rows"
            hashed = meta.ids == "hashed"   # every key is good but the padding

            def bad_entries(batch):
                padding = (batch == store.BAG_PADDING) & bag_column
                outside = (batch == store.BAG_PADDING) if hashed else (batch < low) | (batch >= high)
                bad = outside & ~padding
                if follows_slot.any():
                    bad[:, 1:] |= padding[:, :-1] & ~padding[:, 1:] & follows_slot[1:]
                return bad

            def describe(value, c):
                f = column_field[c]
                if hashed and value == store.BAG_PADDING and not bag_column[c]:
                    return f"the padding ({store.BAG_PADDING}) in field {f}, which is no bag"
                if hashed or low[c] <= value < high[c]:
                    return f"an id after its bag's padding ({store.BAG_PADDING}), " \
                           f"field {f} keeps its ids left-aligned"
                padding = f" or {store.BAG_PADDING} after the bag's ids" if bag_column[c] else ""
                return f"{wanted}, field {f} holds ids [{low[c]}, {high[c]}){padding}"
        elif kind == "dense":
            names, wanted = meta.info.get("dense_names") or (), "a feature that is not finite"

            def bad_entries(batch):
                return ~np.isfinite(batch)
        elif kind == "labels":
            values = meta.info.get("label", {}).get("values")
            names = ("label",)
            wanted = "a label that is not " + (f"one of {values}" if values else "finite")

            def bad_entries(batch):
                return ~np.isin(batch, values) if values else ~np.isfinite(batch)
        else:
            raise ValueError(f"no {kind!r} array; a dataset part has 'dense', 'sparse' and 'labels'")
        where = f"{self.path}/{kind}.npy" if self.path is not None else f"the {kind} array"

        def check(batch, rows):
            bad = bad_entries(batch)
            if bad.any():
                r, c = (int(i) for i in np.argwhere(bad)[0])
                name = f" ({names[c]})" if c < len(names) else ""
                value = batch[r, c].item()
                raise BadBatch(f"{where}, row {self.first_row + int(rows[r])}, column {c}{name}: "
                               f"{value!r} is {describe(value, c)}")
        return check

    def batches(self, batch_size, drop_last=False):
        """(dense or None, sparse, labels) views of consecutive batches."""
        end = len(self) - (len(self) % batch_size if drop_last else 0)
        for start in range(0, end, batch_size):
            part = self.slice(start, min(start + batch_size, end))
            yield part.dense, part.sparse, part.labels


class Dataset:
    def __init__(self, path, mmap=True):
        self.path = Path(path)
        self.meta = read_dataset_meta(self.path)
        dense, sparse, labels = store.load_arrays(self.path, mmap=mmap)
        check_arrays(self.path, self.meta, dense, sparse, labels)
        cut = self.meta.train_rows
        self.train = DatasetPart(dense[:cut], sparse[:cut], labels[:cut], self.meta, self.path)
        self.val = DatasetPart(dense[cut:], sparse[cut:], labels[cut:], self.meta, self.path, cut)

    def __repr__(self):
        m = self.meta
        return (f"Dataset({m.name!r}, path={str(self.path)!r}, train={len(self.train)}, "
                f"val={len(self.val)}, fields={m.num_fields}, dense={m.num_dense}, "
                f"num_embeddings={m.num_embeddings})")


def read_dataset_meta(path):
    """The folder's meta.json, checked: it parses, has every key, and its fields' id ranges lie
    within num_embeddings (the batches' ids are checked against those ranges as they are read,
    so no id reaches a table row it does not have)."""
    where = path / store.META_FILE
    try:
        raw = store.read_meta(path)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{where} is not valid JSON ({e})") from None
    try:
        meta = DatasetMeta.from_dict(raw)
    except (KeyError, TypeError) as e:
        missing = f"has no key {e}" if isinstance(e, KeyError) else f"is malformed ({e})"
        raise ValueError(f"{where} {missing}") from None
    sizes, offsets = np.asarray(meta.field_sizes, np.int64), np.asarray(meta.field_offsets, np.int64)
    if len(sizes) != meta.num_fields or len(offsets) != meta.num_fields:
        raise ValueError(f"{where}: num_fields is {meta.num_fields}, but it lists {len(sizes)} field_sizes "
                         f"and {len(offsets)} field_offsets")
    ends = offsets + sizes
    if len(ends) and (ends.max() > meta.num_embeddings or offsets.min() < 0):
        f = int(ends.argmax()) if ends.max() > meta.num_embeddings else int(offsets.argmin())
        raise ValueError(f"{where}: field {f} ({meta.field_names[f] if f < len(meta.field_names) else '?'}) "
                         f"holds ids [{offsets[f]}, {ends[f]}), outside num_embeddings {meta.num_embeddings}")
    if len(meta.field_slots) != meta.num_fields or min(meta.field_slots, default=1) < 1:
        raise ValueError(f"{where}: field_slots must list a positive slot count for each of the "
                         f"{meta.num_fields} fields, found {list(meta.field_slots)}")
    unknown = sorted(set(meta.bag_fields) - set(meta.field_names))
    if unknown:
        raise ValueError(f"{where}: bag_fields names {unknown}, which are not fields")
    return meta


def check_arrays(path, meta, dense, sparse, labels):
    expected = {"dense": ((meta.num_rows, meta.num_dense), np.float32),
                "sparse": ((meta.num_rows, meta.num_slots), np.int64),
                "labels": ((meta.num_rows, 1), np.float32)}
    for name, array in (("dense", dense), ("sparse", sparse), ("labels", labels)):
        shape, dtype = expected[name]
        if array.shape != shape or array.dtype != dtype:
            raise ValueError(f"{path}/{name}.npy is {array.dtype}{list(array.shape)}, "
                             f"meta.json says {np.dtype(dtype)}{list(shape)}")


def resolve_dataset_dir(name_or_dir, **synthetic_params):
    """Folder for a dataset path, a synthetic name (``synthetic`` = ``synthetic-criteo``,
    ``synthetic-avazu``, ``synthetic-movielens``, ``synthetic-criteo-multihot``, each also with
    sessions: ``-sessions``, e.g. ``synthetic-criteo-sessions``), or a prepared name under
    $HETU_DATA_HOME. User histories (sequences.py): ``synthetic-sequences`` (generated on first
    use) and ``movielens-sequences`` (cache.ensure_movielens_sequences)."""
    name = str(name_or_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / store.META_FILE).is_file():
            raise FileNotFoundError(f"{path} is not a complete dataset folder (no meta.json)")
        return path
    if name == sequences.SYNTHETIC_NAME:
        return ensure_synthetic_sequences(**synthetic_params)
    if name == sequences.MOVIELENS_NAME and not synthetic_params:
        return ensure_movielens_sequences()
    if name == "synthetic" or name.startswith("synthetic-"):
        shape, sessions = parse_synthetic_name(name)
        if sessions:
            synthetic_params = {"sessions": True, **synthetic_params}
        return ensure_synthetic(shape, **synthetic_params)
    if synthetic_params:
        raise TypeError(f"synthetic parameters given for non-synthetic dataset {name!r}")
    if name in PREPARED_NAMES:
        prepared = data_home() / name
        if store.is_complete_dataset(prepared):
            return prepared
        raise FileNotFoundError(
            f"no prepared {name} dataset at {prepared}; create it with "
            f"`python -m hetu.data.prepare {name} --input FILE --output {prepared}` "
            f"or use the generated stand-in 'synthetic-{name}'")
    raise FileNotFoundError(f"dataset not found: {name!r} is neither a folder nor a known name")


def load_dataset(name_or_dir, mmap=True, **synthetic_params):
    """Load a dataset (see ``resolve_dataset_dir`` for names) with memory-mapped train/val views;
    a sequences folder (meta.json kind "sequences") loads as a sequences.SequenceData.

    Synthetic parameters (``rows``, ``scale``, ``zipf_exponent``, ``drift``, ``seed``, ...;
    for ``synthetic-sequences`` those of sequences.SYNTHETIC_DEFAULTS) select which cached
    synthetic dataset to use, generating it on first use."""
    folder = resolve_dataset_dir(name_or_dir, **synthetic_params)
    if sequences.is_sequences_folder(folder):
        return sequences.load_sequences(folder, mmap=mmap)
    return Dataset(folder, mmap=mmap)
