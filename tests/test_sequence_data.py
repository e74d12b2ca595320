"""User histories for sequential models (hetu.data.sequences): MovieLens ratings -> a sequences
folder (time order, leave-one-out, left-aligned windows, items most frequent first), the synthetic
long-tail generator, the named datasets, the folder checks, and the counter-based negatives."""
import json
import shutil

import numpy as np
import pytest

from hetu.data import cache, load_dataset, sequences
from hetu.data.keys import hash_ids, hash_values
from hetu.data.prepare import main as prepare_main
from hetu.data.sequences import (SequenceData, draw_negatives, generate_synthetic_sequences, in_batch_negatives,
                                 load_sequences, prepare_movielens_sequences, shared_negatives)

# user item rating timestamp, users interleaved. User 1: items at 50, 100, 100 (10 before 30: file
# order), 200; user 2: three items, two tied at 10; user 3: two items (dropped: item 50 is only
# theirs, so it is no item); user 4: three.
RATINGS = [(1, 10, 5, 100), (2, 20, 4, 10), (1, 20, 3, 50), (3, 10, 5, 1), (2, 10, 1, 10), (4, 30, 3, 5),
           (1, 30, 4, 100), (3, 50, 5, 2), (2, 60, 2, 5), (4, 20, 3, 6), (1, 40, 2, 200), (4, 60, 2, 7)]
# kept: 20 x3, then 10, 30, 60 x2 each (by raw id), then 40
ITEM_IDS = [20, 10, 30, 60, 40]
USER_IDS = [1, 2, 4]
HISTORIES = {1: ([0, 1, 2, 4], [50, 100, 100, 200]), 2: ([3, 0, 1], [5, 10, 10]), 4: ([2, 0, 3], [5, 6, 7])}


def write_ratings(path, rows, delimiter="\t"):
    path.write_text("".join(delimiter.join(str(v) for v in row) + "\n" for row in rows))
    return path


def prepare(tmp_path, max_length, rows=RATINGS, name="u.data", delimiter="\t"):
    source = write_ratings(tmp_path / name, rows, delimiter)
    return prepare_movielens_sequences(source, tmp_path / f"out-{name}-{max_length}", max_length, progress=False)


def test_every_array_of_a_small_file(tmp_path):
    data = load_sequences(prepare(tmp_path, 2))
    assert isinstance(data, SequenceData)
    m = data.meta
    assert (m.kind, m.num_items, m.num_users, m.max_length, m.num_interactions) == ("sequences", 5, 3, 2, 10)
    info = json.loads((data.path / "meta.json").read_text())
    assert info["kind"] == "sequences" and info["ids"] == "indexed" and info["timestamps"] is True
    assert info["source"]["users_dropped"] == 1 and info["source"]["ratings"] == len(RATINGS)
    assert data.item_ids.tolist() == ITEM_IDS and data.user_ids.tolist() == USER_IDS
    # training: the last L+1 = 3 of the history without its last item, left-aligned
    assert data.train.items.tolist() == [[0, 1, 2], [3, 0, -1], [2, 0, -1]]
    assert data.train.times.tolist() == [[50, 100, 100], [5, 10, 0], [5, 6, 0]]
    # evaluation: the L = 2 items before the last, and the last
    assert data.val.items.tolist() == [[1, 2], [3, 0], [2, 0]]
    assert data.val.times.tolist() == [[100, 100], [5, 10], [5, 6]]
    assert data.val.target.tolist() == [4, 1, 3]
    assert data.val.target_time.tolist() == [200, 10, 7]
    for array in (data.train.items, data.train.times, data.val.items, data.val.target):
        assert array.dtype == np.int64 and isinstance(array, np.memmap)
    assert len(data.train) == len(data.val) == 3


def test_truncation_and_padding(tmp_path):
    short = load_sequences(prepare(tmp_path, 1))    # the last 2 and the last 1
    assert short.train.items.tolist() == [[1, 2], [3, 0], [2, 0]]
    assert short.train.times.tolist() == [[100, 100], [5, 10], [5, 6]]
    assert short.val.items.tolist() == [[2], [0], [0]]
    assert short.val.target.tolist() == [4, 1, 3]
    long = load_sequences(prepare(tmp_path, 4))     # everything, padded on the right
    assert long.train.items.tolist() == [[0, 1, 2, -1, -1], [3, 0, -1, -1, -1], [2, 0, -1, -1, -1]]
    assert long.train.times.tolist() == [[50, 100, 100, 0, 0], [5, 10, 0, 0, 0], [5, 6, 0, 0, 0]]
    assert long.val.items.tolist() == [[0, 1, 2, -1], [3, 0, -1, -1], [2, 0, -1, -1]]


