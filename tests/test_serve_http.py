"""The serving endpoint (python -m hetu.serve run, docs/design.md "Serving"): a real server process
answered by real HTTP clients. Its predictions equal the bundle's in process, in TensorFlow
Serving's shapes; concurrent requests are batched; bad requests get one line and the server goes on;
startup errors exit 2; SIGTERM stops it cleanly; and while a training job writes checkpoints and
deltas into the folder it watches, it swaps each new version in under concurrent requests: versions
only rise, none fails, and the last version answers as its own bundle does in process."""
import asyncio
import json
import os
import shutil
import signal
import socket
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("onnxruntime")

import jobs  # noqa: E402
from conftest import REPO  # noqa: E402
from dist_harness import THREADS  # noqa: E402
from hetu.serve.bundle import Bundle  # noqa: E402
from hetu.serve.export import checkpoint_version, export  # noqa: E402
from hetu_tools.serve_load import clients, random_instances  # noqa: E402

TRAIN = ["--no-progress", "--model", "wdl_criteo", "--rows", "20000", "--embedding-size", "8",
         "--iters-per-epoch", "30", "--batch-size", "64"]
START_S = 60   # a server's start: Python, ONNX Runtime and the bundle


def train(data_home, extra, timeout=300):
    env = dict(os.environ, HETU_DATA_HOME=data_home, **THREADS)
    proc = jobs.run([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *TRAIN, *extra],
                    capture_output=True, text=True, env=env, timeout=timeout)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_home):
    """(checkpoint folder, bundle path) of a short training run."""
    folder = tmp_path_factory.mktemp("serve")
    train(data_home, ["--nepoch", "1", "--checkpoint", str(folder / "ckpt")])
    return folder / "ckpt", export(str(folder / "ckpt"), str(folder / "bundle"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python -m hetu.serve run` in a process of its own; its output in a file."""

    def __init__(self, tmp_path, bundle, *args, env=None):
        self.port = free_port()
        self.log = tmp_path / f"server-{self.port}.log"
        self._log = open(self.log, "w")
        self.job = jobs.Job([sys.executable, "-m", "hetu.serve", "run", str(bundle), "--port", str(self.port), *args],
                            stdout=self._log, stderr=self._log, env=dict(os.environ, **(env or {})))
        self.base = f"http://127.0.0.1:{self.port}"

    def output(self):
        return self.log.read_text()

    def wait_ready(self, name):
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            if self.job.poll() is not None:
                pytest.fail(f"the server exited with {self.job.returncode} before answering:\n{self.output()}")
            try:
                return self.get(f"/v1/models/{name}")
            except (urllib.error.URLError, ConnectionError):
                time.sleep(0.1)
        pytest.fail(f"the server at {self.base} did not answer GET /v1/models/{name} within {START_S} s:\n"
                    f"{self.output()}")

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=30) as response:
            return json.load(response)

    def post(self, path, body):
        """(status, JSON answer) of POST `body` (bytes, or a JSON-able object)."""
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as e:
            return e.code, json.load(e)

    def stop(self, sig=signal.SIGTERM):
        self.job.send_signal(sig)
        try:
            self.job.wait(timeout=30)
        finally:
            self.job.stop()
            self._log.close()
        return self.job.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.job.stop()
        self.job.wait()
        self._log.close()


def test_predictions_equal_the_bundle_in_process_in_tf_serving_shapes(tmp_path, trained):
    _, path = trained
    bundle = Bundle.open(path)
    instances = random_instances(bundle, 50, seed=1)
    with Server(tmp_path, path) as server:
        status = server.wait_ready(bundle.name)
        assert status == {"model_version_status": [{"version": str(bundle.version), "state": "AVAILABLE",
                                                    "status": {"error_code": "OK", "error_message": ""}}]}
        code, answer = server.post(f"/v1/models/{bundle.name}:predict", {"instances": instances})
        assert code == 200, answer
        assert sorted(answer) == ["model_version", "predictions"]
        assert answer["model_version"] == bundle.version
        np.testing.assert_allclose(answer["predictions"], bundle.predict(instances), rtol=1e-5, atol=1e-6)
        assert server.stop() == 0
    assert server.output().rstrip().endswith("stopped"), server.output()


def test_bad_requests_get_one_line_and_the_server_goes_on(tmp_path, trained):
    _, path = trained
    bundle = Bundle.open(path)
    good = random_instances(bundle, 2, seed=2)
    column = bundle.schema["columns"][-1]["name"]
    missing = [good[0], {k: v for k, v in good[1].items() if k != column}]
    wrong_type = [good[0], {**good[1], column: {"a": 1}}]
    url = f"/v1/models/{bundle.name}:predict"
    with Server(tmp_path, path, "--max-body-bytes", "4096") as server:
        server.wait_ready(bundle.name)
        cases = [
            (url, b'{"instances": [', 400, "not JSON"),
            (url, {"examples": good}, 400, '"instances"'),
            (url, {"instances": [1, 2]}, 400, "instance 0"),
            (url, {"instances": missing}, 400, f"instance 1: column {column!r}"),
            (url, {"instances": wrong_type}, 400, f"instance 1: column {column!r}"),
            (f"/v1/models/no_such_model:predict", {"instances": good}, 404, "no_such_model"),
            (url, {"instances": good * 100}, 413, "4096 bytes"),
        ]
        for path_, body, status, names in cases:
            code, answer = server.post(path_, body)
            assert (code, sorted(answer)) == (status, ["error"]), (path_, code, answer)
            assert names in answer["error"] and "\n" not in answer["error"], answer
            code, answer = server.post(url, {"instances": good})
            assert code == 200 and len(answer["predictions"]) == 2, answer
        with pytest.raises(urllib.error.HTTPError) as unknown:
            server.get("/v1/models/no_such_model")
        assert unknown.value.code == 404
        assert server.stop(signal.SIGINT) == 0   # Ctrl-C stops it as cleanly as SIGTERM
    assert server.output().rstrip().endswith("stopped"), server.output()


def test_concurrent_requests_are_merged_into_batches(tmp_path, trained):
    _, path = trained
    bundle = Bundle.open(path)
    batches = [random_instances(bundle, 1 + k % 3, seed=10 + k) for k in range(32)]
    with Server(tmp_path, path, "--max-batch", "64", "--max-wait-ms", "20") as server:
        server.wait_ready(bundle.name)
        url = f"{server.base}/v1/models/{bundle.name}:predict"
        sent = []
        answers = asyncio.run(clients(url, batches, 16, stop_when=lambda: len(sent) >= 16 or sent.append(1)))
        stats = server.get(f"/v1/models/{bundle.name}/stats")
    answered = [a for client in answers for a in client]
    assert len(answered) == 16 and all(a.ok for a in answered), [a.error for a in answered]
    for k, client in enumerate(answers):
        np.testing.assert_allclose(client[0].predictions, bundle.predict(batches[k]), rtol=1e-5, atol=1e-6)
    assert stats["requests"] == 16
    assert stats["batches"] < stats["requests"], stats   # merged: fewer model runs than requests
    assert stats["largest_batch"] <= 64


def test_startup_errors_exit_2_with_one_line(tmp_path, trained):
    _, path = trained
    missing = jobs.run([sys.executable, "-m", "hetu.serve", "run", str(tmp_path / "nothing"), "--port", "1"],
                       capture_output=True, text=True, timeout=START_S)
    assert missing.returncode == 2
    assert len(missing.stderr.strip().splitlines()) == 1 and str(tmp_path / "nothing") in missing.stderr
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        in_use = jobs.run([sys.executable, "-m", "hetu.serve", "run", str(path), "--port", str(port)],
                          capture_output=True, text=True, timeout=START_S)
    assert in_use.returncode == 2
    assert len(in_use.stderr.strip().splitlines()) == 1 and f"127.0.0.1:{port}" in in_use.stderr, in_use.stderr


def test_a_checkpoint_of_another_model_is_not_served(tmp_path, data_home, trained):
    _, path = trained
    bundle = Bundle.open(path)
    other = tmp_path / "other"
    train(data_home, ["--model", "dcn_criteo", "--nepoch", "2", "--checkpoint", str(other)])
    assert checkpoint_version(str(other)) > bundle.version
    instances = random_instances(bundle, 3, seed=5)
    with Server(tmp_path, path, "--watch", str(other)) as server:
        server.wait_ready(bundle.name)
        deadline = time.monotonic() + 30
        while "not served" not in server.output() and time.monotonic() < deadline:
            time.sleep(0.1)
        code, answer = server.post(f"/v1/models/{bundle.name}:predict", {"instances": instances})
        assert (code, answer["model_version"]) == (200, bundle.version), answer
        time.sleep(1.5)   # past the retry: refused again, said once
        assert server.stop() == 0
    refused = [line for line in server.output().splitlines() if "not served" in line]
    assert len(refused) == 1 and "it is a model dcn_criteo, this server serves wdl_criteo" in refused[0], \
        server.output()


def test_a_training_job_s_checkpoints_are_swapped_in_under_concurrent_requests(tmp_path, data_home, trained):
    """The server follows a job that resumes the trained checkpoint and saves every 3 steps, every
    3rd save full, the others deltas; 8 clients ask all along."""
    first_ckpt, first_bundle = trained
    ckpt = tmp_path / "ckpt"
    shutil.copytree(first_ckpt, ckpt)
    bundle = Bundle.open(first_bundle)
    batches = [random_instances(bundle, 4, seed=100 + k) for k in range(8)]
    work = tmp_path / "server-tmp"   # where the server exports the versions it follows
    work.mkdir()
    with Server(tmp_path, first_bundle, "--watch", str(ckpt), env={"TMPDIR": str(work)}) as server:
        server.wait_ready(bundle.name)
        path = f"/v1/models/{bundle.name}"
        assert server.post(path + ":predict", {"instances": batches[0]})[1]["model_version"] == bundle.version
        env = dict(os.environ, HETU_DATA_HOME=data_home, **THREADS)
        with open(tmp_path / "train.log", "w") as log:
            job = jobs.Job([sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *TRAIN, "--resume", str(ckpt),
                            "--checkpoint", str(ckpt), "--nepoch", "8", "--checkpoint-every", "3",
                            "--checkpoint-full-every", "3"], stdout=log, stderr=log, env=env)
        with job:
            final = {}

            def caught_up():
                # Once the job has ended: 0.3 s after the server serves its last version (30 s at most).
                if job.poll() is None:
                    return False
                now = time.monotonic()
                final.setdefault("version", checkpoint_version(str(ckpt)))
                if "until" not in final and server.get(path)["model_version_status"][0]["version"] == \
                        str(final["version"]):
                    final["until"] = now + 0.3
                return now > final.get("until", now + 1) or now > final.setdefault("deadline", now + 30)

            answers = asyncio.run(clients(server.base + path + ":predict", batches, 8, stop_when=caught_up,
                                          pause=0.005))
            assert job.wait() == 0, (tmp_path / "train.log").read_text()
        stats = server.get(f"{path}/stats")
        assert server.stop() == 0
    failed = [a.error for client in answers for a in client if not a.ok]
    assert failed == [], failed
    for client in answers:
        versions = [a.version for a in client]
        assert versions == sorted(versions), versions   # only rising
    seen = sorted({a.version for client in answers for a in client})
    assert seen[0] >= bundle.version and seen[-1] == final["version"], (seen, final, server.output())
    assert len(seen) >= 3 and stats["swaps"] >= 2, (seen, stats)
    swaps = [line for line in server.output().splitlines() if line.startswith("serving version")]
    assert len(swaps) == stats["swaps"] and f"serving version {final['version']}," in swaps[-1], server.output()
    assert list(work.glob("hetu-serve-*")) == []   # every version it exported removed
    # The last version answers as its own export does in process.
    last = Bundle.open(export(str(ckpt), str(tmp_path / "last")))
    assert last.version == final["version"]
    for k, client in enumerate(answers):   # client k sends batches[k]
        for answer in client:
            if answer.version == last.version:
                np.testing.assert_allclose(answer.predictions, last.predict(batches[k]), rtol=1e-5, atol=1e-6)
    assert any(a.version == last.version for client in answers for a in client)
