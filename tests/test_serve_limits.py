"""The serving endpoint's limits (docs/design.md "Serving over HTTP"): an instance the model cannot
read fails its own request alone, whatever is merged with it, an integer outside int64 or a double
included; a body nested too deeply is a 400; a request of more than --max-instances is refused in
one line; a request larger than --max-batch runs in parts between the other requests' batches, all
its parts answered by the version its first one ran on."""
import asyncio
import concurrent.futures
import json
import threading
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("onnxruntime")

from hetu.serve.batching import Batcher, ServedBundle, TooManyInstances  # noqa: E402
from hetu.serve.bundle import Bundle, InstanceError  # noqa: E402
from hetu_tools.serve_load import random_instances  # noqa: E402
from test_serve_http import Server, trained  # noqa: E402,F401 - the fixture, shared


def test_an_integer_outside_int64_fails_its_own_request_alone(tmp_path, trained):  # noqa: F811
    _, path = trained
    bundle = Bundle.open(path)
    column = next(c["name"] for c in bundle.schema["columns"] if c.get("value") == "id")
    dense = next(c["name"] for c in bundle.schema["columns"] if c["kind"] == "dense")
    requests = [random_instances(bundle, 3, seed=k) for k in range(40)]
    requests[7][2][column] = 10 ** 30
    requests[23][1][dense] = 10 ** 400
    url = f"/v1/models/{bundle.name}:predict"
    with Server(tmp_path, path, "--max-wait-ms", "20") as server:
        server.wait_ready(bundle.name)
        with concurrent.futures.ThreadPoolExecutor(40) as pool:
            answers = list(pool.map(lambda r: server.post(url, {"instances": r}), requests))
        for k, (code, answer) in enumerate(answers):
            if k == 7:
                assert (code, answer) == (400, {"error": f"instance 2: column {column!r}: id {10 ** 30} is outside "
                                                         f"int64"}), answer
            elif k == 23:
                assert code == 400 and answer["error"].startswith(f"instance 1: column {dense!r}: expected a "
                                                                  f"finite number"), answer
            else:
                assert code == 200, (k, answer)
                np.testing.assert_allclose(answer["predictions"], bundle.predict(requests[k]), rtol=1e-5, atol=1e-6)
        stats = server.get(f"/v1/models/{bundle.name}/stats")
        assert stats["batches"] < 40 + 2 * 40, stats   # merged at least once
        for body, says in ((b"[" * 100_000, "nests"), (b'{"instances": [{"I1": ' + b"7" * 5000 + b"}]}", "not JSON")):
            code, answer = server.post(url, body)
            assert code == 400 and says in answer["error"] and "\n" not in answer["error"], answer
        code, answer = server.post(url, {"instances": requests[0]})
        assert code == 200, answer
        assert server.stop() == 0
    assert "Traceback" not in server.output(), server.output()


def test_a_column_read_at_once_is_the_column_read_value_by_value():
    """The encoder reads a column of plain numbers at once (dense_values, id_values): the same
    numbers, and for anything else the same refusal, as reading it value by value."""
    from hetu.serve.encode import dense_value, dense_values, id_value, id_values
    pool = [0, 1, -5, 2 ** 53 + 1, 2 ** 63 - 1, -2 ** 63, 2 ** 63, 10 ** 30, 10 ** 400,   # ints first
            0.5, -2.25, 1e308, float("inf"), float("nan"), True, None, "", "7", "x", [1]]
    rng = np.random.default_rng(0)

    def outcome(read):
        try:
            return read()
        except InstanceError as e:
            return str(e)

    fast_paths = 0
    for trial in range(400):
        values = [pool[k] for k in rng.integers(0, 9 if trial % 2 else len(pool), rng.integers(1, 6))]
        owners = list(range(10, 10 + len(values)))
        for integer in (False, True):
            got = outcome(lambda: dense_values("c", values, integer))
            want = outcome(lambda: np.array([dense_value(i, "c", v, integer) for i, v in enumerate(values)],
                                            np.float64))
            assert type(got) is type(want) and (np.array_equal(got, want) if isinstance(got, np.ndarray)
                                                else got == want), (values, integer, got, want)
        got = outcome(lambda: id_values("c", values, owners))
        want = outcome(lambda: np.array([id_value(i, "c", v) for i, v in zip(owners, values)], np.int64))
        assert type(got) is type(want) and (np.array_equal(got, want) if isinstance(got, np.ndarray)
                                            else got == want), (values, got, want)
        fast_paths += isinstance(got, np.ndarray)
    assert fast_paths > 50


def test_a_request_over_max_instances_is_refused_and_a_large_one_runs_in_parts(tmp_path, trained):  # noqa: F811
    _, path = trained
    bundle = Bundle.open(path)
    url = f"/v1/models/{bundle.name}:predict"
    large = random_instances(bundle, 500, seed=3)
    with Server(tmp_path, path, "--max-batch", "64", "--max-instances", "500") as server:
        server.wait_ready(bundle.name)
        code, answer = server.post(url, {"instances": large + large[:1]})
        assert (code, answer) == (400, {"error": "the request has 501 instances, more than the server's limit of 500 "
                                                 "(--max-instances): send them in several requests"}), answer
        code, answer = server.post(url, {"instances": large})
        assert code == 200 and answer["model_version"] == bundle.version, answer
        np.testing.assert_allclose(answer["predictions"], bundle.predict(large), rtol=1e-5, atol=1e-6)
        stats = server.get(f"/v1/models/{bundle.name}/stats")
        assert (stats["requests"], stats["instances"], stats["largest_batch"]) == (1, 500, 64), stats
        assert stats["batches"] == 8, stats
        assert server.stop() == 0


