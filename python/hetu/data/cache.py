"""Synthetic datasets generated on first use into a shared cache folder.

Folder: ``$HETU_DATA_HOME`` (default ``~/.cache/hetu/datasets``) / ``synthetic-<shape>-<hash>``
(``synthetic-<shape>-sessions-<hash>`` with sessions), where the hash covers every generator parameter (defaults included), so changing any parameter
gives a new folder and equal parameters share one. Several worker processes may start at once:
an fcntl lock lets exactly one generate while the others wait, then all load the same files.
Synthetic user histories (``synthetic-sequences``, sequences.py) are cached the same way, in
``synthetic-sequences-<hash>``; ``movielens-sequences`` is prepared on first use from MovieLens
100K's ``u.data`` where scripts/get_movielens100k.py put it (MOVIELENS_100K_PLACES).
"""
import hashlib
import json
from pathlib import Path

from .. import env
from . import sequences, store
from .synthetic import generate_synthetic, synthetic_spec


def data_home():
    return env.data_home()


def spec_key(spec):
    text = json.dumps({"format_version": store.FORMAT_VERSION, **spec.as_dict()},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def synthetic_dataset_dir(shape="criteo", cache_dir=None, **params):
    spec = synthetic_spec(shape, **params)
    root = Path(cache_dir) if cache_dir is not None else data_home()
    return root / f"{spec.name}-{spec_key(spec)}", spec


def ensure_synthetic(shape="criteo", cache_dir=None, progress=False, **params):
    """Path of the cached synthetic dataset for these parameters, generating it if absent."""
    folder, spec = synthetic_dataset_dir(shape, cache_dir, **params)
    return ensure_folder(folder, lambda: generate_synthetic(folder, spec, overwrite=folder.exists(),
                                                            progress=progress))


def ensure_folder(folder, make):
    """``folder``, made by make() under a lock unless it is complete already."""
    if store.is_complete_dataset(folder):
        return folder
    with store.file_lock(folder.parent / f".{folder.name}.lock"):
        # another process may have finished it while this one waited for the lock
        if not store.is_complete_dataset(folder):
            make()
    return folder


def synthetic_sequences_dir(cache_dir=None, **params):
    """(folder, full parameters) of the cached synthetic histories of ``params``."""
    full = sequences.synthetic_params(**params)
    text = json.dumps({"format_version": store.FORMAT_VERSION, "version": sequences.SYNTHETIC_VERSION, **full},
                      sort_keys=True)
    root = Path(cache_dir) if cache_dir is not None else data_home()
    return root / f"{sequences.SYNTHETIC_NAME}-{hashlib.sha256(text.encode()).hexdigest()[:12]}", full


def ensure_synthetic_sequences(cache_dir=None, progress=False, **params):
    """Path of the cached ``synthetic-sequences`` folder for these parameters (sequences.
    SYNTHETIC_DEFAULTS overridden), generating it if absent."""
    folder, full = synthetic_sequences_dir(cache_dir, **params)
    return ensure_folder(folder, lambda: sequences.generate_synthetic_sequences(
        folder, overwrite=folder.exists(), progress=progress, **full))


# where a MovieLens 100K u.data is looked for: the data home, then data/ml-100k (the folder
# scripts/get_movielens100k.py is told in the docs and scripts/demo.sh) of the working folder and
# of this source tree
MOVIELENS_100K_PLACES = (lambda: data_home() / "ml-100k", lambda: Path.cwd() / "data" / "ml-100k",
                         lambda: Path(__file__).resolve().parents[3] / "data" / "ml-100k")


def ensure_movielens_sequences(cache_dir=None, progress=False):
    """``$HETU_DATA_HOME/movielens-sequences``: as prepared there (any MovieLens, by
    ``python -m hetu.data.prepare movielens --sequences``), else prepared on first use from the
    first u.data of MOVIELENS_100K_PLACES with sequences.DEFAULT_MAX_LENGTH."""
    root = Path(cache_dir) if cache_dir is not None else data_home()
    folder = root / sequences.MOVIELENS_NAME
    if store.is_complete_dataset(folder):
        return folder
    found = [place() / "u.data" for place in MOVIELENS_100K_PLACES]
    ratings = next((path for path in found if path.is_file()), None)
    if ratings is None:
        raise FileNotFoundError(
            f"no {sequences.MOVIELENS_NAME} at {folder}, and no MovieLens 100K u.data to prepare it from (looked "
            f"in {', '.join(str(p.parent) for p in found)}); fetch it with `python scripts/get_movielens100k.py "
            f"--output data/ml-100k` (from the repository), or prepare any MovieLens with `python -m "
            f"hetu.data.prepare movielens --sequences --input FILE --output {folder}`")
    return ensure_folder(folder, lambda: sequences.prepare_movielens_sequences(
        ratings, folder, overwrite=folder.exists(), progress=progress))
