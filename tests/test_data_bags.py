"""Multi-slot fields and bags in the dataset folder format: meta.json keys, the jagged view of a
bag, and the batch checker's rules for the -1 padding."""
import json

import numpy as np
import pytest

from hetu.data import DatasetMeta, load_dataset
from hetu.data import store

# fields: a (3 ids, one slot), tags (5 ids, a bag of up to 3), b (2 ids, one slot)
FIELD_NAMES = ("a", "tags", "b")
FIELD_SIZES = (3, 5, 2)
FIELD_SLOTS = (1, 3, 1)
# global ids: a [0, 3), tags [3, 8), b [8, 10)
SPARSE = np.array([[0, 3, 4, 4, 8],      # tags {3, 4, 4}: a repeated id counts twice
                   [1, 7, -1, -1, 9],    # tags {7}
                   [2, -1, -1, -1, 8],   # an empty bag
                   [0, 5, 6, -1, 9]], dtype=np.int64)


def write_bag_dataset(folder, sparse=SPARSE, bag_fields=("tags",), field_slots=FIELD_SLOTS):
    n = len(sparse)
    with store.atomic_directory(folder) as tmp:
        np.save(tmp / store.DENSE_FILE, np.zeros((n, 0), np.float32))
        np.save(tmp / store.SPARSE_FILE, sparse)
        np.save(tmp / store.LABELS_FILE, np.arange(n, dtype=np.float32)[:, None] % 2)
        store.write_meta(tmp, store.dataset_meta(
            "bags", n, 0, FIELD_NAMES, FIELD_SIZES, n - 1, 1, 0.25, None, {"kind": "test"},
            label={"kind": "click", "values": [0.0, 1.0]}, field_slots=field_slots,
            bag_fields=bag_fields))
    return folder


def test_meta_keys_round_trip(tmp_path):
    dataset = load_dataset(write_bag_dataset(tmp_path / "d"))
    raw = json.loads((tmp_path / "d" / "meta.json").read_text())
    assert raw["field_slots"] == [1, 3, 1] and raw["bag_fields"] == ["tags"]
    assert raw["num_fields"] == 3 and raw["field_offsets"] == [0, 3, 8]
    meta = dataset.meta
    assert meta.field_slots == (1, 3, 1) and meta.bag_fields == ("tags",)
    assert meta.slot_offsets == (0, 1, 4, 5) and meta.num_slots == 5
    assert dataset.train.sparse.shape == (3, 5) and dataset.val.sparse.shape == (1, 5)


def test_old_meta_means_one_slot_per_field_and_no_bags(tmp_path):
    """A single-slot writer adds no new keys, and a meta.json without them reads as before."""
    meta = store.dataset_meta("plain", 4, 0, FIELD_NAMES, FIELD_SIZES, 3, 1, 0.25, None, {},
                              label={"kind": "click"})
    assert "field_slots" not in meta and "bag_fields" not in meta
    parsed = DatasetMeta.from_dict(meta)
    assert parsed.field_slots == (1, 1, 1) and parsed.bag_fields == ()
    assert parsed.slot_offsets == (0, 1, 2, 3)


def test_bad_slot_meta_is_an_error_naming_the_file(tmp_path):
    with pytest.raises(ValueError, match=r"meta.json: field_slots must list a positive slot count"):
        load_dataset(write_bag_dataset(tmp_path / "short", field_slots=(1, 4)))
    with pytest.raises(ValueError, match=r"meta.json: bag_fields names \['genres'\]"):
        load_dataset(write_bag_dataset(tmp_path / "unknown", bag_fields=("genres",)))
    with pytest.raises(ValueError, match=r"sparse.npy is int64\[4, 5\], meta.json says int64\[4, 6\]"):
        load_dataset(write_bag_dataset(tmp_path / "wide", field_slots=(1, 4, 1)))


def test_bag_is_the_jagged_view_without_padding(tmp_path):
    dataset = load_dataset(write_bag_dataset(tmp_path / "d"))
    values, offsets = dataset.train.bag("tags")
    np.testing.assert_array_equal(values, [3, 4, 4, 7])
    np.testing.assert_array_equal(offsets, [0, 3, 4, 4])
    assert values.dtype == np.int64 and offsets.dtype == np.int64
    values, offsets = dataset.val.bag("tags")
    np.testing.assert_array_equal(values, [5, 6])
    np.testing.assert_array_equal(offsets, [0, 2])
    # a single-id field: bags of one
    values, offsets = dataset.train.bag("b")
    np.testing.assert_array_equal(values, [8, 9, 8])
    np.testing.assert_array_equal(offsets, [0, 1, 2, 3])
    with pytest.raises(KeyError, match="no field 'genres'"):
        dataset.train.bag("genres")


def check_all(part):
    check = part.checker("sparse")
    check(np.asarray(part.sparse), np.arange(len(part)))


def test_checker_accepts_trailing_padding_in_bag_columns(tmp_path):
    dataset = load_dataset(write_bag_dataset(tmp_path / "d"))
    check_all(dataset.train)
    check_all(dataset.val)


@pytest.mark.parametrize("row, column, value, message", [
    # -1 in a single-id field
    (1, 0, -1, r"row 1, column 0 \(a\): -1 is an id outside its field's rows, field 0 holds ids \[0, 3\)$"),
    (2, 4, -1, r"row 2, column 4 \(b\): -1 is an id outside its field's rows, field 2 holds ids \[8, 10\)$"),
    # an id after the padding: tags {7, pad, 5}
    (1, 3, 5, r"row 1, column 3 \(tags slot 2\): 5 is an id after its bag's padding \(-1\)"),
    # an empty bag with an id in its last slot
    (2, 3, 3, r"row 2, column 3 \(tags slot 2\): 3 is an id after its bag's padding"),
    # an id of another field inside the bag
    (0, 2, 8, r"row 0, column 2 \(tags slot 1\): 8 is an id outside its field's rows, field 1 holds "
              r"ids \[3, 8\) or -1 after the bag's ids"),
    (0, 1, -2, r"row 0, column 1 \(tags slot 0\): -2 is an id outside"),
])
def test_checker_rejects_padding_outside_bags_and_ids_after_padding(tmp_path, row, column, value,
                                                                    message):
    sparse = SPARSE.copy()
    sparse[row, column] = value
    dataset = load_dataset(write_bag_dataset(tmp_path / "d", sparse=sparse))
    with pytest.raises(ValueError, match=message):
        check_all(dataset.train)


def test_padding_is_not_allowed_in_a_multi_slot_field_that_is_not_a_bag(tmp_path):
    dataset = load_dataset(write_bag_dataset(tmp_path / "d", bag_fields=()))
    with pytest.raises(ValueError, match=r"row 1, column 2 \(tags slot 1\): -1 is an id outside"):
        check_all(dataset.train)
