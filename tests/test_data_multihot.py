"""Synthetic ``criteo-multihot`` (MLPerf DLRM-DCNv2's Criteo 1TB shape, every field a bag)."""
import json
import sys

import numpy as np
import pytest

from hetu.data import generate_synthetic, load_dataset, rank_auc, synthetic_dataset_dir
from hetu.data.criteo import FIELD_NAMES
from hetu.data.synthetic import (MLPERF_FIELD_SIZES, MLPERF_HOTNESS, scaled_field_sizes,
                                 synthetic_spec)
import jobs
from test_data_synthetic import fit_logistic_regression

ARRAYS = ("dense.npy", "sparse.npy", "labels.npy")


@pytest.fixture(scope="module")
def multihot_60k(tmp_path_factory):
    return load_dataset(generate_synthetic(tmp_path_factory.mktemp("mh") / "d",
                                           shape="criteo-multihot", rows=60_000, progress=False))


def test_mlperf_sizes_and_hotness():
    assert sum(MLPERF_HOTNESS) == 214 and len(MLPERF_HOTNESS) == len(MLPERF_FIELD_SIZES) == 26
    assert MLPERF_FIELD_SIZES[0] == 40_000_000 and MLPERF_FIELD_SIZES[20] == 40_000_000
    assert MLPERF_HOTNESS[20] == 100 and MLPERF_HOTNESS[21] == 27


def test_shape_slots_and_field_sizes(multihot_60k):
    meta = multihot_60k.meta
    assert meta.num_fields == 26 and meta.num_dense == 13 and meta.field_names == FIELD_NAMES
    assert meta.field_slots == MLPERF_HOTNESS and meta.num_slots == 214
    assert meta.bag_fields == FIELD_NAMES
    sizes = scaled_field_sizes(MLPERF_FIELD_SIZES, 0.002, 16)
    assert meta.field_sizes == tuple(int(s) for s in sizes)
    assert meta.field_sizes[0] == 80_000 and meta.field_sizes[5] == 3   # 40M x 0.002; 3 kept
    assert meta.num_embeddings == int(sizes.sum())
    raw = meta.info
    assert raw["field_slots"] == list(MLPERF_HOTNESS) and raw["bag_fields"] == list(FIELD_NAMES)
    assert raw["source"]["real_field_sizes"] == list(MLPERF_FIELD_SIZES)
    assert multihot_60k.train.sparse.shape == (54_000, 214)
    assert multihot_60k.train.dense.shape == (54_000, 13)


def test_every_bag_is_full_and_inside_its_field(multihot_60k):
    meta = multihot_60k.meta
    sparse = np.asarray(multihot_60k.train.sparse)
    assert sparse.dtype == np.int64 and (sparse != -1).all()   # fixed-size bags: no padding
    columns = meta.column_fields()
    low = np.asarray(meta.field_offsets)[columns]
    assert ((sparse >= low) & (sparse < low + np.asarray(meta.field_sizes)[columns])).all()
    multihot_60k.train.checker("sparse")(sparse, np.arange(len(sparse)))
    values, offsets = multihot_60k.train.bag("C21")
    np.testing.assert_array_equal(np.diff(offsets), 100)
    np.testing.assert_array_equal(values, sparse[:, meta.slot_offsets[20]:meta.slot_offsets[21]].ravel())
    # ids of a bag are independent draws: the hot ones repeat inside a 100-id bag
    bags = values.reshape(-1, 100)
    assert np.mean([len(np.unique(bag)) < 100 for bag in bags[:1000]]) > 0.9


def test_each_bag_follows_its_fields_power_law(multihot_60k):
    """Every slot of a bag draws from the same law: the top 1% of C21's rows take most of the
    lookups in its first and in its last slot alike."""
    meta = multihot_60k.meta
    start, stop = meta.slot_offsets[20:22]
    local = np.asarray(multihot_60k.train.sparse[:, start:stop]) - meta.field_offsets[20]
    top = meta.field_sizes[20] // 100
    for slot in (0, 99):
        counts = np.sort(np.bincount(local[:, slot], minlength=meta.field_sizes[20]))[::-1]
        assert counts[:top].sum() / counts.sum() > 0.4


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    """Several chunks (a 214-slot chunk has 8192 rows), so the chunked streams are covered."""
    a, b, c = (generate_synthetic(tmp_path / name, shape="criteo-multihot", rows=20_000, seed=seed,
                                  progress=False) for name, seed in (("a", 0), ("b", 0), ("c", 1)))
    for name in ARRAYS:
        assert (a / name).read_bytes() == (b / name).read_bytes()
    assert (a / "sparse.npy").read_bytes() != (c / "sparse.npy").read_bytes()
    assert (a / "labels.npy").read_bytes() != (c / "labels.npy").read_bytes()


