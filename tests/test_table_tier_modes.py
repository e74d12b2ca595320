"""Tables on disk (docs/design.md, "Disk tier") in every parameter-server mode: the servers keep
the embedding table in a row file with a cache far smaller than a step's rows, and the trained
parameters equal the same mode's run with the table in memory bit for bit. Checkpoints written
from disk resume in memory and the other way round, full saves and deltas."""
import re

import numpy as np
import pytest

from dist_harness import run_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

HET = ["--comm", "Hybrid", "--cache", "lru", "--bound", "0", "--bsp", "0"]
PS = ["--comm", "PS", "--bsp", "0"]
# (script, mode, optimizer and table flags): about 60 cached rows of 30 x 2 samples' ~1,500.
CASES = {
    "PS-adam-bf16": ("run_hetu.py", PS, ["--optimizer", "adam", "--learning-rate", "0.001",
                                         "--embedding-dtype", "bf16"]),
    "HET-adam_catchup": ("run_hetu.py", HET, ["--optimizer", "adam_catchup", "--learning-rate", "0.001"]),
    "Herald-rowwise_adagrad": ("run_laia.py", HET, ["--optimizer", "rowwise_adagrad", "--learning-rate", "0.01"]),
    "PS-dynamic-sgd": ("run_hetu.py", PS, ["--optimizer", "sgd", "--learning-rate", "0.02",
                                           "--table-capacity", "1024", "--admit-after", "2", "--evict-ttl", "5"]),
}
TINY_CACHE = ["--table-cache-mb", "0.006"]


def on_disk(tmp_path, name="rows"):
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    return ["--table-storage", "disk", "--table-dir", str(folder), *TINY_CACHE]


def tier_reads(stdout):
    """Rows the servers read back from their row files, summed over the servers' lines."""
    found = [int(n) for n in re.findall(r"in cache, (\d+) read", stdout)]
    assert found, stdout[-3000:]
    return sum(found)


def assert_identical(a, b):
    assert sorted(a) == sorted(b)
    for name in a:
        assert np.array_equal(a[name], b[name]), name


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_table_on_disk_trains_as_in_memory(tmp_path, data_home, case):
    script, mode, args = CASES[case]
    memory, _ = run_cluster(tmp_path, data_home, script, [*mode, *args], 2, 2, 30)
    disk, stdout = run_cluster(tmp_path, data_home, script, [*mode, *args, *on_disk(tmp_path)], 2, 2, 30)
    assert tier_reads(stdout) > 1000   # the rows went through the file, not only the cache
    assert_identical(memory, disk)


def test_checkpoints_move_between_disk_and_memory(tmp_path, data_home):
    """Two epochs in memory equal: one epoch on disk checkpointed (a full save, then deltas),
    resumed in memory; and one in memory resumed on disk, on another server count."""
    script, mode, args = CASES["HET-adam_catchup"]
    saves = ["--checkpoint-every", "10", "--checkpoint-full-every", "3"]   # full at 10, deltas at 20 and 30
    straight, _ = run_cluster(tmp_path, data_home, script, [*mode, *args, "--nepoch", "2"], 2, 2, 30)
    from_disk = tmp_path / "from-disk"
    run_cluster(tmp_path, data_home, script, [*mode, *args, "--nepoch", "1", "--checkpoint", str(from_disk), *saves,
                                              *on_disk(tmp_path)], 2, 2, 30)
    got, stdout = run_cluster(tmp_path, data_home, script, [*mode, *args, "--nepoch", "2", "--resume",
                                                            str(from_disk)], 2, 2, 30)
    assert "resumed" in stdout
    assert_identical(straight, got)
    from_memory = tmp_path / "from-memory"
    run_cluster(tmp_path, data_home, script, [*mode, *args, "--nepoch", "1", "--checkpoint", str(from_memory),
                                              *saves], 2, 2, 30)
    got, stdout = run_cluster(tmp_path, data_home, script, [*mode, *args, "--nepoch", "2", "--resume",
                                                            str(from_memory), *on_disk(tmp_path, "rows2")], 2, 3, 30)
    assert "resumed" in stdout and tier_reads(stdout) > 0
    reference, _ = run_cluster(tmp_path, data_home, script, [*mode, *args, "--nepoch", "2", "--resume",
                                                             str(from_memory)], 2, 3, 30)
    assert_identical(reference, got)


def test_a_server_killed_midway_resumes_on_disk_exactly(tmp_path, data_home):
    """A server SIGKILLed at a random point (its row file half written), the job resumed from
    its checkpoints with the table on disk again: the parameters of the uninterrupted run in
    memory, bit for bit, and every step trained once."""
    import random

    import test_stream_exactly_once as once
    rng = random.Random(f"{once.SEED}-disk-server")
    common, model, steps = once.data_args("folder", "PS", None)
    args = [*model, *on_disk(tmp_path)]
    ckpt = tmp_path / "ckpt"
    killed = once.kill_midway(tmp_path, data_home, ckpt, "run_hetu.py", common, args, "server", rng)
    written = [int(s) for s in re.findall(r"\[worker 0\] checkpoint at step (\d+)", killed)]
    assert written and written[-1] < steps, killed[-3000:]
    got, out = run_cluster(tmp_path, data_home, "run_hetu.py",
                           [*args, "--resume", str(ckpt), "--checkpoint", str(ckpt), *once.CHECKPOINTS],
                           once.WORKERS, once.SERVERS, once.BATCH, common=common)
    first = int(re.search(r"resumed at step (\d+)", out)[1])
    summary = [line for line in out.splitlines() if "summary {" in line][-1]
    assert first >= written[-1] and first + int(re.search(r'"iterations": (\d+)', summary)[1]) == steps
    straight = tmp_path / "straight"
    straight.mkdir()
    reference, _ = run_cluster(straight, data_home, "run_hetu.py", model, once.WORKERS, once.SERVERS, once.BATCH,
                               common=common)
    assert_identical(reference, got)


def cache_lookups(stdout):
    """(rows the servers' caches answered, rows looked up in them), over every server's line."""
    found = [(float(share), int(looked)) for share, looked in re.findall(r"disk tier: ([\d.]+) of (\d+) rows in cache",
                                                                        stdout)]
    assert found, stdout[-3000:]
    return sum(round(share * looked) for share, looked in found), sum(looked for _, looked in found)


@pytest.mark.parametrize("case", ["PS-adam-bf16", "PS-dynamic-sgd"])
def test_plain_ps_hints_its_next_batch_to_the_servers(tmp_path, data_home, case):
    """Plain PS on disk sends the ids of its dataloader's next batch (a dynamic table's resident
    slots) after each push: the servers stage those rows ahead (more lookups), and the step's pull
    then finds them cached (as many more hits); the trained parameters are those of the run
    without hints, bit for bit."""
    script, mode, args = CASES[case]
    runs = {}
    for prefetch in ("off", "on"):
        folder = tmp_path / f"rows-{prefetch}"
        folder.mkdir()
        runs[prefetch] = run_cluster(tmp_path, data_home, script, [*mode, *args, "--table-storage", "disk",
                                                                   "--table-dir", str(folder), "--table-cache-mb", "1",
                                                                   "--table-prefetch", prefetch], 2, 2, 30)
    assert_identical(runs["off"][0], runs["on"][0])
    (hits_off, looked_off), (hits_on, looked_on) = cache_lookups(runs["off"][1]), cache_lookups(runs["on"][1])
    hinted = looked_on - looked_off
    assert hinted > 1000 and hits_on - hits_off > 0.9 * hinted, (hits_off, looked_off, hits_on, looked_on)
