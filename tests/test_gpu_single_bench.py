"""bench/gpu_single.py's PyTorch baselines, run on the CPU with a tiny grid so that its
torch.compile columns work before a GPU machine runs them: a compiled mode gives rates, a mode
torch.compile refuses is an error cell with the reason, and the run goes on to the end."""
import json
import sys
from pathlib import Path

import pytest

import jobs

pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(600)
def test_torch_compile_columns_on_cpu(tmp_path):
    out = tmp_path / "single.json"
    res = jobs.run(
        [sys.executable, str(ROOT / "bench" / "gpu_single.py"), "--device", "cpu", "--models", "ncf",
         "--batch", "64", "--embedding", "4", "--optimizers", "sgd", "adam", "--windows", "2", "--steps", "2",
         "--warmup", "2", "--no-check", "--compile-modes", "default", "no-such-mode", "--out", str(out)],
        capture_output=True, text=True, timeout=580)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "tc:default" in res.stdout and "hetu/tc:default" in res.stdout
    rows = json.loads(out.read_text())["results"]
    assert [r["opt"] for r in rows] == ["sgd", "adam"]
    for r in rows:
        for key in ("hetu", "torch", "compile_default"):
            assert r[key] > 0, (key, r)
            assert len(r[key + "_detail"]["rates"]) == 2
        assert r["ratios"]["hetu/compile_default"] == pytest.approx(r["hetu"] / r["compile_default"])
        assert r["compile_no_such_mode"] is None
        assert "no-such-mode" in r["compile_no_such_mode_detail"]["error"]
        assert "compile_no_such_mode: set-up: RuntimeError" in r["note"]
