"""`python -m hetu.serve run --watch DIR` without a bundle (docs/design.md section 16, "Live
updates"): the server listens before the training job has written a checkpoint, answers every
model 404 as TensorFlow Serving answers a model with no version loaded, says in one line that it
waits, and serves the job's first checkpoint once it lands, as that checkpoint's bundle answers in
process."""
import sys
import time

import numpy as np
import pytest

pytest.importorskip("aiohttp")
pytest.importorskip("onnxruntime")

import jobs  # noqa: E402
from hetu.serve.bundle import Bundle  # noqa: E402
from hetu.serve.export import export  # noqa: E402
from hetu_tools.serve_load import random_instances  # noqa: E402
from test_serve_http import START_S, Server, train  # noqa: E402
from test_serve_rest_api import call  # noqa: E402

MODEL = "wdl_criteo"


def test_the_server_waits_for_the_first_checkpoint_then_serves_it(tmp_path, data_home):
    ckpt = tmp_path / "ckpt"   # not there yet
    with Server(tmp_path, f"--watch={ckpt}") as server:   # in BUNDLE's place: no BUNDLE
        deadline = time.monotonic() + START_S
        while "waiting for the first checkpoint" not in server.output():
            assert time.monotonic() < deadline and server.job.poll() is None, server.output()
            time.sleep(0.05)
        assert f"waiting for the first checkpoint in {ckpt}" in server.output().splitlines()[-1]
        assert call(server.base, "GET", f"/v1/models/{MODEL}") == \
            (404, {"error": f"Could not find any versions of model {MODEL}"})
        assert call(server.base, "GET", f"/v1/models/{MODEL}/versions/3") == \
            (404, {"error": f"Could not find version 3 of model {MODEL}"})
        assert call(server.base, "GET", f"/v1/models/{MODEL}/metadata") == \
            (404, {"error": f"Servable not found for request: Latest({MODEL})"})
        assert call(server.base, "POST", f"/v1/models/{MODEL}:predict", {"instances": [{"I1": 1}]}) == \
            (404, {"error": f"Servable not found for request: Latest({MODEL})"})

        train(data_home, ["--nepoch", "1", "--checkpoint", str(ckpt)])   # the job, after the server started
        bundle = Bundle.open(export(str(ckpt), str(tmp_path / "bundle")))
        deadline = time.monotonic() + START_S
        while (status := call(server.base, "GET", f"/v1/models/{MODEL}"))[0] != 200:
            assert time.monotonic() < deadline and server.job.poll() is None, (status, server.output())
            time.sleep(0.05)
        assert status[1]["model_version_status"][0]["version"] == str(bundle.version)
        instances = random_instances(bundle, 20, seed=4)
        code, answer = call(server.base, "POST", f"/v1/models/{MODEL}:predict", {"instances": instances})
        assert code == 200 and answer["model_version"] == bundle.version, answer
        np.testing.assert_allclose(answer["predictions"], bundle.predict(instances), rtol=1e-5, atol=1e-6)
        assert f"serving version {bundle.version}," in server.output()
        assert server.stop() == 0
    assert server.output().rstrip().endswith("stopped"), server.output()


def test_bundle_is_required_without_watch():
    done = jobs.run([sys.executable, "-m", "hetu.serve", "run", "--port", "1"], capture_output=True, text=True,
                    timeout=START_S)
    assert done.returncode == 2 and "BUNDLE is required, unless --watch" in done.stderr, done.stderr
