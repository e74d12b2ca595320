"""A prepared folder's arrays as one digest: the synthetic generator's tests pin the bytes it
writes with it."""
import hashlib

ARRAYS = ("dense.npy", "sparse.npy", "labels.npy")


def arrays_digest(folder):
    """sha256 of dense.npy, sparse.npy and labels.npy of `folder` (a pathlib.Path), in that order."""
    digest = hashlib.sha256()
    for name in ARRAYS:
        digest.update((folder / name).read_bytes())
    return digest.hexdigest()
