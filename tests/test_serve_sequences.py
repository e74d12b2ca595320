"""Serving the sequential models (docs/design.md section 17, "Serving"): a SASRec or HSTU checkpoint
exports to a bundle whose ONNX encoder gives the user vectors hetu's own graph computes from the
trained parameters, and whose top K items are the highest inner products with the normalised item
table, the history's items left out; the HTTP endpoint answers raw histories as the bundle does
in process, and a bad history is one line naming the instance."""
import json
import os
import sys
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("aiohttp")

import hetu as ht  # noqa: E402
import jobs  # noqa: E402
from conftest import REPO  # noqa: E402
from dist_harness import THREADS  # noqa: E402
from hetu.data import load_dataset  # noqa: E402
from hetu.data.sequences import generate_synthetic_sequences, load_sequences  # noqa: E402
from hetu.serve.bundle import Bundle, InstanceError  # noqa: E402
from hetu.serve.export import export  # noqa: E402
from test_serve_http import Server  # noqa: E402

from hetu.models.sequential import SequenceConfig, serving  # noqa: E402

TRAIN = ["--no-progress", "--embedding-size", "16", "--num-negatives", "8", "--iters-per-epoch", "4",
         "--batch-size", "32", "--heads", "2", "--nepoch", "1"]
USERS = 48


# (model, what it trains on): hashed item ids on a dynamic table, whose rows export writes with
# their keys, too.
MODELS = {"sasrec_synthetic": [], "hstu_synthetic": [], "sasrec": ["--table-capacity", "4000", "--admit-after", "2"]}


@pytest.fixture(scope="module", params=sorted(MODELS))
def exported(request, tmp_path_factory, data_home):
    """(model, trained parameters (the item table's rows in catalog order), bundle path, the
    sequences data) of a short run."""
    folder = tmp_path_factory.mktemp(request.param)
    os.environ["HETU_DATA_HOME"] = data_home
    data = load_dataset("synthetic-sequences")
    flags = MODELS[request.param]
    if flags:
        data = load_sequences(generate_synthetic_sequences(folder / "hashed", users=300, items=3000, ids="hashed"))
        flags = [*flags, "--data-dir", str(data.path)]
    env = dict(os.environ, HETU_DATA_HOME=data_home, **THREADS)
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--model", request.param, *TRAIN, *flags,
                     "--checkpoint", str(folder / "ckpt"), "--save-params", str(folder / "params.npz")],
                    capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    params = dict(np.load(folder / "params.npz"))
    if data.item_keys is not None:   # the resident keys' rows: in catalog order, zeros for the others
        keys, rows = params.pop("item_embedding:keys"), params["item_embedding"]
        table = np.zeros((data.meta.num_items, rows.shape[1]), np.float32)
        at = np.searchsorted(keys, data.item_keys)
        held = (at < len(keys)) & (keys[np.minimum(at, len(keys) - 1)] == data.item_keys)
        table[held] = rows[at[held]]
        assert 100 < held.sum() < len(table)
        params["item_embedding"] = table
    return request.param, params, export(str(folder / "ckpt"), str(folder / "bundle")), data


def graph_user_vectors(kind, params, data, history, times):
    """hetu's own forward of the trained parameters (a static table in catalog order; histories of
    catalog indices): the user vectors the bundle must give."""
    config = SequenceConfig(num_items=data.meta.num_items, max_length=data.meta.max_length, embedding_size=16,
                            heads=2, num_negatives=8)
    ids = ht.placeholder_op("history", dtype=np.int64)
    stamps = ht.placeholder_op("times", dtype=np.int64) if kind == "hstu" else None
    user, _ = serving(kind, ids, stamps, config)
    executor = ht.Executor({"validate": [user]}, ctx=ht.cpu(0), seed=0)
    for p in executor.graph.parameters:
        executor.params.values[p.id][...] = params[p.name]
    feed = {ids: history, **({stamps: times} if stamps is not None else {})}
    return executor.run("validate", feed_dict=feed, convert_to_numpy_ret_vals=True)[0]


def raw_instances(data, users, k):
    items, times = data.catalog_index(data.val.items[:users]), np.asarray(data.val.times[:users])
    out = []
    for row, stamps in zip(items, times):
        filled = row >= 0
        out.append({"history": data.item_ids[row[filled]].tolist(), "timestamps": stamps[filled].tolist(), "k": k})
    return out


