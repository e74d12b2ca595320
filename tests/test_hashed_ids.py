"""Hashed ids (`prepare ... --ids hashed`): the key hash against xxHash64's published test vectors
and a pure-Python reference, and every reader's keys against the reference applied to the raw
values of its file."""
import json
import struct
import sys

import numpy as np
import pytest

import jobs
from conftest import REPO
from hetu import _C
from hetu.data import generate_synthetic, load_dataset, prepare_avazu, prepare_criteo, prepare_movielens
from hetu.data import keys, store, synthetic_spec
from test_data_movielens_side import U_DATA, U_ITEM, U_USER, write as write_latin1
from test_data_readers import AVAZU_HEADER, CRITEO_ROWS, avazu_line, messy_criteo, write

MASK = (1 << 64) - 1
P1, P2, P3, P4, P5 = (0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
                      0x85EBCA77C2B2AE63, 0x27D4EB2F165667C5)


def rotl(x, r):
    return ((x << r) | (x >> (64 - r))) & MASK


def xxh64_round(acc, lane):
    return rotl((acc + lane * P2) & MASK, 31) * P1 & MASK


def xxh64(data, seed=0):
    """XXH64 as its specification (xxhash_spec.md) describes it, little-endian lanes."""
    n, p = len(data), 0
    if n >= 32:
        v = [(seed + P1 + P2) & MASK, (seed + P2) & MASK, seed, (seed - P1) & MASK]
        while p + 32 <= n:
            for i in range(4):
                v[i] = xxh64_round(v[i], int.from_bytes(data[p + 8 * i:p + 8 * i + 8], "little"))
            p += 32
        h = (rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18)) & MASK
        for lane in v:
            h = ((h ^ xxh64_round(0, lane)) * P1 + P4) & MASK
    else:
        h = (seed + P5) & MASK
    h = (h + n) & MASK
    while p + 8 <= n:
        h = (rotl(h ^ xxh64_round(0, int.from_bytes(data[p:p + 8], "little")), 27) * P1 + P4) & MASK
        p += 8
    if p + 4 <= n:
        h = (rotl(h ^ (int.from_bytes(data[p:p + 4], "little") * P1 & MASK), 23) * P2 + P3) & MASK
        p += 4
    while p < n:
        h = rotl(h ^ (data[p] * P5 & MASK), 11) * P1 & MASK
        p += 1
    h ^= h >> 33
    h = h * P2 & MASK
    h ^= h >> 29
    h = h * P3 & MASK
    return h ^ (h >> 32)


def key(field, value):
    """The key of a value (str as UTF-8, bytes, or an int as its 8 little-endian bytes)."""
    if isinstance(value, str):
        value = value.encode("utf-8")
    elif isinstance(value, (int, np.integer)):
        value = struct.pack("<q", int(value))
    signed = struct.unpack("<q", struct.pack("<Q", xxh64(struct.pack("<I", field) + value)))[0]
    return -2 if signed == -1 else signed


# XXH64, seed 0: the reference implementation's published values (xxHash's sanity checks and
# the python-xxhash documentation).
VECTORS = [(b"", 0xEF46DB3751D8E999), (b"a", 0xD24EC4F1A98C6E5B), (b"abc", 0x44BC2CF5AD770999),
           (b"xxhash", 0x32DD38952C4BC720),
           (b"Nobody inspects the spammish repetition", 0xFBCEA83C8A378BF1)]


@pytest.mark.parametrize("data, expected", VECTORS)
def test_reference_matches_the_published_vectors(data, expected):
    assert xxh64(data) == expected


def test_reference_matches_the_xxhash_library_when_installed():
    xxhash = pytest.importorskip("xxhash")
    rng = np.random.default_rng(0)
    for n in list(range(70)) + [255, 256, 1000]:
        data = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert xxh64(data) == xxhash.xxh64_intdigest(data), n


def test_native_hash_equals_the_reference():
    rng = np.random.default_rng(1)
    # lengths across every tail case and across the native stack buffer (252 value bytes)
    for n in list(range(80)) + [250, 251, 252, 253, 300, 4096]:
        field = int(rng.integers(0, 1 << 32))
        value = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
        assert _C.key_hash(field, value) == key(field, value), (field, n)
    values = ["", "a", "caf\u00e9", "68fd1e64", "\ufffd\ufffd"]
    assert list(_C.key_hash_values(7, values)) == [key(7, v) for v in values]
    assert list(keys.hash_values(7, values)) == [key(7, v) for v in values]
    ids = rng.integers(-(1 << 63), 1 << 63, (5, 3), dtype=np.int64)
    hashed = keys.hash_ids(3, ids)
    assert hashed.shape == ids.shape and hashed.dtype == np.int64
    assert hashed.tolist() == [[key(3, int(i)) for i in row] for row in ids]
    assert _C.KEY_HASH_NAME == keys.HASH_NAME


