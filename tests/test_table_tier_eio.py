"""The disk tier (docs/design.md, "Disk tier") under a real I/O error: a table's row file on a
FUSE file system (hetu_tools.fault_fs) whose reads or writes fail with EIO once switched on, with
real scheduler, server and worker processes on loopback. The request that meets the error fails
in one line naming the file; nothing wrong is served, and once the disk answers again the job
goes on with the rows of the NumPy model."""
import json

import numpy as np
import pytest

from hetu import _C
from hetu_tools.fault_fs import FaultFS, FaultFsUnavailable
from ps_helpers import cluster_fixture, optim_config

cluster = pytest.fixture(cluster_fixture)

ROWS, WIDTH, STEPS, LR = 400, 16, 3, 0.1
# A cache of about 7 lines (a line: the row, Adam's two moments and about 90 bytes of
# bookkeeping): every step's rows go through the file.
CACHE_MB = 7 * (WIDTH * 4 + 2 * WIDTH * 4 + 90) / 2 ** 20
# The gradients of step t for n rows: shared by the worker and the model.
GRADS_CODE = """
def grads(t, n):
    return np.random.default_rng([7, t]).standard_normal((n, WIDTH)).astype(np.float32)
"""

TRAIN = GRADS_CODE + """
from hetu_tools.fault_fs import set_faults
ROWS, WIDTH, STEPS, LR = ARGS["rows"], ARGS["width"], ARGS["steps"], ARGS["lr"]
c = ps.client()
emb = c.init_table("emb", ROWS, WIDTH, init=("normal", 0.0, 0.1), seed=7, optimizer=("adam", {}),
                   tier=ps.DiskTier(ARGS["dir"], ARGS["cache_mb"]))
keys = np.arange(ROWS)
for t in range(STEPS):
    emb.push(keys, grads(t, ROWS), iteration=t, lr=LR).wait()
# A few rows stepped again: the cache holds them, changed since the file has them (dirty).
emb.push(keys[:5], grads(STEPS, 5), iteration=STEPS, lr=LR).wait()
def error_of(handle):   # the request's error, "" when it went through
    try:
        handle.wait()
        return ""
    except RuntimeError as e:
        return str(e)
set_faults(ARGS["backing"], ARGS["fault"])
said = [
    # The other rows: most are in the file (read), and the dirty lines make room for them first
    # (written back).
    ["pull", error_of(emb.pull(keys[5:], iteration=STEPS + 1))],
    # A save writes the dirty lines back, then copies the records out (the checkpoint's folder
    # is on another file system: no clone).
    ["save", error_of(emb.save(ARGS["saved"]))]]
saved_after_fault = sorted(os.listdir(ARGS["saved"]))
set_faults(ARGS["backing"])
rows, state, steps, versions = emb.pull_with_state(keys).wait()
said.append(["save", error_of(emb.save(ARGS["saved"]))])
json.dump({"said": said, "saved_after_fault": saved_after_fault}, open(OUT + ".json", "w"))
np.savez(OUT + ".npz", rows=rows, state=state, steps=steps)
ps.finalize()
"""


def model():
    """The table after the worker's pushes: NumPy + hetu._C's optimizer step."""
    ns = {"np": np, "WIDTH": WIDTH}
    exec(GRADS_CODE, ns)
    cfg = optim_config("adam")
    table = np.empty((ROWS, WIDTH), np.float32)
    _C.init_fill(2, 0.0, 0.1, 7, _C.name_stream("emb"), 0, table)
    state = np.zeros((ROWS, _C.optim_state_width(cfg.kind, WIDTH)), np.float32)
    steps = np.zeros(ROWS, np.int64)
    for t in range(STEPS):
        _C.apply_rows(cfg, np.float32(LR), table, state, steps, np.arange(ROWS), ns["grads"](t, ROWS))
    _C.apply_rows(cfg, np.float32(LR), table, state, steps, np.arange(5), ns["grads"](STEPS, 5))
    return table, state, steps


@pytest.fixture
def faulty_disk(tmp_path):
    """A FaultFS of tmp_path/backing mounted at tmp_path/disk; skips where FUSE is not to be had."""
    backing, disk = tmp_path / "backing", tmp_path / "disk"
    backing.mkdir()
    disk.mkdir()
    try:
        with FaultFS(backing, disk) as fs:
            yield fs
    except FaultFsUnavailable as e:
        pytest.skip(str(e))


