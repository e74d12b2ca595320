"""Open-world drift (``prepare synthetic --ids hashed --drift R``): distinct keys grow with the
rows, old keys fade, memory stays bounded, the same seed gives the same data; and drift with
indexed ids keeps the bounded rotation it always had."""
import json
import tracemalloc

import numpy as np
import pytest

from data_digest import arrays_digest
from hetu.data import generate_synthetic
from hetu.data.prepare import main as prepare_main
from hetu.data.synthetic import DRIFT_ROWS, HiddenModel, synthetic_spec

WINDOW = 10_000   # rows of the first window; the stream has four
# each field's values replaced 300 times per million rows: a value lives 3,333 rows, so the
# stream's 40,000 rows see each field's values replaced 12 times over
DRIFT = 300.0
SMALL = dict(scale=0.001, law=2)   # 26 fields of 3 to 10,131 values


def stream_keys(drift, rows=4 * WINDOW, **params):
    """[rows, 26] keys of the hashed Criteo-shaped stream, chunk by chunk as the generator
    writes them."""
    model = HiddenModel(synthetic_spec("criteo", rows=rows, ids="hashed", drift=drift,
                                       **{**SMALL, **params}))
    chunks = []
    for index, first_row in enumerate(range(0, rows, model.chunk_rows)):
        n = min(model.chunk_rows, rows - first_row)
        chunks.append(model.keys(model.generate_chunk(index, first_row, n)[1]))
    return np.concatenate(chunks), model.field_sizes


def distinct_per_field(keys):
    return np.array([len(np.unique(column)) for column in keys.T])


@pytest.fixture(scope="module")
def open_world():
    return stream_keys(DRIFT)


@pytest.fixture(scope="module")
def closed_world():
    return stream_keys(0.0)


def test_distinct_keys_grow_with_the_rows_in_every_field(open_world, closed_world):
    keys, sizes = open_world
    first, whole = distinct_per_field(keys[:WINDOW]), distinct_per_field(keys)
    assert np.all(whole > 2.5 * first), (whole / first).round(2)
    # far beyond the fields' sizes: these are new values, not a field's values seen at last
    assert np.all(whole > 3 * sizes), (whole / sizes).round(2)
    keys, sizes = closed_world
    first, whole = distinct_per_field(keys[:WINDOW]), distinct_per_field(keys)
    assert np.all(whole <= sizes) and np.all(whole < 2.5 * first), (whole / first).round(2)
    assert np.sum(whole == sizes) >= 20   # the small fields saturated


def test_old_keys_fade(open_world, closed_world):
    """The first window's keys, against the last window's: gone with drift, mostly there
    without it."""
    def shared_share(keys):
        early, late = keys[:WINDOW], keys[-WINDOW:]
        return np.array([len(np.intersect1d(e, l)) / len(np.unique(e))
                         for e, l in zip(early.T, late.T)])
    assert np.all(shared_share(open_world[0]) < 0.01)
    assert np.all(shared_share(closed_world[0]) > 0.4)


def test_values_are_born_hottest_and_cool_one_rank_a_birth():
    """The documented law: at row i, rank r is first + b(i) + size - 1 - r, with
    b(i) = floor(i R size / DRIFT_ROWS)."""
    model = HiddenModel(synthetic_spec("criteo", rows=10**6, ids="hashed", drift=0.5, **SMALL))
    field = 2
    size = int(model.field_sizes[field])
    births_a_row = 0.5 * size / DRIFT_ROWS
    rows = np.array([[0], [1000], [DRIFT_ROWS]])
    values = model.rank_values(field, np.array([[0, 1, size - 1]] * 3), rows)
    first = model.first_values[field]
    born = np.floor(rows * births_a_row).astype(np.int64)
    assert np.array_equal(values, first + born + size - 1 - np.array([0, 1, size - 1]))
    # the value born hottest at row 1000 has cooled to rank 1 one birth later
    next_birth = int(np.ceil((born[1, 0] + 1) / births_a_row))
    assert model.rank_values(field, np.array([[1]]), np.array([[next_birth]]))[0, 0] == \
        values[1, 0]


