"""The endpoint's counters (docs/design.md section 16): the ids the model never saw, per raw column
(a value outside an indexed field's vocabulary, a key not resident in a dynamic table), in the
bundle, in /v1/models/NAME/stats and at /monitoring/prometheus/metrics, whose text a real
Prometheus server scrapes: its queries give the requests made."""
import collections
import json
import os
import shutil
import socket
import sys
import time
import urllib.parse
import urllib.request

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("onnxruntime")

import jobs  # noqa: E402
from conftest import REPO  # noqa: E402
from dist_harness import THREADS  # noqa: E402
from hetu.data.prepare import main as prepare_main  # noqa: E402
from hetu.serve.bundle import Bundle  # noqa: E402
from hetu.serve.export import export  # noqa: E402
from test_serve_export import criteo_lines  # noqa: E402
from test_serve_http import Server  # noqa: E402
from test_serve_rest_api import call, criteo  # noqa: E402,F401 - the fixture, shared (hashed ids, a dynamic table)

METRICS = "/monitoring/prometheus/metrics"


@pytest.fixture(scope="module")
def indexed(tmp_path_factory):
    """(bundle path, raw instances) of Criteo text prepared indexed with --min-count 2 (bucket 0)."""
    folder = tmp_path_factory.mktemp("indexed")
    instances = criteo_lines(folder / "part-0.txt", rows=600)
    assert prepare_main(["criteo", "--input", str(folder / "part-0.txt"), "--output", str(folder / "criteo"),
                         "--min-count", "2", "--quiet"]) == 0
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress", "--model", "wdl_criteo",
                     "--data-dir", str(folder / "criteo"), "--embedding-size", "4", "--batch-size", "64",
                     "--nepoch", "1", "--checkpoint", str(folder / "ckpt")],
                    capture_output=True, text=True, env=dict(os.environ, **THREADS), timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return export(str(folder / "ckpt"), str(folder / "bundle")), instances[:8]


def unknown_of(bundle, instances):
    counted = collections.Counter()
    bundle.predict(instances, counted)
    return counted


def test_values_outside_the_vocabulary_are_counted_per_column(indexed):
    path, instances = indexed
    bundle = Bundle.open(path)
    unseen = [{**instance, "C1": f"never-seen-{k}"} for k, instance in enumerate(instances[:3])]
    before, after = unknown_of(bundle, instances[:3]), unknown_of(bundle, unseen)
    assert {where for _, where in before} <= {"vocabulary"}   # training's rare values read bucket 0 too
    assert after["C1", "vocabulary"] == 3
    assert {key: n for key, n in after.items() if key[0] != "C1"} == {key: n for key, n in before.items()
                                                                      if key[0] != "C1"}
    np.testing.assert_array_equal(bundle.predict(unseen), Bundle.open(path).predict(unseen))   # counting changes nothing


def test_keys_not_resident_in_a_dynamic_table_are_counted_per_column(criteo):
    path, instances = criteo
    bundle = Bundle.open(path)
    dynamic = [name for name, info in bundle.schema["tables"].items() if "keys" in info]
    assert dynamic
    before = unknown_of(bundle, instances)
    unseen = [{**instance, "C3": f"never-seen-{k}", "C7": f"never-seen-{k}"} for k, instance in enumerate(instances)]
    after = unknown_of(bundle, unseen)
    for table in dynamic:
        for column in ("C3", "C7"):
            assert after[column, table] == len(instances), (column, table, after)
    assert {key for key in after if after[key] != before[key]} == {(c, t) for c in ("C3", "C7") for t in dynamic}


def metric_families(text):
    from prometheus_client.parser import text_string_to_metric_families
    return {family.name: family for family in text_string_to_metric_families(text)}


