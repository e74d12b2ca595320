"""Synthetic sessions: determinism, ranges, the independent generator left as it was, and the
short-distance reuse that sessions add."""
import json

import numpy as np
import pytest

from data_digest import ARRAYS, arrays_digest
from hetu.data import generate_synthetic, load_dataset, reuse_distances, reuse_share_within
from hetu.data.cache import synthetic_dataset_dir
from hetu.data.synthetic import SHAPES, OpenSessions, SyntheticSpec, synthetic_spec


def test_independent_generator_is_unchanged(tmp_path):
    """Digests and cache folders of law 1's generator as it was before sessions existed."""
    criteo = generate_synthetic(tmp_path / "c", rows=5000, law=1, progress=False)
    movielens = generate_synthetic(tmp_path / "m", shape="movielens", rows=5000, drift=0.05,
                                   law=1, progress=False)
    assert arrays_digest(criteo) == \
        "24b6276d87def5f1b85090772b64ed7d837d33cb821cbb3041a57873d326776b"
    assert arrays_digest(movielens) == \
        "378ee62999ae91c301ce6167dbeb3f23d8f91d02adf5fb215c37d51af3a1f6e5"
    assert synthetic_dataset_dir("criteo", "/x", rows=1000, law=1)[0].name == \
        "synthetic-criteo-4b10abf5fd1e"
    assert "sessions" not in json.loads((criteo / "meta.json").read_text())["source"]["spec"]


def test_same_spec_same_bytes_other_seed_differs(tmp_path):
    a = generate_synthetic(tmp_path / "a", rows=3000, sessions=True, progress=False)
    b = generate_synthetic(tmp_path / "b", rows=3000, sessions=True, progress=False)
    c = generate_synthetic(tmp_path / "c", rows=3000, sessions=True, seed=1, progress=False)
    for name in ARRAYS:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "sparse.npy").read_bytes() != (c / "sparse.npy").read_bytes()


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_session_ids_are_int64_inside_their_fields(tmp_path, shape):
    # more rows than one chunk (1 << 17; 8192 for criteo-multihot), so sessions carry over a
    # chunk boundary
    rows = 140_000 if shape == "movielens" else 20_000
    data = load_dataset(generate_synthetic(tmp_path / shape, shape=shape, rows=rows,
                                           sessions=True, progress=False))
    meta = data.meta
    assert meta.name == f"synthetic-{shape}-sessions"
    low = np.array(meta.field_offsets)[meta.column_fields()]
    high = low + np.array(meta.field_sizes)[meta.column_fields()]
    for part in (data.train, data.val):
        assert part.sparse.dtype == np.int64
        assert (part.sparse >= low).all() and (part.sparse < high).all()


def test_only_the_session_fields_change(tmp_path):
    """Sessions draw from a stream of their own: the other fields and the dense features are
    those of the independent dataset with the same parameters."""
    independent = load_dataset(generate_synthetic(tmp_path / "i", rows=4000, progress=False))
    sessions = load_dataset(generate_synthetic(tmp_path / "s", rows=4000, sessions=True,
                                               progress=False))
    user_fields = list(SHAPES["criteo"].session_fields)
    assert user_fields == [2, 3, 11, 15, 20]
    a, b = np.asarray(independent.train.sparse), np.asarray(sessions.train.sparse)
    assert (np.delete(a, user_fields, 1) == np.delete(b, user_fields, 1)).all()
    assert (a[:, user_fields] != b[:, user_fields]).any()
    assert (np.asarray(independent.train.dense) == np.asarray(sessions.train.dense)).all()


def sequential_sessions(spec, draw_ids, chunks, seed):
    """The session model sample by sample, on the same random draws as OpenSessions."""
    state_rng = np.random.default_rng([seed, 0])
    current = draw_ids(state_rng, np.zeros(spec.concurrent_sessions, dtype=np.int64))
    slot, first_row, out = 0, 0, []
    for index, n in enumerate(chunks):
        rng = np.random.default_rng([seed, 1, index])
        switches = rng.random(n) < spec.session_switch
        chosen = rng.integers(0, spec.concurrent_sessions, n)
        opens = rng.random(n) < 1.0 / spec.session_length
        new_ids = iter(draw_ids(rng, first_row + np.flatnonzero(opens)))
        for t in range(n):
            if switches[t]:
                slot = chosen[t]
            if opens[t]:
                current[slot] = next(new_ids)
            out.append(current[slot].copy())
        first_row += n
    return np.array(out)


