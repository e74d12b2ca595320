"""The endpoint speaks TensorFlow Serving's REST API (docs/design.md section 16; TensorFlow Serving's
api_rest.md and its handler's tests): model status and metadata, predict in the row and the
columnar form, /versions/V and /labels/L URLs, {"b64": ...} strings, "signature_name", and its
answers to malformed requests, with its status codes and error texts. One server process on one
bundle of Criteo text (hashed ids: DT_INT64 and DT_STRING columns) answers a real HTTP client."""
import base64
import json
import os
import sys
import types
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("onnxruntime")

import jobs  # noqa: E402
from conftest import REPO  # noqa: E402
from dist_harness import THREADS  # noqa: E402
from hetu.data.prepare import main as prepare_main  # noqa: E402
from hetu.serve import rest  # noqa: E402
from hetu.serve.bundle import Bundle  # noqa: E402
from hetu.serve.export import export  # noqa: E402
from test_serve_export import criteo_lines  # noqa: E402
from test_serve_http import Server  # noqa: E402
from test_serve_sequences import exported, raw_instances  # noqa: E402,F401 - the fixture, shared

ROWS = 600


def call(base, method, path, body=None):
    """(status, JSON answer) of `method` on `path`; `body` bytes or a JSON-able object."""
    data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


@pytest.fixture(scope="module")
def criteo(tmp_path_factory):
    """(bundle path, raw instances of Criteo text: I1..I13 integers, C1..C26 hex strings)."""
    folder = tmp_path_factory.mktemp("rest")
    instances = criteo_lines(folder / "files" / "part-0.txt", rows=ROWS)
    assert prepare_main(["criteo", "--input", str(folder / "files" / "part-0.txt"), "--output",
                         str(folder / "criteo"), "--ids", "hashed", "--quiet"]) == 0
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress", "--model", "wdl_criteo",
                     "--data-dir", str(folder / "criteo"), "--table-capacity", "512", "--embedding-size", "4",
                     "--batch-size", "64", "--nepoch", "1", "--checkpoint", str(folder / "ckpt")],
                    capture_output=True, text=True, env=dict(os.environ, **THREADS), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return export(str(folder / "ckpt"), str(folder / "bundle")), instances[:8]


@pytest.fixture(scope="module")
def server(criteo, tmp_path_factory):
    """(Server, Bundle, instances): one server for the module, labels "stable" and "canary"."""
    path, instances = criteo
    bundle = Bundle.open(path)
    with Server(tmp_path_factory.mktemp("rest-server"), path, "--version-label", "stable", "--version-label",
                "canary", env=THREADS) as started:
        started.wait_ready(bundle.name)
        yield started, bundle, instances
        assert started.stop() == 0


def columns_of(instances):
    return {name: [instance[name] for instance in instances] for name in instances[0]}


def test_status_for_the_model_its_version_and_its_labels(server):
    srv, bundle, _ = server
    name, v = bundle.name, bundle.version
    expected = {"model_version_status": [{"version": str(v), "state": "AVAILABLE",
                                          "status": {"error_code": "OK", "error_message": ""}}]}
    for path in (f"/v1/models/{name}", f"/v1/models/{name}/versions/{v}", f"/v1/models/{name}/labels/stable",
                 f"/v1/models/{name}/labels/canary"):
        assert call(srv.base, "GET", path) == (200, expected), path
    assert call(srv.base, "GET", f"/v1/models/{name}/versions/{v + 1}") == \
        (404, {"error": f"Could not find version {v + 1} of model {name}"})
    assert call(srv.base, "GET", "/v1/models/half") == (404, {"error": "Could not find any versions of model half"})
    assert call(srv.base, "GET", f"/v1/models/{name}/labels/nightly") == \
        (400, {"error": "Unrecognized servable version label: nightly"})


