"""Checkpoints of a disk-tier table (docs/design.md, "Disk tier"): on a file system that clones
files (XFS with reflink=1, here a loop-mounted image) a save shares the row file's blocks
instead of copying them, and the checkpoint resumes bit for bit onto a disk tier (cloned back)
or into memory, under the same server count or another; elsewhere (ext4, tmpfs) the save is
written whole and resumes the same. A damaged record of a cloned shard fails the load naming
the file and the record."""
import json
import os
import shutil
import struct
import subprocess

import numpy as np
import pytest

from ps_helpers import Cluster

pytestmark = pytest.mark.timeout(120)

ROWS, WIDTH = 40_000, 64
# A row file's record: the row, Adam's two moments, its step and version, and an 8-byte check.
RECORD = WIDTH * 4 + 2 * WIDTH * 4 + 16 + 8
SERVERS = 2                       # of the saving job
CACHE_MB = 0.5                    # each server's lines: far fewer than its ~20,000 rows

# Rows 3, 13, 23, ... are never stepped before the save: their records are never written, and a
# load must draw them as the tier would. Phase 1 steps the others (written to the row files);
# phase 2, after the save, steps random rows, as a resumed run does.
COMMON = """
R, W = ARGS["rows"], ARGS["width"]
c = ps.client()
kw = dict(init=("normal", 0.0, 0.1), seed=7, optimizer=("adam", {}), bsp=False)
if ARGS["tier"]:
    kw["tier"] = ps.DiskTier(ARGS["tier"], ARGS["cache_mb"])
t = c.init_table("emb", R, W, **kw)

def step(i, keys):
    grads = np.random.default_rng([5, i]).standard_normal((len(keys), W)).astype(np.float32)
    t.push(keys, grads, lr=0.01).wait()

def phase2():
    for i in range(3):
        step(100 + i, np.unique(np.random.default_rng([6, i]).integers(0, R, 3000)))

def everything():
    return t.pull_with_state(np.arange(R)).wait()
"""

SAVE = COMMON + """
stepped = np.arange(R)[np.arange(R) % 10 != 3]
for i in range(2):
    for b in range(0, len(stepped), 8192):
        step(10 * i + b, stepped[b:b + 8192])

def used():   # the file system's used bytes, with everything written out
    os.sync()
    s = os.statvfs(os.path.dirname(ARGS["ckpt"]))
    return (s.f_blocks - s.f_bfree) * s.f_frsize

before = used()
t.save(ARGS["ckpt"]).wait()
grown = used() - before
saved = everything()
phase2()
final = everything()
# The same job resumes from the checkpoint onto its own disk tier: cleared, loaded, stepped again.
t.clear().wait()
t.load(ARGS["ckpt"]).wait()
reloaded = everything()
phase2()
refinal = everything()
np.savez(OUT + ".npz", *saved, *final, *reloaded, *refinal)
json.dump({"grown": grown}, open(OUT + ".json", "w"))
ps.finalize()
"""

LOAD = COMMON + """
try:
    t.load(ARGS["ckpt"]).wait()
except RuntimeError as e:
    json.dump(str(e), open(OUT + ".json", "w"))
    ps.finalize()
    sys.exit(0)
loaded = everything()
phase2()
np.savez(OUT + ".npz", *loaded, *everything())
ps.finalize()
"""


def run_job(folder, servers, code, args):
    folder.mkdir(parents=True)
    job = Cluster(folder, servers, 1)
    try:
        job.run(code, dict(rows=ROWS, width=WIDTH, cache_mb=CACHE_MB, **args), timeout=100)
    finally:
        job.close()
    return job


def arrays(path, groups):
    """The npz's arrays in `groups` groups of (rows, state, steps, versions)."""
    got = np.load(path)
    flat = [got[f"arr_{i}"] for i in range(len(got.files))]
    assert len(flat) == 4 * groups
    return [flat[4 * g:4 * g + 4] for g in range(groups)]


def assert_same(a, b, what):
    for name, x, y in zip(["rows", "state", "steps", "versions"], a, b):
        assert x.dtype == y.dtype and np.array_equal(x, y), f"{what}: {name} differ"


