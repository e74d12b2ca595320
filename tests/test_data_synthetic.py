"""Synthetic generator: determinism, shape, skew and label learnability."""
import json

import numpy as np
import pytest

from hetu.data import generate_synthetic, load_dataset, rank_auc, top_rows_lookup_share
from hetu.data.synthetic import scaled_field_sizes, synthetic_spec
from hetu.data.criteo import FIELD_SIZES

ARRAYS = ("dense.npy", "sparse.npy", "labels.npy")


@pytest.fixture(scope="module")
def criteo_default_100k(tmp_path_factory):
    """Default parameters (scale 0.01, exponent 1.05), 100k rows to keep the suite quick."""
    return load_dataset(generate_synthetic(tmp_path_factory.mktemp("syn") / "d", rows=100_000,
                                           progress=False))


def test_field_sizes_scale_with_a_floor():
    sizes = scaled_field_sizes(FIELD_SIZES, 0.01, 16)
    assert sizes[2] == 101312      # 10,131,227 x 0.01
    assert sizes[0] == 16          # 1460 x 0.01 = 15 -> floor 16
    assert sizes[8] == 3           # a 3-value field keeps its 3 values
    assert sizes[5] == 16          # 24 x 0.01 -> floor 16
    assert sizes.sum() == 337754
    assert sizes.dtype == np.int64


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    a = generate_synthetic(tmp_path / "a", rows=3000, progress=False)
    b = generate_synthetic(tmp_path / "b", rows=3000, progress=False)
    c = generate_synthetic(tmp_path / "c", rows=3000, seed=1, progress=False)
    for name in ARRAYS:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "sparse.npy").read_bytes() != (c / "sparse.npy").read_bytes()
    assert (a / "labels.npy").read_bytes() != (c / "labels.npy").read_bytes()


def test_ids_are_int64_and_inside_their_fields(criteo_default_100k):
    meta = criteo_default_100k.meta
    for part in (criteo_default_100k.train, criteo_default_100k.val):
        assert part.sparse.dtype == np.int64 and part.sparse.shape[1] == 26
        low = np.array(meta.field_offsets)
        high = low + np.array(meta.field_sizes)
        assert (part.sparse >= low).all() and (part.sparse < high).all()
        assert part.dense.dtype == np.float32 and part.dense.shape[1] == 13
        assert part.labels.dtype == np.float32 and part.labels.shape[1] == 1
    assert meta.num_embeddings == 337754
    assert len(criteo_default_100k.train) == 90_000 and len(criteo_default_100k.val) == 10_000


BIGGEST_FIELD = 2  # C3: 101,312 ids at scale 0.01


def field_share(dataset, field, fraction=0.01):
    """Top-``fraction`` share within one field, ids shifted to start at 0."""
    meta = dataset.meta
    local = np.asarray(dataset.train.sparse[:, field]) - meta.field_offsets[field]
    return top_rows_lookup_share(local[:, None], meta.field_sizes[field], fraction)


def test_top_one_percent_of_rows_take_about_ninety_percent(criteo_default_100k):
    part = criteo_default_100k.train
    share = top_rows_lookup_share(part.sparse, part.meta.num_embeddings, 0.01)
    assert 0.87 <= share <= 0.95, share
    assert field_share(criteo_default_100k, BIGGEST_FIELD) > 0.6


def test_flat_law_has_less_skew(tmp_path, criteo_default_100k):
    """Tiny fields put their few ids in the global top 1% whatever the law (as in real Criteo),
    so the flat law still scores high globally; within a big field it shows no skew."""
    flat = load_dataset(generate_synthetic(tmp_path / "flat", rows=100_000, zipf_exponent=0.0,
                                           progress=False))
    share = top_rows_lookup_share(flat.train.sparse, flat.meta.num_embeddings, 0.01)
    assert share < 0.8
    assert field_share(flat, BIGGEST_FIELD) < 0.1


