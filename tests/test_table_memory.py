"""A table this host has not the memory for is refused in one line before it is allocated (docs/
design.md sections 5 and 13): a worker's dynamic tables (key directory, and rows where no server
holds them) and a server's shard, against MemAvailable or the cgroup's limit (HETU_MEMORY_AVAILABLE
stands in for it here, so that nothing large is allocated)."""
import os
import sys

import pytest

import jobs
from conftest import REPO
from hetu import _C
from test_dynamic_tables import hashed  # noqa: F401  (the synthetic hashed-ids data, a fixture)

# SGD: a row without optimizer state, as the figures below count it (the model's recommended optimizer has some).
FLAGS = ("--no-progress", "--model", "wdl_criteo", "--batch-size", "128", "--optimizer", "sgd")


def run(cmd, **env):
    return jobs.run(cmd, capture_output=True, text=True, timeout=200,
                    env=dict(os.environ, HETU_NUM_THREADS="1", **env))


def test_available_memory_is_the_hosts_or_less(monkeypatch):
    with open("/proc/meminfo") as f:
        mem_available = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    available, source = _C.available_memory()
    assert 0 < available <= mem_available * 1.5 and (source == "MemAvailable" or "cgroup" in source)
    monkeypatch.setenv("HETU_MEMORY_AVAILABLE", "12345")
    assert _C.available_memory() == (12345, "HETU_MEMORY_AVAILABLE")
    assert [_C.byte_text(n) for n in (800, 12_345_678, 24_700_000_000, 148 * 10**12)] == \
        ["800 bytes", "12.3 MB", "24.7 GB", "148.0 TB"]


def test_a_capacity_beyond_the_host_is_refused_in_one_line(hashed):
    cmd = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), *FLAGS, "--data-dir", str(hashed),
           "--embedding-size", "4"]
    proc = run([*cmd, "--table-capacity", str(10**12)])   # a std::bad_alloc before
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip().splitlines()[-1]
    assert line.startswith("error: dynamic tables: this process needs 148.0 TB (a key directory: 1000000000000 "
                           "slots x 112 bytes; table embedding: 1000000000000 rows x 24 bytes; ") and \
        " available (" in line, line
    # Adam's state (2 floats an element): 4 x (4 + 8) + 8 bytes a row; the figure the host has.
    proc = run([*cmd, "--table-capacity", "4096", "--optimizer", "adam"], HETU_MEMORY_AVAILABLE="500000")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: dynamic tables: this process needs 770048 bytes (a key directory: 4096 slots x 112 bytes; table embedding: "
        "4096 rows x 56 bytes; table wdl_wide_ids: 4096 rows x 20 bytes; a row with its optimizer state and step "
        "count) and its host has 500000 bytes available (HETU_MEMORY_AVAILABLE): give a smaller capacity")


@pytest.mark.timeout(300)
def test_a_server_refuses_a_shard_its_host_cannot_hold(hashed):
    """The worker holds the key directory alone (7.3 MB), the server the rows: 65536 x (256 + 8)."""
    cmd = [sys.executable, str(REPO / "python/runner.py"), "-w", "1", "-s", "1", "--timeout", "150", sys.executable,
           str(REPO / "examples/ctr/run_hetu.py"), *FLAGS, "--data-dir", str(hashed), "--embedding-size", "64",
           "--comm", "PS", "--table-capacity", "65536"]
    proc = run(cmd, HETU_MEMORY_AVAILABLE="12000000")
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in out, out[-3000:]
    assert "table 'embedding': server 0 needs 17.3 MB for its 65536 of the 65536 rows (264 bytes a row: the row as " \
           "stored, its optimizer state, step count and version), and its host has 12.0 MB available " \
           "(HETU_MEMORY_AVAILABLE)" in out, out[-3000:]