def mount_xfs(root):
    """An XFS with reflink=1 on a loop-mounted image under `root`; skips where it cannot be made."""
    if shutil.which("mkfs.xfs") is None:
        pytest.skip("mkfs.xfs not installed (xfsprogs): no file system with reflinks to test on")
    image, folder = root / "xfs.img", root / "xfs"
    folder.mkdir()
    with open(image, "wb") as f:
        f.truncate(300 << 20)
    made = subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"mkfs.xfs -m reflink=1 failed here: {made.stderr.decode().strip()}")
    mounted = subprocess.run(["mount", "-o", "loop", str(image), str(folder)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot loop-mount an XFS image here: {mounted.stderr.decode().strip()}")
    return folder


def clones(folder):
    """Whether the file system of `folder` clones files (cp --reflink=always succeeds)."""
    a, b = folder / ".probe", folder / ".probe-clone"
    a.write_bytes(b"x" * 8192)
    done = subprocess.run(["cp", "--reflink=always", str(a), str(b)], capture_output=True).returncode == 0
    a.unlink()
    if b.exists():
        b.unlink()
    return done


@pytest.fixture(scope="module", params=["xfs", "plain"])
def saved(request, tmp_path_factory):
    """A checkpoint of a 2-server disk-tier table: on the XFS (cloned) or on the test's own file
    system when that cannot clone (written whole). Yields (file system, folder, save job)."""
    root = tmp_path_factory.mktemp(request.param)
    if request.param == "xfs":
        fs = mount_xfs(root)
    else:
        fs = root / "plain"
        fs.mkdir()
        if clones(fs):
            pytest.skip("the test's file system clones files: the whole-copy fallback needs one that cannot")
    try:
        (fs / "tier").mkdir()
        job = run_job(root / "save", SERVERS, SAVE, dict(tier=str(fs / "tier"), ckpt=str(fs / "ckpt")))
        yield request.param, fs, job
    finally:
        if request.param == "xfs":
            subprocess.run(["umount", "-l", str(fs)])


def test_a_save_shares_the_row_files_blocks_where_it_can(saved):
    """On XFS the save grows the file system by far less than the shard (the dirty lines written
    back and a header), and each server says it cloned; elsewhere each says it wrote it whole.
    The same job cleared and loaded its own checkpoint back onto its disk tier bit for bit (cloned
    back on XFS)."""
    kind, fs, job = saved
    grown = json.loads((job.tmp / "worker0.json").read_text())["grown"]
    files = sorted((fs / "ckpt").iterdir())
    assert [f.name for f in files] == [f"emb.shard{k}-of-{SERVERS}.bin" for k in range(SERVERS)], files
    shard_bytes = ROWS * RECORD
    assert sum(f.stat().st_size for f in files) >= ROWS * (RECORD - 8)   # every row, in either layout
    logs = [job.log(f"server{k}") for k in range(SERVERS)]
    if kind == "xfs":
        assert grown < shard_bytes / 8, (grown, shard_bytes)
        assert all("by cloning the row file" in log and "loaded" in log and "by cloning it into" in log
                   for log in logs), logs
    else:   # (the file system is shared with other processes: its growth says little here)
        assert all(" whole: " in log and "no clone of the row file" in log for log in logs), logs
    saved_rows, final, reloaded, refinal = arrays(job.tmp / "worker0.npz", 4)
    assert (saved_rows[2][np.arange(ROWS) % 10 == 3] == 0).all() and (saved_rows[2][np.arange(ROWS) % 10 != 3] == 2).all()
    assert_same(reloaded, saved_rows, "rows loaded back onto the disk tier")
    assert_same(refinal, final, "steps after the load")
    assert not np.array_equal(final[0], saved_rows[0])   # phase 2 changed rows: the comparison can fail
    # What serving's export reads from the files alone: the same rows, state and step counts.
    from hetu.serve.checkpoint_rows import read_shards
    rows, storage, state, steps = read_shards(str(fs / "ckpt"), "emb", with_state=True)
    assert storage == "fp32"
    assert_same([rows, state, steps], saved_rows[:3], "rows read from the files by hetu.serve")


@pytest.mark.parametrize("servers,where", [(2, "memory"), (3, "disk"), (1, "memory")])
def test_a_checkpoint_resumes_bit_for_bit(saved, servers, where):
    """The checkpoint loaded into a job of `servers` servers keeping the table `where`: the rows,
    state, step counts and versions equal the saving job's, and the same steps after it give the
    same table as the saving job's uninterrupted run."""
    kind, fs, job = saved
    folder = job.tmp.parent / f"load-{servers}-{where}"
    tier = ""
    if where == "disk":
        tier = fs / f"tier-{servers}"
        tier.mkdir()
    run_job(folder, servers, LOAD, dict(tier=str(tier), ckpt=str(fs / "ckpt")))
    saved_rows, final = arrays(job.tmp / "worker0.npz", 4)[:2]
    loaded, resumed = arrays(folder / "worker0.npz", 2)
    assert_same(loaded, saved_rows, f"rows loaded by {servers} servers ({where})")
    assert_same(resumed, final, f"steps after the load by {servers} servers ({where})")


@pytest.mark.parametrize("servers,where", [(SERVERS, "disk"), (1, "memory")])
def test_a_damaged_record_fails_the_load_naming_it(saved, servers, where):
    """One byte changed in a record of a cloned shard (a copy of the checkpoint that shares its
    blocks): the load, cloned back or read, fails in one line naming the file and the record."""
    kind, fs, job = saved
    if kind != "xfs":
        pytest.skip("a shard written whole holds no record checks (the records layout is a clone's)")
    damaged = fs / f"damaged-{servers}-{where}"
    subprocess.run(["cp", "-r", "--reflink=always", str(fs / "ckpt"), str(damaged)], check=True)
    path = damaged / f"emb.shard0-of-{SERVERS}.bin"
    with open(path, "r+b") as f:
        record_bytes, records_at = struct.unpack("<qq", f.read(112)[96:112])
        assert record_bytes == RECORD and records_at % 4096 == 0
        f.seek(records_at + 5 * record_bytes + 20)   # record 5 holds a stepped row
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte ^ 0x40]))
    tier = ""
    if where == "disk":
        tier = fs / f"tier-damaged-{servers}"
        tier.mkdir()
    folder = job.tmp.parent / f"damaged-{servers}-{where}"
    run_job(folder, servers, LOAD, dict(tier=str(tier), ckpt=str(damaged)))
    error = json.loads((folder / "worker0.json").read_text())
    assert f"record 5 of {path} is damaged" in error and "\n" not in error, error