@pytest.mark.timeout(90)
@pytest.mark.parametrize("fault,failed", [("read", "reading record"), ("write", "writing record")])
def test_an_io_error_fails_the_request_naming_the_file(cluster, tmp_path, faulty_disk, fault, failed):
    """Reads (or writes) of the row file failing with EIO: the pull that needs a row from the
    file (or must write a changed row back first) and the save fail, each in one line naming the
    file and the error, no rows and no checkpoint come of them; with the disk well again, the
    rows, state and step counts pulled are the model's, and a save goes through."""
    saved = tmp_path / "saved"
    saved.mkdir()
    cluster(1, 1).run(TRAIN, dict(rows=ROWS, width=WIDTH, steps=STEPS, lr=LR, dir=faulty_disk.mountpoint,
                                  backing=faulty_disk.backing, cache_mb=CACHE_MB, fault=fault, saved=str(saved)),
                      timeout=60)
    got = json.loads((tmp_path / "worker0.json").read_text())
    path = f"{faulty_disk.mountpoint}/emb.shard0-of-1.rows"
    assert [what for what, _ in got["said"]] == ["pull", "save", "save"], got
    for what, error in got["said"][:2]:
        assert failed in error and path in error and "Input/output error" in error, (what, error)
        assert "\n" not in error
    assert got["said"][2] == ["save", ""], got
    assert got["saved_after_fault"] == [], got   # the failed save left no checkpoint
    table, state, steps = model()
    rows = np.load(tmp_path / "worker0.npz")
    assert np.array_equal(rows["rows"], table)
    assert np.array_equal(rows["state"], state)
    assert np.array_equal(rows["steps"], steps)


BROKEN = GRADS_CODE + """
import time
from hetu_tools.fault_fs import set_faults
ROWS, WIDTH, STEPS, LR = ARGS["rows"], ARGS["width"], ARGS["steps"], ARGS["lr"]
c = ps.client()
emb = c.init_table("emb", ROWS, WIDTH, init=("normal", 0.0, 0.1), seed=7, optimizer=("adam", {}), bsp=True,
                   tier=ps.DiskTier(ARGS["dir"], ARGS["cache_mb"]))
keys = np.arange(ROWS)
for t in range(STEPS):
    emb.push(keys, grads(t, ROWS), iteration=t, lr=LR).wait()
def error_of(handle):
    try:
        handle.wait()
        return ""
    except RuntimeError as e:
        return str(e)
set_faults(ARGS["backing"], "write")
said = [["push", error_of(emb.push(keys, grads(STEPS, ROWS), iteration=STEPS, lr=LR))]]
set_faults(ARGS["backing"])
started = time.monotonic()
said.append(["pull", error_of(emb.pull(keys[:5], iteration=STEPS + 1))])
said.append(["push", error_of(emb.push(keys[:5], grads(STEPS + 1, 5), iteration=STEPS + 1, lr=LR))])
json.dump({"said": said, "seconds": time.monotonic() - started}, open(OUT + ".json", "w"))
ps.finalize()
"""


@pytest.mark.timeout(90)
def test_a_step_that_fails_on_an_io_error_breaks_the_table_instead_of_hanging(cluster, tmp_path, faulty_disk):
    """A BSP push whose step meets a write error (the rows written back to make room): the push
    fails naming the file; its iteration never completes, so the reads of the next one, which
    would wait for it for ever, and every later request fail at once with the table's error
    (its rows may be half stepped), even with the disk well again."""
    cluster(1, 1).run(BROKEN, dict(rows=ROWS, width=WIDTH, steps=STEPS, lr=LR, dir=faulty_disk.mountpoint,
                                   backing=faulty_disk.backing, cache_mb=CACHE_MB), timeout=60)
    got = json.loads((tmp_path / "worker0.json").read_text())
    path = f"{faulty_disk.mountpoint}/emb.shard0-of-1.rows"
    (_, push), (_, pull), (_, later) = got["said"]
    assert path in push and "Input/output error" in push and "\n" not in push, push
    for error in (pull, later):
        assert "serves nothing after it" in error and "Input/output error" in error, error
    assert got["seconds"] < 10, got   # answered, not left to the workers' wait timeout
