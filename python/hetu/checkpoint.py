"""The files of a checkpoint folder: written beside the old one, synced, checksummed, swapped in.

A save writes a new folder `.tmp-NAME.XXXXXXXX` beside NAME, syncs every file, records each
file's sha256 in meta.json (written last), then swaps by renames:

    NAME -> NAME.previous,  .tmp-NAME.XXXXXXXX -> NAME,  remove NAME.previous

so that at every instant NAME or NAME.previous holds a complete checkpoint; locate() finds it.
Temporary folders of interrupted saves are removed by the next save. Loading checks every
file against meta.json first: a changed byte is an error naming the file.

HETU_CHECKPOINT_STOP_AT=POINT kills the saving process (SIGKILL) at one of STOP_POINTS, to
test that every step of the swap leaves a checkpoint to resume from.
"""
import hashlib
import json
import os
import re
import shutil
import signal
import tempfile

META = "meta.json"
PREVIOUS = ".previous"
STOP_POINTS = ("written", "old-set-aside", "new-in-place")


def _stop_point(point):
    if os.environ.get("HETU_CHECKPOINT_STOP_AT") == point:
        os.kill(os.getpid(), signal.SIGKILL)


def _fsync(path, folder=False):
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if folder else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sha256_of(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _files(folder):
    """Relative paths of the files under `folder`, meta.json aside."""
    out = []
    for root, _, names in os.walk(folder):
        for name in names:
            rel = os.path.relpath(os.path.join(root, name), folder)
            if rel != META:
                out.append(rel)
    return sorted(out)


def _temporaries(directory):
    parent, name = os.path.split(directory)
    # mkdtemp's suffix: 8 characters of [a-z0-9_], so NAME's temporaries are told from NAME2's.
    pattern = re.compile(r"\.tmp-" + re.escape(name) + r"\.[a-z0-9_]{8}")
    return [os.path.join(parent, e) for e in os.listdir(parent) if pattern.fullmatch(e)]


def new_folder(directory):
    """An empty folder beside `directory` for a new checkpoint; interrupted saves' are removed."""
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)
    for stale in _temporaries(directory):
        shutil.rmtree(stale, ignore_errors=True)
    return tempfile.mkdtemp(prefix=".tmp-" + os.path.basename(directory) + ".", dir=parent)


def seal(folder, meta):
    """Syncs every file of `folder`, then writes meta.json with their checksums, last."""
    files = {}
    for rel in _files(folder):
        path = os.path.join(folder, rel)
        files[rel] = {"sha256": sha256_of(path), "bytes": os.path.getsize(path)}
        _fsync(path)
    meta = {**meta, "files": files}
    with open(os.path.join(folder, META), "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    for root, _, _ in os.walk(folder):
        _fsync(root, folder=True)


def swap_in(folder, directory):
    """Makes the sealed `folder` the checkpoint at `directory`, keeping a complete checkpoint at
    `directory` or `directory.previous` at every instant."""
    parent = os.path.dirname(directory)
    previous = directory + PREVIOUS
    _stop_point("written")
    if os.path.isdir(directory):
        shutil.rmtree(previous, ignore_errors=True)   # `directory` is complete: the older one goes
        os.rename(directory, previous)
        _fsync(parent, folder=True)
        _stop_point("old-set-aside")
    # Without `directory`, `previous` (if any) is the only complete checkpoint until this rename.
    os.rename(folder, directory)
    _fsync(parent, folder=True)
    _stop_point("new-in-place")
    shutil.rmtree(previous, ignore_errors=True)


def locate(directory):
    """(folder, note): the folder holding the checkpoint saved at `directory`; `note` says why it
    is not `directory` itself (an interrupted save), else it is None."""
    directory = os.path.abspath(directory)
    if os.path.exists(os.path.join(directory, META)):
        return directory, None
    previous = directory + PREVIOUS
    if not os.path.exists(directory) and os.path.exists(os.path.join(previous, META)):
        return previous, (f"{directory} is missing (a save was interrupted while replacing it): "
                          f"using the checkpoint before it, {previous}")
    raise FileNotFoundError(f"{directory} is not a hetu checkpoint (no {META})")


def read_meta(folder):
    path = os.path.join(folder, META)
    try:
        with open(path) as f:
            meta = json.load(f)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON ({e}): the checkpoint is damaged") from None
    files = meta.get("files", {}) if isinstance(meta, dict) else None
    if not isinstance(files, dict) or not all(isinstance(f, dict) and {"sha256", "bytes"} <= set(f)
                                              for f in files.values()):
        raise ValueError(f"{path} is not a checkpoint's meta.json: the checkpoint is damaged")
    return meta


def verify(folder, meta, only=None):
    """Every file meta.json lists (or those under `only`, a relative prefix) is as saved."""
    for rel, saved in sorted(meta.get("files", {}).items()):
        if only is not None and not rel.startswith(only):
            continue
        path = os.path.join(folder, rel)
        if not os.path.isfile(path):
            raise ValueError(f"checkpoint file {path} is missing")
        size = os.path.getsize(path)
        if size < saved["bytes"]:
            raise ValueError(f"checkpoint file {path} is truncated: {size} bytes, {saved['bytes']} when saved")
        if size > saved["bytes"]:
            raise ValueError(f"checkpoint file {path} has {size - saved['bytes']} bytes appended since it was saved")
        if sha256_of(path) != saved["sha256"]:
            raise ValueError(f"checkpoint file {path} is corrupt: its content differs from its sha256 in "
                             f"{os.path.join(folder, META)}")
