"""Export of a checkpoint to a bundle and offline prediction (hetu.serve): for every model the
bundle's probabilities of the validation split equal the trained graph's (run_hetu.py --val
--save-predictions) within 1e-5, from encoded samples and from raw instances (synthetic data,
MovieLens 100K-shaped files with side features, indexed and hashed), with dynamic tables, bf16
rows and deltas; a bad instance, a missing checkpoint, an unknown model or an op without an ONNX
mapping is one line and exit status 2."""
import json
import os
import shutil
import sys
import threading

import numpy as np
import pytest

import jobs
from conftest import REPO

pytest.importorskip("onnxruntime")

sys.path.insert(0, str(REPO / "examples/ctr"))
import train  # noqa: E402

import hetu as ht  # noqa: E402
from hetu import threads  # noqa: E402
from hetu.checkpoint import stamped  # noqa: E402
from hetu.data import load_dataset  # noqa: E402
from hetu.data.prepare import main as prepare_main  # noqa: E402
from hetu.data.movielens import prepare_movielens  # noqa: E402
from hetu.data.movielens_side import GENRES_100K  # noqa: E402
from hetu.serve import onnx_graph  # noqa: E402
from hetu.serve.__main__ import main as serve_main  # noqa: E402
from hetu.serve.bundle import Bundle, InstanceError  # noqa: E402
from hetu.serve.checkpoint_rows import CheckpointRows  # noqa: E402
from hetu.serve.export import ExportError, checkpoint_version, export  # noqa: E402

TINY = ["--embedding-size", "4", "--batch-size", "64", "--nepoch", "1", "--no-progress", "--val"]
TOLERANCE = 1e-5


@pytest.fixture
def run(monkeypatch, capsys):
    """train.py in this process, threads at 1 (restored afterwards); its output."""
    for name in threads.THREAD_VARS:
        monkeypatch.setenv(name, "1")

    def train_run(*flags):
        train.main([*TINY, *flags])
        return capsys.readouterr().out
    return train_run


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """Tiny prepared synthetic folders: shape -> path."""
    root = tmp_path_factory.mktemp("serve-data")
    out = {}
    for shape, ids in (("criteo", "indexed"), ("criteo-multihot", "indexed"), ("movielens", "indexed"),
                       ("criteo", "hashed")):
        path = root / f"{shape}-{ids}"
        assert prepare_main(["synthetic", "--shape", shape, "--rows", "1500", "--scale", "0.0005", "--ids", ids,
                             "--output", str(path), "--quiet"]) == 0
        out[f"{shape}-{ids}"] = path
    return out


def trained_and_exported(run, tmp_path, data_dir, *flags):
    """(the graph's validation probabilities, the bundle) of one tiny run."""
    checkpoint, bundle = tmp_path / "ckpt", tmp_path / "bundle"
    run("--data-dir", str(data_dir), "--checkpoint", str(checkpoint), "--save-predictions",
        str(tmp_path / "graph.npy"), *flags)
    export(str(checkpoint), str(bundle))
    return np.load(tmp_path / "graph.npy"), Bundle.open(str(bundle))


def split_predictions(bundle, data_dir):
    val = load_dataset(str(data_dir)).val
    return bundle.predict_arrays(val.dense, val.sparse)


def synthetic_instances(data_dir):
    """The validation split as raw instances: dense features by name, each field's local id."""
    data = load_dataset(str(data_dir))
    meta, val = data.meta, data.val
    dense_names = meta.info.get("dense_names", [])
    instances = []
    for i in range(len(val)):
        row = {name: float(val.dense[i, k]) for k, name in enumerate(dense_names)}
        for f, name in enumerate(meta.field_names):
            start, stop = meta.slot_offsets[f:f + 2]
            ids = [int(x) - meta.field_offsets[f] for x in val.sparse[i, start:stop] if x >= 0]
            row[name] = ids if name in meta.bag_fields else ids[0]
        instances.append(row)
    return instances


@pytest.mark.parametrize("model,shape", [("wdl", "criteo"), ("dfm", "criteo"), ("dcn", "criteo"),
                                         ("dlrm", "criteo"), ("dcnv2", "criteo"), ("ncf", "movielens"),
                                         ("dlrm", "criteo-multihot"), ("dcnv2", "criteo-multihot"),
                                         ("lr", "criteo"), ("lr", "criteo-multihot")])