def test_vectorised_sessions_equal_the_sequential_model():
    spec = SyntheticSpec(sessions=True, session_length=7, concurrent_sessions=3,
                         session_switch=0.3)

    def draw_ids(rng, rows):   # the opening position and a random id per session
        return np.stack([rows, rng.integers(0, 1 << 40, len(rows))], axis=1)

    chunks, seed = (1000, 1, 1999, 500), 5
    sessions = OpenSessions(spec, draw_ids, np.random.default_rng([seed, 0]))
    vectorised, first_row = [], 0
    for index, n in enumerate(chunks):
        vectorised.append(sessions.next_ids(np.random.default_rng([seed, 1, index]),
                                            first_row, n))
        first_row += n
    vectorised = np.concatenate(vectorised)
    expected = sequential_sessions(spec, draw_ids, chunks, seed)
    assert (vectorised == expected).all()
    # sessions opened over the whole stream, each at a sample of its own
    opened_at = np.unique(vectorised[:, 0])
    assert len(opened_at) > sum(chunks) / spec.session_length / 2
    assert (vectorised[opened_at[opened_at > 0], 0] == opened_at[opened_at > 0]).all()


def user_reuse_within(tmp_path, name, window=256, **params):
    data = load_dataset(generate_synthetic(tmp_path / name, shape="movielens", rows=20_000,
                                           progress=False, **params))
    return reuse_share_within(np.asarray(data.train.sparse)[:, 0], window)


def test_sessions_reuse_ids_at_short_distance(tmp_path):
    independent = user_reuse_within(tmp_path, "i")
    sessions = user_reuse_within(tmp_path, "s", sessions=True)
    # one-sample sessions are independent draws again: the measure tells the two apart
    one_sample = user_reuse_within(tmp_path, "o", sessions=True, session_length=1)
    assert sessions > independent + 0.25, (sessions, independent)
    assert abs(one_sample - independent) < 0.05, (one_sample, independent)


def test_criteo_rows_reuse_more_within_a_batch_window(tmp_path):
    """The rows stream as a worker's cache sees it (all 26 fields) also reuses more."""
    independent = load_dataset(generate_synthetic(tmp_path / "i", rows=20_000, progress=False))
    sessions = load_dataset(generate_synthetic(tmp_path / "s", rows=20_000, sessions=True,
                                               progress=False))
    a = reuse_share_within(np.asarray(independent.train.sparse), 256)
    b = reuse_share_within(np.asarray(sessions.train.sparse), 256)
    assert b > a + 0.03, (a, b)


def test_reuse_distances_by_hand():
    assert sorted(reuse_distances([5, 7, 5, 5, 9, 7]).tolist()) == [1, 2, 4]
    # two fields: an id repeated within a sample counts once
    rows = np.array([[1, 2], [3, 3], [1, 3]])
    assert sorted(reuse_distances(rows).tolist()) == [1, 2]


def test_names_and_parameters(tmp_path, monkeypatch):
    monkeypatch.setenv("HETU_DATA_HOME", str(tmp_path))
    data = load_dataset("synthetic-avazu-sessions", rows=2000, session_length=20.0)
    assert data.path.name.startswith("synthetic-avazu-sessions-")
    spec = data.meta.info["source"]["spec"]
    assert spec["sessions"] is True and spec["session_length"] == 20.0
    assert load_dataset("synthetic-avazu", rows=2000).path != data.path
    with pytest.raises(ValueError, match="sessions"):
        load_dataset("synthetic-kddcup-sessions")
    with pytest.raises(ValueError, match="session"):
        synthetic_spec(sessions=True, concurrent_sessions=0)
