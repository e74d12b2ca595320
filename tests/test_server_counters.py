"""What each server served (docs/design.md section 7's counters, per server): one line per server at
the job's end and, with --cache-perf, a CSV beside the workers'."""
import csv
import json
import os
import re
import sys

import pytest

import jobs
from conftest import REPO
from dist_harness import COMMON

LINE = re.compile(r"^\[server (\d+)\] server (\d+): (\d+) requests, (\d+) rows, (\d+) bytes served, ([\d.]+) s busy$")


@pytest.mark.timeout(300)
def test_every_server_reports_what_it_served(tmp_path, data_home):
    csv_dir = tmp_path / "csv"
    cmd = [sys.executable, str(REPO / "python/runner.py"), "-w", "2", "-s", "2", "--timeout", "200", sys.executable,
           str(REPO / "examples/ctr/run_hetu.py"), *COMMON, "--comm", "PS", "--bsp", "0", "--batch-size", "32",
           "--nepoch", "1", "--cache-perf", "--csv-dir", str(csv_dir)]
    proc = jobs.run(cmd, capture_output=True, text=True, timeout=280,
                    env=dict(os.environ, HETU_DATA_HOME=data_home))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    lines = {}
    for line in proc.stdout.splitlines():
        m = LINE.match(line)
        if m:
            assert m.group(1) == m.group(2), line   # the launcher's tag is the server's rank
            lines[int(m.group(2))] = [int(m.group(i)) for i in (3, 4, 5)] + [float(m.group(6))]
    assert sorted(lines) == [0, 1], proc.stdout[-3000:]
    # Every embedding row a worker pulled or pushed was served by one server, and no other row.
    moved = sum(c["rows_pulled"] + c["rows_pushed"] for c in
                (json.loads(line.split("summary ", 1)[1])["counters"]
                 for line in proc.stdout.splitlines() if "] summary {" in line))
    assert sum(v[1] for v in lines.values()) == moved > 0
    for requests, rows, nbytes, busy in lines.values():
        assert requests >= 20 and nbytes > rows * 8 * 4 and busy > 0   # every step reaches every server
    with open(csv_dir / "wdl_criteo-PS-servers.csv") as f:
        table = list(csv.DictReader(f))
    assert [int(r["server"]) for r in table] == [0, 1]
    for r in table:   # written by worker 0 after training, the same as the servers' last word
        assert [int(r["requests"]), int(r["rows"]), int(r["bytes"])] == lines[int(r["server"])][:3]