def test_every_model_exports_and_predicts_as_the_graph(run, tmp_path, datasets, model, shape):
    data_dir = datasets[f"{shape}-indexed"]
    graph, bundle = trained_and_exported(run, tmp_path, data_dir, "--model", model)
    assert bundle.name == model and graph.shape == (150,)
    np.testing.assert_allclose(split_predictions(bundle, data_dir), graph, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(bundle.predict(synthetic_instances(data_dir)), graph, rtol=0, atol=TOLERANCE)


def test_dynamic_table_in_bf16_with_deltas_exports_as_one_version(run, tmp_path, datasets):
    """Hashed keys, a dynamic table smaller than the keys seen (keys not resident read zeros),
    bf16 rows and a checkpoint of a full save and its deltas."""
    data_dir = datasets["criteo-hashed"]
    graph, bundle = trained_and_exported(run, tmp_path, data_dir, "--model", "wdl_criteo", "--table-capacity", "256",
                                         "--embedding-dtype", "bf16", "--checkpoint-every", "7",
                                         "--checkpoint-full-every", "3")
    schema = bundle.schema
    assert schema["deltas"] == 2 and bundle.version == 21 == checkpoint_version(str(tmp_path / "ckpt"))
    table = schema["tables"]["embedding"]
    assert table["storage"] == "bf16" and table["resident"] == 256 and schema["ids"] == "hashed"
    assert bundle.tables["embedding"].rows.dtype == np.uint16
    np.testing.assert_allclose(split_predictions(bundle, data_dir), graph, rtol=0, atol=TOLERANCE)
    # The indexed folder of the same spec draws the same values: its local ids are the raw values,
    # hashed from their 8 bytes as prepare --ids hashed hashed them.
    np.testing.assert_allclose(bundle.predict(synthetic_instances(datasets["criteo-indexed"])), graph, rtol=0,
                               atol=TOLERANCE)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_catch_up_optimizers_rows_export_brought_to_the_last_step(run, tmp_path, datasets, dtype):
    """adam_catchup: the rows the checkpoint holds are each as of their last read; the bundle's
    are brought to the last step, as the graph's validation reads them (local tables, deltas)."""
    data_dir = datasets["criteo-indexed"]
    graph, bundle = trained_and_exported(run, tmp_path, data_dir, "--model", "dlrm_criteo", "--optimizer",
                                         "adam_catchup", "--learning-rate", "0.01", "--embedding-dtype", dtype,
                                         "--checkpoint-every", "7", "--checkpoint-full-every", "3",
                                         "--save-params", str(tmp_path / "params.npz"))
    assert bundle.schema["deltas"] == 2
    np.testing.assert_allclose(split_predictions(bundle, data_dir), graph, rtol=0, atol=TOLERANCE)
    # every row, read by the validation or not, as --save-params brings it to the last step
    params = np.load(tmp_path / "params.npz")
    for name in ("embedding", "dlrm_first_order"):
        rows = bundle.tables[name].rows
        if dtype == "bf16":
            rows = (rows.astype(np.uint32) << 16).view(np.float32)
        np.testing.assert_array_equal(rows, params[name], err_msg=name)
    # not vacuous: the checkpoint's own rows are behind
    saved = CheckpointRows(str(tmp_path / "ckpt"))
    assert saved.catch_up["embedding"][1] == 21
    state, steps = saved.state["embedding"]
    assert (steps < 21).any() and (steps == 21).any()


# --- MovieLens 100K-shaped files with side features ------------------------------------------
OCCUPATIONS = ("writer", "executive", "student", "engineer", "other")


def movielens_100k(folder, users=40, items=30, ratings=640, seed=5):
    """u.user, u.item and u.data of the 100K format, random but well-formed; the ratings' raw
    instances (in file order) with the columns ML-1M's README names, plus 100K's release date."""
    rng = np.random.default_rng(seed)
    user_rows, item_rows, rating_rows, instances = {}, {}, [], []
    for u in range(1, users + 1):
        user_rows[u] = (int(rng.integers(18, 70)), "FM"[u % 2], OCCUPATIONS[u % 5], f"{rng.integers(0, 99999):05d}")
    for i in range(1, items + 1):
        year = int(rng.integers(1960, 1999))
        flags = (rng.random(len(GENRES_100K)) < 0.2).astype(int)
        flags[rng.integers(len(GENRES_100K))] = 1
        item_rows[i] = (f"Film {i} ({year})", f"01-Jan-{year}", flags)
    (folder / "u.user").write_text("".join(f"{u}|{a}|{g}|{o}|{z}\n" for u, (a, g, o, z) in user_rows.items()))
    (folder / "u.item").write_text("".join(f"{i}|{t}|{d}||http://x|" + "|".join(map(str, f)) + "\n"
                                           for i, (t, d, f) in item_rows.items()))
    for k in range(ratings):
        u, i = int(rng.integers(1, users + 1)), int(rng.integers(1, items + 1))
        rating_rows.append(f"{u}\t{i}\t{int(rng.integers(1, 6))}\t{880000000 + k}\n")
        age, gender, occupation, zip_code = user_rows[u]
        title, date, flags = item_rows[i]
        instances.append({"user_id": u, "movie_id": str(i), "gender": gender, "age": age, "occupation": occupation,
                          "zip_code": zip_code, "title": title, "release_date": date,
                          "genres": "|".join(g for g, f in zip(GENRES_100K, flags) if f)})
    (folder / "u.data").write_text("".join(rating_rows))
    return instances


@pytest.mark.parametrize("ids", ["indexed", "hashed"])
def test_movielens_raw_instances_with_side_features_predict_as_the_graph(run, tmp_path, ids):
    instances = movielens_100k(tmp_path)
    data_dir = prepare_movielens(tmp_path / "u.data", tmp_path / "ml", users_path=tmp_path / "u.user",
                                 items_path=tmp_path / "u.item", shuffle_seed=None, progress=False, ids=ids)
    dynamic = ["--table-capacity", "128"] if ids == "hashed" else []
    graph, bundle = trained_and_exported(run, tmp_path, data_dir, "--model", "dlrm", "--batch-size", "32", *dynamic)
    assert list(bundle.columns) == ["user_id", "movie_id", "gender", "age", "occupation", "zip_code", "title",
                                    "genres"]
    assert bundle.columns["genres"] == "bag"
    val = instances[-len(graph):]   # file order: the validation split is the last ratings
    np.testing.assert_allclose(bundle.predict(val), graph, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(split_predictions(bundle, data_dir), graph, rtol=0, atol=TOLERANCE)
    # The CLI's path: one JSON object a line.
    lines = tmp_path / "val.jsonl"
    lines.write_text("".join(json.dumps(x) + "\n" for x in val))
    assert serve_main(["predict", str(tmp_path / "bundle"), "--instances", str(lines), "--output",
                       str(tmp_path / "p.npy")]) == 0
    np.testing.assert_allclose(np.load(tmp_path / "p.npy"), graph, rtol=0, atol=TOLERANCE)
    if ids == "indexed":
        with pytest.raises(InstanceError, match=r"instance 1: column 'occupation': 'astronaut' is not a value"):
            bundle.predict([val[0], {**val[0], "occupation": "astronaut"}])
    else:   # a key training never saw reads zeros, as in training
        assert np.isfinite(bundle.predict([{**val[0], "user_id": 10 ** 6}])).all()


def criteo_lines(path, rows=1600, seed=3):
    """A Criteo train.txt of random values (some empty, some negative); its rows as raw instances
    with the columns I1..I13, C1..C26 (integers as JSON numbers or text, empty as null)."""
    rng = np.random.default_rng(seed)
    lines, instances = [], []
    for _ in range(rows):
        ints = [None if rng.random() < 0.1 else int(rng.integers(-3, 500)) for _ in range(13)]
        cats = [None if rng.random() < 0.1 else f"{int(rng.zipf(1.5)) % 300:08x}" for _ in range(26)]
        lines.append("\t".join([str(int(rng.random() < 0.3))] + ["" if v is None else str(v) for v in ints] +
                                ["" if v is None else v for v in cats]) + "\n")
        instance = {f"I{k + 1}": v if k % 2 else (None if v is None else str(v)) for k, v in enumerate(ints)}
        instance.update({f"C{f + 1}": v for f, v in enumerate(cats)})
        instances.append(instance)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(lines))
    return instances


def test_criteo_text_hashed_and_its_stream_read_raw_columns_as_training(run, tmp_path):
    """A prepared --ids hashed folder and a stream of the same file: the raw columns I1..I13
    (log1p of max(x, 0)) and C1..C26 (hashed text) give the samples training read."""
    instances = criteo_lines(tmp_path / "files" / "part-0.txt")
    assert prepare_main(["criteo", "--input", str(tmp_path / "files" / "part-0.txt"), "--output",
                         str(tmp_path / "criteo"), "--ids", "hashed", "--quiet"]) == 0
    data_dir = tmp_path / "criteo"
    graph, bundle = trained_and_exported(run, tmp_path, data_dir, "--model", "wdl_criteo", "--table-capacity", "512")
    np.testing.assert_allclose(bundle.predict(instances[-len(graph):]), graph, rtol=0, atol=TOLERANCE)
    run_stream = ["--model", "wdl_criteo", "--table-capacity", "512", "--embedding-size", "4", "--batch-size", "64",
                  "--no-progress", "--stream", str(tmp_path / "files"), "--stream-idle-exit", "0.2",
                  "--checkpoint", str(tmp_path / "stream-ckpt"), "--csv-dir", str(tmp_path / "csv")]
    train.main(run_stream)
    stream_bundle = Bundle.open(export(str(tmp_path / "stream-ckpt"), str(tmp_path / "stream-bundle")))
    assert stream_bundle.schema["ids"] == "hashed" and stream_bundle.version == 25
    val = load_dataset(str(data_dir)).val
    np.testing.assert_array_equal(stream_bundle.predict(instances[-len(graph):]),
                                  stream_bundle.predict_arrays(val.dense, val.sparse))


def test_criteo_text_indexed_reads_raw_values_through_its_vocabulary(run, tmp_path):
    """prepare criteo (indexed, --min-count 2) keeps its vocabulary: a value seen once, missing or
    never seen takes its field's bucket 0, as in training."""
    instances = criteo_lines(tmp_path / "train.txt")
    assert prepare_main(["criteo", "--input", str(tmp_path / "train.txt"), "--output", str(tmp_path / "criteo"),
                         "--min-count", "2", "--quiet"]) == 0
    graph, bundle = trained_and_exported(run, tmp_path, tmp_path / "criteo", "--model", "wdl_criteo")
    val = instances[-len(graph):]
    np.testing.assert_allclose(bundle.predict(val), graph, rtol=0, atol=TOLERANCE)
    unseen = {**val[0], "C1": "never-seen", "C2": None}
    rare = {**val[0], "C1": "", "C2": ""}
    np.testing.assert_array_equal(bundle.predict([unseen]), bundle.predict([rare]))


def test_avazu_columns_are_its_header_names(run, tmp_path):
    from hetu.data.avazu import COLUMNS
    rng = np.random.default_rng(2)
    lines, instances = [",".join(COLUMNS) + "\n"], []
    for k in range(1600):
        values = [f"{int(rng.zipf(1.6)) % 50:x}" for _ in COLUMNS[2:]]
        lines.append(",".join([str(k), str(int(rng.random() < 0.2))] + values) + "\n")
        instances.append(dict(zip(COLUMNS[2:], values)))
    (tmp_path / "train.csv").write_text("".join(lines))
    assert prepare_main(["avazu", "--input", str(tmp_path / "train.csv"), "--output", str(tmp_path / "avazu"),
                         "--quiet"]) == 0
    graph, bundle = trained_and_exported(run, tmp_path, tmp_path / "avazu", "--model", "dfm")
    assert list(bundle.columns) == list(COLUMNS[2:])
    np.testing.assert_allclose(bundle.predict(instances[-len(graph):]), graph, rtol=0, atol=TOLERANCE)


def test_an_indexed_folder_without_its_vocabulary_is_a_clear_export_error(run, tmp_path):
    movielens_100k(tmp_path)
    data_dir = prepare_movielens(tmp_path / "u.data", tmp_path / "ml", users_path=tmp_path / "u.user",
                                 items_path=tmp_path / "u.item", shuffle_seed=None, progress=False)
    run("--data-dir", str(data_dir), "--model", "dlrm", "--batch-size", "32", "--checkpoint", str(tmp_path / "ckpt"))
    (data_dir / "vocabulary.npz").unlink()
    with pytest.raises(ValueError, match=r"keeps no vocabulary .*re-run python -m hetu.data.prepare movielens"):
        export(str(tmp_path / "ckpt"), str(tmp_path / "bundle"))


# --- errors -----------------------------------------------------------------------------------
@pytest.fixture
def wdl_bundle(run, tmp_path, datasets):
    trained_and_exported(run, tmp_path, datasets["criteo-indexed"], "--model", "wdl_criteo")
    return tmp_path / "bundle"


def one_error_line(capsys, argv):
    assert serve_main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    return err


MISSING = object()


@pytest.mark.parametrize("column,value,message", [
    ("I1", MISSING, "instance 1: column 'I1': missing"),
    ("I1", "x", "instance 1: column 'I1': expected a number, found 'x'"),
    ("C2", [1, 2], "instance 1: column 'C2': expected a field-local id (an integer), found [1, 2]"),
    ("C3", 10 ** 9, "instance 1: column 'C3': id 1000000000 outside the field's"),
])
def test_bad_instances_are_one_line_naming_the_instance_and_column(wdl_bundle, tmp_path, datasets, capsys, column,
                                                                   value, message):
    good = synthetic_instances(datasets["criteo-indexed"])[0]
    bad = {k: v for k, v in good.items() if k != column}
    if value is not MISSING:
        bad[column] = value
    with pytest.raises(InstanceError) as caught:
        Bundle.open(str(wdl_bundle)).predict([good, bad])
    assert str(caught.value).startswith(message)
    lines = tmp_path / "bad.jsonl"
    lines.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    err = one_error_line(capsys, ["predict", str(wdl_bundle), "--instances", str(lines), "--output",
                                  str(tmp_path / "p.npy")])
    assert message in err, err


def test_a_missing_checkpoint_and_an_unknown_model_are_one_line(wdl_bundle, tmp_path, capsys):
    err = one_error_line(capsys, ["export", "--checkpoint", str(tmp_path / "none"), "--output", str(tmp_path / "b")])
    assert "is not a hetu checkpoint" in err
    meta_path = tmp_path / "ckpt" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["run"]["model"] = "resnet"
    meta["run"]["spec"]["model"]["name"] = "resnet"   # the run spec it records names it too
    meta_path.write_text(json.dumps(stamped(meta)))   # a well-formed checkpoint of another model
    err = one_error_line(capsys, ["export", "--checkpoint", str(tmp_path / "ckpt"), "--output", str(tmp_path / "b")])
    assert "unknown model 'resnet'" in err
    assert not (tmp_path / "b").exists()


def test_export_runs_outside_the_repository_and_ignores_an_old_models_dir(wdl_bundle, tmp_path, datasets):
    """hetu.serve imports the models as the library's hetu.models: an export from another folder,
    with no examples/ on sys.path, loads nothing of examples/, and the "models_dir" that older
    training wrote into the run record is ignored (here one naming a package that fails to load)."""
    old_models = tmp_path / "old_models"
    old_models.mkdir()
    (old_models / "__init__.py").write_text("raise ImportError('the run record\\'s models_dir was imported')\n")
    meta_path = tmp_path / "ckpt" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta["run"]["models_dir"] = str(old_models)
    meta_path.write_text(json.dumps(stamped(meta)))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    examples = str(REPO / "examples")
    script = (f"import json, sys; assert not any(p.startswith({examples!r}) for p in sys.path), sys.path; "
              f"from hetu.serve.export import export; export({str(tmp_path / 'ckpt')!r}, 'bundle'); "
              f"print(json.dumps(sorted(n for n, m in list(sys.modules.items()) "
              f"if str(getattr(m, '__file__', None) or '').startswith({examples!r}))))")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                                                      if p and not p.startswith(examples)))
    proc = jobs.run([sys.executable, "-c", script], cwd=elsewhere, env=env, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == []   # the modules loaded from examples/
    np.testing.assert_array_equal(split_predictions(Bundle.open(str(elsewhere / "bundle")), datasets["criteo-indexed"]),
                                  split_predictions(Bundle.open(str(wdl_bundle)), datasets["criteo-indexed"]))


def test_an_op_without_an_onnx_mapping_is_named():
    x = ht.placeholder_op("dense")
    w = ht.Variable("w", value=np.ones((3, 2), np.float32))
    prediction = ht.sigmoid_op(ht.reduce_sum_op(ht.one_hot_op(ht.matmul_op(x, w), 4), axes=[1, 2], keepdims=False))
    with pytest.raises(onnx_graph.ExportError, match=r"op OneHotOp \(OneHot_\d+\) has no ONNX mapping"):
        onnx_graph.build(prediction, x, {"w": w.value}, {}, [], 3, 1)


def test_a_new_export_replaces_the_bundle_whole_and_threads_share_one(wdl_bundle, tmp_path, datasets):
    bundle = Bundle.open(str(wdl_bundle))
    instances = synthetic_instances(datasets["criteo-indexed"])
    expected = bundle.predict(instances)
    # each thread's batch against the same batch predicted alone: ONNX Runtime's GEMMs may round
    # a row apart at another batch size (one ulp, with the first-order terms' dense linear layer)
    alone = [bundle.predict(instances[k::4]) for k in range(4)]
    results, errors = {}, []

    def call(k):
        try:
            results[k] = bundle.predict(instances[k::4])
        except Exception as e:   # noqa: BLE001 -- reported below
            errors.append(e)
    workers = [threading.Thread(target=call, args=(k,)) for k in range(4)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    assert not errors
    for k in range(4):
        np.testing.assert_array_equal(results[k], alone[k])
    assert export(str(tmp_path / "ckpt"), str(wdl_bundle)) == str(wdl_bundle)
    assert sorted(p.name for p in tmp_path.iterdir() if "bundle" in p.name) == ["bundle"]
    np.testing.assert_array_equal(Bundle.open(str(wdl_bundle)).predict(instances), expected)


def swap_in_place(newer, directory):
    """What a job's full save does to `directory`: set aside, the newer folder renamed in, the old
    one removed (hetu.checkpoint.swap_in)."""
    os.rename(directory, str(directory) + ".previous")
    os.rename(newer, directory)
    shutil.rmtree(str(directory) + ".previous")


def test_a_checkpoint_replaced_while_it_is_read_is_read_again(run, tmp_path, datasets, monkeypatch):
    """A newer full save swapped in while export reads the old one's files: the rows read are
    refused (the save in place is no longer the one read) and the newer save is read whole; a
    checkpoint replaced at every read is an error saying so."""
    data = datasets["criteo-indexed"]
    run("--data-dir", str(data), "--model", "wdl_criteo", "--checkpoint", str(tmp_path / "ckpt"))
    run("--data-dir", str(data), "--model", "wdl_criteo", "--checkpoint", str(tmp_path / "newer"), "--nepoch", "2")
    export(str(tmp_path / "newer"), str(tmp_path / "newer-bundle"))
    newer = Bundle.open(str(tmp_path / "newer-bundle"))
    saves = [tmp_path / "older-copy", tmp_path / "newer-copy"]   # two saves, to swap in by turns
    shutil.copytree(tmp_path / "ckpt", saves[0])
    shutil.copytree(tmp_path / "newer", saves[1])

    real = CheckpointRows._local_arrays
    swaps = []

    def read_then_swap(folder, chain):
        arrays = real(folder, chain)
        if not swaps:   # the job's save lands once, after the old save's arrays were read
            swap_in_place(tmp_path / "newer", tmp_path / "ckpt")
            swaps.append(folder)
        return arrays
    monkeypatch.setattr(CheckpointRows, "_local_arrays", staticmethod(read_then_swap))
    bundle = Bundle.open(export(str(tmp_path / "ckpt"), str(tmp_path / "bundle")))
    assert swaps and bundle.version == newer.version > 0
    instances = synthetic_instances(data)
    np.testing.assert_array_equal(bundle.predict(instances), newer.predict(instances))

    def read_then_always_swap(folder, chain):
        arrays = real(folder, chain)
        swaps.append(folder)
        shutil.copytree(saves[len(swaps) % 2], tmp_path / "next")
        swap_in_place(tmp_path / "next", tmp_path / "ckpt")
        return arrays
    monkeypatch.setattr(CheckpointRows, "_local_arrays", staticmethod(read_then_always_swap))
    with pytest.raises(ExportError, match="was replaced by a newer save while it was read"):
        export(str(tmp_path / "ckpt"), str(tmp_path / "bundle2"))
    assert not os.path.exists(tmp_path / "bundle2")


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script,mode", [("run_hetu.py", ["--comm", "PS"]),
                                         ("run_laia.py", ["--comm", "Hybrid", "--cache", "lru", "--bound", "0",
                                                          "--bsp", "0"]),
                                         ],
                         ids=["PS", "Herald"])
