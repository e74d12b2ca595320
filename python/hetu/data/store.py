"""Dataset folders on disk.

A dataset folder holds ``dense.npy`` (float32 [N, D]), ``sparse.npy`` (int64 [N, S]),
``labels.npy`` (float32 [N, 1]) and ``meta.json``. Each field takes ``field_slots[f]``
consecutive columns ("slots") of sparse.npy, in field order (meta.json's ``field_slots``; absent
means one slot per field, S = number of fields). A field named in ``bag_fields`` is a multi-hot
bag: a sample's ids sit left-aligned in the field's slots and the slots after them hold
``BAG_PADDING`` (-1); an empty bag is all padding. -1 appears nowhere else. With hashed ids
(meta.json ``"ids": "hashed"``, keys.py) sparse.npy holds keys, not field offset + local id.

A folder is only ever created under a hidden
temporary name and renamed into place once every file is written, so a folder that carries a
readable ``meta.json`` under its final name is complete: an interrupted writer leaves at most a
``.NAME.partial-*`` folder behind, which nothing mistakes for a dataset.
"""
import contextlib
import fcntl
import json
import os
import shutil
import uuid
from pathlib import Path

import numpy as np

from .keys import HASH_NAME

FORMAT_VERSION = 1
META_FILE = "meta.json"
DENSE_FILE = "dense.npy"
SPARSE_FILE = "sparse.npy"
LABELS_FILE = "labels.npy"
ID_DTYPE = np.int64
VALUE_DTYPE = np.float32
BAG_PADDING = -1   # fills a bag's slots after its ids


def is_complete_dataset(folder):
    """True when ``folder`` is a finished dataset folder (its meta.json parses)."""
    meta_path = Path(folder) / META_FILE
    if not meta_path.is_file():
        return False
    try:
        read_meta(folder)
    except (OSError, ValueError):
        return False
    return True


def read_meta(folder):
    with open(Path(folder) / META_FILE, "r", encoding="utf-8") as f:
        return json.load(f)


