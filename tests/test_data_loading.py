"""load_dataset: memory-mapped train/val views, the synthetic cache, and concurrent first use."""
import multiprocessing
import sys
from pathlib import Path

import numpy as np
import pytest

import jobs

import hetu as ht
import hetu.data.cache as cache
from hetu.data import ensure_synthetic, generate_synthetic, load_dataset

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def data_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HETU_DATA_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_parts_are_memmap_views_of_one_file(tmp_path):
    folder = generate_synthetic(tmp_path / "d", rows=2000, progress=False)
    ds = load_dataset(folder)
    assert isinstance(ds.train.sparse, np.memmap) and isinstance(ds.val.sparse, np.memmap)
    assert ds.train.sparse.filename == ds.val.sparse.filename
    full = np.load(folder / "sparse.npy")
    np.testing.assert_array_equal(ds.train.sparse, full[:1800])
    np.testing.assert_array_equal(ds.val.sparse, full[1800:])
    assert ds.meta.num_fields == 26 and ds.meta.num_dense == 13
    assert ds.meta.field_offsets[1] == ds.meta.field_sizes[0]
    batches = list(ds.val.batches(64))
    assert len(batches) == 4 and batches[-1][1].shape == (8, 26)
    assert len(list(ds.val.batches(64, drop_last=True))) == 3


def test_synthetic_name_generates_once_into_data_home(data_home):
    first = load_dataset("synthetic", rows=1500)
    second = load_dataset("synthetic-criteo", rows=1500)
    assert first.path == second.path and first.path.parent == data_home
    assert first.path.name.startswith("synthetic-criteo-")
    other = load_dataset("synthetic", rows=1500, seed=1)
    assert other.path != first.path
    assert not [p for p in data_home.iterdir() if ".partial-" in p.name]


def test_prepared_name_without_data_says_how_to_prepare(data_home):
    with pytest.raises(FileNotFoundError, match="hetu.data.prepare criteo"):
        load_dataset("criteo")


def test_inconsistent_arrays_are_rejected(tmp_path):
    folder = generate_synthetic(tmp_path / "d", rows=100, progress=False)
    np.save(folder / "sparse.npy", np.load(folder / "sparse.npy").astype(np.float32))
    with pytest.raises(ValueError, match="sparse.npy is float32"):
        load_dataset(folder)


@pytest.mark.parametrize("kind,row,column,value,message", [
    ("dense", 1850, 3, np.nan, r"dense.npy, row 1850, column 3 \(I4\): nan is a feature that is not finite"),
    ("dense", 12, 0, np.inf, r"dense.npy, row 12, column 0 \(I1\): inf is a feature that is not finite"),
    ("sparse", 40, 2, 10**9, r"sparse.npy, row 40, column 2 \(C3\): 1000000000 is an id outside its field's rows, "
                             r"field 2 holds ids \[32, "),
    ("sparse", 41, 1, 5, r"sparse.npy, row 41, column 1 \(C2\): 5 is an id outside its field's rows, "
                         r"field 1 holds ids \[16, 32\)"),
    ("labels", 1999, 0, 2.0, r"labels.npy, row 1999, column 0 \(label\): 2.0 is a label that is not one of")])
@pytest.mark.parametrize("shuffle", [False, True])
def test_bad_values_are_named_by_file_row_and_column(tmp_path, kind, row, column, value, message, shuffle):
    folder = generate_synthetic(tmp_path / "d", rows=2000, progress=False)
    ds = load_dataset(folder)
    part = ds.train if row < ds.meta.train_rows else ds.val
    loader = ht.Dataloader(getattr(part, kind), 50, "train", shuffle=shuffle, prefetch=1, check=part.checker(kind))
    for _ in range(loader.batch_num):   # the whole split is good
        loader.next_batch()
    array = np.load(folder / f"{kind}.npy", mmap_mode="r+")
    array[row, column] = value
    array.flush()
    ds = load_dataset(folder)
    part = ds.train if row < ds.meta.train_rows else ds.val
    loader = ht.Dataloader(getattr(part, kind), 50, "train", shuffle=shuffle, prefetch=1, check=part.checker(kind))
    with pytest.raises(ValueError, match=str(folder) + "/" + message):
        for _ in range(loader.batch_num):
            loader.next_batch()


def test_a_bad_id_stops_training_with_its_place(tmp_path):
    folder = generate_synthetic(tmp_path / "d", rows=2000, progress=False)
    array = np.load(folder / "sparse.npy", mmap_mode="r+")
    array[70, 5] = -1
    array.flush()
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--data-dir", str(folder),
                     "--batch-size", "32", "--embedding-size", "8", "--no-progress"],
                    capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"error: {folder}/sparse.npy, row 70, column 5 (C6): -1 is an id outside its field's rows"), \
        proc.stderr[-3000:]


def _first_use(home, barrier, log_path, results):
    import os
    os.environ["HETU_DATA_HOME"] = home
    real_generate = cache.generate_synthetic

    def logged_generate(*args, **kwargs):
        with open(log_path, "a") as log:
            log.write(f"{os.getpid()}\n")
        return real_generate(*args, **kwargs)

    cache.generate_synthetic = logged_generate
    barrier.wait()
    folder = ensure_synthetic("criteo", rows=30_000)
    results.put((str(folder), int(load_dataset(folder).train.sparse[-1, 0])))


def test_concurrent_first_use_generates_once(tmp_path):
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(2)
    results = context.Queue()
    log_path = tmp_path / "generations.log"
    workers = [context.Process(target=_first_use,
                               args=(str(tmp_path / "home"), barrier, str(log_path), results))
               for _ in range(2)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    assert outcomes[0] == outcomes[1]
    assert len(log_path.read_text().split()) == 1


def test_example_loaders(data_home, tmp_path):
    from hetu.models import load_data
    criteo = load_data.load_criteo(rows=1000)
    assert criteo.meta.name == "synthetic-criteo" and criteo.train.dense.shape == (900, 13)
    avazu = load_data.load("avazu", rows=1000)
    assert avazu.meta.num_fields == 22 and avazu.train.dense is None
    assert load_data.load_movielens(rows=1000).meta.num_fields == 2
    prepared = generate_synthetic(tmp_path / "prepared", rows=500, progress=False)
    assert len(load_data.load_criteo(data_dir=prepared).val) == 50
    with pytest.raises(TypeError):
        load_data.load_criteo(data_dir=prepared, rows=10)