def test_the_field_comes_first_as_four_little_endian_bytes():
    assert _C.key_hash(0x04030201, b"v") == struct.unpack(
        "<q", struct.pack("<Q", xxh64(b"\x01\x02\x03\x04v")))[0]
    assert _C.key_hash(0, "7") != _C.key_hash(1, "7")


def hashed_meta(out):
    meta = json.loads((out / "meta.json").read_text())
    assert meta["ids"] == "hashed" and meta["hash"] == keys.HASH_NAME
    assert meta["num_embeddings"] == 0
    assert meta["field_sizes"] == meta["field_offsets"] == [0] * meta["num_fields"]
    return meta


def test_criteo_keys_are_the_hashes_of_the_raw_columns(tmp_path):
    src = write(tmp_path, "train.txt", "".join(CRITEO_ROWS * 5))
    out = prepare_criteo(src, tmp_path / "out", progress=False, ids="hashed")
    meta = hashed_meta(out)
    assert meta["encoding"]["categorical"].startswith("key of the column's UTF-8 text")
    expected = [[key(f, v) for f, v in enumerate(line.rstrip("\n").split("\t")[14:])]
                for line in CRITEO_ROWS * 5]
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), expected)
    indexed = prepare_criteo(src, tmp_path / "indexed", progress=False)
    for name in ("dense.npy", "labels.npy"):
        np.testing.assert_array_equal(np.load(out / name), np.load(indexed / name))
    assert "ids" not in json.loads((indexed / "meta.json").read_text())
    assert load_dataset(indexed).meta.ids == "indexed"
    data = load_dataset(out)
    assert data.meta.ids == "hashed" and len(data.train) + len(data.val) == 30
    check = data.train.checker("sparse")
    check(np.asarray(data.train.sparse[:4]), np.arange(4))
    with pytest.raises(ValueError, match=r"--ids hashed .*dynamic tables"):
        data.meta.fields
    with pytest.raises(ValueError, match="min_count"):
        prepare_criteo(src, tmp_path / "rare", progress=False, ids="hashed", min_count=2)


class _PythonOnly:
    """The native encoder refusing every chunk, so that the Python parser reads the whole file."""

    def __init__(self, encoder):
        self.encoder = encoder

    def __getattr__(self, name):
        return getattr(self.encoder, name)

    def check_chunk(self, text, max_rows):
        return -1

    def hash_chunk(self, text, max_rows):
        return None


@pytest.mark.parametrize("rows", [None, 250])
def test_native_and_python_parsers_write_the_same_keys(tmp_path, monkeypatch, rows):
    from hetu.data import tabular
    src = tmp_path / "train.txt"
    src.write_bytes(messy_criteo(np.random.default_rng(0), 600))
    mixed = prepare_criteo(src, tmp_path / "mixed", progress=False, ids="hashed", rows=rows,
                           skip_bad_lines=True, chunk_bytes=4096, log=open(tmp_path / "log", "w"))
    native = tabular.click_log_encoder
    monkeypatch.setattr(tabular, "click_log_encoder", lambda layout: _PythonOnly(native(layout)))
    python = prepare_criteo(src, tmp_path / "python", progress=False, ids="hashed", rows=rows,
                            skip_bad_lines=True, chunk_bytes=4096, log=open(tmp_path / "log", "w"))
    for name in ("dense.npy", "sparse.npy", "labels.npy"):
        np.testing.assert_array_equal(np.load(mixed / name), np.load(python / name))
    meta = [json.loads((out / "meta.json").read_text()) for out in (mixed, python)]
    assert meta[0] == meta[1]
    # the non-ASCII value of line 18 (C1 = café) is hashed as its UTF-8 bytes
    sparse = np.load(python / "sparse.npy")
    assert key(0, "caf\u00e9") in sparse[:, 0]


def test_avazu_keys(tmp_path):
    rows = [avazu_line(10000000 + i, click, hour, site)
            for i, (click, hour, site) in enumerate([
                (0, "14102100", "s1"), (1, "14102100", "s2"), (0, "14102101", "s1"), (0, "14102100", "")])]
    out = prepare_avazu(write(tmp_path, "train", AVAZU_HEADER + "".join(rows)), tmp_path / "out",
                        progress=False, ids="hashed")
    meta = hashed_meta(out)
    assert meta["field_names"][0] == "hour"
    expected = [[key(f, v) for f, v in enumerate(line.rstrip("\n").split(",")[2:])] for line in rows]
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), expected)
    np.testing.assert_array_equal(np.load(out / "labels.npy")[:, 0], [0, 1, 0, 0])