def write_meta(folder, meta):
    meta = dict(meta)
    meta.setdefault("format_version", FORMAT_VERSION)
    path = Path(folder) / META_FILE
    with open(path, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def create_array(folder, file_name, dtype, shape):
    """A writable memory-mapped .npy file, so outputs larger than RAM can be filled in chunks."""
    return np.lib.format.open_memmap(
        str(Path(folder) / file_name), mode="w+", dtype=dtype, shape=tuple(int(s) for s in shape))


class NpyWriter:
    """A .npy file written front to back, a block of rows at a time. Unlike a memory map's,
    the pages written do not stay in the writer's resident memory, so writing a file larger
    than RAM needs memory for one block only. The file is the one ``create_array`` would make."""

    def __init__(self, folder, file_name, dtype, shape):
        self.path = Path(folder) / file_name
        self.dtype, self.shape = np.dtype(dtype), tuple(int(s) for s in shape)
        self.rows = 0
        self.file = open(self.path, "wb")
        np.lib.format.write_array_header_1_0(self.file, {
            "descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False,
            "shape": self.shape})

    def write(self, block):
        block = np.ascontiguousarray(block, dtype=self.dtype)
        if block.shape[1:] != self.shape[1:] or self.rows + len(block) > self.shape[0]:
            raise ValueError(f"{self.path}: block {block.shape} does not fit {self.shape} "
                             f"after {self.rows} rows")
        self.file.write(block.data)
        self.rows += len(block)

    def close(self):
        self.file.close()
        if self.rows != self.shape[0]:
            raise ValueError(f"{self.path}: {self.rows} rows written of {self.shape[0]}")

    def __enter__(self):
        return self

    def __exit__(self, kind, *_):
        if kind is None:
            self.close()
        else:
            self.file.close()


def npy_row_chunks(path, chunk_rows):
    """The rows of a .npy file as arrays of ``chunk_rows`` rows, read (not memory-mapped) so
    that reading a large file keeps one chunk resident."""
    with open(path, "rb") as f:
        shape, dtype = _read_npy_header(f)
        row_items = int(np.prod(shape[1:], dtype=np.int64))
        for start in range(0, shape[0], chunk_rows):
            rows = min(chunk_rows, shape[0] - start)
            yield np.fromfile(f, dtype=dtype, count=rows * row_items).reshape(
                (rows,) + tuple(shape[1:]))


def _read_npy_header(f):
    """(shape, dtype) of the open .npy file ``f``, left at the start of its data."""
    version = np.lib.format.read_magic(f)
    read_header = {(1, 0): np.lib.format.read_array_header_1_0,
                   (2, 0): np.lib.format.read_array_header_2_0}.get(version)
    if read_header is None:
        raise ValueError(f"unsupported .npy version {version}")
    shape, _, dtype = read_header(f)
    return shape, dtype


def flush_arrays(*arrays):
    for array in arrays:
        if isinstance(array, np.memmap):
            array.flush()


def load_arrays(folder, mmap=True):
    """(dense, sparse, labels) of a dataset folder; memory-mapped read-only by default so that
    several processes on one host share a single copy through the page cache."""
    folder = Path(folder)
    mode = "r" if mmap else None
    return tuple(load_npy(folder / name, mode) for name in (DENSE_FILE, SPARSE_FILE, LABELS_FILE))


def load_npy(path, mmap_mode=None):
    """np.load of one .npy file, whose size is checked against its header first, so that a
    truncated or overlong file is an error naming it (NumPy's own says neither)."""
    try:
        with open(path, "rb") as f:
            shape, dtype = _read_npy_header(f)
            data_start = f.tell()
    except ValueError as e:
        raise ValueError(f"{path} is not a .npy array file ({e})") from None
    expected = data_start + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = os.path.getsize(path)
    if size != expected:
        what = "is truncated" if size < expected else "has extra bytes after its data"
        raise ValueError(f"{path} {what}: {size} bytes, its header describes {dtype}{list(shape)} "
                         f"in {expected} bytes")
    return np.load(path, mmap_mode=mmap_mode)


def _fsync_tree(folder):
    for entry in Path(folder).iterdir():
        if entry.is_file():
            fd = os.open(entry, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)


@contextlib.contextmanager
def atomic_directory(final_dir, overwrite=False):
    """Yield a temporary folder next to ``final_dir``; rename it to ``final_dir`` when the block
    finishes, delete it when the block raises (or the process dies before the rename)."""
    final_dir = Path(final_dir)
    parent = final_dir.parent
    parent.mkdir(parents=True, exist_ok=True)
    if final_dir.exists() and not overwrite:
        raise FileExistsError(
            f"output folder {final_dir} already exists (pass --force / overwrite=True to replace it)")
    # mkdir (unlike mkdtemp's 0700) honours the umask, so a shared cache stays readable by all
    tmp_dir = parent / f".{final_dir.name}.partial-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp_dir.mkdir()
    try:
        yield tmp_dir
        _fsync_tree(tmp_dir)
        if final_dir.exists():
            # rename the old folder away first: rename() cannot replace a non-empty folder.
            trash = parent / f".{final_dir.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(final_dir, trash)
            os.rename(tmp_dir, final_dir)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.rename(tmp_dir, final_dir)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise


@contextlib.contextmanager
def file_lock(lock_path):
    """Exclusive advisory lock (fcntl.flock) held for the block; released if the holder dies."""
    lock_path = Path(lock_path)
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def permute_rows(source, target, permutation, chunk_rows=1 << 18):
    """target[i] = source[permutation[i]], a chunk of target rows at a time (bounded memory)."""
    for start in range(0, len(permutation), chunk_rows):
        rows = permutation[start:start + chunk_rows]
        # reading source rows in sorted order is far kinder to a memmap than random order.
        order = np.argsort(rows, kind="stable")
        gathered = np.asarray(source[rows[order]])
        block = np.empty_like(gathered)
        block[order] = gathered
        target[start:start + len(rows)] = block


def contiguous_split(num_rows, val_fraction):
    """Rows [0, train_rows) train, the rest validate; at least one row each when possible."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    val_rows = int(round(num_rows * val_fraction))
    if val_fraction > 0 and num_rows >= 2:
        val_rows = min(max(val_rows, 1), num_rows - 1)
    return num_rows - val_rows, val_rows


def field_offsets(field_sizes):
    sizes = np.asarray(field_sizes, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)


def slot_offsets(field_slots):
    """Column start of each field in sparse.npy, plus the end (the number of columns)."""
    return tuple(int(o) for o in np.concatenate([[0], np.cumsum(field_slots, dtype=np.int64)]))


def dataset_meta(name, num_rows, num_dense, field_names, field_sizes, train_rows, val_rows,
                 val_fraction, shuffle_seed, source, label, field_slots=None, bag_fields=(),
                 ids="indexed", **extra):
    """The meta.json content every writer produces (readers and the generator alike).
    ``field_slots`` and ``bag_fields`` are written only for datasets with a multi-slot field or
    a bag, so a one-id-per-field dataset keeps the meta it always had. Hashed ids (keys.py) have
    no vocabulary: ``field_sizes`` (None) become 0, and so do ``field_offsets`` and
    ``num_embeddings``; meta.json says ``"ids": "hashed"`` and names the hash. Indexed data
    writes no ``ids`` (absent means indexed)."""
    if ids == "hashed":
        field_sizes = [0] * len(field_names)
        extra.update(ids="hashed", hash=HASH_NAME)
    sizes = [int(s) for s in field_sizes]
    meta = {
        "format_version": FORMAT_VERSION,
        "name": name,
        "source": source,
        "num_rows": int(num_rows),
        "num_dense": int(num_dense),
        "num_fields": len(sizes),
        "field_names": list(field_names),
        "field_sizes": sizes,
        "field_offsets": [int(o) for o in field_offsets(sizes)],
        "num_embeddings": int(sum(sizes)),
        "id_dtype": "int64",
        "label": label,
        "split": {
            "kind": "contiguous",
            "train_rows": int(train_rows),
            "val_rows": int(val_rows),
            "val_fraction": float(val_fraction),
            "shuffle_seed": shuffle_seed,
        },
    }
    slots = [1] * len(sizes) if field_slots is None else [int(k) for k in field_slots]
    if bag_fields or any(k != 1 for k in slots):
        meta["field_slots"] = slots
        meta["bag_fields"] = list(bag_fields)
    meta.update(extra)
    return meta
