"""A stream folder of many files (docs/design.md "Streams"): the reader lists the folder once per
poll, not once per file, so N files cost O(N) (entries listed, counted); the idle limit counts only
time without data to read, so files listed and not yet read are trained however slowly they are
read; and a source closed after an idle exit stops between files, not after all of them."""
import os
import sys
import time

import numpy as np
import pytest

import jobs
from conftest import REPO
from dist_harness import _summary
from hetu.data import stream
from hetu.data.stream import StreamSource
from hetu.streaming import StreamFeed


def criteo_files(folder, count, lines_per_file=1, seed=0):
    """`count` Criteo-format files of `lines_per_file` lines each: part-000000, ..."""
    rng = np.random.default_rng(seed)
    folder.mkdir()
    for k in range(count):
        rows = []
        for _ in range(lines_per_file):
            dense = "\t".join(str(v) for v in rng.integers(0, 50, 13))
            sparse = "\t".join(f"{v:08x}" for v in rng.integers(0, 1 << 20, 26))
            rows.append(f"{int(rng.integers(0, 2))}\t{dense}\t{sparse}\n")
        (folder / f"part-{k:06d}").write_text("".join(rows))
    return folder


@pytest.fixture
def listed(monkeypatch):
    """Counts os.scandir's calls and the entries they yield."""
    counts = {"listings": 0, "entries": 0}
    real = os.scandir

    def counting(path):
        counts["listings"] += 1
        for entry in real(path):
            counts["entries"] += 1
            yield entry

    monkeypatch.setattr(stream.os, "scandir", counting)
    return counts


def read_all(source, samples, timeout=10):
    got = 0
    while got < samples:
        block = source.read(samples, timeout)
        assert block is not None, f"{got} of {samples} samples read"
        got += len(block.labels)
    return got


def test_a_folder_of_many_files_is_listed_once_a_poll(tmp_path, listed):
    files = 3000
    folder = criteo_files(tmp_path / "many", files)
    started = time.monotonic()
    with StreamSource(str(folder), "criteo", poll_seconds=0.2) as source:
        assert read_all(source, files) == files
    seconds = time.monotonic() - started
    # Listed at the start and once a poll while reading: a few listings of N entries, not one a file.
    assert listed["listings"] <= 2 + seconds / 0.2 * 2, (listed, seconds)
    assert listed["entries"] <= files * listed["listings"] and listed["listings"] < 50, listed


def slow_files(monkeypatch, seconds):
    """Each file takes `seconds` before it is read: a slow disk, or a folder too large to keep up."""
    read_file = stream._DirectoryReader.read_file

    def slow(self, name, offset, line):
        time.sleep(seconds)
        return read_file(self, name, offset, line)

    monkeypatch.setattr(stream._DirectoryReader, "read_file", slow)


def test_the_idle_limit_waits_for_files_listed_and_not_yet_read(tmp_path, monkeypatch):
    folder = criteo_files(tmp_path / "slow", 40)
    slow_files(monkeypatch, 0.03)
    with StreamSource(str(folder), "criteo", poll_seconds=0.05) as source:
        feed = StreamFeed(source, 4, idle_exit=0.01)   # a batch of 4 files takes 0.12 s to read
        batches = 0
        while feed.all_ready(batches):
            batches += 1
    assert batches == 10 and feed.samples_read == 40


def test_a_source_closed_after_an_idle_exit_stops_between_files(tmp_path, monkeypatch):
    folder = criteo_files(tmp_path / "left", 200)
    slow_files(monkeypatch, 0.02)   # 4 s to read them all
    source = StreamSource(str(folder), "criteo", poll_seconds=0.05)
    assert source.read(1, 5) is not None
    started = time.monotonic()
    source.close()
    assert time.monotonic() - started < 1


def test_a_job_on_thousands_of_files_trains_every_sample(tmp_path):
    files, batch = 2400, 60
    folder = criteo_files(tmp_path / "job", files)
    cmd = [sys.executable, str(REPO / "examples/ctr/run_hetu.py"), "--no-progress", "--model", "wdl_criteo",
           "--embedding-size", "8", "--optimizer", "sgd", "--table-capacity", "4096", "--stream", str(folder),
           "--stream-idle-exit", "1", "--batch-size", str(batch), "--csv-dir", str(tmp_path / "csv")]
    proc = jobs.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = _summary(proc.stdout)
    assert summary["iterations"] == files // batch and summary["final"]["not_trained"] == 0, summary