def test_movielens_keys_with_the_genres_bag(tmp_path):
    out = prepare_movielens(write_latin1(tmp_path, "u.data", U_DATA), tmp_path / "out",
                            users_path=write_latin1(tmp_path, "u.user", U_USER),
                            items_path=write_latin1(tmp_path, "u.item", U_ITEM),
                            shuffle_seed=None, progress=False, ids="hashed")
    meta = hashed_meta(out)
    assert meta["field_names"] == ["user", "item", "gender", "age", "occupation", "zip", "year", "genres"]
    assert meta["field_slots"] == [1] * 7 + [4] and meta["bag_fields"] == ["genres"]
    # the raw values, read off the files by hand: u.user is id|age|gender|occupation|zip
    users = {22: ("M", "25", "writer", "4"), 186: ("F", "39", "executive", "0"), 196: ("M", "49", "writer", "5")}
    items = {242: ("1997", ("Comedy",)), 302: ("1997", ("Crime", "Film-Noir", "Mystery", "Thriller")),
             377: ("unknown", ("Children's", "Comedy"))}
    expected = []
    for line in U_DATA.splitlines():
        user, item = (int(v) for v in line.split("\t")[:2])
        year, genres = items[item]
        row = [key(0, str(user)), key(1, str(item))] + [key(2 + f, v) for f, v in enumerate(users[user])]
        row += [key(6, year)] + [key(7, g) for g in genres] + [store.BAG_PADDING] * (4 - len(genres))
        expected.append(row)
    np.testing.assert_array_equal(np.load(out / "sparse.npy"), expected)
    data = load_dataset(out)
    values, offsets = data.train.bag("genres")
    assert offsets.tolist() == [0, 1, 5, 7, 9]
    checker = data.train.checker("sparse")
    checker(np.asarray(data.train.sparse), np.arange(len(data.train)))
    bad = np.array(data.train.sparse[:1])
    bad[0, 0] = store.BAG_PADDING
    with pytest.raises(ValueError, match=r"column 0 \(user\): -1 is the padding \(-1\) in field 0"):
        checker(bad, np.arange(1))


@pytest.mark.parametrize("shape", ["criteo", "movielens", "criteo-multihot"])
def test_synthetic_keys_are_the_hashes_of_the_indexed_ids(tmp_path, shape):
    params = dict(rows=600, scale=1e-4 if shape == "criteo-multihot" else None, hotness_scale=0.02)
    params = {k: v for k, v in params.items() if v is not None}
    spec = synthetic_spec(shape, **params)
    indexed = generate_synthetic(tmp_path / "indexed", spec, progress=False)
    hashed = generate_synthetic(tmp_path / "hashed", spec, progress=False, ids="hashed")
    meta = hashed_meta(hashed)
    assert meta["source"]["spec"]["ids"] == "hashed"
    indexed_meta = json.loads((indexed / "meta.json").read_text())
    assert "ids" not in indexed_meta["source"]["spec"] and "ids" not in indexed_meta
    for name in ("dense.npy", "labels.npy"):
        np.testing.assert_array_equal(np.load(hashed / name), np.load(indexed / name))
    ids = np.load(indexed / "sparse.npy")
    column_field = np.repeat(np.arange(indexed_meta["num_fields"]),
                             indexed_meta.get("field_slots", [1] * indexed_meta["num_fields"]))
    local = ids - np.asarray(indexed_meta["field_offsets"])[column_field]
    expected = [[key(int(f), int(v)) for f, v in zip(column_field, row)] for row in local[:50]]
    got = np.load(hashed / "sparse.npy")
    np.testing.assert_array_equal(got[:50], expected)
    for f in range(indexed_meta["num_fields"]):   # the rest through the native hash
        np.testing.assert_array_equal(got[:, column_field == f], keys.hash_ids(f, local[:, column_field == f]))


def run_cli(*args):
    return jobs.run([sys.executable, "-m", "hetu.data.prepare", *args], capture_output=True, text=True,
                    timeout=300)


def test_cli_and_training_refusal(tmp_path):
    src = write(tmp_path, "train.txt", "".join(CRITEO_ROWS * 5))
    proc = run_cli("criteo", "--input", str(src), "--output", str(tmp_path / "c"), "--ids", "hashed", "--quiet")
    assert proc.returncode == 0, proc.stderr
    assert '"ids": "hashed"' in proc.stdout
    hashed_meta(tmp_path / "c")
    proc = run_cli("synthetic", "--output", str(tmp_path / "s"), "--rows", "300", "--ids", "hashed", "--quiet")
    assert proc.returncode == 0, proc.stderr
    hashed_meta(tmp_path / "s")
    train = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress", "--model",
                      "wdl_criteo", "--data-dir", str(tmp_path / "c")], capture_output=True, text=True, timeout=300)
    assert train.returncode != 0
    assert "--ids hashed" in train.stderr and "dynamic tables" in train.stderr, train.stderr
    assert "Traceback" not in train.stderr
