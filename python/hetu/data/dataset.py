"""Loading a dataset folder for training: memory-mapped arrays split into train and val views."""
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import store
from .cache import data_home, ensure_synthetic
from .synthetic import SHAPES

PREPARED_NAMES = ("criteo", "avazu", "movielens")


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

    @classmethod
    def from_dict(cls, meta):
        return cls(
            name=meta["name"], num_rows=meta["num_rows"], num_dense=meta["num_dense"],
            num_fields=meta["num_fields"], field_names=tuple(meta["field_names"]),
            field_sizes=tuple(meta["field_sizes"]), field_offsets=tuple(meta["field_offsets"]),
            num_embeddings=meta["num_embeddings"], train_rows=meta["split"]["train_rows"],
            val_rows=meta["split"]["val_rows"], info=meta)


class DatasetPart:
    """Rows of one split. ``dense`` is None for datasets without dense features."""

    def __init__(self, dense, sparse, labels, meta):
        self.dense = dense if dense is not None and dense.shape[1] > 0 else None
        self.sparse = sparse
        self.labels = labels
        self.meta = meta

    def __len__(self):
        return len(self.labels)

    def slice(self, start, stop):
        dense = None if self.dense is None else self.dense[start:stop]
        return DatasetPart(dense, self.sparse[start:stop], self.labels[start:stop], self.meta)

    def batches(self, batch_size, drop_last=False):
        """(dense or None, sparse, labels) views of consecutive batches."""
        end = len(self) - (len(self) % batch_size if drop_last else 0)
        for start in range(0, end, batch_size):
            part = self.slice(start, min(start + batch_size, end))
            yield part.dense, part.sparse, part.labels


class Dataset:
    def __init__(self, path, mmap=True):
        self.path = Path(path)
        self.meta = DatasetMeta.from_dict(store.read_meta(self.path))
        dense, sparse, labels = store.load_arrays(self.path, mmap=mmap)
        check_arrays(self.path, self.meta, dense, sparse, labels)
        cut = self.meta.train_rows
        self.train = DatasetPart(dense[:cut], sparse[:cut], labels[:cut], self.meta)
        self.val = DatasetPart(dense[cut:], sparse[cut:], labels[cut:], self.meta)

    def __repr__(self):
        m = self.meta
        return (f"Dataset({m.name!r}, path={str(self.path)!r}, train={len(self.train)}, "
                f"val={len(self.val)}, fields={m.num_fields}, dense={m.num_dense}, "
                f"num_embeddings={m.num_embeddings})")


def check_arrays(path, meta, dense, sparse, labels):
    expected = {"dense": ((meta.num_rows, meta.num_dense), np.float32),
                "sparse": ((meta.num_rows, meta.num_fields), np.int64),
                "labels": ((meta.num_rows, 1), np.float32)}
    for name, array in (("dense", dense), ("sparse", sparse), ("labels", labels)):
        shape, dtype = expected[name]
        if array.shape != shape or array.dtype != dtype:
            raise ValueError(f"{path}/{name}.npy is {array.dtype}{list(array.shape)}, "
                             f"meta.json says {np.dtype(dtype)}{list(shape)}")


def resolve_dataset_dir(name_or_dir, **synthetic_params):
    """Folder for a dataset path, a synthetic name (``synthetic`` = ``synthetic-criteo``,
    ``synthetic-avazu``, ``synthetic-movielens``), or a prepared name under $HETU_DATA_HOME."""
    name = str(name_or_dir)
    path = Path(name).expanduser()
    if path.is_dir():
        if not store.is_complete_dataset(path):
            raise FileNotFoundError(f"{path} is not a complete dataset folder (no meta.json)")
        return path
    if name == "synthetic" or name.startswith("synthetic-"):
        shape = "criteo" if name == "synthetic" else name[len("synthetic-"):]
        if shape not in SHAPES:
            raise ValueError(f"unknown synthetic dataset {name!r}; shapes: {sorted(SHAPES)}")
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
    """Load a dataset (see ``resolve_dataset_dir`` for names) with memory-mapped train/val views.

    Synthetic parameters (``rows``, ``scale``, ``zipf_exponent``, ``drift``, ``seed``, ...)
    select which cached synthetic dataset to use, generating it on first use."""
    return Dataset(resolve_dataset_dir(name_or_dir, **synthetic_params), mmap=mmap)
