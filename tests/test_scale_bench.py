"""bench/scale.py on a small table: every figure it reads from the jobs is there and adds up."""
import json
import os
import sys

import pytest

import jobs
from conftest import REPO


@pytest.mark.timeout(400)
@pytest.mark.parametrize("dtype,element", [("fp32", 4), ("bf16", 2)])
def test_scale_bench_reads_every_figure_of_a_small_run(tmp_path, dtype, element):
    out = tmp_path / "scale.json"
    p = jobs.run([sys.executable, str(REPO / "bench/scale.py"), "--scale", "0.01", "--rows", "4000",
                  "--iterations", "4", "--batch", "64", "--modes", "PS", "Herald", "--data",
                  str(tmp_path / "data"), "--work", str(tmp_path / "work"), "--json", str(out),
                  "--sample-interval", "0.1", "--timeout", "300", "--dtype", dtype],
                 capture_output=True, text=True, timeout=390)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = json.loads(out.read_text())["results"]
    assert [r["mode"] for r in results] == ["PS", "Herald"]
    rows = results[0]["rows"]
    for r in results:
        # Each server's shard of each table (the embedding, width 16, and the first-order weights,
        # width 1): a 96-byte header, then its rows x (the row's elements of the type, 1 accumulator,
        # an int64 step and version); in memory the step and version are 32 bits each.
        assert sorted(map(tuple, r["tables"])) == [(rows, 1), (rows, 16)], r["tables"]
        shards = [[((rows - s + 1) // 2, width * element + 4) for width in (1, 16)] for s in range(2)]
        assert [b for b, _ in r["checkpoint_saved"]] == [sum(96 + n * (row + 16) for n, row in t) for t in shards], r
        assert [b for b, _ in r["checkpoint_loaded"]] == [sum(n * (row + 16) for n, row in t) for t in shards], r
        assert r["server_expected_bytes"] == [sum(n * (row + 8) for n, row in t) for t in shards]
        peaks = r["peak_rss"]
        assert peaks["scheduler"] > 0 and all(x > 0 for x in peaks["servers"] + peaks["workers"]), peaks
        assert all(x > 0 for x in r["resume_peak_rss"]["servers"]), r
        assert r["startup_s"] > 0 and r["samples_per_s"] > 0 and r["rows_moved"] > 0 and r["bytes_moved"] > 0
        assert len(r["served_rows"]) == 2 and r["served_max_mean"] >= 1.0
    assert f"| PS | {dtype} |" in p.stdout and f"| Herald | {dtype} |" in p.stdout
    assert not os.path.exists(tmp_path / "work" / "PS"), "the checkpoints are left behind"
