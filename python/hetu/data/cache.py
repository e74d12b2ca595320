"""Synthetic datasets generated on first use into a shared cache folder.

Folder: ``$HETU_DATA_HOME`` (default ``~/.cache/hetu/datasets``) / ``synthetic-<shape>-<hash>``
(``synthetic-<shape>-sessions-<hash>`` with sessions), where the hash covers every generator parameter (defaults included), so changing any parameter
gives a new folder and equal parameters share one. Several worker processes may start at once:
an fcntl lock lets exactly one generate while the others wait, then all load the same files.
"""
import hashlib
import json
import os
from pathlib import Path

from . import store
from .synthetic import generate_synthetic, synthetic_spec

DATA_HOME_ENV = "HETU_DATA_HOME"


def data_home():
    configured = os.environ.get(DATA_HOME_ENV)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "hetu" / "datasets"


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
    if store.is_complete_dataset(folder):
        return folder
    with store.file_lock(folder.parent / f".{folder.name}.lock"):
        # another process may have finished it while this one waited for the lock
        if not store.is_complete_dataset(folder):
            generate_synthetic(folder, spec, overwrite=folder.exists(), progress=progress)
    return folder