def reference(rows, max_length):
    """The folder's arrays by the definition, user by user (Python's sort is stable)."""
    by_user = {}
    for user, item, _, ts in rows:
        by_user.setdefault(user, []).append((item, ts))
    kept = {u: sorted(h, key=lambda e: e[1]) for u, h in sorted(by_user.items()) if len(h) >= 3}
    counts = {}
    for h in kept.values():
        for item, _ in h:
            counts[item] = counts.get(item, 0) + 1
    order = sorted(counts, key=lambda i: (-counts[i], i))
    index = {item: k for k, item in enumerate(order)}
    L, out = max_length, {name: [] for name in ("ti", "tt", "vi", "vt", "target", "target_time")}
    for h in kept.values():
        items, times = [index[i] for i, _ in h], [t for _, t in h]
        train_i, train_t, val_i, val_t = items[:-1][-(L + 1):], times[:-1][-(L + 1):], items[:-1][-L:], times[:-1][-L:]
        out["ti"].append(train_i + [-1] * (L + 1 - len(train_i)))
        out["tt"].append(train_t + [0] * (L + 1 - len(train_t)))
        out["vi"].append(val_i + [-1] * (L - len(val_i)))
        out["vt"].append(val_t + [0] * (L - len(val_t)))
        out["target"].append(items[-1])
        out["target_time"].append(times[-1])
    return order, list(kept), out


@pytest.mark.parametrize("max_length", [1, 3, 8])
def test_random_ratings_against_the_definition(tmp_path, max_length):
    rng = np.random.default_rng(max_length)
    rows = [(int(u), int(i), 3, int(t)) for u, i, t in zip(rng.integers(1, 40, 600), rng.integers(1, 60, 600),
                                                             rng.integers(0, 30, 600))]   # many ties
    data = load_sequences(prepare(tmp_path, max_length, rows))
    order, users, want = reference(rows, max_length)
    assert data.item_ids.tolist() == order and data.user_ids.tolist() == users
    assert data.train.items.tolist() == want["ti"] and data.train.times.tolist() == want["tt"]
    assert data.val.items.tolist() == want["vi"] and data.val.times.tolist() == want["vt"]
    assert data.val.target.tolist() == want["target"] and data.val.target_time.tolist() == want["target_time"]


def test_ratings_dat_and_a_folder_read_the_same(tmp_path):
    tab = load_sequences(prepare(tmp_path, 2))
    dat = load_sequences(prepare(tmp_path, 2, name="ratings.dat", delimiter="::"))
    folder = tmp_path / "ml-1m"
    folder.mkdir()
    write_ratings(folder / "ratings.dat", RATINGS, "::")
    from_folder = load_sequences(prepare_movielens_sequences(folder, tmp_path / "f", 2, progress=False))
    for other in (dat, from_folder):
        for name in ("train_items", "train_times", "val_items", "val_times", "val_target", "val_target_time"):
            assert np.load(tab.path / f"{name}.npy").tolist() == np.load(other.path / f"{name}.npy").tolist(), name
    with pytest.raises(FileNotFoundError, match="no MovieLens ratings file"):
        prepare_movielens_sequences(tmp_path / "out-u.data-2", tmp_path / "g", 2)


def test_the_command_line(tmp_path, capsys):
    source = write_ratings(tmp_path / "u.data", RATINGS)
    out = tmp_path / "cli"
    assert prepare_main(["movielens", "--sequences", "--max-length", "2", "--input", str(tmp_path),
                         "--output", str(out), "--quiet"]) == 0
    assert '"num_users": 3' in capsys.readouterr().out
    assert load_dataset(out).train.items.tolist() == [[0, 1, 2], [3, 0, -1], [2, 0, -1]]
    assert prepare_main(["movielens", "--sequences", "--input", str(source), "--output", str(out)]) == 2
    assert "already exists" in capsys.readouterr().err
    assert prepare_main(["movielens", "--sequences", "--users", "u.user", "--input", str(source),
                         "--output", str(tmp_path / "x")]) == 2
    assert "--users do not apply to --sequences" in capsys.readouterr().err
    assert prepare_main(["movielens", "--max-length", "5", "--input", str(source),
                         "--output", str(tmp_path / "y")]) == 2
    # the rating rows are written as before
    assert prepare_main(["movielens", "--time-order", "--input", str(source), "--output", str(tmp_path / "rows"),
                         "--quiet"]) == 0
    assert load_dataset(tmp_path / "rows").meta.num_rows == len(RATINGS)
    assert prepare_main(["synthetic-sequences", "--users", "30", "--items", "200", "--max-length", "10",
                         "--output", str(tmp_path / "syn"), "--quiet"]) == 0
    assert load_dataset(tmp_path / "syn").train.items.shape == (30, 11)