def test_metadata_is_the_serving_default_signature_of_the_raw_columns(server):
    srv, bundle, _ = server
    name, v = bundle.name, bundle.version
    status, answer = call(srv.base, "GET", f"/v1/models/{name}/metadata")
    assert status == 200, answer
    assert answer["model_spec"] == {"name": name, "signature_name": "", "version": str(v)}
    signatures = answer["metadata"]["signature_def"]["signature_def"]
    assert list(signatures) == ["serving_default"]
    sig = signatures["serving_default"]
    assert sig["method_name"] == "tensorflow/serving/predict"
    assert list(sig["inputs"]) == list(bundle.columns) == [f"I{k}" for k in range(1, 14)] + \
        [f"C{k}" for k in range(1, 27)]
    batch = {"dim": [{"size": "-1", "name": ""}], "unknown_rank": False}
    assert sig["inputs"]["I1"] == {"dtype": "DT_INT64", "tensor_shape": batch, "name": "I1"}
    assert sig["inputs"]["C26"] == {"dtype": "DT_STRING", "tensor_shape": batch, "name": "C26"}
    assert sig["outputs"] == {"probability": {"dtype": "DT_FLOAT", "tensor_shape": batch, "name": "probability"}}
    for path in (f"/v1/models/{name}/versions/{v}/metadata", f"/v1/models/{name}/labels/stable/metadata"):
        assert call(srv.base, "GET", path) == (200, answer), path
    assert call(srv.base, "GET", f"/v1/models/{name}/versions/{v + 1}/metadata") == \
        (404, {"error": f"Servable not found for request: Specific({name}, {v + 1})"})
    assert call(srv.base, "GET", "/v1/models/half/metadata") == \
        (404, {"error": "Servable not found for request: Latest(half)"})


def test_predict_in_the_row_and_the_columnar_form(server):
    srv, bundle, instances = server
    name, v = bundle.name, bundle.version
    expected = bundle.predict(instances)
    for path in (f"/v1/models/{name}:predict", f"/v1/models/{name}/versions/{v}:predict",
                 f"/v1/models/{name}/labels/canary:predict"):
        for body in ({"instances": instances}, {"signature_name": "serving_default", "instances": instances}):
            status, answer = call(srv.base, "POST", path, body)
            assert status == 200 and sorted(answer) == ["model_version", "predictions"], (path, answer)
            assert answer["model_version"] == v
            np.testing.assert_allclose(answer["predictions"], expected, rtol=1e-5, atol=1e-6)
        status, answer = call(srv.base, "POST", path, {"inputs": columns_of(instances)})
        assert status == 200 and sorted(answer) == ["model_version", "outputs"], (path, answer)
        np.testing.assert_allclose(answer["outputs"], expected, rtol=1e-5, atol=1e-6)
    # Columnar: inputs the signature does not have are ignored, as TensorFlow Serving does.
    status, answer = call(srv.base, "POST", f"/v1/models/{name}:predict",
                          {"inputs": {**columns_of(instances), "extra": [1] * len(instances)}})
    assert status == 200, answer
    np.testing.assert_allclose(answer["outputs"], expected, rtol=1e-5, atol=1e-6)


def test_b64_values_of_string_inputs_are_their_decoded_text(server):
    srv, bundle, instances = server
    url = f"/v1/models/{bundle.name}:predict"
    encoded = [{k: {"b64": base64.b64encode(v.encode()).decode()} if k.startswith("C") and v else v
                for k, v in instance.items()} for instance in instances]
    assert encoded[0] != instances[0]
    expected = bundle.predict(instances)
    status, answer = call(srv.base, "POST", url, {"instances": encoded})
    assert status == 200, answer
    np.testing.assert_allclose(answer["predictions"], expected, rtol=1e-5, atol=1e-6)
    status, answer = call(srv.base, "POST", url, {"inputs": columns_of(encoded)})
    assert status == 200, answer
    np.testing.assert_allclose(answer["outputs"], expected, rtol=1e-5, atol=1e-6)
    escaped = json.dumps({"instances": encoded}).replace('"b64"', '"\\u0062\\u0036\\u0034"').encode()
    assert b"b64" not in escaped
    status, answer = call(srv.base, "POST", url, escaped)
    assert status == 200, answer
    np.testing.assert_allclose(answer["predictions"], expected, rtol=1e-5, atol=1e-6)
    for column, value, says in (("C1", {"b64": "%%%"}, "Unable to base64 decode"),
                                ("C1", {"b64": "aGk=", "x": 1}, "not formatted correctly for base64 data"),
                                ("I1", {"b64": "aGk="}, "column 'I1'")):
        status, answer = call(srv.base, "POST", url, {"instances": [instances[0], {**instances[1], column: value}]})
        assert status == 400 and says in answer["error"] and "instance 1" in answer["error"], answer