def test_generator_memory_does_not_grow_with_the_stream():
    """The model holds no per-value state: a model for 10^12 rows is as small as one for 10^5,
    and chunks ever further along the stream, each of new keys, neither grow what the model
    holds nor the peak of a chunk."""
    def spec(rows):
        return synthetic_spec("criteo", rows=rows, ids="hashed", drift=DRIFT, **SMALL)
    HiddenModel(spec(10**5))   # once untraced: the first model also fills import-time caches
    tracemalloc.start()
    try:
        held, models = [], []
        for rows in (10**5, 10**12):
            before = tracemalloc.get_traced_memory()[0]
            models.append(HiddenModel(spec(rows)))
            held.append(tracemalloc.get_traced_memory()[0] - before)
        assert held[1] < 1.05 * held[0], held
        model = models[-1]
        first_keys = np.unique(model.keys(model.generate_chunk(0, 0, WINDOW)[1]))
        start = tracemalloc.get_traced_memory()[0]
        peaks = []
        for index, first_row in enumerate((0, 10**7, 10**9, 10**11)):
            tracemalloc.reset_peak()
            keys = model.keys(model.generate_chunk(index, first_row, WINDOW)[1])
            shared = len(np.intersect1d(first_keys, keys))
            peaks.append(tracemalloc.get_traced_memory()[1] - start)
            assert (shared == len(first_keys)) if first_row == 0 else shared == 0, first_row
            del keys
        grown = tracemalloc.get_traced_memory()[0] - start
    finally:
        tracemalloc.stop()
    assert max(peaks) < 1.2 * peaks[0], peaks
    assert grown < 64 << 10, f"{grown} bytes held after the chunks"


def test_same_seed_same_bytes_other_seed_other_keys(tmp_path):
    def folder(name, seed):
        return generate_synthetic(tmp_path / name, rows=3000, ids="hashed", drift=DRIFT,
                                  seed=seed, progress=False, **SMALL)
    a, b, c = folder("a", 0), folder("b", 0), folder("c", 1)
    assert arrays_digest(a) == arrays_digest(b)
    sparse_a, sparse_c = np.load(a / "sparse.npy"), np.load(c / "sparse.npy")
    # the seed picks the values too, not only the draws: hardly a key in common
    assert len(np.intersect1d(sparse_a[:, 2], sparse_c[:, 2])) < 10


def test_open_world_with_sessions_and_bags(tmp_path):
    folder = generate_synthetic(tmp_path / "m", shape="criteo-multihot", rows=3000,
                                scale=0.0001, sessions=True, ids="hashed", drift=DRIFT,
                                progress=False)
    sparse = np.load(folder / "sparse.npy")
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["ids"] == "hashed" and meta["source"]["spec"]["law"] == 2
    assert sparse.shape == (3000, 214) and not np.any(sparse == -1)


# sha256 of dense, sparse and labels written before open-world drift existed: drift with
# indexed ids (law 1 is pinned by test_data_bounded.py) keeps its bounded rotation byte for byte
ROTATION_DIGESTS = {
    "criteo-law2": (dict(rows=5000, scale=0.001, drift=0.1, law=2),
                    "d79a7e4e438fcb7013cf7d0e97cb9af9459d110756e18cb9fc9335d375639058"),
    "avazu-law2-sessions": (dict(shape="avazu", rows=3000, drift=0.2, law=2, sessions=True,
                                 seed=5),
                            "bf7aa0bfcbc1537e2f5293b01f2b2480bf73884d837acb41056180d89df49ccb"),
}


@pytest.mark.parametrize("case", sorted(ROTATION_DIGESTS))
def test_indexed_drift_keeps_its_bytes(tmp_path, case):
    params, expected = ROTATION_DIGESTS[case]
    assert arrays_digest(generate_synthetic(tmp_path / case, progress=False, **params)) == \
        expected


def test_prepare_command_line(tmp_path, capsys):
    output = tmp_path / "d"
    assert prepare_main(["synthetic", "--output", str(output), "--rows", "2000", "--scale",
                         "0.001", "--ids", "hashed", "--drift", "300", "--quiet"]) == 0
    spec = json.loads((output / "meta.json").read_text())["source"]["spec"]
    assert spec["drift"] == 300 and spec["ids"] == "hashed" and spec["law"] == 2
    assert prepare_main(["synthetic", "--output", str(tmp_path / "e"), "--rows", "2000",
                         "--ids", "hashed", "--drift", "1", "--law", "1"]) == 2
    assert "law 2" in capsys.readouterr().err