def test_hashed_ids_hold_each_items_key_in_place_of_its_index(tmp_path, capsys):
    source = write_ratings(tmp_path / "u.data", RATINGS)
    indexed = load_sequences(prepare(tmp_path, 2))
    assert prepare_main(["movielens", "--sequences", "--max-length", "2", "--ids", "hashed", "--input", str(source),
                         "--output", str(tmp_path / "hashed"), "--quiet"]) == 0
    hashed = load_dataset(tmp_path / "hashed")
    assert hashed.meta.ids == "hashed" and indexed.item_keys is None
    keys = hash_values(0, [str(int(i)) for i in indexed.item_ids])
    assert hashed.item_keys.tolist() == keys.tolist() and hashed.item_ids.tolist() == indexed.item_ids.tolist()
    for name in ("train_items", "val_items", "val_target"):
        want = np.load(indexed.path / f"{name}.npy")
        got = np.load(hashed.path / f"{name}.npy")
        assert got.tolist() == np.where(want >= 0, keys[np.maximum(want, 0)], -1).tolist(), name
        assert hashed.catalog_index(got).tolist() == want.tolist(), name
    synthetic = load_sequences(generate_synthetic_sequences(tmp_path / "s", users=50, items=400, ids="hashed"))
    plain = load_sequences(generate_synthetic_sequences(tmp_path / "p", users=50, items=400))
    assert synthetic.item_keys.tolist() == hash_ids(0, plain.item_ids).tolist()
    assert synthetic.catalog_index(synthetic.train.items).tolist() == plain.train.items.tolist()


def test_bad_folders_are_named(tmp_path):
    good = prepare(tmp_path, 2)
    broken = tmp_path / "broken"

    def copy():
        if broken.exists():
            shutil.rmtree(broken)
        shutil.copytree(good, broken)
        return broken

    (copy() / "val_target.npy").unlink()
    with pytest.raises(ValueError, match=r"broken/val_target.npy is missing"):
        load_dataset(broken)
    np.save(copy() / "train_items.npy", np.zeros((3, 2), np.int64))
    with pytest.raises(ValueError, match=r"broken/train_items.npy is int64\[3, 2\], meta.json says int64\[3, 3\]"):
        load_dataset(broken)
    np.save(copy() / "val_times.npy", np.zeros((3, 2), np.int32))
    with pytest.raises(ValueError, match=r"val_times.npy is int32"):
        load_sequences(broken)
    np.save(copy() / "val_target.npy", np.array([0, 5, 1]))
    with pytest.raises(ValueError, match=r"val_target.npy, row 1: 5 is not an item"):
        load_sequences(broken)
    meta = json.loads((copy() / "meta.json").read_text())
    (broken / "meta.json").write_text(json.dumps({**meta, "max_length": 0}))
    with pytest.raises(ValueError, match=r"meta.json: max_length must be an integer of at least 1"):
        load_sequences(broken)
    (broken / "meta.json").write_text("{")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_sequences(broken)
    (broken / "meta.json").unlink()
    with pytest.raises(FileNotFoundError, match="no meta.json"):
        load_dataset(broken)
    with pytest.raises(ValueError, match="meta.json is missing"):
        load_sequences(broken)


# --- synthetic ------------------------------------------------------------------------------------