def samples(family, name, **labels):
    return [s.value for s in family.samples if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def scrape(base):
    with urllib.request.urlopen(base + METRICS, timeout=30) as response:
        return response.headers["Content-Type"], response.read().decode()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def prometheus_query(base, query):
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as response:
        result = json.load(response)["data"]["result"]
    return {tuple(sorted((k, v) for k, v in r["metric"].items() if k not in ("__name__", "instance", "job"))): float(r["value"][1])
            for r in result}


def test_prometheus_metrics_count_the_requests_batches_and_unknown_ids(criteo, tmp_path):
    pytest.importorskip("prometheus_client")
    path, instances = criteo
    bundle = Bundle.open(path)
    unseen = [{**instance, "C5": f"never-seen-{k}"} for k, instance in enumerate(instances[:3])]
    with Server(tmp_path, path, env=THREADS) as server:
        server.wait_ready(bundle.name)
        predict = f"/v1/models/{bundle.name}:predict"
        for _ in range(4):
            assert call(server.base, "POST", predict, {"instances": instances})[0] == 200
        assert call(server.base, "POST", predict, {"instances": unseen})[0] == 200
        assert call(server.base, "POST", predict, {"instances": [{"C1": "x"}]})[0] == 400   # run: a bad instance
        run = 4 * len(instances) + 3 + 1
        assert call(server.base, "GET", f"/v1/models/{bundle.name}/metadata")[0] == 200
        assert call(server.base, "GET", "/v1/models/another")[0] == 404
        stats = server.get(f"/v1/models/{bundle.name}/stats")
        dynamic = [name for name, info in bundle.schema["tables"].items() if "keys" in info]
        assert stats["unknown_ids"]["C5"] == {table: 3 + 4 * unknown_of(bundle, instances)["C5", table]
                                              for table in dynamic}, stats
        content_type, text = scrape(server.base)
        assert content_type.startswith("text/plain; version=0.0.4")
        assert "# HELP hetu_serve_requests_total " in text and "# TYPE hetu_serve_requests_total counter" in text
        families = metric_families(text)
        requests = families["hetu_serve_requests"]
        assert samples(requests, "hetu_serve_requests_total", api="predict", code="200") == [5]
        assert samples(requests, "hetu_serve_requests_total", api="predict", code="400") == [1]
        assert samples(requests, "hetu_serve_requests_total", api="metadata", code="200") == [1]
        assert samples(requests, "hetu_serve_requests_total", api="status", code="404") == [1]
        latency = families["hetu_serve_request_latency_seconds"]
        assert samples(latency, "hetu_serve_request_latency_seconds_count", api="predict") == [6]
        assert samples(latency, "hetu_serve_request_latency_seconds_bucket", api="predict", le="+Inf") == [6]
        batch = families["hetu_serve_batch_size"]
        assert samples(batch, "hetu_serve_batch_size_sum") == [run]
        assert samples(batch, "hetu_serve_batch_size_bucket", le="8.0") == samples(batch, "hetu_serve_batch_size_count")
        assert samples(families["hetu_serve_instances"], "hetu_serve_instances_total") == [run]
        assert samples(families["hetu_serve_model_version"], "hetu_serve_model_version", model=bundle.name) \
            == [bundle.version]
        assert samples(families["hetu_serve_swaps"], "hetu_serve_swaps_total") == [0]
        assert samples(families["hetu_serve_failed_batches"], "hetu_serve_failed_batches_total") == [0]
        for table in dynamic:
            assert samples(families["hetu_serve_unknown_ids"], "hetu_serve_unknown_ids_total", column="C5",
                           where=table) == [stats["unknown_ids"]["C5"][table]]

        binary = shutil.which("prometheus")
        if binary is None:
            pytest.skip("no prometheus binary (apt-get install prometheus; scripts/install_deps.sh installs it)")
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: hetu\n"
                          f"    metrics_path: {METRICS}\n    static_configs:\n"
                          f"      - targets: ['127.0.0.1:{server.port}']\n")
        log = open(tmp_path / "prometheus.log", "w")
        with jobs.Job([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                       f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=log) as prometheus:
            base = f"http://127.0.0.1:{port}"
            wanted = {"hetu_serve_requests_total": {(("api", "predict"), ("code", "200")): 5.0,
                                                    (("api", "predict"), ("code", "400")): 1.0,
                                                    (("api", "metadata"), ("code", "200")): 1.0,
                                                    (("api", "status"), ("code", "404")): 1.0,
                                                    (("api", "stats"), ("code", "200")): 1.0,
                                                    (("api", "status"), ("code", "200")): 1.0},   # wait_ready
                      "hetu_serve_instances_total": {(): float(run)},
                      "hetu_serve_model_version": {(("model", bundle.name),): float(bundle.version)},
                      f'hetu_serve_unknown_ids_total{{column="C5",where="{dynamic[0]}"}}':
                          {(("column", "C5"), ("where", dynamic[0])): float(stats["unknown_ids"]["C5"][dynamic[0]])}}
            got, deadline = {}, time.monotonic() + 25
            while time.monotonic() < deadline:
                assert prometheus.poll() is None, (tmp_path / "prometheus.log").read_text()[-2000:]
                try:
                    got = {query: prometheus_query(base, query) for query in wanted}
                except OSError:
                    got = {}
                if all(got.get(query, {}) == {tuple(sorted(k)): v for k, v in answer.items()}
                       for query, answer in wanted.items()):
                    break
                time.sleep(0.5)
            # the scrapes themselves are not counted: the values are as the requests made them
            assert got == {q: {tuple(sorted(k)): v for k, v in a.items()} for q, a in wanted.items()}, \
                (got, (tmp_path / "prometheus.log").read_text()[-2000:])
            prometheus.terminate()
            prometheus.wait(timeout=20)
        log.close()


def test_without_prometheus_client_the_path_answers_503_and_the_rest_serves(monkeypatch):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from hetu.serve import server
    from hetu.serve.batching import Batcher, ServedBundle
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.delitem(sys.modules, "hetu.serve.metrics", raising=False)

    async def answers():
        served = ServedBundle(None)
        async with TestClient(TestServer(server.make_app(served, Batcher(served, 8, 0), 1 << 20))) as client:
            metrics, status = await client.get(METRICS), await client.get("/v1/models/m")
            return metrics.status, await metrics.json(), status.status
    code, answer, status = asyncio.run(answers())
    assert code == 503 and "prometheus_client" in answer["error"], answer
    assert status == 404   # no version yet: the server itself goes on