def test_the_bundle_answers_as_the_graph(exported):
    model, params, path, data = exported
    bundle = Bundle.open(path)
    kind = model.split("_")[0]
    history, times = data.catalog_index(data.val.items[:USERS]), np.asarray(data.val.times[:USERS])
    expected = graph_user_vectors(kind, params, data, history, times)
    got = bundle.user_vectors(history, times)
    assert got.shape == (USERS, 16)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert np.abs(expected).max() > 0.05   # a trained vector, not zeros

    # The top K of raw histories: the catalog ranked by the trained, normalised table.
    k = 20
    answers = bundle.predict(raw_instances(data, USERS, k))
    table = params["item_embedding"] / np.maximum(np.linalg.norm(params["item_embedding"], axis=1, keepdims=True), 1e-6)
    scores = expected @ table.T
    for i, answer in enumerate(answers):
        seen = history[i][history[i] >= 0]
        scores[i, seen] = -np.inf
        best = np.argsort(-scores[i], kind="stable")[:k]
        assert answer["items"] == data.item_ids[best].tolist(), i
        np.testing.assert_allclose(answer["scores"], scores[i, best], rtol=1e-4, atol=1e-5)
        assert not set(answer["items"]) & set(data.item_ids[seen].tolist())


def test_a_history_longer_than_the_model_reads_its_last_items(exported):
    model, _, path, data = exported
    bundle = Bundle.open(path)
    L = data.meta.max_length
    items = data.item_ids[np.arange(L + 7) % data.meta.num_items].tolist()
    long = {"history": items, "timestamps": list(range(L + 7)), "k": 5}
    tail = {"history": items[-L:], "timestamps": list(range(7, L + 7)), "k": 5}
    assert bundle.predict([long]) == bundle.predict([tail])


@pytest.mark.parametrize("instance,says", [
    ({"history": [-12345]}, "item -12345 is not an item"),
    ({"history": []}, "at least one raw item id"),
    ({"history": "1 2"}, "a list of integers"),
    ({"history": [1], "k": 0}, "column 'k'"),
    ({"history": [1], "genre": "x"}, "unknown column 'genre'")])
def test_a_bad_history_is_one_line_naming_the_instance(exported, instance, says):
    _, _, path, data = exported
    bundle = Bundle.open(path)
    good = {"history": [int(data.item_ids[0])], "timestamps": [5]}
    fixed = {**({"timestamps": [5] * len(instance["history"])} if isinstance(instance["history"], list) else {}),
             **{k: [int(data.item_ids[0])] if v == [1] else v for k, v in instance.items()}}
    with pytest.raises(InstanceError, match=r"instance 1: .*" + says.replace("(", r"\(")):
        bundle.predict([good, fixed])


def test_hstu_needs_the_timestamps(exported):
    model, _, path, data = exported
    bundle = Bundle.open(path)
    instance = {"history": [int(data.item_ids[0])]}
    if model.startswith("hstu"):
        with pytest.raises(InstanceError, match="instance 0: column 'timestamps'"):
            bundle.predict([instance])
    else:
        assert len(bundle.predict([instance])[0]["items"]) == 10


def post(base, path, document):
    request = urllib.request.Request(base + path, data=json.dumps(document).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_endpoint_answers_histories_as_the_bundle(exported, tmp_path):
    model, _, path, data = exported
    bundle = Bundle.open(path)
    instances = raw_instances(data, 6, 7)
    server = Server(tmp_path, path, env=THREADS)
    try:
        server.wait_ready(model)
        status, answer = post(server.base, f"/v1/models/{model}:predict", {"instances": instances})
        assert status == 200, answer
        assert answer["predictions"] == json.loads(json.dumps(bundle.predict(instances)))
        assert answer["model_version"] == bundle.version
        status, answer = post(server.base, f"/v1/models/{model}:predict",
                              {"instances": [instances[0], {"history": [-5], "timestamps": [1]}]})
        assert status == 400 and answer["error"].startswith("instance 1: column 'history': item -5"), answer
    finally:
        server.stop()