def test_synthetic_is_deterministic_and_long_tailed(tmp_path):
    params = dict(users=400, items=3000, mean_length=12, max_length=400, seed=5)
    a = generate_synthetic_sequences(tmp_path / "a", **params)
    b = generate_synthetic_sequences(tmp_path / "b", **params)
    c = generate_synthetic_sequences(tmp_path / "c", **{**params, "seed": 6})
    for name in ("train_items", "train_times", "val_target", "val_times", "item_ids"):
        assert (a / f"{name}.npy").read_bytes() == (b / f"{name}.npy").read_bytes(), name
    assert (a / "train_items.npy").read_bytes() != (c / "train_items.npy").read_bytes()
    data = load_sequences(a)
    assert (data.meta.num_items, data.meta.num_users) == (3000, 400)
    # no history is cut at L = 400: every interaction is in the files
    train = np.asarray(data.train.items)
    lengths = (train >= 0).sum(axis=1) + 1
    assert lengths.min() >= 3 and (train[:, -1] == -1).all() and lengths.sum() == data.meta.num_interactions
    assert ((train >= 0)[:, 1:] <= (train >= 0)[:, :-1]).all()        # left-aligned
    times = np.asarray(data.train.times)
    assert (np.diff(times, axis=1)[(train >= 0)[:, 1:]] > 0).all()     # time order
    counts = np.bincount(np.concatenate([train[train >= 0], data.val.target]), minlength=3000)
    assert (np.diff(counts) <= 0).all()                                # most frequent first
    top = np.sort(counts)[::-1][:30].sum() / counts.sum()              # the top 1% of the items
    assert top > 0.3 and abs(top - data.meta.info["top1pct_share"]) < 1e-12
    # what the previous item says: the commonest follower of each item, learnt from the
    # training histories, finds the held-out item far more often than the most popular item does
    pairs = np.stack([train[:, :-1].reshape(-1), train[:, 1:].reshape(-1)], 1)
    pairs = pairs[(pairs >= 0).all(1)]
    follower = np.zeros(3000, np.int64)
    key, n = np.unique(pairs[:, 0] * 3000 + pairs[:, 1], return_counts=True)
    for k in key[np.lexsort((-n, key // 3000))][::-1]:
        follower[k // 3000] = k % 3000
    last = train[np.arange(400), lengths - 2]
    assert (follower[last] == data.val.target).mean() > 2 * (data.val.target == 0).mean() + 0.05


def test_synthetic_named_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("HETU_DATA_HOME", str(tmp_path))
    data = load_dataset("synthetic-sequences", users=100, items=500)
    assert data.path.parent == tmp_path and data.path.name.startswith("synthetic-sequences-")
    assert data.train.items.shape == (100, 51) and data.meta.num_items == 500
    assert load_dataset("synthetic-sequences", users=100, items=500).path == data.path
    assert load_dataset("synthetic-sequences", users=101, items=500).path != data.path
    with pytest.raises(TypeError, match="unknown synthetic sequence parameter"):
        load_dataset("synthetic-sequences", rows=5)
    with pytest.raises(ValueError, match="mean_length"):
        load_dataset("synthetic-sequences", mean_length=2)


def test_movielens_named_dataset(tmp_path, monkeypatch):
    monkeypatch.setenv("HETU_DATA_HOME", str(tmp_path))
    monkeypatch.setattr(cache, "MOVIELENS_100K_PLACES", (lambda: tmp_path / "ml-100k",))
    with pytest.raises(FileNotFoundError, match="get_movielens100k.py --output data/ml-100k"):
        load_dataset("movielens-sequences")
    (tmp_path / "ml-100k").mkdir()
    write_ratings(tmp_path / "ml-100k" / "u.data", RATINGS)
    data = load_dataset("movielens-sequences")      # prepared on first use
    assert data.path == tmp_path / "movielens-sequences" and data.meta.max_length == sequences.DEFAULT_MAX_LENGTH
    assert data.val.target.tolist() == [4, 1, 3]
    with pytest.raises(TypeError):
        load_dataset("movielens-sequences", users=5)


# --- negatives ------------------------------------------------------------------------------------

# src/common/rng.h's splitmix64 in Python integers, as the dynamic tables' rule model has it
from test_dynamic_rule import MASK as M64, splitmix64  # noqa: E402


def negative(seed, step, sample, p, j, n):
    """The documented key and Lemire's method, in Python integers."""
    h = splitmix64(seed & M64)
    for x in (step, sample, p, j):
        h = splitmix64(h ^ (x & M64))
    while ((h * n) & M64) < (1 << 64) % n:
        h = splitmix64(h)
    return (h * n) >> 64


def test_negatives_follow_the_documented_key():
    targets = np.array([[1, 2, -1, 3], [0, -1, -1, 0]])
    rows = np.array([12, 5])
    for seed, step, items in ((7, 3, 1000), (-1, 2 ** 40, 7), (0, 0, 3 << 61)):   # 3 * 2^61: rejections
        out = draw_negatives(seed, step, rows, targets, 6, items)
        assert out.shape == (2, 4, 6) and out.dtype == np.int64
        for k in range(2):
            for p in range(4):
                want = [-1] * 6 if targets[k, p] == -1 else [negative(seed, step, int(rows[k]), p, j, items)
                                                             for j in range(6)]
                assert out[k, p].tolist() == want
    many = draw_negatives(0, 0, np.arange(64), np.zeros((64, 4), np.int64), 8, 3 << 61)
    assert all(0 <= v < 3 << 61 for v in many.reshape(-1).tolist())
    shared = shared_negatives(9, 4, 5, 100)
    assert shared.tolist() == [negative(9, 4, M64, 0, j, 100) for j in range(5)]
    assert shared_negatives(9, 4, 3, 100).tolist() == shared[:3].tolist()
    assert shared_negatives(9, 5, 5, 100).tolist() != shared.tolist()


def test_negatives_are_the_samples_whatever_the_batch_and_threads():
    rng = np.random.default_rng(0)
    targets = rng.integers(-1, 50, size=(64, 20))
    rows = rng.permutation(10_000)[:64]
    whole = draw_negatives(11, 3, rows, targets, 16, 50_000)
    assert (draw_negatives(11, 3, rows[[3, 7]], targets[[3, 7]], 16, 50_000)[1] == whole[7]).all()
    assert (draw_negatives(11, 3, rows[[7]], targets[[7]], 16, 50_000)[0] == whole[7]).all()
    order = rng.permutation(64)
    assert (draw_negatives(11, 3, rows[order], targets[order], 16, 50_000) == whole[order]).all()
    for threads in (1, 3, 8):
        assert (draw_negatives(11, 3, rows, targets, 16, 50_000, threads=threads) == whole).all()
    assert ((whole == -1) == (targets == -1)[:, :, None]).all()
    assert (whole[targets != -1] >= 0).all() and (whole < 50_000).all()
    assert (draw_negatives(11, 4, rows, targets, 16, 50_000) != whole)[targets != -1].mean() > 0.99
    assert (draw_negatives(12, 3, rows, targets, 16, 50_000) != whole)[targets != -1].mean() > 0.99
    # a position's negatives are its own: its sample's other positions leave them alone
    moved = targets.copy()
    moved[:, 1:] = -1
    assert (draw_negatives(11, 3, rows, moved, 16, 50_000)[:, 0] == whole[:, 0]).all()


def test_in_batch_negatives_are_the_global_batchs_targets_whoever_draws_them():
    rng = np.random.default_rng(2)
    keys = rng.integers(-2**63, 2**63 - 1, 30)   # hashed ids: any int64 but -1
    targets = rng.choice(np.r_[-1, keys[keys != -1]], size=(16, 12))
    rows = rng.permutation(1000)[:16]
    drawn, pool = in_batch_negatives(5, 9, rows, targets, targets, 8)
    assert (pool == np.unique(targets[targets != -1])).all()
    assert ((drawn == -1) == (targets == -1)[:, :, None]).all()
    assert drawn.max() < len(pool) and len(np.unique(drawn[drawn >= 0])) > len(pool) // 2
    # A worker's half of the batch draws what the whole batch draws for those samples.
    half, same = in_batch_negatives(5, 9, rows[8:], targets[8:], targets, 8)
    assert (half == drawn[8:]).all() and (same == pool).all()
    assert (drawn == draw_negatives(5, 9, rows, targets, 8, len(pool))).all()
    assert len(in_batch_negatives(5, 9, rows, targets, np.full((2, 2), -1), 8)[1]) == 0


def test_negatives_are_uniform():
    for items, draws in ((10, 20_000), (997, 400)):
        out = draw_negatives(1, 2, np.arange(500), np.zeros((500, 4), np.int64), draws // 20, items).reshape(-1)
        counts = np.bincount(out, minlength=items)
        expected = len(out) / items
        chi2 = ((counts - expected) ** 2 / expected).sum()
        dof = items - 1
        assert chi2 < dof + 6 * np.sqrt(2 * dof), (items, chi2)


def test_negative_arguments_are_checked():
    targets = np.zeros((2, 3), np.int64)
    with pytest.raises(ValueError, match="dataset rows are at least 0"):
        draw_negatives(0, 0, np.array([1, -2]), targets, 4, 10)
    with pytest.raises(ValueError, match="holds 1 rows for 2 samples"):
        draw_negatives(0, 0, np.array([1]), targets, 4, 10)
    with pytest.raises(ValueError, match="num_items must be at least 1"):
        draw_negatives(0, 0, np.array([1, 2]), targets, 4, 0)
    with pytest.raises(ValueError, match=r"targets must be \[samples, positions\]"):
        draw_negatives(0, 0, np.array([1, 2]), np.zeros(2, np.int64), 4, 10)
    assert draw_negatives(0, 0, np.zeros(0, np.int64), np.zeros((0, 3), np.int64), 4, 10).shape == (0, 3, 4)