class SlowBundle:
    """A bundle whose predict takes 10 ms a batch and records each batch: instance k's prediction
    is k + version / 1000."""
    name = "slow"

    def __init__(self, version, runs):
        self.version, self.runs = version, runs

    def predict(self, instances):
        self.runs.append((self.version, list(instances)))
        time.sleep(0.01)
        if any(i < 0 for i in instances):
            raise InstanceError(f"instance {[i < 0 for i in instances].index(True)}: column 'x': negative")
        return np.asarray(instances, np.float64) + self.version / 1000


def test_a_large_request_runs_in_parts_between_the_others_on_one_version():
    runs = []
    old, new = SlowBundle(1, runs), SlowBundle(2, runs)

    async def scenario():
        served = ServedBundle(old)
        batcher = Batcher(served, max_batch=8, max_wait=0, max_instances=100)
        loop_task = asyncio.create_task(batcher.run())
        big = asyncio.create_task(batcher.predict(list(range(100))))
        await asyncio.sleep(0.025)   # its first parts run
        served.swap(new, None)       # a new version while it runs: the request stays on its own
        small = [asyncio.create_task(batcher.predict([1000 + k, 2000 + k])) for k in range(3)]
        bad = asyncio.create_task(batcher.predict([5] * 30 + [-1]))
        small_done = await asyncio.gather(*small)
        big_done_first = big.done()
        results = await big, await asyncio.gather(bad, return_exceptions=True)
        with pytest.raises(TooManyInstances, match="101 instances, more than the server's limit of 100"):
            await batcher.predict([0] * 101)
        loop_task.cancel()
        batcher.close()
        return small_done, big_done_first, results, served

    small_done, big_done_first, ((big, version), (bad,)), served = asyncio.run(scenario())
    assert not big_done_first   # the small requests were answered between the large one's parts
    assert version == 1 and big.tolist() == [k + 0.001 for k in range(100)]
    assert [version for _, version in small_done] == [2, 2, 2]
    assert isinstance(bad, InstanceError) and str(bad) == "instance 30: column 'x': negative"
    assert max(len(instances) for _, instances in runs) <= 8
    assert sorted(i for v, instances in runs if v == 1 for i in instances) == list(range(100))
    assert not served._leases   # every lease released


def test_a_body_over_a_mebibyte_is_read_on_a_thread_alike(tmp_path, trained):  # noqa: F811
    """A body larger than PARSE_ON_LOOP_BYTES is parsed and read off the event loop: the same
    answers, and the same refusals, as a small one."""
    from hetu.serve.server import PARSE_ON_LOOP_BYTES
    _, path = trained
    bundle = Bundle.open(path)
    url = f"/v1/models/{bundle.name}:predict"
    instances = random_instances(bundle, 400, seed=5)
    large = instances * (PARSE_ON_LOOP_BYTES // len(json.dumps(instances)) + 2)
    body = json.dumps({"instances": large}).encode()
    assert len(body) > PARSE_ON_LOOP_BYTES
    with Server(tmp_path, path, "--max-batch", "256", "--max-instances", str(len(large))) as server:
        server.wait_ready(bundle.name)
        code, answer = server.post(url, body)
        assert code == 200, answer
        np.testing.assert_allclose(answer["predictions"], bundle.predict(large), rtol=1e-5, atol=1e-6)
        columnar = {"inputs": {c: [row[c] for row in large] for c in large[0]}}
        code, answer = server.post(url, columnar)
        assert code == 200 and len(answer["outputs"]) == len(large), answer
        code, answer = server.post(url, body[:-1])   # cut: not JSON
        assert code == 400 and "not JSON" in answer["error"], answer
        code, answer = server.post(url, json.dumps({"instances": large + large[:1]}).encode())
        assert code == 400 and "--max-instances" in answer["error"], answer
        assert server.stop() == 0
    assert "Traceback" not in server.output(), server.output()


@pytest.mark.parametrize("text", [
    '{}', '{"a":1}', ' { "a" : [ ] , "b" : { } } ', '{"a":NaN,"a":2}', '[1,2]', '"x"', '{"a":[[[[1]]]]}',
    '{"instances":[{"x":1,"y":[1,2]},{"x":"s\\u00e9"}],"signature_name":"serving_default"}',
    '{"inputs":{"a":[1,2,3],"b":[{"b64":"eA=="},"y"]}}', '{"a":{"b":{"c":[1, 2]}}}',
    '{"a":[1,2,]}', '{"a":1}}', '{"a" 1}', '{a:1}', '{"a":[1 2]}', '', '{"a":1,}', '{"a":[1,2', '{"a":' + '[' * 5000])
def test_a_body_read_in_pieces_is_the_body_json_reads(text):
    from hetu.serve.rest import parse_in_pieces
    try:
        want = json.loads(text)
    except (ValueError, RecursionError):
        with pytest.raises((ValueError, RecursionError)):
            parse_in_pieces(text.encode())
    else:
        assert parse_in_pieces(text.encode()) == want and parse_in_pieces(text.encode("utf-16")) == want