def fit_logistic_regression(sparse, dense, labels, num_embeddings, lr=0.1, batch=8192):
    """One Adagrad epoch of logistic regression on one-hot ids + dense features (numpy)."""
    w = np.zeros(num_embeddings)
    v = np.zeros(dense.shape[1])
    b = 0.0
    gw2, gv2, gb2 = np.full(num_embeddings, 1e-8), np.full(dense.shape[1], 1e-8), 1e-8
    for start in range(0, len(labels), batch):
        ids, x, y = sparse[start:start + batch], dense[start:start + batch], \
            labels[start:start + batch]
        g = 1 / (1 + np.exp(-(w[ids].sum(1) + x @ v + b))) - y
        gw = np.bincount(ids.ravel(), weights=np.repeat(g, ids.shape[1]),
                         minlength=num_embeddings)
        gv, gb = x.T @ g, g.sum()
        gw2 += gw * gw
        gv2 += gv * gv
        gb2 += gb * gb
        w -= lr * gw / np.sqrt(gw2)
        v -= lr * gv / np.sqrt(gv2)
        b -= lr * gb / np.sqrt(gb2)
    return lambda ids, x: w[ids].sum(1) + x @ v + b


def test_labels_are_learnable_by_logistic_regression(criteo_default_100k):
    train, val = criteo_default_100k.train, criteo_default_100k.val
    predict = fit_logistic_regression(np.asarray(train.sparse), np.asarray(train.dense),
                                      np.asarray(train.labels)[:, 0],
                                      train.meta.num_embeddings)
    auc = rank_auc(val.labels, predict(np.asarray(val.sparse), np.asarray(val.dense)))
    assert 0.74 <= auc <= 0.85, auc
    measured = criteo_default_100k.meta.info["source"]["measured"]
    assert 0.78 <= measured["hidden_logit_auc"] <= 0.88
    assert 0.2 <= measured["positive_rate"] <= 0.3


def test_shuffled_labels_are_not_learnable(criteo_default_100k):
    """The learnability check above can fail: with labels detached from features it does."""
    train, val = criteo_default_100k.train, criteo_default_100k.val
    shuffled = np.random.default_rng(0).permutation(np.asarray(train.labels)[:, 0])
    predict = fit_logistic_regression(np.asarray(train.sparse), np.asarray(train.dense),
                                      shuffled, train.meta.num_embeddings)
    auc = rank_auc(val.labels, predict(np.asarray(val.sparse), np.asarray(val.dense)))
    assert abs(auc - 0.5) < 0.05


def hot_set(sparse, k=100):
    counts = np.bincount(np.asarray(sparse[:, BIGGEST_FIELD]))
    return set(np.argsort(counts)[-k:])


def test_drift_moves_the_hot_set(tmp_path):
    steady = load_dataset(generate_synthetic(tmp_path / "s", rows=60_000, val_fraction=0.5,
                                             progress=False))
    drifting = load_dataset(generate_synthetic(tmp_path / "d", rows=60_000, val_fraction=0.5,
                                               drift=0.02, progress=False))
    overlap_steady = len(hot_set(steady.train.sparse) & hot_set(steady.val.sparse))
    overlap_drift = len(hot_set(drifting.train.sparse) & hot_set(drifting.val.sparse))
    assert overlap_steady > 60 and overlap_drift < 20, (overlap_steady, overlap_drift)


def test_avazu_and_movielens_shapes(tmp_path):
    avazu = load_dataset(generate_synthetic(tmp_path / "a", shape="avazu", rows=5000,
                                            progress=False))
    assert avazu.meta.num_fields == 22 and avazu.meta.num_dense == 0
    assert avazu.meta.num_embeddings == 283608 and avazu.train.dense is None
    assert avazu.train.sparse.dtype == np.int64
    movielens = load_dataset(generate_synthetic(tmp_path / "m", shape="movielens", rows=5000,
                                                progress=False))
    assert movielens.meta.field_sizes == (6040, 3706)


def test_rank_auc_matches_hand_values():
    assert rank_auc([0, 0, 1, 1], [0.1, 0.4, 0.35, 0.8]) == 0.75
    assert rank_auc([0, 1], [0.5, 0.5]) == 0.5
    assert rank_auc([1, 0, 1], [3, 1, 2]) == 1.0


def test_meta_records_the_generator_parameters(tmp_path):
    out = generate_synthetic(tmp_path / "x", rows=1000, drift=0.1, seed=7, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["source"]["spec"]["seed"] == 7 and meta["source"]["spec"]["drift"] == 0.1
    assert meta["split"] == {"kind": "contiguous", "train_rows": 900, "val_rows": 100,
                             "val_fraction": 0.1, "shuffle_seed": None}


def test_unknown_parameter_is_rejected():
    with pytest.raises(TypeError, match="zipf"):
        synthetic_spec(zipf=1.0)