def test_hotness_scale_shrinks_the_bags(tmp_path):
    dataset = load_dataset(generate_synthetic(tmp_path / "small", shape="criteo-multihot",
                                              rows=2000, hotness_scale=0.1, progress=False))
    # max(1, round(size x 0.1)): 12 -> 1, 100 -> 10, 27 -> 3 (2.7), 10 -> 1
    expected = tuple(max(1, int(np.rint(k * 0.1))) for k in MLPERF_HOTNESS)
    assert dataset.meta.field_slots == expected and expected[20] == 10 and expected[21] == 3
    assert dataset.train.sparse.shape == (1800, sum(expected))
    assert json.loads((tmp_path / "small" / "meta.json").read_text())["source"]["spec"][
        "hotness_scale"] == 0.1
    with pytest.raises(ValueError, match="hotness_scale must be positive"):
        synthetic_spec("criteo-multihot", hotness_scale=0)


def test_labels_are_learnable_from_the_bags(multihot_60k):
    """Sum-pooled logistic regression; a smaller step than the one-hot test's, since a sample
    now moves 214 weights (0.71 with this seed)."""
    train, val = multihot_60k.train, multihot_60k.val
    predict = fit_logistic_regression(np.asarray(train.sparse), np.asarray(train.dense),
                                      np.asarray(train.labels)[:, 0], train.meta.num_embeddings,
                                      lr=0.01, batch=1024)
    auc = rank_auc(val.labels, predict(np.asarray(val.sparse), np.asarray(val.dense)))
    assert auc > 0.67, auc
    measured = multihot_60k.meta.info["source"]["measured"]
    assert measured["hidden_logit_auc"] > 0.75 and 0.2 <= measured["positive_rate"] <= 0.3


def test_loads_by_name_through_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HETU_DATA_HOME", str(tmp_path))
    params = dict(rows=3000, scale=0.0005, hotness_scale=0.2)
    dataset = load_dataset("synthetic-criteo-multihot", **params)
    folder, spec = synthetic_dataset_dir("criteo-multihot", **params)
    assert dataset.path == folder and folder.name.startswith("synthetic-criteo-multihot-")
    assert dataset.meta.field_sizes[0] == 20_000 and dataset.meta.field_slots[20] == 20
    sessions = load_dataset("synthetic-criteo-multihot-sessions", **params)
    assert sessions.meta.field_slots == dataset.meta.field_slots
    assert sessions.meta.name == "synthetic-criteo-multihot-sessions"
    # a user-like field (40M real rows) keeps its whole bag within a session
    start, stop = sessions.meta.slot_offsets[20:22]

    def distinct_bags(part):
        return len(np.unique(np.asarray(part.sparse[:, start:stop]), axis=0))
    assert distinct_bags(sessions.train) < len(sessions.train) // 10
    assert distinct_bags(dataset.train) == len(dataset.train)


def test_hotness_scale_leaves_single_hot_shapes_alone(tmp_path):
    """Other shapes ignore hotness_scale: their cache folders and meta stay as they were."""
    assert "hotness_scale" not in synthetic_spec("criteo").as_dict()
    assert "hotness_scale" in synthetic_spec("criteo-multihot").as_dict()
    out = generate_synthetic(tmp_path / "c", rows=1000, progress=False)
    meta = json.loads((out / "meta.json").read_text())
    assert "field_slots" not in meta and "bag_fields" not in meta


def test_cli_generates_the_shape(tmp_path):
    out = tmp_path / "cli"
    proc = jobs.run([sys.executable, "-m", "hetu.data.prepare", "synthetic", "--shape",
                     "criteo-multihot", "--rows", "1000", "--hotness-scale", "0.5",
                     "--output", str(out), "--quiet"], capture_output=True, text=True,
                    timeout=120)
    assert proc.returncode == 0, proc.stderr
    meta = load_dataset(out).meta
    assert meta.field_slots[20] == 50 and meta.num_slots == sum(
        max(1, int(np.rint(k * 0.5))) for k in MLPERF_HOTNESS)