@pytest.mark.parametrize("body,says", [
    (b"", "not JSON"),
    (b"instances = [1, 2]", "not JSON"),
    (b"[1, 2]", "not a JSON object"),
    ({"signature_name": 100, "instances": []}, "'signature_name' key must be a string value."),
    ({"signature_name": "classify_x", "instances": "*"}, 'Serving signature name: "classify_x" not found'),
    ({"instances": "*", "inputs": "*"}, "expecting only one of 'inputs' or 'instances' keys"),
    ({"examples": []}, "Missing 'inputs' or 'instances' key"),
    ({"instances": {}}, "Expecting 'instances' to be an list/array"),
    ({"instances": []}, "No values in 'instances' array"),
    ({"instances": [1.0, 2.0]}, "instance 0 is a JSON number"),
    ({"instances": "ROWS"}, "instance 1: unknown column 'genre'"),
    ({"instances": "MISSING"}, "instance 1: column 'C26': missing"),
    ({"inputs": [1.0, 2.0]}, "inputs is a plain value/list"),
    ({"inputs": {"I1": [1]}}, "Missing named input: I2 in 'inputs' object."),
    ({"inputs": "SHORT"}, "input 'C26' has 1 values, input 'I1' 2"),
])
def test_malformed_predict_bodies_are_400_in_one_line(server, body, says):
    srv, bundle, instances = server
    rows = instances[:2]
    templates = {"ROWS": {"instances": [rows[0], {**rows[1], "genre": "x"}]},
                 "MISSING": {"instances": [rows[0], {k: v for k, v in rows[1].items() if k != "C26"}]},
                 "SHORT": {"inputs": {**columns_of(rows), "C26": [rows[0]["C26"]]}}}
    marker = body.get("instances", body.get("inputs")) if isinstance(body, dict) else None
    if isinstance(marker, str) and marker in templates:
        body = templates[marker]
    status, answer = call(srv.base, "POST", f"/v1/models/{bundle.name}:predict", body)
    assert status == 400 and sorted(answer) == ["error"], answer
    assert says in answer["error"] and "\n" not in answer["error"], answer
    # the server goes on
    assert call(srv.base, "POST", f"/v1/models/{bundle.name}:predict", {"instances": rows})[0] == 200


def test_other_models_versions_and_labels(server):
    srv, bundle, instances = server
    name, v = bundle.name, bundle.version
    body = {"instances": instances[:1]}
    assert call(srv.base, "POST", "/v1/models/half:predict", body) == \
        (404, {"error": "Servable not found for request: Latest(half)"})
    assert call(srv.base, "POST", f"/v1/models/{name}/versions/{v + 7}:predict", body) == \
        (404, {"error": f"Servable not found for request: Specific({name}, {v + 7})"})
    assert call(srv.base, "POST", f"/v1/models/{name}/labels/nightly:predict", body) == \
        (400, {"error": "Unrecognized servable version label: nightly"})


