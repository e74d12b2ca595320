"""An indexed dataset's vocabulary, ``vocabulary.npz``: what ``prepare`` numbered each field's
values by, kept so that raw values met later (hetu.serve's instances) are encoded as it encoded
them. Per field f: ``keys/f``, the key of each value (keys.hash_values(f, its text), 64 bits, so
the file is compact and its values need no text arrays) ascending; ``ids/f``, each one's global id
(field offset + local id); ``missing/f``, where the field has one, the id of missing, rare and
unseen values (its bucket 0)."""
import numpy as np

from .keys import hash_values

VOCABULARY_FILE = "vocabulary.npz"


def field_arrays(field, values, ids, missing=None):
    """The arrays of field `field`: its `values` (str or bytes) numbered `ids`."""
    keys = hash_values(field, values) if len(values) else np.zeros(0, np.int64)
    order = np.argsort(keys, kind="stable")
    arrays = {f"keys/{field}": keys[order], f"ids/{field}": np.asarray(ids, np.int64)[order]}
    if missing is not None:
        arrays[f"missing/{field}"] = np.int64(missing)
    return arrays


def write(folder, arrays):
    np.savez(f"{folder}/{VOCABULARY_FILE}", **arrays)
