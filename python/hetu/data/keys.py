"""Hashed ids (``python -m hetu.data.prepare ... --ids hashed``): each categorical value is
written as its key, a 64-bit hash of (field index, raw value bytes), instead of an index from a
vocabulary. There is no vocabulary pass, no field offset and no min-count; the keys are meant for
dynamic tables, which take any int64 key.

The hash (src/common/key_hash.h, the one definition, bound as ``hetu._C.key_hash*``): XXH64 with
seed 0 over the field index as 4 little-endian bytes followed by the value's bytes, the uint64
read as an int64; the one result -1 (a bag's padding) becomes -2. The field index is the field's
position in meta.json's ``field_names``. The value's bytes: the column's text in UTF-8 for
Criteo, Avazu and MovieLens (an empty column is the empty value; user and item ids as their
decimal text), the field-local id's 8 little-endian bytes for synthetic data.
"""
import numpy as np

ID_KINDS = ("indexed", "hashed")
HASH_NAME = "xxh64(field:u32le || value bytes), seed 0, -1 -> -2"


def _native():
    from .. import _C  # imported here so that hetu.data stays importable without the build
    return _C


def check_ids(ids):
    if ids not in ID_KINDS:
        raise ValueError(f"ids must be one of {ID_KINDS}, got {ids!r}")
    return ids


def hash_values(field, values):
    """int64 keys of a field's values (str, as UTF-8, or bytes)."""
    return _native().key_hash_values(int(field), list(values))


def hash_ids(field, ids):
    """int64 keys of a field's integer ids (each as its 8 little-endian bytes), same shape."""
    return _native().key_hash_ids(int(field), np.ascontiguousarray(ids, dtype=np.int64))


def find_keys(keys, wanted, sorter=None):
    """(position in `keys` of each of `wanted`, whether it is there): `keys` int64 ascending (or
    put in order by `sorter`, np.searchsorted's, the positions then `keys`' own); a position where
    it is not there is any valid one."""
    wanted = np.asarray(wanted, np.int64)
    if len(keys) == 0:
        return np.zeros(wanted.shape, np.int64), np.zeros(wanted.shape, bool)
    at = np.minimum(np.searchsorted(keys, wanted, sorter=sorter), len(keys) - 1)
    if sorter is not None:
        at = sorter[at]
    return at, keys[at] == wanted