def test_classify_and_regress_are_signatures_a_bundle_does_not_have(server):
    srv, bundle, instances = server
    name = bundle.name
    examples = {"examples": instances[:1]}
    assert call(srv.base, "POST", f"/v1/models/{name}:classify", examples) == (400, {"error": (
        "Expected classification signature method_name to be tensorflow/serving/classify. "
        "Was: tensorflow/serving/predict")})
    assert call(srv.base, "POST", f"/v1/models/{name}/versions/{bundle.version}:regress", examples) == (400, {
        "error": "Expected regression signature method_name to be tensorflow/serving/regress. "
                 "Was: tensorflow/serving/predict"})
    assert call(srv.base, "POST", f"/v1/models/{name}:regress", {**examples, "signature_name": "regress_x_to_y"}) == \
        (400, {"error": "No signature was found with the name: regress_x_to_y"})
    status, answer = call(srv.base, "POST", f"/v1/models/{name}:classify", {"instances": instances[:1]})
    assert status == 400 and "key 'examples' is expected and was not found" in answer["error"], answer
    assert call(srv.base, "POST", "/v1/models/half:regress", examples)[0] == 404


def test_malformed_urls_as_tensorflow_serving_answers(server):
    srv, bundle, _ = server
    name = bundle.name
    for method, path in (("GET", "/v1/foo"), ("POST", "/v1/foo"), ("GET", "/v1/models/debug/model_name"),
                         ("POST", "/v1/models"), ("GET", f"/v1/models/{name}:predict"),
                         ("GET", f"/v1/models/{name}/version/50:predict"),
                         ("POST", f"/v1/models/{name}/versions/HELLO:regress"),
                         ("POST", f"/v1/models/{name}/metadata"), ("POST", f"/v1/models/{name}/label/x:regress"),
                         ("POST", f"/v1/models/{name}/versions/50/labels/x:regress"),
                         ("POST", f"/v1/models/{name}/versions/some_label:regress"),
                         ("PUT", f"/v1/models/{name}"), ("DELETE", f"/v1/models/{name}")):
        body = b"{}" if method in ("POST", "PUT") else None
        assert call(srv.base, method, path, body) == (400, {"error": f"Malformed request: {method} {path}"}), path
    assert call(srv.base, "GET", "/v1/models") == (400, {"error": "Missing model name in request."})
    huge = f"/v1/models/{name}/versions/{2 ** 64 - 1}:regress"
    assert call(srv.base, "POST", huge, b"{}") == \
        (400, {"error": f"Failed to convert version: {2 ** 64 - 1} to numeric."})
    status, answer = call(srv.base, "GET", "/statuspage")
    assert status == 404 and sorted(answer) == ["error"], answer


def test_lenient_keeps_unknown_columns_and_empty_instances(criteo, tmp_path):
    path, instances = criteo
    bundle = Bundle.open(path)
    with Server(tmp_path, path, "--lenient", env=THREADS) as srv:
        srv.wait_ready(bundle.name)
        url = f"/v1/models/{bundle.name}:predict"
        status, answer = call(srv.base, "POST", url, {"instances": [{**instances[0], "genre": "x"}]})
        assert status == 200, answer
        np.testing.assert_allclose(answer["predictions"], bundle.predict(instances[:1]), rtol=1e-5, atol=1e-6)
        assert call(srv.base, "POST", url, {"instances": []}) == (200, {"predictions": [], "model_version":
                                                                         bundle.version})
        # the default label without --version-label
        assert call(srv.base, "GET", f"/v1/models/{bundle.name}/labels/stable")[0] == 200
        assert call(srv.base, "GET", f"/v1/models/{bundle.name}/labels/canary")[0] == 400
        assert srv.stop() == 0


def schema_bundle(schema):
    return types.SimpleNamespace(name="m", version=3, schema=schema)