def test_servers_shards_and_deltas_of_two_workers_export(tmp_path, datasets, script, mode):
    """2 workers, 2 servers, plain PS and Herald: the tables and dense parameters come from the
    servers' shard and delta files; the predictions gathered from both workers are the split's,
    in order (Herald plans the training batches only; validation is each worker's slice)."""
    data_dir = datasets["criteo-hashed"]
    cmd = [sys.executable, str(REPO / "python/runner.py"), "-w", "2", "-s", "2", "--timeout", "240", sys.executable,
           str(REPO / "examples/ctr" / script), *TINY, "--batch-size", "32", *mode, "--model", "wdl_criteo",
           "--data-dir", str(data_dir), "--table-capacity", "256", "--embedding-dtype", "bf16",
           "--checkpoint", str(tmp_path / "ckpt"), "--checkpoint-every", "7", "--checkpoint-full-every", "3",
           "--save-predictions", str(tmp_path / "graph.npy"), "--save-params", str(tmp_path / "params.npz")]
    proc = jobs.run(cmd, capture_output=True, text=True, timeout=280, env={**os.environ, "HETU_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert any(name.startswith("embedding.delta") for name in os.listdir(tmp_path / "ckpt/deltas/000001/ps"))
    export(str(tmp_path / "ckpt"), str(tmp_path / "bundle"))
    bundle = Bundle.open(str(tmp_path / "bundle"))
    np.testing.assert_allclose(split_predictions(bundle, data_dir), np.load(tmp_path / "graph.npy"), rtol=0,
                               atol=TOLERANCE)
    # The dynamic table's resident rows, by key, as --save-params writes them.
    params, table = np.load(tmp_path / "params.npz"), bundle.tables["embedding"]
    rows = (np.asarray(table.rows)[np.asarray(table.slots)].astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(np.asarray(table.keys), params["embedding:keys"])
    np.testing.assert_array_equal(rows, params["embedding"])


def test_a_catch_up_optimizers_server_rows_export_brought_to_the_last_step(tmp_path, datasets):
    """adamw_catchup under Herald, 2 workers and 2 servers, bf16: the servers' shards and deltas
    hold each row as of its last read, with its optimizer state and step; the bundle's rows are
    every row brought to the last step, as --save-params pulls them."""
    data_dir = datasets["criteo-indexed"]
    cmd = [sys.executable, str(REPO / "python/runner.py"), "-w", "2", "-s", "2", "--timeout", "240", sys.executable,
           str(REPO / "examples/ctr/run_laia.py"), *TINY, "--batch-size", "32", "--comm", "Hybrid", "--cache", "lru",
           "--bound", "0", "--bsp", "0", "--optimizer", "adamw_catchup", "--model", "wdl_criteo",
           "--data-dir", str(data_dir), "--embedding-dtype", "bf16", "--checkpoint", str(tmp_path / "ckpt"),
           "--checkpoint-every", "7", "--checkpoint-full-every", "3", "--save-predictions", str(tmp_path / "graph.npy"),
           "--save-params", str(tmp_path / "params.npz")]
    proc = jobs.run(cmd, capture_output=True, text=True, timeout=280, env={**os.environ, "HETU_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    export(str(tmp_path / "ckpt"), str(tmp_path / "bundle"))
    bundle = Bundle.open(str(tmp_path / "bundle"))
    assert bundle.schema["deltas"] == 2
    np.testing.assert_allclose(split_predictions(bundle, data_dir), np.load(tmp_path / "graph.npy"), rtol=0,
                               atol=TOLERANCE)
    params = np.load(tmp_path / "params.npz")
    rows = (np.asarray(bundle.tables["embedding"].rows).astype(np.uint32) << 16).view(np.float32)
    np.testing.assert_array_equal(rows, params["embedding"])
    _, steps = CheckpointRows(str(tmp_path / "ckpt")).state["embedding"]
    assert (steps < 21).any() and (steps == 21).any()   # not vacuous: the saved rows are behind


# --- each op's ONNX mapping against its own forward --------------------------------------------
def _w(name, shape, seed):
    return ht.Variable(name, value=np.random.default_rng(seed).normal(size=shape).astype(np.float32))


def _stack(x):
    return ht.array_reshape_op(x, (-1, 3, 2))


OP_GRAPHS = {
    "elementwise": lambda x: x * x + x - x / (x * x + 2.0) + (2.0 - x * 3.0) + 1.0 / (x * x + 5.0) + (-x),
    "unary": lambda x: ht.sqrt_op(ht.exp_op(x)) + ht.log_op(x * x + 10.0) + ht.power_op(x, 3),
    "activations": lambda x: ht.relu_op(x) + ht.leaky_relu_op(x, 0.2) + ht.tanh_op(x) + ht.gelu_op(x) +
    ht.softmax_op(x) + ht.sigmoid_op(x),
    "matmul": lambda x: ht.concat_op(ht.matmul_op(x, _w("w", (4, 6), 1), trans_B=True),
                                     ht.matmul_op(x, _w("v", (6, 3), 2)), axis=1),
    "stacked matmul": lambda x: ht.concat_op(ht.lower_triangle_op(ht.matmul_op(_stack(x), _stack(x), trans_B=True)),
                                             ht.array_reshape_op(ht.matmul_op(_stack(x), _stack(x), trans_A=True),
                                                                 (-1, 4)), axis=1),
    "reductions": lambda x: ht.concat_op(ht.reduce_mean_op(x, axes=[1], keepdims=True),
                                         ht.reduce_sum_op(ht.array_reshape_op(x, (-1, 2, 3)), axes=[2]), axis=1),
    "shapes": lambda x: ht.concatenate_op([ht.array_reshape_op(ht.transpose_op(ht.array_reshape_op(x, (-1, 2, 3)),
                                                                               (0, 2, 1)), (-1, 6)),
                                           ht.slice_op(x, (0, 2), (-1, 3)),
                                           ht.broadcastto_op(_w("b", (6,), 3), x),
                                           ht.where_op(ht.relu_op(x), x, x * 2.0),
                                           ht.sum_op([x, x, x])], axis=1),
    "norms": lambda x: ht.layer_normalization_op(x, _w("g", (6,), 4), _w("beta", (6,), 5)) +
    ht.batch_normalization_op(ht.dropout_op(x, 0.5), _w("s", (6,), 6), _w("c", (6,), 7)),
}


@pytest.mark.parametrize("name", sorted(OP_GRAPHS))
def test_each_op_mapping_computes_its_forward(name):
    import onnxruntime as ort
    x = ht.placeholder_op("dense")
    out = OP_GRAPHS[name](x)
    prediction = ht.reduce_sum_op(out, axes=[1], keepdims=True)
    batch = np.random.default_rng(0).normal(size=(5, 6)).astype(np.float32)
    expected = ht.Executor([prediction]).run(feed_dict={x: batch}, convert_to_numpy_ret_vals=True, training=False)[0]
    values = {n.name: n.value for n in ht.topo_sort([prediction]) if isinstance(n, ht.Variable) and n.is_parameter}
    persistent = {f"{n.name}/{k}": np.full(6, fill, np.float32) for n in ht.topo_sort([prediction])
                  if type(n).__name__ == "BatchNormOp" for k, fill in (("running_mean", 0.0), ("running_var", 1.0))}
    model = onnx_graph.build(prediction, x, values, persistent, [], 6, 1)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = session.run(["probability"], {"dense": batch})[0]
    np.testing.assert_allclose(got, expected.reshape(-1), rtol=1e-5, atol=1e-5)


def stream_bundle(run, tmp_path, files, *flags):
    """The bundle of a tiny stream job on `files` (a folder)."""
    run_args = ["--table-capacity", "128", "--embedding-size", "4", "--batch-size", "32", "--no-progress",
                "--stream", str(files), "--stream-idle-exit", "0.2", "--checkpoint", str(tmp_path / "ckpt"),
                "--csv-dir", str(tmp_path / "csv"), *flags]
    train.main(run_args)
    return Bundle.open(export(str(tmp_path / "ckpt"), str(tmp_path / "bundle")))


def parsed(fmt, path):
    """The samples of a stream file by its format's Python definition: (dense, keys)."""
    from hetu.data.stream_formats import BadLineRecorder
    lines = path.read_text().splitlines(keepends=True)
    fmt.begin_file(lines[0], str(path))
    dense, sparse, _ = fmt.parse_lines(lines, str(path), 1, BadLineRecorder())
    return dense, sparse


def test_a_schema_stream_reads_its_own_columns(run, tmp_path):
    """A schema file's columns: a dense one through log1p, a categorical one, a bag, an ignored one."""
    from hetu.data.stream_formats import SchemaFormat
    (tmp_path / "schema.yaml").write_text(
        "delimiter: \",\"\ncolumns:\n  - {name: click, role: label}\n  - {name: price, role: dense, transform: log1p}\n"
        "  - {name: user, role: categorical}\n  - {name: tags, role: bag, separator: \"|\", slots: 3}\n"
        "  - {role: ignore}\n")
    rng = np.random.default_rng(1)
    rows, instances = [], []
    for k in range(400):
        price, user = f"{rng.random() * 100:.2f}", f"u{rng.integers(60)}"
        tags = "|".join(f"t{t}" for t in rng.choice(12, int(rng.integers(0, 4)), replace=False))
        rows.append(f"{int(rng.random() < 0.4)},{price},{user},{tags},x{k}\n")
        instances.append({"price": price, "user": user, "tags": tags})
    (tmp_path / "files").mkdir()
    (tmp_path / "files" / "part-0.csv").write_text("".join(rows))
    bundle = stream_bundle(run, tmp_path, tmp_path / "files", "--model", "dlrm", "--stream-format",
                           f"schema:{tmp_path / 'schema.yaml'}")
    assert bundle.columns == {"price": "dense", "user": "categorical", "tags": "bag"}
    dense, sparse = parsed(SchemaFormat.from_file(tmp_path / "schema.yaml"), tmp_path / "files" / "part-0.csv")
    np.testing.assert_array_equal(bundle.predict(instances), bundle.predict_arrays(dense, sparse))
    with pytest.raises(InstanceError, match=r"instance 0: column 'tags': 4 values, more than its 3 slots"):
        bundle.predict([{**instances[0], "tags": "a|b|c|d"}])


def test_a_movielens_stream_with_side_files_reads_the_readme_columns(run, tmp_path):
    from hetu.data.stream_formats import MovieLensFormat
    instances = movielens_100k(tmp_path)
    (tmp_path / "files").mkdir()
    (tmp_path / "u.data").rename(tmp_path / "files" / "u.data")
    bundle = stream_bundle(run, tmp_path, tmp_path / "files", "--model", "dlrm", "--stream-format", "movielens",
                           "--users", str(tmp_path / "u.user"), "--items", str(tmp_path / "u.item"))
    dense, sparse = parsed(MovieLensFormat(tmp_path / "u.user", tmp_path / "u.item"), tmp_path / "files" / "u.data")
    np.testing.assert_array_equal(bundle.predict(instances), bundle.predict_arrays(dense, sparse))
