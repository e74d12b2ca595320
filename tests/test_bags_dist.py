"""Bags through every mode: AllReduce, PS, the HET cache at bound 0 and Herald each equal the single-process
run with the global batch (docs/design.md section 4), parameter by parameter, on data whose bags hold
0, 1 and many ids with repeats; and the multi-hot Criteo shape trains in every mode."""
import numpy as np
import pytest

from dist_harness import assert_same_parameters, run_cluster, run_single
from hetu.data import load_dataset, store

pytestmark = pytest.mark.timeout(600)

OPTIMIZERS = {"sgd": ["--optimizer", "sgd", "--learning-rate", "0.02"],
              "adam": ["--optimizer", "adam", "--learning-rate", "0.001"],
              "rowwise_adagrad": ["--optimizer", "rowwise_adagrad", "--learning-rate", "0.001"]}
# mode: (flags, script, servers)
MODES = {"AllReduce": (["--comm", "AllReduce"], "run_hetu.py", 0),
         "PS": (["--comm", "PS"], "run_hetu.py", 1),
         "HET": (["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--cache-limit-ratio", "0.2"], "run_hetu.py", 1),
         "Herald": (["--comm", "Hybrid", "--cache", "lru", "--cache-limit-ratio", "0.2"], "run_laia.py", 1)}


@pytest.fixture(scope="module")
def tagged_ratings(tmp_path_factory):
    """A MovieLens-shaped folder: user and item, and a bag of up to 4 tags per sample (0 to 4
    ids, repeats allowed, -1 after them), labels from a hidden rule of all three."""
    rng = np.random.default_rng(11)
    n, users, items, tags, slots = 12000, 300, 400, 60, 4
    user = rng.zipf(1.3, n) % users
    item = users + rng.zipf(1.2, n) % items
    length = rng.integers(0, slots + 1, n)
    bag = users + items + rng.zipf(1.4, (n, slots)) % tags
    bag[np.arange(slots)[None, :] >= length[:, None]] = -1
    sparse = np.column_stack([user, item, bag]).astype(np.int64)
    taste = rng.standard_normal(users + items + tags)
    score = taste[user] + taste[item] + np.where(bag >= 0, taste[np.maximum(bag, 0)], 0).sum(1)
    labels = (score + rng.standard_normal(n) > 0).astype(np.float32)[:, None]
    folder = tmp_path_factory.mktemp("bags") / "tagged"
    with store.atomic_directory(folder) as tmp:
        np.save(tmp / store.DENSE_FILE, np.zeros((n, 0), np.float32))
        np.save(tmp / store.SPARSE_FILE, sparse)
        np.save(tmp / store.LABELS_FILE, labels)
        store.write_meta(tmp, store.dataset_meta(
            "tagged", n, 0, ("user", "item", "tags"), (users, items, tags), n - 2000, 2000, 2000 / n, None,
            {"kind": "test"}, label={"kind": "click", "values": [0.0, 1.0]}, field_slots=(1, 1, slots),
            bag_fields=("tags",)))
    return folder


def test_the_folder_has_empty_single_and_repeated_bags(tagged_ratings):
    tags = load_dataset(tagged_ratings).train.sparse[:, 2:]
    lengths = (tags >= 0).sum(1)
    assert {0, 1, 4} <= set(lengths.tolist())
    assert any(len(set(row[row >= 0])) < (row >= 0).sum() for row in tags[:500])   # a repeated id in a bag


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_bags_in_every_mode_equal_single_process(tmp_path, data_home, tagged_ratings, mode, opt):
    args = ["--model", "dlrm_movielens", "--data-dir", str(tagged_ratings), *OPTIMIZERS[opt]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    flags, script, servers = MODES[mode]
    got, _ = run_cluster(tmp_path, data_home, script, [*flags, "--bsp", "0", *args], 2, servers, 32)
    assert_same_parameters(reference, got, exact_rows=(opt == "sgd"))


def test_multihot_criteo_under_herald_equals_single_process(tmp_path, data_home):
    """MLPerf's multi-hot shape (214 ids a sample, repeats in a bag) through Herald's allocator."""
    args = ["--model", "dlrm_criteo_multihot", "--rows", "6000", *OPTIMIZERS["sgd"]]
    reference, _ = run_single(tmp_path, data_home, "run_hetu.py", args, global_batch=64)
    got, _ = run_cluster(tmp_path, data_home, "run_laia.py", [*MODES["Herald"][0], "--bsp", "0", *args], 2, 2, 32)
    assert_same_parameters(reference, got, exact_rows=True)