def test_signatures_of_synthetic_movielens_and_sequential_bundles():
    """The signature of other kinds of bundles, from their schema.json alone: DT_FLOAT dense
    columns, id columns and bags, MovieLens' optional release date, a history's inputs with
    their defaults, and its two outputs in both response forms."""
    from hetu.serve.raw_columns import bag, categorical, dense
    synthetic = rest.signature(schema_bundle({"columns": [dense("I1", 0, "none"), categorical("C1", 0, value="id"),
                                                          bag("tags", 1, 3, value="id")]}))
    assert synthetic.inputs == {"I1": ("DT_FLOAT", (-1,)), "C1": ("DT_INT64", (-1,)), "tags": ("DT_INT64", (-1, -1))}
    movielens = rest.signature(schema_bundle({"columns": [categorical("title", 0, "title_year"), bag("genres", 1, 3)]}))
    assert movielens.inputs == {"title": ("DT_STRING", (-1,)), "release_date": ("DT_STRING", (-1,)),
                                "genres": ("DT_STRING", (-1,))}
    assert list(movielens.defaults) == ["release_date"] and movielens.strings == {"title", "release_date", "genres"}
    for timestamps in (True, False):
        meta = rest.metadata(schema_bundle({"kind": "sequences", "timestamps": timestamps}))
        sig = meta["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert list(sig["inputs"]) == ["history", "timestamps", "k"] and list(sig["outputs"]) == ["items", "scores"]
        assert sig["inputs"]["history"]["tensor_shape"]["dim"] == [{"size": "-1", "name": ""}] * 2
        assert sig["defaults"]["k"]["int64_val"] == ["10"]
        assert ("timestamps" in sig["defaults"]) is not timestamps
    sequences = rest.signature(schema_bundle({"kind": "sequences", "timestamps": True}))
    rows, columnar = rest.instances_of({"inputs": {"history": [[1, 2], [3]], "timestamps": [[5, 6], [7]], "k": 2}},
                                       sequences)
    assert columnar and rows == [{"history": [1, 2], "timestamps": [5, 6], "k": 2},
                                 {"history": [3], "timestamps": [7], "k": 2}]
    with pytest.raises(rest.RestError, match="Missing named input: timestamps"):
        rest.instances_of({"inputs": {"history": [[1]]}}, sequences)
    predictions = [{"items": [4, 5], "scores": [0.5, 0.25]}, {"items": [6, 7], "scores": [0.75, 0.5]}]
    assert rest.answer(predictions, True, sequences, 3) == {
        "outputs": {"items": [[4, 5], [6, 7]], "scores": [[0.5, 0.25], [0.75, 0.5]]}, "model_version": 3}
    assert rest.answer(predictions, False, sequences, 3) == {"predictions": predictions, "model_version": 3}


@pytest.mark.parametrize("exported", ["hstu_synthetic"], indirect=True)
def test_a_sequential_bundle_s_signature_and_columnar_form_over_http(exported, tmp_path):
    model, _, path, data = exported
    bundle = Bundle.open(path)
    instances = raw_instances(data, 3, 5)
    with Server(tmp_path, path, env=THREADS) as srv:
        srv.wait_ready(model)
        status, answer = call(srv.base, "GET", f"/v1/models/{model}/labels/stable/metadata")
        assert status == 200, answer
        sig = answer["metadata"]["signature_def"]["signature_def"]["serving_default"]
        assert list(sig["inputs"]) == ["history", "timestamps", "k"] and list(sig["outputs"]) == ["items", "scores"]
        assert list(sig["defaults"]) == ["k"]   # HSTU reads the timestamps
        expected = json.loads(json.dumps(bundle.predict(instances)))
        columns = {"history": [x["history"] for x in instances], "timestamps": [x["timestamps"] for x in instances],
                   "k": 5}
        status, answer = call(srv.base, "POST", f"/v1/models/{model}/versions/{bundle.version}:predict",
                              {"inputs": columns})
        assert status == 200, answer
        assert answer["outputs"] == {"items": [p["items"] for p in expected], "scores": [p["scores"] for p in expected]}
        status, answer = call(srv.base, "POST", f"/v1/models/{model}:predict", {"instances": instances})
        assert (status, answer["predictions"]) == (200, expected)
        status, answer = call(srv.base, "POST", f"/v1/models/{model}:predict",
                              {"instances": [{**instances[0], "user": 1}]})
        assert status == 400 and "instance 0: unknown column 'user'" in answer["error"], answer
        assert srv.stop() == 0
